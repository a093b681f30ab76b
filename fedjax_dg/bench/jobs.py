"""A sweep job's folder: its files, its state, and one run of it in this process.

A job's workdir holds, besides the runner's outputs (metrics.jsonl, summary.json,
checkpoints/):
  job.json     the resolved config and the job's grid entries (written before it runs)
  RUNNING      a lock: host, pid and start time of the process running it
  events.jsonl one line per start / done / failed, with host, pid and time; a batched job's
               start line names its batch (`batch`, `batch_jobs`: the keys run with it)
  error.txt    the traceback of the last failure (removed when the job later succeeds)
  log.txt      the job's Python-level stdout and stderr

`job_state` reads a folder's state; `decide` takes a job's lock, `run_held` runs it through
the runner's entry point (`experiment.train_and_evaluate`) and records the outcome, and
`execute` does both. The launchers (`fedjax_dg.bench.launch`, `fedjax_dg.bench.tasks`) and
the readers of a sweep (`collect`, `results`) all go through this module.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
import warnings

from fedjax_dg import rundir
from fedjax_dg import stopping
from fedjax_dg.bench import sweep as sweep_lib

STATES = ("done", "running", "failed", "interrupted", "pending", "broken", "stale")
MAX_CRASHES = 2  # a job whose worker process died this many times is recorded as failed


# ---------------------------------------------------------------------------- files of a job

def job_file(workdir, name):
  """The file `name` of the job folder `workdir`."""
  return os.path.join(workdir, name)


def write_job(job: sweep_lib.Job, entries) -> None:
  """job.json: what `execute` runs, and where the job sits in the sweep."""
  if os.path.lexists(job.workdir) and not os.path.isdir(job.workdir):
    raise sweep_lib.SweepError(f"{job.workdir}: the job's folder is not a folder; move it away so the job can run")
  os.makedirs(job.workdir, exist_ok=True)
  doc = {"key": job.key, "config": job.config.to_dict(),
         "entries": [{"grid": e.grid, "axes": e.axes} for e in entries]}
  tmp = job_file(job.workdir, "job.json.tmp")
  with open(tmp, "w") as f:
    json.dump(doc, f, indent=1, default=sweep_lib.json_default)
  os.replace(tmp, job_file(job.workdir, "job.json"))


def event(workdir, kind: str, **extra) -> None:
  """Appends a `kind` line (start, done, failed, stopped, crashed) to events.jsonl."""
  rundir.append_event(workdir, kind, **extra)


def read_events(workdir) -> list[dict]:
  return rundir.read_events(workdir)


def read_lock(workdir) -> dict | None:
  """The RUNNING lock's owner record (rundir.read_lock)."""
  return rundir.read_lock(job_file(workdir, "RUNNING"))


lock_is_live = rundir.lock_is_live


def acquire(workdir, ignore_locks: bool) -> bool:
  """Takes the job's RUNNING lock (a stale one of a dead process is taken over; with
  `ignore_locks`, any other process's). Returns whether this process holds it."""
  path = job_file(workdir, "RUNNING")
  held = rundir.try_lock(path)
  if held is not None and ignore_locks and held.get("pid") != os.getpid():
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)
    held = rundir.try_lock(path)
  return held is None or held.get("pid") == os.getpid()


def problem(workdir) -> str | None:
  """Why a job's folder cannot be read (one line naming the file), or None."""
  if os.path.lexists(workdir) and not os.path.isdir(workdir):
    return f"{workdir}: the job's folder is not a folder; move it away so the job can run again"
  try:
    with warnings.catch_warnings():  # a torn last line is dropped, as the runner does
      warnings.simplefilter("ignore")
      if rundir.read_summary(workdir) is not None:
        rundir.read_metrics(workdir)
      rundir.read_events(workdir)
  except rundir.RunDirError as e:
    return str(e)
  return None


def job_state(workdir) -> str:
  """done (its summary and metrics parse) | running | failed | interrupted (started, not
  running, no error) | pending | broken (a file of it does not parse: `problem`)."""
  if problem(workdir):
    return "broken"
  if os.path.exists(job_file(workdir, "summary.json")):
    return "done"
  if lock_is_live(read_lock(workdir)):
    return "running"
  if os.path.exists(job_file(workdir, "error.txt")):
    return "failed"
  if os.path.exists(job_file(workdir, "metrics.jsonl")) or read_events(workdir):
    return "interrupted"
  return "pending"


# ---------------------------------------------------------------------------- one job

def run_config(config, workdir: str) -> dict:
  """One job: the runner's entry point, `experiment.train_and_evaluate` (a sweep's jobs are
  single folds, `data.leave_one_domain_out = False`, so R_DG's carve is the fold's own)."""
  from fedjax_dg import experiment
  return experiment.train_and_evaluate(config, workdir)


def load_job(workdir: str):
  """(key, config) of the job's job.json, the config set to run in `workdir` (resuming, quietly)."""
  with open(job_file(workdir, "job.json")) as f:
    doc = json.load(f)
  config = sweep_lib.from_json_dict(doc["config"])
  config.workdir, config.resume, config.quiet = workdir, True, True
  return doc.get("key") or os.path.basename(os.path.normpath(workdir)), config


def error_line(e: BaseException) -> str:
  """The first line of `e` as events.jsonl records it (at most 500 characters)."""
  return f"{type(e).__name__}: {e}".splitlines()[0][:500] if str(e) else type(e).__name__


def record_failure(workdir: str, e: BaseException, t0: float | None = None) -> None:
  """error.txt (the traceback of `e`) and a "failed" event with its first line."""
  with open(job_file(workdir, "error.txt"), "w") as f:
    f.write("".join(traceback.format_exception(type(e), e, e.__traceback__)))
  extra = {} if t0 is None else {"seconds": time.time() - t0}
  event(workdir, "failed", error=error_line(e), **extra)


def record_done(workdir: str, t0: float) -> None:
  """A "done" event with the job's seconds; a failure's error.txt is removed."""
  with contextlib.suppress(FileNotFoundError):
    os.remove(job_file(workdir, "error.txt"))
  event(workdir, "done", seconds=time.time() - t0)


def quiet_logging() -> None:
  from absl import logging
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint at INFO


def execute(workdir: str, ignore_locks: bool = False) -> str:
  """Runs the job in `workdir` (its job.json) in this process unless it is done or another
  process holds it. Returns "skipped", "busy", "done", "failed" or "stopped" (a stop signal:
  the job saved its round and is interrupted; `fedjax_dg.stopping`); never raises for a
  failing job: its traceback goes to error.txt."""
  if stopping.stop_signal():
    return "stopped"
  decision = decide(workdir, ignore_locks)
  if decision != "run":
    return decision
  try:
    _, config = load_job(workdir)
    error = run_held(workdir, config)
    return "done" if error is None else "stopped" if isinstance(error, stopping.Stopped) else "failed"
  finally:
    release(workdir)


def decide(workdir: str, ignore_locks: bool = False) -> str:
  """"skipped" (the job is done), "busy" (another live process holds its lock) or "run" (this
  process now holds the lock: `release` it)."""
  if job_state(workdir) == "done":
    return "skipped"
  return "run" if acquire(workdir, ignore_locks) else "busy"


def release(workdir: str) -> None:
  """Removes the job's RUNNING lock."""
  with contextlib.suppress(FileNotFoundError):
    os.remove(job_file(workdir, "RUNNING"))


def run_held(workdir: str, config, run=None) -> Exception | None:
  """Runs `config` in `workdir` (`run(config, workdir)`, default `run_config`), whose lock this
  process holds: the start line, the run with its output in log.txt, then done or failed
  (error.txt). Returns the error, if any."""
  event(workdir, "start", resumed=os.path.exists(job_file(workdir, "metrics.jsonl")))
  t0 = time.time()
  try:
    quiet_logging()
    with open(job_file(workdir, "log.txt"), "a") as log, contextlib.redirect_stdout(log), \
        contextlib.redirect_stderr(log):
      (run or run_config)(config, workdir)
  except stopping.Stopped as e:  # interrupted, not failed: a rerun resumes it
    event(workdir, "stopped", reason=str(e), seconds=time.time() - t0)
    return e
  except Exception as e:  # the sweep goes on; the job records why it stopped
    record_failure(workdir, e, t0)
    return e
  record_done(workdir, t0)
  return None


