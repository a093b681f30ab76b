"""Running a sweep's jobs: one job in this process (`execute`), a local pool of worker
processes (`run_local`), or Slurm through submitit (`run_submitit`).

A job's workdir holds, besides the runner's outputs (metrics.jsonl, summary.json,
checkpoints/):
  job.json     the resolved config and the job's grid entries (written before it runs)
  RUNNING      a lock: host, pid and start time of the process running it
  events.jsonl one line per start / done / failed, with host, pid and time
  error.txt    the traceback of the last failure (removed when the job later succeeds)
  log.txt      the job's Python-level stdout and stderr

A finished job (its summary.json and metrics.jsonl parse) is skipped; a job whose files do
not parse is "broken" (status names the file) and runs again; an interrupted one restarts with
`config.resume=True`, i.e. from its latest orbax checkpoint, which gives the metrics of an
uninterrupted run (the runner's kill-and-resume guarantee).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import multiprocessing
import os
import time
import traceback
import warnings

from fedjax_dg import rundir
from fedjax_dg.bench import sweep as sweep_lib

STATES = ("done", "running", "failed", "interrupted", "pending", "broken", "stale")
MAX_CRASHES = 2  # a job whose worker process died this many times is recorded as failed


# ---------------------------------------------------------------------------- files of a job

def _path(workdir, name):
  return os.path.join(workdir, name)


def write_job(job: sweep_lib.Job, entries) -> None:
  """job.json: what `execute` runs, and where the job sits in the sweep."""
  if os.path.lexists(job.workdir) and not os.path.isdir(job.workdir):
    raise sweep_lib.SweepError(f"{job.workdir}: the job's folder is not a folder; move it away so the job can run")
  os.makedirs(job.workdir, exist_ok=True)
  doc = {"key": job.key, "config": job.config.to_dict(),
         "entries": [{"grid": e.grid, "axes": e.axes} for e in entries]}
  tmp = _path(job.workdir, "job.json.tmp")
  with open(tmp, "w") as f:
    json.dump(doc, f, indent=1, default=sweep_lib._json_default)
  os.replace(tmp, _path(job.workdir, "job.json"))


def _event(workdir, kind: str, **extra) -> None:
  rundir.append_event(workdir, kind, **extra)


def read_events(workdir) -> list[dict]:
  return rundir.read_events(workdir)


def read_lock(workdir) -> dict | None:
  """The RUNNING lock's owner record (rundir.read_lock)."""
  return rundir.read_lock(_path(workdir, "RUNNING"))


lock_is_live = rundir.lock_is_live


def _acquire(workdir, ignore_locks: bool) -> bool:
  path = _path(workdir, "RUNNING")
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
  if os.path.exists(_path(workdir, "summary.json")):
    return "done"
  if lock_is_live(read_lock(workdir)):
    return "running"
  if os.path.exists(_path(workdir, "error.txt")):
    return "failed"
  if os.path.exists(_path(workdir, "metrics.jsonl")) or read_events(workdir):
    return "interrupted"
  return "pending"


# ---------------------------------------------------------------------------- one job

def run_config(config, workdir: str) -> dict:
  """`train_and_evaluate`, or, for R_DG's carved folds, the same steps with
  `splits.fold_from_config` (until the runner passes the carve fields to make_fold itself)."""
  from fedjax_dg import experiment
  d = config.data
  if d.get("test_domain_train_fraction", 0.0) == 0.0 or d.name == "wilds":
    return experiment.train_and_evaluate(config, workdir)
  from fedjax_dg import config as config_lib
  from fedjax_dg.data import datasets, splits
  config_lib.validate(config)
  return experiment.run_fold(config, splits.fold_from_config(datasets.load_dataset(d), d), workdir)


def execute(workdir: str, ignore_locks: bool = False) -> str:
  """Runs the job in `workdir` (its job.json) in this process unless it is done or another
  process holds it. Returns "skipped", "busy", "done" or "failed"; never raises for a
  failing job: its traceback goes to error.txt."""
  if job_state(workdir) == "done":
    return "skipped"
  if not _acquire(workdir, ignore_locks):
    return "busy"
  try:
    with open(_path(workdir, "job.json")) as f:
      config = sweep_lib.from_json_dict(json.load(f)["config"])
    config.workdir, config.resume, config.quiet = workdir, True, True
    _event(workdir, "start", resumed=os.path.exists(_path(workdir, "metrics.jsonl")))
    t0 = time.time()
    try:
      from absl import logging
      logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint at INFO
      with open(_path(workdir, "log.txt"), "a") as log, contextlib.redirect_stdout(log), \
          contextlib.redirect_stderr(log):
        run_config(config, workdir)
    except Exception as e:  # the sweep goes on; the job records why it stopped
      with open(_path(workdir, "error.txt"), "w") as f:
        f.write(traceback.format_exc())
      _event(workdir, "failed", error=f"{type(e).__name__}: {e}".splitlines()[0][:500], seconds=time.time() - t0)
      return "failed"
    with contextlib.suppress(FileNotFoundError):
      os.remove(_path(workdir, "error.txt"))
    _event(workdir, "done", seconds=time.time() - t0)
    return "done"
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.remove(_path(workdir, "RUNNING"))


# ---------------------------------------------------------------------------- launchers

def prepare(exp: sweep_lib.Expansion) -> list[sweep_lib.Job]:
  """Writes every job's job.json; returns the jobs not yet done."""
  by_key = {}
  for e in exp.entries:
    by_key.setdefault(e.key, []).append(e)
  todo = []
  for key, job in exp.jobs.items():
    write_job(job, by_key[key])
    if job_state(job.workdir) != "done":
      todo.append(job)
  return todo


def _worker_init(cache_dir: str) -> None:
  if cache_dir:
    import jax
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _mark_dead(job: sweep_lib.Job) -> None:
  """The worker running `job` died (a signal, out of memory): record it as failed."""
  with open(_path(job.workdir, "error.txt"), "w") as f:
    f.write(f"the worker process running this job died {MAX_CRASHES} times (killed by a signal or out of "
            "memory); see log.txt\n")
  _event(job.workdir, "failed", error="worker process died")


def _print(msg: str, quiet: bool) -> None:
  if not quiet:
    print(msg, flush=True)


def run_local(exp: sweep_lib.Expansion, workers: int = 1, cache_dir: str = "", quiet: bool = False,
              ignore_locks: bool = False) -> dict:
  """Runs every job not done in `workers` worker processes (spawned, each running jobs one
  after another in-process). A job that raises is recorded failed and the rest go on. When
  a worker dies (a signal, out of memory) the pool breaks: its unfinished jobs run again in
  a fresh pool, and a job whose worker died `MAX_CRASHES` times is recorded failed."""
  if workers < 1:
    raise sweep_lib.SweepError(f"workers must be >= 1, got {workers}")
  todo = prepare(exp)
  label = {e.key: sweep_lib.describe(e.axes) for e in reversed(exp.entries)}
  counts = {s: 0 for s in ("done", "failed", "skipped", "busy")}
  total, n = len(todo), 0
  _print(f"{len(exp.jobs)} jobs, {len(exp.jobs) - total} already done, {total} to run on {workers} worker(s)", quiet)
  ctx = multiprocessing.get_context("spawn")
  while todo:
    with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init, initargs=(cache_dir,)) as pool:
      futures = {pool.submit(execute, j.workdir, ignore_locks): j for j in todo}
      todo, broken = [], False
      for f in cf.as_completed(futures):
        job = futures[f]
        try:
          outcome = f.result()
        except cf.process.BrokenProcessPool:
          broken = True
          todo.append(job)
          continue
        n += 1
        counts[outcome] += 1
        _print(f"[{n}/{total}] {outcome:7s} {label[job.key]}  {job.workdir}", quiet)
    if broken:  # a worker died; the pool took the other workers' jobs down with it
      for j in [j for j in todo if read_lock(j.workdir) and not lock_is_live(read_lock(j.workdir))]:
        _event(j.workdir, "crashed")
        with contextlib.suppress(FileNotFoundError):
          os.remove(_path(j.workdir, "RUNNING"))
        if sum(e["event"] == "crashed" for e in read_events(j.workdir)) >= MAX_CRASHES:
          _mark_dead(j)
          todo.remove(j)
          n += 1
          counts["failed"] += 1
          _print(f"[{n}/{total}] failed  {label[j.key]} (its worker died {MAX_CRASHES} times)  {j.workdir}", quiet)
  return counts


def _child_pythonpath() -> str:
  """PYTHONPATH under which a job process imports this same fedjax_dg."""
  import fedjax_dg
  root = os.path.dirname(os.path.dirname(os.path.abspath(fedjax_dg.__file__)))
  rest = os.environ.get("PYTHONPATH", "")
  return root + (os.pathsep + rest if rest else "")


@contextlib.contextmanager
def _environ(**values):
  """os.environ with `values` set (None: left alone) inside the block, restored after."""
  old = {k: os.environ.get(k) for k in values}
  os.environ.update({k: v for k, v in values.items() if v is not None})
  try:
    yield
  finally:
    for k, v in old.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


def run_submitit(exp: sweep_lib.Expansion, folder: str, cluster: str | None = None, parameters: dict | None = None,
                 wait: bool = False, quiet: bool = False, cache_dir: str = "") -> list:
  """Submits every job not done as one submitit batch (a Slurm job array with
  `cluster=None` on a Slurm login node; `cluster="local"` runs them as local processes,
  as the tests do). `parameters` go to `update_parameters` (e.g. timeout_min,
  slurm_partition, gpus_per_node, cpus_per_task, slurm_array_parallelism). The jobs
  import this fedjax_dg (PYTHONPATH) and use `cache_dir` as JAX's compilation cache. With
  `wait`, returns the outcomes ("done", "failed", ...), else the submitit job handles."""
  try:
    import submitit
  except ImportError:
    raise sweep_lib.SweepError("the submitit launcher needs submitit: pip install 'fedjax-dg[cluster]'") from None
  todo = prepare(exp)
  if not todo:
    _print(f"{len(exp.jobs)} jobs, all done", quiet)
    return []
  executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
  executor.update_parameters(**dict(parameters or {}))
  cache = dict(JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0") if cache_dir else {}
  with _environ(PYTHONPATH=_child_pythonpath(), **cache), executor.batch():
    handles = [executor.submit(execute, os.path.abspath(j.workdir)) for j in todo]
  _print(f"{len(exp.jobs)} jobs, {len(exp.jobs) - len(todo)} already done, {len(todo)} submitted to "
         f"{executor.cluster} (logs in {folder})", quiet)
  if not wait:
    return handles
  return [h.result() for h in handles]


def status(exp: sweep_lib.Expansion) -> list[dict]:
  """One row per job: key, state, description, workdir, and the first line of any error. A
  finished job whose recorded source fingerprint is not the current code's is "stale"
  (`fedjax_dg.bench.results.is_stale`): it stays finished for `run`, and collect / report
  refuse it unless told otherwise."""
  from fedjax_dg import provenance
  from fedjax_dg.bench import results as results_lib
  label = {e.key: sweep_lib.describe(e.axes) for e in reversed(exp.entries)}
  current = provenance.source_fingerprint()["sha256"]
  rows = []
  for key, job in exp.jobs.items():
    state = job_state(job.workdir)
    if state == "done" and results_lib.is_stale(rundir.read_summary(job.workdir), current):
      state = "stale"
    err = ""
    if state == "failed":
      ev = [e for e in read_events(job.workdir) if e["event"] == "failed"]
      err = ev[-1].get("error", "") if ev else ""
    elif state == "broken":
      err = problem(job.workdir)
    rows.append({"key": key, "state": state, "job": label[key], "workdir": job.workdir, "error": err})
  return rows


def status_text(rows: list[dict], verbose: bool = False) -> str:
  counts = {s: sum(r["state"] == s for r in rows) for s in STATES}
  shown = [s for s in STATES if s not in ("broken", "stale") or counts[s]]  # these two only when a job is
  lines = [", ".join(f"{counts[s]} {s}" for s in shown) + f" (of {len(rows)} jobs)"]
  for r in rows:
    if verbose or r["state"] != "done":
      lines.append(f"{r['state']:11s} {r['job']}  {r['workdir']}" + (f"\n            {r['error']}" if r["error"] else ""))
  return "\n".join(lines)
