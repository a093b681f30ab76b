"""Resume and checkpoints, and the kept selected parameters.

One reference run (SCAFFOLD, so client state is checkpointed too; 6 rounds, evaluations
and checkpoints every 2) is shared; each test works on a copy of its workdir.
"""
import json
import os
import shutil
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers

from fedjax_dg import checkpoint as ckpt_lib
from fedjax_dg import experiment
from fedjax_dg import plan as plan_lib
from fedjax_dg import plan as plan_lib
from fedjax_dg import rundir
from fedjax_dg.config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(tiny_config):
  tiny_config.algorithm.name = "scaffold"
  return tiny_config


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """(config, workdir, summary) of an uninterrupted run."""
  sys.path.insert(0, os.path.join(ROOT, "configs"))
  import default
  config = default.get_config()  # conftest's tiny_config, built once for the module
  config.model.name, config.model.hidden, config.data.image_size = "mlp", (32,), 8
  config.num_clients, config.num_rounds, config.eval_every, config.checkpoint_every = 8, 6, 2, 2
  config.client.lr, config.client.momentum, config.client.batch_size, config.quiet = 0.1, 0.0, 16, True
  config = _config(config)
  workdir = str(tmp_path_factory.mktemp("reference") / "run")
  summary = experiment.train_and_evaluate(config, workdir)
  return config, workdir, summary


def _copy(reference, tmp_path, name="copy"):
  config, workdir, _ = reference
  dest = str(tmp_path / name)
  shutil.copytree(workdir, dest)
  c = config.copy_and_resolve_references()
  c.workdir = dest
  return c, dest


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _tmp_dirs(workdir):
  return [n for n in os.listdir(os.path.join(workdir, "checkpoints")) if "tmp" in n]


def _wrap_rounds(monkeypatch, fn):
  """Every round function's output passes through `fn(round, state, metrics)`."""
  real = plan_lib.make_round

  def make_round(*a, **k):
    rf = real(*a, **k)
    n = [0]

    def wrapped(state, store, rng):
      n[0] += 1
      return fn(n[0], *rf(state, store, rng))
    return wrapped
  monkeypatch.setattr(plan_lib, "make_round", make_round)


# ----------------------------------------------------------------------------- items 1-3

def test_resume_without_checkpoint_keeps_metrics_and_refuses_a_changed_config(reference, tmp_path, monkeypatch):
  config, workdir = _copy(reference, tmp_path)
  shutil.rmtree(os.path.join(workdir, "checkpoints"))
  shutil.rmtree(os.path.join(workdir, "checkpoint_sums"))
  before = open(os.path.join(workdir, "metrics.jsonl"), "rb").read()
  config.resume = True
  # Item 2: a result-changing field is refused, naming it, and nothing is touched.
  config.client.lr = 1e6
  with pytest.raises(ConfigError, match=r"client\.lr: 0\.1 in the run, 1000000\.0 now") as e:
    experiment.train_and_evaluate(config, workdir)
  assert "\n" not in str(e.value)
  assert open(os.path.join(workdir, "metrics.jsonl"), "rb").read() == before
  config.client.lr = 0.1
  # Item 1: a resume with no checkpoint restarts at round 0; when it fails, every recorded
  # evaluation is still there.
  with monkeypatch.context() as m:
    def crash(n, state, metrics):
      if n > 3:
        raise RuntimeError("simulated crash")
      return state, metrics
    _wrap_rounds(m, crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
      experiment.train_and_evaluate(config, workdir)
  assert [r["round"] for r in _records(workdir)] == [2, 4, 6]
  assert _records(workdir) == [json.loads(l) for l in before.decode().splitlines()]


def test_resume_compares_configs_and_fresh_run_refuses_checkpoints(reference, tmp_path):
  config, workdir = _copy(reference, tmp_path)
  os.remove(os.path.join(workdir, "metrics.jsonl"))
  os.remove(os.path.join(workdir, "summary.json"))
  # Item 3: checkpoints and no metrics.jsonl: a fresh run is refused.
  with pytest.raises(ConfigError, match=r"already holds checkpoints \(checkpoints/, selected/\)"):
    experiment.train_and_evaluate(config, workdir)
  config.resume = True
  config.num_clients = 4
  with pytest.raises(ConfigError, match=r"num_clients: 8 in the run, 4 now"):
    experiment.train_and_evaluate(config, workdir)
  config.num_clients = 8
  config.num_rounds = 4  # fewer rounds than the run has: its later rounds would be mixed in
  with pytest.raises(ConfigError, match=r"num_rounds: 6 in the run, 4 now"):
    experiment.train_and_evaluate(config, workdir)
  config.data.test_domains = (4,)
  with pytest.raises(ConfigError, match=r"data\.test_domains: \[5\] in the run, \[4\] now"):
    experiment.train_and_evaluate(config, workdir)
  # A field absent from the stored config counts only away from its default.
  stored = json.load(open(os.path.join(workdir, "config.json")))
  del stored["config"]["eval_every"], stored["config"]["client"]["weight_decay"]
  diff = rundir.config_differences(stored["config"], reference[0], multi_stage=False)
  library_defaults = rundir.library_defaults
  defaults = library_defaults()
  assert defaults["client.weight_decay"] == reference[0].client.weight_decay
  assert diff == [f"eval_every: {defaults['eval_every']} in the run, 2 now"], diff


# ----------------------------------------------------------------------------- items 4 and 6

@pytest.mark.slow  # two runs, ~20 s
def test_nan_in_saved_state_stops_before_saving_and_pending_save_is_finished(reference, tmp_path, monkeypatch):
  config, _ = _copy(reference, tmp_path)
  workdir = str(tmp_path / "nan")
  config.checkpoint_every = 1

  def poison(n, state, metrics):  # round 6: NaN in a client control variate, loss and params finite
    if n == 6:
      leaf = jax.tree.leaves(state.clients)[0]
      clients = jax.tree.map(lambda a: a.at[(0,) * a.ndim].set(jnp.nan) if a is leaf else a, state.clients)
      state = state._replace(clients=clients)
    return state, metrics
  with monkeypatch.context() as m:
    _wrap_rounds(m, poison)
    with pytest.raises(FloatingPointError, match="round state .* is not finite at round 6"):
      experiment.train_and_evaluate(config, workdir)
  # Item 4: the save of round 5, started just before, is complete; none is left half-written.
  assert _tmp_dirs(workdir) == []
  assert sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit()) == [4, 5]
  assert [r["round"] for r in _records(workdir)] == [2, 4]
  # The resume (checkpoint_every may differ) continues from round 5 and matches the reference.
  config.resume, config.checkpoint_every, config.eval_batch_size = True, 2, 64  # fields that cannot change results
  summary = experiment.train_and_evaluate(config, workdir)
  assert summary["final"] == reference[2]["final"] and summary["selection"] == reference[2]["selection"]


def test_nan_in_data_is_named(tiny_config):
  from fedjax_dg.data import datasets, splits
  ds = datasets.load_dataset(tiny_config.data)
  fold = splits.fold_from_config(ds, tiny_config.data)
  fold.test.x[3] = np.inf
  with pytest.raises(ConfigError, match="the 'test' split's inputs hold NaN or inf"):
    plan_lib.check_finite(fold)


# ----------------------------------------------------------------------------- item 5

def _steps(tmp_path):
  """A checkpoint folder with steps 2 and 4 of a small state."""
  workdir = str(tmp_path / "w")
  state = {"a": jnp.arange(3000.0), "b": {"c": jnp.ones((40, 3)), "k": jnp.arange(5)}}
  ck = ckpt_lib.Checkpoints(workdir)
  ck.save(2, state)
  ck.save(4, jax.tree.map(lambda x: x * 2, state))
  ck.close()
  return workdir, state


def _data_files(step_dir):
  out = []
  for root, _, files in os.walk(step_dir):
    out += [os.path.join(root, f) for f in files if os.path.basename(root) == "d"]
  return sorted(out, key=os.path.getsize)


def _truncate(step_dir):
  f = _data_files(step_dir)[-1]
  os.truncate(f, os.path.getsize(f) // 2)


def _delete_metadata(step_dir):
  os.remove(os.path.join(step_dir, "default", "_METADATA"))


def _empty(step_dir):
  shutil.rmtree(step_dir)
  os.makedirs(step_dir)


def _flip(step_dir):
  f = _data_files(step_dir)[-1]
  with open(f, "r+b") as h:
    data = bytearray(h.read())
    data[len(data) // 2] ^= 0xFF
    h.seek(0)
    h.write(bytes(data))


@pytest.mark.parametrize("corrupt", [_truncate, _delete_metadata, _empty, _flip])
def test_corrupt_latest_checkpoint_falls_back(tmp_path, corrupt):
  workdir, state = _steps(tmp_path)
  corrupt(os.path.join(workdir, "checkpoints", "4"))
  target = lambda step: jax.eval_shape(lambda: state)
  ck = ckpt_lib.Checkpoints(workdir)
  with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    step, restored = ck.restore_latest(target)
  ck.close()
  msgs = [str(x.message) for x in w if issubclass(x.category, UserWarning)]
  assert len(msgs) == 1 and "\n" not in msgs[0] and "checkpoint 4:" in msgs[0] and "from checkpoint 2" in msgs[0]
  assert step == 2
  assert ckpt_lib.state_digest(restored) == ckpt_lib.state_digest(state)
  # The corrupt one is kept aside, so a new save of step 4 is not skipped.
  assert os.path.isdir(os.path.join(workdir, "checkpoints_corrupt", "4"))
  assert not os.path.exists(os.path.join(workdir, "checkpoints", "4"))


def test_flipped_bytes_that_decode_are_caught_by_the_digest(tmp_path):
  workdir, state = _steps(tmp_path)
  # A state that restores without error but holds other values than were saved.
  sums = os.path.join(workdir, "checkpoint_sums", "4.json")
  with open(sums, "w") as f:
    json.dump({"step": 4, "sha256": ckpt_lib.state_digest(state)}, f)  # step 2's digest
  ck = ckpt_lib.Checkpoints(workdir)
  with pytest.warns(UserWarning, match="SHA-256 mismatch"):
    step, _ = ck.restore_latest(lambda s: jax.eval_shape(lambda: state))
  ck.close()
  assert step == 2


def test_every_checkpoint_corrupt_is_one_line_and_moves_nothing(tmp_path):
  workdir, state = _steps(tmp_path)
  for s in ("2", "4"):
    _truncate(os.path.join(workdir, "checkpoints", s))
  ck = ckpt_lib.Checkpoints(workdir)
  with pytest.raises(ckpt_lib.CheckpointError, match="no checkpoint restores intact") as e:
    ck.restore_latest(lambda s: jax.eval_shape(lambda: state))
  ck.close()
  assert "\n" not in str(e.value) and "checkpoint 4:" in str(e.value) and "checkpoint 2:" in str(e.value)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4"]


def test_corrupt_latest_checkpoint_resume_matches_uninterrupted(reference, tmp_path):
  config, workdir = _copy(reference, tmp_path)
  _flip(os.path.join(workdir, "checkpoints", "6"))
  config.resume = True
  with pytest.warns(UserWarning, match="resuming from checkpoint 4"):
    summary = experiment.train_and_evaluate(config, workdir)
  assert summary["final"] == reference[2]["final"] and summary["selection"] == reference[2]["selection"]
  assert _records(workdir) == _records(reference[1])


# ----------------------------------------------------------------------------- item 13

def test_progress_bar_waits_for_each_round_and_shows_the_phase(tiny_config, tmp_path, monkeypatch):
  events = []

  class Probe:  # the round's train loss; reading it is waiting for the round
    def __init__(self, n, v):
      self.n, self.v = n, v

    def __float__(self):
      events.append(("ready", self.n))
      return float(self.v)

  class Bar:
    def __init__(self, *a, **k):
      pass

    def set_description(self, d, refresh=True):
      events.append(("phase", d))

    def update(self, n=1):
      events.append(("update",))

    def set_postfix(self, **k):
      pass

    def close(self):
      pass
  from fedjax_dg import loop
  monkeypatch.setattr(loop, "tqdm", Bar)
  _wrap_rounds(monkeypatch, lambda n, state, m: (state, {**m, "train_loss": Probe(n, m["train_loss"])}))
  tiny_config.num_rounds, tiny_config.eval_every, tiny_config.checkpoint_every = 3, 2, 0
  experiment.train_and_evaluate(tiny_config, str(tmp_path / "w"))
  updates = [k for k, e in enumerate(events) if e[0] == "update"]
  assert len(updates) == 3
  for t, k in enumerate(updates):  # round t+1's update comes after its metrics were waited for
    assert ("ready", t + 1) in events[:k] and ("ready", t + 2) not in events[:k]
  phases = [e[1] for e in events if e[0] == "phase"]
  assert phases == ["round (compiling)", "round (training)", "round (evaluating)", "round (training)",
                    "round (evaluating)"]


# ----------------------------------------------------------------------------- selected params

def test_selected_parameters_rescore_to_the_summary(reference, tmp_path):
  from fedjax_dg import evaluate
  config, workdir, summary = reference
  by_round = {r["round"]: r for r in _records(workdir)}
  for rule, sel in summary["selection"].items():
    assert summary["selected_params"][rule] == f"selected/{rule}.msgpack"
    out = evaluate.rescore(workdir, rule)
    assert out["round"] == sel["round"]
    assert out["splits"]["test"]["accuracy"] == sel["test"]["accuracy"]
    assert out["splits"] == by_round[sel["round"]]["splits"]  # every split, every metric
  # Another data config: the test and held-out domains swapped, on the command line.
  d = config.data
  out = subprocess.run([sys.executable, "-m", "fedjax_dg.evaluate", "--workdir", workdir, "--rule=heldout_domain",
                        f"--config.data.test_domains=({d.val_domains[0]},)",
                        f"--config.data.val_domains=({d.test_domains[0]},)"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600, env=dict(os.environ, PYTHONPATH=helpers.pythonpath(ROOT)))
  assert out.returncode == 0, out.stderr
  swapped = json.loads(out.stdout)["splits"]
  sel = summary["selection"]["heldout_domain"]
  assert swapped["test"] == sel["val"] and swapped["heldout_val"] == sel["test"]
  # The parameters fit one model: other fields are refused in one line.
  other = evaluate.run_config(workdir)
  other.model.hidden = (8,)
  with pytest.raises(ConfigError, match=r"^model\.hidden: the saved parameters fit"):
    evaluate.rescore(workdir, "in_domain", other)


def test_orbax_errors_read_as_one_line_without_tensorstore_decorations():
  """Newer TensorStore appends its C++ source lines (over several lines) to an error; the
  one-line reason a skipped checkpoint prints leaves them out (seen with orbax 0.12.4)."""
  from fedjax_dg.checkpoint import _first_line
  msg = ('OUT_OF_RANGE: Error reading "w/0": Requested byte range [0, 5) is not valid for value of size 3 '
         "[source locations='tensorstore/kvstore/batch_util.h:439\ntensorstore/internal/cache/kvs.h:229']")
  assert _first_line(ValueError(msg)) == ('ValueError: OUT_OF_RANGE: Error reading "w/0": Requested byte range '
                                          '[0, 5) is not valid for value of size 3')


# ----------------------------------------------------------------------------- one run per directory, nothing lost

def test_resume_refuses_files_no_config_json_describes(reference, tmp_path):
  config, workdir = _copy(reference, tmp_path)
  os.remove(os.path.join(workdir, "config.json"))
  config.resume, config.client.lr = True, 0.05
  with pytest.raises(ConfigError, match=r"holds metrics.jsonl, summary.json, checkpoints/, selected/ but no "
                                        r"config.json, so no resume can tell which config made them"):
    experiment.train_and_evaluate(config, workdir)


def test_resume_refuses_metrics_of_another_run(reference, tmp_path):
  config, workdir = _copy(reference, tmp_path)
  recs = _records(workdir)
  recs[1]["run"] = "0" * 16
  rundir.write_metrics(workdir, recs)
  config.resume = True
  with pytest.raises(ConfigError, match=r"record 2 \(round 4\) carries run 0{16}, this config is run [0-9a-f]{16}"):
    experiment.train_and_evaluate(config, workdir)


def test_resume_refuses_lost_evaluations_and_rebuilds_a_torn_last_one(reference, tmp_path):
  config, workdir = _copy(reference, tmp_path)
  path = os.path.join(workdir, "metrics.jsonl")
  full = open(path, "rb").read()
  os.remove(path)
  config.resume = True
  with pytest.raises(ConfigError, match=r"metrics.jsonl lacks the evaluation\(s\) of round\(s\) \[2, 4, 6\], which "
                                        r"checkpoint 6 follows"):
    experiment.train_and_evaluate(config, workdir)
  assert not os.path.exists(path)
  # Round 6's line torn: the warning, then round 6 evaluated again from checkpoint 6.
  with open(path, "wb") as f:
    f.write(full[:-20])
  with pytest.warns(UserWarning, match=r"line 3 is torn"):
    summary = experiment.train_and_evaluate(config, workdir)
  want = [json.loads(l) for l in full.decode().splitlines()]
  got = _records(workdir)
  assert [r["round"] for r in got] == [2, 4, 6] and got[:2] == want[:2]
  assert got[2]["splits"] == want[2]["splits"] and got[2]["train_loss"] == want[2]["train_loss"]  # saved beside checkpoint 6
  assert summary["selection"] == reference[2]["selection"]


def test_older_checkpoint_under_a_newer_step_is_set_aside_and_the_run_redone(reference, tmp_path):
  config, workdir = _copy(reference, tmp_path)
  d, sums = os.path.join(workdir, "checkpoints"), os.path.join(workdir, "checkpoint_sums")
  shutil.rmtree(os.path.join(d, "6"))
  shutil.copytree(os.path.join(d, "4"), os.path.join(d, "6"))
  s = json.load(open(os.path.join(sums, "4.json")))
  json.dump({**s, "step": 6}, open(os.path.join(sums, "6.json"), "w"))
  config.resume = True
  with pytest.warns(UserWarning, match=r"checkpoint 6: ValueError: it holds round 4's state, not round 6's"):
    experiment.train_and_evaluate(config, workdir)
  assert _records(workdir) == _records(reference[1])


def test_extended_run_keeps_one_evaluation_schedule(reference, tmp_path):
  config, _, full = reference
  short = config.copy_and_resolve_references()
  short.num_rounds, short.workdir = 3, str(tmp_path / "w")
  experiment.train_and_evaluate(short, short.workdir)
  assert [r["round"] for r in _records(short.workdir)] == [2, 3]
  short.num_rounds, short.resume = 6, True
  with pytest.warns(UserWarning, match=r"dropping the evaluation\(s\) of round\(s\) \[3\], off this run's schedule"):
    summary = experiment.train_and_evaluate(short, short.workdir)
  assert _records(short.workdir) == _records(reference[1])  # rounds 2, 4, 6, as uninterrupted
  assert summary["selection"] == full["selection"]


def test_fresh_run_never_overwrites_another_runs_summary_or_selected(reference, tmp_path):
  config, workdir = _copy(reference, tmp_path)
  for name in ("metrics.jsonl", "config.json"):
    os.remove(os.path.join(workdir, name))
  for name in ("checkpoints", "checkpoint_sums"):
    shutil.rmtree(os.path.join(workdir, name))
  before = open(os.path.join(workdir, "summary.json"), "rb").read()
  with pytest.raises(ConfigError, match=r"already holds results \(summary.json, selected/\)"):
    experiment.train_and_evaluate(config, workdir)
  os.remove(os.path.join(workdir, "summary.json"))
  with pytest.raises(ConfigError, match=r"already holds selected parameters \(selected/\)"):
    experiment.train_and_evaluate(config, workdir)
  assert before  # untouched files stay


def test_an_unretrieved_orbax_write_failure_is_not_logged_and_other_failures_are():
  """A failed background save leaves futures whose exception nobody retrieves; asyncio logs
  each when it is collected (at exit, after the run's one-line error). The command line's
  filter drops exactly those raised inside orbax."""
  import asyncio
  import gc
  import logging
  from fedjax_dg import checkpoint
  code = compile("def write():\n  raise ValueError('OUT_OF_RANGE: Failed to write: File too large')\n",
                 os.path.join("site-packages", "orbax", "checkpoint", "serialization.py"), "exec")
  orbax_ns = {}
  exec(code, orbax_ns)

  def elsewhere():
    raise ZeroDivisionError("not orbax")

  def tensorstore():  # TensorStore's writer fails in C++: no orbax frame, the save's temporary directory named
    raise ValueError('OUT_OF_RANGE: Error writing "state.hparams.server.lr/0" in OCDBT database at local file '
                     '"/w/checkpoints/2.orbax-checkpoint-tmp/default.orbax-checkpoint-tmp/ocdbt.process_0/": '
                     'Failed to write 617 bytes to file 4: File too large')
  seen = []
  handler = logging.Handler()
  handler.emit = seen.append
  log, drop = logging.getLogger("asyncio"), checkpoint._DropOrbaxUnretrieved()
  log.addHandler(handler)
  log.addFilter(drop)
  loop = asyncio.new_event_loop()
  try:
    for fn in (orbax_ns["write"], elsewhere, tensorstore):
      fut = loop.create_future()
      try:
        fn()
      except Exception as e:  # noqa: BLE001 - the future holds it, as a failed write's does
        fut.set_exception(e)
      del fut
      gc.collect()
  finally:
    loop.close()
    log.removeHandler(handler)
    log.removeFilter(drop)
  assert [r.exc_info[0] for r in seen] == [ZeroDivisionError]
  assert "exception was never retrieved" in seen[0].getMessage()
