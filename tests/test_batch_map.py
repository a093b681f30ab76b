"""A batch of runs under `engine.run_axis="map"` (fedjax_dg/batch.py: a `jax.lax.map` loop
over the run axis inside the one compiled program): on CPU every run of the batch equals
the same run done alone BIT FOR BIT: every record of metrics.jsonl (train loss and every
split's metrics), the selections, the selected parameters and the final round state of its
newest checkpoint. Checked for FedAvg (federated, runs differing in seed and client step
size, one diverging) and for centralised GroupDRO (C = 1, the report grid's case whose
vmapped batch drifts from its solo runs), and each check is also made against the OTHER
run, which must differ."""
import os

import jax
import numpy as np
import pytest

import test_batch as tb


def _base(tiny_config, name, strategy="vmap", **over):
  c = tb._config(tiny_config, name, strategy, **over)
  c.engine.run_axis = "map"
  c.eval_every = 1
  c.checkpoint_every = 2
  return c


def _records(workdir):
  """metrics.jsonl without the wall-clock fields: every number a run computed."""
  return [{k: v for k, v in r.items() if k not in ("time", "wall_s")} for r in tb._metrics(workdir)]


def assert_identical(cfg, w_batch, w_solo, w_other):
  """The batch's run in `w_batch` is the solo run `w_solo` bit for bit, and not `w_other`."""
  from fedjax_dg import rundir
  rb, rs = _records(w_batch), _records(w_solo)
  assert rb == rs
  assert rb != _records(w_other)
  sb, ss = rundir.read_summary(str(w_batch)), rundir.read_summary(str(w_solo))
  assert sb["selection"] == ss["selection"] and sb["final"] == ss["final"]
  for rule, path in ss["selected_params"].items():
    assert (path is None) == (sb["selected_params"][rule] is None)
    if path:
      with open(os.path.join(w_batch, path), "rb") as a, open(os.path.join(w_solo, path), "rb") as b:
        assert a.read() == b.read(), rule
  step_b, st_b = tb._final_state(cfg, w_batch)
  step_s, st_s = tb._final_state(cfg, w_solo)
  assert step_b == step_s
  leaves_b, leaves_s = jax.tree.leaves(st_b), jax.tree.leaves(st_s)
  assert len(leaves_b) == len(leaves_s)
  for a, b in zip(leaves_b, leaves_s):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _batch_and_solo(cfgs, root):
  from fedjax_dg import batch
  out = batch.train_and_evaluate_batch(cfgs, [root / f"b{i}" for i in range(len(cfgs))])
  solo = [tb._solo(c, root / f"s{i}") for i, c in enumerate(cfgs)]
  return out, solo


def test_fedavg_runs_under_map_equal_their_solo_runs_bit_for_bit(tiny_config, tmp_path):
  from fedjax_dg import batch
  cfgs = [_base(tiny_config, "fedavg", seed=0), _base(tiny_config, "fedavg", seed=1, **{"client.lr": 0.05}),
          _base(tiny_config, "fedavg", seed=0, **{"client.lr": 1e30})]
  assert batch.run_axis(cfgs[0]) == "map"
  out, solo = _batch_and_solo(cfgs, tmp_path)
  assert isinstance(out[0], dict) and isinstance(out[1], dict)
  assert_identical(cfgs[0], tmp_path / "b0", tmp_path / "s0", tmp_path / "s1")
  assert_identical(cfgs[1], tmp_path / "b1", tmp_path / "s1", tmp_path / "s0")
  # the diverging run fails with its solo error, after the same records
  assert isinstance(solo[2], FloatingPointError) and isinstance(out[2], FloatingPointError)
  assert str(out[2]) == str(solo[2]) and "\n" not in str(out[2])
  assert _records(tmp_path / "b2") == _records(tmp_path / "s2")
  assert not os.path.exists(tmp_path / "b2" / "summary.json")


def _groupdro(tiny_config, **over):
  """Centralised GroupDRO as in the report grid (configs/sweeps/report.py: C = 1, one local
  epoch per round at lr 0.1 with momentum 0.9, batch 32), on the tiny data."""
  return _base(tiny_config, "groupdro", num_clients=1, **{"client.local_steps": 0, "client.local_epochs": 1,
                                                           "client.momentum": 0.9, "client.batch_size": 32,
                                                           "num_rounds": 6, **over})


def test_centralised_groupdro_under_map_equals_its_solo_runs_bit_for_bit(tiny_config, tmp_path):
  cfgs = [_groupdro(tiny_config, seed=0), _groupdro(tiny_config, seed=1)]
  out, solo = _batch_and_solo(cfgs, tmp_path)
  assert all(isinstance(o, dict) for o in out + solo), (out, solo)
  for i in range(2):
    assert_identical(cfgs[i], tmp_path / f"b{i}", tmp_path / f"s{i}", tmp_path / f"s{1 - i}")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["chunked", "sequential"])
@pytest.mark.parametrize("name", ["scaffold", "fedloe"])
def test_other_strategies_and_stateful_or_staged_methods_under_map_equal_their_solo_runs(tiny_config, tmp_path,
                                                                                          strategy, name):
  """SCAFFOLD (persistent client states) and FedLOE (two stages) under the chunked and the
  sequential client strategies, two runs differing in seed and step size."""
  extra = {"algorithm.fedloe.stage2_rounds": 2, "num_rounds": 2, "algorithm.fedloe.head_steps": 2,
           "algorithm.fedloe.solver_steps": 5} if name == "fedloe" else {}
  cfgs = [_base(tiny_config, name, strategy, seed=0, **extra),
          _base(tiny_config, name, strategy, seed=1, **{"client.lr": 0.05}, **extra)]
  out, solo = _batch_and_solo(cfgs, tmp_path)
  assert all(isinstance(o, dict) for o in out + solo), (out, solo)
  assert_identical(cfgs[0], tmp_path / "b0", tmp_path / "s0", tmp_path / "s1")
  assert_identical(cfgs[1], tmp_path / "b1", tmp_path / "s1", tmp_path / "s0")


def test_run_axis_splits_batches_and_enters_a_job_key_only_when_set(tiny_config):
  """Runs of different `engine.run_axis` never share a batch (they may round differently);
  "auto" leaves a sweep job's key what it was before the field existed, "map" and "vmap"
  make new jobs."""
  from fedjax_dg import batch
  from fedjax_dg.bench import sweep as sweep_lib
  cfgs = {axis: _base(tiny_config, "fedavg") for axis in ("auto", "map", "vmap")}
  for axis, c in cfgs.items():
    c.engine.run_axis = axis
  assert len({batch.static_key(c) for c in cfgs.values()}) == 3
  before = cfgs["auto"].copy_and_resolve_references()
  with before.unlocked():
    del before.engine["run_axis"]  # a config written before the field existed
  keys = {axis: sweep_lib.config_key(c) for axis, c in cfgs.items()}
  assert keys["auto"] == sweep_lib.config_key(before)
  assert len(set(keys.values())) == 3
  assert batch.run_axis(cfgs["auto"]) == ("map" if jax.default_backend() == "cpu" else "vmap")
