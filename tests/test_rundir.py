"""The run directory: one owner, one identity, one torn-line policy, no mixed or lost results."""
import json
import os
import socket
import subprocess
import sys
import warnings

import numpy as np
import pytest

import helpers

from fedjax_dg import checkpoint as ckpt_lib
from fedjax_dg import main as main_lib
from fedjax_dg import rundir
from fedjax_dg.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- owners

def test_a_second_process_is_refused_while_the_owner_lives(tmp_path):
  holder = ("import sys, time; from fedjax_dg import rundir\n"
            "with rundir.owned(sys.argv[1]):\n  print('held', flush=True); time.sleep(30)\n")
  env = dict(os.environ, PYTHONPATH=helpers.pythonpath(ROOT))
  p = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True)
  try:
    assert p.stdout.readline().strip() == "held"
    with pytest.raises(ConfigError, match=rf"is in use by process {p.pid} on {socket.gethostname()}") as e:
      with rundir.owned(str(tmp_path)):
        pass
    assert "\n" not in str(e.value)
  finally:
    p.kill()
    p.wait()
  # Its process is gone: the lock is stale and taken over, with one warning.
  with pytest.warns(UserWarning, match=f"stale lock \\(process {p.pid} on .* is gone\\)"):
    with rundir.owned(str(tmp_path)):
      assert rundir.read_lock(str(tmp_path / "LOCK"))["pid"] == os.getpid()
  assert not (tmp_path / "LOCK").exists()  # released


def test_stale_malformed_and_reused_pid_locks_are_taken_over(tmp_path):
  path = str(tmp_path / "LOCK")
  me = rundir.owner_record()
  cases = {"malformed": "{\"pid\": 1", "reused pid": json.dumps({**me, "pid": os.getppid(), "pid_start": "0"}),
           "dead pid": json.dumps({**me, "pid": 2 ** 22 + 17})}
  for name, text in cases.items():
    with open(path, "w") as f:
      f.write(text)
    with pytest.warns(UserWarning, match="taking over a stale lock"):
      assert rundir.try_lock(path) is None, name
    assert rundir.read_lock(path)["pid"] == os.getpid()
    rundir.release_lock(path)
  # A live process of another host, or this host's live parent, keeps its lock.
  for held in ({**me, "host": "elsewhere"}, {**me, "pid": os.getppid(), "pid_start": rundir._proc_start(os.getppid())}):  # pylint: disable=protected-access
    with open(path, "w") as f:
      json.dump(held, f)
    assert rundir.try_lock(path) == held
  os.remove(path)


# ----------------------------------------------------------------------------- one policy for JSON lines

def test_torn_last_line_is_dropped_any_other_bad_line_is_named(tmp_path):
  p = tmp_path / "metrics.jsonl"
  p.write_text('{"round": 2, "splits": {}}\n{"round": 4, "spl')
  with pytest.warns(UserWarning, match=r"line 2 is torn"):
    assert [r["round"] for r in rundir.read_metrics(str(tmp_path))] == [2]
  p.write_text('{"round": 2, "splits": {}}\ngarbage\n{"round": 4, "splits": {}}\n')
  with pytest.raises(ConfigError, match=r"metrics.jsonl: line 2 is not an evaluation record"):
    rundir.read_metrics(str(tmp_path))
  p.write_text('{"round": "two", "splits": {}}\n')
  with pytest.raises(ConfigError, match=r"record 1 is not an evaluation record"):
    rundir.read_metrics(str(tmp_path))
  (tmp_path / "summary.json").write_text('{"selection": {"heldout')
  with pytest.raises(ConfigError, match=r"summary.json: cannot read the run's summary"):
    rundir.read_summary(str(tmp_path))


def test_one_list_of_result_neutral_fields_for_resume_key_and_rescoring(tiny_config):
  from fedjax_dg.bench import sweep as sweep_lib
  c = tiny_config
  base_key, base_id = sweep_lib.config_key(c), rundir.run_identity(c)
  for field, value in (("checkpoint_every", 7), ("eval_batch_size", 3), ("quiet", False), ("workdir", "x")):
    d = c.copy_and_resolve_references()
    d[field] = value
    assert sweep_lib.config_key(d) == base_key, field
    assert rundir.run_identity(d) == base_id, field
    assert rundir.config_differences(c.to_dict(), d, multi_stage=False) == [], field
  d = c.copy_and_resolve_references()
  d.client.lr = 0.05
  assert sweep_lib.config_key(d) != base_key and rundir.run_identity(d) != base_id
  assert rundir.config_differences(c.to_dict(), d, multi_stage=False) == ["client.lr: 0.1 in the run, 0.05 now"]


# ----------------------------------------------------------------------------- checkpoints carry round and run

def _saved(tmp_path, run="00112233aabbccdd"):
  ck = ckpt_lib.Checkpoints(str(tmp_path), run=run)
  for step in (2, 4):
    ck.save(step, {"w": np.full(3, float(step), np.float32)})
  ck.close()
  return ckpt_lib.Checkpoints(str(tmp_path), run=run)


def _restore(ck):
  target = {"w": np.zeros(3, np.float32)}
  with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter("always")
    step, state = ck.restore_latest(lambda s: target)
  ck.close()
  return step, state, [str(w.message) for w in rec]


def test_an_older_checkpoint_under_a_newer_step_is_refused(tmp_path):
  import shutil
  _saved(tmp_path).close()
  d = tmp_path / "checkpoints"
  shutil.rmtree(d / "4")
  shutil.copytree(d / "2", d / "4")  # round 2's contents under step 4, its checksum file too
  s = json.loads((tmp_path / "checkpoint_sums" / "2.json").read_text())
  (tmp_path / "checkpoint_sums" / "4.json").write_text(json.dumps({**s, "step": 4}))
  step, state, warned = _restore(ckpt_lib.Checkpoints(str(tmp_path), run="00112233aabbccdd"))
  assert step == 2 and float(state["w"][0]) == 2.0
  assert len(warned) == 1 and "checkpoint 4: ValueError: it holds round 2's state, not round 4's" in warned[0]


def test_a_checkpoint_without_checksum_or_of_another_run_is_refused(tmp_path):
  _saved(tmp_path).close()
  os.remove(tmp_path / "checkpoint_sums" / "4.json")
  step, _, warned = _restore(ckpt_lib.Checkpoints(str(tmp_path), run="00112233aabbccdd"))
  assert step == 2 and "it has no checksum file (checkpoint_sums/4.json)" in warned[0]
  with pytest.raises(ckpt_lib.CheckpointError, match=r"run 00112233aabbccdd's, this is run ffffffffffffffff"):
    ckpt_lib.Checkpoints(str(tmp_path), run="ffffffffffffffff").restore_latest(lambda s: {"w": np.zeros(3, np.float32)})


# ----------------------------------------------------------------------------- the command line

def test_an_override_given_twice_takes_its_last_value():
  argv = ["prog", "--config", "c.py", "--config.model.hidden=(64,)", "--config.num_clients", "7",
          "--config.model.hidden=(32,)", "--config.num_clients=5", "--quiet"]
  assert main_lib.last_overrides(argv) == ["prog", "--config", "c.py", "--config.model.hidden=(32,)",
                                           "--config.num_clients=5", "--quiet"]


def test_repeated_tuple_override_replaces_on_the_command_line():
  code = ("import sys\nfrom ml_collections import config_flags\nfrom fedjax_dg import main\n"
          "c = config_flags.DEFINE_config_file('config', None, '')\nmain.parse_flags(sys.argv)\n"
          "print(tuple(c.value.model.hidden))\n")
  env = dict(os.environ, PYTHONPATH=helpers.pythonpath(ROOT), JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", code, "--config", "configs/default.py", "--config.model.hidden=(64,)",
                        "--config.model.hidden=(32,)"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
  assert out.stdout.strip() == "(32,)", out.stderr[-2000:]


# ----------------------------------------------------------------------------- layering

def _imports(path: str) -> set:
  import ast
  tree = ast.parse(open(path).read())
  out = set()
  for node in ast.walk(tree):  # imports inside functions count too
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
  return out


def test_the_runner_does_not_import_the_benchmark_layer_and_collect_has_no_cycle():
  pkg = os.path.join(ROOT, "fedjax_dg")
  for name in ("experiment.py", "checkpoint.py", "evaluate.py", "rundir.py", "checks.py", "main.py", "provenance.py",
               "errors.py"):
    bench = sorted(m for m in _imports(os.path.join(pkg, name)) if m.startswith("fedjax_dg.bench"))
    assert not bench, f"{name} imports {bench}"
  rundir_imports = {m for m in _imports(os.path.join(pkg, "rundir.py")) if m.startswith("fedjax_dg")}
  # the run directory reads only the errors and the config schema (fedjax_dg.defaults), for
  # the library defaults that a run's identity leaves out
  assert rundir_imports <= {"fedjax_dg.errors", "fedjax_dg.errors.ConfigError", "fedjax_dg.defaults",
                            "fedjax_dg.defaults.default_config"}, rundir_imports
  difficulty = _imports(os.path.join(pkg, "bench", "difficulty.py"))  # collect imports difficulty, not back
  assert not any(m.startswith("fedjax_dg.bench.collect") for m in difficulty), difficulty
