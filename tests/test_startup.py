"""The persistent compilation cache: where it lives, its switch, and that a run reading
compiled programs from it computes what a run without it computes."""
import json
import os
import subprocess
import sys

from fedjax_dg import compilation_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cache_dir_follows_the_environment(tmp_path):
  home = {"HOME": str(tmp_path)}
  assert compilation_cache.cache_dir(home) == os.path.join(str(tmp_path), ".cache", "fedjax_dg", "jax")
  assert compilation_cache.cache_dir({**home, "XDG_CACHE_HOME": "/x/cache"}) == "/x/cache/fedjax_dg/jax"
  assert compilation_cache.cache_dir({**home, compilation_cache.ENV: str(tmp_path / "c")}) == str(tmp_path / "c")
  for off in ("off", "0", "false", "NO", "none", " Off "):
    assert compilation_cache.cache_dir({**home, compilation_cache.ENV: off}) is None


_PROGRAM = r"""
import json, os, sys
import fedjax_dg
import jax, jax.numpy as jnp
from fedjax_dg import compilation_cache
path = compilation_cache.enable()
x = jnp.arange(12.0).reshape(3, 4)
y = jax.jit(lambda a: jnp.tanh(a @ a.T).sum(axis=0))(x)
print(json.dumps({"dir": path, "config": jax.config.jax_compilation_cache_dir, "y": [float(v) for v in y]}))
"""


def _run(env_value, cwd):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env[compilation_cache.ENV] = env_value
  r = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  return json.loads(r.stdout.strip().splitlines()[-1])


def test_cache_is_written_then_read_with_the_same_results(tmp_path):
  import numpy as np
  cache = tmp_path / "jaxcache"
  first = _run(str(cache), tmp_path)
  assert first["dir"] == first["config"] == str(cache)
  entries = sorted(os.listdir(cache))
  assert entries, "the compiled program was not written to the cache"
  second = _run(str(cache), tmp_path)
  off = _run("off", tmp_path)
  assert off["dir"] is None and not off["config"]
  a = np.arange(12.0).reshape(3, 4)
  expected = np.tanh(a @ a.T).sum(axis=0)  # float64 NumPy
  np.testing.assert_allclose(first["y"], expected, rtol=1e-6)
  assert second["y"] == first["y"] == off["y"]


def test_a_folder_given_to_jax_is_kept(tmp_path):
  import jax
  before = jax.config.jax_compilation_cache_dir
  try:
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
    assert compilation_cache.enable(environ={compilation_cache.ENV: str(tmp_path / "other")}) == str(tmp_path / "mine")
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
