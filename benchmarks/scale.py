"""Round time and peak memory against the total number of clients, and ragged cohorts

  total_clients: C = 1,000, 10,000, 100,000 clients of `--per-client` (20) examples each,
      a cohort of 100, FedAvg (or `--algorithm scaffold`, whose controls then live in host
      memory: `init_round_state(..., host_states=True)`) on the MLP 784-200-200-10, 2
      local steps of 10. Inputs are uint8 28x28 images in one raw file (`--data-dir`),
      read by row (`host_store.FileRows`) into a host store (`pack_clients_host`): only the
      cohort's minibatches are read and moved to the device. (A `np.memmap` of the file
      would add the page-cache folios it maps, hundreds of kB per client read, to RSS.)
  ragged: a cohort of 100 clients whose sizes follow a power law from 10 to 2,000
      examples (200:1), one epoch of batch 10, the same MLP; the round with local-step
      buckets (`buckets_for(schedule)`: each client runs its own steps) against the masked
      round (every client compiled for the largest client's 200 steps); both from the same
      state, with the largest parameter difference after the rounds.

Every point runs in a fresh subprocess, so `peak_rss_mb` (`VmHWM`) is that point's own.
`round_s` is the median over `--rounds` rounds after two compiling rounds (`first_round_s`:
their sum).

    python benchmarks/scale.py --out benchmarks/results/scale_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIM = 28 * 28


def _args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--points", default="1000,10000,100000", help="total clients of the total_clients experiment")
  p.add_argument("--cohort", type=int, default=100)
  p.add_argument("--per-client", type=int, default=20)
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--strategy", default="sequential")
  p.add_argument("--algorithm", default="fedavg", choices=["fedavg", "scaffold"])
  p.add_argument("--experiments", default="total_clients,ragged")
  p.add_argument("--ragged-strategies", default="sequential,host_loop")
  p.add_argument("--data-dir", default="/tmp/fedjax_dg_scale")
  p.add_argument("--out", default=None)
  p.add_argument("--child", default=None, help=argparse.SUPPRESS)
  p.add_argument("--clients", type=int, default=0, help=argparse.SUPPRESS)
  return p.parse_args(argv)


def _machine() -> dict:
  model = ""
  try:
    with open("/proc/cpuinfo") as f:
      model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
  except OSError:
    pass
  import jax
  return {"platform": platform.platform(), "cpu": model, "cpu_count": os.cpu_count(),
          "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
          "jax": jax.__version__, "python": platform.python_version()}


def _data_file(data_dir: str, rows: int) -> str:
  """A raw uint8 [rows, 784] file of random images (made once, reused)."""
  import numpy as np
  os.makedirs(data_dir, exist_ok=True)
  path = os.path.join(data_dir, f"x_{rows}.u8")
  if not os.path.exists(path) or os.path.getsize(path) != rows * DIM:
    rng = np.random.default_rng(0)
    x = np.memmap(path + ".tmp", np.uint8, "w+", shape=(rows, DIM))
    step = 200_000
    for i in range(0, rows, step):
      x[i:i + step] = rng.integers(0, 256, (min(step, rows - i), DIM), dtype=np.uint8)
    x.flush()
    del x
    os.replace(path + ".tmp", path)
  return path


def _peak_rss_mb() -> float:
  """This process's peak resident memory: `VmHWM` (reset by exec; `ru_maxrss` is not, so a
  child would inherit the high-water mark of the parent that wrote the data file)."""
  try:
    with open("/proc/self/status") as f:
      return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024.0
  except (OSError, StopIteration):
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _mlp_and_round(jax, num_clients, cohort, sched, strategy, algorithm, buckets=None):
  import ml_collections
  from fedjax_dg import algorithms, default_config
  from fedjax_dg.engine import make_round
  from fedjax_dg.models import build_model
  model = build_model(ml_collections.ConfigDict({"name": "mlp", "hidden": (200, 200)}), (28, 28, 1), 10)
  config = default_config()  # `algorithm` with local SGD at 0.05 without momentum, server step 1
  config.algorithm.name = algorithm
  config.client.lr, config.client.momentum = 0.05, 0.0
  alg = algorithms.build_algorithm(config, model, sched, num_clients, cohort)
  return model, alg, make_round(alg, num_clients, cohort, strategy, chunk_size=10, buckets=buckets)


WARMUP = 2  # the second round compiles again for the state's new (committed, strong) types


def _time_rounds(jax, rf, state, store, rounds, params_of):
  times = []
  for t in range(rounds + WARMUP):
    t0 = time.perf_counter()
    state, m = rf(state, store, jax.random.PRNGKey(t))
    jax.block_until_ready(params_of(state.server))
    times.append(time.perf_counter() - t0)
  timed = sorted(times[WARMUP:])
  return state, timed[len(timed) // 2], sum(times[:WARMUP])


def child_total_clients(args) -> dict:
  import numpy as np
  t_setup = time.perf_counter()
  import jax
  import jax.numpy as jnp
  sys.path.insert(0, ROOT)
  from fedjax_dg.algorithms.base import make_schedule
  from fedjax_dg.data.host_store import FileRows, pack_clients_host
  from fedjax_dg.data.splits import Split
  from fedjax_dg.engine import init_round_state
  C, n = args.clients, args.per_client
  x = FileRows(os.path.join(args.data_dir, os.environ["SCALE_DATA_FILE"]), np.uint8, (28, 28, 1), C * n)
  rng = np.random.default_rng(1)
  split = Split(x, rng.integers(0, 10, C * n).astype(np.int32), np.zeros(C * n, np.int32))
  parts = [np.arange(c * n, (c + 1) * n) for c in range(C)]
  packed = pack_clients_host(split, parts)
  sched = make_schedule(10, 2, 0, n, n)  # 2 local steps of 10
  model, alg, rf = _mlp_and_round(jax, C, args.cohort, sched, args.strategy, args.algorithm)
  params = model.init(jax.random.PRNGKey(0))
  state = init_round_state(alg, jax.random.PRNGKey(1), params, C, host_states=args.algorithm == "scaffold")
  store = rf.place(jax.tree.map(jnp.asarray, packed))
  setup_s = time.perf_counter() - t_setup
  state, round_s, first_s = _time_rounds(jax, rf, state, store, args.rounds, alg.params_of)
  rec = {"experiment": "total_clients", "total_clients": C, "cohort": args.cohort, "round_s": round_s,
         "peak_rss_mb": _peak_rss_mb(), "first_round_s": first_s, "setup_s": setup_s,
         "examples_per_client": n, "local_steps": 2, "batch": 10, "strategy": args.strategy,
         "algorithm": args.algorithm, "data_bytes_total": int(C * n * DIM)}
  if args.algorithm == "scaffold":
    rec["client_state_bytes"] = state.clients.nbytes
  return rec


def ragged_sizes(cohort: int, lo: int = 10, hi: int = 2000, alpha: float = 1.0, seed: int = 0):
  """Power-law (Pareto, index `alpha`) client sizes in [lo, hi], the extremes included."""
  import numpy as np
  u = np.random.default_rng(seed).uniform(size=cohort)
  sizes = np.minimum(hi, np.floor(lo * (1 - u) ** (-1.0 / alpha))).astype(int)
  sizes[0], sizes[1] = lo, hi
  return sizes


def child_ragged(args) -> dict:
  import numpy as np
  import jax
  import jax.numpy as jnp
  sys.path.insert(0, ROOT)
  from fedjax_dg.algorithms.base import make_schedule
  from fedjax_dg.data.splits import Split
  from fedjax_dg.data.store import pack_clients
  from fedjax_dg.engine import init_round_state
  from fedjax_dg.engine.round import buckets_for
  sizes = ragged_sizes(args.cohort)
  rng = np.random.default_rng(2)
  n = int(sizes.sum())
  split = Split(rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8), rng.integers(0, 10, n).astype(np.int32),
                np.zeros(n, np.int32))
  parts = np.split(np.arange(n), np.cumsum(sizes)[:-1])
  store = jax.tree.map(jnp.asarray, pack_clients(split, parts))
  sched = make_schedule(10, 0, 1, int(sizes.max()), int(sizes.min()))  # one epoch of batch 10
  out, times = [], {}
  for name, buckets in (("masked", None), ("buckets", buckets_for(sched))):
    model, alg, rf = _mlp_and_round(jax, args.cohort, args.cohort, sched, args.strategy, args.algorithm, buckets)
    params = model.init(jax.random.PRNGKey(0))
    state = init_round_state(alg, jax.random.PRNGKey(1), params, args.cohort)
    state, times[name], times[name + "_first"] = _time_rounds(jax, rf, state, rf.place(store), args.rounds,
                                                              alg.params_of)
    out.append(alg.params_of(state.server))
  diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(out[0]), jax.tree.leaves(out[1])))
  steps = -(-sizes // 10)
  return {"experiment": "ragged", "total_clients": args.cohort, "cohort": args.cohort,
          "round_s": times["buckets"], "masked_round_s": times["masked"], "speedup": times["masked"] / times["buckets"],
          "first_round_s": times["buckets_first"], "masked_first_round_s": times["masked_first"],
          "peak_rss_mb": _peak_rss_mb(), "strategy": args.strategy, "algorithm": args.algorithm,
          "sizes_min": int(sizes.min()), "sizes_max": int(sizes.max()), "sizes_median": float(np.median(sizes)),
          "own_steps_total": int(steps.sum()), "masked_steps_total": int(steps.max() * len(steps)),
          "bucket_caps": list(buckets_for(sched).caps), "max_param_diff_vs_masked": diff}


def main(argv=None):
  args = _args(argv)
  if args.child:
    rec = child_total_clients(args) if args.child == "total_clients" else child_ragged(args)
    print("RESULT " + json.dumps(rec), flush=True)
    return
  points = [int(p) for p in args.points.split(",") if p]
  experiments = args.experiments.split(",")
  records = []
  env = dict(os.environ)
  if "total_clients" in experiments:
    path = _data_file(args.data_dir, max(points) * args.per_client)
    env["SCALE_DATA_FILE"] = os.path.basename(path)
  jobs = [("total_clients", c, args.strategy) for c in points if "total_clients" in experiments]
  jobs += [("ragged", args.cohort, s) for s in args.ragged_strategies.split(",") if "ragged" in experiments]
  for exp, clients, strategy in jobs:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", exp, "--clients", str(clients),
           "--cohort", str(args.cohort), "--per-client", str(args.per_client), "--rounds", str(args.rounds),
           "--strategy", strategy, "--algorithm", args.algorithm, "--data-dir", args.data_dir]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
      raise RuntimeError(f"{exp} {clients} failed:\n{out.stdout}\n{out.stderr[-4000:]}")
    rec = json.loads(line[len("RESULT "):])
    records.append(rec)
    print(json.dumps(rec), flush=True)
  tc = [r for r in records if r["experiment"] == "total_clients"]
  if len(tc) > 1:
    lo, hi = tc[0], tc[-1]
    print(f"total clients {lo['total_clients']} -> {hi['total_clients']}: round time x{hi['round_s'] / lo['round_s']:.2f}, "
          f"peak RSS x{hi['peak_rss_mb'] / lo['peak_rss_mb']:.2f}")
  for r in records:
    if r["experiment"] == "ragged":
      print(f"ragged ({r['strategy']}): buckets {r['round_s']:.3f} s vs masked {r['masked_round_s']:.3f} s "
            f"per round: x{r['speedup']:.1f} faster; max parameter difference {r['max_param_diff_vs_masked']:.2e}")
  machine = _machine()
  for r in records:
    r["machine"] = machine
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(records, f, indent=2)


if __name__ == "__main__":
  main()
