"""FedADG: its losses against float64 NumPy, its local step against an independent
re-derivation, and its rounds through the engine (strategies, padding, learning)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dg.algorithms.base import Batch, ClientData, make_schedule
from fedjax_dg.algorithms.fedadg import (AdgCarry, Discriminator, Generator, adg_step, disc_loss,
                                         feature_adv_loss, gen_loss, label_code, reference_noise, task_loss)
from fedjax_dg.algorithms.fedavg import erm, local_update
from fedjax_dg.engine import init_round_state, make_round
from helpers import method, ragged_store, sgd_config, tiny_mlp, tree_max_diff

DIM, K, NZ = 6, 3, 5


def _perturb(tree, seed, scale=0.3):
  leaves, tdef = jax.tree.flatten(tree)
  rng = np.random.default_rng(seed)
  return tdef.unflatten([jnp.asarray(a + scale * rng.normal(size=a.shape), jnp.float32) for a in leaves])


def _nets(seed=0):
  """A linear model (F = identity, C linear), a tiny G and D, all with non-zero biases."""
  model = tiny_mlp(DIM, K, hidden=())
  gen, disc = Generator(DIM, hidden=7), Discriminator(hidden=5, rp_size=4)
  k = jax.random.split(jax.random.PRNGKey(seed), 3)
  params = _perturb(model.init(k[0]), seed)
  g = _perturb(gen.init(k[1], jnp.zeros((1, NZ)), jnp.zeros((1, K)))["params"], seed + 1)
  d = _perturb(disc.init(k[2], jnp.zeros((1, K)), jnp.zeros((1, DIM)))["params"], seed + 2)
  return model, gen, disc, params, g, d


def _batch(seed=0, n=11, num_pad=3):
  rng = np.random.default_rng(seed)
  mask = (np.arange(n) < n - num_pad).astype(np.float32)
  return Batch(jnp.asarray(rng.normal(size=(n, DIM)), jnp.float32), jnp.asarray(rng.integers(0, K, n), jnp.int32),
               jnp.zeros(n, jnp.int32), jnp.asarray(mask))


# Independent implementations of the paper's networks and losses, for any array module `xp`.
def _leaky(xp, h):
  return xp.where(h > 0, h, 0.01 * h)


def _d(xp, p, y_code, f):
  h = xp.concatenate([f @ p["projection"]["kernel"], y_code], -1)
  h = _leaky(xp, h @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"])
  return 1.0 / (1.0 + xp.exp(-(h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"])[:, 0]))


def _g(xp, p, z, y_code):
  h = _leaky(xp, xp.concatenate([z, y_code], -1) @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"])
  return xp.maximum(h @ p["Dense_1"]["kernel"] + p["Dense_1"]["bias"], 0.0)


def _ce(xp, p, x, y):
  z = x @ p["classifier"]["Dense_0"]["kernel"] + p["classifier"]["Dense_0"]["bias"]
  z = z - z.max(-1, keepdims=True)
  logp = z - xp.log(xp.exp(z).sum(-1, keepdims=True))
  return -(logp * (xp.arange(K)[None, :] == y[:, None])).sum(-1)


def _mean(xp, v, m):
  return (v * m).sum() / m.sum()


def _losses(xp, params, g, d, x, y, m, z, lam0):
  yc = 0.6 * (xp.arange(K)[None, :] == y[:, None])
  refs = _g(xp, g, z, yc)
  l_d = _mean(xp, (1 - _d(xp, d, yc, refs)) ** 2 + _d(xp, d, yc, x) ** 2, m)
  l_f = _mean(xp, (1 - _d(xp, d, yc, x)) ** 2, m)
  l_g = _mean(xp, _d(xp, d, yc, refs) ** 2, m)
  ce = _mean(xp, _ce(xp, params, x, y), m)
  return l_d, l_f, l_g, ce, lam0 * l_f + (1 - lam0) * ce


def _f64(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def test_losses_match_float64_numpy():
  model, gen, disc, params, g, d = _nets(0)
  b = _batch(1)
  lam0 = 0.55

  @jax.jit  # one program, not one per primitive
  def parts(params, g, d, b, rng):
    z = reference_noise(rng, len(b.y), NZ)
    yc = label_code(b.y, K)
    refs = gen.apply({"params": g}, z, yc)
    feats = model.features(params, b.x)
    got = (disc_loss(disc, d, yc, feats, refs, b.mask), feature_adv_loss(disc, d, yc, feats, b.mask),
           gen_loss(disc, d, yc, refs, b.mask), *task_loss(model, disc, params, d, b, yc, lam0)[1],
           task_loss(model, disc, params, d, b, yc, lam0)[0])
    return z, refs, jnp.stack(got), disc.apply({"params": d}, yc, feats)

  z, refs, got, disc_out = parts(params, g, d, b, jax.random.PRNGKey(3))
  x, y, m = np.asarray(b.x, np.float64), np.asarray(b.y), np.asarray(b.mask, np.float64)
  l_d, l_f, l_g, ce, total = _losses(np, _f64(params), _f64(g), _f64(d), x, y, m, np.asarray(z, np.float64), lam0)
  np.testing.assert_allclose(np.asarray(got, np.float64), [l_d, l_f, l_g, ce, l_f, total], rtol=1e-5, atol=1e-7)
  # the reference lies in [0, inf) and the discriminator in (0, 1)
  assert float(refs.min()) >= 0 and 0 < float(disc_out.min())


def _step(lrs, lam0=0.4, seed=0):
  model, gen, disc, params, g, d = _nets(seed)
  lr, lr_g, lr_d = lrs
  opts = optax.sgd(lr), optax.sgd(lr_g), optax.sgd(lr_d)
  step = jax.jit(adg_step(model, gen, disc, *opts, K, NZ, lam0))  # as local_loop runs it: compiled, not op by op
  carry = AdgCarry(params, opts[0].init(params), g, opts[1].init(g), d, opts[2].init(d), jnp.zeros(4))
  return (model, params, g, d), step, carry


def test_step_is_d_then_fc_then_g_each_on_its_own_loss():
  lrs, lam0 = (0.3, 0.2, 0.5), 0.4
  (model, params, g, d), step, carry = _step(lrs, lam0)
  b, rng = _batch(2), jax.random.PRNGKey(5)
  out, ce = step(carry, b, rng)
  z = reference_noise(rng, len(b.y), NZ)
  L = lambda p, g_, d_: _losses(jnp, p, g_, d_, b.x, b.y, b.mask, z, lam0)
  sgd = lambda p, grad, lr: jax.tree.map(lambda a, e: a - lr * e, p, grad)

  @jax.jit  # the reference in one program (op by op, each operation would compile on its own)
  def reference(params, g, d):
    d1 = sgd(d, jax.grad(lambda d_: L(params, g, d_)[0])(d), lrs[2])               # D on L_advd
    p1 = sgd(params, jax.grad(lambda p: L(p, g, d1)[4])(params), lrs[0])           # F, C on the new D
    g1 = sgd(g, jax.grad(lambda g_: L(params, g_, d1)[2])(g), lrs[1])              # G on the new D
    return d1, p1, g1, L(params, g, d1), L(params, g, d)
  d1, p1, g1, at_d1, at_d = reference(params, g, d)
  assert tree_max_diff(out.disc, d1) < 1e-5
  assert tree_max_diff(out.params, p1) < 1e-5
  assert tree_max_diff(out.gen, g1) < 1e-5
  n = float(b.mask.sum())
  np.testing.assert_allclose(ce, at_d1[3], rtol=1e-5)
  np.testing.assert_allclose(out.sums, n * np.array([at_d1[1], at_d[0], at_d1[2], 1]), rtol=1e-5)


def test_each_update_moves_only_its_own_network():
  b, rng = _batch(3), jax.random.PRNGKey(1)
  for moving, lrs in (("disc", (0.0, 0.0, 0.5)), ("params", (0.5, 0.0, 0.0)), ("gen", (0.0, 0.5, 0.0))):
    (_, params, g, d), step, carry = _step(lrs)
    out, _ = step(carry, b, rng)
    for name, before in (("disc", d), ("params", params), ("gen", g)):
      changed = tree_max_diff(getattr(out, name), before) > 1e-6
      assert changed == (name == moving), (moving, name)
  # L_advf reaches the featurizer only: with lambda_0 = 1 the head does not move
  (_, params, _, _), step, carry = _step((0.5, 0.0, 0.0), lam0=1.0)
  out, _ = step(carry, b, rng)
  assert tree_max_diff(out.params["classifier"], params["classifier"]) == 0.0


def test_padding_rows_of_a_batch_have_no_effect():
  (_, _, _, _), step, carry = _step((0.3, 0.2, 0.5))
  b, rng = _batch(4), jax.random.PRNGKey(2)
  pad = np.asarray(b.mask) == 0
  x2 = np.asarray(b.x).copy()
  x2[pad] = 50.0
  y2 = np.where(pad, (np.asarray(b.y) + 1) % K, np.asarray(b.y))
  a, ce_a = step(carry, b, rng)
  c, ce_c = step(carry, b._replace(x=jnp.asarray(x2), y=jnp.asarray(y2, jnp.int32)), rng)
  assert tree_max_diff(a, c) == 0.0 and float(ce_a) == float(ce_c)


def fedadg(model, sched, num_clients, client_lr, lam0, e0, gen_lr, noise_dim, hidden):
  """FedADG from the config: an MLP, local SGD (its generator and discriminator steps at
  `gen_lr`), FedAvg's rule at step 1."""
  fields = {"lambda0": lam0, "e0_epochs": e0, "gen_lr": gen_lr, "disc_lr": gen_lr, "noise_dim": noise_dim,
            "hidden": hidden}
  return method({"algorithm.name": "fedadg", "model.name": "mlp", **sgd_config(client_lr), "server.lr": 1.0,
                 **{f"algorithm.fedadg.{k}": v for k, v in fields.items()}}, model, sched, num_clients)


def _alg(model, sched, lam0=0.55, e0=1, client_lr=0.1):
  return fedadg(model, sched, 6, client_lr, lam0, e0, gen_lr=0.05, noise_dim=NZ, hidden=6)


def test_rounds_agree_across_strategies_and_ignore_padding_rows():
  st = ragged_store()
  store = jax.tree.map(jnp.asarray, st)
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  alg = _alg(model, make_schedule(4, 0, 1, 12, 3))
  C, S = 6, 4
  init = init_round_state(alg, jax.random.PRNGKey(9), params, C)
  states, rfs = {}, {}
  for strategy in ("vmap", "sequential"):
    rf = rfs[strategy] = make_round(alg, C, S, strategy)
    s = init
    for t in range(2):
      s, metrics = rf(s, store, jax.random.PRNGKey(t))
    states[strategy] = s
    assert set(metrics) == {"train_loss", "erm_loss", "adv_feature_loss", "disc_loss", "gen_loss", "activity/rule_deviation"}
  assert tree_max_diff(states["vmap"], states["sequential"]) < 1e-5
  s = states["vmap"]
  assert tree_max_diff(s.server.params["gen"], init.server.params["gen"]) > 1e-4    # G is aggregated
  assert tree_max_diff(s.server.params["model"], init.server.params["model"]) > 1e-4
  moved = [tree_max_diff(jax.tree.map(lambda a: a[c], s.clients), jax.tree.map(lambda a: a[c], init.clients)) > 0
           for c in range(C)]
  assert 0 < sum(moved) < C  # only sampled clients trained their own D
  d0, d1 = (jax.tree.map(lambda a: a[c], s.clients) for c in np.flatnonzero(moved)[:2])
  assert tree_max_diff(d0, d1) > 1e-6  # one D per client
  # garbage in every padding row of the store changes nothing
  n_max = st.x.shape[1]
  pad = np.arange(n_max)[None, :] >= st.counts[:, None]
  store2 = store._replace(x=jnp.asarray(np.where(pad[..., None], 99.0, st.x), jnp.float32),
                          y=jnp.asarray(np.where(pad, (st.y + 1) % K, st.y), jnp.int32))
  a, _ = rfs["vmap"](init, store, jax.random.PRNGKey(0))
  b, _ = rfs["vmap"](init, store2, jax.random.PRNGKey(0))
  assert tree_max_diff(a, b) == 0.0


def test_without_e0_and_adversarial_weight_the_model_update_is_fedavgs():
  st = ragged_store()
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(1))
  sched = make_schedule(4, 0, 2, 12, 3)
  alg = _alg(model, sched, lam0=0.0, e0=0)
  nets = alg.broadcast(alg.server_init(jax.random.PRNGKey(2), params))
  c = 2
  data = ClientData(jnp.asarray(st.x[c]), jnp.asarray(st.y[c]), jnp.asarray(st.domain[c]), jnp.asarray(st.counts[c]))
  rng = jax.random.PRNGKey(4)
  out = alg.client_update(nets, alg.client_init(params), data, rng)
  want = local_update(erm(model), optax.sgd(0.1), sched)(params, (), data, rng)
  assert tree_max_diff(out.message["model"], want.message) < 1e-6
  np.testing.assert_allclose(out.metrics["train_loss"], want.metrics["train_loss"], rtol=1e-6)
  assert tree_max_diff(out.message["gen"], jax.tree.map(jnp.zeros_like, nets["gen"])) > 0  # G still trains


def test_lowers_the_training_loss_on_the_embedded_dataset():
  from fedjax_dg.data import datasets, partition, splits
  from fedjax_dg.data.store import pack_clients
  from fedjax_dg.models import build_model
  import ml_collections
  ds = datasets.rotated_digits(image_size=8)
  fold = splits.make_fold(ds, (5,), (0,))
  parts = partition.heterogeneous_partition(fold.train.domain, 4, 0.1, 0)
  packed = pack_clients(fold.train, parts)
  model = build_model(ml_collections.ConfigDict({"name": "mlp", "hidden": (32,)}), fold.train.x.shape[1:],
                      fold.num_classes)
  sched = make_schedule(16, 0, 1, int(packed.counts.max()), int(packed.counts.min()))
  alg = fedadg(model, sched, 4, 0.3, 0.55, 1, gen_lr=7e-3, noise_dim=16, hidden=32)
  state = init_round_state(alg, jax.random.PRNGKey(1), model.init(jax.random.PRNGKey(0)), 4)
  rf = make_round(alg, 4, 4, "vmap")
  store = jax.tree.map(jnp.asarray, packed)
  losses = []
  for t in range(5):
    state, m = rf(state, store, jax.random.PRNGKey(t))
    losses.append(float(m["train_loss"]))
    assert all(np.isfinite(float(v)) for v in m.values())
  assert losses[-1] < 0.8 * losses[0], losses
  logits = model.apply(alg.params_of(state.server), jnp.asarray(fold.in_test.x))  # uint8 -> [0, 1] inside
  acc = float((np.asarray(logits).argmax(-1) == fold.in_test.y).mean())
  assert acc > 0.3, acc  # chance is 0.1
