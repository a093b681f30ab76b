"""Time and peak memory of a hypergradient through K rounds (fedjax_dg.meta), with and
without per-round rematerialisation (`jax.checkpoint` around each round).

Problem: FedProx on a 32-64-64-10 MLP, 8 clients of 64 synthetic examples (8 clients a
round, 8 local steps of batch 32, "sequential" strategy), outer variables `client.lr`,
`method.mu`, per-client and per-domain aggregation weights and the shrink factor;
objective: cross-entropy on 256 held-out examples. For each K in `--ks` and remat on/off,
in a fresh subprocess:

  temp_mb        XLA's buffer assignment for the compiled hypergradient program
                 (`compiled.memory_analysis().temp_size_in_bytes`): the memory the program
                 needs beyond its inputs and outputs; deterministic, independent of load.
  peak_rss_mb    the subprocess's peak resident memory (`VmHWM`), compilation included.
  compile_s      lowering and compiling.
  step_s         median wall time of `--repeats` calls of the compiled program.

The machine is shared: `load_before`/`load_after` record `os.getloadavg()` around each
point, and times on a loaded machine are upper bounds. Memory figures do not depend on load.

    python benchmarks/hypergrad_memory.py --out benchmarks/results/hypergrad_memory_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--ks", default="1,4,16,64")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--out", default=None)
  p.add_argument("--child", default=None, help=argparse.SUPPRESS)
  return p.parse_args(argv)


def _vm_hwm_mb() -> float:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) / 1024
  return float("nan")


def _child(k: int, remat: bool, repeats: int) -> dict:
  sys.path.insert(0, ROOT)
  import jax
  import jax.numpy as jnp
  import numpy as np
  import fedjax_dg
  from fedjax_dg import algorithms, meta
  from fedjax_dg.algorithms.base import make_schedule
  from fedjax_dg.data.store import ClientStore
  from fedjax_dg.engine import init_round_state
  from fedjax_dg.models import build_model
  import ml_collections

  C, N, DIM, CLASSES = 8, 64, 32, 10
  rng = np.random.default_rng(0)
  x = rng.normal(size=(C, N, DIM)).astype(np.float32) + (np.arange(C) % 4)[:, None, None] * 0.2
  store = ClientStore(x, rng.integers(0, CLASSES, (C, N)).astype(np.int32),
                      np.repeat((np.arange(C) % 4)[:, None], N, 1).astype(np.int32), np.full(C, N, np.int32))
  config = fedjax_dg.default_config()
  config.algorithm.name = "fedprox"
  config.client.lr, config.client.momentum = 0.05, 0.0
  model = build_model(ml_collections.ConfigDict({"name": "mlp", "hidden": (64, 64), "head_hidden": ()}), (DIM,), CLASSES)
  sched = make_schedule(32, 8, 1, N, N)
  builder = algorithms.Builder(algorithms.context(config, model, sched, C, C, num_domains=4, store=store))
  xv = jnp.asarray(rng.normal(size=(256, DIM)), jnp.float32)
  yv = jnp.asarray(rng.integers(0, CLASSES, 256))
  p = meta.problem(builder, store, C, C, "sequential", splits={"heldout_val": (xv, yv)}, num_domains=4)
  state = init_round_state(builder, jax.random.PRNGKey(1), model.init(jax.random.PRNGKey(0)), C)
  m = meta.init_meta(p, ("client.lr", "method.mu"))
  key = jax.random.PRNGKey(2)
  fn = meta.hypergradient(p, meta.validation_loss(model), k, remat=remat, jit=False)
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(m, state, key, 0).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(m, state, key, 0))
    times.append(time.perf_counter() - t0)
  return {"k": k, "remat": remat, "temp_mb": mem.temp_size_in_bytes / 2 ** 20,
          "argument_mb": mem.argument_size_in_bytes / 2 ** 20, "output_mb": mem.output_size_in_bytes / 2 ** 20,
          "peak_rss_mb": _vm_hwm_mb(), "compile_s": compile_s, "step_s": float(np.median(times)),
          "step_times_s": times, "state_mb": sum(a.nbytes for a in jax.tree.leaves(state)) / 2 ** 20}


def main(argv=None):
  args = _args(argv)
  if args.child:
    k, remat = args.child.split(",")
    print("RESULT " + json.dumps(_child(int(k), remat == "1", args.repeats)))
    return
  sys.path.insert(0, ROOT)
  from fedjax_dg.bench.provenance import provenance
  points = []
  for k in [int(v) for v in args.ks.split(",")]:
    for remat in (True, False):
      load_before = os.getloadavg()
      out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", f"{k},{int(remat)}",
                            "--repeats", str(args.repeats)], capture_output=True, text=True,
                           env=dict(os.environ, JAX_PLATFORMS="cpu"))
      line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
      if line is None:
        raise RuntimeError(f"K={k} remat={remat} failed:\n{out.stderr[-3000:]}")
      point = {**json.loads(line[7:]), "load_before": load_before, "load_after": os.getloadavg()}
      print(json.dumps(point), flush=True)
      points.append(point)
  res = {"command": "python benchmarks/hypergrad_memory.py " + " ".join(argv or sys.argv[1:]),
         "provenance": provenance(), "python": platform.python_version(),
         "note": ("shared 2-core CPU under load from other processes (load averages per point): times are upper "
                  "bounds; temp_mb is XLA's buffer assignment and does not depend on load"),
         "points": points}
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(res, f, indent=2)
  return res


if __name__ == "__main__":
  main()
