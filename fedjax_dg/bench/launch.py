"""Running a sweep's jobs: batches of jobs that share one compiled program in a local pool
of worker processes (`run_batched`, the default), one job at a time per worker (`run_local`,
`--no-vectorize`), or Slurm through submitit (`run_submitit`, one submitit job per batch, or
per job run as several tasks of one `jax.distributed` run: `fedjax_dg.bench.tasks`).
`execute` runs one job in this process, `execute_batch` a batch (`fedjax_dg.bench.batches`
groups and sizes them; `fedjax_dg.batch` runs them). The local pool starts the units it
expects to take longest first (`longest_first`, from the estimates the command line passes:
`collect.job_seconds`), so that the end of a phase does not leave one worker running a long
unit alone.

A job's folder (job.json, RUNNING, events.jsonl, error.txt, log.txt) and one run of it in
this process are `fedjax_dg.bench.jobs`'s.

A finished job (its summary.json and metrics.jsonl parse) is skipped; a job whose files do
not parse is "broken" (status names the file) and runs again; an interrupted one restarts with
`config.resume=True`, i.e. from its latest orbax checkpoint, which gives the metrics of an
uninterrupted run (the runner's kill-and-resume guarantee).
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import importlib.util
import json
import multiprocessing
import os
import signal
import threading
import time
import traceback
import warnings

from fedjax_dg import config as config_lib
from fedjax_dg import rundir
from fedjax_dg import stopping
from fedjax_dg.bench import batches as batches_lib
from fedjax_dg.bench import sweep as sweep_lib

from fedjax_dg.bench import jobs as jobs_lib
from fedjax_dg.bench.jobs import (MAX_CRASHES, STATES, decide, execute, job_state, load_job, lock_is_live,  # noqa: F401
                                  problem, quiet_logging, read_events, read_lock, release, run_config, run_held,
                                  write_job)


# ---------------------------------------------------------------------------- a batch of jobs

class _Tee:
  """A text stream writing to every file of `files` (a batch's output into each job's log.txt)."""

  def __init__(self, files):
    self.files = files

  def write(self, text: str) -> int:
    for f in self.files:
      f.write(text)
    return len(text)

  def flush(self) -> None:
    for f in self.files:
      f.flush()


def _run_batch(workdirs: list[str], keys: list[str], configs: list, outcome: dict) -> None:
  """One batch (`batch.train_and_evaluate_batch`): each job's start line names the batch;
  each job is recorded done or failed with its own error."""
  from fedjax_dg import batch
  bid = batches_lib.batch_id(keys)
  for w in workdirs:
    jobs_lib.event(w, "start", resumed=os.path.exists(jobs_lib.job_file(w, "metrics.jsonl")), batch=bid, batch_jobs=keys)
  t0 = time.time()
  with contextlib.ExitStack() as stack:
    tee = _Tee([stack.enter_context(open(jobs_lib.job_file(w, "log.txt"), "a")) for w in workdirs])
    stack.enter_context(contextlib.redirect_stdout(tee))
    stack.enter_context(contextlib.redirect_stderr(tee))
    try:
      results = batch.train_and_evaluate_batch(configs, workdirs)
    except Exception as e:  # pylint: disable=broad-except  # the batch as a whole failed: each job says why
      results = [e] * len(workdirs)
  for w, r in zip(workdirs, results):
    if isinstance(r, stopping.Stopped):  # interrupted, not failed: a rerun resumes it
      jobs_lib.event(w, "stopped", reason=str(r), seconds=time.time() - t0)
      outcome[w] = ("stopped", bid)
    elif isinstance(r, BaseException):
      jobs_lib.record_failure(w, r, t0)
      outcome[w] = ("failed", bid)
    else:
      jobs_lib.record_done(w, t0)
      outcome[w] = ("done", bid)


def _sizes(workdirs: list[str], configs: dict, outcome: dict) -> list[int]:
  """`batch.run_bytes` of each job; a job whose estimate raises (its data cannot be read) is
  recorded failed and dropped from `workdirs`."""
  from fedjax_dg import batch
  sizes, known = [], {}
  for w in list(workdirs):
    try:  # equal static key and data: equal estimate (it reads neither seeds nor continuous values)
      same = (batch.static_key(configs[w]), rundir.canonical_json(rundir.plain(configs[w].data.to_dict())))
      if same not in known:
        known[same] = int(batch.run_bytes(configs[w]))
      sizes.append(known[same])
    except Exception as e:  # pylint: disable=broad-except  # the job fails alone
      jobs_lib.record_failure(w, e)
      outcome[w] = ("failed", "")
      workdirs.remove(w)
  return sizes


def execute_batch(workdirs: list[str], ignore_locks: bool = False, memory: batches_lib.Memory | None = None,
                  workers: int = 1, max_runs: int = batches_lib.DEFAULT_MAX_RUNS) -> list[tuple[str, str, str]]:
  """Runs the jobs in `workdirs` (one static key) in this process as batches that fit
  `memory` (a budget, or a share of this device's memory divided among `workers`) and hold
  at most `max_runs` jobs. A job done is skipped, one another live process holds is busy,
  an interrupted one resumes from its checkpoints. Returns `(workdir, outcome, batch id)`
  per job, outcome "skipped", "busy", "done", "failed" or "stopped" (a stop signal: saved
  and interrupted, or not started); never raises for a failing job."""
  if stopping.stop_signal():
    return [(w, "stopped", "") for w in workdirs]
  outcome, held = {}, []
  for w in workdirs:
    if job_state(w) == "done":
      outcome[w] = ("skipped", "")
    elif not jobs_lib.acquire(w, ignore_locks):
      outcome[w] = ("busy", "")
    else:
      held.append(w)
  try:
    quiet_logging()
    keys, configs, ready = {}, {}, []
    for w in held:
      try:
        keys[w], configs[w] = load_job(w)
        config_lib.validate(configs[w])  # an invalid config fails alone, before the batch compiles
        ready.append(w)
      except Exception as e:  # pylint: disable=broad-except  # an unreadable job.json or invalid config fails alone
        jobs_lib.record_failure(w, e)
        outcome[w] = ("failed", "")
    if len(ready) > 1:
      sizes = _sizes(ready, configs, outcome)
      from fedjax_dg import checks
      budget = (memory or batches_lib.Memory()).budget(checks.device_memory(), workers)
      parts = batches_lib.split(ready, sizes, budget, max_runs)
    else:
      parts = [ready] if ready else []
    for part in parts:
      if stopping.stop_signal():  # a stop signal: the rest of the unit is not started
        outcome.update({w: ("stopped", "") for w in part})
        continue
      _run_batch(part, [keys[w] for w in part], [configs[w] for w in part], outcome)
  finally:
    for w in held:
      with contextlib.suppress(FileNotFoundError):
        os.remove(jobs_lib.job_file(w, "RUNNING"))
  return [(w, *outcome[w]) for w in workdirs]


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
  stopping.record_signals()  # between runs a stop signal is recorded; the worker then starts nothing
  if cache_dir:
    import jax
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _mark_dead(job: sweep_lib.Job) -> None:
  """The worker running `job` died (a signal, out of memory): record it as failed."""
  with open(jobs_lib.job_file(job.workdir, "error.txt"), "w") as f:
    f.write(f"the worker process running this job died {MAX_CRASHES} times (killed by a signal or out of "
            "memory); see log.txt\n")
  jobs_lib.event(job.workdir, "failed", error="worker process died")


@contextlib.contextmanager
def forwarding_signals():
  """While a local pool runs: SIGTERM and SIGUSR1 to the launcher are recorded
  (`stopping.stop_signal`) and passed on to its worker processes, which finish their round,
  save it and start nothing new; the launcher then returns. A signal sent to the whole
  process group reaches the workers twice, which changes nothing."""
  def forward(signum, frame):
    stopping.record_signal(signum, frame)
    for child in multiprocessing.active_children():
      with contextlib.suppress(OSError):
        os.kill(child.pid, signum)
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {sig: signal.signal(sig, forward) for sig in stopping.signals()}
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


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
  os.environ.pop(stopping.ENV, None)  # a new launch: an earlier stop is not this one
  todo = prepare(exp)
  label = {e.key: sweep_lib.describe(e.axes) for e in reversed(exp.entries)}
  counts = {s: 0 for s in ("done", "failed", "skipped", "busy", "stopped")}
  total, n = len(todo), 0
  _print(f"{len(exp.jobs)} jobs, {len(exp.jobs) - total} already done, {total} to run on {workers} worker(s)", quiet)
  ctx = multiprocessing.get_context("spawn")
  while todo and not stopping.stop_signal():
    with forwarding_signals(), \
        cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init, initargs=(cache_dir,)) as pool:
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
    if broken and not stopping.stop_signal():  # a worker died; the pool took the other workers' jobs with it
      for j in [j for j in todo if read_lock(j.workdir) and not lock_is_live(read_lock(j.workdir))]:
        jobs_lib.event(j.workdir, "crashed")
        with contextlib.suppress(FileNotFoundError):
          os.remove(jobs_lib.job_file(j.workdir, "RUNNING"))
        if sum(e["event"] == "crashed" for e in read_events(j.workdir)) >= MAX_CRASHES:
          _mark_dead(j)
          todo.remove(j)
          n += 1
          counts["failed"] += 1
          _print(f"[{n}/{total}] failed  {label[j.key]} (its worker died {MAX_CRASHES} times)  {j.workdir}", quiet)
  return counts


def _crashed(jobs: list, counts: dict, progress) -> list:
  """After a worker died: the jobs of `jobs` whose lock is dead get a "crashed" event; one
  crashed `MAX_CRASHES` times is recorded failed. Returns the jobs to run again."""
  again = []
  for j in jobs:
    lock = read_lock(j.workdir)
    if lock and not lock_is_live(lock):
      jobs_lib.event(j.workdir, "crashed")
      with contextlib.suppress(FileNotFoundError):
        os.remove(jobs_lib.job_file(j.workdir, "RUNNING"))
      if sum(e["event"] == "crashed" for e in read_events(j.workdir)) >= MAX_CRASHES:
        _mark_dead(j)
        counts["failed"] += 1
        progress(j, f"failed  (its worker died {MAX_CRASHES} times)")
        continue
    again.append(j)
  return again


def _last_error(workdir: str) -> str:
  ev = [e for e in read_events(workdir) if e["event"] == "failed"]
  return ev[-1].get("error", "") if ev else ""


def plan(jobs: list, max_runs: int = batches_lib.DEFAULT_MAX_RUNS, workers: int = 1) -> tuple[list, dict]:
  """`(units, errors)`: `jobs` grouped by static key (`batch.static_key`) and cut into units of
  at most `max_runs` (`batches.units`); `errors` maps the key of each job whose static key
  cannot be computed (an unknown method) to its error. Nothing here touches a device, so the
  launcher's process leaves the device's memory to its workers."""
  from fedjax_dg import batch
  groups, errors = batches_lib.group(jobs, batch.static_key)
  return batches_lib.units(groups, max_runs, workers), errors


def longest_first(units: list, seconds: dict) -> list:
  """The units in order of their estimated run time, longest first (ties in their given
  order). A pool of workers takes units in turn, so the last to start are then the short
  ones and no worker runs a long unit alone at the end (longest processing time first); the
  units themselves, and so every run's numbers, are unchanged.

  Args:
    units: lists of jobs (`plan`).
    seconds: job key -> its estimated run time; a job without one counts the mean of those
      with one.

  Returns:
    The same units, reordered; in their given order when no job has an estimate.
  """
  known = [v for u in units for j in u for v in [seconds.get(j.key)] if v is not None]
  if not known:
    return list(units)
  mean = sum(known) / len(known)
  cost = [sum(seconds[j.key] if seconds.get(j.key) is not None else mean for j in u) for u in units]
  order = sorted(range(len(units)), key=lambda i: -cost[i])  # stable: ties keep the sweep's order
  return [units[i] for i in order]


def run_batched(exp: sweep_lib.Expansion, workers: int = 1, memory: batches_lib.Memory | None = None,
                max_runs: int = batches_lib.DEFAULT_MAX_RUNS, cache_dir: str = "", quiet: bool = False,
                ignore_locks: bool = False, seconds: dict | None = None) -> dict:
  """Runs every job not done as batches of jobs that share a static configuration
  (`plan`), each unit in one of `workers` worker processes, which cuts it into batches that
  fit `memory` (`execute_batch`), the units expected to take longest first (`longest_first`
  with `seconds`, job key -> estimated run time, e.g. `collect.job_seconds`; none: the
  sweep's order). A job with an invalid config is recorded failed before anything runs; a
  job failing inside a batch is recorded failed alone. A dead worker's jobs run again, as in
  `run_local`."""
  if workers < 1:
    raise sweep_lib.SweepError(f"workers must be >= 1, got {workers}")
  batches_lib.check_max_runs(max_runs)
  memory = memory or batches_lib.Memory()
  os.environ.pop(stopping.ENV, None)  # a new launch: an earlier stop is not this one
  todo = prepare(exp)
  label = {e.key: sweep_lib.describe(e.axes) for e in reversed(exp.entries)}
  counts = {s: 0 for s in ("done", "failed", "skipped", "busy", "stopped")}
  total, n = len(todo), [0]

  def progress(job, text: str) -> None:
    n[0] += 1
    _print(f"[{n[0]}/{total}] {text}  {label[job.key]}  {job.workdir}", quiet)

  units, errors = plan(todo, max_runs, workers)
  units = longest_first(units, seconds or {})
  _print(f"{len(exp.jobs)} jobs, {len(exp.jobs) - total} already done, {total} to run in {len(units)} unit(s) on "
         f"{workers} worker(s); batches of at most {max_runs} runs within {memory.describe()}", quiet)
  for job in (j for j in todo if j.key in errors):  # refused before anything runs
    if jobs_lib.acquire(job.workdir, ignore_locks):
      try:
        jobs_lib.record_failure(job.workdir, errors[job.key])
      finally:
        with contextlib.suppress(FileNotFoundError):
          os.remove(jobs_lib.job_file(job.workdir, "RUNNING"))
      counts["failed"] += 1
      progress(job, f"failed  ({jobs_lib.error_line(errors[job.key])})")
    else:
      counts["busy"] += 1
      progress(job, "busy   ")
  ctx = multiprocessing.get_context("spawn")
  by_dir = {j.workdir: j for j in todo}
  while units and not stopping.stop_signal():
    with forwarding_signals(), \
        cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init, initargs=(cache_dir,)) as pool:
      futures = {pool.submit(execute_batch, [j.workdir for j in unit], ignore_locks, memory, workers, max_runs): unit
                 for unit in units}
      left, broken = [], False
      for f in cf.as_completed(futures):
        try:
          results = f.result()
        except cf.process.BrokenProcessPool:
          broken = True
          left.extend(futures[f])
          continue
        for w, outcome, bid in results:
          counts[outcome] += 1
          why = _last_error(w) if outcome == "failed" else ""
          progress(by_dir[w], f"{outcome:7s}" + (f" (batch {bid})" if bid else "") + (f" ({why})" if why else ""))
    units = []
    if broken and not stopping.stop_signal():  # a worker died; the pool took the other workers' units with it
      units, _ = plan(_crashed(left, counts, progress), max_runs, workers)
      units = longest_first(units, seconds or {})
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
                 wait: bool = False, quiet: bool = False, cache_dir: str = "", vectorize: bool = True,
                 memory: batches_lib.Memory | None = None, max_runs: int = batches_lib.DEFAULT_MAX_RUNS,
                 tasks: int = 1) -> list:
  """Submits every job not done as one submitit batch (a Slurm job array with
  `cluster=None` on a Slurm login node; `cluster="local"` runs them as local processes,
  as the tests do): with `vectorize`, one submitit job per unit of jobs sharing a static
  configuration (`plan`), which cuts it into batches that fit `memory` on its own node's
  device (`execute_batch`); without, one submitit job per job. `parameters` go to
  `update_parameters` (e.g. timeout_min, slurm_partition, gpus_per_node, cpus_per_task,
  slurm_array_parallelism). With `tasks` > 1, each job runs alone as one submitit job of
  `tasks` tasks, the processes of one `jax.distributed` run (`fedjax_dg.bench.tasks`). The
  jobs import this fedjax_dg (PYTHONPATH) and use `cache_dir` as JAX's compilation cache.
  With `wait`, returns each job's outcome ("done", "failed", ...), else the submitit job
  handles."""
  if importlib.util.find_spec("submitit") is None:  # before anything is written
    raise sweep_lib.SweepError("the submitit launcher needs submitit: pip install 'fedjax-dg[cluster]'")
  from fedjax_dg.bench import tasks as tasks_lib
  batches_lib.check_max_runs(max_runs)
  tasks = tasks_lib.check_tasks_per_job(tasks, cluster=cluster)
  if tasks > 1:
    parameters = tasks_lib.task_parameters(dict(parameters or {}), tasks)
  todo = prepare(exp)
  if not todo:
    _print(f"{len(exp.jobs)} jobs, all done", quiet)
    return []
  if tasks > 1:
    return _submit_tasks(exp, todo, folder, cluster, parameters, wait, quiet, cache_dir, tasks)
  failed = []
  if vectorize:
    units, errors = plan(todo, max_runs)
    for job in (j for j in todo if j.key in errors):  # refused before anything is submitted
      jobs_lib.record_failure(job.workdir, errors[job.key])
      failed.append("failed")
      _print(f"failed  ({jobs_lib.error_line(errors[job.key])})  {job.workdir}", quiet)
  else:
    units = [[j] for j in todo]
  if not units:
    return failed if wait else []
  executor = _executor(folder, cluster, parameters)
  with _job_environ(cache_dir), executor.batch():
    if vectorize:
      handles = [executor.submit(execute_batch, [os.path.abspath(j.workdir) for j in unit], False, memory, 1, max_runs)
                 for unit in units]
    else:
      handles = [executor.submit(execute, os.path.abspath(unit[0].workdir)) for unit in units]
  what = f"{sum(map(len, units))} in {len(units)} unit(s) of one static configuration each" if vectorize else \
      f"{len(units)}"
  _print(f"{len(exp.jobs)} jobs, {len(exp.jobs) - len(todo)} already done, {what} submitted to "
         f"{executor.cluster} (logs in {folder})", quiet)
  if not wait:
    return handles
  if not vectorize:
    return [h.result() for h in handles]
  return failed + [outcome for h in handles for _, outcome, _ in h.result()]


def _executor(folder: str, cluster: str | None, parameters: dict | None):
  import submitit
  executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
  executor.update_parameters(**dict(parameters or {}))
  return executor


def _job_environ(cache_dir: str):
  """The environment the submitted jobs inherit: this fedjax_dg, JAX's compilation cache."""
  cache = dict(JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0") if cache_dir else {}
  return _environ(PYTHONPATH=_child_pythonpath(), **cache)


def _submit_tasks(exp, todo: list, folder: str, cluster: str | None, parameters: dict, wait: bool, quiet: bool,
                  cache_dir: str, tasks: int) -> list:
  """`run_submitit` with `tasks` > 1: one submitit job of `tasks` tasks per sweep job."""
  from fedjax_dg.bench import tasks as tasks_lib
  executor = _executor(folder, cluster, parameters)
  with _job_environ(cache_dir), executor.batch():
    handles = tasks_lib.submit(executor, todo)
  _print(f"{len(exp.jobs)} jobs, {len(exp.jobs) - len(todo)} already done, {len(todo)} submitted to "
         f"{executor.cluster} as {tasks} tasks each, one job per submitit job (logs in {folder})", quiet)
  if not wait:
    return handles
  return [tasks_lib.outcome(h, j.workdir) for h, j in zip(handles, todo)]


def status(exp: sweep_lib.Expansion) -> list[dict]:
  """One row per job: key, state, description, workdir, the first line of any error, and the
  batch that last started it ("" when it ran alone). A finished job whose recorded source
  fingerprint is not the current code's is "stale" (`fedjax_dg.bench.results.is_stale`): it
  stays finished for `run`, and collect / report refuse it unless told otherwise."""
  from fedjax_dg import provenance
  label = {e.key: sweep_lib.describe(e.axes) for e in reversed(exp.entries)}
  rows = []
  for key, job in exp.jobs.items():
    state = job_state(job.workdir)
    if state == "done":
      changed = provenance.changed_files(rundir.read_summary(job.workdir))
      if changed:
        state = "stale"
    err = ""
    if state == "stale":
      err = "code changed: " + ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
    if state == "failed":
      ev = [e for e in read_events(job.workdir) if e["event"] == "failed"]
      err = ev[-1].get("error", "") if ev else ""
    elif state == "broken":
      err = problem(job.workdir)
    starts = [e for e in read_events(job.workdir) if e["event"] == "start"] if state != "broken" else []
    batch = starts[-1].get("batch", "") if starts else ""
    rows.append({"key": key, "state": state, "job": label[key], "workdir": job.workdir, "error": err, "batch": batch})
  return rows


def status_text(rows: list[dict], verbose: bool = False) -> str:
  counts = {s: sum(r["state"] == s for r in rows) for s in STATES}
  shown = [s for s in STATES if s not in ("broken", "stale") or counts[s]]  # these two only when a job is
  lines = [", ".join(f"{counts[s]} {s}" for s in shown) + f" (of {len(rows)} jobs)"]
  for r in rows:
    if verbose or r["state"] != "done":
      batch = f"  (batch {r['batch']})" if verbose and r.get("batch") else ""
      lines.append(f"{r['state']:11s} {r['job']}  {r['workdir']}{batch}" + (f"\n            {r['error']}" if r["error"] else ""))
  return "\n".join(lines)
