"""Many runs in one program (fedjax_dg/batch.py): each run of a batch equals the same run done
alone (metrics at every evaluation, selected rounds, final parameters from its checkpoint),
a diverging run fails with its solo error and leaves the others unchanged, a killed batch
resumes every run from its own checkpoint, and a bad run list is refused before compiling.
Every equality is also checked against the OTHER run, which must differ (a batch that mixed
its runs up fails)."""
import json
import re
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import tree_max_diff

RTOL = 1e-6  # float32 results of a vmapped program against the solo program (summation order)


def _config(tiny_config, name="fedavg", strategy="vmap", **over):
  c = tiny_config.copy_and_resolve_references()
  c.algorithm.name = name
  c.model.hidden = (16,)
  c.num_clients = 4
  c.client.local_steps = 2
  c.num_rounds = 4
  c.engine.strategy = strategy
  c.engine.chunk_size = 2
  c.engine.run_axis = "vmap"  # the run axis as a batch axis (tests/test_batch_map.py: the loop over runs)
  for k, v in over.items():
    node = c
    *path, last = k.split(".")
    for p in path:
      node = node[p]
    node[last] = v
  return c


def _solo(config, workdir):
  from fedjax_dg import experiment
  try:
    return experiment.train_and_evaluate(config, str(workdir))
  except FloatingPointError as e:
    return e


def _final_state(config, workdir):
  """The round state of the run's newest checkpoint (restored as a resume restores it)."""
  from fedjax_dg import checkpoint, experiment, rundir
  from fedjax_dg import folds as folds_lib
  from fedjax_dg import plan as plan_lib
  from fedjax_dg.data import datasets, splits
  if config.data.leave_one_domain_out:  # the fold the directory's name gives
    folds = folds_lib.lodo_folds(datasets.load_dataset(config.data), config.data)
    fold = next(f for f in folds if os.path.basename(folds_lib.fold_dir(str(workdir), f)) == os.path.basename(str(workdir)))
  else:
    fold = splits.fold_from_config(datasets.load_dataset(config.data), config.data)
  book = experiment.RunBook(config, fold, str(workdir), rundir.read_run_config(str(workdir))["run"],
                            plan_lib.prepare(config, fold))
  state = book.initial_state(book.initial_params())

  def target_of(step):
    target = jax.eval_shape(lambda: state)
    for j in range(1, book.stage_of(step) + 1):
      target = jax.eval_shape(lambda st, j=j: book.next_stage_state(j, st), target)
    return target
  ckpts = checkpoint.Checkpoints(str(workdir), run=book.run)
  try:
    step, restored = ckpts.restore_latest(target_of)
  finally:
    ckpts.close()
  return step, restored


def _rel(a, b) -> float:
  """max |a - b| / max |b| over one leaf (float64): the error relative to the leaf's scale (an
  element's own relative error means nothing where it cancels, as in SCAFFOLD's controls)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)) if a.size else 0.0


def _metrics(workdir):
  from fedjax_dg import rundir
  return rundir.read_metrics(str(workdir))


def _scores(records):
  """[(round, train loss, every split's accuracy)]: what two runs' metrics are compared on."""
  return [(r["round"], r["train_loss"], {k: v["accuracy"] for k, v in sorted(r["splits"].items())}) for r in records]


def _close(a, b) -> bool:
  """Two runs' metrics equal: same rounds, losses within RTOL, accuracies within one example."""
  if [r for r, _, _ in a] != [r for r, _, _ in b]:
    return False
  for (_, la, sa), (_, lb, sb) in zip(a, b):
    if (la is None) != (lb is None) or (la is not None and abs(la - lb) > RTOL * max(1.0, abs(lb))):
      return False
    if sa.keys() != sb.keys() or any(abs(sa[k] - sb[k]) > 1e-9 for k in sa):
      return False
  return True


def assert_same_run(cfg_batch, w_batch, cfg_solo, w_solo, other=None, state_rtol=RTOL):
  """The batch's run in `w_batch` equals the solo run in `w_solo` (metrics, selection, final
  state within `state_rtol`, max-norm relative per leaf); and differs from the `other` solo
  run directory."""
  from fedjax_dg import rundir
  mb, ms = _scores(_metrics(w_batch)), _scores(_metrics(w_solo))
  assert _close(mb, ms), (mb, ms)
  sb, ss = rundir.read_summary(str(w_batch)), rundir.read_summary(str(w_solo))
  assert {k: (v or {}).get("round") for k, v in sb["selection"].items()} == \
         {k: (v or {}).get("round") for k, v in ss["selection"].items()}
  assert sb["run"] == ss["run"]  # the same run identity: collect sees the same run
  step_b, st_b = _final_state(cfg_batch, w_batch)
  step_s, st_s = _final_state(cfg_solo, w_solo)
  assert step_b == step_s
  for a, b in zip(jax.tree.leaves(st_b), jax.tree.leaves(st_s)):
    if jnp.issubdtype(a.dtype, jnp.inexact):
      assert _rel(a, b) <= state_rtol, _rel(a, b)  # float32 arithmetic summed in another order
    else:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  if other is not None:
    assert not _close(mb, _scores(_metrics(other)))


# ----------------------------------------------------------------------------- the default checks

# The tests that read `seeds_batch` run on one pytest-xdist worker: it is computed once.
SEEDS_BATCH_GROUP = pytest.mark.xdist_group("seeds_batch")


@pytest.fixture(scope="module")
def seeds_batch(tmp_path_factory):
  """One batch of three FedAvg runs (seed 0; seed 1 at another client step size; seed 0 at a
  diverging step size) and the three runs alone."""
  import sys
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"))
  import default
  from fedjax_dg import batch
  base = default.get_config()
  base.model.name = "mlp"
  base.data.image_size = 8
  base.quiet = True
  base.eval_every = 2
  base.checkpoint_every = 2
  base.client.momentum = 0.0
  base.client.batch_size = 16
  root = tmp_path_factory.mktemp("seeds_batch")
  cfgs = [_config(base, seed=0), _config(base, seed=1, **{"client.lr": 0.05}),
          _config(base, seed=0, **{"client.lr": 1e30})]
  solo = [_solo(c, root / f"solo{i}") for i, c in enumerate(cfgs)]
  out = batch.train_and_evaluate_batch(cfgs, [root / f"batch{i}" for i in range(3)])
  return root, cfgs, solo, out


@SEEDS_BATCH_GROUP
def test_runs_differing_in_seed_and_lr_equal_their_solo_runs(seeds_batch):
  root, cfgs, solo, out = seeds_batch
  assert isinstance(out[0], dict) and isinstance(out[1], dict)
  assert out[0]["batch"] == {"size": 3, "index": 0} and out[1]["batch"] == {"size": 3, "index": 1}
  assert set(out[0]["timing"]) == {"compile_s", "train_s", "eval_s", "checkpoint_s", "total_s", "rounds_timed",
                                   "median_round_s"}
  assert set(solo[0]["timing"]) == set(out[0]["timing"])  # the single run reports the same split
  assert_same_run(cfgs[0], root / "batch0", cfgs[0], root / "solo0", other=root / "solo1")
  assert_same_run(cfgs[1], root / "batch1", cfgs[1], root / "solo1", other=root / "solo0")
  for name in ("config.json", "summary.json", "metrics.jsonl", "selected", "checkpoints"):
    assert os.path.exists(root / "batch0" / name), name


@SEEDS_BATCH_GROUP
def test_a_diverging_run_fails_alone_with_its_solo_error(seeds_batch):
  root, _, solo, out = seeds_batch
  assert isinstance(solo[2], FloatingPointError) and isinstance(out[2], FloatingPointError)
  assert str(out[2]) == str(solo[2]), (str(out[2]), str(solo[2]))
  assert "\n" not in str(out[2])
  assert not os.path.exists(root / "batch2" / "summary.json")
  assert _scores(_metrics(root / "batch2")) == _scores(_metrics(root / "solo2"))  # records before it failed


@SEEDS_BATCH_GROUP
def test_a_killed_batch_resumes_each_run_from_its_own_checkpoint(seeds_batch, tmp_path, monkeypatch):
  """The batch of three is killed during round 4's evaluation (runs 0 and 1 hold checkpoint 2,
  run 2 has diverged); run 1's checkpoints are then lost, so the rerun starts run 0 at round
  2 and runs 1 and 2 at round 0, in one program: runs 0 and 1 end equal to their
  uninterrupted solo runs, run 2 fails again with its solo error."""
  import shutil
  from fedjax_dg import batch, experiment
  root, cfgs, solo, _ = seeds_batch
  cfgs = [c.copy_and_resolve_references() for c in cfgs]
  dirs = [tmp_path / f"r{i}" for i in range(3)]
  record = experiment.RunBook.record

  def killed(self, done, *a, **k):
    if done == 4:
      raise KeyboardInterrupt
    return record(self, done, *a, **k)
  monkeypatch.setattr(experiment.RunBook, "record", killed)
  with pytest.raises(KeyboardInterrupt):
    batch.train_and_evaluate_batch(cfgs, dirs)
  monkeypatch.setattr(experiment.RunBook, "record", record)
  assert sorted(os.listdir(dirs[0] / "checkpoints")) == ["2"]
  shutil.rmtree(dirs[1] / "checkpoints")
  starts = []
  open_ = experiment.RunBook.open

  def opened(self, state):
    out = open_(self, state)
    starts.append(out[0])
    return out
  monkeypatch.setattr(experiment.RunBook, "open", opened)
  for c in cfgs:
    c.resume = True
  out = batch.train_and_evaluate_batch(cfgs, dirs)
  assert starts == [2, 0, 0]
  assert isinstance(out[0], dict) and isinstance(out[1], dict)
  assert str(out[2]) == str(solo[2])
  assert_same_run(cfgs[0], dirs[0], cfgs[0], root / "solo0", other=root / "solo1")
  assert_same_run(cfgs[1], dirs[1], cfgs[1], root / "solo1", other=root / "solo0")


@SEEDS_BATCH_GROUP
def test_a_run_list_on_the_command_line_writes_one_directory_per_run(seeds_batch, tmp_path):
  """`config.runs`: each entry's overrides, run i in <workdir>/run_<i>, equal to its solo run;
  the diverged run is reported in one line naming it once the others finished."""
  from fedjax_dg import experiment, rundir
  from fedjax_dg.errors import ConfigError
  root, cfgs, solo, _ = seeds_batch
  c = cfgs[0].copy_and_resolve_references()
  c.runs = ("seed=0", "seed=1,client.lr=0.05", "client.lr=1e30")
  with pytest.raises(FloatingPointError, match=r"^run 2 \(.*run_2\): " + re.escape(str(solo[2]).split(";")[0])):
    experiment.train_and_evaluate(c, str(tmp_path / "b"))
  listed = json.loads((tmp_path / "b" / "runs.json").read_text())["runs"]
  assert [r["workdir"] for r in listed] == [str(tmp_path / "b" / f"run_{i}") for i in range(3)]
  assert "error" in listed[2] and "selection" in listed[1]
  for i in range(2):
    assert rundir.read_run_config(str(tmp_path / "b" / f"run_{i}"))["run"] == solo[i]["run"]
    assert_same_run(cfgs[i], tmp_path / "b" / f"run_{i}", cfgs[i], root / f"solo{i}", other=root / f"solo{1 - i}")
  c.runs = ("seed=1", "sed=2")
  with pytest.raises(ConfigError, match=r"^runs\[1\]: unknown field 'sed'; did you mean 'seed'\?$"):
    experiment.train_and_evaluate(c, str(tmp_path / "c"))


def test_a_bad_run_list_is_refused_in_one_line_before_compiling(tiny_config, tmp_path):
  from fedjax_dg import batch
  from fedjax_dg.errors import ConfigError
  a = _config(tiny_config)
  b = _config(tiny_config, seed=3, **{"model.hidden": (8,)})
  with pytest.raises(ConfigError, match=r"^run 1 \(.*w1\): model.hidden is \[8\], run 0's is \[16\]; the runs") as e:
    batch.train_and_evaluate_batch([a, b], [tmp_path / "w0", tmp_path / "w1"])
  assert "\n" not in str(e.value)
  c = _config(tiny_config, name="fedprox", **{"algorithm.fedprox.mu": -1.0})
  with pytest.raises(ConfigError, match=r"^run 1 \(.*w1\): algorithm.fedprox.mu must be"):
    batch.train_and_evaluate_batch([_config(tiny_config, name="fedprox"), c], [tmp_path / "w0", tmp_path / "w1"])
  assert not os.path.exists(tmp_path / "w0") and not os.path.exists(tmp_path / "w1")  # nothing ran


def test_static_key_ignores_seeds_and_continuous_values_only(tiny_config):
  from fedjax_dg import batch
  a = _config(tiny_config, name="fedprox")
  same = [_config(tiny_config, name="fedprox", seed=5), _config(tiny_config, name="fedprox", **{"data.seed": 2}),
          _config(tiny_config, name="fedprox", **{"client.lr": 0.01, "server.lr": 0.5, "algorithm.fedprox.mu": 0.3}),
          _config(tiny_config, name="fedprox", workdir="elsewhere", checkpoint_every=3)]
  differ = [_config(tiny_config, name="irm"), _config(tiny_config, name="fedprox", num_clients=5),
            _config(tiny_config, name="fedprox", **{"client.momentum": 0.5}),  # 0 removes momentum from the program
            _config(tiny_config, name="fedprox", **{"algorithm.fedprox.mu": 0.0}),
            _config(tiny_config, name="fedprox", **{"partition.lam": 0.5})]
  assert all(batch.static_key(c) == batch.static_key(a) for c in same)
  assert len({batch.static_key(c) for c in differ} | {batch.static_key(a)}) == len(differ) + 1


def test_run_bytes_grows_with_the_model(tiny_config):
  from fedjax_dg import batch
  small, big = _config(tiny_config), _config(tiny_config, **{"model.hidden": (256, 256)})
  assert 0 < batch.run_bytes(small) < batch.run_bytes(big)


# ----------------------------------------------------------------------------- every strategy and method kind

# method -> the continuous hyperparameter the second run changes (besides its seed and client.lr)
# FedLOE's stage-2 solver (the invariant manager's IRM-penalised weights phi) amplifies the
# per-client heads' round-off (1e-7, as every other method's parameters) about tenfold: its
# final classifier agrees to 1.4e-6 (measured on the 2-core CPU), so its states are held to 1e-5.
STATE_RTOL = {"fedloe": 1e-5}
METHODS = {"fedavg": {}, "irm": {"algorithm.irm.lam": 10.0}, "scaffold": {}, "fedloe": {"algorithm.fedloe.lam": 10.0},
           "fediir": {"algorithm.fediir.gamma": 0.5}, "fedprox": {"algorithm.fedprox.mu": 0.5}}


def _method_config(tiny_config, name, strategy, **over):
  extra = {"algorithm.irm.anneal_steps": 0}
  if name == "fedloe":  # two stages: 2 rounds of FedAvg, then 2 of the invariant manager (Table 5's shape, small)
    extra.update({"algorithm.fedloe.stage2_rounds": 2, "num_rounds": 2, "algorithm.fedloe.head_steps": 2,
                  "algorithm.fedloe.solver_steps": 5, "algorithm.fedloe.stage1_syncs": 0})
  return _config(tiny_config, name, strategy, **extra, **over)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["vmap", "chunked", "sequential", "host_loop"])
@pytest.mark.parametrize("name", list(METHODS))
def test_every_strategy_and_method_kind_equals_its_solo_runs(tiny_config, tmp_path, strategy, name):
  cfgs = [_method_config(tiny_config, name, strategy, seed=0),
          _method_config(tiny_config, name, strategy, seed=1, **{"client.lr": 0.05}, **METHODS[name])]
  _two_runs_equal_their_solo_runs(cfgs, tmp_path, STATE_RTOL.get(name, RTOL))


def _two_runs_equal_their_solo_runs(cfgs, d, state_rtol):
  """The two runs `cfgs` batched into `d/b0`, `d/b1` and alone into `d/s0`, `d/s1`: each
  batched run equals its solo run and differs from the other."""
  from fedjax_dg import batch
  out = batch.train_and_evaluate_batch(cfgs, [d / "b0", d / "b1"])
  assert all(isinstance(o, dict) for o in out), out
  for i, c in enumerate(cfgs):
    assert isinstance(_solo(c, d / f"s{i}"), dict)
  assert_same_run(cfgs[0], d / "b0", cfgs[0], d / "s0", other=d / "s1", state_rtol=state_rtol)
  assert_same_run(cfgs[1], d / "b1", cfgs[1], d / "s1", other=d / "s0", state_rtol=state_rtol)


@pytest.mark.parametrize("name", ["fedloe", pytest.param("fediir", marks=pytest.mark.slow)])
def test_multi_stage_and_pre_round_methods_in_one_batch_equal_their_solo_runs(tiny_config, tmp_path, name):
  """FedLOE (two stages, switching at the same round for every run) and FedIIR (a pre-round
  statistic), two runs each under vmap."""
  cfgs = [_method_config(tiny_config, name, "vmap", seed=0),
          _method_config(tiny_config, name, "vmap", seed=0, **{"client.lr": 0.05}, **METHODS[name])]
  _two_runs_equal_their_solo_runs(cfgs, tmp_path / name, STATE_RTOL.get(name, RTOL))


SHARDED = """
import sys, tempfile, os
sys.path.insert(0, {tests!r}); sys.path.insert(0, {root!r}); sys.path.insert(0, os.path.join({root!r}, "configs"))
import jax
assert jax.device_count() == 4
import default, test_batch
from fedjax_dg import batch
base = default.get_config()
base.model.name = "mlp"; base.data.image_size = 8; base.quiet = True; base.eval_every = 2; base.checkpoint_every = 2
base.client.momentum = 0.0; base.client.batch_size = 16
d = tempfile.mkdtemp()
for name in ("fedavg", "scaffold"):
  for strategy in ("vmap", "chunked"):
    cfgs = [test_batch._method_config(base, name, strategy, seed=0),
            test_batch._method_config(base, name, strategy, seed=1, **{{"client.lr": 0.05}})]
    w = os.path.join(d, name + strategy)
    out = batch.train_and_evaluate_batch(cfgs, [w + "b0", w + "b1"])
    assert all(isinstance(o, dict) for o in out), out
    for i, c in enumerate(cfgs):
      assert isinstance(test_batch._solo(c, w + f"s{{i}}"), dict)
    test_batch.assert_same_run(cfgs[0], w + "b0", cfgs[0], w + "s0", other=w + "s1")
    test_batch.assert_same_run(cfgs[1], w + "b1", cfgs[1], w + "s1", other=w + "s0")
print("BATCH_SHARDED_OK")
"""


@pytest.mark.slow
@pytest.mark.host_devices(SHARDED, "BATCH_SHARDED_OK")
def test_a_batch_sharded_over_four_host_devices_equals_its_solo_runs(host_devices):
  ok, output = host_devices
  assert ok, output


@pytest.mark.slow
def test_leave_one_domain_out_runs_batch_fold_by_fold(tiny_config, tmp_path):
  """Each fold of each run equals that fold of the run alone; the folds' summary too."""
  from fedjax_dg import batch, rundir
  over = {"data.angles": (0, 30, 60), "data.leave_one_domain_out": True, "data.val_domains": (), "data.test_domains": (),
          "data.lodo_validation": "in_domain", "num_rounds": 2, "eval_every": 1}
  cfgs = [_config(tiny_config, seed=0, **over), _config(tiny_config, seed=1, **{"client.lr": 0.05}, **over)]
  out = batch.train_and_evaluate_batch(cfgs, [tmp_path / "b0", tmp_path / "b1"])
  solo = [_solo(c, tmp_path / f"s{i}") for i, c in enumerate(cfgs)]
  for i in range(2):
    assert out[i]["selection"].keys() == solo[i]["selection"].keys()
    for rule, sel in solo[i]["selection"].items():
      assert out[i]["selection"][rule]["per_fold_test_accuracy"] == sel["per_fold_test_accuracy"]
    for d in ("fold_0", "fold_1", "fold_2"):
      assert_same_run(cfgs[i], tmp_path / f"b{i}" / d, cfgs[i], tmp_path / f"s{i}" / d,
                      other=tmp_path / f"s{1 - i}" / d)
