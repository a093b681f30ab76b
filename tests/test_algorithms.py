"""Each FedAvg-family member against its closed form, and every algorithm end to end."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import ml_collections
import pytest

from fedjax_dg import experiment
from fedjax_dg.algorithms import ALGORITHMS
from fedjax_dg.algorithms.base import Batch, LocalSchedule, erm_objective
from fedjax_dg.algorithms.fedprox import proximal_objective
from fedjax_dg.engine import init_round_state, make_round
from helpers import (adam_config, client_arrays, learn_in_process, method, ragged_store, run_from, sgd_config,
                     tiny_mlp, tree_max_diff)

jax.config.update("jax_enable_x64", False)


def test_fedprox_gradient_is_erm_gradient_plus_mu_times_distance():
  model = tiny_mlp()
  g_params = model.init(jax.random.PRNGKey(0))
  params = jax.tree.map(lambda a: a + 0.3, g_params)
  st = ragged_store()
  x, y = client_arrays(st, 0)
  batch = Batch(x, y, jnp.zeros_like(y), jnp.ones(len(y)))
  mu = 0.37
  # Each gradient one compiled program (op by op, every operation would compile on its own).
  g_prox = jax.jit(jax.grad(lambda p: proximal_objective(model, mu)(g_params)(p, batch, None)[0]))(params)
  g_erm = jax.jit(jax.grad(lambda p: erm_objective(model)(p, batch, None)[0]))(params)
  expect = jax.tree.map(lambda ge, p, q: ge + mu * (p - q), g_erm, params, g_params)
  assert tree_max_diff(g_prox, expect) < 1e-6
  val = proximal_objective(model, mu)(g_params)(params, batch, None)[0] - erm_objective(model)(params, batch, None)[0]
  n = sum(a.size for a in jax.tree.leaves(params))
  assert float(val) == pytest.approx(0.5 * mu * 0.09 * n, rel=1e-4)


def _one_round_delta(params, st, lr, grad):
  """The example-weighted mean of one full-batch GD step per client. `grad(q, x, y)`: the
  gradient of the mean cross-entropy of the model's logits at q."""
  w = st.counts / st.counts.sum()
  deltas = []
  for c in range(len(st.counts)):
    x, y = client_arrays(st, c)
    g = grad(params, x, y)
    deltas.append(jax.tree.map(lambda a: -lr * a, g))
  return jax.tree.map(lambda *d: sum(wi * di for wi, di in zip(w, d)), *deltas)


def test_fedadam_and_fedavgm_server_steps():
  st = ragged_store()
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=1, batch_size=int(st.counts.max()), epochs=1, passes=1, unroll=1)
  store = jax.tree.map(jnp.asarray, st)
  C = len(st.counts)
  # FedAdam, one round: m_hat = g, v_hat = g^2 with g = -Delta, so theta + lr Delta / (|Delta| + eps).
  lr, eps = 0.01, 1e-3
  alg = method({"algorithm.name": "fedadam", **sgd_config(0.1), **adam_config(lr, eps=eps, prefix="server")},
               model, sched, C)
  state, _ = make_round(alg, C, C, "vmap")(init_round_state(alg, None, params, C), store, jax.random.PRNGKey(0))
  # The reference's client gradient: one compiled program per client size (op by op, every
  # operation would compile on its own).
  grad = jax.jit(jax.grad(lambda q, x, y: optax.softmax_cross_entropy_with_integer_labels(model.apply(q, x), y).mean()))
  d = _one_round_delta(params, st, 0.1, grad)
  expect = jax.tree.map(lambda p, dd: p + lr * dd / (jnp.abs(dd) + eps), params, d)
  assert tree_max_diff(state.server.params, expect) < 1e-6
  # FedAvgM, two rounds: v1 = -D1, v2 = beta v1 - D2, theta2 = theta1 - lr v2.
  beta, lr = 0.9, 0.5
  alg = method({"algorithm.name": "fedavgm", **sgd_config(0.1), **sgd_config(lr, beta, prefix="server")}, model,
               sched, C)
  rf = make_round(alg, C, C, "vmap")
  state = init_round_state(alg, None, params, C)
  state, _ = rf(state, store, jax.random.PRNGKey(0))
  d1 = _one_round_delta(params, st, 0.1, grad)
  p1 = jax.tree.map(lambda p, dd: p + lr * dd, params, d1)
  assert tree_max_diff(state.server.params, p1) < 1e-6
  state, _ = rf(state, store, jax.random.PRNGKey(1))
  d2 = _one_round_delta(p1, st, 0.1, grad)
  p2 = jax.tree.map(lambda p, a, b: p + lr * (beta * a + b), p1, d1, d2)
  assert tree_max_diff(state.server.params, p2) < 1e-6


def test_minibatch_sgd_is_gradient_descent_on_equal_clients():
  st = ragged_store(sizes=(6, 6, 6, 6))
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=1, batch_size=6, epochs=1, passes=1, unroll=1)
  alg = method({"algorithm.name": "minibatch_sgd", "client.batch_size": 6, **sgd_config(0.2)}, model, sched, 4)
  # batch = a client's whole data
  rf = make_round(alg, 4, 4, "vmap")
  state = init_round_state(alg, None, params, 4)
  p = params
  xs = jnp.concatenate([client_arrays(st, c)[0] for c in range(4)])
  ys = jnp.concatenate([client_arrays(st, c)[1] for c in range(4)])
  for t in range(3):
    state, _ = rf(state, jax.tree.map(jnp.asarray, st), jax.random.PRNGKey(t))
    g = jax.grad(lambda q: optax.softmax_cross_entropy_with_integer_labels(model.apply(q, xs), ys).mean())(p)
    p = jax.tree.map(lambda a, b: a - 0.2 * b, p, g)
  assert tree_max_diff(state.server.params, p) < 1e-5


# The slowest learners run with -m slow; each also has its own tests by default (FedADG's
# test_lowers_the_training_loss_on_the_embedded_dataset, Mixup's and FedDG's NumPy checks,
# FedSR, FedSAM, FedIIR and FedOMG each learning alone).
SLOW_LEARNERS = ("fedadg", "mixup", "feddg", "fedsr+omg", "fedsam+omg", "fediir+omg")
# Whole runs (`train_and_evaluate`: files, evaluations, checkpoints' schedule) once per runner
# path: one stage, and two stages (FedLOE). Every other method trains in this process with the
# program the runner builds (`helpers.learn_in_process`) and meets the same assertions.
WHOLE_RUNS = ("fedavg", "fedloe")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_LEARNERS else n
                                  for n in ALGORITHMS])
def test_every_algorithm_learns_on_the_embedded_dataset(tiny_config, tmp_path, name):
  tiny_config.algorithm.name = name
  tiny_config.num_rounds = 8
  tiny_config.checkpoint_every = 0
  if name in ("fedadam", "fedyogi"):
    tiny_config.server.lr = 0.01
  if name == "afl":  # a single-domain client's loss is beta_d R_d (eq. 15), beta uniform over 4 domains
    tiny_config.client.lr *= 4
  if name == "fedadg":  # narrower generator and discriminator than the paper's 1024 (test time)
    tiny_config.algorithm.fedadg.hidden = tiny_config.algorithm.fedadg.noise_dim = 64
  if name == "minibatch_sgd":
    tiny_config.num_rounds = 40
    tiny_config.eval_every = 10
  if name == "fedloe":
    tiny_config.client.optimizer = "adam"
    tiny_config.client.lr = 0.01
  if name in WHOLE_RUNS:
    out = experiment.train_and_evaluate(tiny_config, str(tmp_path / name))
    recs = [json.loads(l) for l in open(tmp_path / name / "metrics.jsonl")]
    stage1 = [r for r in recs if r.get("stage", 1) == 1]
    first, last = stage1[0]["train_loss"], stage1[-1]["train_loss"]
    if name == "fedloe":  # stage 2 ran after stage 1, with a combination over the 8 clients
      stage2 = [r for r in recs if r.get("stage") == 2]
      assert [r["round"] for r in stage2] == [9, 10, 11, 12]  # stage 1's 8 syncs, then stage 2 evaluated every round
      assert len(stage2[-1]["phi"]) == 8
    final, num_clients = out["final"]["splits"], out["num_clients"]
  else:  # the same numbers from the same program, without the run's files
    out = learn_in_process(tiny_config)
    first, last = out["train_loss"][tiny_config.eval_every - 1], out["train_loss"][-1]
    final, num_clients = out["splits"], out["num_clients"]
  assert last < first        # the training loss at the first and the last evaluation
  assert final["in_val"]["accuracy"] > 0.3  # chance is 0.1
  if name == "erm":
    assert num_clients == 1


def test_sam_gradient_matches_numpy_on_a_linear_model():
  """FedSAM's local gradient is grad R(theta + rho g / ||g||), checked in float64 NumPy."""
  from fedjax_dg.algorithms.fedsam import sam_objective
  st = ragged_store()
  model = tiny_mlp(hidden=())  # logits = x W + b
  params = model.init(jax.random.PRNGKey(0))
  x, y = client_arrays(st, 2)
  rho = 0.3
  batch = Batch(x, y, jnp.zeros_like(y), jnp.ones(len(y)))
  got = jax.grad(lambda p: sam_objective(erm_objective(model), rho)(p, batch, None)[0])(params)
  X, Y = np.asarray(x, np.float64), np.eye(3)[np.asarray(y)]
  W0 = np.asarray(params["classifier"]["Dense_0"]["kernel"], np.float64)
  b0 = np.asarray(params["classifier"]["Dense_0"]["bias"], np.float64)

  def grad(W, b):
    z = X @ W + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d = (p - Y) / len(X)
    return X.T @ d, d.sum(0)

  gW, gb = grad(W0, b0)
  norm = np.sqrt((gW ** 2).sum() + (gb ** 2).sum())
  eW, eb = grad(W0 + rho * gW / norm, b0 + rho * gb / norm)
  np.testing.assert_allclose(got["classifier"]["Dense_0"]["kernel"], eW, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(got["classifier"]["Dense_0"]["bias"], eb, rtol=1e-4, atol=1e-6)


def test_registry_builds_the_named_method(tiny_config):
  """Each name builds its own method from its spec, with its rule's aggregation."""
  from fedjax_dg.algorithms import build_algorithm, resolve
  from fedjax_dg.algorithms.base import make_schedule as sched_of
  model = tiny_mlp(dim=64, classes=10)
  params = model.init(jax.random.PRNGKey(0))
  store = ragged_store(dim=64)._replace(x=np.zeros((6, 12, 8, 8, 1), np.float32))  # FedDG's bank needs images
  val = (np.zeros((4, 8, 8, 1), np.float32), np.zeros(4, np.int32))  # the learned rule's held-out domain
  for name in ALGORITHMS:
    tiny_config.algorithm.name = name
    alg = build_algorithm(tiny_config, model, sched_of(4, 2, 1, 10, 5), 8, 8, store=store, heldout_val=val)
    assert alg.name == name
    alg.server_init(None, params)
    spec, rule = resolve(name)
    assert spec.name == name.split("+")[0] and rule.name == (name.split("+")[1] if "+" in name else spec.rule)
  for name, agg in (("fedomg", "stack"), ("fediir+omg", "stack"), ("fedga", "stack"), ("feddim", "mean"),
                    ("fediir", "mean"), ("fedprox+gma", "stack"), ("irm+omg", "stack")):
    tiny_config.algorithm.name = name
    assert build_algorithm(tiny_config, model, sched_of(4, 2, 1, 10, 5), 8, 8).aggregation == agg
  tiny_config.algorithm.name = "irm+ga"   # FedGA's rule reads a weight only FedGA's clients send
  with pytest.raises(ValueError, match="needs the clients' aggregation weight"):
    build_algorithm(tiny_config, model, sched_of(4, 2, 1, 10, 5), 8, 8)


def test_readme_communication_table_matches_the_declarations(tiny_config):
  """The documentation's table is `communication_table()`, and every built algorithm carries
  the declaration the table shows (so summary.json reports the same)."""
  import os
  from fedjax_dg.algorithms import COMMUNICATION, build_algorithm, communication_table
  from fedjax_dg.algorithms.base import make_schedule as sched_of
  page = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "methods", "index.md")
  assert communication_table() in open(page).read()
  model = tiny_mlp(dim=64, classes=10)
  store = ragged_store(dim=64)._replace(x=np.zeros((6, 12, 8, 8, 1), np.float32))
  val = (np.zeros((4, 8, 8, 1), np.float32), np.zeros(4, np.int32))  # the learned rule's held-out domain
  for name in ALGORITHMS:
    tiny_config.algorithm.name = name
    alg = build_algorithm(tiny_config, model, sched_of(4, 2, 1, 10, 5), 8, 8, store=store, heldout_val=val)
    want = COMMUNICATION.get(name, {})
    assert alg.sends == want.get("sends", ()) and alg.receives == want.get("receives", ()), name
    assert alg.leaks_data == want.get("leaks_data", False), name
  assert [n for n in ALGORITHMS if COMMUNICATION.get(n, {}).get("leaks_data")] == ["fedloe", "feddg"]


def test_readme_tables_are_generated_from_the_specs():
  import importlib.util
  import os
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  spec = importlib.util.spec_from_file_location("readme_tables", os.path.join(root, "scripts", "readme_tables.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  for rel in mod.PAGES:
    text = open(os.path.join(root, rel)).read()
    assert "<!-- BEGIN methods -->" in text or rel != mod.PAGES[0]
    assert mod.render(text) == text, f"{rel}: tables are stale: run python scripts/readme_tables.py"


def test_no_method_name_outside_the_algorithms_package():
  """experiment.py, config.py, the engine, models, evaluation and the benchmark layer name
  no method or server rule: not quoted, not as a dictionary key, not in a comparison."""
  import os
  import re
  from fedjax_dg.algorithms import METHODS, RULES
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  files = ["fedjax_dg/experiment.py", "fedjax_dg/config.py"]
  for layer in ("engine", "models", "eval", "bench"):  # every module, subpackages included
    for folder, _, names in os.walk(os.path.join(root, "fedjax_dg", layer)):
      files += [os.path.relpath(os.path.join(folder, f), root) for f in names if f.endswith(".py")]
  # The sweep helpers are sweep-config data (Bai et al.'s table rows, display names), as the
  # config files were: they name the benchmark's methods, no code path branches on one.
  files.remove(os.path.join("fedjax_dg", "bench", "sweep_helpers.py"))
  assert {"fedjax_dg/engine/round.py", "fedjax_dg/models/__init__.py", "fedjax_dg/eval/evaluate.py",
          "fedjax_dg/bench/sweep.py"} <= set(files)
  names = set(METHODS) | {n for n in RULES if len(n) > 3} - {"adam", "yogi"} | {"phi", "to_z"}
  for f in files:
    text = open(os.path.join(root, f)).read()
    for name in names:
      assert not re.search(rf"[\"'+]{re.escape(name)}[\"'+]", text), (f, name)
      assert not re.search(rf"\.{re.escape(name)}\b", text), (f, name)


TOY = '''
import dataclasses
import jax
from fedjax_dg.algorithms.base import erm_objective
from fedjax_dg.algorithms.fedavg import objective_client
from fedjax_dg.algorithms.spec import LogUniform, MethodSpec, hparam


@dataclasses.dataclass(frozen=True)
class HParams:
  shrink: float = hparam(0.5, "weight decay towards zero inside the loss", ge=0, search=LogUniform(1e-3, 1.0))


def toy_client(ctx, hp):
  base = erm_objective(ctx.model)
  def objective(params, batch, rng):
    loss, aux = base(params, batch, rng)
    return loss + hp.shrink * sum((p ** 2).sum() for p in jax.tree.leaves(params)), aux
  return objective_client(lambda g, extra: objective, ctx.client_opt, ctx.sched)


SPEC = MethodSpec("toyreg", "a test", toy_client, HParams)
'''


def test_a_toy_method_is_one_file_and_one_line(tmp_path, tiny_config, monkeypatch):
  """A new method file plus `register(SPEC)` builds, composes with every rule, validates its
  field's range and runs a round."""
  import importlib
  import sys
  from fedjax_dg import algorithms, config as config_lib
  from fedjax_dg.algorithms.base import make_schedule as sched_of
  (tmp_path / "toyreg.py").write_text(TOY)
  monkeypatch.syspath_prepend(str(tmp_path))
  toy = importlib.import_module("toyreg")
  monkeypatch.setitem(algorithms.METHODS, "toyreg", None)
  algorithms.register(toy.SPEC)                       # the one registry line
  tiny_config.algorithm.toyreg = ml_collections.ConfigDict({"shrink": 0.5})
  st = ragged_store(dim=64)
  model = tiny_mlp(dim=64, classes=3)
  params = model.init(jax.random.PRNGKey(0))
  val = (np.zeros((4, 64), np.float32), np.zeros(4, np.int32))  # the learned rule's held-out domain
  for rule in algorithms.RULES:
    tiny_config.algorithm.name = f"toyreg+{rule}"
    if rule in ("ga", "learned"):  # they need per-client signals (gaps, domain shares) a plain client does not send
      with pytest.raises(ValueError, match="needs"):
        algorithms.build_algorithm(tiny_config, model, sched_of(4, 2, 1, 12, 3), 6, 6, heldout_val=val)
      continue
    alg = algorithms.build_algorithm(tiny_config, model, sched_of(4, 2, 1, 12, 3), 6, 6, heldout_val=val)
    state, m = make_round(alg, 6, 6, "vmap")(init_round_state(alg, None, params, 6), jax.tree.map(jnp.asarray, st),
                                            jax.random.PRNGKey(0))
    assert np.isfinite(float(m["train_loss"])) and tree_max_diff(alg.params_of(state.server), params) > 0
  tiny_config.algorithm.name = "toyreg"
  tiny_config.algorithm.toyreg.shrink = -1.0
  with pytest.raises(config_lib.ConfigError, match=r"algorithm.toyreg.shrink must be >= 0, got -1.0"):
    config_lib.validate(tiny_config)
  assert set(algorithms.sample_hparams("toyreg", np.random.default_rng(0))) == {"algorithm.toyreg.shrink"}


@pytest.mark.parametrize("name", ["erm", "irm", "groupdro"])
def test_centralised_rounds_are_epochs_of_one_run(tiny_config, name):
  """With one client (Bai et al.'s C = 1 column), E rounds of one epoch equal
  one round of E epochs, because the local optimizer's state (Adam's moments and step count)
  carries over. Full-batch steps, so the batch order cannot matter. ERM is also checked
  against a plain optax loop; a FedAvg-style reset each round (E > 1 clients' rule) differs."""
  from fedjax_dg.algorithms import build_algorithm
  from fedjax_dg.algorithms.base import make_schedule
  E, n = 4, 14
  st = ragged_store(sizes=(n,), dim=6)
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(1))
  tiny_config.algorithm.name = name
  tiny_config.algorithm.irm.anneal_steps = 0
  tiny_config.client.optimizer, tiny_config.client.lr, tiny_config.client.batch_size = "adam", 0.05, 32
  one = lambda epochs: build_algorithm(tiny_config, model, make_schedule(32, 0, epochs, n, n), 1, 1,
                                       num_domains=3)
  by_rounds = one(1).params_of(run_from(one(1), params, st, 1, 1, rounds=E).server)
  by_epochs = one(E).params_of(run_from(one(E), params, st, 1, 1, rounds=1).server)
  assert tree_max_diff(by_rounds, by_epochs) < 1e-5
  if name == "erm":
    x, y = client_arrays(st, 0)
    opt = optax.adam(0.05)
    p, s = params, opt.init(params)
    for _ in range(E):
      g = jax.grad(lambda q: optax.softmax_cross_entropy_with_integer_labels(model.apply(q, x), y).mean())(p)
      u, s = opt.update(g, s, p)
      p = optax.apply_updates(p, u)
    assert tree_max_diff(by_rounds, p) < 1e-5
  # Two clients (FedAvg's client: a fresh optimizer every round) on the same data would differ.
  reset = build_algorithm(tiny_config, model, make_schedule(32, 0, 1, n, n), 2, 1, num_domains=3)
  state = init_round_state(reset, None, params, 1)
  rf = make_round(reset, 1, 1, "vmap")
  for t in range(E):
    state, _ = rf(state, jax.tree.map(jnp.asarray, st), jax.random.PRNGKey(t))
  assert tree_max_diff(reset.params_of(state.server), by_rounds) > 1e-3
