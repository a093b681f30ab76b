"""fedjax-dg beside the simulators a user would otherwise pick: Flower's simulation engine
and pfl-research (PyTorch backend), on the same workloads (common.py: identical model,
data sizes, optimizer, batch and local steps, synthetic data).

    python benchmarks/peers/run.py --out benchmarks/results/peers_cpu.json

creates one virtual environment per peer on first use (under `--envs`, default
`~/.cache/fedjax_dg/peers`: `flower` with `flwr[simulation]`, `pfl` with `pfl[pytorch]`,
each with `torch==2.13.0` installed first), writes the data sets once, then runs every
system as a whole command (a fresh process: imports, data, set-up, compilation and every
round), repeats interleaved (repeat r runs the systems in an order rotated by r), with
`os.getloadavg()` read before and after each run. For each run it records the start-up
(from the command to the start of the first round), the first round, the median of the
later rounds, the wall time and the peak memory of the whole process tree (the sum of
the processes' proportional set sizes, sampled every 0.2 s: Flower's Ray workers
included). `--memory-clients 1000,10000,100000` runs workload A at those client counts
(3 rounds) for the memory figures. A peer that cannot be installed is reported with pip's
error and left out; the others are compared.

fedjax-dg runs under the Python running this script (`sys.executable`), with the engine's
`auto` choice unless `--ours-variants` names strategies. The peers' torch runs at
`--peer-threads` threads (default 1: on a loaded 2-core machine PyTorch's two OpenMP
threads lose up to 10x).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import common  # noqa: E402

PEERS = {  # name -> (pip requirement after torch, the module it must import)
    "pfl": ("pfl[pytorch]", "pfl"),
    "flower": ("flwr[simulation]", "flwr.simulation"),
}
TORCH = "torch==2.13.0"


def _args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--systems", default="ours,pfl,flower")
  p.add_argument("--workloads", default="A,B")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--rounds-a", type=int, default=0, help="rounds of workload A (default: common.py's)")
  p.add_argument("--rounds-b", type=int, default=0, help="rounds of workload B (default: common.py's)")
  p.add_argument("--clients-a", type=int, default=0, help="clients of workload A (default: common.py's)")
  p.add_argument("--memory-clients", default="", help="e.g. 1000,10000,100000: workload A's memory at these sizes")
  p.add_argument("--ours-variants", default="auto@fresh,auto@warm",
                 help="our side's runs, each `strategy[+option...]@cache`: strategy auto (the engine's choice) or a "
                      "strategy; options `+host` for the inputs left in their file (host_store.FileRows), `+gemm` "
                      "for model.conv_impl='gemm', `+devN` for N one-thread CPU devices, `+ynn` for jaxlib's own "
                      "XLA:CPU flags (FEDJAX_DG_XLA_CPU_DEFAULTS=off), `+thread1` for the host loop's clients called "
                      "from one host thread; "
                      "cache `fresh` (a new empty compilation cache: a user's first run) or `warm` (the cache a "
                      "warm-up run of the same workload filled, untimed: every later run)")
  p.add_argument("--peer-threads", type=int, default=1)
  p.add_argument("--envs", default=os.path.join(os.path.expanduser("~"), ".cache", "fedjax_dg", "peers"))
  p.add_argument("--data", default=os.path.join("/tmp", "fedjax_dg_peers_data"))
  p.add_argument("--timeout", type=float, default=1800, help="seconds before a run is stopped")
  p.add_argument("--out", default="")
  p.add_argument("--from-json", default="", help="print a results file's tables as Markdown, run nothing")
  return p.parse_args(argv)


# ------------------------------------------------------------------ environments
def ensure_env(envs: str, name: str) -> tuple[str | None, str]:
  """The peer's Python, creating its virtual environment if needed: (python or None, note)."""
  req, module = PEERS[name]
  venv = os.path.join(envs, name)
  py = os.path.join(venv, "bin", "python")
  if os.path.exists(py) and subprocess.run([py, "-c", f"import {module}"], capture_output=True).returncode == 0:
    return py, "installed"
  os.makedirs(envs, exist_ok=True)
  log = os.path.join(envs, f"{name}-install.log")
  with open(log, "w") as f:
    for cmd in ([sys.executable if sys.version_info[:2] == (3, 11) else "python3.11", "-m", "venv", venv],
                [py, "-m", "pip", "install", TORCH], [py, "-m", "pip", "install", req]):
      print(f"  {' '.join(cmd)}  (log: {log})", flush=True)
      r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
      if r.returncode != 0:
        f.flush()
        tail = [l for l in open(log).read().splitlines() if l.startswith("ERROR")][-3:]
        return None, f"`{' '.join(cmd[2:])}` failed: " + " | ".join(tail or ["see " + log])
  return py, "installed now"


# ------------------------------------------------------------------ measuring a run
def _tree_pss_kb(root: int) -> int:
  """The summed proportional set size (kB) of `root` and all its descendants."""
  children: dict[int, list[int]] = {}
  for d in os.listdir("/proc"):
    if d.isdigit():
      try:
        with open(f"/proc/{d}/stat") as f:
          ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d))
      except (OSError, IndexError, ValueError):
        pass
  total, todo = 0, [root]
  while todo:
    pid = todo.pop()
    todo += children.get(pid, [])
    try:
      with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
          if line.startswith("Pss:"):
            total += int(line.split()[1])
            break
    except OSError:
      pass
  return total


def run_one(system: str, python: str, w: dict, xp: str, yp: str, threads: int, variant: str, timeout: float,
            cache: str = "") -> dict:
  """Runs one system on one workload as a fresh command; returns its record. `variant`:
  our side's strategy (empty: `auto`); `cache`: our compilation cache folder (or "off")."""
  script = os.path.join(HERE, f"side_{system}.py")
  cmd = [python, script, "--workload", json.dumps(w), "--x", xp, "--y", yp, "--threads", str(threads)]
  if variant:
    cmd += ["--variant", variant]
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  if cache:
    env["FEDJAX_DG_COMPILATION_CACHE"] = cache
  load0 = os.getloadavg()
  t_spawn = time.time()
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True)
  peak = [0]
  stop = threading.Event()

  def sample():
    while not stop.is_set():
      peak[0] = max(peak[0], _tree_pss_kb(proc.pid))
      stop.wait(0.2)
  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, 9)
    out, err = proc.communicate()
    err += f"\nstopped after {timeout} s"
  wall = time.time() - t_spawn
  stop.set()
  sampler.join()
  events = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
  rounds = [e for e in events if e["event"] == "round"]
  done = next((e for e in events if e["event"] == "done"), None)
  rec = {"system": system, "variant": variant or ("auto" if system == "ours" else ""), "workload": w["name"],
         "clients": w["clients"], "rounds": w["rounds"], "threads": threads, "wall_s": wall,
         "load_before": load0, "load_after": os.getloadavg(), "returncode": proc.returncode}
  rec["peak_memory_gb"] = peak[0] * 1024 / 1e9  # kB -> GB (10^9 bytes)
  if proc.returncode != 0 or done is None or len(rounds) != w["rounds"]:
    rec["error"] = (err.strip().splitlines() or ["no output"])[-1][:500]
    return rec
  marks = {e["event"]: e["t"] for e in events if "t" in e}
  later = [r["t1"] - r["t0"] for r in rounds[1:]]
  rec.update(startup_s=rounds[0]["t0"] - t_spawn, first_round_s=rounds[0]["t1"] - rounds[0]["t0"],
             to_first_round_end_s=rounds[0]["t1"] - t_spawn,
             round_s_median=statistics.median(later) if later else None, round_s=later,
             python_start_s=marks["start"] - t_spawn, imports_s=marks.get("imported", marks["start"]) - marks["start"],
             final_loss=done["loss"], versions={k: v for k, v in done.items() if k not in ("event", "t", "loss")})
  return rec


# ------------------------------------------------------------------ the comparison
def _machine() -> dict:
  cpu = platform.processor()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    pass
  mem = 0
  with open("/proc/meminfo") as f:
    mem = int(next(l for l in f if l.startswith("MemTotal")).split()[1]) * 1024
  return {"platform": platform.platform(), "cpu_model": cpu, "cpu_count": os.cpu_count(), "memory_gb": mem / 1e9,
          "python": platform.python_version()}


def summarise(records: list[dict]) -> dict:
  """Per workload and system: the medians over repeats of each figure, and ratios to ours."""
  out: dict = {}
  for r in records:
    if "error" in r:
      continue
    key = (r["workload"], r["clients"], r["rounds"])
    name = r["system"] + (f":{r['variant']}" if r["system"] == "ours" else "")
    out.setdefault(key, {}).setdefault(name, []).append(r)
  table = []
  for (wname, clients, rounds), systems in out.items():
    row = {"workload": wname, "clients": clients, "rounds": rounds, "systems": {}}
    for name, rs in systems.items():
      med = lambda k: statistics.median([x[k] for x in rs if x.get(k) is not None]) if any(
          x.get(k) is not None for x in rs) else None
      row["systems"][name] = {k: med(k) for k in ("startup_s", "first_round_s", "round_s_median", "wall_s",
                                                   "peak_memory_gb", "final_loss")}
      row["systems"][name]["runs"] = len(rs)
      row["systems"][name]["range_round_s"] = [min(x["round_s_median"] for x in rs if x["round_s_median"] is not None),
                                               max(x["round_s_median"] for x in rs if x["round_s_median"] is not None)] \
          if any(x["round_s_median"] is not None for x in rs) else None
      row["systems"][name]["range_wall_s"] = [min(x["wall_s"] for x in rs), max(x["wall_s"] for x in rs)]
    for ref in [n for n in row["systems"] if n.startswith("ours")]:
      ours = row["systems"][ref]
      for name, s in row["systems"].items():
        if not name.startswith("ours"):
          s.setdefault("over", {})[ref] = {}
          ratio = s["over"][ref]
          ratio["wall"] = s["wall_s"] / ours["wall_s"]
          if s["round_s_median"] and ours["round_s_median"]:
            ratio["round"] = s["round_s_median"] / ours["round_s_median"]
          ratio["memory"] = s["peak_memory_gb"] / ours["peak_memory_gb"]
    table.append(row)
  return {"table": table}


def markdown(result: dict) -> str:
  """The comparison as Markdown tables (docs/peers.md): per workload and system the median
  over repeats and, in brackets, the range."""
  def fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"
  lines = []
  for row in result["table"]:
    lines += [f"**Workload {row['workload']}**, {row['clients']:,} clients, {row['rounds']} rounds:", "",
              "| system | runs | command to first round (s) | first round (s) | later rounds, median (s) [range] "
              "| whole command (s) [range] | peak memory (GB) | final loss |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, s in row["systems"].items():
      rr = s.get("range_round_s") or [None, None]
      rw = s["range_wall_s"]
      lines.append(f"| {name} | {s['runs']} | {fmt(s['startup_s'], 1)} | {fmt(s['first_round_s'])} | "
                   f"{fmt(s['round_s_median'], 3)} [{fmt(rr[0], 3)}-{fmt(rr[1], 3)}] | {fmt(s['wall_s'], 1)} "
                   f"[{fmt(rw[0], 1)}-{fmt(rw[1], 1)}] | {fmt(s['peak_memory_gb'])} | {fmt(s['final_loss'], 4)} |")
    lines.append("")
  return "\n".join(lines)


def main(argv=None):
  args = _args(argv)
  if args.from_json:
    with open(args.from_json) as f:
      print(markdown(json.load(f)))
    return None
  systems = args.systems.split(",")
  pythons, install = {"ours": sys.executable}, {}
  for name in systems:
    if name in PEERS:
      py, note = ensure_env(args.envs, name)
      install[name] = note
      print(f"{name}: {note}", flush=True)
      if py:
        pythons[name] = py
  systems = [s for s in systems if s in pythons]
  variants = {"ours": args.ours_variants.split(",")}
  jobs = []  # (workload, [system, variant] list) in the order they run
  for wname in args.workloads.split(","):
    if not wname:
      continue
    w = common.workload(wname, clients=args.clients_a if wname == "A" else None,
                        rounds=args.rounds_a if wname == "A" else args.rounds_b)
    jobs.append((w, args.repeats, False))
  for c in [int(c) for c in args.memory_clients.split(",") if c]:
    jobs.append((common.workload("A", clients=c, rounds=3), 1, True))
  records = []
  caches = tempfile.mkdtemp(prefix="fedjax_dg_peers_cache_")
  for j, (w, repeats, memory_only) in enumerate(jobs):
    xp, yp = common.write_data(args.data, w)
    runs = [(s, v) for s in systems for v in variants.get(s, [""])
]
    warm = os.path.join(caches, f"warm{j}")
    if memory_only:  # memory does not depend on the cache: one fresh-cache run of ours, no warm-up
      mine = dict.fromkeys(v.split("@")[0] + "@fresh" for v in variants["ours"]) if "ours" in systems else {}
      runs = [(s, v) for s, v in runs if s != "ours"] + [("ours", v) for v in mine]
    if any(v.endswith("@warm") for s, v in runs if s == "ours"):  # untimed: fills the warm cache
      strategies = {v.split("@")[0] for s, v in runs if s == "ours" and v.endswith("@warm")}
      for st in strategies:
        run_one("ours", sys.executable, dict(w, rounds=2), xp, yp, os.cpu_count(), "" if st == "auto" else st,
                args.timeout, warm)
    for rep in range(repeats):
      for s, v in runs[rep % len(runs):] + runs[:rep % len(runs)]:
        threads = args.peer_threads if s in PEERS else os.cpu_count()
        strategy, _, cache = v.partition("@")
        cache = {"fresh": os.path.join(caches, f"fresh{j}_{rep}"), "warm": warm}.get(cache, cache)
        rec = run_one(s, pythons[s], w, xp, yp, threads, "" if strategy == "auto" else strategy, args.timeout, cache)
        rec["variant"] = v
        rec["repeat"] = rep
        if s == "ours":
          rec["variant"] = v
        if args.out:  # every record as it comes, so a stopped comparison keeps what it measured
          with open(args.out + ".records.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        records.append(rec)
        msg = rec.get("error") or (f"start-up {rec['startup_s']:.1f} s, first round {rec['first_round_s']:.2f} s, "
                                   f"rounds {rec['round_s_median'] or 0:.3f} s, wall {rec['wall_s']:.1f} s, "
                                   f"loss {rec['final_loss']:.4f}")
        print(f"{w['name']} C={w['clients']:>6} {s}{':' + v if v else ''} #{rep}: {msg}, peak {rec['peak_memory_gb']:.2f} GB, "
              f"load {rec['load_before'][0]:.1f}->{rec['load_after'][0]:.1f}", flush=True)
  result = {"machine": _machine(), "install": install, "pythons": pythons, "peer_threads": args.peer_threads,
            "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]) if argv is None else argv,
            "workloads": common.WORKLOADS, "records": records, **summarise(records)}
  shutil.rmtree(caches, ignore_errors=True)
  for row in result["table"]:
    print(f"\n{row['workload']} ({row['clients']} clients, {row['rounds']} rounds)")
    for name, s in row["systems"].items():
      print(f"  {name:16s} " + ", ".join(f"{k} {v:.3f}" for k, v in s.items() if isinstance(v, float)))
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
    print(f"wrote {args.out}")
  return result


if __name__ == "__main__":
  main()
