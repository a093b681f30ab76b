"""Per-op times of DomainBed's MNIST CNN on CPU, XLA against PyTorch.

For batch 32 on 28x28x1 it times each convolution's forward pass, weight gradient and
input gradient, and GroupNorm forward and forward+backward, as separately jitted XLA
functions (NHWC, what fedjax_dg's Flax model runs) and, with `--peer-python`, as PyTorch
ops in a subprocess (NCHW, `torch.set_num_threads(--threads)`); also one whole local
step (forward, backward, SGD update) on each side, and for XLA the weight gradient
written as nine shifted-slice matmuls (an alternative lowering). Medians over `--repeats`
calls, in milliseconds; JSON with `--out`.

    python benchmarks/cnn_ops.py --peer-python /tmp/torchvenv/bin/python

`--client` times instead one client's local work of workload B (benchmarks/peers: 5 SGD
steps of batch 32, one jitted program with the steps unrolled, what the `host_loop`
strategy runs per client) for each convolution variant, each `--xla-flags` set in a
process of its own (XLA reads its flags once), the flag sets and their variants
interleaved over `--repeats` passes, and the PyTorch step loop at `--threads` 1 and 2 with
`--peer-python`. Variants: `model:xla` and `model:gemm` (fedjax_dg's model with
`model.conv_impl` "xla" / "gemm"), and the same network written with `lax` directly in
`fn:nhwc`, `fn:nchw` (NCHW / OIHW layout) and `fn:patches` (`lax.conv_general_dilated_patches`
then one matrix product). Each record: compilation seconds, the median over the calls
of a pass, the load average, and the largest relative difference of the trained
parameters from the pass's first variant of the same family.

    python benchmarks/cnn_ops.py --client --peer-python ~/.cache/fedjax_dg/peers/pfl/bin/python \
        --xla-flags "default;--xla_cpu_experimental_ynn_fusion_type=" --out benchmarks/results/cnn_client_cpu.json
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


CLIENT_STEPS = 5
DEFAULT_VARIANTS = "model:xla,model:gemm,fn:nhwc,fn:nchw,fn:patches"


def _fn_client(layout: str):
  """One client's local steps of DomainBed's MNIST CNN written with `lax` directly
  (convolution, ReLU, GroupNorm(8), mean pool, linear head; SGD 0.05), in `layout`
  ("nhwc", "nchw" or "patches": NHWC with im2col patches from
  `lax.conv_general_dilated_patches`)."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  pads = ((1, 1), (1, 1))

  def conv(x, w, s):  # w: HWIO
    if layout == "nchw":
      return lax.conv_general_dilated(x, w.transpose(3, 2, 0, 1), (s, s), pads, dimension_numbers=("NCHW", "OIHW", "NCHW"))
    if layout == "patches":  # patch features ordered (c, p, q)
      kh, kw, cin, cout = w.shape
      cols = lax.conv_general_dilated_patches(x, (kh, kw), (s, s), pads, dimension_numbers=("NHWC", "HWIO", "NHWC"))
      return jnp.einsum("bhwk,ko->bhwo", cols, w.transpose(2, 0, 1, 3).reshape(cin * kh * kw, cout))
    return lax.conv_general_dilated(x, w, (s, s), pads, dimension_numbers=("NHWC", "HWIO", "NHWC"))

  c = 1 if layout == "nchw" else -1

  def groupnorm(x, g, b, groups=8, eps=1e-6):
    xs = jnp.moveaxis(x, 1, -1) if c == 1 else x
    xg = xs.reshape(xs.shape[0], -1, groups, xs.shape[-1] // groups)
    m = xg.mean(axis=(1, 3), keepdims=True)
    v = ((xg - m) ** 2).mean(axis=(1, 3), keepdims=True)
    y = ((xg - m) * lax.rsqrt(v + eps)).reshape(xs.shape) * g + b
    return jnp.moveaxis(y, -1, 1) if c == 1 else y

  def apply(params, x):
    x = x.transpose(0, 3, 1, 2) if c == 1 else x
    for (_, _, s, _), p in zip(LAYERS, params[0]):
      x = conv(x, p["w"], s) + (p["b"][:, None, None] if c == 1 else p["b"])
      x = groupnorm(jax.nn.relu(x), p["g"], p["beta"])
    return x.mean(axis=(2, 3) if c == 1 else (1, 2)) @ params[1]["w"] + params[1]["b"]

  def init(key):
    layers = []
    for cin, cout, _, _ in LAYERS:
      key, k = jax.random.split(key)
      layers.append({"w": jax.random.normal(k, (3, 3, cin, cout)) * (2 / (9 * cin)) ** .5, "b": jnp.zeros(cout),
                     "g": jnp.ones(cout), "beta": jnp.zeros(cout)})
    return layers, {"w": jax.random.normal(key, (128, 10)) * 0.1, "b": jnp.zeros(10)}
  return init, apply


def client_variants(variants, repeats, passes=1) -> dict:
  """Times one client's local work (CLIENT_STEPS SGD steps of batch 32, unrolled, one
  jitted program) per variant, interleaved over `passes` x `repeats` calls."""
  import jax
  import jax.numpy as jnp
  import ml_collections
  import numpy as np
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from fedjax_dg.models import build_model
  xs = jax.random.uniform(jax.random.PRNGKey(3), (CLIENT_STEPS, 32, 28, 28, 1))
  ys = jax.random.randint(jax.random.PRNGKey(4), (CLIENT_STEPS, 32), 0, 10)
  fns, out, first = {}, {}, {}
  for v in variants:
    kind, impl = v.split(":")
    if kind == "model":
      model = build_model(ml_collections.ConfigDict({"name": "cnn", "conv_impl": impl}), (28, 28, 1), 10)
      init, apply = model.init, model.apply
    else:
      init, apply = _fn_client(impl)

    def client(params, xs, ys, apply=apply):
      loss = lambda p, x, y: -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(apply(p, x)), y[:, None], 1))
      for i in range(CLIENT_STEPS):
        params = jax.tree.map(lambda a, g: a - 0.05 * g, params, jax.grad(loss)(params, xs[i], ys[i]))
      return params
    params = init(jax.random.PRNGKey(0))
    f = jax.jit(client)
    t = time.perf_counter()
    trained = jax.block_until_ready(f(params, xs, ys))
    compile_s = time.perf_counter() - t
    leaves = [np.asarray(a, np.float64) for a in jax.tree.leaves(trained)]
    ref = first.setdefault(kind, leaves)
    diff = max(float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)) for a, b in zip(leaves, ref))
    fns[v] = (f, params)
    out[v] = {"compile_and_first_call_s": compile_s, "max_rel_diff_from_first_of_kind": diff, "calls_s": []}
  for _ in range(passes):
    for v in variants:
      f, params = fns[v]
      for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f(params, xs, ys))
        out[v]["calls_s"].append(time.perf_counter() - t)
  for v in variants:
    out[v]["median_s"] = float(np.median(out[v]["calls_s"]))
  return out


def torch_client(repeats, threads) -> dict:
  """PyTorch's step loop for one client (CLIENT_STEPS SGD steps of batch 32), as the peers run it."""
  import numpy as np
  import torch
  import torch.nn.functional as F
  torch.set_num_threads(threads)
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from torch_peer import build
  model = build("cnn")
  opt = torch.optim.SGD(model.parameters(), lr=0.05)
  xs, ys = torch.rand(CLIENT_STEPS, 32, 1, 28, 28), torch.randint(0, 10, (CLIENT_STEPS, 32))

  def client():
    for i in range(CLIENT_STEPS):
      opt.zero_grad(set_to_none=True)
      F.cross_entropy(model(xs[i]), ys[i]).backward()
      opt.step()
  client()
  ts = []
  for _ in range(repeats):
    t = time.perf_counter()
    client()
    ts.append(time.perf_counter() - t)
  return {"median_s": float(np.median(ts)), "calls_s": ts}


def client_main(args, header: dict) -> dict:
  """The `--client` comparison: every flag set in its own process, passes interleaved; the
  results file (`--out`) rewritten after each run, so that a stopped comparison keeps them."""
  flag_sets = [f.strip() for f in args.xla_flags.split(";")]
  runs = []
  res = {**header, "what": f"one client's local work: {CLIENT_STEPS} SGD steps of batch 32, 28x28x1, "
                           "DomainBed's MNIST CNN", "runs": runs}

  def save():
    if args.out:
      with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
  for p in range(args.passes):
    order = flag_sets[p % len(flag_sets):] + flag_sets[:p % len(flag_sets)]
    for flags in order:
      env = dict(os.environ, FEDJAX_DG_XLA_CPU_DEFAULTS="off")  # exactly the flag set's XLA_FLAGS
      env["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + ("" if flags == "default" else flags)).strip()
      load0 = os.getloadavg()
      r = subprocess.run([sys.executable, os.path.abspath(__file__), "--client-child", "--variants", args.variants,
                          "--repeats", str(args.repeats)], capture_output=True, text=True, env=env)
      rec = {"pass": p, "xla_flags": flags, "load_before": load0, "load_after": os.getloadavg()}
      if r.returncode != 0:
        rec["error"] = ([l for l in r.stderr.splitlines() if "Error" in l] or r.stderr.splitlines() or ["?"])[-1][:300]
      else:
        rec["variants"] = json.loads(r.stdout.strip().splitlines()[-1])
      runs.append(rec)
      print(json.dumps(rec), flush=True)
      save()
      if args.peer_python:
        for threads in (1, 2):
          r = subprocess.run([args.peer_python, os.path.abspath(__file__), "--torch-client", "--threads", str(threads),
                              "--repeats", str(args.repeats)], capture_output=True, text=True, check=True)
          rec = {"pass": p, "torch_threads": threads, "load_after": os.getloadavg(),
                 **json.loads(r.stdout.strip().splitlines()[-1])}
          runs.append(rec)
          print(json.dumps(rec), flush=True)
          save()
  return res


YNN_OPTIONS = ("default", "none", "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT", "LIBRARY_FUSION_TYPE_DOT")


def ynn_ab(repeats) -> dict:
  """One client's local work (model:xla) compiled under each of YNN_OPTIONS as
  `xla_cpu_experimental_ynn_fusion_type` (per-compilation options of one process: "default"
  is jaxlib's own list, YNNPACK convolutions included; "none" no YNNPACK fusion), the calls
  alternated in one process so that every option meets the same load."""
  import jax
  import jax.numpy as jnp
  import ml_collections
  import numpy as np
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from fedjax_dg.models import build_model
  model = build_model(ml_collections.ConfigDict({"name": "cnn"}), (28, 28, 1), 10)

  def client(params, xs, ys):
    loss = lambda p, x, y: -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(model.apply(p, x)), y[:, None], 1))
    for i in range(CLIENT_STEPS):
      params = jax.tree.map(lambda a, g: a - 0.05 * g, params, jax.grad(loss)(params, xs[i], ys[i]))
    return params
  p0 = model.init(jax.random.PRNGKey(0))
  xs = jax.random.uniform(jax.random.PRNGKey(3), (CLIENT_STEPS, 32, 28, 28, 1))
  ys = jax.random.randint(jax.random.PRNGKey(4), (CLIENT_STEPS, 32), 0, 10)
  lowered = jax.jit(client).lower(p0, xs, ys)
  fns, out, ref = {}, {"load_before": os.getloadavg(), "xla_flags": os.environ.get("XLA_FLAGS", "")}, None
  for n in YNN_OPTIONS:
    opts = {} if n == "default" else {"xla_cpu_experimental_ynn_fusion_type": "" if n == "none" else n}
    fns[n] = lowered.compile(compiler_options=opts)
    text = fns[n].as_text()
    leaves = [np.asarray(a, np.float64) for a in jax.tree.leaves(jax.block_until_ready(fns[n](p0, xs, ys)))]
    ref = ref or leaves
    out[n] = {"ynn_fusions": text.count("kind=kCustom"), "calls_s": [],
              "max_rel_diff_from_default": max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(leaves, ref))}
  for rep in range(repeats):
    for n in (YNN_OPTIONS if rep % 2 == 0 else YNN_OPTIONS[::-1]):
      t = time.perf_counter()
      jax.block_until_ready(fns[n](p0, xs, ys))
      out[n]["calls_s"].append(time.perf_counter() - t)
  for n in YNN_OPTIONS:
    out[n]["median_s"] = float(np.median(out[n]["calls_s"]))
  out["load_after"] = os.getloadavg()
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--repeats", type=int, default=20)
  p.add_argument("--threads", type=int, default=os.cpu_count(), help="the PyTorch side's torch.set_num_threads")
  p.add_argument("--peer-python", default=None, help="a Python with torch; runs the PyTorch side")
  p.add_argument("--torch", action="store_true", help=argparse.SUPPRESS)  # the subprocess's side
  p.add_argument("--out", default=None)
  p.add_argument("--client", action="store_true", help="time one client's local work per variant and flag set")
  p.add_argument("--variants", default=DEFAULT_VARIANTS, help="--client: comma-separated variants")
  p.add_argument("--xla-flags", default="default", help="--client: ';'-separated XLA_FLAGS sets ('default': none)")
  p.add_argument("--passes", type=int, default=1, help="--client: interleaved passes over the flag sets")
  p.add_argument("--ynn", action="store_true", help="one client's local work under each YNNPACK fusion option, "
                                                     "alternated in one process (--passes processes)")
  p.add_argument("--client-child", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--torch-client", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.client_child:
    print(json.dumps(client_variants(args.variants.split(","), args.repeats)))
    return
  if args.torch_client:
    print(json.dumps(torch_client(args.repeats, args.threads)))
    return
  if args.ynn:  # "default" is jaxlib's own choice: the package's XLA:CPU default (fedjax_dg.xla_cpu) off
    os.environ["FEDJAX_DG_XLA_CPU_DEFAULTS"] = "off"
    import platform
    res = {"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "processor": platform.processor()},
           "command": " ".join(["benchmarks/cnn_ops.py"] + (sys.argv[1:] if argv is None else list(argv))),
           "what": f"one client's local work ({CLIENT_STEPS} SGD steps of batch 32, DomainBed's MNIST CNN) per "
                   "xla_cpu_experimental_ynn_fusion_type", "runs": []}
    for _ in range(args.passes):
      res["runs"].append(ynn_ab(args.repeats))
      print(json.dumps({k: (v["median_s"] if isinstance(v, dict) else v) for k, v in res["runs"][-1].items()}), flush=True)
      if args.out:
        with open(args.out, "w") as f:
          json.dump(res, f, indent=1)
    return
  if args.client:
    import platform
    client_main(args, {"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(),
                                   "processor": platform.processor()},
                       "command": " ".join(["benchmarks/cnn_ops.py"] + (sys.argv[1:] if argv is None else list(argv)))})
    return
  if args.torch:
    print(json.dumps(torch_ops(args.batch, args.repeats, args.threads)))
    return
  res = {"load_average_at_start": os.getloadavg(), "xla": xla_ops(args.batch, args.repeats),
         "xla_flags": os.environ.get("XLA_FLAGS", "")}
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
