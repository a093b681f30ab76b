"""Times one FedAvg round for each client-execution strategy.

Workloads:
  cnn: C = 100 clients, 5 local steps, batch 32, DomainBed's MNIST CNN on 28x28 inputs;
  mlp: C = 1000 clients, 2 local steps, batch 10, an MLP 784-200-200-10.
Data are random arrays of the right shapes (speed does not depend on their values); each
client holds exactly `steps * batch` examples.

For each strategy it prints the median seconds per round over `--repeats` rounds (after
one compiling round), the ratio to the "sequential" per-client loop (the `lax.scan` over
single clients; > 1 means slower), and the fraction of the machine's measured float32
matmul rate that the round achieves, counting model FLOPs as 3x the forward pass's
convolution and matrix-product FLOPs (forward + backward) per example seen, counted from
the model's jaxpr (benchmarks/flops.py; XLA's cost analysis counts no convolution on GPU).
With more than one local device (e.g. `--host-devices 2` on CPU) the jitted strategies shard the client axis over devices and
"host_loop" dispatches clients round-robin to the devices.

    python benchmarks/round_speed.py --out benchmarks/results/round_speed_cpu.json

With `--peer`, the PyTorch peer (benchmarks/torch_peer.py: the same models, data shapes,
local steps, batch, SGD and FedAvg averaging, clients trained one after another as the
reference codebases do) runs in a subprocess under `--peer-python` (a Python with torch;
torch is not a dependency of this project, and the peer is skipped when that Python cannot
import it), with `torch.set_num_threads(--peer-threads)`. Its rounds are interleaved with
ours (one of ours, then one of the peer's, `--repeats` times per strategy), so both see
the same machine load; with `--peer-threads 2,1` one peer per thread count runs, and the
ratios use the fastest (on a loaded 2-core machine PyTorch's OpenMP threads can lose 10x
at 2 threads). Each record gets `peer_median_s` (the fastest peer's), `peer_threads` and
`peer_over_ours` (the peer's seconds over ours: > 1 means we are faster), and the JSON's
`peer` maps each workload to the peer's median, our fastest strategy and that ratio.

    python benchmarks/round_speed.py --workloads cnn --strategies host_loop --cnn-clients 10 \
        --peer --peer-python /tmp/torchvenv/bin/python --out benchmarks/results/round_speed_cpu_peer.json
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
  p.add_argument("--cnn-strategies", default=None, help="the cnn workload's strategies (default: --strategies)")
  p.add_argument("--mlp-strategies", default=None, help="the mlp workload's strategies (default: --strategies)")
  p.add_argument("--chunk-size", type=int, default=0, help="chunked strategy; 0: min(10, max(2, C // 2))")
  p.add_argument("--cnn-clients", type=int, default=100, help="clients in the cnn workload (default: 100)")
  p.add_argument("--mlp-clients", type=int, default=1000, help="clients in the mlp workload (default: 1000)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--host-devices", type=int, default=1, help="force N XLA host devices (CPU)")
  p.add_argument("--also-host-devices", type=int, default=0,
                 help="also rerun every strategy in a subprocess with this many host devices")
  p.add_argument("--peer", action="store_true", help="interleave the PyTorch peer's rounds (torch_peer.py)")
  p.add_argument("--peer-python", default=sys.executable, help="a Python that can import torch")
  p.add_argument("--peer-threads", default=str(os.cpu_count()),
                 help="torch.set_num_threads for the peer; a comma list runs one peer per value, interleaved, "
                      "and the ratio uses the fastest")
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


class Peer:
  """torch_peer.py in `--serve` mode: `round()` runs one of its rounds, returns seconds."""

  def __init__(self, python, workload, clients, steps, batch, threads):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_peer.py")
    self.proc = subprocess.Popen([python, script, "--workload", workload, "--clients", str(clients), "--steps",
                                  str(steps), "--batch", str(batch), "--threads", str(threads), "--serve"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    self.info = json.loads(self.proc.stdout.readline())["ready"]

  def round(self) -> float:
    self.proc.stdin.write("round\n")
    self.proc.stdin.flush()
    return json.loads(self.proc.stdout.readline())["s"]

  def close(self):
    self.proc.stdin.write("quit\n")
    self.proc.stdin.close()
    self.proc.wait()


def peer_available(python) -> str | None:
  """None if `python` imports torch, else why not."""
  try:
    r = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True, timeout=300)
  except OSError as e:
    return str(e)
  return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["import torch failed"])[-1]


def run(args):
  if args.host_devices > 1:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={args.host_devices}")
  import jax
  import jax.numpy as jnp
  import ml_collections
  import numpy as np
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from fedjax_dg.algorithms.base import make_schedule
  from fedjax_dg import algorithms, default_config
  from fedjax_dg.data.store import ClientStore
  from fedjax_dg.engine import init_round_state, make_round
  from fedjax_dg.models import build_model
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from flops import forward_flops, round_flops

  rate = matmul_rate(jax, jnp)
  n_dev = jax.local_device_count()
  print(f"backend {jax.default_backend()}, {n_dev} device(s), float32 matmul {rate / 1e9:.1f} GFLOP/s", flush=True)
  records, peers = [], {}
  if args.peer:
    why = peer_available(args.peer_python)
    if why:
      print(f"peer skipped: {args.peer_python} cannot import torch ({why})", flush=True)
      args.peer = False
  for wname in args.workloads.split(","):
    w = WORKLOADS[wname]
    C, K, B = getattr(args, f"{wname}_clients"), w["steps"], w["batch"]
    peer_list = [Peer(args.peer_python, wname, C, K, B, int(t)) for t in str(args.peer_threads).split(",")] if args.peer else []
    n = K * B
    model = build_model(ml_collections.ConfigDict({"name": w["model"], "hidden": (200, 200)}), w["input_shape"], 10)
    params = model.init(jax.random.PRNGKey(0))
    flops = round_flops(forward_flops(model, w["input_shape"]), C, K, B)
    rng = np.random.default_rng(0)
    store = ClientStore(rng.random((C, n) + w["input_shape"], dtype=np.float32),
                        rng.integers(0, 10, (C, n)).astype(np.int32), np.zeros((C, n), np.int32),
                        np.full(C, n, np.int32))
    store = jax.tree.map(jnp.asarray, store)
    unroll = True if jax.default_backend() == "cpu" else 1
    sched = make_schedule(B, K, 1, n, n, unroll=unroll)
    config = default_config()  # FedAvg: local SGD at 0.01 without momentum, server step 1
    config.client.lr, config.client.momentum = 0.01, 0.0
    alg = algorithms.build_algorithm(config, model, sched, C, C)
    results = {}
    for strategy in (getattr(args, f"{wname}_strategies") or args.strategies).split(","):
      chunk = args.chunk_size or min(10, max(2, C // 2))
      rf = make_round(alg, C, C, strategy, chunk_size=chunk)
      state = init_round_state(alg, jax.random.PRNGKey(1), params, C)
      t = time.perf_counter()
      state, m = rf(state, store, jax.random.PRNGKey(0))
      jax.block_until_ready(state)
      compile_s = time.perf_counter() - t
      times, peer_times = [], {p.info["threads"]: [] for p in peer_list}
      for r in range(args.repeats):
        t = time.perf_counter()
        state, m = rf(state, store, jax.random.PRNGKey(r + 1))
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t)
        for p in peer_list:
          peer_times[p.info["threads"]].append(p.round())
      med = float(np.median(times))
      results[strategy] = med
      label = strategy if n_dev == 1 else f"{strategy}@{n_dev}dev"
      rec = {"workload": wname, "strategy": label, "clients": C, "chunk_size": chunk if strategy == "chunked" else None,
             "median_s": med, "times": times, "first_round_s": compile_s, "devices": n_dev,
             "matmul_fraction": flops / med / rate, "model_gflop_per_round": flops / 1e9}
      peer_msg = ""
      if peer_list:  # the peer at its fastest thread count: the conservative ratio
        meds = {th: float(np.median(ts)) for th, ts in peer_times.items()}
        best_th = min(meds, key=meds.get)
        rec.update(peer_median_s=meds[best_th], peer_threads=best_th, peer_median_s_by_threads=meds,
                   peer_times_by_threads=peer_times, peer_over_ours=meds[best_th] / med)
        peer_msg = "  peer " + ", ".join(f"{v:.3f} s ({th} thr)" for th, v in meds.items())
        peer_msg += f"; peer/ours {rec['peer_over_ours']:.2f}x"
      records.append(rec)
      print(f"  {wname:4s} {label:20s} median {med:8.3f} s/round  (first round {compile_s:6.1f} s){peer_msg}", flush=True)
    if peer_list:  # our fastest strategy against the peer's rounds interleaved with it
      mine = [q for q in records if q["workload"] == wname and "peer_median_s" in q]
      best = min(mine, key=lambda q: q["median_s"])
      peers[wname] = {"peer_median_s": best["peer_median_s"], "peer_threads": best["peer_threads"],
                      "peer_median_s_by_threads": best["peer_median_s_by_threads"],
                      "peer": [p.info for p in peer_list], "peer_python": args.peer_python,
                      "best_strategy": best["strategy"], "ours_median_s": best["median_s"],
                      "peer_over_ours": best["peer_over_ours"]}
      for p in peer_list:
        p.close()
  return records, rate, peers


_LOAD_AT_START = os.getloadavg()


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor()


def main(argv=None):
  args = _args(argv)
  records, rate, peers = run(args)
  if args.also_host_devices > 1:
    cmd = [sys.executable, os.path.abspath(__file__), "--workloads", args.workloads, "--strategies", args.strategies,
           "--cnn-strategies", args.cnn_strategies or args.strategies,
           "--mlp-strategies", args.mlp_strategies or args.strategies,
           "--chunk-size", str(args.chunk_size), "--repeats", str(args.repeats),
           "--cnn-clients", str(args.cnn_clients), "--mlp-clients", str(args.mlp_clients),
           "--host-devices", str(args.also_host_devices), "--out", "/tmp/_round_speed_multi.json"]
    if args.peer:
      cmd += ["--peer", "--peer-python", args.peer_python, "--peer-threads", str(args.peer_threads)]
    subprocess.run(cmd, check=True)
    multi = json.load(open("/tmp/_round_speed_multi.json"))
    records += multi["records"]
    for wname, p in multi.get("peer", {}).items():  # the faster of ours over both runs
      if wname not in peers or p["ours_median_s"] < peers[wname]["ours_median_s"]:
        peers[wname] = p
  # Ratios to the single-device sequential loop of the same workload.
  for r in records:
    base = [q["median_s"] for q in records if q["workload"] == r["workload"] and q["strategy"] == "sequential"]
    r["ratio_to_sequential"] = r["median_s"] / base[0] if base else None
  print("\nworkload strategy              s/round   x sequential   matmul fraction")
  for r in records:
    ratio = f"{r['ratio_to_sequential']:.2f}" if r["ratio_to_sequential"] else "-"
    print(f"{r['workload']:8s} {r['strategy']:20s} {r['median_s']:8.3f}   {ratio:>12s}   {r['matmul_fraction']:.3f}")
  for wname, p in peers.items():
    print(f"peer {wname}: torch {p['peer_median_s']:.3f} s/round, ours ({p['best_strategy']}) {p['ours_median_s']:.3f} "
          f"s/round: peer/ours {p['peer_over_ours']:.2f}x (> 1: we are faster)")
  if args.out:
    import jax
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    machine = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
               "cpu_count": os.cpu_count(), "backend": jax.default_backend(),
               "devices": [str(d) for d in jax.devices()], "jax": jax.__version__,
               "float32_matmul_gflops": rate / 1e9}
    import flax
    import jaxlib
    import numpy
    machine.update(jaxlib=jaxlib.__version__, flax=flax.__version__, numpy=numpy.__version__,
                   xla_flags=os.environ.get("XLA_FLAGS", ""), load_average_at_start=_LOAD_AT_START,
                   load_average_at_end=os.getloadavg())
    machine["cpu_model"] = _cpu_model()
    out = {"machine": machine, "records": records}
    if peers:
      out["peer"] = peers
    with open(args.out, "w") as f:
      json.dump(out, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
