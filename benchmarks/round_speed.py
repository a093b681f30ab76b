"""Times one FedAvg round for each client-execution strategy.

Workloads (issue 2):
  cnn: C = 100 clients, 5 local steps, batch 32, DomainBed's MNIST CNN on 28x28 inputs;
  mlp: C = 1000 clients, 2 local steps, batch 10, an MLP 784-200-200-10.
Data are random arrays of the right shapes (speed does not depend on their values); each
client holds exactly `steps * batch` examples.

For each strategy it prints the median seconds per round over `--repeats` rounds (after
one compiling round), the ratio to the "sequential" per-client loop (the `lax.scan` over
single clients; > 1 means slower), and the fraction of the machine's measured float32
matmul rate that the round achieves, counting model FLOPs as 3x XLA's forward-pass count
(forward + backward) per example seen. With more than one local device (e.g.
`--host-devices 2` on CPU) the jitted strategies shard the client axis over devices and
"host_loop" dispatches clients round-robin to the devices.

    python benchmarks/round_speed.py --out benchmarks/results/round_speed_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

WORKLOADS = {
    "cnn": dict(model="cnn", clients=100, steps=5, batch=32, input_shape=(28, 28, 1)),
    "mlp": dict(model="mlp", clients=1000, steps=2, batch=10, input_shape=(28, 28, 1)),
}


def _args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workloads", default="cnn,mlp")
  p.add_argument("--strategies", default="vmap,chunked,sequential,host_loop")
  p.add_argument("--chunk-size", type=int, default=0, help="chunked strategy; 0: min(10, max(2, C // 2))")
  p.add_argument("--cnn-clients", type=int, default=100, help="clients in the cnn workload (issue: 100)")
  p.add_argument("--mlp-clients", type=int, default=1000, help="clients in the mlp workload (issue: 1000)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--host-devices", type=int, default=1, help="force N XLA host devices (CPU)")
  p.add_argument("--also-host-devices", type=int, default=0,
                 help="also rerun every strategy in a subprocess with this many host devices")
  p.add_argument("--out", default=None, help="write the JSON list of records here")
  return p.parse_args(argv)


def matmul_rate(jax, jnp, n=2048, repeats=5) -> float:
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    f(a).block_until_ready()
    times.append(time.perf_counter() - t)
  return 2 * n ** 3 / sorted(times)[len(times) // 2]


def run(args):
  if args.host_devices > 1:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.host_devices}")
  import jax
  import jax.numpy as jnp
  import ml_collections
  import numpy as np
  import optax
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from fedjax_dg.algorithms.base import make_schedule
  from fedjax_dg.algorithms.fedavg import fedavg
  from fedjax_dg.data.store import ClientStore
  from fedjax_dg.engine import init_round_state, make_round
  from fedjax_dg.models import build_model

  rate = matmul_rate(jax, jnp)
  n_dev = jax.local_device_count()
  print(f"backend {jax.default_backend()}, {n_dev} device(s), float32 matmul {rate / 1e9:.1f} GFLOP/s", flush=True)
  records = []
  for wname in args.workloads.split(","):
    w = WORKLOADS[wname]
    C, K, B = getattr(args, f"{wname}_clients"), w["steps"], w["batch"]
    n = K * B
    model = build_model(ml_collections.ConfigDict({"name": w["model"], "hidden": (200, 200)}), w["input_shape"], 10)
    params = model.init(jax.random.PRNGKey(0))
    x1 = jnp.zeros((1,) + w["input_shape"], jnp.float32)
    fwd = jax.jit(model.apply).lower(params, x1).compile().cost_analysis()
    fwd = fwd[0] if isinstance(fwd, list) else fwd
    flops = 3.0 * float(fwd["flops"]) * C * K * B
    rng = np.random.default_rng(0)
    store = ClientStore(rng.random((C, n) + w["input_shape"], dtype=np.float32),
                        rng.integers(0, 10, (C, n)).astype(np.int32), np.zeros((C, n), np.int32),
                        np.full(C, n, np.int32))
    store = jax.tree.map(jnp.asarray, store)
    unroll = True if jax.default_backend() == "cpu" else 1
    sched = make_schedule(B, K, 1, n, n, unroll=unroll)
    alg = fedavg(model, sched, optax.sgd(0.01), optax.sgd(1.0))
    results = {}
    for strategy in args.strategies.split(","):
      chunk = args.chunk_size or min(10, max(2, C // 2))
      rf = make_round(alg, C, C, strategy, chunk_size=chunk)
      state = init_round_state(alg, jax.random.PRNGKey(1), params, C)
      t = time.perf_counter()
      state, m = rf(state, store, jax.random.PRNGKey(0))
      jax.block_until_ready(state)
      compile_s = time.perf_counter() - t
      times = []
      for r in range(args.repeats):
        t = time.perf_counter()
        state, m = rf(state, store, jax.random.PRNGKey(r + 1))
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t)
      med = float(np.median(times))
      results[strategy] = med
      label = strategy if n_dev == 1 else f"{strategy}@{n_dev}dev"
      records.append({"workload": wname, "strategy": label, "clients": C, "chunk_size": chunk if strategy == "chunked" else None, "median_s": med,
                      "first_round_s": compile_s, "devices": n_dev,
                      "matmul_fraction": flops / med / rate, "model_gflop_per_round": flops / 1e9})
      print(f"  {wname:4s} {label:20s} median {med:8.3f} s/round  (first round {compile_s:6.1f} s)", flush=True)
  return records, rate


def main(argv=None):
  args = _args(argv)
  records, rate = run(args)
  if args.also_host_devices > 1:
    cmd = [sys.executable, os.path.abspath(__file__), "--workloads", args.workloads, "--strategies", args.strategies,
           "--chunk-size", str(args.chunk_size), "--repeats", str(args.repeats),
           "--cnn-clients", str(args.cnn_clients), "--mlp-clients", str(args.mlp_clients),
           "--host-devices", str(args.also_host_devices), "--out", "/tmp/_round_speed_multi.json"]
    subprocess.run(cmd, check=True)
    records += json.load(open("/tmp/_round_speed_multi.json"))["records"]
  # Ratios to the single-device sequential loop of the same workload.
  for r in records:
    base = [q["median_s"] for q in records if q["workload"] == r["workload"] and q["strategy"] == "sequential"]
    r["ratio_to_sequential"] = r["median_s"] / base[0] if base else None
  print("\nworkload strategy              s/round   x sequential   matmul fraction")
  for r in records:
    ratio = f"{r['ratio_to_sequential']:.2f}" if r["ratio_to_sequential"] else "-"
    print(f"{r['workload']:8s} {r['strategy']:20s} {r['median_s']:8.3f}   {ratio:>12s}   {r['matmul_fraction']:.3f}")
  if args.out:
    import jax
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
               "cpu_count": os.cpu_count(), "backend": jax.default_backend(),
               "devices": [str(d) for d in jax.devices()], "jax": jax.__version__,
               "float32_matmul_gflops": rate / 1e9}
    with open(args.out, "w") as f:
      json.dump({"machine": machine, "records": records}, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
