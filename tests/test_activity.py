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


@pytest.mark.parametrize("name,field", [("irm", "lam"), ("vrex", "lam"), ("mmd", "gamma"), ("coral", "gamma")])
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


def test_errors_come_first_and_findings_are_one_line():
  fs = _find({"algorithm.name": "irm", "algorithm.irm.anneal_steps": 10 ** 6})
  assert [f.level for f in fs] == ["error", "warning"]
  assert all(isinstance(f, Finding) and "\n" not in f.message for f in fs)
  assert _find({"algorithm.name": "fedavg"}) == []
