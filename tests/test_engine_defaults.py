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
  # the same convolutions as matrix products run fastest under vmap on a GPU (results/gpu_h100/, gpu_h200/)
  if family == "conv":
    gemm = build_model(ml_collections.ConfigDict({"name": name, "hidden": (8,), "conv_impl": "gemm"}), shape, 3)
    assert model_family(gemm, shape) == "gemm_conv"
    assert default_strategy(gemm, "gpu", shape) == "vmap" and default_strategy(gemm, "cpu", shape) == "host_loop"


def test_unroll_comes_from_the_same_table():
  for (backend, family), d in ENGINE_DEFAULTS.items():
    b = "cpu" if backend == "cpu" else "gpu"
    assert default_unroll(family, max(1, d.unroll_upto), b) == (True if d.unroll_upto else 1)
    assert default_unroll(family, d.unroll_upto + 1, b) == 1
  assert default_unroll("conv", 5, "cpu") is True and default_unroll("conv", 6, "tpu") == 1
  # measured on an H200 (results/gpu_h200/*_unroll.json): XLA convolutions client by client gain from
  # unrolling 5 steps, the GEMM convolution under vmap loses
  assert default_unroll("conv", 5, "gpu") is True and default_unroll("gemm_conv", 5, "gpu") == 1


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


# ----------------------------------------------------------------------------- "auto" and the device's memory

@pytest.mark.parametrize("family,backend,fits,want", [
    ("gemm_conv", "gpu", {"vmap", "chunked"}, "vmap"),
    ("gemm_conv", "gpu", {"chunked"}, "chunked"),
    ("gemm_conv", "gpu", set(), "sequential"),
    ("dense", "gpu", {"chunked"}, "chunked"),
    ("dense", "cpu", set(), "sequential"),   # the measured default is not vmap: nothing to move
    ("conv", "gpu", set(), "sequential"),
])
def test_auto_leaves_vmap_for_chunks_then_one_client_when_the_cohort_does_not_fit(tiny_config, family, backend,
                                                                                  fits, want):
  from fedjax_dg import plan
  asked = []

  def fits_fn(strategy):
    asked.append(strategy)
    return strategy in fits
  assert plan.resolve_strategy(tiny_config, family, fits_fn, backend) == want
  if ENGINE_DEFAULTS[("cpu" if backend == "cpu" else "accelerator", family)].strategy != "vmap":
    assert asked == []  # only vmap is ever moved
  for explicit in ("vmap", "chunked"):  # an explicit strategy is kept (check_memory refuses it if need be)
    tiny_config.engine.strategy = explicit
    assert plan.resolve_strategy(tiny_config, family, lambda s: False, backend) == explicit


def test_processes_agree_on_the_most_cautious_fallback(tiny_config, monkeypatch):
  """Under `jax.distributed` each process tests its own memory; the run takes the most
  cautious choice of any process, so that every process compiles the same program."""
  from jax.experimental import multihost_utils
  from fedjax_dg import distributed, plan
  monkeypatch.setattr(distributed, "process_count", lambda: 2)
  monkeypatch.setattr(distributed, "check_strategy", lambda config: None)
  for other, want in ((0, "chunked"), (2, "sequential")):  # the other process's choice: vmap, sequential
    monkeypatch.setattr(multihost_utils, "process_allgather", lambda x, other=other: np.stack([x, np.int32(other)]))
    assert plan.resolve_strategy(tiny_config, "gemm_conv", lambda s: s == "chunked", "gpu") == want


def test_parallel_clients_counts_one_device_s_share():
  from fedjax_dg import plan
  assert [plan.parallel_clients("vmap", 100, 10, n) for n in (1, 3, 8)] == [100, 34, 13]
  assert [plan.parallel_clients("chunked", 100, 20, n) for n in (1, 8)] == [20, 13]
  assert plan.parallel_clients("sequential", 100, 10, 8) == plan.parallel_clients("host_loop", 100, 10) == 1
  assert plan.memory_devices("vmap", "cpu") == plan.memory_devices("host_loop", "gpu") == 1
  assert plan.memory_devices("chunked", "gpu") == len(jax.devices())


def test_round_fits_is_check_memory_s_test(tiny_config):
  from fedjax_dg import checks
  from fedjax_dg.errors import ConfigError
  shape = (8, 8, 1)
  model = build_model(tiny_config.model, shape, 10)
  m = checks.round_memory(tiny_config, model, shape, 8, 4)
  need = m["state"] + m["activations"] + m["indices"]
  assert checks.round_fits(tiny_config, model, shape, 8, 4, available=need)
  checks.check_memory(tiny_config, model, shape, 8, "vmap", 4, available=need)
  assert not checks.round_fits(tiny_config, model, shape, 8, 4, available=need - 1)
  with pytest.raises(ConfigError, match="engine.strategy='chunked'"):
    checks.check_memory(tiny_config, model, shape, 8, "vmap", 4, available=need - 1)
  with pytest.raises(ConfigError, match="engine.chunk_size"):
    checks.check_memory(tiny_config, model, shape, 8, "chunked", 4, available=need - 1)


@pytest.mark.parametrize("name,patches", [
    # DomainBed's MNIST CNN at 28x28x1: 3x3 convs 1->64 at 28x28, 64->128 stride 2, then 128->128 twice at 14x14
    ("cnn", 28 * 28 * 9 * 1 + 14 * 14 * 9 * 64 + 2 * 14 * 14 * 9 * 128),
    # LEAF's FEMNIST CNN: 5x5 convs 1->16 at 28x28 and 16->64 at 14x14 (after 2x2 pooling)
    ("femnist_cnn", 28 * 28 * 25 * 1 + 14 * 14 * 25 * 16),
])
@pytest.mark.parametrize("dtype,itemsize", [("float32", 4), ("bfloat16", 2)])
def test_gemm_activations_count_the_im2col_patches_in_the_computation_dtype(name, patches, dtype, itemsize):
  from fedjax_dg import checks
  shape = (28, 28, 1)
  count = {}
  for impl in ("xla", "gemm"):
    model = build_model(ml_collections.ConfigDict({"name": name, "conv_impl": impl, "dtype": dtype}), shape, 10)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    count[impl] = checks._activation_bytes_per_example(model, params, shape)  # pylint: disable=protected-access
  assert count["gemm"] - count["xla"] == patches * itemsize


def test_the_memory_estimate_brackets_xla_s_plan_of_the_measured_gpu_rounds():
  """`checks.round_memory` against XLA's own memory plan of every round measured on an H200
  with clients in parallel (`vmap`, `chunked`; benchmarks/results/gpu_h200/, the round
  program's `program_memory`): never below the plan's temporaries (the fallback must not
  send a round that cannot fit), never above 2.5 times its whole size (nor so cautious that
  it gives up fitting rounds; the factor the docstring states)."""
  import glob
  import importlib.util
  import json
  import os
  from fedjax_dg import checks, default_config, plan
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  spec = importlib.util.spec_from_file_location("gpu_session", os.path.join(root, "benchmarks", "gpu_session.py"))
  session = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(session)
  checked = []
  for path in sorted(glob.glob(os.path.join(root, "benchmarks", "results", "gpu_h200", "*.json"))):
    doc = json.load(open(path))
    for rec in doc.get("records", []):
      if rec.get("strategy") not in ("vmap", "chunked") or "program_memory" not in rec:
        continue
      w = session.workload(doc["stage"], smoke=False)
      v = session.parse_variant(rec["variant"])
      model = build_model(ml_collections.ConfigDict(session.model_config(w, v)), tuple(w["shape"]), w["classes"])
      config = default_config()
      config.client.batch_size = w["batch"]
      parallel = plan.parallel_clients(v["strategy"], w["cohort"], v["chunk_size"])
      m = checks.round_memory(config, model, tuple(w["shape"]), parallel, w["steps"])
      est, pm = m["state"] + m["activations"] + m["indices"], rec["program_memory"]
      assert pm["temp"] <= est <= 2.5 * pm["total_bytes"], (path, rec["variant"], est, pm)
      checked.append((doc["stage"], rec["variant"]))
  assert {s for s, _ in checked} >= {"cnn", "pacs", "cifar", "femnist"} and len(checked) >= 7, checked


def _gemm_cnn_run(config):
  """A GEMM-convolution CNN run of 8 clients, all in the round, chunks of 2; its data."""
  from fedjax_dg import folds
  config.model.name, config.model.conv_impl = "cnn", "gemm"
  config.num_clients, config.cohort_size, config.num_rounds = 8, 8, 1
  config.engine.chunk_size = 2
  return config, folds.load_fold(config)


@pytest.mark.parametrize("room,parallel", [("vmap", 8), ("chunked", 2), ("sequential", 1)])
def test_prepare_on_an_accelerator_runs_the_strategy_that_fits(tiny_config, monkeypatch, room, parallel):
  """`prepare` for a GEMM CNN as on a GPU (the table's accelerator row, one device): with
  memory for the whole cohort at once it runs vmap; with room for a chunk only, chunks;
  with room for one client only, one client at a time; the plan's text says why."""
  from fedjax_dg import checks, plan
  config, fold = _gemm_cnn_run(tiny_config)
  shape = fold.train.x.shape[1:]
  on_cpu = plan.prepare(config, fold)  # the local steps, as prepare counts them
  m = lambda p: checks.round_memory(config, on_cpu.model, shape, p, on_cpu.plan.local_steps)
  need = lambda p: m(p)["state"] + m(p)["activations"] + m(p)["indices"]
  assert need(1) < need(2) < need(8)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(plan, "memory_devices", lambda strategy, backend=None: 1)  # one GPU, as forced host devices are not
  monkeypatch.setattr(checks, "device_memory", lambda: need(parallel))
  p = plan.prepare(config, fold).plan
  assert (p.strategy, p.parallel, p.auto, p.model_family) == (room, parallel, True, "gemm_conv")
  moved = "; the cohort under vmap exceeds the device's memory: "
  assert p.measured == ENGINE_DEFAULTS[("accelerator", "gemm_conv")].measured + ("" if room == "vmap" else moved + room)


def test_run_bytes_counts_the_strategy_auto_falls_back_to(tiny_config, monkeypatch):
  """A batch's estimate of one run (`batch.run_bytes`) follows the same fallback: on a GPU
  too small for the cohort under vmap, "auto" costs what an explicit "chunked" costs."""
  from fedjax_dg import batch, checks
  from fedjax_dg import plan
  config, _ = _gemm_cnn_run(tiny_config)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(plan, "memory_devices", lambda strategy, backend=None: 1)
  roomy = batch.run_bytes(config)
  config.engine.strategy = "chunked"
  chunked = batch.run_bytes(config)
  config.engine.strategy = "vmap"
  assert batch.run_bytes(config) == roomy > chunked  # with room, auto is vmap
  config.engine.strategy = "auto"
  monkeypatch.setattr(checks, "round_fits", lambda c, mdl, s, parallel, n, *a, **k: parallel <= 2)
  assert batch.run_bytes(config) == chunked
