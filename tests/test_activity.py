"""Activity: the preflight findings of a run whose method cannot act, and the activity
records the methods emit, against hand computations."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dg.activity import Finding, preflight
import helpers
from helpers import config_with, tiny_mlp


def _find(overrides, local_steps=5, rounds=60, client_domains=(1, 1, 1)):
  return preflight(config_with(overrides), local_steps=local_steps, rounds=rounds, client_domains=client_domains)


def test_a_schedule_that_never_reaches_its_target_is_an_error_naming_the_field():
  # The report's case: 500 update steps of annealing, a run of 60 rounds x 5 local steps.
  (f,) = _find({"algorithm.name": "irm", "algorithm.irm.anneal_steps": 500, "algorithm.irm.lam": 1.66e4},
               client_domains=(2, 3))
  assert f.level == "error" and f.field == "algorithm.irm.anneal_steps" and not f.equals_baseline
  assert f.message.startswith("algorithm.irm.anneal_steps:") and "\n" not in f.message and "300" in f.message
  # 299 steps of annealing in 300: reaches lam at the last step; the default share always does.
  assert _find({"algorithm.name": "vrex", "algorithm.vrex.anneal_steps": 299}, client_domains=(2,)) == []
  assert _find({"algorithm.name": "vrex"}, local_steps=1, rounds=3, client_domains=(2,)) == []
  # lam = 1: the weight is at its target all along.
  assert _find({"algorithm.name": "irm", "algorithm.irm.anneal_steps": 500, "algorithm.irm.lam": 1.0},
               client_domains=(2,)) == []


def test_on_single_domain_clients_the_domain_penalties_train_plain_erm():
  """What preflight's `equals_baseline` claims, on the updates themselves: VREx's variance,
  MMD's and CORAL's pair terms need two domains, and IRM's penalty is applied only where two
  or more are present (`dg.py`: IRMv1's per-domain product itself is not zero on one domain),
  so on a client holding one domain all four send the same update, bit for bit, as a plain
  ERM client (IRM's weight 100 from the first step); on two domains IRM's differs."""
  from fedjax_dg.algorithms.base import ClientData, LocalSchedule
  from fedjax_dg.algorithms.dg import dg_client
  from fedjax_dg.objectives import irm_penalty
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=3, batch_size=8, epochs=0, passes=3, unroll=1)
  d = _two_domain_data()
  one = ClientData(d.x, d.y, jnp.zeros_like(d.domain), d.count)  # every row in domain 0
  msg = lambda k, data: client_message(dg_client(model, sched, optax.sgd(0.1), k, 100.0, 3, 0), params, data)  # noqa: E731
  erm = client_message(dg_client(model, sched, optax.sgd(0.1), "vrex", 0.0, 3, 0), params, one)
  for k in ("vrex", "mmd", "coral", "irm"):
    assert helpers.tree_max_diff(msg(k, one), erm) == 0.0, k
  assert helpers.tree_max_diff(msg("irm", d), msg("vrex", d)) > 1e-4
  logits = model.apply(params, one.x)
  assert abs(float(irm_penalty(logits, one.y))) > 0  # the gate, not the formula, makes it zero


def client_message(client, params, data):
  return jax.jit(client.update)(params, jnp.asarray(5), (), data, jax.random.PRNGKey(2)).message


@pytest.mark.parametrize("name,field", [("vrex", "lam"), ("mmd", "gamma"), ("coral", "gamma")])
def test_penalties_between_domains_on_single_domain_clients_equal_fedavg(name, field):
  (f,) = _find({"algorithm.name": name})
  assert (f.level, f.field, f.equals_baseline) == ("warning", f"algorithm.{name}.{field}", True)
  (f,) = _find({"algorithm.name": name + "+omg"})  # another rule: the rule still acts
  assert not f.equals_baseline
  (f,) = _find({"algorithm.name": name}, client_domains=(1, 2, 3))
  assert "1 of 3 clients" in f.message and not f.equals_baseline
  assert _find({"algorithm.name": name}, client_domains=(2, 3)) == []


def test_fedprox_with_one_local_step_or_mu_zero_equals_fedavg():
  (f,) = _find({"algorithm.name": "fedprox"}, local_steps=1)
  assert (f.level, f.field, f.equals_baseline) == ("warning", "algorithm.fedprox.mu", True)
  assert _find({"algorithm.name": "fedprox"}, local_steps=2) == []
  (f,) = _find({"algorithm.name": "fedprox", "algorithm.fedprox.mu": 0.0}, local_steps=4)
  assert f.equals_baseline and f.field == "algorithm.fedprox.mu"


def test_fedprox_with_one_local_step_is_fedavg_exactly():
  """The warning's claim, checked: one local SGD step of FedProx equals FedAvg's."""
  from fedjax_dg.algorithms.base import LocalSchedule
  st = helpers.ragged_store()
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=1, batch_size=4, epochs=0, passes=3, unroll=1)
  out = [helpers.run_from(helpers.method({"algorithm.name": n, "algorithm.fedprox.mu": 0.7, **helpers.sgd_config(0.1)},
                                         model, sched, 6), params, st, 6, 6, 2).server.params
         for n in ("fedprox", "fedavg")]
  assert helpers.tree_max_diff(out[0], out[1]) < 1e-6


def test_fish_on_single_domain_clients_is_a_warning():
  (f,) = _find({"algorithm.name": "fish"})
  assert (f.level, f.field, f.equals_baseline) == ("warning", "algorithm.fish.meta_lr", False)
  assert _find({"algorithm.name": "fish"}, client_domains=(1, 2)) == []


def test_errors_come_first_and_findings_are_one_line():
  fs = _find({"algorithm.name": "irm", "algorithm.irm.anneal_steps": 10 ** 6})
  assert [f.level for f in fs] == ["error", "warning"]
  assert all(isinstance(f, Finding) and "\n" not in f.message for f in fs)
  assert _find({"algorithm.name": "fedavg"}) == []


# ------------------------------------------------------------------ client activity records


def _two_domain_data(n=8, seed=0):
  from fedjax_dg.algorithms.base import ClientData
  rng = np.random.default_rng(seed)
  dom = np.array([0, 2] * (n // 2))
  return ClientData(jnp.asarray(rng.normal(size=(n, 6)) + dom[:, None], jnp.float32),
                    jnp.asarray(rng.integers(0, 3, n)), jnp.asarray(dom), jnp.asarray(n))


def _flat_norm(tree):
  return float(np.sqrt(sum(np.sum(np.asarray(a, np.float64) ** 2) for a in jax.tree.leaves(tree))))


def test_irm_activity_records_against_a_replay_of_the_local_steps():
  """One IRM client round (4 full-batch SGD steps, round 1 of a run whose annealing lasts
  T_a = 6 steps): `weight_at_target` is the share of steps 4..7 at or past 6 (1/2),
  `penalty_loss_share` the mean over the steps of |lambda_t pen| / |loss| at each step's
  parameters, `penalty_grad_share` ||grad lambda_0 pen|| / ||grad loss|| at the first step,
  all replayed step by step here."""
  from fedjax_dg.algorithms.base import LocalSchedule
  from fedjax_dg.algorithms.dg import dg_client, dg_objective
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  K, lr, lam, T_a, round_ = 4, 0.05, 30.0, 6, 1
  sched = LocalSchedule(num_steps=K, batch_size=8, epochs=0, passes=K, unroll=1)
  data = _two_domain_data()
  client = dg_client(model, sched, optax.sgd(lr), "irm", lam, 3, T_a)
  out = jax.jit(client.update)(params, jnp.asarray(round_), (), data, jax.random.PRNGKey(2))
  objective = dg_objective(model, "irm", lam, 3, T_a, K)(round_)
  from fedjax_dg.algorithms.base import Batch, batch_indices
  idx, _ = batch_indices(jax.random.split(jax.random.PRNGKey(2))[0], data.count, 8, sched)  # local_loop's rows
  step = jax.jit(jax.value_and_grad(objective, has_aux=True))  # one program, not one per primitive
  p, shares, at = params, [], []
  for s in range(K):  # every step reads all 8 rows, in the order IRM's even/odd halves depend on
    batch = Batch(data.x[idx[s]], data.y[idx[s]], data.domain[idx[s]], jnp.ones(8), s)
    (loss, aux), g = step(p, batch, None)
    lam_t = 1.0 if round_ * K + s < T_a else lam
    shares.append(abs(lam_t * float(aux["penalty"])) / abs(float(loss)))
    at.append(float(lam_t == lam))
    if s == 0:
      g_pen = jax.jit(jax.grad(lambda q: lam_t * objective(q, batch, None)[1]["penalty"]))(p)
      grad_share = _flat_norm(g_pen) / _flat_norm(g)
    p = jax.tree.map(lambda a, b: a - lr * b, p, g)
  m = out.metrics
  assert at == [0.0, 0.0, 1.0, 1.0]
  np.testing.assert_allclose(float(m["activity/weight_at_target"]), 0.5, rtol=0, atol=0)
  np.testing.assert_allclose(float(m["activity/penalty_loss_share"]), np.mean(shares), rtol=1e-4)
  np.testing.assert_allclose(float(m["activity/penalty_grad_share"]), grad_share, rtol=1e-4)
  assert 0.05 < np.mean(shares) and grad_share > 0.05  # the penalty matters at this point
  assert helpers.tree_max_diff(jax.tree.map(jnp.add, params, out.message), p) < 1e-5  # the same trajectory


def test_fedprox_with_one_local_step_records_no_activity():
  """The proximal term is zero at the one step taken at the global model: both shares are 0,
  as the preflight warning says; with 3 steps the loss share is the replayed mean."""
  from fedjax_dg.algorithms.base import Batch, LocalSchedule, erm_objective
  from fedjax_dg.algorithms.fedprox import prox_client, HParams
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  data = _two_domain_data()
  mu, lr = 0.5, 0.2
  for K in (1, 3):
    sched = LocalSchedule(num_steps=K, batch_size=8, epochs=0, passes=K, unroll=1)
    client = prox_client(type("Ctx", (), {"model": model, "client_opt": optax.sgd(lr), "sched": sched})(),
                         HParams(mu=mu))
    m = client.update(params, (), (), data, jax.random.PRNGKey(1)).metrics
    assert float(m["activity/penalty_grad_share"]) == 0.0
    p, shares = params, []
    for s in range(K):
      batch = Batch(data.x, data.y, data.domain, jnp.ones(8), s)
      ce, g = jax.value_and_grad(lambda q: erm_objective(model)(q, batch, None)[0])(p)
      term = 0.5 * mu * sum(float(jnp.sum((a - b) ** 2)) for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(params)))
      shares.append(term / (float(ce) + term))
      g = jax.tree.map(lambda gi, a, b: gi + mu * (a - b), g, p, params)
      p = jax.tree.map(lambda a, b: a - lr * b, p, g)
    np.testing.assert_allclose(float(m["activity/penalty_loss_share"]), np.mean(shares), rtol=1e-4, atol=1e-9)
    assert (np.mean(shares) == 0.0) == (K == 1)


# ------------------------------------------------------------------ the server rule's step


@pytest.mark.parametrize("name,server_lr,want", [("fedavg", 1.0, 0.0), ("fedavg", 2.5, 1.5), ("fedavg", 0.5, 0.5),
                                                 ("fedavg+omg", 1.0, None), ("fedavgm", 1.0, None)])
def test_rule_deviation_is_the_step_against_the_plain_average(name, server_lr, want):
  """`activity/rule_deviation` = ||step - mean Delta|| / ||mean Delta||: 0 for FedAvg at
  server step 1, |eta_g - 1| for FedAvg at step eta_g (closed form), and for FedOMG's rule
  and server momentum (second round) the value recomputed from the round's own states and
  the clients' updates, run client by client here."""
  from fedjax_dg.algorithms.base import LocalSchedule
  from fedjax_dg.engine import init_round_state, make_round
  st = helpers.ragged_store()
  C = len(st.counts)
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=4, epochs=0, passes=3, unroll=1)
  extra = {"server.momentum": 0.9} if name == "fedavgm" else {}
  alg = helpers.method({"algorithm.name": name, **helpers.sgd_config(0.1), "server.lr": server_lr, **extra},
                       model, sched, C)
  rf = make_round(alg, C, C, "vmap")
  store = jax.tree.map(jnp.asarray, st)
  state = init_round_state(alg, None, params, C)
  for t in range(2):
    old = state
    state, m = rf(state, store, jax.random.PRNGKey(t))
  got = float(m["activity/rule_deviation"])
  if want is not None:
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return
  # the clients' updates of the second round, one client at a time, weighted by examples
  from fedjax_dg.algorithms.base import ClientData
  b = alg.broadcast(old.server)
  k_clients = jax.random.split(jax.random.PRNGKey(1))[1]  # the cohort's member keys (engine/cohort.py)
  deltas = []
  for c in range(C):
    n = int(st.counts[c])
    data = ClientData(store.x[c], store.y[c], store.domain[c], jnp.asarray(n), c)
    out = alg.client_update(b, (), data, jax.random.fold_in(k_clients, c))
    deltas.append(np.concatenate([np.asarray(a, np.float64).ravel() for a in jax.tree.leaves(out.message)]))
  w = st.counts / st.counts.sum()
  mean = (w[:, None] * np.stack(deltas)).sum(0)
  flat = lambda s: np.concatenate([np.asarray(a, np.float64).ravel() for a in jax.tree.leaves(s.server.params)])
  step = flat(state) - flat(old)
  np.testing.assert_allclose(got, np.linalg.norm(step - mean) / np.linalg.norm(mean), rtol=1e-3)
  assert got > 0.05  # the rule does move away from the average here


@pytest.mark.parametrize("name", ["irm", "vrex", "coral", "mmd", "fediir", "fedprox", "fedavg", "fish", "fedsam", "fedloe",
                                  "feddim",
                                  "fedsr"])
def test_a_round_emits_exactly_the_declared_activity_records(name):
  """`MethodSpec.activity` + the rule's `RuleSpec.activity` are the round's `activity/*` metrics."""
  from fedjax_dg import algorithms
  from fedjax_dg.algorithms.base import LocalSchedule
  from fedjax_dg.engine import init_round_state, make_round
  st = helpers.ragged_store()
  C = len(st.counts)
  overrides = {"algorithm.name": name, **helpers.sgd_config(0.1)}
  model = algorithms.model_for(config_with(overrides), tiny_mlp())  # FedSR's probabilistic featurizer
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=4, epochs=0, passes=3, unroll=1)
  alg = helpers.method(overrides, model, sched, C, num_domains=3, store=st)
  _, m = make_round(alg, C, C, "vmap")(init_round_state(alg, None, params, C), jax.tree.map(jnp.asarray, st),
                                       jax.random.PRNGKey(0))
  spec, rule = algorithms.resolve(name)
  assert {k for k in m if k.startswith("activity/")} == {f"activity/{n}" for n in spec.activity + rule.activity}
  assert all(np.isfinite(float(m[k])) for k in m if k.startswith("activity/"))
