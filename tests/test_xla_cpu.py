"""The package's XLA:CPU default (fedjax_dg/xla_cpu.py): when it applies, and that a
process importing fedjax_dg runs a convolution's weight gradient in XLA (no YNNPACK
fusion) with the values of a float64 NumPy transcription, as a process with the default
switched off (YNNPACK) does."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_dg import xla_cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_flag_is_added_only_where_it_applies():
  assert xla_cpu.xla_flags({}, "0.10.2") == xla_cpu.FLAG
  assert xla_cpu.xla_flags({"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}, "0.10.0") == (
      "--xla_cpu_enable_fast_math=false " + xla_cpu.FLAG)
  assert xla_cpu.xla_flags({"XLA_FLAGS": xla_cpu.OPTION + "="}, "0.10.2") is None  # the user's own setting
  for off in ("off", "0", "FALSE", " no ", "none"):
    assert xla_cpu.xla_flags({xla_cpu.ENV: off}, "0.10.2") is None
  for other in ("0.9.1", "0.11.0", "1.0.10", None):  # not measured: XLA aborts on an unknown option
    assert xla_cpu.xla_flags({}, other) is None
  env = {"XLA_FLAGS": ""}
  assert xla_cpu.apply(env) == (xla_cpu.jaxlib_version() or "").startswith(xla_cpu.MEASURED_JAXLIB)


_PROGRAM = r"""
import json, os
import fedjax_dg  # adds the CPU default before JAX starts its backend
import jax, jax.numpy as jnp, numpy as np
from jax import lax
rng = np.random.default_rng(0)
x = rng.normal(size=(4, 9, 9, 32)).astype(np.float32)
g = rng.normal(size=(4, 9, 9, 32)).astype(np.float32)
conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC"))
wgrad = jax.jit(lambda x, g: jax.vjp(lambda w: conv(x, w), jnp.zeros((3, 3, 32, 32)))[1](g)[0])  # a weight gradient
hlo = wgrad.lower(x, g).compile().as_text()
print(json.dumps({"flags": os.environ.get("XLA_FLAGS", ""), "ynn_conv": '"__ynn_fusion"' in hlo,
                  "y": np.asarray(wgrad(x, g)).tolist()}))
"""


def _run(environ):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", **environ)
  env.pop("XLA_FLAGS", None)
  r = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, env=env, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not (xla_cpu.jaxlib_version() or "").startswith(xla_cpu.MEASURED_JAXLIB),
                    reason="the default applies to jaxlib 0.10 only")
def test_importing_the_package_runs_convolutions_in_xla_with_the_same_values():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(4, 9, 9, 32)).astype(np.float32).astype(np.float64)
  g = rng.normal(size=(4, 9, 9, 32)).astype(np.float32).astype(np.float64)
  xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))  # dW[p, q, c, o] = sum_{b,i,j} xp[b, i+p, j+q, c] g[b, i, j, o]
  expected = np.stack([np.stack([np.einsum("bhwc,bhwo->co", xp[:, p:p + 9, q:q + 9, :], g) for q in range(3)])
                       for p in range(3)])
  on, off = _run({}), _run({xla_cpu.ENV: "off"})
  assert on["flags"] == xla_cpu.FLAG and not on["ynn_conv"]
  assert off["flags"] == "" and off["ynn_conv"]  # jaxlib 0.10's own choice: YNNPACK
  for got in (on["y"], off["y"]):  # float32 sums of 324 products: relative error far below 1e-5
    assert np.linalg.norm(np.asarray(got) - expected) <= 1e-5 * np.linalg.norm(expected)
