"""The vectorised round against a plain sequential per-client implementation."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dg.algorithms.base import (LocalSchedule, batch_indices, ClientData, local_train,
                                       erm_objective, make_schedule)
from fedjax_dg.engine import init_round_state, make_round, STRATEGIES
from helpers import adam_config, client_arrays, method, ragged_store, sgd_config, tiny_mlp, tree_max_diff

STORE = ragged_store()
SIZES = STORE.counts.tolist()
C = len(SIZES)
N_MAX = max(SIZES)
EPOCHS = 3
LR = 0.2
# Full-batch local steps (B >= N_max): the reference needs no batch order.
FULL = LocalSchedule(num_steps=EPOCHS, batch_size=N_MAX, epochs=EPOCHS, passes=EPOCHS, unroll=1)


def _mean_ce(model, p, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()


def local_loss(model, mu):
  """A client's full-batch objective at `q`: the mean cross-entropy plus `mu / 2` times the
  squared distance to the round's starting point `p0`."""
  def loss(q, p0, x, y):
    return _mean_ce(model, q, x, y) + 0.5 * mu * sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(q),
                                                                                             jax.tree.leaves(p0)))
  return loss


def reference_round(params, controls, c_server, kind, cohort, grad, server_lr=1.0):
  """A plain loop: each client runs EPOCHS full-batch GD steps, then the server averages.
  `grad(q, p0, x, y)`: the gradient of the clients' objective (`local_loss`) at q."""
  deltas, dcs, new_controls = [], [], dict(controls)
  for c in cohort:
    x, y = client_arrays(STORE, c)
    p = params
    for _ in range(EPOCHS):
      g = grad(p, params, x, y)
      if kind == "scaffold":
        g = jax.tree.map(lambda gi, ci, cc: gi - ci + cc, g, controls[c], c_server)
      p = jax.tree.map(lambda a, b: a - LR * b, p, g)
    deltas.append(jax.tree.map(lambda a, b: a - b, p, params))
    if kind == "scaffold":
      ci_new = jax.tree.map(lambda ci, cc, p0, pc: ci - cc + (p0 - pc) / (EPOCHS * LR), controls[c], c_server, params, p)
      dcs.append(jax.tree.map(lambda a, b: a - b, ci_new, controls[c]))
      new_controls[c] = ci_new
  if kind == "scaffold":
    w = np.ones(len(cohort)) / len(cohort)
  else:
    w = np.array([SIZES[c] for c in cohort], np.float64)
    w = w / w.sum()
  mean = lambda trees: jax.tree.map(lambda *a: sum(wi * ai for wi, ai in zip(w, a)), *trees)
  new_params = jax.tree.map(lambda p, d: p + server_lr * d, params, mean(deltas))
  if kind == "scaffold":
    c_server = jax.tree.map(lambda cc, d: cc + len(cohort) / C * d, c_server, mean(dcs))
  return new_params, new_controls, c_server


def build(kind, model, cohort_size=C, server_lr=1.0, mu=0.1):
  """`kind` from the config, as the runner builds it (its hyperparameters in the round state)."""
  overrides = {"algorithm.name": kind, **sgd_config(LR), "server.lr": server_lr}
  if kind == "fedprox":
    overrides["algorithm.fedprox.mu"] = mu
  return method(overrides, model, FULL, C, cohort_size, builder=True)


@functools.lru_cache(maxsize=None)
def reference_rounds(kind, rounds, cohorts=None, server_lr=1.0):
  """`rounds` rounds of `reference_round` from the tiny MLP's initial parameters (`cohorts`:
  each round's sampled clients; None: all). The loop does not depend on the strategy, so each
  test module computes it once per case and every strategy is compared with it."""
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  zeros = jax.tree.map(jnp.zeros_like, params)
  ref_p, ref_ctrl, ref_c = params, {c: zeros for c in range(C)}, zeros
  mu = 0.1 if kind == "fedprox" else 0.0
  grad = jax.jit(jax.grad(local_loss(model, mu)))  # one program per client size, for every round
  for t in range(rounds):
    cohort = list(cohorts[t]) if cohorts else list(range(C))
    ref_p, ref_ctrl, ref_c = reference_round(ref_p, ref_ctrl, ref_c, kind, cohort, grad, server_lr=server_lr)
  return ref_p, ref_ctrl, ref_c


# "sequential" is `ChunkedExecutor(1)`: the slow suite compares it with the reference, "chunked"
# (chunks of 4, 6 clients padded to 8) checks that executor by default, and
# test_minibatch_strategies_agree_with_momentum compares "sequential" with "vmap".
@pytest.mark.parametrize("kind", ["fedavg", "fedprox", "scaffold"])
@pytest.mark.parametrize("strategy", [pytest.param(s, marks=pytest.mark.slow) if s == "sequential" else s
                                      for s in STRATEGIES])
def test_round_equals_sequential_reference(kind, strategy):
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  alg = build(kind, model)
  state = init_round_state(alg, jax.random.PRNGKey(1), params, C)
  round_fn = make_round(alg, C, C, strategy, chunk_size=4)
  store = jax.tree.map(jnp.asarray, STORE)
  for t in range(3):
    state, _ = round_fn(state, store, jax.random.PRNGKey(10 + t))
  ref_p, ref_ctrl, ref_c = reference_rounds(kind, 3)
  assert tree_max_diff(state.server.params, ref_p) < 1e-5
  if kind == "scaffold":
    assert tree_max_diff(state.server.control, ref_c) < 1e-5
    for c in range(C):
      assert tree_max_diff(jax.tree.map(lambda a: a[c], state.clients), ref_ctrl[c]) < 1e-4


@pytest.mark.parametrize("strategy", ["vmap", "chunked", "host_loop"])
def test_partial_cohort_scaffold_keeps_unsampled_state(strategy):
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  S = 4
  alg = build("scaffold", model, cohort_size=S, server_lr=0.7)
  state = init_round_state(alg, jax.random.PRNGKey(1), params, C)
  round_fn = make_round(alg, C, S, strategy, chunk_size=3)  # 4 members, chunks of 3: padding
  store = jax.tree.map(jnp.asarray, STORE)
  zeros = jax.tree.map(jnp.zeros_like, params)
  cohorts = []
  for t in range(4):
    rng = jax.random.PRNGKey(20 + t)
    k_cohort, _ = jax.random.split(rng)
    cohorts.append(tuple(sorted(np.asarray(jax.random.choice(k_cohort, C, (S,), replace=False)).tolist())))
    state, _ = round_fn(state, store, rng)
  seen = set().union(*cohorts)
  ref_p, ref_ctrl, ref_c = reference_rounds("scaffold", 4, tuple(cohorts), server_lr=0.7)
  assert tree_max_diff(state.server.params, ref_p) < 1e-5
  for c in range(C):
    got = jax.tree.map(lambda a: a[c], state.clients)
    assert tree_max_diff(got, ref_ctrl[c]) < 1e-4
    if c not in seen:
      assert tree_max_diff(got, zeros) == 0.0


def test_fedavg_one_full_batch_step_is_centralised_gd():
  """FedAvg, one local full-batch SGD step, example weights == GD on the pooled data."""
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=1, batch_size=N_MAX, epochs=1, passes=1, unroll=1)
  alg = method({**sgd_config(LR), "server.lr": 1.0}, model, sched, C, builder=True)
  state = init_round_state(alg, jax.random.PRNGKey(1), params, C)
  round_fn = make_round(alg, C, C, "vmap")
  store = jax.tree.map(jnp.asarray, STORE)
  xs = jnp.concatenate([client_arrays(STORE, c)[0] for c in range(C)])
  ys = jnp.concatenate([client_arrays(STORE, c)[1] for c in range(C)])
  p = params
  grad = jax.jit(jax.grad(lambda q: _mean_ce(model, q, xs, ys)))  # one program, not one per primitive
  for t in range(5):
    state, _ = round_fn(state, store, jax.random.PRNGKey(t))
    g = grad(p)
    p = jax.tree.map(lambda a, b: a - LR * b, p, g)
  assert tree_max_diff(state.server.params, p) < 1e-5


def test_batch_indices_are_epochs_of_the_clients_own_rows():
  count, n_max, B = 7, 12, 3
  sched = make_schedule(B, 0, 2, n_max, count)  # 2 epochs, ceil(2*12/3)=8 steps compiled
  idx, mask = batch_indices(jax.random.PRNGKey(0), count, n_max, sched)
  idx, mask = np.asarray(idx).ravel(), np.asarray(mask).ravel()
  real = idx[mask > 0]
  assert len(real) == 2 * count
  assert sorted(real[:count]) == list(range(count)) and sorted(real[count:]) == list(range(count))
  assert idx.max() < count  # padding rows are never read
  # Fixed-step mode: every position is real and still cycles through permutations.
  sched = make_schedule(B, 5, 1, n_max, count)
  idx, mask = batch_indices(jax.random.PRNGKey(1), count, n_max, sched)
  flat = np.asarray(idx).ravel()
  assert np.asarray(mask).min() == 1.0 and sorted(flat[:count]) == list(range(count))
  assert sorted(flat[count:2 * count]) == list(range(count))


@pytest.mark.parametrize("opt", [optax.sgd(0.1, momentum=0.9), optax.adam(0.01)])
def test_steps_past_a_clients_data_change_nothing(opt):
  """A client with 5 examples, batch 2, one epoch: 3 real steps. Compiling 3 or 8 steps
  (as a padded cohort with a bigger client would) gives identical parameters."""
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  x = jnp.asarray(STORE.x[1]); y = jnp.asarray(STORE.y[1])
  data = ClientData(x, y, jnp.zeros_like(y), jnp.asarray(5))
  obj = erm_objective(model)
  out = []
  for steps in (3, 8):
    sched = LocalSchedule(num_steps=steps, batch_size=2, epochs=1, passes=1, unroll=1)
    out.append(local_train(params, obj, opt, data, jax.random.PRNGKey(3), sched))
  assert tree_max_diff(out[0][0], out[1][0]) == 0.0
  assert float(out[0][1]) == pytest.approx(float(out[1][1]), rel=1e-6)
  assert tree_max_diff(out[0][0], params) > 0


def test_minibatch_strategies_agree_with_momentum():
  """With real minibatches and momentum, every strategy gives the vmap result."""
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = make_schedule(4, 0, 2, N_MAX, min(SIZES))
  alg = method({"algorithm.name": "fedadam", **sgd_config(0.1, 0.9), **adam_config(0.05, prefix="server")},
               model, sched, C, 5, builder=True)
  store = jax.tree.map(jnp.asarray, STORE)
  results = {}
  for strategy in STRATEGIES:
    state = init_round_state(alg, jax.random.PRNGKey(1), params, C)
    round_fn = make_round(alg, C, 5, strategy, chunk_size=2)
    for t in range(3):
      state, m = round_fn(state, store, jax.random.PRNGKey(t))
    results[strategy] = state.server.params
  for s in STRATEGIES:
    assert tree_max_diff(results[s], results["vmap"]) < 1e-5, s


SHARDED_SCRIPT = r"""
import sys; sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import jax, jax.numpy as jnp, optax
assert jax.device_count() == 4, jax.devices()
from fedjax_dg.algorithms.base import make_schedule
from fedjax_dg.engine import init_round_state, make_round
from helpers import method, ragged_store, sgd_config, tiny_mlp, tree_max_diff
store = ragged_store(sizes=(9, 5, 12, 7, 3, 10, 4, 8, 6))
C = 9
model = tiny_mlp()
params = model.init(jax.random.PRNGKey(0))
sched = make_schedule(4, 0, 2, 12, 3)
algs = [method({{"algorithm.name": name, **sgd_config(0.1, momentum), "server.lr": 1.0}}, model, sched, C, 7)
        for name, momentum in (("fedavg", 0.9), ("scaffold", 0.0))]
# The cohort of 7 is padded to 8: 2 members on each device. FedAvg under vmap, sequential
# (chunks of 1: a 2-step scan on each device) and the host loop; SCAFFOLD (persistent client
# state) under chunked (chunks of 2, the same sharded chunk code) and the host loop.
for alg in algs:
  for strategy in (("vmap", "sequential", "host_loop") if alg.name == "fedavg" else ("chunked", "host_loop")):
    out = []
    for devices in (jax.devices()[:1], jax.devices()):
      state = init_round_state(alg, jax.random.PRNGKey(1), params, C)
      rf = make_round(alg, C, 7, strategy, chunk_size=2, devices=devices)
      for t in range(3):
        state, m = rf(state, jax.tree.map(jnp.asarray, store), jax.random.PRNGKey(t))
      out.append(state)
    d = max(tree_max_diff(out[0].server, out[1].server), tree_max_diff(out[0].clients, out[1].clients) if jax.tree.leaves(out[0].clients) else 0.0)
    print(alg.name, strategy, d)
    assert d < 1e-5, (alg.name, strategy, d)
print("SHARDED_OK")
"""


@pytest.mark.host_devices(SHARDED_SCRIPT, "SHARDED_OK")
def test_sharded_over_four_host_devices_equals_one_device(host_devices):
  ok, output = host_devices
  assert ok, output
