"""Preflight findings for GroupDRO, Mixup and FedLOE, and the claims their messages make,
checked against the implementation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from fedjax_dg.activity import preflight
from helpers import config_with, tiny_mlp


def _find(overrides, local_steps=5, rounds=60, client_domains=(1, 1, 1)):
  return preflight(config_with(overrides), local_steps=local_steps, rounds=rounds, client_domains=client_domains)


def test_groupdro_on_single_domain_clients_is_a_warning_equal_to_fedavg():
  (f,) = _find({"algorithm.name": "groupdro"})
  assert (f.level, f.field, f.equals_baseline) == ("warning", "algorithm.groupdro.eta", True)
  assert f.message.startswith("algorithm.groupdro.eta:") and "\n" not in f.message
  (f,) = _find({"algorithm.name": "groupdro+omg"})
  assert not f.equals_baseline
  (f,) = _find({"algorithm.name": "groupdro"}, client_domains=(1, 3))
  assert "1 of 2 clients" in f.message and not f.equals_baseline
  assert _find({"algorithm.name": "groupdro"}, client_domains=(2, 3)) == []


def test_groupdro_on_single_domain_clients_trains_fedavg():
  """The warning's claim: two rounds of GroupDRO (a large eta) on clients of one domain each
  give FedAvg's model to rounding."""
  from fedjax_dg.algorithms.base import LocalSchedule
  st = helpers.ragged_store()  # client c holds domain c % 3 only
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=3, batch_size=4, epochs=0, passes=3, unroll=1)
  out = [helpers.run_from(helpers.method({"algorithm.name": n, "algorithm.groupdro.eta": 0.5,
                                          **helpers.sgd_config(0.1)}, model, sched, 6, num_domains=3),
                          params, st, 6, 6, 2).server.params for n in ("groupdro", "fedavg")]
  assert helpers.tree_max_diff(out[0], out[1]) < 1e-6
  # ... and they act on clients of two domains (the test can tell the two apart)
  st2 = st._replace(domain=np.tile(np.arange(st.domain.shape[1]) % 2, (len(st.counts), 1)).astype(np.int32))
  out2 = [helpers.run_from(helpers.method({"algorithm.name": n, "algorithm.groupdro.eta": 0.5,
                                           **helpers.sgd_config(0.1)}, model, sched, 6, num_domains=3),
                           params, st2, 6, 6, 2).server.params for n in ("groupdro", "fedavg")]
  assert helpers.tree_max_diff(out2[0], out2[1]) > 1e-4


def test_mixup_on_single_domain_clients_is_a_warning_not_equal_to_fedavg():
  (f,) = _find({"algorithm.name": "mixup"})
  assert (f.level, f.field, f.equals_baseline) == ("warning", "algorithm.mixup.alpha", False)
  assert "every client" in f.message and "\n" not in f.message
  (f,) = _find({"algorithm.name": "mixup"}, client_domains=(1, 2, 2))
  assert "1 of 3 clients" in f.message
  assert _find({"algorithm.name": "mixup"}, client_domains=(2, 3)) == []


def test_mixup_on_one_domain_mixes_each_example_with_the_next_of_its_domain():
  """The warning's claim: with one domain present the partner of the example of rank r is
  the one of rank r + 1 (cyclically), so Mixup mixes distinct examples (not ERM), and the
  loss is lam CE(x~, y_i) + (1 - lam) CE(x~, y_j), recomputed here in float64."""
  import optax
  from fedjax_dg.algorithms.base import Batch
  from fedjax_dg.algorithms.dg import mixup_loss, mixup_pairing
  from fedjax_dg.objectives import mixup_partners
  mask = jnp.asarray([1, 1, 1, 1, 1, 0], jnp.float32)
  domain = jnp.full((6,), 2)
  j = np.asarray(jax.jit(mixup_partners, static_argnums=2)(domain, mask, 3))  # one program, not one per primitive
  assert list(j) == [1, 2, 3, 4, 0, 5]
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  batch = Batch(jnp.asarray(rng.normal(size=(6, 6)), jnp.float32), jnp.asarray([0, 1, 2, 0, 1, 2]), domain, mask)
  key = jax.random.PRNGKey(3)
  jj, lam = jax.jit(lambda k, b: mixup_pairing(k, b, 3, 0.4))(key, batch)
  lam = np.asarray(lam, np.float64)
  x = np.asarray(batch.x, np.float64)
  mixed = lam[:, None] * x + (1 - lam[:, None]) * x[np.asarray(jj)]
  logits = np.asarray(jax.jit(model.apply)(params, jnp.asarray(mixed, jnp.float32)), np.float64)
  top = logits.max(1, keepdims=True)
  logp = logits - top - np.log(np.sum(np.exp(logits - top), 1, keepdims=True))
  y = np.asarray(batch.y)
  ce = -(lam * logp[np.arange(6), y] + (1 - lam) * logp[np.arange(6), y[np.asarray(jj)]])
  want = np.sum(ce * np.asarray(mask)) / 5
  got = float(jax.jit(lambda p, b, k: mixup_loss(model, p, b, k, 0.4, 3))(params, batch, key))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  erm = float(optax.softmax_cross_entropy_with_integer_labels(model.apply(params, batch.x), batch.y)[:5].mean())
  assert abs(got - erm) > 1e-3  # not ERM


def test_fedloe_findings():
  base = {"algorithm.name": "fedloe"}
  assert _find({**base, "algorithm.fedloe.stage1_syncs": 8}, rounds=8) == []
  (f,) = _find({**base, "algorithm.fedloe.stage1_syncs": 16}, local_steps=1, rounds=10)
  assert (f.level, f.field) == ("warning", "algorithm.fedloe.stage1_syncs") and "runs 10" in f.message
  (f,) = _find({**base, "algorithm.fedloe.stage2_rounds": 0}, rounds=8)
  assert (f.field, f.equals_baseline) == ("algorithm.fedloe.stage2_rounds", False)
  (f,) = _find({**base, "algorithm.fedloe.stage2_rounds": 0, "algorithm.fedloe.stage1_syncs": 0})
  assert f.equals_baseline and "FedAvg's run exactly" in f.message
  (f,) = _find({**base, "algorithm.fedloe.solver_steps": 0}, rounds=8)
  assert f.field == "algorithm.fedloe.solver_steps"
  (f,) = _find({**base, "algorithm.fedloe.lam": 0.0}, rounds=8)
  assert f.field == "algorithm.fedloe.lam"
  assert _find({**base, "algorithm.fedloe.lam": 0.0, "algorithm.fedloe.penalty": "fish"}, rounds=8) == []
  assert all("\n" not in f.message for f in _find({**base, "algorithm.fedloe.stage1_syncs": 99,
                                                     "algorithm.fedloe.solver_steps": 0}, rounds=3))


def test_fedloe_stage1_syncs_above_the_budget_are_clipped_as_the_warning_says():
  from fedjax_dg.algorithms.fedloe import stage1_schedule
  rounds, steps = stage1_schedule(num_rounds=3, steps_per_round=4, syncs=16, stage2_steps=2)
  assert (rounds, steps) == (10, 1)
  assert [f.field for f in _find({"algorithm.name": "fedloe", "algorithm.fedloe.stage1_syncs": 16},
                                 local_steps=steps, rounds=rounds)] == ["algorithm.fedloe.stage1_syncs"]


def test_fedloe_without_stage_two_and_syncs_is_fedavg():
  """The equals_baseline claim: FedLOE's stage 1 with `stage1_syncs = 0` is FedAvg's run."""
  from fedjax_dg.algorithms.base import LocalSchedule
  st = helpers.ragged_store()
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=4, epochs=0, passes=3, unroll=1)
  out = [helpers.run_from(helpers.method({"algorithm.name": n, "algorithm.fedloe.stage1_syncs": 0,
                                          "algorithm.fedloe.stage2_rounds": 0, "model.head_hidden": (),
                                          **helpers.sgd_config(0.1)}, model, sched, 6, num_domains=3, store=st),
                          params, st, 6, 6, 2).server.params for n in ("fedloe", "fedavg")]
  assert helpers.tree_max_diff(out[0], out[1]) == 0.0


def test_which_findings_mark_a_cell_and_which_only_inform():
  """`equals_baseline` under FedAvg's rule, `inactive` where the method's own term does not
  act under another rule or reduces to something else (Fish on one domain), neither where
  the method still acts (Mixup within a domain, a penalty on some clients only); the report
  marks the first two and reports the third (`collect.run_mark`)."""
  from fedjax_dg.bench import collect
  (f,) = _find({"algorithm.name": "vrex"})
  assert (f.equals_baseline, f.inactive) == (True, False)
  (f,) = _find({"algorithm.name": "vrex+omg"})
  assert (f.equals_baseline, f.inactive) == (False, True)
  (f,) = _find({"algorithm.name": "fish"})
  assert (f.equals_baseline, f.inactive) == (False, True)
  (f,) = _find({"algorithm.name": "mixup"})
  assert (f.equals_baseline, f.inactive) == (False, False)
  (f,) = _find({"algorithm.name": "vrex"}, client_domains=(1, 2))
  assert (f.equals_baseline, f.inactive) == (False, False)
  mark = lambda f: collect.run_mark({"summary": {"preflight": [f._asdict()]}})[0]  # noqa: E731
  assert [mark(f) for f in (_find({"algorithm.name": "vrex"})[0], _find({"algorithm.name": "fish"})[0],
                            _find({"algorithm.name": "mixup"})[0])] == [collect.EQUALS_BASELINE, collect.INACTIVE, ""]


def test_config_activity_reaches_the_runners_and_the_librarys_schedule():
  """`config.activity = False` reaches the schedule the runner builds (`plan.prepare`) and the
  library's (`api.local_schedule`); that a schedule without records trains the same model
  bit for bit is `tests/test_activity_steps.py`'s."""
  from fedjax_dg import api, plan as plan_lib
  from fedjax_dg.data import datasets, splits
  c = config_with({"algorithm.name": "irm", "num_rounds": 2})
  fold = splits.fold_from_config(datasets.load_dataset(c.data), c.data)
  assert api.local_schedule(c, [10, 12]).activity and plan_lib.prepare(c, fold).sched.activity
  c.activity = False
  assert not api.local_schedule(c, [10, 12]).activity and not plan_lib.prepare(c, fold).sched.activity
