import os
import sys

import jax
import pytest

# The tests compare float32 results with float64 NumPy at float32 tolerances: on GPUs whose
# default float32 matmul is TF32 (A100, H100) that needs full-precision matmuls.
jax.config.update("jax_default_matmul_precision", "highest")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


@pytest.fixture
def tiny_config():
  """The default config shrunk to seconds: MLP, few rounds, few clients."""
  sys.path.insert(0, os.path.join(ROOT, "configs"))
  import default
  c = default.get_config()
  c.model.name = "mlp"
  c.model.hidden = (32,)
  c.data.image_size = 8
  c.num_clients = 8
  c.num_rounds = 6
  c.eval_every = 2
  c.checkpoint_every = 2
  c.client.lr = 0.1
  c.client.momentum = 0.0
  c.client.batch_size = 16
  c.quiet = True
  return c
