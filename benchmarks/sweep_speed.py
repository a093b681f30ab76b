"""A sweep run one job at a time versus in batches, on the same jobs, machine and invocation.

The jobs: the first `--jobs` jobs (in the sweep's order) of a report's sweep (`--sweep`,
default `configs/sweeps/report.py`, MLP on the embedded rotated digits) that one of `--grids`
names (default the table grid; the JSON counts them by method and C under `job_mix`). Each arm runs them from a fresh temporary sweep root
(its own JAX compilation cache, as `bench run` sets up) in a child process:

  alone    `bench run --no-vectorize`: `launch.run_local`, one job at a time per worker (a
           long-lived worker process: it imports once and keeps JAX's in-memory caches)
  batched  `bench run`: `launch.run_batched`, jobs of one static configuration as one batch
           (`engine.run_axis` as the jobs' configs say: "auto", a loop over the runs on CPU)
  process  one job per process: a fresh Python process per job running `launch.execute`
           (what the submitit launcher's `--no-vectorize` submits per job), one after
           another; JAX's persistent compilation cache shared between them as the launcher
           shares it (`launch.run_submitit`'s environment); `--workers` is ignored (one at a time)

The arms run in the order `--arms` gives (default alone, batched, process). The benchmark
records per arm the wall time (child start to exit), jobs per hour, the
peak resident memory of the child's process tree (sampled every 0.1 s with psutil; also
the largest single process, `getrusage` in the child), the outcome counts, and the sum
over the jobs of each run summary's `timing` (compile, train, evaluate, checkpoint, total;
null where no summary has that key; a batch's totals counted once); then the ratios
alone / batched and process / batched, whether the arms give the same scores as the
batched arm (every score column of `jobs.csv` within 1e-5), and the Amdahl bound of
batching on a device where it does not speed up the training arithmetic: the alone arm's
total time over its training time.

    python benchmarks/sweep_speed.py --out benchmarks/results/sweep_speed_cpu.json
    python benchmarks/sweep_speed.py --jobs 6 --rounds 4      # a quick check that it works
    python benchmarks/sweep_speed.py --sweep configs/sweeps/report_fmnist.py --grids search \
        --out benchmarks/results/sweep_speed_fmnist_search_cpu.json   # the search phase: 8 trials a cell

The JSON also holds the machine (CPU model, cores, GPU if `nvidia-smi` lists one), the
versions, the load average before and after each arm, and the command.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(ROOT, "configs", "sweeps", "report.py")
ARMS = ("alone", "batched", "process")
TIMING = ("compile_s", "train_s", "eval_s", "checkpoint_s", "total_s")
SCORES = [f"{rule}_{f}" for rule in ("heldout_domain", "in_domain", "oracle") for f in ("round", "val", "test", "in_test")]
SCORES += ["final_round", "final_test"]
TOLERANCE = 1e-5


def _args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--jobs", type=int, default=100, help="jobs per arm (default 100)")
  p.add_argument("--sweep", default=SWEEP, help="the sweep config to take jobs from (default the digits report's)")
  p.add_argument("--grids", default="table", help="comma list of the sweep's grids to take jobs from")
  p.add_argument("--rounds", type=int, default=0, help="override the sweep's num_rounds (0: the sweep's own)")
  p.add_argument("--workers", type=int, default=1, help="worker processes, the same in both arms")
  p.add_argument("--batch-memory", default="", help="the batched arm's --batch-memory (default: the launcher's)")
  p.add_argument("--max-batch", type=int, default=0, help="the batched arm's --max-batch (0: the launcher's)")
  p.add_argument("--arms", default="alone,batched,process", help="which arms, in this order")
  p.add_argument("--keep", default="", help="run in this folder and keep it (default: a temporary folder, removed)")
  p.add_argument("--out", default="", help="write the JSON here")
  p.add_argument("--arm", default="", help=argparse.SUPPRESS)   # child mode: run one arm
  p.add_argument("--root", default="", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.jobs < 1:
    p.error(f"--jobs must be >= 1, got {args.jobs}")
  if args.workers < 1:
    p.error(f"--workers must be >= 1, got {args.workers}")
  if not os.path.isfile(args.sweep):
    p.error(f"--sweep: no sweep config at {args.sweep}")
  args.sweep = os.path.abspath(args.sweep)  # the arms' child processes run from the repository root
  if args.rounds < 0:
    p.error(f"--rounds must be >= 0, got {args.rounds}")
  if args.max_batch < 0:
    p.error(f"--max-batch must be >= 1 (0: the launcher's default), got {args.max_batch}")
  bad = [a for a in args.arms.split(",") if a not in ARMS]
  if bad:
    p.error(f"--arms: unknown arm {bad[0]!r}; choose from {', '.join(ARMS)}")
  return args


# ---------------------------------------------------------------------------- the jobs

def selection(args, root: str):
  """(sweep, sub-expansion): the report sweep rooted at `root`, and its first `--jobs` jobs
  (in the sweep's order) that one of `--grids` names."""
  sys.path.insert(0, ROOT)
  from fedjax_dg.bench import sweep as sweep_lib
  s = sweep_lib.load_config_file(args.sweep)
  s.root = root
  if args.rounds:
    s.base.num_rounds = args.rounds
  grids = args.grids.split(",")
  missing = [g for g in grids if g not in s.grids]
  if missing:
    raise SystemExit(f"error: --grids: the sweep {args.sweep} has no grid {missing[0]!r}; it has {', '.join(s.grids)}")
  exp = sweep_lib.expand(s)
  wanted = {e.key for e in exp.entries if e.grid in grids}
  keys = [k for k in exp.jobs if k in wanted][:args.jobs]
  if len(keys) < args.jobs:
    raise SystemExit(f"error: --jobs {args.jobs}: the grids {grids} hold {len(keys)} jobs")
  picked = set(keys)
  return s, sweep_lib.Expansion({k: exp.jobs[k] for k in keys}, [e for e in exp.entries if e.key in picked])


def run_arm(args) -> None:
  """Child mode: one arm's jobs with the launcher the CLI uses."""
  from fedjax_dg.bench import batches, launch
  s, exp = selection(args, args.root)
  cache = os.path.join(args.root, ".jax_cache")
  if args.arm == "alone":
    counts = launch.run_local(exp, args.workers, cache_dir=cache)
  elif args.arm == "process":
    counts = one_process_per_job(exp, cache)
  else:
    memory = batches.parse_memory(args.batch_memory)
    counts = launch.run_batched(exp, args.workers, memory, args.max_batch or batches.DEFAULT_MAX_RUNS,
                                cache_dir=cache)
  print("COUNTS " + json.dumps(counts), flush=True)
  kib = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
  print(f"MAXRSS {kib * 1024}", flush=True)  # Linux reports KiB


JOB_PROCESS = "import sys; from fedjax_dg.bench import launch; print(launch.execute(sys.argv[1]))"


def one_process_per_job(exp, cache: str) -> dict:
  """Every job not done in its own fresh Python process (`launch.execute`), one at a time,
  with JAX's persistent compilation cache in `cache` (the launcher's environment variables)."""
  from fedjax_dg.bench import launch
  counts = {s: 0 for s in ("done", "failed", "skipped", "busy", "stopped")}
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  for job in launch.prepare(exp):
    out = subprocess.run([sys.executable, "-c", JOB_PROCESS, job.workdir], env=env, capture_output=True, text=True,
                         check=False)
    lines = out.stdout.split()
    outcome = lines[-1] if out.returncode == 0 and lines and lines[-1] in counts else "failed"
    counts[outcome] += 1
  return counts


# ---------------------------------------------------------------------------- measuring

def _tree_rss(proc) -> int:
  total = 0
  for p in [proc, *proc.children(recursive=True)]:
    try:
      total += p.memory_info().rss
    except Exception:  # pylint: disable=broad-except  # a process that just ended
      pass
  return total


def measure(args, arm: str, root: str) -> dict:
  """Runs one arm in a child process; wall time, peak memory, load and outcome counts."""
  cmd = [sys.executable, os.path.abspath(__file__), "--arm", arm, "--root", root, "--jobs", str(args.jobs),
         "--sweep", args.sweep, "--grids", args.grids, "--rounds", str(args.rounds), "--workers", str(args.workers),
         "--batch-memory", args.batch_memory, "--max-batch", str(args.max_batch)]
  env = dict(os.environ, PYTHONPATH=ROOT + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""))
  try:
    import psutil
  except ImportError:
    psutil = None
  load_before = os.getloadavg()
  log_path = os.path.join(os.path.dirname(root), f"{arm}.log")
  os.makedirs(os.path.dirname(root), exist_ok=True)
  peak = 0
  with open(log_path, "w") as log:
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    handle = psutil.Process(child.pid) if psutil else None
    while child.poll() is None:
      if handle is not None:
        peak = max(peak, _tree_rss(handle))
      time.sleep(0.1)
    wall = time.perf_counter() - t0
  with open(log_path) as f:
    out = f.read()
  if child.returncode != 0:
    raise SystemExit(f"error: the {arm} arm exited with status {child.returncode}:\n{out[-3000:]}")
  counts = next((json.loads(l[7:]) for l in out.splitlines() if l.startswith("COUNTS ")), None)
  largest = next((int(l[7:]) for l in out.splitlines() if l.startswith("MAXRSS ")), None)
  return {"wall_s": wall, "jobs_per_hour": args.jobs * 3600 / wall, "counts": counts,
          "peak_rss_tree_bytes": peak if psutil else None,
          "peak_rss_largest_process_bytes": largest,
          "load_average_before": load_before, "load_average_after": os.getloadavg(), "command": cmd}


def timing(exp) -> dict:
  """Sums over the jobs' summaries of each `timing` key (None where no summary has it). A
  run of a batch reports its batch's totals: each counts `1 / batch size` of them, so every
  batch is counted once and the sums split the arm's wall time."""
  sums = {k: None for k in TIMING}
  for job in exp.jobs.values():
    path = os.path.join(job.workdir, "summary.json")
    if not os.path.exists(path):
      continue
    with open(path) as f:
      summary = json.load(f)
    t = summary.get("timing") or {}
    share = 1.0 / max(1, int((summary.get("batch") or {}).get("size", 1)))
    for k in TIMING:
      if t.get(k) is not None:
        sums[k] = (sums[k] or 0.0) + share * float(t[k])
  return sums


def scores(sweep, exp) -> dict:
  from fedjax_dg.bench import collect, results
  return {r["key"]: r for r in collect.job_rows(results.from_runs(sweep, exp), "accuracy")}


def compare(a: dict, b: dict) -> dict:
  """Whether two arms' jobs.csv rows give the same states and scores (within TOLERANCE)."""
  worst, mismatches = 0.0, []
  for key in a:
    if a[key]["state"] != b[key]["state"]:
      mismatches.append(f"{key}: state {a[key]['state']} vs {b[key]['state']}")
      continue
    for col in SCORES:
      x, y = a[key].get(col, ""), b[key].get(col, "")
      if (x == "") != (y == ""):
        mismatches.append(f"{key}.{col}: {x!r} vs {y!r}")
      elif x != "":
        d = abs(float(x) - float(y))
        worst = max(worst, d)
        if not d <= TOLERANCE:
          mismatches.append(f"{key}.{col}: {x} vs {y}")
  return {"same_scores": not mismatches, "tolerance": TOLERANCE, "max_abs_difference": worst,
          "mismatches": mismatches[:20]}


# ---------------------------------------------------------------------------- the machine

def machine() -> dict:
  """CPU model and cores, GPU (nvidia-smi), versions; without starting JAX in this process."""
  from importlib import metadata
  cpu = platform.processor()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
  except OSError:
    pass
  gpu = None
  if shutil.which("nvidia-smi"):
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True,
                       text=True, check=False)
    gpu = [l.strip() for l in q.stdout.splitlines() if l.strip()] or None
  versions = {}
  for pkg in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "psutil"):
    try:
      versions[pkg] = metadata.version(pkg)
    except metadata.PackageNotFoundError:
      versions[pkg] = None
  try:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError):
    mem = None
  return {"platform": platform.platform(), "cpu_model": cpu, "cpu_count": os.cpu_count(), "memory_bytes": mem,
          "gpu": gpu, "python": platform.python_version(), "versions": versions,
          "jax_platforms": os.environ.get("JAX_PLATFORMS", ""), "xla_flags": os.environ.get("XLA_FLAGS", "")}


def _fmt(x, unit="") -> str:
  return "-" if x is None else f"{x:.1f}{unit}"


def main(argv=None):
  args = _args(argv)
  if args.arm:
    return run_arm(args)
  base = args.keep or tempfile.mkdtemp(prefix="sweep_speed_")
  os.makedirs(base, exist_ok=True)
  result = {"command": [sys.executable, *sys.argv], "machine": machine(), "jobs": args.jobs,
            "sweep": os.path.relpath(os.path.abspath(args.sweep), ROOT), "grids": args.grids,
            "rounds": args.rounds or "the sweep's", "workers": args.workers, "arms": {}}
  rows = {}
  try:
    for arm in args.arms.split(","):
      root = os.path.join(base, arm, "runs")
      if os.path.exists(root):
        raise SystemExit(f"error: {root} exists; give a fresh --keep folder")
      print(f"{arm}: {args.jobs} jobs in {root}", flush=True)
      rec = measure(args, arm, root)
      sweep, exp = selection(args, root)
      rec["timing_sums_s"] = timing(exp)
      rows[arm] = scores(sweep, exp)
      result["arms"][arm] = rec
      print(f"{arm}: {rec['wall_s']:.1f} s, {rec['jobs_per_hour']:.0f} jobs/h, peak tree RSS "
            f"{_fmt(rec['peak_rss_tree_bytes'] and rec['peak_rss_tree_bytes'] / 2 ** 20, ' MiB')}, {rec['counts']}",
            flush=True)
    result["job_keys"] = list(next(iter(rows.values())))
    mix = {}
    for r in next(iter(rows.values())).values():
      name = f"{r['algorithm']} C={r['num_clients']}"
      mix[name] = mix.get(name, 0) + 1
    result["job_mix"] = mix
    if "batched" in rows:
      b = result["arms"]["batched"]
      for arm in ("alone", "process"):
        if arm not in rows:
          continue
        a = result["arms"][arm]
        result[f"speedup_{arm}_over_batched"] = a["wall_s"] / b["wall_s"]
        pa, pb = a["peak_rss_tree_bytes"], b["peak_rss_tree_bytes"]
        result[f"peak_memory_ratio_batched_over_{arm}"] = pb / pa if pa and pb else None
        result["scores" if arm == "alone" else f"scores_{arm}"] = same = compare(rows[arm], rows["batched"])
        print(f"speed-up ({arm} / batched wall time): {result[f'speedup_{arm}_over_batched']:.2f}x; "
              f"same scores within {TOLERANCE}: {same['same_scores']} (max difference {same['max_abs_difference']:.2g})")
    if "alone" in result["arms"]:
      t = result["arms"]["alone"]["timing_sums_s"]
      if t.get("train_s") and t.get("total_s"):  # Amdahl: batching leaves the training arithmetic
        result["amdahl_bound_alone_total_over_train"] = t["total_s"] / t["train_s"]
  finally:
    if not args.keep:
      shutil.rmtree(base, ignore_errors=True)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(result, f, indent=2, default=str)
      f.write("\n")
    print(f"wrote {args.out}")
  return result


if __name__ == "__main__":
  main()
