"""Per-op times of DomainBed's MNIST CNN on CPU, XLA against PyTorch.

For batch 32 on 28x28x1 it times each convolution's forward pass, weight gradient and
input gradient, and GroupNorm forward and forward+backward, as separately jitted XLA
functions (NHWC, what fedjax_dg's Flax model runs) and, with `--peer-python`, as PyTorch
ops in a subprocess (NCHW, `torch.set_num_threads(--threads)`); also one whole local
step (forward, backward, SGD update) on each side, and for XLA the weight gradient
written as nine shifted-slice matmuls (an alternative lowering). Medians over `--repeats`
calls, in milliseconds; JSON with `--out`.

    python benchmarks/cnn_ops.py --peer-python /tmp/torchvenv/bin/python
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

LAYERS = ((1, 64, 1, 28), (64, 128, 2, 28), (128, 128, 1, 14), (128, 128, 1, 14))  # cin, cout, stride, input H
NORMS = ((64, 28), (128, 14), (128, 14), (128, 14))  # channels, H of each GroupNorm


def _median_ms(f, repeats):
  import numpy as np
  f()
  f()
  ts = []
  for _ in range(repeats):
    t = time.perf_counter()
    f()
    ts.append(time.perf_counter() - t)
  return float(np.median(ts)) * 1e3


def xla_ops(B, repeats):
  import jax
  import jax.numpy as jnp
  import ml_collections
  import optax
  from jax import lax
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from fedjax_dg.models import build_model
  dn = ("NHWC", "HWIO", "NHWC")
  run = lambda f, *a: (lambda: jax.block_until_ready(f(*a)))
  out = {}
  for li, (cin, cout, s, H) in enumerate(LAYERS):
    x = jax.random.normal(jax.random.PRNGKey(0), (B, H, H, cin))
    w = jax.random.normal(jax.random.PRNGKey(1), (3, 3, cin, cout)) * 0.01
    conv = lambda x, w, s=s: lax.conv_general_dilated(x, w, (s, s), ((1, 1), (1, 1)), dimension_numbers=dn)
    g = jax.random.normal(jax.random.PRNGKey(2), conv(x, w).shape)

    def wgrad_dots(x, g, s=s):  # sum over (b, h, w) of shifted input slices times g, one matmul per tap
      xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
      Ho, Wo = g.shape[1], g.shape[2]
      gm = g.reshape(-1, g.shape[3])
      taps = [lax.dot_general(lax.slice(xp, (0, i, j, 0), (x.shape[0], i + (Ho - 1) * s + 1, j + (Wo - 1) * s + 1,
                                                            x.shape[3]), (1, s, s, 1)).reshape(-1, x.shape[3]),
                              gm, (((0,), (0,)), ((), ()))) for i in range(3) for j in range(3)]
      return jnp.stack(taps).reshape(3, 3, x.shape[3], g.shape[3])
    key = f"conv{li + 1} {cin}->{cout} s{s} {H}x{H}"
    out[key] = {
        "fwd": _median_ms(run(jax.jit(conv), x, w), repeats),
        "wgrad": _median_ms(run(jax.jit(lambda x, w, g: jax.vjp(lambda w: conv(x, w), w)[1](g)[0]), x, w, g), repeats),
        "wgrad_9_matmuls": _median_ms(run(jax.jit(wgrad_dots), x, g), repeats),
        "igrad": _median_ms(run(jax.jit(lambda x, w, g: jax.vjp(lambda x: conv(x, w), x)[1](g)[0]), x, w, g), repeats)}
  import flax.linen as nn
  for li, (C, H) in enumerate(NORMS[:2]):
    gn = nn.GroupNorm(num_groups=8)
    x = jax.random.normal(jax.random.PRNGKey(0), (B, H, H, C))
    p = gn.init(jax.random.PRNGKey(0), x)
    fb = jax.jit(jax.grad(lambda p, x: jnp.sum(gn.apply(p, x) ** 2), argnums=(0, 1)))
    out[f"groupnorm {C} {H}x{H}"] = {"fwd": _median_ms(run(jax.jit(gn.apply), p, x), repeats),
                                     "fwd+bwd": _median_ms(run(fb, p, x), repeats)}
  model = build_model(ml_collections.ConfigDict({"name": "cnn"}), (28, 28, 1), 10)
  params = model.init(jax.random.PRNGKey(0))
  x = jax.random.uniform(jax.random.PRNGKey(3), (B, 28, 28, 1))
  y = jnp.zeros((B,), jnp.int32)
  loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()
  step = jax.jit(lambda p: jax.tree.map(lambda a, b: a - 0.01 * b, p, jax.grad(loss)(p)))
  out["whole step"] = {"fwd+bwd+sgd": _median_ms(run(step, params), repeats)}
  return out


def torch_ops(B, repeats, threads):
  import torch
  import torch.nn.functional as F
  torch.set_num_threads(threads)
  out = {}
  for li, (cin, cout, s, H) in enumerate(LAYERS):
    x = torch.randn(B, cin, H, H)
    w = torch.randn(cout, cin, 3, 3) * 0.01
    g = torch.randn_like(F.conv2d(x, w, stride=s, padding=1))
    back = lambda mask: (lambda: torch.ops.aten.convolution_backward(g, x, w, None, [s, s], [1, 1], [1, 1], False,
                                                                     [0, 0], 1, mask))
    with torch.no_grad():
      fwd = _median_ms(lambda: F.conv2d(x, w, stride=s, padding=1), repeats)
    out[f"conv{li + 1} {cin}->{cout} s{s} {H}x{H}"] = {"fwd": fwd, "wgrad": _median_ms(back([False, True, False]), repeats),
                                                       "igrad": _median_ms(back([True, False, False]), repeats)}
  for C, H in NORMS[:2]:
    gn = torch.nn.GroupNorm(8, C, eps=1e-6)
    x = torch.randn(B, C, H, H, requires_grad=True)
    with torch.no_grad():
      fwd = _median_ms(lambda: gn(x), repeats)
    out[f"groupnorm {C} {H}x{H}"] = {"fwd": fwd, "fwd+bwd": _median_ms(lambda: (gn(x) ** 2).sum().backward(), repeats)}
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from torch_peer import build
  model = build("cnn")
  opt = torch.optim.SGD(model.parameters(), lr=0.01)
  x = torch.rand(B, 1, 28, 28)
  y = torch.zeros(B, dtype=torch.long)

  def step():
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    opt.step()
  out["whole step"] = {"fwd+bwd+sgd": _median_ms(step, repeats)}
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--repeats", type=int, default=20)
  p.add_argument("--threads", type=int, default=os.cpu_count(), help="the PyTorch side's torch.set_num_threads")
  p.add_argument("--peer-python", default=None, help="a Python with torch; runs the PyTorch side")
  p.add_argument("--torch", action="store_true", help=argparse.SUPPRESS)  # the subprocess's side
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)
  if args.torch:
    print(json.dumps(torch_ops(args.batch, args.repeats, args.threads)))
    return
  res = {"load_average_at_start": os.getloadavg(), "xla": xla_ops(args.batch, args.repeats)}
  if args.peer_python:
    r = subprocess.run([args.peer_python, os.path.abspath(__file__), "--torch", "--batch", str(args.batch),
                        "--repeats", str(args.repeats), "--threads", str(args.threads)],
                       capture_output=True, text=True, check=True)
    res["torch"] = json.loads(r.stdout.strip().splitlines()[-1])
    res["torch_threads"] = args.threads
  res["load_average_at_end"] = os.getloadavg()
  print(f"{'op (batch %d)' % args.batch:32s} {'what':16s} {'XLA ms':>8s} {'torch ms':>9s}")
  for op, d in res["xla"].items():
    for k, v in d.items():
      t = res.get("torch", {}).get(op, {}).get(k)
      print(f"{op:32s} {k:16s} {v:8.2f} {('%9.2f' % t) if t is not None else '        -'}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(res, f, indent=2)


if __name__ == "__main__":
  main()
