"""The engine's defaults come from the model's operations and the backend, in one table."""
import jax
import ml_collections
import numpy as np
import pytest

from fedjax_dg.engine.round import ENGINE_DEFAULTS, default_strategy, default_unroll, model_family
from fedjax_dg.models import build_model


def _model(name, shape):
  return build_model(ml_collections.ConfigDict({"name": name, "hidden": (8,)}), shape, 3)


@pytest.mark.parametrize("name,shape,family", [("mlp", (28, 28, 1), "dense"), ("cnn", (28, 28, 1), "conv"),
                                               ("femnist_cnn", (28, 28, 1), "conv"),
                                               ("resnet18", (32, 32, 3), "conv")])
def test_family_and_strategy_follow_the_operations_not_the_name(name, shape, family):
  model = _model(name, shape)
  assert model_family(model, shape) == family
  # on CPU convolutions get the host loop (the ResNets too, which the old name rule sent to "sequential")
  assert default_strategy(model, "cpu", shape) == ("host_loop" if family == "conv" else "sequential")
  # on a GPU (H100, round_speed_gpu.json) convolutions run fastest one client at a time, dense models under vmap
  assert default_strategy(model, "gpu", shape) == ("sequential" if family == "conv" else "vmap")


def test_unroll_comes_from_the_same_table():
  for (backend, family), d in ENGINE_DEFAULTS.items():
    b = "cpu" if backend == "cpu" else "gpu"
    assert default_unroll(family, max(1, d.unroll_upto), b) == (True if d.unroll_upto else 1)
    assert default_unroll(family, d.unroll_upto + 1, b) == 1
  assert default_unroll("conv", 5, "cpu") is True and default_unroll("conv", 5, "tpu") == 1


def test_summary_shows_the_engine_choice(tiny_config, tmp_path):
  import json
  from fedjax_dg import experiment
  tiny_config.num_rounds = 2
  tiny_config.checkpoint_every = 0
  experiment.train_and_evaluate(tiny_config, str(tmp_path / "w"))
  s = json.load(open(tmp_path / "w" / "summary.json"))
  want = ENGINE_DEFAULTS[("cpu" if jax.default_backend() == "cpu" else "accelerator", "dense")]
  assert s["engine"]["model_family"] == "dense" and s["engine"]["auto"] is True
  assert s["engine"]["strategy"] == s["strategy"] == want.strategy
  assert s["engine"]["unroll"] == default_unroll("dense", s["local_steps"])


def test_the_unrolled_local_loop_gives_the_scan_s_rounds(tiny_config):
  """Unrolling the local loop is a speed choice (`engine.unroll`): the loop unrolled in full
  gives the scan's training losses and scores to float32 rounding."""
  from helpers import learn_in_process
  tiny_config.num_rounds = 3
  tiny_config.client.local_steps, tiny_config.client.local_epochs = 6, 0
  runs = {}
  for unroll in (6, 1):
    tiny_config.engine.unroll = unroll
    runs[unroll] = learn_in_process(tiny_config)
  assert len(runs[1]["train_loss"]) == 3
  np.testing.assert_allclose(runs[6]["train_loss"], runs[1]["train_loss"], rtol=1e-5)
  for split, scores in runs[1]["splits"].items():
    for name, value in scores.items():
      assert abs(runs[6]["splits"][split][name] - value) < 1e-5, (split, name)
