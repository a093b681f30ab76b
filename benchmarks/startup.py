"""Where the seconds before the first round of a small command-line run go, and what JAX's
persistent compilation cache saves.

The run is the README's first command (FedProx, the MLP on 8x8 digits, 8 clients, 4
rounds, evaluation every 2). Each repeat runs it three times, interleaved: with a fresh
(empty) compilation cache, with the cache the fresh run just filled (warm), and with the
cache off (`FEDJAX_DG_COMPILATION_CACHE=off`). Each run is a new process (`fedjax-dg`'s
entry point, `fedjax_dg.main.run`) started through a wrapper that stamps the first call of
the round function, so for each run it records: the process start (interpreter up), the
first round's start (everything before training: imports, data, partitioning, set-up,
model initialisation), the first round's end (its tracing and compilation included), and
the whole command; and the seconds of the phases before the first round: the package's
imports (from the interpreter's start), preparing the run (`plan.prepare`: data,
partitioning, algorithms), the model's initialisation (`Model.init`) and the tracing of
one client's update for the communication record (`runbook.communication`).
`os.getloadavg()` is read before and after each run. Once per
invocation it also runs `python -X importtime -c "import fedjax_dg.main, fedjax_dg.experiment"`
and keeps the ten slowest imports (cumulative).

    python benchmarks/startup.py --repeats 2 --out benchmarks/results/startup_cpu.json
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
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_RUN = ["--config", "configs/default.py", "--config.model.name=mlp", "--config.data.image_size=8",
             "--config.num_clients=8", "--config.num_rounds=4", "--config.eval_every=2",
             "--config.algorithm.name=fedprox", "--config.algorithm.fedprox.mu=0.01", "--config.partition.lam=0.1",
             "--config.quiet=True"]

# Runs the command line with the round function's first call stamped on stderr, and the
# phases before it: the package's import, preparing the run (data, partitioning,
# algorithms: plan.prepare), the model's initialisation (Model.init) and the tracing of one
# client's update for the communication record (runbook.communication, as loop calls it).
_WRAPPER = r"""
import functools, json, sys, time
print(json.dumps({"mark": "python", "t": time.time()}), file=sys.stderr, flush=True)
from fedjax_dg import loop as _loop, main, plan as _plan
from fedjax_dg.engine import round as _round
from fedjax_dg.models import Model as _Model
print(json.dumps({"mark": "imported", "t": time.time()}), file=sys.stderr, flush=True)

def _phase(owner, name, label):
  fn = getattr(owner, name)
  @functools.wraps(fn)
  def stamped(*a, **k):
    t = time.time()
    out = fn(*a, **k)
    print(json.dumps({"phase": label, "t0": t, "t1": time.time()}), file=sys.stderr, flush=True)
    return out
  setattr(owner, name, stamped)
_phase(_plan, "prepare", "prepare")
_phase(_Model, "init", "model_init")
_phase(_loop, "communication", "communication")
_call = _round.RoundFn.__call__
_seen = []
def _stamped(self, *a, **k):
  first = not _seen
  if first:
    _seen.append(1)
    print(json.dumps({"mark": "round0_start", "t": time.time()}), file=sys.stderr, flush=True)
  out = _call(self, *a, **k)
  if first:
    import jax
    jax.block_until_ready(out)
    print(json.dumps({"mark": "round0_end", "t": time.time()}), file=sys.stderr, flush=True)
  return out
_round.RoundFn.__call__ = _stamped
sys.argv = ["fedjax-dg"] + sys.argv[1:]
main.run()
"""


def run_once(cache: str, workdir: str) -> dict:
  env = dict(os.environ, FEDJAX_DG_COMPILATION_CACHE=cache, PYTHONPATH=ROOT)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  load0 = os.getloadavg()
  t0 = time.time()
  r = subprocess.run([sys.executable, "-c", _WRAPPER, *SMALL_RUN, f"--workdir={workdir}"], cwd=ROOT, env=env,
                     capture_output=True, text=True)
  total = time.time() - t0
  marks, phases = {}, {}
  for line in r.stderr.splitlines():
    if line.startswith('{"mark"'):
      m = json.loads(line)
      marks[m["mark"]] = m["t"] - t0
    elif line.startswith('{"phase"') and "round0_start" not in marks:  # before the first round
      m = json.loads(line)
      phases[m["phase"] + "_s"] = phases.get(m["phase"] + "_s", 0.0) + m["t1"] - m["t0"]
  if r.returncode != 0 or "round0_end" not in marks:
    raise RuntimeError(f"the small run failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
  return {"python_s": marks["python"], "imported_s": marks["imported"], "before_first_round": phases,
          "to_first_round_s": marks["round0_start"],
          "to_first_round_end_s": marks["round0_end"], "first_round_s": marks["round0_end"] - marks["round0_start"],
          "total_s": total, "load_before": load0, "load_after": os.getloadavg()}


def slowest_imports(n: int = 10) -> list:
  r = subprocess.run([sys.executable, "-X", "importtime", "-c", "import fedjax_dg.main, fedjax_dg.experiment"],
                     cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True)
  rows = []
  for line in r.stderr.splitlines():
    if line.startswith("import time:") and "|" in line and "cumulative" not in line:
      _, cum, name = [p.strip() for p in line[len("import time:"):].split("|")]
      rows.append((int(cum) / 1e6, name.strip()))
  top = sorted(rows, reverse=True)
  return [{"module": name, "cumulative_s": s} for s, name in top[:n]]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  records = []
  tmp = tempfile.mkdtemp(prefix="fedjax_dg_startup_")
  try:
    for rep in range(args.repeats):
      cache = os.path.join(tmp, f"cache{rep}")
      for mode, where in (("fresh", cache), ("warm", cache), ("off", "off")):
        rec = dict(run_once(where, os.path.join(tmp, f"run{rep}_{mode}")), mode=mode, repeat=rep)
        records.append(rec)
        print(f"#{rep} {mode:5s}: interpreter {rec['python_s']:.2f} s, imported {rec['imported_s']:.2f} s, "
              + "".join(f"{k} {v:.2f} s, " for k, v in rec["before_first_round"].items())
              + f"first round starts {rec['to_first_round_s']:.2f} s,"
              f" ends {rec['to_first_round_end_s']:.2f} s, command {rec['total_s']:.2f} s "
              f"(load {rec['load_before'][0]:.1f}->{rec['load_after'][0]:.1f})", flush=True)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  summary = {}
  for mode in ("fresh", "warm", "off"):
    rs = [r for r in records if r["mode"] == mode]
    summary[mode] = {k: statistics.median(r[k] for r in rs)
                     for k in ("imported_s", "to_first_round_s", "to_first_round_end_s", "first_round_s", "total_s")}
    for k in sorted({k for r in rs for k in r["before_first_round"]}):
      summary[mode][k] = statistics.median(r["before_first_round"].get(k, 0.0) for r in rs)
  imports = slowest_imports()
  print("\nmedians:")
  for mode, s in summary.items():
    print(f"  {mode:5s} " + ", ".join(f"{k} {v:.2f}" for k, v in s.items()))
  print("slowest imports (cumulative s): " + ", ".join(f"{i['module']} {i['cumulative_s']:.2f}" for i in imports[:6]))
  if args.out:
    import jax
    out = {"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "jax": jax.__version__,
                       "python": platform.python_version()},
           "command": "fedjax-dg " + " ".join(SMALL_RUN), "records": records, "median": summary,
           "slowest_imports": imports}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(out, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
