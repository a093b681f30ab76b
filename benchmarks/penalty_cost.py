"""What a DG penalty adds to a local step: CORAL's two covariance forms and MMD against ERM.

For each workload it times one jitted gradient step (value and gradient of the mean
cross-entropy, plus the penalty where one is named) on a fixed batch, `--repeats` times
after one compiling call, and prints the median milliseconds per step and the ratio to the
ERM step. `coral/moments` forms the slots' covariances ([S, d, d]); `coral/gram` reads the
same sums off the rows' Gram matrix ([N, N]), which `mean_pairwise_coral` takes where it is
the cheaper (`covariance="auto"`).

    python benchmarks/penalty_cost.py --out benchmarks/results/penalty_cost_cpu.json

Workloads: `mlp`, the Fashion-MNIST report's MLP (28 x 28 inputs, one hidden layer of 256,
10 classes) on a batch of 64 rows from 6 domains, the gradient taken in its parameters;
`resnet50_features`, ResNet-50's 2,048 features of a batch of 32 rows from 3 domains under
a linear head of 7 classes (PACS' shape), the gradient taken in the features and the head.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

WORKLOADS = {"mlp": dict(rows=64, inputs=784, hidden=256, classes=10, domains=6),
             "resnet50_features": dict(rows=32, inputs=0, hidden=2048, classes=7, domains=3)}
PENALTIES = ("erm", "coral/moments", "coral/gram", "mmd")


def _args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma separated")
  p.add_argument("--repeats", type=int, default=50)
  p.add_argument("--out", default="", help="write the JSON here")
  return p.parse_args(argv)


def step_fn(w: dict, penalty: str):
  """`(params, batch) -> (loss, grads)`, jitted: ERM's mean cross-entropy plus `penalty`."""
  import jax
  import jax.numpy as jnp
  import optax
  from fedjax_dg import objectives

  def loss(params, x, y, slot, mask):
    z = jax.nn.relu(x @ params["hidden"]) if w["inputs"] else params["features"]
    ce = jnp.mean(optax.softmax_cross_entropy_with_integer_labels(z @ params["head"], y))
    if penalty == "erm":
      return ce
    if penalty == "mmd":
      return ce + objectives.mean_pairwise_mmd(z, slot, mask, w["domains"])
    return ce + objectives.mean_pairwise_coral(z, slot, mask, w["domains"], covariance=penalty.split("/")[1])
  return jax.jit(jax.value_and_grad(loss))


def inputs(w: dict):
  import jax
  import jax.numpy as jnp
  k = jax.random.split(jax.random.PRNGKey(0), 5)
  n, d = w["rows"], w["hidden"]
  params = {"head": jax.random.normal(k[0], (d, w["classes"])) / d ** 0.5}
  if w["inputs"]:
    params["hidden"] = jax.random.normal(k[1], (w["inputs"], d)) / w["inputs"] ** 0.5
    x = jax.random.uniform(k[2], (n, w["inputs"]))
  else:
    params["features"] = jax.nn.relu(jax.random.normal(k[1], (n, d)))
    x = jnp.zeros((n, 0))
  y = jax.random.randint(k[3], (n,), 0, w["classes"])
  slot = jnp.arange(n) % w["domains"]  # every domain present, rows interleaved
  return params, x, y, slot, jnp.ones(n)


def time_step(fn, args, repeats: int) -> float:
  import jax
  jax.block_until_ready(fn(*args))  # compile
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def main(argv=None) -> dict:
  a = _args(argv)
  import jax
  out = {"command": "python benchmarks/penalty_cost.py " + " ".join(sys.argv[1:] if argv is None else argv),
         "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "device": str(jax.devices()[0]),
                     "jax": jax.__version__, "load_before": os.getloadavg()}, "workloads": {}}
  for name in a.workloads.split(","):
    w = WORKLOADS[name]
    args = inputs(w)
    ms = {p: 1e3 * time_step(step_fn(w, p), args, a.repeats) for p in PENALTIES}
    out["workloads"][name] = {"shape": w, "ms_per_step": ms, "ratio_to_erm": {p: ms[p] / ms["erm"] for p in ms}}
    for p in PENALTIES:
      print(f"{name:18s} {p:14s} {ms[p]:8.3f} ms/step  {ms[p] / ms['erm']:6.2f}x ERM")
  out["machine"]["load_after"] = os.getloadavg()
  if a.out:
    with open(a.out, "w") as f:
      json.dump(out, f, indent=1)
  return out


if __name__ == "__main__":
  main()
