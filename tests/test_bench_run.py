"""Running sweeps for real: a SIGKILLed and restarted sweep equals an uninterrupted one, a
failing job is recorded and the rest run, and the submitit local executor runs jobs."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import ml_collections
import pytest

import helpers

from fedjax_dg.bench import collect, launch, sweep as sweep_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "sweeps", "tiny.py")


LAMS = "(1.0,)"  # tiny.py's lambda = 1 column only: 4 jobs in 2 batch programs, as `cli` runs them


def tiny(root, bad_job: bool = True):
  """configs/sweeps/tiny.py at lambda = 1 (2 methods x 2 seeds, 4 jobs) plus, with `bad_job`, a
  grid whose one job has an invalid lambda (the runner's validation raises)."""
  s = sweep_lib.load_config_file(TINY)
  s.root = str(root)
  s.grids.table.lams = (1.0,)
  s.base.num_rounds = 5  # a wider window to catch a job between its first checkpoint and its end
  if bad_job:
    s.grids.bad = {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.5,), "seeds": (0,)}
  return s


@pytest.fixture
def jax_cache(tmp_path_factory):
  """A JAX compilation cache shared by this file's tests (and pytest-xdist workers)."""
  path = tmp_path_factory.getbasetemp().parent / "fedjax_dg_bench_jax_cache"
  path.mkdir(exist_ok=True)
  return str(path)


def finished_checkpoint(workdir) -> bool:
  ck = os.path.join(workdir, "checkpoints")
  return os.path.isdir(ck) and any(d.isdigit() for d in os.listdir(ck))


def cli(root, cache, *args, **kw):
  """`python -m fedjax_dg.bench ... --sweep configs/sweeps/tiny.py` with 5 rounds at lambda = 1, in `root`."""
  env = dict(os.environ, PYTHONPATH=helpers.pythonpath(ROOT), JAX_PLATFORMS="cpu")
  return subprocess.Popen([sys.executable, "-m", "fedjax_dg.bench", *args, f"--sweep={TINY}",
                           f"--sweep.root={root}", "--sweep.base.num_rounds=5", f"--sweep.grids.table.lams={LAMS}",
                           f"--sweep.launch.compilation_cache_dir={cache}"], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def test_killed_sweep_resumes_to_the_uninterrupted_tables_and_failures_are_recorded(tmp_path, jax_cache):
  root, ref_root, cache = tmp_path / "sweep", tmp_path / "reference", jax_cache
  # The CLI launcher runs tiny.py's 4 jobs at lambda = 1 in its own process group and is killed
  # with SIGKILL as soon as some job has a finished checkpoint but no summary.
  proc = cli(root, cache, "run", start_new_session=True)
  exp4 = sweep_lib.expand(tiny(root, bad_job=False))
  assert len(exp4.jobs) == 4
  caught, deadline = None, time.time() + 300
  while caught is None and proc.poll() is None and time.time() < deadline:
    for key, job in exp4.jobs.items():
      if finished_checkpoint(job.workdir) and not os.path.exists(os.path.join(job.workdir, "summary.json")):
        caught = key
        os.killpg(proc.pid, signal.SIGKILL)
        break
    time.sleep(0.01)
  proc.wait()
  assert caught is not None, "the sweep ended before a job could be interrupted:\n" + proc.stdout.read()
  t0 = time.time()  # the killed worker is gone once init reaps it
  while launch.lock_is_live(launch.read_lock(exp4.jobs[caught].workdir)) and time.time() < t0 + 30:
    time.sleep(0.05)
  before = {k: launch.job_state(j.workdir) for k, j in exp4.jobs.items()}
  assert before[caught] == "interrupted" and launch.read_lock(exp4.jobs[caught].workdir)  # a dead process's lock
  done_before = {k for k, st in before.items() if st == "done"}
  mtimes = {k: os.stat(os.path.join(exp4.jobs[k].workdir, "summary.json")).st_mtime_ns for k in done_before}

  # Restarted with one more grid whose job raises (an invalid lambda): it fails, the rest run.
  s = tiny(root)
  exp = sweep_lib.expand(s)
  assert len(exp.jobs) == 5 and set(exp4.jobs) < set(exp.jobs)
  bad = next(e.key for e in exp.entries if e.grid == "bad")
  counts = launch.run_local(exp, workers=1, cache_dir=cache, quiet=True)
  assert counts["failed"] == 1 and counts["done"] == 4 - len(done_before)
  rows = {r["key"]: r for r in launch.status(exp)}
  assert rows[bad]["state"] == "failed" and "partition.lam must lie in [0, 1], got 1.5" in rows[bad]["error"]
  assert "ConfigError" in open(os.path.join(exp.jobs[bad].workdir, "error.txt")).read()
  for key, job in exp4.jobs.items():
    assert rows[key]["state"] == "done"
    assert [e["event"] for e in launch.read_events(job.workdir)].count("done") == 1  # done once
    assert [r["round"] for r in collect.read_records(job.workdir)] == [1, 2, 3, 4, 5]  # every evaluation once
  for k in done_before:  # finished before the kill: not run again
    assert os.stat(os.path.join(exp.jobs[k].workdir, "summary.json")).st_mtime_ns == mtimes[k]
    assert [e["event"] for e in launch.read_events(exp.jobs[k].workdir)] == ["start", "done"]
  starts = [e for e in launch.read_events(exp.jobs[caught].workdir) if e["event"] == "start"]
  assert len(starts) == 2 and starts[1]["resumed"]

  # The interrupted job run again without interruption, in another root: identical records,
  # so identical tables (the other jobs ran uninterrupted either way).
  ref = tiny(ref_root, bad_job=False)
  ref.base.checkpoint_every = 0  # result-neutral: the same job, without checkpoint writes
  ref_exp = sweep_lib.expand(ref)
  assert list(ref_exp.jobs) == list(exp4.jobs)  # the key depends on neither the root nor checkpoint_every
  ref_exp = dataclasses.replace(ref_exp, jobs={caught: ref_exp.jobs[caught]},
                                entries=[e for e in ref_exp.entries if e.key == caught])
  assert launch.run_local(ref_exp, workers=1, cache_dir=cache, quiet=True)["done"] == 1
  assert collect.read_records(exp.jobs[caught].workdir) == collect.read_records(ref_exp.jobs[caught].workdir)
  tables = collect.collect(s, str(tmp_path / "tables"), exp)
  assert len(tables) == 3 and "X" not in tables["table_heldout_domain"]

  # The status view of the 4-job sweep (the CLI prints this text: test_configs_packaged.py).
  out = launch.status_text(launch.status(exp4))
  assert "4 done, 0 running, 0 failed, 0 interrupted, 0 pending (of 4 jobs)" in out, out


# In the slow suite: by default test_bench_batched.py's test_submitit_submits_one_job_per_batch
# takes the same path (run_submitit, execute_batch in another process, a second submission
# finds nothing). Checked here alone: the outcomes the vectorised launch returns with `wait=True`.
@pytest.mark.slow
def test_submitit_local_executor_runs_a_sweep(tmp_path, jax_cache):
  pytest.importorskip("submitit")
  s = tiny(tmp_path / "sweep", bad_job=False)
  s.grids = ml_collections.ConfigDict({"table": {"methods": ("fedavg",), "client_counts": (4,), "lams": (0.0,),
                                                 "seeds": (0,)}})
  exp = sweep_lib.expand(s)
  outcomes = launch.run_submitit(exp, str(tmp_path / "submitit"), cluster="local", parameters={"timeout_min": 10},
                                 wait=True, quiet=True, cache_dir=jax_cache)
  assert outcomes == ["done"]
  from fedjax_dg.eval.evaluate import select
  job = next(iter(exp.jobs.values()))
  events = launch.read_events(job.workdir)
  assert [e["event"] for e in events] == ["start", "done"] and events[0]["pid"] != os.getpid()
  assert os.listdir(tmp_path / "submitit")  # submitit's own job files and logs
  summary = json.load(open(os.path.join(job.workdir, "summary.json")))
  recs = collect.read_records(job.workdir)
  assert [r["round"] for r in recs] == [1, 2, 3, 4, 5]
  assert summary["selection"]["heldout_domain"] == select(recs, "heldout_domain")
  # A second submission finds nothing to do.
  assert launch.run_submitit(exp, str(tmp_path / "submitit"), cluster="local", wait=True, quiet=True) == []
