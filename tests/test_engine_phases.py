"""The round's three exchanges (pre-round stat, update, post-round report) under every
strategy, against a plain Python loop over the cohort."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dg.algorithms.base import Algorithm, ClientData, ClientOutput, Stacked
from fedjax_dg.engine import STRATEGIES, init_round_state, make_round
from helpers import ragged_store, tree_max_diff

STORE = ragged_store()
C, D = STORE.counts.shape[0], STORE.x.shape[-1]


def _stacked_or_mean(agg):
  """A stacked aggregate reduced in a way that depends on which member sent which row."""
  if isinstance(agg, Stacked):
    v = agg.messages["v"] * (agg.messages["id"] + 1.0)[:, None]
    return jnp.tensordot(agg.weights, v, axes=1) / jnp.sum(agg.weights)
  return agg["v"]


def toy(stat_how: str, report_how: str) -> Algorithm:
  """A toy algorithm with all three phases; each depends on the state the previous one left."""
  def client_stat(theta, cs, data, rng):
    mean_x = jnp.sum(data.x * data.mask[:, None], 0) / data.count
    return {"id": jnp.asarray(data.client_id, jnp.float32), "v": mean_x + cs + jax.random.normal(rng, (D,))}

  def server_prepare(server, agg):
    return {**server, "stat": _stacked_or_mean(agg)}

  def client_update(bcast, cs, data, rng):
    theta, stat = bcast
    mean_x = jnp.sum(data.x * data.mask[:, None], 0) / data.count
    new = theta + 0.5 * (mean_x - theta) + 0.1 * stat + 0.01 * jax.random.normal(rng, (D,))
    return ClientOutput(new - theta, cs + new, {"loss": jnp.sum(mean_x ** 2)})

  def server_update(server, mean_delta):
    return {**server, "theta": server["theta"] + mean_delta}

  def client_report(bcast, cs, data, rng):
    theta, _ = bcast
    return {"id": jnp.asarray(data.client_id, jnp.float32),
            "v": cs * theta + data.count + jax.random.uniform(rng, (D,))}

  def server_finish(server, agg):
    out = {**server, "report": _stacked_or_mean(agg)}
    if isinstance(agg, Stacked):  # every real member's report in its client's row
      ids = jnp.where(agg.weights > 0, agg.messages["id"].astype(jnp.int32), C)
      out["table"] = server["table"].at[ids].set(agg.messages["v"], mode="drop")
    return out

  zeros = jnp.zeros((D,))
  return Algorithm(
      name="toy", server_init=lambda rng, p: {"theta": p, "stat": zeros, "report": zeros, "table": jnp.zeros((C, D))},
      client_init=lambda p: jnp.zeros_like(p), broadcast=lambda s: (s["theta"], s["stat"]),
      client_update=client_update, server_update=server_update, params_of=lambda s: s["theta"],
      client_stat=client_stat, server_prepare=server_prepare, stat_aggregation=stat_how,
      client_report=client_report, server_finish=server_finish, report_aggregation=report_how)


def reference(alg, cohort_size, rounds):
  """A plain loop over the cohort: the round as `make_round` documents it."""
  state = init_round_state(alg, None, jnp.ones((D,)), C)
  server, clients = state.server, [state.clients[c] for c in range(C)]
  one = lambda c: ClientData(*(jnp.asarray(a[c]) for a in (STORE.x, STORE.y, STORE.domain, STORE.counts)), client_id=c)

  def reduce(values, weights, how):
    if how == "stack":
      return Stacked(jax.tree.map(lambda *a: jnp.stack(a), *values), jnp.asarray(weights, jnp.float32))
    return jax.tree.map(lambda *a: sum(w * x for w, x in zip(weights, a)) / sum(weights), *values)

  for t in range(rounds):
    k_cohort, k_clients = jax.random.split(jax.random.PRNGKey(t))
    cohort = list(range(C)) if cohort_size == C else sorted(
        np.asarray(jax.random.choice(k_cohort, C, (cohort_size,), replace=False)).tolist())
    keys = {c: jax.random.fold_in(k_clients, c) for c in cohort}
    ones = [1.0] * len(cohort)
    stats = [alg.client_stat(alg.broadcast(server), clients[c], one(c), keys[c]) for c in cohort]
    server = alg.server_prepare(server, reduce(stats, ones, alg.stat_aggregation))
    outs = [alg.client_update(alg.broadcast(server), clients[c], one(c), keys[c]) for c in cohort]
    sizes = [float(STORE.counts[c]) for c in cohort]
    server = alg.server_update(server, reduce([o.message for o in outs], sizes, "mean"))
    for c, o in zip(cohort, outs):
      clients[c] = o.state
    reports = [alg.client_report(alg.broadcast(server), clients[c], one(c), jax.random.fold_in(keys[c], 1))
               for c in cohort]
    server = alg.server_finish(server, reduce(reports, ones, alg.report_aggregation))
  return server, jnp.stack(clients)


def run_engine(alg, cohort_size, rounds, strategy, place=False, devices=None):
  state = init_round_state(alg, None, jnp.ones((D,)), C)
  rf = make_round(alg, C, cohort_size, strategy, chunk_size=2, devices=devices)
  store = jax.tree.map(jnp.asarray, STORE)
  if place:
    store = rf.place(rf.place(store))  # placing is idempotent
  for t in range(rounds):
    state, metrics = rf(state, store, jax.random.PRNGKey(t))
  assert set(metrics) == {"loss"}
  return state


def strategies(*fast):
  """Every strategy; those not in `fast` run with -m slow."""
  return [s if s in fast else pytest.param(s, marks=pytest.mark.slow) for s in STRATEGIES]


# "sequential" is `ChunkedExecutor(1)`: the slow suite runs it, "chunked" (chunks of 2, a
# padded cohort of 5) checks that executor by default.
@pytest.mark.parametrize("strategy", strategies("vmap", "chunked", "host_loop"))
@pytest.mark.parametrize("how", [("mean", "stack"), ("stack", "mean")])
def test_three_phases_equal_a_python_loop(strategy, how):
  alg = toy(*how)
  for cohort_size in (C, 5):
    server, clients = reference(alg, cohort_size, 2)
    state = run_engine(alg, cohort_size, 2, strategy)
    assert tree_max_diff(state.server, server) < 1e-5, (strategy, how, cohort_size)
    assert tree_max_diff(state.clients, clients) < 1e-5
  if how[1] == "stack":  # the members' reports landed in their clients' rows
    assert float(jnp.abs(state.server["table"]).sum()) > 0


def test_placed_store_gives_the_same_round():
  alg = toy("mean", "stack")
  a = run_engine(alg, 5, 2, "host_loop")
  b = run_engine(alg, 5, 2, "host_loop", place=True)
  assert tree_max_diff(a, b) == 0.0


SHARDED_SCRIPT = r"""
import sys; sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import jax
assert jax.device_count() == 4, jax.devices()
from fedjax_dg.engine import STRATEGIES
from helpers import tree_max_diff
from test_engine_phases import C, reference, run_engine, toy
for how in [("mean", "stack"), ("stack", "mean")]:
  alg = toy(*how)
  server, clients = reference(alg, 5, 2)
  for strategy in STRATEGIES:
    for place in (False, True):
      state = run_engine(alg, 5, 2, strategy, place=place)
      d = max(tree_max_diff(state.server, server), tree_max_diff(state.clients, clients))
      print(how, strategy, place, d)
      assert d < 1e-5, (how, strategy, place, d)
print("PHASES_SHARDED_OK")
"""


@pytest.mark.slow  # the default suite checks FedGA's and FedLOE stage 2's reports on 4 devices
@pytest.mark.host_devices(SHARDED_SCRIPT, "PHASES_SHARDED_OK")
def test_three_phases_on_four_host_devices(host_devices):
  ok, output = host_devices
  assert ok, output
