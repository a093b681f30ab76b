"""Peak memory and round time of SCAFFOLD from the command line at 1,000 / 10,000 / 100,000
clients, with the control variates in host memory (`--config.engine.host_client_states=True`).

Every point is `python -m fedjax_dg` in a fresh process:

    python -m fedjax_dg --config configs/default.py --config.algorithm.name=scaffold \\
      --config.client.momentum=0 --config.engine.host_client_states=True \\
      --config.num_clients=C --config.cohort_size=100 ...

The data is the embedded synthetic `spurious` dataset with `data.n_per_domain=40000`
(128,000 training rows over 4 training domains), so 100,000 clients have at least one
example each (the runner refuses more clients than training examples); every point uses
the same data, model (MLP 10-200-200-2) and local work (2 steps of batch 10 per client),
so only the number of clients changes.

  peak_rss_mb   the process's peak resident memory (`ru_maxrss` of that child, `os.wait4`).
  Each point is run `--repeats` times, interleaved with the other points; the figures
  are the medians over the repeats.
  clients_with_state  the clients holding a state at the end (those ever sampled; read
                from the final checkpoint's checksum file). Host memory grows with them:
                4 bytes per client plus one state per client ever sampled, so the default
                10 rounds of 100 keep at most 1,000 states at every point.
  round_s       the median seconds of a round after the compiling first one
                (summary.json's `timing.median_round_s`: the round and its wait for the
                train loss, no evaluation or checkpoint).

    python benchmarks/scale_cli.py --out benchmarks/results/scale_cli_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--points", default="1000,10000,100000", help="total clients")
  p.add_argument("--cohort", type=int, default=100)
  p.add_argument("--rounds", type=int, default=10)
  p.add_argument("--repeats", type=int, default=3, help="runs per point, interleaved across the points")
  p.add_argument("--n-per-domain", type=int, default=40000)
  p.add_argument("--host-states", default="True", choices=["True", "False"])
  p.add_argument("--out", default=None)
  return p.parse_args(argv)


def command(clients: int, rounds: int, workdir: str, args) -> list[str]:
  return [sys.executable, "-m", "fedjax_dg", "--config", "configs/default.py",
          "--config.algorithm.name=scaffold", "--config.client.momentum=0",
          f"--config.engine.host_client_states={args.host_states}",
          "--config.data.name=spurious", f"--config.data.n_per_domain={args.n_per_domain}",
          "--config.model.name=mlp", "--config.model.hidden=(200,200)",
          f"--config.num_clients={clients}", f"--config.cohort_size={args.cohort}",
          "--config.client.local_steps=2", "--config.client.batch_size=10",
          f"--config.num_rounds={rounds}", f"--config.eval_every={rounds}", f"--config.checkpoint_every={rounds}",
          "--config.quiet=True", f"--workdir={workdir}"]


def run_once(clients: int, rounds: int, args) -> dict:
  workdir = tempfile.mkdtemp(prefix="scale_cli_")
  try:
    cmd = command(clients, rounds, os.path.join(workdir, "run"), args)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)  # this child's own peak RSS
    out, err = p.stdout.read().decode(), p.stderr.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
      raise SystemExit(f"scale_cli: {' '.join(cmd)} failed: {err.strip()[-2000:]}")
    summary = json.load(open(os.path.join(workdir, "run", "summary.json")))
    sums = json.load(open(os.path.join(workdir, "run", "checkpoint_sums", f"{rounds}.json")))
    return {"round_s": summary["timing"]["median_round_s"], "compiling_round_s": summary["timing"]["compile_s"],
            "clients_with_state": sums.get("host_client_states", [None])[0],
            "wall_time_s": summary["wall_time_s"], "process_s": time.time() - t0,
            "peak_rss_mb": usage.ru_maxrss / 1024.0, "command": " ".join(cmd[1:]).replace(workdir, "<tmp>"),
            "strategy": summary["strategy"], "local_steps": summary["local_steps"], "stdout_tail": out[-300:]}
  finally:
    shutil.rmtree(workdir, ignore_errors=True)


def _machine() -> dict:
  model = ""
  try:
    with open("/proc/cpuinfo") as f:
      model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
  except OSError:
    pass
  return {"cpu": model, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
          "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1)}


def main(argv=None):
  args = _args(argv)
  sizes = [int(x) for x in args.points.split(",")]
  runs = {c: [] for c in sizes}
  for k in range(args.repeats):  # interleaved: a burst of load on the shared machine hits every point
    for clients in sizes:
      load = os.getloadavg()
      run = run_once(clients, args.rounds, args)
      run["load_average_1_5_15_before"] = load
      runs[clients].append(run)
      print(f"repeat {k}: {clients:>7} clients: round {run['round_s']:.3f} s, peak RSS {run['peak_rss_mb']:.0f} MB "
            f"(load {load[0]:.1f})", flush=True)
  points = [{"num_clients": c, "cohort": args.cohort, "host_client_states": args.host_states == "True",
             "round_s": float(np.median([r["round_s"] for r in runs[c]])),
             "peak_rss_mb": float(np.median([r["peak_rss_mb"] for r in runs[c]])), "runs": runs[c]}
            for c in sizes]
  lo, hi = points[0], points[-1]
  result = {"experiment": "scaffold_host_states_cli", "machine": _machine(),
            "note": "a shared machine, loaded by other jobs while measuring (load averages per run)",
            "command": "python benchmarks/scale_cli.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "points": points,
            "ratio_last_to_first": {"round_s": hi["round_s"] / lo["round_s"],
                                    "peak_rss_mb": hi["peak_rss_mb"] / lo["peak_rss_mb"]}}
  print(f"{hi['num_clients']} vs {lo['num_clients']} clients: round time x{result['ratio_last_to_first']['round_s']:.2f}, "
        f"peak RSS x{result['ratio_last_to_first']['peak_rss_mb']:.2f}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=2)
  return result


if __name__ == "__main__":
  main()
