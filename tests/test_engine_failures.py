"""Clients that fail (dropout, stragglers) and ragged clients run at their own steps
(buckets), for every strategy, against plain Python loops over the clients."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dg.algorithms.base import LocalSchedule, local_train, erm_objective, make_schedule
from fedjax_dg.engine import STRATEGIES, init_round_state, make_round
from fedjax_dg.engine.round import buckets_for
from helpers import adam_config, client_arrays, method, ragged_store, sgd_config, tiny_mlp, tree_max_diff

STORE = ragged_store()
SIZES = STORE.counts.tolist()
C, N_MAX = len(SIZES), max(SIZES)
LR, EPOCHS = 0.2, 3
FULL = LocalSchedule(num_steps=EPOCHS, batch_size=N_MAX, epochs=EPOCHS, passes=EPOCHS, unroll=1)


def fedavg(model, sched=FULL, server_adam=None, momentum=0.0, lr=LR):
  """FedAvg (local SGD at `lr`) from the config, with FedAdam's rule at `server_adam`."""
  server = ({"algorithm.name": "fedadam", **adam_config(server_adam, prefix="server")} if server_adam
            else {"algorithm.name": "fedavg", "server.lr": 1.0})
  return method({**sgd_config(lr, momentum), **server}, model, sched, C, builder=True)


def scaffold(model, sched, lr, server_lr, cohort_size, num_clients):
  return method({"algorithm.name": "scaffold", **sgd_config(lr), "server.lr": server_lr}, model, sched, num_clients,
                cohort_size, builder=True)


def strategies(*fast):
  """Every strategy; those not in `fast` run with -m slow."""
  return [s if s in fast else pytest.param(s, marks=pytest.mark.slow) for s in STRATEGIES]


def _ce(model, p, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()


def documented_failures(rng, cohort, dropout, straggler_fraction):
  """The reporters and each member's local steps (of EPOCHS), as make_round documents them."""
  k_drop, k_slow, k_work = jax.random.split(jax.random.fold_in(rng, 1), 3)
  up = [not bool(jax.random.bernoulli(jax.random.fold_in(k_drop, c), dropout)) for c in cohort]
  n_slow = int(round(straggler_fraction * len(cohort)))
  slow = set(np.asarray(jax.random.permutation(k_slow, len(cohort))[:n_slow]).tolist())
  steps = [min(EPOCHS, int(np.floor(float(jax.random.uniform(jax.random.fold_in(k_work, c))) * EPOCHS)) + 1)
           if pos in slow else EPOCHS for pos, c in enumerate(cohort)]
  return [c for c, u in zip(cohort, up) if u], dict(zip(cohort, steps))


def cohort_of(rng, size):
  k_cohort, _ = jax.random.split(rng)
  return sorted(np.asarray(jax.random.choice(k_cohort, C, (size,), replace=False)).tolist())


_GD_STEP = {}


def _gd_step(model):
  """One full-batch GD step on a client's own rows, jitted once per model."""
  if id(model) not in _GD_STEP:
    _GD_STEP[id(model)] = (model, jax.jit(lambda p, x, y: jax.tree.map(
        lambda a, g: a - LR * g, p, jax.grad(lambda q: _ce(model, q, x, y))(p))))
  return _GD_STEP[id(model)][1]


def fedavg_over(model, params, reporters, steps):
  """FedAvg with full-batch GD over the reporters only, client c taking steps[c] steps."""
  deltas, w = [], []
  for c in reporters:
    x, y = client_arrays(STORE, c)
    p = params
    for _ in range(steps[c]):
      p = _gd_step(model)(p, x, y)
    deltas.append(jax.tree.map(jnp.subtract, p, params))
    w.append(SIZES[c])
  w = np.asarray(w, np.float64) / sum(w)
  return jax.tree.map(lambda p, *d: p + sum(wi * di for wi, di in zip(w, d)), params, *deltas)


@pytest.mark.parametrize("strategy", strategies("sequential", "host_loop"))
def test_dropout_and_stragglers_equal_a_loop_over_the_reporters(strategy):
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  alg = fedavg(model)
  S = 5
  rf = make_round(alg, C, S, strategy, chunk_size=2, dropout=0.4, straggler_fraction=0.6)
  state = init_round_state(alg, None, params, C)
  ref, seen = params, []
  for t in range(3):
    rng = jax.random.PRNGKey(100 + t)
    reporters, steps = documented_failures(rng, cohort_of(rng, S), 0.4, 0.6)
    seen.append((len(reporters), sorted(set(steps.values()))))
    state, m = rf(state, jax.tree.map(jnp.asarray, STORE), rng)
    assert int(m["reporters"]) == len(reporters)
    if reporters:
      ref = fedavg_over(model, ref, reporters, steps)
  assert tree_max_diff(state.server.params, ref) < 1e-5
  # the keys above exercise what they claim: someone dropped, someone straggled
  assert any(n < S for n, _ in seen) and any(min(s) < EPOCHS for _, s in seen), seen


@pytest.mark.parametrize("strategy", strategies("sequential"))
def test_zero_dropout_is_todays_round_bit_for_bit(strategy):
  """`dropout=0, straggler_fraction=0` is today's round; and the failure path itself (taken
  for any positive rate) at a rate where nobody drops or straggles gives that same round:
  the renormalised weights, the reporter count and the keep-the-server guard change nothing
  when everyone reports."""
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  alg = fedavg(model, make_schedule(4, 0, 2, N_MAX, min(SIZES)), server_adam=0.05, momentum=0.9, lr=0.1)
  out = []
  # 1e-9: no member drops at these keys; 0.01 of 4 members rounds to 0 stragglers.
  for kw in ({}, dict(dropout=0.0, straggler_fraction=0.0), dict(dropout=1e-9, straggler_fraction=0.01)):
    state = init_round_state(alg, None, params, C)
    rf = make_round(alg, C, 4, strategy, chunk_size=2, **kw)
    for t in range(2):
      rng = jax.random.PRNGKey(t)
      state, m = rf(state, jax.tree.map(jnp.asarray, STORE), rng)
      if kw.get("dropout", 0.0) > 0:  # the failure path ran, and everyone reported
        assert int(m["reporters"]) == 4 == len(documented_failures(rng, cohort_of(rng, 4), kw["dropout"],
                                                                   kw["straggler_fraction"])[0])
      else:
        assert "reporters" not in m
    out.append(state)
  assert tree_max_diff(out[0], out[1]) == 0.0
  assert tree_max_diff(out[0], out[2]) < 1e-6


@pytest.mark.parametrize("strategy", strategies("sequential"))
def test_dropped_scaffold_clients_keep_their_controls(strategy):
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  alg = scaffold(model, FULL, LR, 1.0, C, C)
  rf = make_round(alg, C, C, strategy, chunk_size=4, dropout=0.5)
  rng = jax.random.PRNGKey(7)
  reporters, _ = documented_failures(rng, list(range(C)), 0.5, 0.0)
  assert 0 < len(reporters) < C
  state, m = rf(init_round_state(alg, None, params, C), jax.tree.map(jnp.asarray, STORE), rng)
  # one round from zero controls: each reporter's control is (theta - theta_c) / (K eta_l)
  for c in range(C):
    got = jax.tree.map(lambda a: a[c], state.clients)
    if c in reporters:
      x, y = client_arrays(STORE, c)
      p = params
      for _ in range(EPOCHS):
        p = jax.tree.map(lambda a, g: a - LR * g, p, jax.grad(lambda q: _ce(model, q, x, y))(p))
      want = jax.tree.map(lambda a, b: (a - b) / (EPOCHS * LR), params, p)
      assert tree_max_diff(got, want) < 1e-4
    else:
      assert tree_max_diff(got, jax.tree.map(jnp.zeros_like, params)) == 0.0
  # SCAFFOLD weighs clients uniformly: the uniform mean of the reporters' updates
  deltas = [jax.tree.map(jnp.subtract, fedavg_over(model, params, [c], {c: EPOCHS}), params) for c in reporters]
  want = jax.tree.map(lambda p, *d: p + sum(d) / len(d), params, *deltas)
  assert tree_max_diff(state.server.params, want) < 1e-5


@pytest.mark.parametrize("strategy", strategies("host_loop"))
def test_a_round_without_reporters_keeps_the_server_state(strategy):
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  alg = fedavg(model, server_adam=0.05)  # Adam would move on a zero update
  state = init_round_state(alg, None, params, C)
  state, _ = make_round(alg, C, 3, strategy)(state, jax.tree.map(jnp.asarray, STORE), jax.random.PRNGKey(0))
  p = 0.9
  rng = next(jax.random.PRNGKey(k) for k in range(1000)
             if not documented_failures(jax.random.PRNGKey(k), cohort_of(jax.random.PRNGKey(k), 3), p, 0.0)[0])
  new, m = make_round(alg, C, 3, strategy, dropout=p)(state, jax.tree.map(jnp.asarray, STORE), rng)
  assert int(m["reporters"]) == 0
  assert tree_max_diff(new, state) == 0.0


def test_failure_fields_are_checked():
  alg = fedavg(tiny_mlp())
  with pytest.raises(ValueError, match="engine.dropout"):
    make_round(alg, C, 3, dropout=1.0)
  with pytest.raises(ValueError, match="engine.straggler_fraction"):
    make_round(alg, C, 3, straggler_fraction=1.5)


# ------------------------------------------------------------------ ragged clients: buckets


def test_a_capped_local_loop_compiles_fewer_steps_with_the_same_result():
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = make_schedule(2, 0, 2, N_MAX, min(SIZES))  # 2 epochs of ceil(12 / 2) = 6 steps
  x, y = jnp.asarray(STORE.x[1]), jnp.asarray(STORE.y[1])  # 5 examples: 3 steps per epoch
  from fedjax_dg.algorithms.base import ClientData
  data = ClientData(x, y, jnp.zeros_like(y), jnp.asarray(5))
  train = lambda d: local_train(params, erm_objective(model), optax.sgd(0.1, momentum=0.9), d,
                               jax.random.PRNGKey(3), sched)
  full = train(data)
  capped = train(data._replace(step_cap=3))
  jaxpr = str(jax.make_jaxpr(lambda: train(data._replace(step_cap=3)))())
  assert "length=6" in jaxpr and "length=12" not in jaxpr
  assert tree_max_diff(full, capped) == 0.0


@pytest.mark.parametrize("strategy", strategies("sequential"))
def test_bucketed_round_equals_the_masked_round(strategy):
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  store = ragged_store(sizes=(2, 5, 12, 3, 1, 8))
  sched = make_schedule(2, 0, 2, 12, 1)
  buckets = buckets_for(sched)
  assert buckets.caps == (1, 2, 4, 6)
  alg = scaffold(model, sched, 0.1, 1.0, 4, 6)
  out = []
  for b in (None, buckets):
    state = init_round_state(alg, None, params, 6)
    rf = make_round(alg, 6, 4, strategy, chunk_size=2, buckets=b)
    for t in range(3):
      state, m = rf(state, jax.tree.map(jnp.asarray, store), jax.random.PRNGKey(t))
    out.append(state)
  assert tree_max_diff(out[0], out[1]) < 1e-6


# ------------------------------------------------------------------ the runner


@pytest.mark.parametrize("field,value", [("engine.dropout", 1.0), ("engine.dropout", -0.1),
                                         ("engine.straggler_fraction", 2.0)])
def test_bad_failure_config_is_one_line_naming_the_field(tiny_config, tmp_path, field, value, monkeypatch):
  from fedjax_dg import experiment
  from fedjax_dg.config import ConfigError
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled before validating"))
  tiny_config.engine[field.split(".")[1]] = value
  with pytest.raises(ConfigError) as e:
    experiment.train_and_evaluate(tiny_config, str(tmp_path / "w"))
  assert field in str(e.value) and "\n" not in str(e.value)


def test_metrics_jsonl_counts_the_reporters_of_every_round(tiny_config, tmp_path):
  import json
  from fedjax_dg import experiment
  tiny_config.engine.dropout = 0.5
  tiny_config.engine.straggler_fraction = 0.5
  tiny_config.cohort_size = 4
  tiny_config.checkpoint_every = 0
  experiment.train_and_evaluate(tiny_config, str(tmp_path / "w"))
  recs = [json.loads(l) for l in open(tmp_path / "w" / "metrics.jsonl")]
  counts = [n for r in recs for n in r["reporters"]]
  assert len(counts) == tiny_config.num_rounds and all(0 <= n <= 4 for n in counts)
  assert min(counts) < 4  # someone dropped out
  for r in recs:
    first = r["round"] - len(r["reporters"]) + 1
    assert r["rounds_without_reporters"] == [first + i for i, n in enumerate(r["reporters"]) if n == 0]


# ------------------------------------------------------------------ client states in host memory


@pytest.mark.parametrize("strategy", strategies("sequential"))
def test_host_client_states_equal_the_device_table(strategy):
  from fedjax_dg.engine.host_state import HostClientStates
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  S = 3
  alg = scaffold(model, FULL, LR, 0.7, S, C)
  store = jax.tree.map(jnp.asarray, STORE)
  out = []
  for host in (False, True):
    state = init_round_state(alg, None, params, C, host_states=host)
    rf = make_round(alg, C, S, strategy, chunk_size=2, dropout=0.3)
    for t in range(3):
      state, _ = rf(state, store, jax.random.PRNGKey(30 + t))
    out.append(state)
  table = out[1].clients
  assert isinstance(table, HostClientStates)
  assert tree_max_diff(out[0].server, out[1].server) < 1e-6
  assert tree_max_diff(out[0].clients, table.stacked()) < 1e-6
  # only the clients that reported hold a stored state; the others read the initial one
  touched = int((table.slot >= 0).sum())
  assert 0 < touched < C and table.used == touched
  one = sum(a.nbytes for a in jax.tree.leaves(params))
  assert table.nbytes <= table.slot.nbytes + max(16, 2 * touched) * one


@pytest.mark.slow  # two runs; the engine-level equality runs by default above
def test_runner_with_buckets_gives_the_masked_runs_metrics(tiny_config, tmp_path):
  import json
  from fedjax_dg import experiment
  tiny_config.partition.method = "dirichlet"  # ragged clients
  tiny_config.num_rounds, tiny_config.eval_every, tiny_config.checkpoint_every = 2, 2, 0
  tiny_config.client.batch_size = 4
  recs = []
  for buckets in (False, True):
    tiny_config.engine.buckets = buckets
    s = experiment.train_and_evaluate(tiny_config, str(tmp_path / f"w{buckets}"))
    recs.append([json.loads(l) for l in open(tmp_path / f"w{buckets}" / "metrics.jsonl")])
  sizes = s["client_sizes"]
  assert max(sizes) >= 2 * min(sizes) and s["local_steps"] > 1  # the buckets have something to skip
  assert recs[0] == recs[1]


def test_the_host_loop_does_not_run_dropped_members():
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  alg = fedavg(model)()  # the Algorithm the builder makes, to count its client updates
  runs = []

  def update(*args):
    jax.debug.callback(lambda: runs.append(1))
    return alg.client_update(*args)
  rf = make_round(alg._replace(client_update=update), C, C, "host_loop", dropout=0.5)
  rng = jax.random.PRNGKey(7)
  reporters, _ = documented_failures(rng, list(range(C)), 0.5, 0.0)
  state, m = rf(init_round_state(alg, None, params, C), jax.tree.map(jnp.asarray, STORE), rng)
  jax.effects_barrier()
  assert 0 < len(reporters) < C and len(runs) == int(m["reporters"]) == len(reporters)
  assert tree_max_diff(state.server.params, fedavg_over(model, params, reporters, {c: EPOCHS for c in range(C)})) < 1e-5


@pytest.mark.parametrize("how", [("stack", "stack"), ("mean", "mean")])
def test_skipped_members_send_what_the_masked_strategies_discard(how):
  """Three exchanges with stacked aggregates and dropout: the host loop (which skips dropped
  members) equals vmap (which runs and discards them)."""
  from test_engine_phases import D, STORE as PSTORE, toy
  alg = toy(*how)
  out, counts = [], []
  for strategy in ("vmap", "host_loop"):
    state = init_round_state(alg, None, jnp.ones((D,)), C)
    rf = make_round(alg, C, 5, strategy, dropout=0.5)
    for t in range(3):
      state, m = rf(state, jax.tree.map(jnp.asarray, PSTORE), jax.random.PRNGKey(t))
      counts.append(int(m["reporters"]))
    out.append(state)
  assert tree_max_diff(out[0], out[1]) < 1e-5
  assert 0 < min(counts) < 5, counts  # members did drop, and someone reported
