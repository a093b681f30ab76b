"""The accelerator measurements in one prepared command: six stages in priority order.

  cnn      DomainBed's MNIST CNN at C = 100 (5 local steps of batch 32): `sequential`, `vmap`
           and `chunked` rounds, XLA and GEMM convolutions (`model.conv_impl`), float32 and
           bfloat16 (`model.dtype`), against the PyTorch peer (benchmarks/torch_peer.py: one
           client after another, float32, the reference codebases' loop) on the same device;
  batched  the Fashion-MNIST report's MLP jobs (configs/sweeps/report_fmnist.py: an MLP
           784-256-10, Adam at 1e-3 on the clients, batch 64, one local epoch, C = 20 clients
           of 320 examples, 60 rounds; random data of that shape) as R = 1, 8, 64 runs in one
           program (`loop.batched_round`, `engine.run_axis = "vmap"`), runs per second against
           one run at a time in the same process; then the same on the machine's CPU cores;
  femnist  FLUTE's FEMNIST workload: LEAF's CNN, 62 classes, 3,400 clients of 240 examples,
           10 a round, batch 20, one local epoch (12 steps); seconds per round and 1,500 rounds
           extrapolated, against FLUTE's published 8 min 22 s (502 s, 4 processes) and
           FedML's 5 h 50 min (21,000 s);
  pacs     the PACS shape: ResNet-50 at 224x224, C = 100, 3 local steps of 32 (one epoch over
           ~70 examples, the last batch padded), 7 classes, batch norm in training mode on
           both sides (`model_config`), against Table 13 of Bai, Bagchi
           and Inouye, "Benchmarking Algorithms for Federated Domain Generalization", ICLR 2024
           (143 s a round for FedAvg on PACS at C = 100, hardware not given) and the PyTorch
           peer on a few clients scaled linearly to 100;
  cifar    pfl-research's CIFAR-10 shape: ResNet-18 at 32x32, 50 clients a round of 50
           examples, batch 10 (5 steps);
  bitwise  a run alone, the same run twice, inside a batch (`vmap` and `map` run axes), and
           resumed from a checkpoint (`fedjax_dg.checkpoint.Checkpoints`): equal state digests,
           or the largest difference; then the same in a child process under
           `--xla_gpu_deterministic_ops=true`, with its seconds per round.

Each stage writes `<out>/<stage>.json` (`--out`, default `$OUT`) after every record, so a run
cut off at its time limit still returns what it measured. Every JSON holds the environment
(device, driver, library versions). A timed record has seconds per round (median of
`--repeats`, synchronised, after the compiling round and one more), the first round's
seconds (compile + one round) and the second's, the device's peak memory so far in this process (`memory_stats()`, which cannot
be reset: stages and variants run smallest-memory first where it matters), the round
program's own memory plan (`program_memory`: XLA's arguments, outputs and temporaries), model FLOPs per
round counted from the jaxpr (benchmarks/flops.py: 3x the forward pass's convolution and
matrix-product FLOPs per training example; the MNIST CNN is 145.4 MFLOP forward, 6.98 TFLOP
a round at C = 100), and the fractions of the card's dense rates.

Peak rates: NVIDIA H100 SXM5, "NVIDIA H100 Tensor Core GPU" datasheet: bf16 1,979 TFLOP/s
and TF32 989 TFLOP/s with 2:4 sparsity, so 989 and 494.7 dense (`--bf16-peak`,
`--tf32-peak`). The bf16 matmul rate measured in the same process (8192^3) is recorded too.

Budgets: each stage stops starting variants when its budget (`--budget`, seconds) is spent,
and the whole stops starting stages after `--total-s`; the defaults fit one command in
8 minutes on an H100. `--only cnn,batched` runs those stages; `--variants
'cifar:vmap/gemm/bfloat16+sequential/xla/float32'` replaces a round stage's variants; `--trace`
profiles two more rounds of each timed variant and keeps in its record where their time
went, summed by operation per device and host (`benchmarks/trace_summary.py`), so the trace
itself need not come back.
`--smoke` runs every stage at toy sizes on any backend (tests/test_gpu_session.py runs it on
CPU: the stages cnn, batched, femnist and bitwise in the default suite, all six with -m slow).

On a GPU machine without a package index whose image lacks ml-collections
(benchmarks/gpu_wheels.sh, run first where PyPI is reachable, downloads it into .whl/), one
command with .whl/ copied beside the working tree, under a 540-second limit (the
editable install only records the package's metadata: the script imports fedjax_dg from the
tree either way):

  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || echo "editable install failed: fedjax_dg is imported from the tree"; PYTHONUNBUFFERED=1 timeout 470 python3 benchmarks/gpu_session.py --out $OUT 2>&1 | tee $OUT/gpu_session.log
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

STAGES = ("cnn", "batched", "femnist", "pacs", "cifar", "bitwise")
BUDGET_S = {"cnn": 120, "batched": 60, "femnist": 40, "pacs": 110, "cifar": 30, "bitwise": 40}
SMOKE_BUDGET_S = 600.0  # every stage, so that a slow CPU still runs every code path
BF16_PEAK, TF32_PEAK = 989e12, 494.7e12  # H100 SXM5 datasheet, dense (half the 2:4-sparse figures)
BASELINE_CNN_S = 0.235  # the earlier H100 run's `sequential` round (benchmarks/results/round_speed_gpu.json)
FLUTE_S, FEDML_S, FEMNIST_ROUNDS = 502.0, 5 * 3600 + 50 * 60, 1500
BAI_PACS_ROUND_S = 143.0  # Bai, Bagchi and Inouye, ICLR 2024, Table 13: FedAvg on PACS at C = 100
LIBRARIES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "flax", "optax", "orbax-checkpoint", "chex",
             "numpy", "scipy", "ml-collections", "torch", "torchvision", "fedjax-dg")

# workload: model, clients in the store, cohort, local steps, batch, input shape, classes, uint8 store
WORKLOADS = {
    "cnn": dict(model="cnn", clients=100, cohort=100, steps=5, batch=32, shape=(28, 28, 1), classes=10, uint8=False),
    "femnist": dict(model="femnist_cnn", clients=3400, cohort=10, steps=12, batch=20, shape=(28, 28, 1), classes=62,
                    uint8=True),
    "pacs": dict(model="resnet50", clients=100, cohort=100, steps=3, batch=32, shape=(224, 224, 3), classes=7,
                 uint8=True),
    "cifar": dict(model="resnet18", clients=50, cohort=50, steps=5, batch=10, shape=(32, 32, 3), classes=10,
                  uint8=True),
}
# Toy sizes: each stage's code on any backend in seconds. The PACS and CIFAR stages run the
# MNIST CNN on their uint8 stores (the ResNets take minutes to compile on a small CPU; the
# stage's code does not depend on the model, and tests/test_resnet.py checks the ResNets).
SMOKE = {
    "cnn": dict(clients=3, cohort=3, steps=2, batch=4, shape=(8, 8, 1)),
    "femnist": dict(clients=6, cohort=2, steps=2, batch=4, shape=(8, 8, 1)),
    "pacs": dict(model="cnn", clients=2, cohort=2, steps=1, batch=2, shape=(8, 8, 3)),
    "cifar": dict(model="cnn", clients=2, cohort=2, steps=1, batch=2, shape=(8, 8, 3)),
}
SMOKE_RUNS = (2,)
# variant: strategy/conv_impl/dtype[/chunk], cheapest in memory first
VARIANTS = {
    "cnn": ("sequential/xla/float32", "sequential/xla/bfloat16", "sequential/gemm/bfloat16", "chunked/gemm/bfloat16/20",
            "chunked/xla/float32/10", "vmap/xla/float32", "vmap/gemm/float32", "vmap/gemm/bfloat16"),
    "femnist": ("sequential/xla/float32", "sequential/xla/bfloat16", "vmap/xla/float32", "vmap/gemm/float32",
                "vmap/gemm/bfloat16"),
    "pacs": ("sequential/xla/bfloat16", "chunked/gemm/bfloat16/4", "sequential/xla/float32"),
    "cifar": ("sequential/xla/bfloat16", "vmap/gemm/bfloat16", "sequential/xla/float32", "vmap/xla/bfloat16"),
}
SMOKE_VARIANTS = {"cnn": ("chunked/gemm/bfloat16/2",),
                  "femnist": ("vmap/xla/float32",), "pacs": ("sequential/xla/bfloat16",),
                  "cifar": ("vmap/gemm/bfloat16",)}
PEER_CLIENTS = {"cnn": 100, "femnist": 10, "pacs": 10, "cifar": 50}
# The Fashion-MNIST report's MLP job (configs/sweeps/report_fmnist.py) on random data of its shape.
MLP_JOB = dict(hidden=(256,), clients=20, examples=320, batch=64, lr=1e-3, rounds=60, shape=(28, 28, 1), classes=10)


def _args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default=os.environ.get("OUT", ""), help="folder for the JSON files (default: $OUT)")
  p.add_argument("--only", default=",".join(STAGES), help=f"comma list of stages to run, of {', '.join(STAGES)}")
  p.add_argument("--smoke", action="store_true", help="toy sizes, every stage's code path, any backend")
  p.add_argument("--repeats", type=int, default=3, help="timed rounds after the compiling one")
  p.add_argument("--budget", default="", help="per-stage seconds, e.g. 'cnn:120,pacs:90' (default: BUDGET_S)")
  p.add_argument("--total-s", type=float, default=420.0, help="start no stage after this many seconds")
  p.add_argument("--runs", default="1,8,64", help="batched stage: runs per program (--smoke: 2)")
  p.add_argument("--no-peer", action="store_true", help="skip the PyTorch peer")
  p.add_argument("--variants", default="",
                 help="round stages' variants instead of the defaults, e.g. 'cifar:vmap/gemm/bfloat16+sequential/xla/float32'")
  p.add_argument("--trace", action="store_true",
                 help="after timing, profile two more rounds of each variant and keep where their time went "
                      "(benchmarks/trace_summary.py) in its record")
  p.add_argument("--bf16-peak", type=float, default=BF16_PEAK)
  p.add_argument("--tf32-peak", type=float, default=TF32_PEAK)
  p.add_argument("--deterministic-child", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if not args.out:
    p.error("--out: no output folder (and $OUT is unset)")
  bad = [s for s in args.only.split(",") if s not in STAGES]
  if bad:
    p.error(f"--only: unknown stage {bad[0]!r}; choose from {', '.join(STAGES)}")
  try:
    runs = [int(r) for r in args.runs.split(",")]
  except ValueError:
    p.error(f"--runs: a comma list of positive integers, got {args.runs!r}")
  if not runs or min(runs) < 1:
    p.error(f"--runs: a comma list of positive integers, got {args.runs!r}")
  args.runs = list(SMOKE_RUNS) if args.smoke else runs
  budget = {s: SMOKE_BUDGET_S for s in STAGES} if args.smoke else dict(BUDGET_S)
  for item in filter(None, args.budget.split(",")):
    stage, _, sec = item.partition(":")
    if stage not in STAGES or not sec.replace(".", "", 1).isdigit():
      p.error(f"--budget: expected stage:seconds with a stage of {', '.join(STAGES)}, got {item!r}")
    budget[stage] = float(sec)
  args.budget = budget
  variants = {}
  for item in filter(None, args.variants.split(",")):
    stage, _, names = item.partition(":")
    if stage not in VARIANTS or not names:
      p.error(f"--variants: expected stage:variant[+variant...] with a stage of {', '.join(VARIANTS)}, got {item!r}")
    try:
      for v in names.split("+"):
        parse_variant(v)
    except ValueError as e:
      p.error(f"--variants: {e}")
    variants[stage] = tuple(names.split("+"))
  args.variants = variants
  if args.repeats < 1:
    p.error(f"--repeats must be >= 1, got {args.repeats}")
  return args


# ----------------------------------------------------------------------------- environment

def _version(name: str) -> str | None:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def environment(jax) -> dict:
  """The device, its driver and the library versions (read from package metadata)."""
  dev = jax.devices()[0]
  env = {"backend": jax.default_backend(), "device_kind": dev.device_kind, "devices": [str(d) for d in jax.devices()],
         "platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
         "xla_flags": os.environ.get("XLA_FLAGS", ""),
         "mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", ""),
         "libraries": {n: _version(n) for n in LIBRARIES}}
  try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60)
    if smi.returncode == 0 and smi.stdout.strip():
      name, mem, driver = [s.strip() for s in smi.stdout.strip().splitlines()[0].split(",")]
      env.update(gpu=name, gpu_memory=mem, driver=driver)
  except (OSError, subprocess.SubprocessError, ValueError):
    pass
  return env


def matmul_rate(jax, dtype, n: int, repeats: int = 5) -> float:
  """FLOP/s of an `n x n x n` matrix product in `dtype` (median of `repeats` after a warm-up)."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  ts = []
  for _ in range(repeats):
    t = time.perf_counter()
    f(a, b).block_until_ready()
    ts.append(time.perf_counter() - t)
  return 2.0 * n ** 3 / sorted(ts)[len(ts) // 2]


def peak_bytes(jax, device=None) -> int | None:
  """The device's peak bytes in use so far in this process (None where not reported)."""
  stats = (device or jax.devices()[0]).memory_stats() or {}
  return stats.get("peak_bytes_in_use")


class Stage:
  """One stage's JSON file: records appended and written at once; its time budget."""

  def __init__(self, name: str, out: str, env: dict, budget_s: float, config: dict):
    self.path = os.path.join(out, f"{name}.json")
    self.doc = {"stage": name, "env": env, "budget_s": budget_s, "config": config, "records": []}
    self.deadline = time.perf_counter() + budget_s
    self.save()

  def left(self) -> float:
    return self.deadline - time.perf_counter()

  def add(self, rec: dict) -> dict:
    self.doc["records"].append(rec)
    self.save()
    return rec

  def save(self):
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(self.doc, f, indent=1, default=float)
    os.replace(tmp, self.path)


# ----------------------------------------------------------------------------- FedAvg rounds

def parse_variant(variant: str) -> dict:
  """"strategy/conv_impl/dtype[/chunk][/uK]" -> its fields; `uK` unrolls the local loop's
  scan by K (`engine.unroll`; default 1, a rolled scan)."""
  parts = variant.split("/")
  unroll = 1
  if len(parts) in (4, 5) and parts[-1][:1] == "u" and parts[-1][1:].isdigit() and int(parts[-1][1:]) >= 1:
    unroll = int(parts.pop()[1:])
  if (len(parts) not in (3, 4) or parts[0] not in ("sequential", "vmap", "chunked", "host_loop")
      or parts[1] not in ("xla", "gemm") or parts[2] not in ("float32", "bfloat16")
      or (len(parts) == 4 and not parts[3].isdigit())):
    raise ValueError(f"variant {variant!r}: expected strategy/conv_impl/dtype[/chunk][/uK], e.g. vmap/gemm/bfloat16 "
                     "or vmap/gemm/bfloat16/u5")
  return {"strategy": parts[0], "conv_impl": parts[1], "dtype": parts[2],
          "chunk_size": int(parts[3]) if len(parts) == 4 else 1, "unroll": unroll}


def random_store(jax, w: dict, seed: int = 0):
  """A ClientStore of random examples: `clients` clients of `steps x batch` examples each."""
  import numpy as np
  from fedjax_dg.data.store import ClientStore
  C, n = w["clients"], w["steps"] * w["batch"]
  rng = np.random.default_rng(seed)
  x = (rng.integers(0, 256, (C, n) + tuple(w["shape"]), dtype=np.uint8) if w["uint8"]
       else rng.random((C, n) + tuple(w["shape"]), dtype=np.float32))
  store = ClientStore(x, rng.integers(0, w["classes"], (C, n)).astype(np.int32), np.zeros((C, n), np.int32),
                      np.full(C, n, np.int32))
  return jax.device_put(store)


def fedavg(jax, model_config: dict, w: dict, strategy: str, chunk: int, optimizer: str = "sgd", lr: float = 0.01,
           device=None, unroll: int = 1):
  """(round_fn, algorithm, model) of FedAvg on workload `w`: local `optimizer` at `lr`
  (SGD without momentum, or Adam), server step 1, `steps` local steps of `batch` (their
  scan unrolled by `unroll`), on `device` (default: every device)."""
  import ml_collections
  from fedjax_dg import algorithms, default_config
  from fedjax_dg.algorithms.base import make_schedule
  from fedjax_dg.engine import make_round
  from fedjax_dg.models import build_model
  model = build_model(ml_collections.ConfigDict(model_config), tuple(w["shape"]), w["classes"])
  n = w["steps"] * w["batch"]
  sched = make_schedule(w["batch"], w["steps"], 1, n, n, unroll=unroll)
  config = default_config()
  config.client.optimizer, config.client.lr = optimizer, lr
  if optimizer == "sgd":
    config.client.momentum = 0.0
  alg = algorithms.build_algorithm(config, model, sched, w["clients"], w["cohort"])
  devices = None if device is None else [device]
  return make_round(alg, w["clients"], w["cohort"], strategy, chunk_size=chunk, devices=devices), alg, model


def model_config(w: dict, variant: dict) -> dict:
  """`config.model` of workload `w` in `variant`. The ResNets normalise by each batch's own
  statistics (`model.freeze_bn = False`): DomainBed's frozen statistics are meant for
  pretrained weights, and on a randomly initialised ResNet-50 they let SGD diverge (a first
  round's training loss near 1e9 and a non-finite state, in the first H100 run of the PACS
  stage and at 64x64 on CPU; still 1e4 with the frozen statistics set from a batch of data,
  while the training-mode network's first rounds stay near 4)."""
  mc = {"name": w["model"], "conv_impl": variant["conv_impl"], "dtype": variant["dtype"]}
  if w["model"].startswith("resnet"):
    mc["freeze_bn"] = False
  return mc


def _error_line(e: Exception) -> str:
  """"Type: the message's first line", at most 300 characters of it, for a record."""
  return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"


def finite(jax, tree) -> bool:
  import jax.numpy as jnp
  return all(bool(jnp.isfinite(l).all()) for l in jax.tree.leaves(tree) if jnp.issubdtype(l.dtype, jnp.floating))


def time_calls(jax, step, state, repeats: int):
  """(state, first call's seconds, second call's seconds, the timed calls' seconds) of
  `state = step(state, r)`.

  Two calls come before the timed ones: the compiling one, and one on a state the step
  itself returned (a round state whose types differ from the initial one in any way
  compiles again there, never inside the timed calls)."""
  t = time.perf_counter()
  state = step(state, 0)
  jax.block_until_ready(state)
  first = time.perf_counter() - t
  t = time.perf_counter()
  state = step(state, 1)
  jax.block_until_ready(state)
  second = time.perf_counter() - t
  times = []
  for r in range(repeats):
    t = time.perf_counter()
    state = step(state, r + 2)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t)
  return state, first, second, times


def trace_calls(jax, step, state, first_round: int, rounds: int = 2) -> dict:
  """Where `rounds` more calls of `step` spend their time: a profiler trace of them summed
  by operation (benchmarks/trace_summary.py), or {"error": ...}."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from trace_summary import summarize_trace
  try:
    with tempfile.TemporaryDirectory() as d:
      with jax.profiler.trace(d, create_perfetto_trace=True):
        for r in range(rounds):
          state = step(state, first_round + r)
          jax.block_until_ready(state)
      return summarize_trace(d, rounds)
  except Exception as e:  # pylint: disable=broad-except  # a failed trace leaves the timing standing
    return {"error": _error_line(e)}


def program_memory(compiled_fn, *call_args) -> dict:
  """XLA's memory plan for one compiled program (`memory_analysis()` of `compiled_fn`, a
  `jax.jit` function, lowered on `call_args`; after a call on the same arguments the
  compilation is cached, so this costs no second compile): its arguments, outputs and
  temporaries in bytes, and `total_bytes` = arguments + outputs + temporaries - aliased.
  Unlike the device's peak (`peak_bytes`, the process's peak so far), it is this program's
  own. {"error": ...} where it cannot be read."""
  try:
    m = compiled_fn.lower(*call_args).compile().memory_analysis()
    out = {k: int(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "temp", "alias")}
  except Exception as e:  # pylint: disable=broad-except  # the timing stands without it
    return {"error": _error_line(e)}
  out["total_bytes"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
  return out


def rates(flop: float, seconds: float, args) -> dict:
  """TFLOP/s and the fractions of the dense bf16 and TF32 rates."""
  return {"tflops": flop / seconds / 1e12, "bf16_peak_fraction": flop / seconds / args.bf16_peak,
          "tf32_peak_fraction": flop / seconds / args.tf32_peak}


def time_variant(jax, w: dict, variant: str, store, flop: float, args) -> dict:
  """One variant's round on workload `w`: seconds, compile, memory, FLOP rates."""
  import numpy as np
  from fedjax_dg.engine import init_round_state
  v = parse_variant(variant)
  rec = {"variant": variant, **v, "model": w["model"], "clients": w["clients"], "cohort": w["cohort"],
         "steps": w["steps"], "batch": w["batch"], "input_shape": list(w["shape"]), "classes": w["classes"],
         "flop_per_round": flop}
  rf, alg, model = fedavg(jax, model_config(w, v), w, v["strategy"], v["chunk_size"], unroll=v["unroll"])
  state = init_round_state(alg, jax.random.PRNGKey(1), model.init(jax.random.PRNGKey(0)), w["clients"])
  placed = getattr(rf, "place", lambda s: s)(store)
  step = lambda s, r: rf(s, placed, jax.random.PRNGKey(r))[0]
  state, first, second, times = time_calls(jax, step, state, args.repeats)
  med = float(np.median(times))
  rec.update(median_s=med, times=times, first_round_s=first, second_round_s=second, peak_bytes=peak_bytes(jax),
             state_finite=finite(jax, state),
             **rates(flop, med, args))
  if hasattr(getattr(rf, "_device", None), "lower"):  # the jitted strategies' round program
    rec["program_memory"] = program_memory(rf._device, state, placed, jax.random.PRNGKey(0), None)
  if args.trace:
    rec["trace"] = trace_calls(jax, step, state, args.repeats + 2)
  return rec


def workload(name: str, smoke: bool) -> dict:
  w = dict(WORKLOADS[name])
  if smoke:
    w.update(SMOKE[name])
  return w


def peer(name: str, w: dict, clients: int, repeats: int, device: str, timeout: float) -> dict:
  """benchmarks/torch_peer.py on `clients` clients of workload `w`, its time scaled to the cohort."""
  why = None
  try:
    r = subprocess.run([sys.executable, "-c", "import torch, torchvision"], capture_output=True, text=True, timeout=120)
    if r.returncode:
      why = (r.stderr.strip().splitlines() or ["import torch failed"])[-1]
  except (OSError, subprocess.SubprocessError) as e:
    why = str(e)
  if why:
    return {"skipped": f"{sys.executable} cannot import torch and torchvision ({why})"}
  cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_peer.py"),
         "--workload", w["model"], "--clients", str(clients), "--steps", str(w["steps"]), "--batch", str(w["batch"]),
         "--classes", str(w["classes"]), "--repeats", str(repeats), "--device", device, "--threads", "1",
         "--size", str(w["shape"][0])] + (["--bn", "train"] if w["model"].startswith("resnet") else [])
  try:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout, 10.0))
  except subprocess.TimeoutExpired:
    return {"error": f"the peer ran past {timeout:.0f} s", "command": cmd[1:]}
  if r.returncode:
    return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1], "command": cmd[1:]}
  rec = json.loads(r.stdout.strip().splitlines()[-1])
  scale = w["cohort"] / clients
  rec.update(measured_clients=clients, scale_to_cohort=scale, median_s_scaled=rec["median_s"] * scale)
  return rec


def round_stage(jax, name: str, args, env: dict) -> dict:
  """Stages cnn, femnist, pacs, cifar: every variant's round, then the peer, then the goals."""
  from fedjax_dg.models import build_model
  import ml_collections
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from flops import forward_flops, round_flops
  w = workload(name, args.smoke)
  fwd = forward_flops(build_model(ml_collections.ConfigDict({"name": w["model"]}), tuple(w["shape"]), w["classes"]),
                      w["shape"])
  flop = round_flops(fwd, w["cohort"], w["steps"], w["batch"])
  st = Stage(name, args.out, env, args.budget[name], {**w, "forward_flop_per_example": fwd, "flop_per_round": flop})
  print(f"[{name}] {w['model']} {tuple(w['shape'])} C={w['cohort']} of {w['clients']} K={w['steps']} B={w['batch']}: "
        f"{fwd / 1e9:.4f} GFLOP forward per example, {flop / 1e12:.3f} TFLOP per round", flush=True)
  store = random_store(jax, w)
  peer_reserve = 0.0 if args.no_peer else 0.25 * args.budget[name]
  for variant in args.variants.get(name) or (SMOKE_VARIANTS if args.smoke else VARIANTS)[name]:
    if st.left() < peer_reserve:
      st.add({"variant": variant, "skipped": "stage budget"})
      print(f"  {variant}: skipped (stage budget)", flush=True)
      continue
    try:
      rec = st.add(time_variant(jax, w, variant, store, flop, args))
      print(f"  {variant:28s} {rec['median_s']:9.4f} s/round (first {rec['first_round_s']:6.1f} s) "
            f"{rec['tflops']:8.2f} TFLOP/s  bf16 {rec['bf16_peak_fraction']:.3f}  tf32 {rec['tf32_peak_fraction']:.3f}"
            + ("" if rec["state_finite"] else "  STATE NOT FINITE: timed a diverged computation"), flush=True)
    except Exception as e:  # pylint: disable=broad-except  # one variant's failure is a record, not the end
      st.add({"variant": variant, "error": _error_line(e)})
      print(f"  {variant}: {st.doc['records'][-1]['error']}", flush=True)
  del store
  if args.no_peer:
    st.doc["peer"] = {"skipped": "--no-peer"}
  elif args.smoke and name != "cnn":  # torch_peer.py's models read their full-size inputs only
    st.doc["peer"] = {"skipped": "smoke: toy inputs the peer's model does not take"}
  else:
    device = "cuda" if jax.default_backend() == "gpu" else "cpu"
    clients = min(PEER_CLIENTS[name], w["cohort"])
    st.doc["peer"] = peer(name, w, clients, args.repeats, device, max(st.left(), 30.0))
    if "median_s_scaled" in st.doc["peer"]:
      st.doc["peer"].update(rates(flop, st.doc["peer"]["median_s_scaled"], args))
  st.doc["summary"] = summarize(name, st.doc, flop, fwd, args)
  st.save()
  print(f"  summary: {json.dumps(st.doc['summary'])}", flush=True)
  return st.doc


def summarize(name: str, doc: dict, flop: float, fwd: float, args) -> dict:
  """The fastest variant, the peer's ratio and the issue's goals for a round stage."""
  timed = [r for r in doc["records"] if "median_s" in r]
  if not timed:
    return {"timed_variants": 0}
  best = min(timed, key=lambda r: r["median_s"])
  s = {"timed_variants": len(timed), "best_variant": best["variant"], "best_median_s": best["median_s"],
       "best_tflops": best["tflops"], "best_bf16_peak_fraction": best["bf16_peak_fraction"],
       "all_states_finite": all(r["state_finite"] for r in timed)}
  p = doc.get("peer", {})
  if "median_s_scaled" in p:
    s["peer_over_best"] = p["median_s_scaled"] / best["median_s"]
  if name == "cnn":
    s["baseline_over_best"] = BASELINE_CNN_S / best["median_s"]
    s["goals"] = {"peer_over_best_at_least_10": s.get("peer_over_best", math.nan) >= 10,
                  "baseline_0.235s_over_best_at_least_5": s["baseline_over_best"] >= 5}
  elif name == "femnist":
    s["rounds_1500_s"] = FEMNIST_ROUNDS * best["median_s"]
    s["flute_over_ours"] = FLUTE_S / s["rounds_1500_s"]
    s["fedml_over_ours"] = FEDML_S / s["rounds_1500_s"]
    s["goals"] = {"rounds_1500_under_30s": s["rounds_1500_s"] < 30}
  elif name == "pacs":
    s["bai_table13_over_best"] = BAI_PACS_ROUND_S / best["median_s"]
    s["goals"] = {"round_under_3s": best["median_s"] < 3, "bf16_fraction_at_least_0.15": best["bf16_peak_fraction"] >= 0.15}
  return s


# ----------------------------------------------------------------------------- batched runs

def batched_stage(jax, args, env: dict) -> dict:
  """R runs of the MLP job in one vmapped program against one run at a time, on the default
  device and then on the CPU."""
  job = dict(MLP_JOB)
  if args.smoke:
    job.update(hidden=(16,), clients=3, examples=8, batch=4, rounds=2)
  st = Stage("batched", args.out, env, args.budget["batched"], {**job, "runs": args.runs})
  devices = [("default", jax.devices()[0])]
  if jax.default_backend() != "cpu":
    devices.append(("cpu", jax.devices("cpu")[0]))
  for where, device in devices:
    # the accelerator gets 2/3 of the budget; the CPU reference what is left
    until = st.deadline - (args.budget["batched"] / 3 if where == "default" and len(devices) > 1 else 0)
    with jax.default_device(device):
      recs = batched_on(jax, job, args, device, until, st, where)
    alone = next((r for r in recs if r.get("mode") == "alone" and "runs_per_s" in r), None)
    for r in recs:
      if alone and "runs_per_s" in r:
        r["speedup_over_alone"] = r["runs_per_s"] / alone["runs_per_s"]
    st.save()
  summary = {}
  for r in st.doc["records"]:
    if "speedup_over_alone" in r and r["mode"] == "vmap":
      summary[f"{r['where']}_R{r['runs']}_speedup"] = r["speedup_over_alone"]
  top = [r for r in st.doc["records"] if r.get("where") == "default" and "speedup_over_alone" in r and r["mode"] == "vmap"]
  if top:
    best = max(top, key=lambda r: r["runs"])
    summary["goals"] = {f"R{best['runs']}_at_least_20x_alone": best["speedup_over_alone"] >= 20}
  st.doc["summary"] = summary
  st.save()
  print(f"  summary: {json.dumps(summary)}", flush=True)
  return st.doc


def batched_on(jax, job: dict, args, device, until: float, st: Stage, where: str) -> list:
  """The alone round and R = `args.runs` vmapped rounds on `device` (the default device)."""
  import jax.numpy as jnp
  import numpy as np
  from fedjax_dg import loop
  from fedjax_dg.engine import init_round_state
  w = dict(model="mlp", clients=job["clients"], cohort=job["clients"], steps=job["examples"] // job["batch"],
           batch=job["batch"], shape=job["shape"], classes=job["classes"], uint8=False)
  rf, alg, model = fedavg(jax, {"name": "mlp", "hidden": job["hidden"]}, w, "vmap", 1, "adam", job["lr"], device)
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from flops import forward_flops, round_flops
  flop1 = round_flops(forward_flops(model, w["shape"]), w["cohort"], w["steps"], w["batch"])
  store = random_store(jax, w)
  out = []

  def init(seed):
    return init_round_state(alg, jax.random.PRNGKey(1000 + seed), model.init(jax.random.PRNGKey(seed)), w["clients"])

  plan = [("alone", 1)] + [("vmap", r) for r in args.runs]
  for mode, R in plan:
    base = {"where": where, "device": str(device), "mode": mode, "runs": R, "rounds_per_run": job["rounds"]}
    if time.perf_counter() > until:
      out.append(st.add({**base, "skipped": "stage budget"}))
      continue
    try:
      if mode == "alone":
        state = init(0)
        fn = lambda s, r: rf(s, store, jax.random.PRNGKey(r))[0]
      else:
        bstep = loop.batched_round(rf, None, "vmap")
        state = loop.stack([init(i) for i in range(R)])
        active = jnp.ones((R,), bool)
        fn = lambda s, r, R=R, bstep=bstep, active=active: bstep(
            s, store, jax.random.split(jax.random.PRNGKey(r), R), active)[0]
      state, first, second, times = time_calls(jax, fn, state, args.repeats)
      med = float(np.median(times))
      rec = {**base, "median_s_per_round": med, "times": times, "first_round_s": first,
             "second_round_s": second,
             "runs_per_s": R / (med * job["rounds"]), "flop_per_round": flop1 * R,
             "peak_bytes": peak_bytes(jax, device), "state_finite": finite(jax, state), **rates(flop1 * R, med, args)}
      if args.trace:
        rec["trace"] = trace_calls(jax, fn, state, args.repeats + 2)
      print(f"  [{where}] {mode:5s} R={R:3d} {med:9.5f} s/round  {rec['runs_per_s']:9.3f} runs/s "
            f"(first {first:5.1f} s)", flush=True)
    except Exception as e:  # pylint: disable=broad-except
      rec = {**base, "error": _error_line(e)}
      print(f"  [{where}] {mode} R={R}: {rec['error']}", flush=True)
    out.append(st.add(rec))
  return out


# ----------------------------------------------------------------------------- bitwise checks

def max_abs_diff(jax, a, b) -> float:
  import numpy as np
  d = [float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) if np.size(x) else 0.0
       for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
       if np.issubdtype(np.asarray(x).dtype, np.floating)]
  return max(d) if d else 0.0


def bitwise_stage(jax, args, env: dict) -> dict:
  """One CNN run alone, twice; inside a batch of 4 (vmap and map run axes); resumed from a
  checkpoint at half way. Compared by state digest (SHA-256 of every leaf's bytes) and the
  largest absolute difference of the final round state and metrics."""
  import numpy as np
  from fedjax_dg import loop
  from fedjax_dg.checkpoint import Checkpoints, state_digest
  from fedjax_dg.engine import init_round_state
  w = dict(WORKLOADS["cnn"], clients=8, cohort=8, steps=2, batch=16)
  rounds = 4
  if args.smoke:
    w.update(clients=2, cohort=2, steps=1, batch=2, shape=(4, 4, 1))
    rounds = 2
  name = "bitwise_deterministic" if args.deterministic_child else "bitwise"
  st = Stage(name, args.out, env, args.budget["bitwise"], {**w, "rounds": rounds, "batch_runs": 4})
  rf, alg, model = fedavg(jax, {"name": "cnn"}, w, "vmap", 1)
  store = random_store(jax, w)
  k_run = jax.random.PRNGKey(7)

  def init(seed):
    return init_round_state(alg, jax.random.PRNGKey(1000 + seed), model.init(jax.random.PRNGKey(seed)), w["clients"])

  step = lambda s, k: rf(s, store, k)

  def alone(state, start, stop):
    m = None
    for t in range(start, stop):
      state, m = step(state, jax.random.fold_in(k_run, t))
    return jax.block_until_ready(state), m

  results = {}
  t = time.perf_counter()
  a_state, a_m = alone(init(0), 0, rounds)
  results["alone_first_s"] = time.perf_counter() - t
  ref = state_digest(a_state)
  _, _, _, times = time_calls(jax, lambda s, r: step(s, jax.random.fold_in(k_run, r))[0], init(0), args.repeats)
  results["alone_round_median_s"] = float(np.median(times))

  def compare(label, state, metrics):
    rec = {"check": label, "identical": state_digest(state) == ref, "max_abs_diff_state": max_abs_diff(jax, a_state, state),
           "max_abs_diff_metrics": max_abs_diff(jax, a_m, metrics)}
    print(f"  {label:24s} identical {rec['identical']}  max |diff| state {rec['max_abs_diff_state']:.3g} "
          f"metrics {rec['max_abs_diff_metrics']:.3g}", flush=True)
    st.add(rec)

  b_state, b_m = alone(init(0), 0, rounds)
  compare("alone_again", b_state, b_m)
  # the child under deterministic ops repeats the checks that can differ (on CPU smoke: none)
  axes = ("vmap", "map") if not args.deterministic_child else (() if args.smoke else ("vmap",))
  for axis in axes:
    if st.left() < 0:
      st.add({"check": f"batch_{axis}", "skipped": "stage budget"})
      continue
    bstep = loop.batched_round(rf, None, axis)
    states = loop.stack([init(0)] + [init(i) for i in (1, 2, 3)])
    active = np.ones((4,), bool)
    m = None
    for t_ in range(rounds):
      keys = jax.numpy.stack([jax.random.fold_in(k_run, t_)] + [jax.random.fold_in(jax.random.PRNGKey(i), t_)
                                                               for i in (1, 2, 3)])
      states, m = bstep(states, store, keys, active)
    compare(f"batch_{axis}_slot0", loop.pick(states, 0), loop.pick(m, 0))
  if args.deterministic_child and args.smoke:
    pass
  elif st.left() < 0:
    st.add({"check": "resumed", "skipped": "stage budget"})
  else:
    half = rounds // 2
    s_half, _ = alone(init(0), 0, half)
    with tempfile.TemporaryDirectory() as d:
      ck = Checkpoints(d)
      ck.save(half, s_half)
      ck.close()
      ck = Checkpoints(d)
      step_found, restored = ck.restore_latest(lambda s: s_half)
      ck.close()
    r_state, r_m = alone(restored, step_found, rounds)
    compare("resumed_from_checkpoint", r_state, r_m)
  st.doc["summary"] = {**results, "all_identical": all(r.get("identical", False) for r in st.doc["records"]),
                       "state_digest": ref}
  st.save()
  if not args.deterministic_child:
    st.doc["deterministic_ops"] = deterministic_child(args, st.left())
    d = st.doc["deterministic_ops"]
    if "summary" in d:
      d["cost_over_default"] = d["summary"]["alone_round_median_s"] / results["alone_round_median_s"]
    st.save()
  print(f"  summary: {json.dumps(st.doc['summary'])}", flush=True)
  return st.doc


def deterministic_child(args, left: float) -> dict:
  """The bitwise stage again in a child process under `--xla_gpu_deterministic_ops=true`."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_gpu_deterministic_ops=true").strip()
  env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.1"  # the parent holds the default 75% of the device
  with tempfile.TemporaryDirectory() as d:
    cmd = [sys.executable, os.path.abspath(__file__), "--only", "bitwise", "--deterministic-child", "--out", d,
           "--repeats", str(args.repeats)] + (["--smoke"] if args.smoke else [])
    try:
      r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(left, 60.0), env=env)
    except subprocess.TimeoutExpired:
      return {"error": f"the child ran past {max(left, 60.0):.0f} s", "xla_flags": env["XLA_FLAGS"]}
    path = os.path.join(d, "bitwise_deterministic.json")
    if r.returncode or not os.path.exists(path):
      return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1], "xla_flags": env["XLA_FLAGS"]}
    with open(path) as f:
      doc = json.load(f)
  return {"xla_flags": env["XLA_FLAGS"], "records": doc["records"], "summary": doc.get("summary", {})}


# ----------------------------------------------------------------------------- main

def main(argv=None):
  args = _args(argv)
  t0 = time.perf_counter()
  os.makedirs(args.out, exist_ok=True)
  if not args.smoke:  # first rounds then time compilation, not a read of an earlier run's cache
    os.environ.setdefault("FEDJAX_DG_COMPILATION_CACHE", "off")
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax
  import jax.numpy as jnp
  env = environment(jax)
  if args.deterministic_child:
    bitwise_stage(jax, args, env)
    return
  big = jax.default_backend() != "cpu"
  env["bf16_matmul_tflops"] = matmul_rate(jax, jnp.bfloat16, 8192 if big else 256) / 1e12
  env["f32_matmul_tflops_default_precision"] = matmul_rate(jax, jnp.float32, 8192 if big else 256) / 1e12
  env["peaks"] = {"bf16_dense": args.bf16_peak, "tf32_dense": args.tf32_peak,
                  "source": "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM5: half the with-sparsity figures"}
  env["smoke"] = args.smoke
  env["argv"] = sys.argv[1:] if argv is None else list(argv)
  print(json.dumps(env), flush=True)
  runners = {"cnn": lambda: round_stage(jax, "cnn", args, env), "batched": lambda: batched_stage(jax, args, env),
             "femnist": lambda: round_stage(jax, "femnist", args, env),
             "pacs": lambda: round_stage(jax, "pacs", args, env),
             "cifar": lambda: round_stage(jax, "cifar", args, env), "bitwise": lambda: bitwise_stage(jax, args, env)}
  for stage in STAGES:
    if stage not in args.only.split(","):
      continue
    if time.perf_counter() - t0 > args.total_s:
      print(f"[{stage}] skipped: past --total-s {args.total_s:.0f} s", flush=True)
      continue
    t = time.perf_counter()
    try:
      runners[stage]()
    except Exception as e:  # pylint: disable=broad-except  # the next stage still runs
      path = os.path.join(args.out, f"{stage}.json")
      doc = {"stage": stage, "env": env}
      if os.path.exists(path):  # keep what the stage measured before it failed
        with open(path) as f:
          doc = json.load(f)
      doc["error"] = f"{type(e).__name__}: {str(e)[:500]}"
      with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=float)
      print(f"[{stage}] failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}", flush=True)
    print(f"[{stage}] done in {time.perf_counter() - t:.1f} s", flush=True)
  print(f"all done in {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
  main()
