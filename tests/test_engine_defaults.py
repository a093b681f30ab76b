"""The engine's defaults come from the model's operations and the backend, in one table."""
import jax
import ml_collections
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
