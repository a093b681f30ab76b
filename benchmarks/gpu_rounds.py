"""FedAvg rounds of four published workloads on one accelerator, against the PyTorch peer.

Each workload runs several variants of our round (execution strategy x convolution
`model.conv_impl` x computation `model.dtype`), then the PyTorch peer (torch_peer.py: the
reference codebases' loop, one client after another, float32) on the same GPU:

  cnn      DomainBed's MNIST CNN, 28x28x1, C = 100 clients, 5 local steps of batch 32;
  cifar    ResNet-18 on 32x32x3 in pfl-research's CIFAR-10 shape: 50 clients per round,
           50 examples each, batch 10, one local epoch (5 steps);
  femnist  FLUTE's FEMNIST CNN workload: 10 clients per round (of 3,400), batch 20, one
           local epoch; clients hold 240 examples (12 steps; LEAF's FEMNIST writers hold
           about 226 on average), 62 classes;
  pacs     the PACS shape: ResNet-50, 224x224x3, C = 100, batch 32, one local epoch over
           about 70 examples per client (PACS's ~7,000 training images / 100 clients):
           3 steps of 32 (the last batch of a 70-example epoch is partial; our epoch mode
           computes it padded, so 96 images per client is the work either way), 7 classes.

Data are random arrays of those shapes (speed does not depend on their values; images are
uint8 for the ResNets, float32 for the others). Seconds per round are medians over
`--repeats` rounds after one compiling round, synchronised. The peer may run on fewer
clients (`--peer-clients`): its clients are trained one after another, so its round time is
linear in the client count, and the record gives both the measured time and the time scaled
to the workload's C.

FLOPs are counted, not read from XLA's cost analysis (which counts no convolution on GPU):
walking the forward pass's jaxpr (XLA convolutions, float32), each convolution counts
2 x output elements x kernel height x width x input channels / groups, each dot_general
2 x lhs elements x rhs free size; a training example costs 3x its forward count (forward,
gradient w.r.t. inputs, gradient w.r.t. weights); elementwise work (normalisation,
activations, the optimizer) is not counted. A round is that times C x steps x batch.
Fractions are of the H100 SXM's dense datasheet rates, 989 TFLOP/s bf16 and 495 TF32
(`--bf16-peak`, `--tf32-peak`), and of the bf16 / float32 matmul rates measured here.

    python benchmarks/gpu_rounds.py --out /tmp/gpu_rounds.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

# name: model, clients, local steps, batch, input shape, classes, peer workload
WORKLOADS = {
    "cnn": dict(model="cnn", clients=100, steps=5, batch=32, shape=(28, 28, 1), classes=10, uint8=False),
    "cifar": dict(model="resnet18", clients=50, steps=5, batch=10, shape=(32, 32, 3), classes=10, uint8=True),
    "femnist": dict(model="femnist_cnn", clients=10, steps=12, batch=20, shape=(28, 28, 1), classes=62, uint8=False),
    "pacs": dict(model="resnet50", clients=100, steps=3, batch=32, shape=(224, 224, 3), classes=7, uint8=True),
}
# variant: strategy/conv_impl/dtype[/chunk]
DEFAULT_VARIANTS = {
    "cnn": "sequential/xla/float32,sequential/xla/bfloat16,vmap/xla/float32,vmap/gemm/float32,vmap/gemm/bfloat16,"
           "chunked/gemm/bfloat16/20",
    "cifar": "sequential/xla/float32,sequential/xla/bfloat16,vmap/gemm/float32,vmap/gemm/bfloat16,vmap/xla/bfloat16",
    "femnist": "sequential/xla/float32,sequential/xla/bfloat16,vmap/xla/float32,vmap/gemm/float32,vmap/gemm/bfloat16",
    "pacs": "sequential/xla/bfloat16,sequential/xla/float32,chunked/gemm/bfloat16/4",
}


def _args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workloads", default="cnn,femnist,cifar,pacs")
  for w in WORKLOADS:
    p.add_argument(f"--{w}-variants", default=DEFAULT_VARIANTS[w])
    p.add_argument(f"--{w}-clients", type=int, default=WORKLOADS[w]["clients"])
  p.add_argument("--size", type=int, default=0, help="override every image's height = width (smoke runs)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--pacs-repeats", type=int, default=2)
  p.add_argument("--peer", action="store_true")
  p.add_argument("--peer-python", default=sys.executable)
  p.add_argument("--peer-clients", default="cnn:100,femnist:10,cifar:50,pacs:10",
                 help="clients the peer trains per round, per workload; its time is scaled to the workload's C")
  p.add_argument("--peer-device", default="cuda")
  p.add_argument("--budget-s", type=float, default=540.0, help="skip what would start after this many seconds")
  p.add_argument("--bf16-peak", type=float, default=989e12)
  p.add_argument("--tf32-peak", type=float, default=495e12)
  p.add_argument("--out", required=True)
  return p.parse_args(argv)


def count_flops(jaxpr) -> float:
  """Convolution and dot_general FLOPs of a (closed) jaxpr, nested jaxprs included."""
  import numpy as np
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "conv_general_dilated":
      lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
      out = eqn.outvars[0].aval
      dn = eqn.params["dimension_numbers"]
      k_spatial = np.prod([rhs.shape[d] for d in dn.rhs_spec[2:]])
      cin = rhs.shape[dn.rhs_spec[1]]
      total += 2.0 * np.prod(out.shape) * k_spatial * cin
    elif name == "dot_general":
      lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
      (_, rc), (_, rb) = eqn.params["dimension_numbers"]
      free = np.prod([s for d, s in enumerate(rhs.shape) if d not in rc and d not in rb])
      total += 2.0 * np.prod(lhs.shape) * free
    for v in eqn.params.values():
      for inner in (v if isinstance(v, (list, tuple)) else (v,)):
        inner = getattr(inner, "jaxpr", inner)
        if hasattr(inner, "eqns"):
          total += count_flops(inner)
  return total


def matmul_rate(jax, jnp, dtype, n=8192, repeats=10) -> float:
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  ts = []
  for _ in range(repeats):
    t = time.perf_counter()
    f(a, b).block_until_ready()
    ts.append(time.perf_counter() - t)
  return 2 * n ** 3 / sorted(ts)[len(ts) // 2]


def gemm_check(jax, jnp):
  """GemmConv against lax.conv_general_dilated on this device (float32 and bfloat16)."""
  from jax import lax
  from fedjax_dg.models.conv import conv_gemm
  out = {}
  for dt in (jnp.float32, jnp.bfloat16):
    x = jax.random.normal(jax.random.PRNGKey(0), (8, 28, 28, 64), dt)
    k = jax.random.normal(jax.random.PRNGKey(1), (3, 3, 64, 128), dt) / 24
    ref = lax.conv_general_dilated(x.astype(jnp.float32), k.astype(jnp.float32), (2, 2), ((1, 1), (1, 1)),
                                   dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=lax.Precision.HIGHEST)
    y = conv_gemm(x, k, (2, 2), ((1, 1), (1, 1))).astype(jnp.float32)
    out[jnp.dtype(dt).name] = float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))
  return out


def run_peer(args, wname, w, size):
  clients = dict(kv.split(":") for kv in args.peer_clients.split(","))
  C = int(clients.get(wname, w["clients"]))
  cmd = [args.peer_python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_peer.py"),
         "--workload", w["model"] if w["model"] != "femnist_cnn" else "femnist_cnn", "--clients", str(C),
         "--steps", str(w["steps"]), "--batch", str(w["batch"]), "--classes", str(w["classes"]),
         "--repeats", str(args.pacs_repeats if wname == "pacs" else args.repeats), "--device", args.peer_device,
         "--threads", "1"]
  if size:
    cmd += ["--size", str(size)]
  r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  if r.returncode:
    return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1]}
  rec = json.loads(r.stdout.strip().splitlines()[-1])
  scale = getattr(args, f"{wname}_clients") / C
  rec.update(measured_clients=C, scale_to_workload=scale, median_s_scaled=rec["median_s"] * scale)
  return rec


def main(argv=None):
  args = _args(argv)
  t_start = time.perf_counter()
  import jax
  import jax.numpy as jnp
  import ml_collections
  import numpy as np
  import optax
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from fedjax_dg.algorithms.base import make_schedule
  from fedjax_dg import algorithms, default_config
  from fedjax_dg.data.store import ClientStore
  from fedjax_dg.engine import init_round_state, make_round
  from fedjax_dg.models import build_model

  machine = {"platform": platform.platform(), "backend": jax.default_backend(),
             "devices": [str(d) for d in jax.devices()], "device_kind": jax.devices()[0].device_kind,
             "jax": jax.__version__, "python": platform.python_version(), "cpu_count": os.cpu_count(),
             "xla_flags": os.environ.get("XLA_FLAGS", ""),
             "mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "")}
  import flax
  import jaxlib
  machine.update(jaxlib=jaxlib.__version__, flax=flax.__version__, optax=optax.__version__)
  try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60).stdout.strip()
    machine["nvidia_smi"] = smi
  except OSError:
    pass
  big = jax.default_backend() != "cpu"
  machine["bf16_matmul_tflops"] = matmul_rate(jax, jnp, jnp.bfloat16, 8192 if big else 512) / 1e12
  machine["f32_default_precision_matmul_tflops"] = matmul_rate(jax, jnp, jnp.float32, 8192 if big else 512) / 1e12
  machine["gemm_conv_rel_err_vs_lax_conv"] = gemm_check(jax, jnp)
  print(json.dumps(machine), flush=True)
  out = {"machine": machine, "argv": sys.argv[1:], "flops_counted": __doc__.split("FLOPs are counted")[1].split(
      "\n\n")[0].strip(), "records": [], "peer": {}}

  def save():
    with open(args.out, "w") as f:
      json.dump(out, f, indent=2)

  for wname in args.workloads.split(","):
    w = WORKLOADS[wname]
    C, K, B = getattr(args, f"{wname}_clients"), w["steps"], w["batch"]
    shape = w["shape"] if not args.size else (args.size, args.size, w["shape"][2])
    repeats = args.pacs_repeats if wname == "pacs" else args.repeats
    n = K * B
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, (C, n) + shape, dtype=np.uint8) if w["uint8"]
         else rng.random((C, n) + shape, dtype=np.float32))
    store = ClientStore(x, rng.integers(0, w["classes"], (C, n)).astype(np.int32), np.zeros((C, n), np.int32),
                        np.full(C, n, np.int32))
    store = jax.tree.map(jnp.asarray, store)
    del x
    fwd_model = build_model(ml_collections.ConfigDict({"name": w["model"]}), shape, w["classes"])
    p0 = jax.eval_shape(fwd_model.init, jax.random.PRNGKey(0))
    fwd = count_flops(jax.make_jaxpr(fwd_model.apply)(p0, jax.ShapeDtypeStruct((1,) + shape, jnp.float32)).jaxpr)
    flops = 3.0 * fwd * C * K * B
    print(f"{wname}: {w['model']} {shape} C={C} K={K} B={B}: {fwd / 1e9:.3f} GFLOP forward per example, "
          f"{flops / 1e12:.2f} TFLOP per round", flush=True)
    for variant in getattr(args, f"{wname}_variants").split(","):
      if time.perf_counter() - t_start > args.budget_s:
        print(f"  {variant}: skipped (budget)", flush=True)
        out["records"].append({"workload": wname, "variant": variant, "skipped": "time budget"})
        continue
      parts = variant.split("/")
      strategy, impl, dtype = parts[:3]
      chunk = int(parts[3]) if len(parts) > 3 else 1
      rec = {"workload": wname, "variant": variant, "model": w["model"], "strategy": strategy, "conv_impl": impl,
             "dtype": dtype, "chunk_size": chunk if strategy == "chunked" else None, "clients": C, "steps": K,
             "batch": B, "input_shape": shape, "classes": w["classes"], "tflop_per_round": flops / 1e12}
      try:
        model = build_model(ml_collections.ConfigDict({"name": w["model"], "conv_impl": impl, "dtype": dtype}),
                            shape, w["classes"])
        params = model.init(jax.random.PRNGKey(0))
        sched = make_schedule(B, K, 1, n, n, unroll=1)
        config = default_config()  # FedAvg: local SGD at 0.01 without momentum, server step 1
        config.client.lr, config.client.momentum = 0.01, 0.0
        alg = algorithms.build_algorithm(config, model, sched, C, C)
        rf = make_round(alg, C, C, strategy, chunk_size=chunk)
        state = init_round_state(alg, jax.random.PRNGKey(1), params, C)
        t = time.perf_counter()
        state, _ = rf(state, store, jax.random.PRNGKey(0))
        jax.block_until_ready(state)
        rec["first_round_s"] = time.perf_counter() - t
        times = []
        for r in range(repeats):
          t = time.perf_counter()
          state, _ = rf(state, store, jax.random.PRNGKey(r + 1))
          jax.block_until_ready(state)
          times.append(time.perf_counter() - t)
        med = float(np.median(times))
        rec["state_finite"] = bool(all(bool(jnp.isfinite(l).all()) for l in jax.tree.leaves(state)
                                       if jnp.issubdtype(l.dtype, jnp.floating)))
        rec.update(median_s=med, times=times, tflops=flops / med / 1e12, bf16_peak_fraction=flops / med / args.bf16_peak,
                   tf32_peak_fraction=flops / med / args.tf32_peak,
                   measured_bf16_matmul_fraction=flops / med / (machine["bf16_matmul_tflops"] * 1e12))
        del state, rf, alg, params
        print(f"  {variant:28s} {med:8.4f} s/round (first {rec['first_round_s']:6.1f} s)  {rec['tflops']:7.1f} "
              f"TFLOP/s  bf16 {rec['bf16_peak_fraction']:.3f}  tf32 {rec['tf32_peak_fraction']:.3f}", flush=True)
      except Exception as e:  # pylint: disable=broad-except
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        print(f"  {variant}: {rec['error']}", flush=True)
      out["records"].append(rec)
      save()
    del store
    if args.peer and time.perf_counter() - t_start < args.budget_s + 30:
      peer = run_peer(args, wname, w, args.size)
      ours = [r for r in out["records"] if r["workload"] == wname and "median_s" in r]
      if "median_s_scaled" in peer and ours:
        best = min(ours, key=lambda r: r["median_s"])
        peer.update(best_variant=best["variant"], ours_median_s=best["median_s"],
                    peer_over_ours=peer["median_s_scaled"] / best["median_s"],
                    peer_tflops=flops / peer["median_s_scaled"] / 1e12)
        for r in ours:
          r["peer_over_ours"] = peer["median_s_scaled"] / r["median_s"]
        print(f"  peer (torch, {peer['measured_clients']} clients) {peer['median_s']:.3f} s -> "
              f"{peer['median_s_scaled']:.3f} s at C={C}; best ours {best['variant']} {best['median_s']:.4f} s: "
              f"peer/ours {peer['peer_over_ours']:.2f}x", flush=True)
      else:
        print(f"  peer: {peer}", flush=True)
      out["peer"][wname] = peer
      save()
  out["total_s"] = time.perf_counter() - t_start
  save()
  print(f"wrote {args.out} ({out['total_s']:.0f} s)")


if __name__ == "__main__":
  main()
