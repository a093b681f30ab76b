"""FedDIM's regulariser and server update, and FedGA's weights, against NumPy versions."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dg.algorithms.base import LocalSchedule
from fedjax_dg.algorithms.feddim import (VARIANTS, class_mean_insights, dim_regularizer, last_input,
                                         last_kernel, momentum_update, statistic)
from fedjax_dg.engine import init_round_state
from fedjax_dg.algorithms.fedga import ga_weights
from helpers import method, ragged_store, run_from, sgd_config, tiny_mlp, tree_max_diff


def feddim(model, sched, lam, momentum, store, variant="insight"):
  """FedDIM from the config (local SGD 0.1, FedAvg's rule at step 1), on `store`'s clients."""
  return method({"algorithm.name": "feddim", "algorithm.feddim.lam": lam, "algorithm.feddim.momentum": momentum,
                 "algorithm.feddim.variant": variant, **sgd_config(0.1), "server.lr": 1.0}, model, sched,
                len(store.counts), store=store)


def uniform_fedavg(model, sched, num_clients):
  """FedAvg from the config (local SGD 0.1, step 1) with uniform client weights: the reference."""
  return method({**sgd_config(0.1), "server.lr": 1.0}, model, sched, num_clients)._replace(weighting="uniform")


def fedga(model, sched, lr, num_clients, num_rounds, step_size, gap_store=None, fair=None):
  """FedGA from the config; `gap_store`: each client's held-out rows (`gap_fraction > 0`)."""
  overrides = {"algorithm.name": "fedga", "algorithm.fedga.step": step_size, "num_rounds": num_rounds,
               "algorithm.fedga.gap_fraction": 0.1 if gap_store is not None else 0.0, **sgd_config(lr)}
  if fair is not None:
    overrides["algorithm.fedga.fair"] = fair
  return method(overrides, model, sched, num_clients, tune_store=gap_store)

RNG = np.random.default_rng(0)


def _np_head(cls, z):
  """float64 NumPy: `(W, z_last, logits)` of a `Dense -> ReLU -> ... -> Dense` head."""
  layers = [{k: np.asarray(v, np.float64) for k, v in cls[f"Dense_{i}"].items()} for i in range(len(cls))]
  z = np.asarray(z, np.float64)
  for l in layers[:-1]:
    z = np.maximum(z @ l["kernel"] + l["bias"], 0.0)
  return layers[-1]["kernel"], z, z @ layers[-1]["kernel"] + layers[-1]["bias"]


def _np_stat(variant, W, z):
  """One sample's statistic, written out: `I_jk = W_jk z_j`, `z`, or `o_k = sum_j W_jk z_j`."""
  if variant == "insight":
    return np.array([[W[j, k] * z[j] for k in range(W.shape[1])] for j in range(W.shape[0])])
  if variant == "feature":
    return z.copy()
  return np.array([sum(W[j, k] * z[j] for j in range(W.shape[0])) for k in range(W.shape[1])])


@pytest.mark.parametrize("variant", VARIANTS)
def test_dim_regularizer_matches_numpy(variant):
  """Eq. (7)'s second term (and Table 3's W/Fea, W/Log replacements) on a two-layer head:
  `W` is the last layer, `z` its input."""
  d, K, B = 4, 3, 7
  cls = {"Dense_0": {"kernel": RNG.normal(size=(5, d)), "bias": RNG.normal(size=d)},
         "Dense_1": {"kernel": RNG.normal(size=(d, K)), "bias": RNG.normal(size=K)}}
  feats = RNG.normal(size=(B, 5))
  W, z, _ = _np_head(cls, feats)
  y = np.array([0, 1, 2, 1, 0, 2, 1])
  mask = np.array([1, 1, 1, 1, 1, 0, 0], float)
  bar = RNG.normal(size=(K,) + _np_stat(variant, W, z[0]).shape)
  init = np.array([True, True, False])
  expect = 0.0
  for i in range(B):
    if mask[i] and init[y[i]]:
      expect += np.sum((_np_stat(variant, W, z[i]) - bar[y[i]]) ** 2)
  expect /= mask.sum()
  jcls = jax.tree.map(jnp.asarray, cls)
  s = statistic(variant, last_kernel(jcls), last_input(jcls, jnp.asarray(feats)))
  got = dim_regularizer(s, jnp.asarray(y), jnp.asarray(mask), jnp.asarray(bar), jnp.asarray(init))
  np.testing.assert_allclose(float(got), expect, rtol=1e-5)


def test_last_layer_reading_reproduces_the_head():
  """`last_input @ last_kernel + bias` is the model's own head (two-layer head), so `I` sums
  over `j` to the bias-free logit (eq. 2)."""
  model = tiny_mlp(hidden=(8,), head_hidden=(5,))
  params = model.init(jax.random.PRNGKey(1))
  x = jnp.asarray(RNG.normal(size=(4, 6)), jnp.float32)
  z = model.features(params, x)
  cls = params["classifier"]
  W, z_last, logits = _np_head(cls, z)
  np.testing.assert_allclose(np.asarray(model.head(cls, z)), logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(last_input(cls, z)), z_last, rtol=1e-5, atol=1e-6)
  I = np.asarray(statistic("insight", last_kernel(cls), last_input(cls, z)))
  np.testing.assert_allclose(I.sum(1) + np.asarray(cls["Dense_1"]["bias"]), logits, rtol=1e-5, atol=1e-5)


def test_class_means_and_momentum_update_match_numpy():
  d, K = 3, 4
  W = RNG.normal(size=(d, K))
  # Two clients; client 0 has classes {0, 1}, client 1 has {1}; nobody has classes 2, 3.
  data = [(RNG.normal(size=(5, d)), np.array([0, 1, 1, 0, 0]), np.array([1, 1, 1, 1, 0.])),
          (RNG.normal(size=(3, d)), np.array([1, 1, 1]), np.array([1, 1, 1.]))]
  weighted, has = [], []
  for z, y, m in data:
    means, h = class_mean_insights(jnp.asarray(W), jnp.asarray(z), jnp.asarray(y), jnp.asarray(m), K)
    np_means = np.zeros((K, d, K))
    for k in range(K):
      rows = [W * z[i][:, None] for i in range(len(y)) if y[i] == k and m[i]]
      if rows:
        np_means[k] = np.mean(rows, axis=0)
    np.testing.assert_allclose(np.asarray(means) * np.asarray(h)[:, None, None], np_means, rtol=1e-5, atol=1e-6)
    weighted.append(np.asarray(means) * np.asarray(h)[:, None, None])
    has.append(np.asarray(h))
  mean_w, mean_h = np.mean(weighted, 0), np.mean(has, 0)  # the engine's uniform mean
  i_bar = RNG.normal(size=(K, d, K))
  init = np.array([True, False, True, False])
  m = 0.3
  new, new_init = momentum_update(jnp.asarray(i_bar), jnp.asarray(init), jnp.asarray(mean_w), jnp.asarray(mean_h), m)
  i_g0 = weighted[0][0]                                   # class 0: only client 0
  i_g1 = (weighted[0][1] + weighted[1][1]) / 2            # class 1: both clients
  np.testing.assert_allclose(new[0], (1 - m) * i_bar[0] + m * i_g0, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new[1], i_g1, rtol=1e-5, atol=1e-6)          # first sight: initialised
  np.testing.assert_allclose(new[2], i_bar[2])                             # unseen: unchanged
  np.testing.assert_allclose(new[3], i_bar[3])
  assert list(np.asarray(new_init)) == [True, True, True, False]


def _np_initial_bar(model, params, st, variant, K):
  """Alg. 1 line 1 in float64 NumPy: for class k, the mean over the clients that have k of
  each client's mean statistic over its class-k rows, at the initial model."""
  cls = params["classifier"]
  per_client = []
  for c in range(len(st.counts)):
    n = int(st.counts[c])
    W, z, _ = _np_head(cls, model.features(params, jnp.asarray(st.x[c, :n])))
    per_client.append({k: np.mean([_np_stat(variant, W, z[i]) for i in range(n) if st.y[c, i] == k], 0)
                       for k in range(K) if (st.y[c, :n] == k).any()})
  return np.stack([np.mean([pc[k] for pc in per_client if k in pc], 0) for k in range(K)])


@pytest.mark.parametrize("variant,head", [("insight", ()), ("feature", (5,)), ("logit", (5,))])
def test_feddim_initialises_the_class_insight_at_the_initial_model(variant, head):
  """Before round 1 (Alg. 1 line 1) every class has its `I_bar`, the uniform mean over the
  clients of their class means at the initial model; with `m = 0` it never moves (Table 3,
  W/m = 0), while the model trains."""
  st = ragged_store()
  C, K = len(st.counts), 3
  model = tiny_mlp(head_hidden=head)
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=4, epochs=1, passes=1, unroll=1)
  want = _np_initial_bar(model, params, st, variant, K)
  for m in (0.5, 0.0):
    alg = feddim(model, sched, 0.1, m, st, variant)
    state = init_round_state(alg, None, params, C)
    assert bool(state.server.initialized.all())
    np.testing.assert_allclose(np.asarray(state.server.i_bar), want, rtol=1e-4, atol=1e-5)
  after = run_from(alg, params, st, C, 4, 2)      # m = 0, partial participation
  np.testing.assert_allclose(np.asarray(after.server.i_bar), want, rtol=1e-4, atol=1e-5)
  assert tree_max_diff(after.server.params, params) > 1e-3


def test_feddim_first_round_is_regularised():
  """Round 1 already carries the regulariser: with a large `lambda` it moves the model
  differently from `lambda = 0` (before the fix round 1 was plain uniform FedAvg)."""
  st = ragged_store()
  C = len(st.counts)
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=4, epochs=1, passes=1, unroll=1)
  out = [run_from(feddim(model, sched, lam, 0.5, st), params, st, C, C, 1) for lam in (0.0, 1.0)]
  assert tree_max_diff(out[0].server.params, out[1].server.params) > 1e-4


def test_feddim_lambda_zero_is_uniform_fedavg():
  st = ragged_store()
  C = len(st.counts)
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=4, epochs=1, passes=1, unroll=1)
  alg = feddim(model, sched, 0.0, 0.5, st)
  ref = uniform_fedavg(model, sched, C)
  out = [run_from(a, params, st, C, C, 2) for a in (alg, ref)]
  assert tree_max_diff(out[0].server.params, out[1].server.params) < 1e-6


def test_feddim_config_values():
  """`momentum = 0` (W/m = 0) is accepted, the variant is one of three, and `setup_bytes`
  counts every client's per-class statistic once."""
  from fedjax_dg.algorithms.feddim import SPEC
  from fedjax_dg.algorithms.spec import Context, read
  assert read(SPEC.hparams, {"momentum": 0.0, "variant": "logit"}, "algorithm.feddim").momentum == 0.0
  with pytest.raises(ValueError, match="variant"):
    read(SPEC.hparams, {"variant": "prototype"}, "algorithm.feddim")
  with pytest.raises(ValueError, match="momentum"):
    read(SPEC.hparams, {"momentum": -0.1}, "algorithm.feddim")
  ctx = Context(tiny_mlp(head_hidden=(5,)), None, None, None, num_clients=6)
  for variant, size in (("insight", 5 * 3), ("feature", 5), ("logit", 3)):
    hp = read(SPEC.hparams, {"variant": variant}, "algorithm.feddim")
    assert SPEC.setup_bytes(ctx, hp) == 6 * 3 * (size + 1) * 4


def _refine_weight_dict_by_ga(weight_dict, before, after, step_size, fair_metric="loss"):
  """NumPy transcription of FedDG-GA's `utils/weight_adjust.py: refine_weight_dict_by_GA`
  (`signal` -1 for `acc`, +1 for `loss`) with the step scaled by `1 / len(weight_dict)`
  (Bai et al.'s port; `1/3` for the authors' three training domains), then `weight_clip`."""
  signal = {"acc": -1.0, "loss": 1.0}[fair_metric]
  weight_dict = dict(weight_dict)
  value_list = np.array([after[k] - before[k] for k in before], np.float64)
  step_size = 1 / len(weight_dict) * step_size
  norm_gap_list = value_list / np.max(np.abs(value_list))
  for i, k in enumerate(before):
    weight_dict[k] += signal * norm_gap_list[i] * step_size
  total = 0.0
  for k in weight_dict:
    weight_dict[k] = np.clip(weight_dict[k], 0.0, 1.0)
    total += weight_dict[k]
  return {k: v / total for k, v in weight_dict.items()}


def test_ga_weights_match_the_reference_code():
  a = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
  ids = np.array([4, 0, 2, 1, 3])
  gaps = np.array([0.5, -0.1, 0.2, -0.9, 0.05])
  valid = np.array([True, True, True, True, True])
  step = 0.7
  before = {int(c): 0.0 for c in ids}
  after = {int(c): float(g) for c, g in zip(ids, gaps)}
  want = _refine_weight_dict_by_ga({c: a[c] for c in range(5)}, before, after, step)
  got = ga_weights(jnp.asarray(a), jnp.asarray(ids), jnp.asarray(gaps), jnp.asarray(valid), step / 5)
  np.testing.assert_allclose(np.asarray(got), [want[c] for c in range(5)], rtol=1e-6)
  # a padding member (valid False) changes nothing and is not in the max
  got_pad = ga_weights(jnp.asarray(a), jnp.asarray(np.append(ids, 0)), jnp.asarray(np.append(gaps, 99.0)),
                       jnp.asarray(np.append(valid, False)), step / 5)
  np.testing.assert_allclose(np.asarray(got_pad), np.asarray(got), rtol=1e-6)


def _np_metric(p, x, y, fair):
  """float64 NumPy: the mean cross-entropy or the accuracy of a linear model on `(x, y)`."""
  W, b = (np.asarray(p["classifier"]["Dense_0"][k], np.float64) for k in ("kernel", "bias"))
  z = np.asarray(x, np.float64) @ W + b
  if fair == "acc":
    return float(np.mean(np.argmax(z, 1) == y))
  z = z - z.max(1, keepdims=True)
  return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]))


@pytest.mark.parametrize("fair,held", [(None, False), ("loss", True),
                                       pytest.param("loss", False, marks=pytest.mark.slow),
                                       pytest.param("acc", True, marks=pytest.mark.slow)])
def test_fedga_rounds_match_the_authors_loop(fair, held):
  """Three FedGA rounds against the authors' `train_pacs_GA.py: main` loop: aggregation with
  the current weights, the gaps of the new global model against each trained local model
  (float64 NumPy, in accuracy or loss, on the training rows or a held-out split), and
  `refine_weight_dict_by_GA` with the step `d - (i - 1) d / T` of round `i = 0, 1, 2`.
  `fair=None`: the defaults (the authors' `--fair acc`)."""
  from fedjax_dg.algorithms.fedavg import erm, local_update
  from fedjax_dg.algorithms.base import ClientData
  st = ragged_store()
  gap = ragged_store(sizes=(8, 6, 9, 7, 5, 8), seed=4) if held else None
  C, R, T, d, lr = len(st.counts), 3, 10, 0.2, 0.5
  model = tiny_mlp(hidden=())
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=3, batch_size=4, epochs=1, passes=1, unroll=1)
  alg = fedga(model, sched, lr, C, T, step_size=d, gap_store=gap, fair=fair)
  state = run_from(alg, params, st, C, C, R)
  fair = fair or "acc"
  update = jax.jit(local_update(erm(model), optax.sgd(lr), sched))
  src = gap if held else st
  split = lambda c: (src.x[c, :int(src.counts[c])], src.y[c, :int(src.counts[c])])
  weights, theta = {c: 1 / C for c in range(C)}, params
  for i in range(R):
    k_clients = jax.random.split(jax.random.PRNGKey(i))[1]
    locals_ = []
    for c in range(C):
      data = ClientData(*(jnp.asarray(a[c]) for a in (st.x, st.y, st.domain, st.counts)), client_id=c)
      out = update(theta, (), data, jax.random.fold_in(k_clients, c))
      locals_.append(jax.tree.map(lambda p, dl: p + dl, theta, out.message))
    theta = jax.tree.map(lambda *ps: sum(weights[c] * p for c, p in enumerate(ps)), *locals_)   # FedAvg(weight_dict)
    before = {c: _np_metric(locals_[c], *split(c), fair) for c in range(C)}
    after = {c: _np_metric(theta, *split(c), fair) for c in range(C)}
    weights = _refine_weight_dict_by_ga(weights, before, after, d - (i - 1) * d / T, fair)
  assert tree_max_diff(state.server.params, theta) < 1e-5
  np.testing.assert_allclose(np.asarray(state.server.weights), [weights[c] for c in range(C)], rtol=1e-4, atol=1e-6)


def test_fedga_zero_step_is_uniform_fedavg():
  st = ragged_store()
  C = len(st.counts)
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=4, epochs=1, passes=1, unroll=1)
  out = [run_from(a, params, st, C, 4, 3).server.params
         for a in (fedga(model, sched, 0.1, C, 10, step_size=0.0), uniform_fedavg(model, sched, C))]
  assert tree_max_diff(out[0], out[1]) < 1e-6
