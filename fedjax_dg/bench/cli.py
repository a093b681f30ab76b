"""`python -m fedjax_dg.bench COMMAND --sweep configs/sweeps/<name>.py [--sweep.<field>=...]`
(or `fedjax-dg-sweep COMMAND ...`).

Commands:
  run      run every job not done: a local pool of --workers processes (default
           sweep.launch.workers, 1), or --launcher=submitit (Slurm; --cluster=local runs
           the submitit jobs as local processes); finished jobs are skipped, interrupted
           ones resume from their checkpoints, failed ones run again. Jobs that differ only
           in seeds and continuous hyperparameters run as batches, one program each
           (--batch-memory: bytes per batch such as 4G, or a share of the device's memory
           such as 50%, default 50% shared by the workers; --max-batch: runs per batch,
           default 64); --no-vectorize runs one job at a time per worker;
           --launcher=submitit --tasks_per_job=N runs each job as N submitit tasks, the
           processes of one jax.distributed run (default sweep.launch.tasks_per_job, 1)
  status   done / running / failed / interrupted / pending counts and the unfinished jobs
           (--verbose: every job, and the batch that ran it; --search: per cell of a search
           grid, trials finished and the best validation score so far), and an estimate of
           the run time left from the finished jobs' measured time per round (--workers:
           the worker processes it assumes, default sweep.launch.workers)
  collect  tables.md / tables.tex (Bai et al. 2024 Table 3 layout under held-out-domain, in-domain
           and oracle selection), difficulty.md (Table 6), jobs.csv and results.jsonl.gz
           (every job's metrics at every evaluation, config and provenance) into --out
  figures  Fig. 2, Fig. 3, Fig. 4-style curves and per-run curves (PNG + CSV) into --out
  report   collect + figures + REPORT.md into --out (default sweep.report.out), with the
           results file results.jsonl.gz; `report --results FILE` regenerates it from the
           file alone. collect / figures / report refuse jobs run under other code than the
           current one (`status` lists them as stale) unless --allow_stale
  jobs     one line per job: key, workdir, description
"""
from __future__ import annotations

import os
import signal
import sys

from absl import app, flags
from ml_collections import config_flags

COMMANDS = ("run", "status", "collect", "figures", "report", "jobs")

_SWEEP = config_flags.DEFINE_config_file("sweep", None, "Path to a sweep config (configs/sweeps/*.py).")
_WORKERS = flags.DEFINE_integer("workers", None, "run: local worker processes; status: the workers its time estimate assumes "
                                "(default sweep.launch.workers).")
_LAUNCHER = flags.DEFINE_enum("launcher", "local", ["local", "submitit"], "run: the local pool or submitit.")
_CLUSTER = flags.DEFINE_string("cluster", None, "run --launcher=submitit: submitit cluster (None: auto, 'local').")
_WAIT = flags.DEFINE_bool("wait", False, "run --launcher=submitit: wait for the jobs to finish.")
_OUT = flags.DEFINE_string("out", None, "collect / figures / report: output folder.")
_VERBOSE = flags.DEFINE_bool("verbose", False, "status: list every job.")
_SEARCH = flags.DEFINE_bool("search", False, "status: per cell of each search grid, trials finished and the best "
                            "validation score so far (what the seeds phase will select).")
_IGNORE_LOCKS = flags.DEFINE_bool("ignore_locks", False, "run: run jobs even if a lock says they are running.")
_VECTORIZE = flags.DEFINE_bool("vectorize", None, "run: batch the jobs that share a static configuration "
                               "(default sweep.launch.vectorize, True); --no-vectorize runs one job at a time.")
_BATCH_MEMORY = flags.DEFINE_string("batch_memory", None, "run: memory per batch: bytes (4G, 512M, 3e9) or a share "
                                    "of the device's memory (50%; the default, shared by the workers).")
_MAX_BATCH = flags.DEFINE_integer("max_batch", None, "run: at most this many runs per batch (default 64).")
_TASKS = flags.DEFINE_integer("tasks_per_job", None, "run --launcher=submitit: processes per job, one submitit task "
                              "each, of one jax.distributed run (default sweep.launch.tasks_per_job, 1).")
# Spellings of the flags above with hyphens (absl reads `--batch_memory`, `--novectorize`).
_HYPHENATED = {"--batch-memory": "--batch_memory", "--max-batch": "--max_batch", "--no-vectorize": "--novectorize",
               "--ignore-locks": "--ignore_locks", "--tasks-per-job": "--tasks_per_job"}

# --- report flags (staleness, the results file) -------------------------------------------
_ALLOW_STALE = flags.DEFINE_bool("allow_stale", False, "collect / figures / report: use jobs run under other code "
                                 "than the current fedjax_dg (marked with a dagger) instead of refusing them.")
_PILOT = flags.DEFINE_string("pilot", None, "status: a results file of an earlier sweep (e.g. an earlier edition's "
                             "results.jsonl.gz) whose finished runs price the jobs before any has run.")
_RESULTS = flags.DEFINE_string("results", None, "report / collect / figures: regenerate from this results file "
                               "(results.jsonl.gz) alone; --sweep is then not needed (--out defaults to its folder).")


def _sweep_arg(argv) -> str:
  """The --sweep argument as given (file and overrides), recorded in the report."""
  out, args = [], list(argv)
  for i, a in enumerate(args):
    if a == "--sweep" and i + 1 < len(args):
      out.append(args[i + 1])
    elif a.startswith("--sweep=") or a.startswith("--sweep."):
      out.append(a[len("--sweep="):] if a.startswith("--sweep=") else a)
  return " ".join(out)


def _from_results(cmd: str) -> int:
  """collect / figures / report from --results alone."""
  from fedjax_dg.bench import collect, figures, report, results as results_lib
  if not os.path.isfile(_RESULTS.value):
    print(f"error: --results {_RESULTS.value}: no such file", file=sys.stderr)
    return 2
  data = results_lib.read(_RESULTS.value)  # checked against its schema before any cell is computed
  if _missing_matplotlib(cmd, data.sweep):
    print(_missing_matplotlib(cmd, data.sweep), file=sys.stderr)
    return 2
  for note in data.notes:  # each finished job the cells leave out, and why
    print(f"note: {note}")
  out = _OUT.value or os.path.dirname(os.path.abspath(_RESULTS.value))
  if cmd == "report":
    report.write_report(data.sweep, out, data=data, allow_stale=_ALLOW_STALE.value)
    print(f"report in {out}/REPORT.md")
  elif cmd == "collect":
    collect.collect(data.sweep, out, data=data, allow_stale=_ALLOW_STALE.value)
    print(f"tables in {out}/tables.md, jobs in {out}/jobs.csv")
  elif cmd == "figures":
    collect.ready(data, _ALLOW_STALE.value)
    for p in figures.make_figures(data.sweep, out, data=data) or [figures.no_figures(data.sweep) or "no figures"]:
      print(p)
  else:
    print(f"error: --results serves collect, figures and report, not {cmd}", file=sys.stderr)
    return 2
  return 0
# --- end of report flags ---------------------------------------------------------------------


def _missing_matplotlib(cmd: str, sweep) -> str | None:
  """The one-line error when `cmd` would draw the sweep's figures and matplotlib is absent."""
  import importlib.util
  from fedjax_dg.bench import figures
  if cmd not in ("figures", "report") or figures.no_figures(sweep) or importlib.util.find_spec("matplotlib"):
    return None
  return f"error: {cmd} draws figures with matplotlib, which is not installed: pip install \"fedjax-dg[bench]\""


def _tasks_per_job(lc) -> int:
  """--tasks_per_job, else sweep.launch.tasks_per_job (1), checked against the launcher."""
  from fedjax_dg.bench import tasks
  if _TASKS.value is not None:
    return tasks.check_tasks_per_job(_TASKS.value, _LAUNCHER.value, _CLUSTER.value)
  return tasks.check_tasks_per_job(lc.get("tasks_per_job", 1), _LAUNCHER.value, _CLUSTER.value,
                                   flag="sweep.launch.tasks_per_job")


def _out(sweep, sub: str) -> str:
  return _OUT.value or (sweep.get("report", {}).get("out", "") if sub == "report" else "") or \
      os.path.join(sweep.root, "results" if sub != "report" else "report")


def main(argv) -> int:
  from fedjax_dg import stopping
  from fedjax_dg.bench import batches, collect, figures, launch, report, sweep as sweep_lib
  args = argv[1:]
  if len(args) != 1 or args[0] not in COMMANDS:
    print(f"error: give one command of {', '.join(COMMANDS)}, e.g. "
          "python -m fedjax_dg.bench status --sweep configs/sweeps/tiny.py", file=sys.stderr)
    return 2
  from fedjax_dg import main as main_lib
  if _RESULTS.value:  # report flags: the results file alone
    try:
      return _from_results(args[0])
    except (sweep_lib.SweepError, FileNotFoundError) as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
  try:
    cmd, sweep = args[0], _SWEEP.value
    if sweep is not None:
      sweep.keys()  # a file that failed to load raises here, on first use
  except Exception as e:  # pylint: disable=broad-except  # ml_collections loads the file lazily
    print(f"error: {main_lib._config_load_error(e, 'sweep')}", file=sys.stderr)  # pylint: disable=protected-access
    return 2
  if sweep is None:
    print("error: --sweep is required, e.g. --sweep configs/sweeps/tiny.py", file=sys.stderr)
    return 2
  if _missing_matplotlib(cmd, sweep):
    print(_missing_matplotlib(cmd, sweep), file=sys.stderr)
    return 2
  try:
    if cmd == "run":  # the launcher's flags, before anything runs
      lc = sweep.get("launch", {})
      vectorize = _VECTORIZE.value if _VECTORIZE.value is not None else bool(lc.get("vectorize", True))
      if _BATCH_MEMORY.value is not None:
        memory = batches.parse_memory(_BATCH_MEMORY.value)
      else:
        memory = batches.parse_memory(lc.get("batch_memory", ""), flag="sweep.launch.batch_memory")
      if _MAX_BATCH.value is not None:
        max_runs = batches.check_max_runs(_MAX_BATCH.value)
      else:
        max_runs = batches.check_max_runs(lc.get("max_batch", batches.DEFAULT_MAX_RUNS), flag="sweep.launch.max_batch")
      tasks = _tasks_per_job(lc)
    exp = sweep_lib.expand(sweep)
    for grid, why in exp.waiting.items():  # report flags: a seeds phase waiting for its search
      print(f"waiting: {why}", file=sys.stderr)
    if cmd == "jobs":
      for e in exp.entries:
        print(f"{e.key}  {e.grid:12s} {sweep_lib.describe(e.axes)}  {exp.jobs[e.key].workdir}")
    elif cmd == "status":
      print(launch.status_text(launch.status(exp), verbose=_VERBOSE.value))
      if _SEARCH.value:
        print(collect.search_progress(sweep, exp))
      workers = _WORKERS.value if _WORKERS.value is not None else int(sweep.get("launch", {}).get("workers", 1))
      pilot = None
      if _PILOT.value:
        from fedjax_dg.bench import results as results_lib
        pilot = results_lib.read(_PILOT.value)
      print(collect.time_left(sweep, exp, workers, pilot=pilot))
    elif cmd == "run":
      cache = ""
      if lc.get("compilation_cache", False):
        cache = os.path.abspath(lc.get("compilation_cache_dir", "") or os.path.join(sweep.root, ".jax_cache"))
      if _LAUNCHER.value == "local":
        workers = _WORKERS.value if _WORKERS.value is not None else int(lc.get("workers", 1))

        def run_once(exp):
          if vectorize:
            return launch.run_batched(exp, workers, memory, max_runs, cache_dir=cache,
                                      ignore_locks=_IGNORE_LOCKS.value, seconds=collect.job_seconds(exp))
          return launch.run_local(exp, workers, cache_dir=cache, ignore_locks=_IGNORE_LOCKS.value)
        exp, counts = run_phases(sweep, exp, run_once)
        print(", ".join(f"{v} {k}" for k, v in counts.items()))
        print(launch.status_text(launch.status(exp)))
        sig = stopping.stop_signal()
        if sig or counts.get("stopped"):  # the jobs in flight saved their round: `bench run` again resumes them
          print(f"stopped by {sig or 'a signal to a worker'}: run the same command again to resume", file=sys.stderr)
          return 128 + int(getattr(signal, sig)) if sig else 1
      else:
        params = dict(lc.get("submitit", {}))
        folder = params.pop("folder", "") or os.path.join(sweep.root, "submitit")
        out = launch.run_submitit(exp, folder, _CLUSTER.value, params, wait=_WAIT.value, cache_dir=cache,
                                  vectorize=vectorize, memory=memory, max_runs=max_runs, tasks=tasks)
        if _WAIT.value:
          print(launch.status_text(launch.status(exp)))
        else:
          print("submitted: " + " ".join(str(h.job_id) for h in out))
    elif cmd == "collect":
      out = _out(sweep, "collect")
      collect.collect(sweep, out, exp, allow_stale=_ALLOW_STALE.value)
      print(f"tables in {out}/tables.md, jobs in {out}/jobs.csv, results in {out}/{collect.RESULTS_FILE}")
    elif cmd == "figures":
      out = _out(sweep, "figures")
      if figures.no_figures(sweep):
        print(figures.no_figures(sweep))
      for p in figures.make_figures(sweep, out, exp, allow_stale=_ALLOW_STALE.value):
        print(p)
    elif cmd == "report":
      out = _out(sweep, "report")
      report.write_report(sweep, out, exp, allow_stale=_ALLOW_STALE.value, sweep_arg=_sweep_arg(sys.argv[1:]))
      print(f"report in {out}/REPORT.md")
  except (sweep_lib.SweepError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


def run_phases(sweep, exp, run_once) -> tuple:
  """Runs the sweep's jobs (`run_once(expansion) -> counts`), then each later phase as it
  becomes runnable: a grid that runs seeds at its search's winners (`select_from`) waits in
  `exp.waiting` until the search's jobs are done; the sweep is then expanded again and its
  new jobs run, until no waiting grid gains jobs (every phase ran, a search job failed, or a
  stop signal arrived). One `bench run` thus runs the searches and then the seeds.

  Returns:
    `(expansion, counts)`: the last expansion and the counts summed over the phases.
  """
  from fedjax_dg import stopping
  from fedjax_dg.bench import sweep as sweep_lib
  counts = dict(run_once(exp))
  while exp.waiting and not stopping.stop_signal() and not counts.get("stopped"):
    nxt = sweep_lib.expand(sweep)
    new = [k for k in nxt.jobs if k not in exp.jobs]
    if not new:
      break
    for why in nxt.waiting.values():
      print(f"waiting: {why}", file=sys.stderr)
    ready = [g for g in exp.waiting if g not in nxt.waiting]
    print(f"next phase: grid(s) {', '.join(ready) or '-'} now have {len(new)} more jobs", file=sys.stderr)
    exp = nxt
    for k, v in run_once(exp).items():
      counts[k] = counts.get(k, 0) + v
  return exp, counts


def run():
  if any(a in ("-h", "--help", "-help", "-?") for a in sys.argv[1:]):
    from fedjax_dg.main import print_help
    print_help(__name__, __doc__)
    sys.exit(0)
  from fedjax_dg import main as main_lib
  if not any(a == "--results" or a.startswith("--results=") for a in sys.argv[1:]):  # report flags
    flags.mark_flag_as_required("sweep")
  app.run(lambda argv: sys.exit(main(argv)),
          flags_parser=lambda argv: main_lib.parse_flags(_unhyphenate(argv), flag="sweep"))


def _unhyphenate(argv: list[str]) -> list[str]:
  """`--batch-memory=4G` -> `--batch_memory=4G` (and the other `_HYPHENATED` flags)."""
  out = []
  for a in argv:
    head, eq, rest = a.partition("=")
    out.append(_HYPHENATED.get(head, head) + eq + rest)
  return out


if __name__ == "__main__":
  run()
