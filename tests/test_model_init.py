"""`Model.init` compiles Flax's `init` as one program (XLA's optimisation level
`models.INIT_OPTIMIZATION_LEVEL`) to start faster on a fresh machine. Under XLA's default
flags, as a user runs, its parameters for the MLP and the small CNNs are those of Flax's
eager `init` (one small program per initializer) bit for bit. The check runs in a fresh
process without the suite's fast-compile flags (conftest.py), which change the eager
programs' last bits."""
import os
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

import conftest
from fedjax_dg import models

_SCRIPT = r"""
import jax, jax.numpy as jnp, numpy as np
from ml_collections import ConfigDict
from fedjax_dg import models

def build(name, shape):
  return models.build_model(ConfigDict({"name": name, "hidden": (200, 200), "head_hidden": (), "dtype": "float32",
                                        "conv_impl": "xla", "feature_projection": 0}), shape, 10)

for name, shape in [("mlp", (8, 8, 1)), ("cnn", (28, 28, 1)), ("femnist_cnn", (28, 28, 1))]:
  model = build(name, shape)
  for seed in (0, 7):
    rng = jax.random.PRNGKey(seed)
    got = model.init(rng)
    x = jnp.zeros((1,) + model.input_shape, jnp.float32)
    want = model.module.init(rng, model.preprocess(x) if model.preprocess else x)["params"]  # eager, as before
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want), name
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(want)):
      assert a.dtype == b.dtype and a.shape == b.shape, (name, path)
      same = np.array_equal(np.asarray(a), np.asarray(b))
      assert same, (name, seed, jax.tree_util.keystr(path), float(np.max(np.abs(np.asarray(a) - np.asarray(b)))))
  again = build(name, shape).init(jax.random.PRNGKey(0))  # a second build: the same values
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(again),
                                                  jax.tree_util.tree_leaves(model.init(jax.random.PRNGKey(0)))))
print("INIT-OK")
"""


# Slow suite: a fresh Python at XLA's default flags (40 s); the default suite checks the traced
# initialisation against the eager one in its own process (below).
@pytest.mark.slow
def test_compiled_init_gives_the_eager_parameters_bit_for_bit():
  fast = set(conftest.FAST_COMPILE_FLAG.split())
  env = dict(os.environ, XLA_FLAGS=" ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if f not in fast))
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, cwd=root, timeout=600)
  assert "INIT-OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


# femnist_cnn in the slow suite: the same tracer branch, whose conv and dense initialisers
# the MNIST CNN and the MLP cover by default.
@pytest.mark.parametrize("name,shape", [("mlp", (8, 8, 1)), ("cnn", (28, 28, 1)),
                                        pytest.param("femnist_cnn", (28, 28, 1), marks=pytest.mark.slow)])
def test_init_traced_into_a_callers_program_draws_the_same(name, shape):
  """Under a tracer (here `vmap` over keys) `Model.init` falls back to Flax's init inside the
  caller's program: the same draw as the compiled init, up to the programs' rounding."""
  model = models.build_model(ml_collections.ConfigDict({"name": name, "hidden": (200, 200), "head_hidden": (),
                                                        "dtype": "float32", "conv_impl": "xla",
                                                        "feature_projection": 0}), shape, 10)
  rngs = jax.random.split(jax.random.PRNGKey(3), 2)
  batched = jax.vmap(model.init)(rngs)
  for i in range(2):
    for a, b in zip(jax.tree_util.tree_leaves(batched), jax.tree_util.tree_leaves(model.init(rngs[i]))):
      np.testing.assert_allclose(np.asarray(a)[i], np.asarray(b), rtol=0, atol=1e-6)
