"""What a model's initialisation costs on a fresh machine, and whether compiling it as one
program would give the same parameters.

`Model.init` runs Flax's `init` eagerly: each initializer (`jax.random.truncated_normal`,
`uniform`, ...) is a small jitted program of its own, compiled once per parameter shape. With
an empty compilation cache (a user's very first run) those compilations are most of the time
before the first round (`benchmarks/startup.py`: `model_init_s`). This script times, for each
model, in a new process with the persistent cache off:

  eager    `Model.init` as the runner calls it
  jit      `jax.jit(Model.init)`: one program, XLA's default optimisation level
  jit-O1   the same program compiled with `xla_backend_optimization_level = 1`
  jit-O0   the same at level 0

and whether each gives the eager parameters bit for bit (and the largest difference when
not). `os.getloadavg()` is read before and after each process.

    python benchmarks/init_compile.py --out benchmarks/results/init_compile_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

MODELS = {"mlp": (8, 8, 1), "cnn": (28, 28, 1), "resnet18": (32, 32, 3)}
MODES = ("eager", "jit", "jit-O1", "jit-O0")

_CHILD = r"""
import json, sys, time
import jax, numpy as np
from ml_collections import ConfigDict
from fedjax_dg.models import build_model
name, shape, mode, out = sys.argv[1], tuple(json.loads(sys.argv[2])), sys.argv[3], sys.argv[4]
mc = ConfigDict({"name": name, "hidden": (200, 200), "head_hidden": (), "dtype": "float32", "conv_impl": "xla",
                 "feature_projection": 0, "pretrained": False, "freeze_featurizer": False})
model = build_model(mc, shape, 10)
rng = jax.random.PRNGKey(0)
jax.block_until_ready(jax.numpy.zeros(1) + 1)  # the backend is up before the clock starts
t = time.perf_counter()
if mode == "eager":
  params = model.init(rng)
else:
  level = {"jit": None, "jit-O1": 1, "jit-O0": 0}[mode]
  lowered = jax.jit(model.init).lower(rng)
  exe = lowered.compile() if level is None else lowered.compile({"xla_backend_optimization_level": level})
  params = exe(rng)
jax.block_until_ready(params)
seconds = time.perf_counter() - t
np.save(out, np.concatenate([np.asarray(l, np.float32).ravel() for l in jax.tree_util.tree_leaves(params)]))
print(json.dumps({"seconds": seconds}))
"""


def run_one(name: str, mode: str, folder: str) -> dict:
  """One model and mode in a new process with the compilation cache off."""
  env = dict(os.environ, FEDJAX_DG_COMPILATION_CACHE="off")
  path = os.path.join(folder, f"{name}_{mode}.npy")
  load0 = os.getloadavg()
  proc = subprocess.run([sys.executable, "-c", _CHILD, name, json.dumps(MODELS[name]), mode, path],
                        capture_output=True, text=True, env=env, timeout=900)
  if proc.returncode != 0:
    raise RuntimeError(f"{name} {mode}: {proc.stderr.strip().splitlines()[-1]}")
  rec = json.loads(proc.stdout.strip().splitlines()[-1])
  rec.update(model=name, mode=mode, load_before=list(load0), load_after=list(os.getloadavg()))
  return rec


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--models", default=",".join(MODELS))
  ap.add_argument("--out", default="")
  args = ap.parse_args()
  import numpy as np
  records = []
  with tempfile.TemporaryDirectory() as folder:
    for name in args.models.split(","):
      for mode in MODES:
        rec = run_one(name, mode, folder)
        ref, got = np.load(os.path.join(folder, f"{name}_eager.npy")), np.load(os.path.join(folder, f"{name}_{mode}.npy"))
        rec["bitwise_equal_to_eager"] = bool(np.array_equal(ref, got))
        rec["max_abs_difference"] = float(np.max(np.abs(ref - got)))
        rec["values_differing"] = int(np.sum(ref != got))
        records.append(rec)
        eager = next(r["seconds"] for r in records if r["model"] == name and r["mode"] == "eager")
        print(f"{name:9s} {mode:7s} {rec['seconds']:6.2f} s  eager/this {eager / rec['seconds']:5.2f}x  "
              f"equal to eager: {rec['bitwise_equal_to_eager']} (max diff {rec['max_abs_difference']:.2g}, "
              f"{rec['values_differing']} values)  load {rec['load_before'][0]:.1f}", flush=True)
  doc = {"machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": platform.python_version()},
         "command": "python benchmarks/init_compile.py " + " ".join(sys.argv[1:]), "records": records}
  try:
    import jax
    doc["machine"]["jax"] = jax.__version__
  except ImportError:
    pass
  if args.out:
    with open(args.out, "w") as f:
      json.dump(doc, f, indent=1)


if __name__ == "__main__":
  main()
