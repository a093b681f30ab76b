"""The command-line runner under `jax.distributed`: 2 local CPU processes started by
scripts/launch_local.sh against the same run in one process. Equal summary.json metrics
and selected rounds (float tolerance), also after a SIGKILL of the pair and a resume; a
fault in one process stops the other within a bounded time with one line and leaves no
torn file; mismatched configs and a missing coordinator: one line."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import helpers
from helpers import pythonpath

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "scripts", "launch_local.sh")
# SCAFFOLD: persistent client states sharded over the processes; a cohort of 3 over 2
# processes (the engine pads it: no process count needs to divide it).
RUN = ("--config", os.path.join(ROOT, "configs", "default.py"), "--config.model.name=mlp",
       "--config.model.hidden=(16,)", "--config.num_clients=8", "--config.cohort_size=3",
       "--config.algorithm.name=scaffold", "--config.client.momentum=0", "--config.eval_every=1",
       "--config.checkpoint_every=1", "--config.quiet=True")


def _env(**extra):
  return {**os.environ, "PYTHONPATH": pythonpath(ROOT), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": helpers.xla_flags(),
          "PYTHON": sys.executable, "FEDJAX_DG": f"{sys.executable} -m fedjax_dg", **extra}


def one_process(workdir, *args):
  out = subprocess.run([sys.executable, "-m", "fedjax_dg", *RUN, f"--workdir={workdir}", *args], env=_env(),
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.load(open(os.path.join(workdir, "summary.json")))


def launch(n, workdir, *args, env=None, **popen):
  return subprocess.Popen(["bash", LAUNCH, str(n), *RUN, f"--workdir={workdir}", *args], env=env or _env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, **popen)


def two_processes(workdir, *args):
  p = launch(2, workdir, *args)
  out, err = p.communicate(timeout=900)
  assert p.returncode == 0, err[-3000:]
  return json.load(open(os.path.join(workdir, "summary.json"))), out, err


def assert_same_results(got, want):
  """Equal selected rounds and (float tolerance) equal metrics of every rule and the last round."""
  assert got["selection"].keys() == want["selection"].keys()
  for rule, sel in want["selection"].items():
    assert got["selection"][rule]["round"] == sel["round"], rule
    for part in ("val", "test"):
      for k, v in sel[part].items():
        np.testing.assert_allclose(got["selection"][rule][part][k], v, atol=1e-6, err_msg=f"{rule} {part} {k}")
  assert got["final"]["round"] == want["final"]["round"]
  np.testing.assert_allclose(got["final"]["train_loss"], want["final"]["train_loss"], rtol=1e-5)
  for split, m in want["final"]["splits"].items():
    np.testing.assert_allclose(got["final"]["splits"][split]["accuracy"], m["accuracy"], atol=1e-6)


def assert_whole(workdir):
  """No torn file: every metrics line parses and the newest checkpoint has its checksum file
  (an older one that orbax was deleting, past `max_to_keep`, when the kill came may lack
  it: a resume never reaches it while a newer one restores). Returns the evaluated rounds and
  the checkpoint steps."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    lines = f.read().split("\n")
  assert lines[-1] == "", "metrics.jsonl ends inside a line"
  rounds = [json.loads(line)["round"] for line in lines[:-1]]
  assert rounds == sorted(rounds)
  steps = [n for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit()]
  if steps:
    newest = max(steps, key=int)
    assert os.path.exists(os.path.join(workdir, "checkpoint_sums", f"{newest}.json")), newest
  return rounds, sorted(int(s) for s in steps)


def test_two_processes_equal_one(tmp_path):
  want = one_process(tmp_path / "one", "--config.num_rounds=2")
  got, out, err = two_processes(tmp_path / "two", "--config.num_rounds=2")
  assert got["processes"] == 2 and want["processes"] == 1
  assert_same_results(got, want)
  assert out.count("done:") == 1, out  # process 0 alone reports
  assert "error" not in err.lower(), err[-2000:]
  names = set(os.listdir(tmp_path / "two"))
  assert "LOCK" not in names and {"metrics.jsonl", "summary.json", "config.json", "checkpoints"} <= names
  assert not [n for n in names if ".tmp-" in n or n.startswith("LOCK.")], names  # process 1 wrote nothing
  assert sorted(os.listdir(tmp_path / "two" / "checkpoints")) == ["1", "2"]


@pytest.mark.slow
def test_kill_of_both_and_resume_equal_one(tmp_path):
  rounds = "--config.num_rounds=6"
  want = one_process(tmp_path / "one", rounds)
  workdir = tmp_path / "two"
  p = launch(2, workdir, rounds, start_new_session=True)  # its own process group: the launcher and both
  deadline = time.time() + 600
  while not os.path.exists(workdir / "checkpoint_sums" / "3.json") and p.poll() is None and time.time() < deadline:
    time.sleep(0.2)
  assert p.poll() is None, "the run ended before it could be killed"
  os.killpg(p.pid, signal.SIGKILL)
  p.communicate()
  kept, _ = assert_whole(workdir)
  assert 0 < max(kept) < 6
  got, _, _ = two_processes(workdir, rounds, "--config.resume=True")
  assert_same_results(got, want)


WRAPPER = r"""
import os, signal, sys
from fedjax_dg import checkpoint, main
pid = int(next(a.split("=")[1] for a in sys.argv if a.startswith("--config.distributed.process_id=")))
save = checkpoint.Checkpoints.save

def failing_save(self, step, state):
  if pid == 1 and step == 2:
    if os.environ["FAULT"] == "kill":
      os.kill(os.getpid(), signal.SIGKILL)
    raise OSError(28, "No space left on device (injected in process 1)")
  return save(self, step, state)
checkpoint.Checkpoints.save = failing_save
main.run()
"""


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["raise", "kill"])
def test_fault_in_one_process_stops_the_other(fault, tmp_path):
  wrapper = tmp_path / "wrapper.py"
  wrapper.write_text(WRAPPER)
  workdir = tmp_path / "run"
  p = launch(2, workdir, "--config.num_rounds=5", "--config.distributed.heartbeat_s=30",
             env=_env(FAULT=fault, FEDJAX_DG=f"{sys.executable} {wrapper}"))
  out, err = p.communicate(timeout=900)
  assert p.returncode != 0
  lines = [line for line in err.splitlines() if line.startswith(("error:", "launch_local.sh:"))]
  assert len(lines) == 1, err[-3000:]
  if fault == "raise":
    assert lines[0] == "error: process 1: [Errno 28] No space left on device (injected in process 1)", lines
  else:
    assert lines[0] == "launch_local.sh: process 1 was killed (signal 9); stopping the others", lines
  assert "done:" not in out
  rounds, steps = assert_whole(workdir)
  assert steps == [1] and rounds[-1] <= 2  # nothing past the fault: process 0 was stopped in round 3's collective


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_mismatched_configs_stop_every_process(tmp_path):
  port = _free_port()
  procs = [subprocess.Popen([sys.executable, "-m", "fedjax_dg", *RUN, f"--workdir={tmp_path / 'w'}",
                             "--config.num_rounds=2", "--config.distributed.initialize=local",
                             f"--config.distributed.coordinator_address=localhost:{port}",
                             "--config.distributed.num_processes=2", f"--config.distributed.process_id={i}",
                             f"--config.client.lr={0.1 if i == 0 else 0.2}"],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
           for i in range(2)]
  errs = [p.communicate(timeout=300)[1] for p in procs]
  assert [p.returncode for p in procs] == [2, 2]
  lines = [line for e in errs for line in e.splitlines() if line.startswith("error:")]
  assert len(lines) == 1 and "the config of process(es) [1] differs from process 0's" in lines[0], errs
  assert not os.path.exists(tmp_path / "w" / "metrics.jsonl")


@pytest.mark.slow
def test_host_loop_across_processes_is_refused_once(tmp_path):
  p = launch(2, tmp_path / "w", "--config.num_rounds=2", "--config.engine.strategy=host_loop")
  out, err = p.communicate(timeout=600)
  assert p.returncode == 2
  lines = [line for line in err.splitlines() if line.startswith(("error:", "launch_local.sh:"))]
  assert lines == ["error: engine.strategy: host_loop runs on one process's devices; under jax.distributed "
                   "(2 processes) use vmap, chunked, sequential or auto"], err[-2000:]


@pytest.mark.parametrize("bad, line", [
    ("--config.foo=1", "error: --config.foo: unknown config field"),  # refused while parsing the flags
    ("--config.partition.lam=1.5", "error: partition.lam must lie in [0, 1], got 1.5")])  # by every process, agreed
def test_bad_input_is_one_line_for_the_job(bad, line, tmp_path):
  p = launch(2, tmp_path / "w", bad)
  _, err = p.communicate(timeout=600)
  assert p.returncode == 2
  assert [x for x in err.splitlines() if x.startswith(("error:", "launch_local.sh:"))] == [line], err[-2000:]


STOP_WRAPPER = r"""
import os, signal, sys
from fedjax_dg import experiment, main
pid = int(next(a.split("=")[1] for a in sys.argv if a.startswith("--config.distributed.process_id=")))
checks_due = experiment.RunBook.checks_due

def signalling(self, done):
  if pid == 1 and done == 3:  # process 1 alone gets the signal, during round 3
    os.kill(os.getpid(), signal.SIGTERM)
  return checks_due(self, done)

experiment.RunBook.checks_due = signalling
main.run()
"""


@pytest.mark.slow
def test_a_signal_to_one_process_stops_both_at_the_same_saved_round_and_the_resume_equals_one(tmp_path):
  """fedjax_dg.stopping under jax.distributed: the processes agree on the stop round, save it
  together (off the checkpoint schedule) and exit with 128 + SIGTERM; two processes resumed
  end with the metrics of one process never stopped."""
  rounds = "--config.num_rounds=6"
  want = one_process(tmp_path / "one", rounds)
  wrapper = tmp_path / "wrapper.py"
  wrapper.write_text(STOP_WRAPPER)
  workdir = tmp_path / "two"
  p = launch(2, workdir, rounds, "--config.checkpoint_every=5",
             env=_env(FEDJAX_DG=f"{sys.executable} {wrapper}"))
  out, err = p.communicate(timeout=900)
  assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
  assert "stopped: stopped by SIGTERM after round 3; its checkpoint of round 3 is saved" in err, err[-3000:]
  assert "was killed" not in err and "done:" not in out
  kept, steps = assert_whole(workdir)
  assert steps == [3] and max(kept) == 3
  got, _, _ = two_processes(workdir, rounds, "--config.resume=True")
  assert_same_results(got, want)


@pytest.mark.slow
def test_sigterm_to_launch_local_reaches_every_process_which_stop_at_one_saved_round(tmp_path):
  """scripts/launch_local.sh passes SIGTERM on (it used to SIGKILL its processes): both stop
  after the same round with its checkpoint, the script exits 128 + SIGTERM, and two processes
  resumed end with the metrics of one process never stopped."""
  rounds = "--config.num_rounds=400"
  want = one_process(tmp_path / "one", rounds, "--config.eval_every=50", "--config.checkpoint_every=1000")
  workdir = tmp_path / "two"
  p = launch(2, workdir, rounds, "--config.eval_every=50", "--config.checkpoint_every=1000")
  deadline = time.time() + 600
  while not os.path.exists(workdir / "metrics.jsonl") and p.poll() is None and time.time() < deadline:
    time.sleep(0.2)
  assert p.poll() is None, "the run ended before the signal"
  p.send_signal(signal.SIGTERM)  # to the script alone
  out, err = p.communicate(timeout=600)
  assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
  assert "stopped: stopped by SIGTERM after round" in err and "was killed" not in err, err[-3000:]
  kept, steps = assert_whole(workdir)
  assert len(steps) == 1 and 50 <= steps[0] < 400  # the stop round, off the schedule (every 1000)
  got, _, _ = two_processes(workdir, rounds, "--config.eval_every=50", "--config.checkpoint_every=1000",
                            "--config.resume=True")
  assert_same_results(got, want)
