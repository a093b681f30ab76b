"""Can the host loop train two clients of workload B at a time on a 2-core CPU?

Workload B of the peer comparison (benchmarks/peers: DomainBed's MNIST CNN, 10 clients x
256 examples, all 10 per round, 5 local SGD steps of batch 32, FedAvg), built with the
library as `side_ours.py` builds it (the `auto` strategy: `host_loop`, local steps
unrolled). Flower trains two clients at a time in two single-threaded Ray actors; these
variants of our round try the same, each timed as whole rounds, alternated with the
library's own round inside one process so that every variant meets the same load:

  host_loop    the library's round with the one-thread host loop (`HostLoopExecutor(devices,
               threads=1)`): one jitted call per client, dispatched asynchronously;
               client i+1's call does not wait for client i's partial sum.
  threads2     the same round with the clients' calls made from 2 host threads
               (`threads=2`, the default on CPU: 2 clients in flight, each thread
               blocking on its call), the partial sums added in client order (the result
               must equal host_loop's bit for bit).
  dev1, dev2   (in a process of its own, `--xla_force_host_platform_device_count=2
               --xla_cpu_multi_thread_eigen=false`: one Eigen thread per device) the
               one-thread host loop on one of the two CPU devices / on both (client i on
               device i mod 2, each device its own partial sum).

Each record: the seconds of every round (wall) and the process's CPU seconds over it
(`time.process_time`, every thread), their medians, the CPU seconds per wall second (how
many cores the round kept busy), the load average before and after, and the largest
difference of the final server parameters from host_loop's (dev1's in the second process).
Run it at normal priority; the machine's other jobs show in the load.

    python benchmarks/host_loop_overlap.py --rounds 6 --passes 2 --out benchmarks/results/host_loop_overlap_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TWO_DEVICES = "--xla_force_host_platform_device_count=2 --xla_cpu_multi_thread_eigen=false"
PROCESSES = {"one_device": ("", ("host_loop", "threads2")), "two_devices": (TWO_DEVICES, ("dev1", "dev2"))}


def build(variant: str, w: dict):
  """(round_fn, state, store) of workload B for one variant."""
  import jax
  import numpy as np
  import fedjax_dg
  from fedjax_dg import algorithms
  from fedjax_dg.algorithms.base import make_schedule
  from fedjax_dg.data import store as store_lib
  from fedjax_dg.data.store import ClientStore
  from fedjax_dg.engine import round as round_lib
  from fedjax_dg.engine.executors import HostLoopExecutor
  from fedjax_dg.engine.measured import default_unroll, engine_defaults, model_family
  sys.path.insert(0, os.path.join(HERE, "peers"))
  import common
  C, n = w["clients"], w["examples"]
  xp, yp = common.write_data(os.path.join("/tmp", "fedjax_dg_peers_data"), w)
  x, y = common.load_data(xp, yp)
  store = store_lib.to_device(ClientStore(np.asarray(x, np.float32).reshape((C, n) + common.INPUT_SHAPE),
                                          np.asarray(y, np.int32).reshape(C, n), np.zeros((C, n), np.int32),
                                          np.full((C,), n, np.int32)))
  config = fedjax_dg.default_config()
  config.model.name = w["model"]
  config.client.lr, config.client.momentum = w["lr"], 0.0
  config.client.batch_size, config.client.local_steps, config.client.local_epochs = w["batch"], w["steps"], w["epochs"]
  model = fedjax_dg.build_model(config.model, common.INPUT_SHAPE, common.NUM_CLASSES)
  family = model_family(model, common.INPUT_SHAPE)
  strategy = engine_defaults(family).strategy
  steps = common.local_steps(w)
  sched = make_schedule(w["batch"], w["steps"], w["epochs"], n, n, unroll=default_unroll(family, steps))
  alg = algorithms.build_algorithm(config, model, sched, C, w["cohort"])
  devices = jax.local_devices()[:1] if variant in ("host_loop", "threads2", "dev1") else jax.local_devices()
  threads = 2 if variant == "threads2" else 1
  make = round_lib.executor  # the round's executor, with the variant's threads
  round_lib.executor = lambda *a, **k: HostLoopExecutor(devices, threads)
  try:
    round_fn = fedjax_dg.make_round(alg, C, w["cohort"], strategy, devices=devices)
  finally:
    round_lib.executor = make
  key = jax.random.PRNGKey(0)
  state = fedjax_dg.init_round_state(alg, key, model.init(key), C)
  return round_fn, state, round_fn.place(store), strategy, alg


def child(variants, rounds: int) -> dict:
  """The variants' rounds, alternated (round r of every variant, then round r + 1 in the
  reverse order), from the same state; the first round of each (compilation) not timed."""
  import fedjax_dg  # noqa: F401  (first: it sets the package's XLA:CPU flags before JAX's backend starts)
  import jax
  import numpy as np
  sys.path.insert(0, os.path.join(HERE, "peers"))
  import common
  w = common.workload("B")
  from fedjax_dg.engine.executors import host_loop_threads
  out = {"xla_flags": os.environ.get("XLA_FLAGS", ""), "devices": len(jax.local_devices()),
         "library_default_threads": host_loop_threads(jax.local_devices()), "load_before": os.getloadavg()}
  runs = {}
  for v in variants:
    round_fn, state, store, strategy, alg = build(v, w)
    state, _ = round_fn(state, store, jax.random.PRNGKey(1))
    jax.block_until_ready(state)
    runs[v] = dict(round_fn=round_fn, state=state, store=store, alg=alg)
    out[v] = {"strategy": strategy, "wall_s": [], "cpu_s": []}
  for r in range(rounds):
    for v in (variants if r % 2 == 0 else variants[::-1]):
      run = runs[v]
      c, t = time.process_time(), time.perf_counter()
      run["state"], _ = run["round_fn"](run["state"], run["store"], jax.random.PRNGKey(2 + r))
      jax.block_until_ready(run["state"])
      out[v]["wall_s"].append(time.perf_counter() - t)
      out[v]["cpu_s"].append(time.process_time() - c)
  ref = [np.asarray(a) for a in jax.tree.leaves(runs[variants[0]]["alg"].params_of(runs[variants[0]]["state"].server))]
  for v in variants:
    rec = out[v]
    rec["median_wall_s"] = float(np.median(rec["wall_s"]))
    rec["median_cpu_s"] = float(np.median(rec["cpu_s"]))
    rec["cores_busy"] = float(np.sum(rec["cpu_s"]) / np.sum(rec["wall_s"]))
    leaves = [np.asarray(a) for a in jax.tree.leaves(runs[v]["alg"].params_of(runs[v]["state"].server))]
    rec["max_abs_diff_from_first"] = max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(leaves, ref))
    rec["bit_identical_to_first"] = all(np.array_equal(a, b) for a, b in zip(leaves, ref))
  out["load_after"] = os.getloadavg()
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rounds", type=int, default=6, help="timed rounds per variant per process")
  p.add_argument("--passes", type=int, default=1, help="processes per XLA_FLAGS set, interleaved")
  p.add_argument("--processes", default="one_device,two_devices")
  p.add_argument("--out", default="")
  p.add_argument("--child", default="", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.child:
    print(json.dumps(child(args.child.split(","), args.rounds)))
    return
  res = {"command": " ".join([os.path.basename(sys.executable), "benchmarks/host_loop_overlap.py"] + sys.argv[1:]),
         "what": "workload B rounds (benchmarks/peers), variants alternated within each process",
         "nice": os.nice(0), "cpus": os.cpu_count(), "runs": []}
  for p_ in range(args.passes):
    for name in args.processes.split(","):
      flags, variants = PROCESSES[name]
      env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + flags).strip())
      r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", ",".join(variants),
                          "--rounds", str(args.rounds)], capture_output=True, text=True, env=env)
      rec = {"pass": p_, "process": name}
      if r.returncode:
        rec["error"] = (r.stderr.strip().splitlines() or ["?"])[-1][:300]
      else:
        rec.update(json.loads(r.stdout.strip().splitlines()[-1]))
      res["runs"].append(rec)
      short = {k: (v if not isinstance(v, dict) else {m: v[m] for m in ("median_wall_s", "median_cpu_s", "cores_busy",
                                                                       "bit_identical_to_first")})
               for k, v in rec.items()}
      print(json.dumps(short), flush=True)
      if args.out:
        with open(args.out, "w") as f:
          json.dump(res, f, indent=1)


if __name__ == "__main__":
  main()
