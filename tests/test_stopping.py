"""Stopping on a signal (fedjax_dg.stopping): a run that gets SIGTERM or SIGUSR1 finishes its
round, saves a checkpoint of that round (off the checkpoint schedule) and exits with
128 + the signal's number; resuming it ends with the metrics of a run never stopped. The
same for a batch of runs, and for `bench run`, whose stopped job reads "interrupted" and
resumes on the next `bench run`."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = ("--config", os.path.join(ROOT, "configs", "default.py"), "--config.model.name=mlp",
       "--config.model.hidden=(16,)", "--config.num_clients=4", "--config.num_rounds=8", "--config.eval_every=2",
       "--config.checkpoint_every=5", "--config.quiet=True")
# The signal arrives while round STOP_AT runs (sent from inside it), so the stop round is known.
WRAPPER = r"""
import os, signal
from fedjax_dg import experiment, main
checks_due = experiment.RunBook.checks_due

def signalling(self, done):
  if done == int(os.environ["STOP_AT"]):
    os.kill(os.getpid(), getattr(signal, os.environ["STOP_SIGNAL"]))
  return checks_due(self, done)

experiment.RunBook.checks_due = signalling
main.run()
"""


def _env(**extra):
  return {**os.environ, "PYTHONPATH": helpers.pythonpath(ROOT), "JAX_PLATFORMS": "cpu",
          "XLA_FLAGS": helpers.xla_flags(), **extra}


def _run(args, **env):
  cmd = [sys.executable, "-c", WRAPPER] if env else [sys.executable, "-m", "fedjax_dg"]
  return subprocess.run(cmd + list(args), env=_env(**env), capture_output=True, text=True, timeout=900, cwd=ROOT)


def _records(workdir):
  return [json.loads(l) for l in open(os.path.join(workdir, "metrics.jsonl"))]


def _steps(workdir):
  return sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())


@pytest.mark.parametrize("sig,runs", [
    ("SIGTERM", ()),
    pytest.param("SIGUSR1", ("--config.runs=('seed=0', 'seed=1')",), marks=pytest.mark.slow)])
def test_a_signal_stops_after_the_round_with_its_checkpoint_and_the_resume_is_the_run_never_stopped(
    tmp_path, sig, runs):
  ref, stopped = str(tmp_path / "ref"), str(tmp_path / "stopped")
  out = _run(RUN + runs + (f"--workdir={ref}",))
  assert out.returncode == 0, out.stderr[-3000:]
  out = _run(RUN + runs + (f"--workdir={stopped}",), STOP_AT="3", STOP_SIGNAL=sig)
  assert out.returncode == 128 + getattr(signal, sig), out.stderr[-3000:]
  line = f"stopped by {sig} after round 3; its checkpoint of round 3 is saved"
  assert line in out.stderr and f"resume with --workdir={stopped} --config.resume=True" in out.stderr
  dirs = [os.path.join(stopped, f"run_{i}") for i in range(2)] if runs else [stopped]
  refs = [os.path.join(ref, f"run_{i}") for i in range(2)] if runs else [ref]
  for d in dirs:  # round 3 is off the schedule (every 5): saved because of the stop; nothing summarised
    assert _steps(d) == [3] and not os.path.exists(os.path.join(d, "summary.json"))
    assert [r["round"] for r in _records(d)] == [2]
  out = _run(RUN + runs + (f"--workdir={stopped}", "--config.resume=True"))
  assert out.returncode == 0, out.stderr[-3000:]
  for d, r in zip(dirs, refs):
    got, want = json.load(open(os.path.join(d, "summary.json"))), json.load(open(os.path.join(r, "summary.json")))
    assert _records(d) == _records(r)  # every evaluated round, bit for bit
    assert got["selection"] == want["selection"]


def _sweep(tmp_path, rounds: int) -> str:
  path = tmp_path / "sweep.py"
  path.write_text(f"""
import ml_collections
from fedjax_dg.bench import sweep_helpers as sweep_common

def get_config():
  s = sweep_common.skeleton("stop", {str(tmp_path / "runs")!r})
  s.base.model.name, s.base.model.hidden = "mlp", (16,)
  s.base.num_rounds, s.base.eval_every, s.base.checkpoint_every = {rounds}, 10, 1000
  s.grids = ml_collections.ConfigDict({{"table": {{"methods": ("fedavg",), "client_counts": (4,), "lams": (1.0,),
                                                  "seeds": (0,)}}}})
  return s
""")
  return str(path)


def _bench(sweep, *args, **popen):
  return subprocess.Popen([sys.executable, "-m", "fedjax_dg.bench", *args, "--sweep", sweep], env=_env(), cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [("--workers=1",), ("--workers=1", "--no-vectorize")])
def test_bench_run_passes_a_signal_to_its_worker_whose_job_saves_its_round_and_resumes_on_the_next_run(
    tmp_path, launcher):
  sweep = _sweep(tmp_path, rounds=2000)
  p = _bench(sweep, "run", *launcher)
  runs = tmp_path / "runs"
  deadline, workdir = time.time() + 600, None
  while time.time() < deadline and p.poll() is None:  # the job has evaluated a round: send the signal
    done = [d for d in (runs.iterdir() if runs.exists() else ()) if (d / "metrics.jsonl").exists()]
    if done:
      workdir = str(done[0])
      break
    time.sleep(0.2)
  assert workdir and p.poll() is None, "the job ended before the signal"
  p.send_signal(signal.SIGTERM)  # to the launcher alone: it passes it on to its worker
  out, err = p.communicate(timeout=600)
  assert p.returncode == 128 + signal.SIGTERM, err[-3000:]
  assert "stopped by SIGTERM: run the same command again to resume" in err
  assert "1 stopped" in out and "1 interrupted" in out
  events = [json.loads(l)["event"] for l in open(os.path.join(workdir, "events.jsonl"))]
  assert events == ["start", "stopped"] and not os.path.exists(os.path.join(workdir, "error.txt"))
  step = _steps(workdir)[-1]
  assert 0 < step < 2000 and step not in (1000,)  # saved at the stop, off the schedule
  q = _bench(sweep, "run", *launcher)
  out, err = q.communicate(timeout=900)
  assert q.returncode == 0, err[-3000:]
  assert "1 done" in out
  events = [json.loads(l) for l in open(os.path.join(workdir, "events.jsonl"))]
  assert [e["event"] for e in events] == ["start", "stopped", "start", "done"] and events[2]["resumed"]
  assert _records(workdir)[-1]["round"] == 2000
