"""The cost of committed runs: each run's config (its job.json) run again in a fresh child
process into a temporary folder, with its wall time and the child's own CPU time (user +
system) and peak resident memory (ru_maxrss, whole process: Python, JAX, data) recorded. CPU time and memory depend little on the load
of a shared machine; wall time does.

    python experiments/learned_aggregation/measure_cost.py RUN [RUN ...] --out cost.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHILD = """
import json, resource, sys
import ml_collections
from fedjax_dg import experiment
config = ml_collections.ConfigDict(json.load(open(sys.argv[1]))["config"])
config.resume, config.quiet = False, True
experiment.train_and_evaluate(config, sys.argv[2])
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu_s": u.ru_utime + u.ru_stime, "peak_rss_kib": u.ru_maxrss}))
"""


def measure(run: str) -> dict:
  with open(os.path.join(run, "job.json")) as f:
    config = json.load(f)["config"]
  with tempfile.TemporaryDirectory() as tmp:
    t0 = time.time()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", CHILD, os.path.join(run, "job.json"), os.path.join(tmp, "run")],
                         check=True, env=env, cwd=ROOT, capture_output=True, text=True).stdout
    wall = time.time() - t0
    usage = json.loads(out.strip().splitlines()[-1])
  a = config["algorithm"]
  return {"run": os.path.relpath(run, ROOT), "algorithm": a["name"], "unroll": a.get("learned", {}).get("unroll", 1),
          "lam": config["partition"]["lam"], "seed": config["seed"], "num_rounds": config["num_rounds"],
          "wall_s": round(wall, 2),
          "cpu_s": round(usage["cpu_s"], 2), "peak_rss_mib": round(usage["peak_rss_kib"] / 1024, 1)}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("runs", nargs="+")
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)
  rows = []
  for run in args.runs:
    rows.append(measure(run))
    print(json.dumps(rows[-1]), flush=True)
  res = {"machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, shared with other processes",
         "command": "python experiments/learned_aggregation/measure_cost.py " + " ".join(args.runs),
         "runs": rows}
  with open(args.out, "w") as f:
    json.dump(res, f, indent=1)


if __name__ == "__main__":
  main()
