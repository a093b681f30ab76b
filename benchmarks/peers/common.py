"""What every system in the peer comparison shares: the workloads, the data, the report.

Imported by `run.py` and by each system's side (`side_ours.py`, `side_pfl.py`,
`side_flower.py`), each in its own Python: it needs NumPy only.

Workloads (identical model, data sizes, optimizer, batch and local steps everywhere):
  A: the MLP 784-200-200-10, 1,000 clients x 20 examples, a cohort of 100 per round,
     1 local epoch of batch 10 (2 steps), SGD at 0.1, FedAvg (server step 1, clients
     weighted by examples), 20 rounds.
  B: DomainBed's MNIST CNN (28x28x1 inputs), 10 clients x 256 examples, every client in
     every round, 5 local steps of batch 32, SGD at 0.05, FedAvg, 3 rounds.

Data are synthetic and learnable: inputs uniform in [0, 1), labels the argmax of a fixed
random linear map of the inputs (a teacher), so every system's loss falls. They are
written once to two `.npy` files (`x` `[C * n, 28, 28, 1]` float32, `y` `[C * n]` int64,
client `c` owns rows `c * n ... c * n + n - 1`) that every system memory-maps, so no
system pays for generating them and each holds in memory what its design holds.

Each side prints JSON lines on stdout: `{"event": "start", "t": ...}` when its Python
starts running its script, `{"event": "round", "round": r, "t0": ..., "t1": ...}` around
every round, and `{"event": "done", "loss": ...}` with the final global model's mean
cross-entropy on the first `EVAL_EXAMPLES` examples. Times are `time.time()` seconds.
"""
from __future__ import annotations

import json
import os
import sys
import time

WORKLOADS = {
    "A": dict(model="mlp", clients=1000, examples=20, cohort=100, batch=10, epochs=1, steps=0, lr=0.1, rounds=20),
    "B": dict(model="cnn", clients=10, examples=256, cohort=10, batch=32, epochs=0, steps=5, lr=0.05, rounds=3),
}
INPUT_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
EVAL_EXAMPLES = 2000


def workload(name: str, clients: int | None = None, rounds: int | None = None) -> dict:
  """The workload `name` ("A" or "B"), with its client count or rounds replaced if given."""
  w = dict(WORKLOADS[name], name=name)
  if clients:
    w["clients"] = int(clients)
    w["cohort"] = min(w["cohort"], w["clients"])
  if rounds:
    w["rounds"] = int(rounds)
  return w


def local_steps(w: dict) -> int:
  """Local steps per client per round: `steps`, or `epochs` passes over `examples` in batches."""
  return w["steps"] if w["steps"] else w["epochs"] * -(-w["examples"] // w["batch"])


def data_paths(directory: str, w: dict) -> tuple[str, str]:
  stem = os.path.join(directory, f"{w['name']}_{w['clients']}x{w['examples']}")
  return stem + "_x.npy", stem + "_y.npy"


def write_data(directory: str, w: dict, seed: int = 0, chunk: int = 100_000) -> tuple[str, str]:
  """Writes the workload's synthetic data set (once; an existing file is kept) and
  returns its two paths."""
  import numpy as np
  xp, yp = data_paths(directory, w)
  if os.path.exists(xp) and os.path.exists(yp):
    return xp, yp
  os.makedirs(directory, exist_ok=True)
  n = w["clients"] * w["examples"]
  d = int(np.prod(INPUT_SHAPE))
  teacher = np.random.default_rng(seed + 1).standard_normal((d, NUM_CLASSES)).astype(np.float32)
  x = np.lib.format.open_memmap(xp + ".tmp", "w+", np.float32, (n,) + INPUT_SHAPE)
  y = np.lib.format.open_memmap(yp + ".tmp", "w+", np.int64, (n,))
  rng = np.random.default_rng(seed)
  for s in range(0, n, chunk):
    e = min(n, s + chunk)
    xs = rng.random((e - s, d), dtype=np.float32)
    x[s:e] = xs.reshape((e - s,) + INPUT_SHAPE)
    y[s:e] = np.argmax((xs - 0.5) @ teacher, axis=1)
  x.flush()
  y.flush()
  del x, y
  os.replace(xp + ".tmp", xp)
  os.replace(yp + ".tmp", yp)
  return xp, yp


def load_data(xp: str, yp: str):
  """The data set, memory-mapped read-only: (x `[N, 28, 28, 1]`, y `[N]`)."""
  import numpy as np
  return np.load(xp, mmap_mode="r"), np.load(yp, mmap_mode="r")


def emit(event: str, **fields) -> None:
  """One JSON line on stdout."""
  print(json.dumps({"event": event, **fields}), flush=True)


def side_args(argv=None):
  """The arguments every side takes: the workload as JSON and the two data paths."""
  import argparse
  p = argparse.ArgumentParser()
  p.add_argument("--workload", required=True, help="the workload as JSON (common.workload)")
  p.add_argument("--x", required=True)
  p.add_argument("--y", required=True)
  p.add_argument("--threads", type=int, default=os.cpu_count())
  p.add_argument("--variant", default="", help="a system-specific variant (e.g. ours: a strategy)")
  args = p.parse_args(argv)
  args.w = json.loads(args.workload)
  return args


def now() -> float:
  return time.time()


def fail(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)
  sys.exit(2)
