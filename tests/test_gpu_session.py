"""benchmarks/gpu_session.py: its smoke mode writes each stage's JSON with the environment,
finite timings, FLOP counts equal to a hand count and rates that follow from them (the
stages cnn, batched, femnist and bitwise by default, all six with -m slow); its FLOP counter
(benchmarks/flops.py) against hand counts."""
import importlib.util
import json
import math
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("cnn", "batched", "femnist", "pacs", "cifar", "bitwise")
# In smoke mode pacs and cifar run the round stage on the MNIST CNN, as cnn does, on a uint8
# store, as femnist does: the default suite leaves them to the slow suite.
DEFAULT_STAGES = ("cnn", "batched", "femnist", "bitwise")


def _load(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _conv(h_out, w_out, c_out, k, c_in):
  return 2 * h_out * w_out * c_out * k * k * c_in


def mnist_cnn_forward(h, c_in=1, classes=10):
  """DomainBed's MNIST CNN on h x h x c_in: 3x3 convs c_in->64, 64->128 stride 2, 128->128
  twice (padding 1), then the linear head 128 -> classes."""
  q = (h + 1) // 2
  return (_conv(h, h, 64, 3, c_in) + _conv(q, q, 128, 3, 64) + 2 * _conv(q, q, 128, 3, 128) + 2 * 128 * classes)


def leaf_cnn_forward(h, classes):
  """LEAF's FEMNIST CNN on h x h x 1 (h divisible by 4): 5x5 convs 1->16 and 16->64 (padding
  2), each followed by a 2x2 max-pool, a linear layer to 2048, the head to `classes`."""
  return (_conv(h, h, 16, 5, 1) + _conv(h // 2, h // 2, 64, 5, 16) + 2 * (h // 4) ** 2 * 64 * 2048
          + 2 * 2048 * classes)


def test_the_mnist_cnn_round_at_c100_is_6_98_tflop():
  import ml_collections
  from fedjax_dg.models import build_model
  flops = _load("flops")
  for impl in ("xla", "gemm"):
    model = build_model(ml_collections.ConfigDict({"name": "cnn", "conv_impl": impl}), (28, 28, 1), 10)
    fwd = flops.forward_flops(model, (28, 28, 1))
    assert fwd == mnist_cnn_forward(28) == 145_412_608, impl
    assert flops.round_flops(fwd, 100, 5, 32) == 3 * 145_412_608 * 16_000  # 6.98 TFLOP, not 37.5 GFLOP


def test_the_counter_multiplies_a_scan_body_by_its_length_and_counts_grouped_convolutions():
  import jax
  import jax.numpy as jnp
  from jax import lax
  flops = _load("flops")

  def f(x, w):
    return lax.scan(lambda c, _: (c @ w, None), x, None, length=5)[0]
  jaxpr = jax.make_jaxpr(f)(jnp.zeros((3, 4)), jnp.zeros((4, 4)))
  assert flops.count_flops(jaxpr) == 5 * 2 * 3 * 4 * 4

  def g(x, k):  # 6 input channels in 2 groups: the kernel holds 3 input channels per group
    return lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    feature_group_count=2)
  jaxpr = jax.make_jaxpr(g)(jnp.zeros((2, 5, 5, 6)), jnp.zeros((3, 3, 3, 8)))
  assert flops.count_flops(jaxpr) == 2 * (2 * 5 * 5 * 8) * 9 * 3


def test_an_unknown_stage_is_one_line_before_anything_runs(tmp_path, capsys):
  with pytest.raises(SystemExit):
    _load("gpu_session")._args(["--only", "cnn,nope", "--out", str(tmp_path)])
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].endswith("--only: unknown stage 'nope'; choose from cnn, batched, femnist, pacs, cifar, bitwise")


def _finite(x):
  return isinstance(x, (int, float)) and math.isfinite(x)


@pytest.mark.parametrize("only", [pytest.param(DEFAULT_STAGES, id="default"),
                                  pytest.param(None, id="all", marks=pytest.mark.slow)])
def test_smoke_mode_writes_every_stage_with_finite_numbers_and_hand_counted_flops(tmp_path, only):
  """`--smoke --only ONLY` (None: no `--only`, every stage): the JSON of each stage run."""
  import jax
  session = _load("gpu_session")
  out = tmp_path / "out"
  session.main(["--smoke", "--repeats", "2", "--out", str(out)] + (["--only", ",".join(only)] if only else []))
  docs = {}
  for stage in only or STAGES:
    with open(out / f"{stage}.json") as f:
      docs[stage] = json.load(f)
    d = docs[stage]
    assert "error" not in d, (stage, d.get("error"))
    env = d["env"]
    assert env["backend"] == jax.default_backend() and env["device_kind"]
    assert env["libraries"]["jax"] == jax.__version__ and env["libraries"]["flax"]
    assert env["peaks"]["bf16_dense"] == 989e12 and env["peaks"]["tf32_dense"] == 494.7e12
    assert _finite(env["bf16_matmul_tflops"]) and env["bf16_matmul_tflops"] > 0
    assert env["smoke"] is True

  hand = {"cnn": mnist_cnn_forward(8), "femnist": leaf_cnn_forward(8, 62), "pacs": mnist_cnn_forward(8, 3, 7),
          "cifar": mnist_cnn_forward(8, 3, 10)}
  for stage in [s for s in ("cnn", "femnist", "pacs", "cifar") if s in docs]:
    d = docs[stage]
    cfg = d["config"]
    assert cfg["forward_flop_per_example"] == hand[stage], stage
    assert cfg["flop_per_round"] == 3 * cfg["forward_flop_per_example"] * cfg["cohort"] * cfg["steps"] * cfg["batch"]
    timed = [r for r in d["records"] if "median_s" in r]
    assert timed and len(timed) == len(d["records"]), (stage, d["records"])
    for r in timed:
      assert r["flop_per_round"] == cfg["flop_per_round"]
      assert len(r["times"]) == 2 and r["median_s"] == pytest.approx(sum(r["times"]) / 2, rel=1e-12)
      assert all(_finite(v) and v > 0 for v in [r["median_s"], r["first_round_s"], r["second_round_s"], r["tflops"]])
      assert r["tflops"] == pytest.approx(r["flop_per_round"] / r["median_s"] / 1e12, rel=1e-12)
      assert r["bf16_peak_fraction"] == pytest.approx(r["flop_per_round"] / r["median_s"] / 989e12, rel=1e-12)
      assert r["tf32_peak_fraction"] == pytest.approx(r["flop_per_round"] / r["median_s"] / 494.7e12, rel=1e-12)
      assert r["state_finite"] is True and "peak_bytes" in r
    assert d["summary"]["best_median_s"] == min(r["median_s"] for r in timed)
    if stage == "cnn":  # the peer runs where this Python has torch and torchvision
      assert "skipped" in d["peer"] or _finite(d["peer"].get("median_s_scaled")), d["peer"]
    else:
      assert d["peer"] == {"skipped": "smoke: toy inputs the peer's model does not take"}
  fem = docs["femnist"]["summary"]
  assert fem["rounds_1500_s"] == pytest.approx(1500 * fem["best_median_s"], rel=1e-12)
  assert fem["flute_over_ours"] == pytest.approx(502 / fem["rounds_1500_s"], rel=1e-12)
  # the pacs stage's own summary lines (the default case runs no pacs stage), on cnn's records
  pacs = session.summarize("pacs", docs["cnn"], None, None, None)
  assert pacs["bai_table13_over_best"] == pytest.approx(143.0 / pacs["best_median_s"], rel=1e-12)
  assert pacs["goals"] == {"round_under_3s": pacs["best_median_s"] < 3,
                           "bf16_fraction_at_least_0.15": pacs["best_bf16_peak_fraction"] >= 0.15}

  batched = {(r["where"], r["mode"], r["runs"]): r for r in docs["batched"]["records"]}
  alone, two = batched[("default", "alone", 1)], batched[("default", "vmap", 2)]
  for r, runs in ((alone, 1), (two, 2)):
    assert _finite(r["median_s_per_round"]) and r["median_s_per_round"] > 0 and r["state_finite"] is True
    assert r["runs_per_s"] == pytest.approx(runs / (r["median_s_per_round"] * r["rounds_per_run"]), rel=1e-12)
  assert two["speedup_over_alone"] == pytest.approx(two["runs_per_s"] / alone["runs_per_s"], rel=1e-12)

  checks = {r["check"]: r for r in docs["bitwise"]["records"]}
  assert set(checks) == {"alone_again", "batch_vmap_slot0", "batch_map_slot0", "resumed_from_checkpoint"}
  # on CPU: a run repeated, looped inside a batch (`map`) or resumed is the run alone, bit for bit
  for name in ("alone_again", "batch_map_slot0", "resumed_from_checkpoint"):
    assert checks[name]["identical"] and checks[name]["max_abs_diff_state"] == 0.0, checks[name]
  assert 0.0 <= checks["batch_vmap_slot0"]["max_abs_diff_state"] < 1e-4  # vmap: float32 summation order
  det = docs["bitwise"]["deterministic_ops"]
  assert "--xla_gpu_deterministic_ops=true" in det["xla_flags"] and "error" not in det, det
  assert det["records"][0]["identical"] and _finite(det["cost_over_default"])



def test_the_resnet_workloads_train_batch_norm_on_batch_statistics_on_both_sides():
  """A random ResNet-50 with frozen batch-norm statistics diverges under SGD (the first H100
  run's PACS stage; the PyTorch peer likewise at 64x64 on CPU): the ResNet workloads use
  training-mode batch norm (`--bn train` for the peer), the other models stay as configured."""
  import ml_collections
  from fedjax_dg.models import build_model
  gpu_session = _load("gpu_session")
  v = gpu_session.parse_variant("sequential/gemm/bfloat16")
  for name in ("pacs", "cifar", "cnn", "femnist"):
    w = gpu_session.workload(name, smoke=False)
    mc = gpu_session.model_config(w, v)
    assert mc["conv_impl"] == "gemm" and mc["dtype"] == "bfloat16"
    assert mc.get("freeze_bn", True) is (not w["model"].startswith("resnet")), name
  w = dict(gpu_session.workload("cifar", smoke=False), shape=(16, 16, 3))
  model = build_model(ml_collections.ConfigDict(gpu_session.model_config(w, v)), w["shape"], w["classes"])
  assert model.module.featurizer.freeze_bn is False


def test_a_variant_s_unroll_reaches_the_local_loop(monkeypatch):
  """`/uK` unrolls the local loop's scan by K: the schedule the round is built from says so
  and the round's parse keeps the rest of the variant."""
  from fedjax_dg.algorithms import base
  made = []
  real = base.make_schedule
  monkeypatch.setattr(base, "make_schedule", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
  gpu_session = _load("gpu_session")
  assert gpu_session.parse_variant("chunked/gemm/bfloat16/10/u5") == {
      "strategy": "chunked", "conv_impl": "gemm", "dtype": "bfloat16", "chunk_size": 10, "unroll": 5}
  assert gpu_session.parse_variant("vmap/xla/float32")["unroll"] == 1
  import jax
  w = gpu_session.workload("cnn", smoke=True)
  v = gpu_session.parse_variant("vmap/xla/float32/u2")
  gpu_session.fedavg(jax, gpu_session.model_config(w, v), w, v["strategy"], v["chunk_size"], unroll=v["unroll"])
  assert [m.unroll for m in made] == [2]


def test_trace_summary_sums_complete_events_by_name_per_process(tmp_path):
  """A hand-made trace: per process and name, the summed durations and counts per round,
  device processes first, the profiler's own host frames left out, metadata events ignored."""
  import gzip
  trace_summary = _load("trace_summary")
  ev = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 2, "tid": 5, "ts": 10.0, "dur": 4.0, "name": "gemm"},
        {"ph": "X", "pid": 2, "tid": 5, "ts": 20.0, "dur": 6.0, "name": "gemm"},
        {"ph": "X", "pid": 2, "tid": 6, "ts": 15.0, "dur": 30.0, "name": "fusion.1"},
        {"ph": "X", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0, "name": "$profiler.py:307 trace"},
        {"ph": "X", "pid": 1, "tid": 1, "ts": 1.0, "dur": 8.0, "name": "PjitFunction(step)"},
        {"ph": "i", "pid": 2, "tid": 5, "ts": 11.0, "name": "marker"}]
  path = tmp_path / "perfetto_trace.json.gz"
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": ev}, f)
  s = trace_summary.summarize_trace(str(tmp_path), rounds=2, top=5)
  gpu, host = s["processes"]
  assert gpu["name"] == "/device:GPU:0" and gpu["is_device"] and not host["is_device"]
  assert gpu["events"] == 3 and gpu["events_per_round"] == 1.5 and gpu["busy_us_per_round"] == 20.0
  assert gpu["span_us"] == 35.0  # 10 to 45
  assert [(t["name"], t["count_per_round"], t["us_per_round"]) for t in gpu["top"]] == [
      ("fusion.1", 0.5, 15.0), ("gemm", 1.0, 5.0)]
  assert gpu["top"][0]["share"] == pytest.approx(0.75)
  assert [t["name"] for t in host["top"]] == ["PjitFunction(step)"] and host["busy_us_per_round"] == 4.0


def test_a_traced_smoke_variant_keeps_where_its_time_went_and_bad_variants_are_one_line(tmp_path, capsys):
  session = _load("gpu_session")
  out = tmp_path / "out"
  session.main(["--smoke", "--repeats", "1", "--out", str(out), "--only", "cnn", "--no-peer", "--trace",
                "--variants", "cnn:vmap/gemm/float32"])
  with open(out / "cnn.json") as f:
    (rec,) = json.load(f)["records"]
  assert rec["variant"] == "vmap/gemm/float32" and "error" not in rec["trace"], rec.get("trace")
  assert rec["trace"]["rounds"] == 2 and rec["trace"]["processes"]
  assert any(p["events"] > 0 and p["top"] for p in rec["trace"]["processes"])
  import jax
  import ml_collections
  from fedjax_dg.models import build_model
  params = build_model(ml_collections.ConfigDict({"name": "cnn", "conv_impl": "gemm"}), (8, 8, 1), 10).init(
      jax.random.PRNGKey(0))
  pm = rec["program_memory"]  # XLA's plan for the round program: the global model is among its arguments
  assert pm["argument"] >= sum(a.nbytes for a in jax.tree.leaves(params)) and pm["temp"] > 0
  assert pm["total_bytes"] == pm["argument"] + pm["output"] + pm["temp"] - pm["alias"]
  for bad in ("cnn:vmap/gemm", "nope:vmap/xla/float32", "cnn:warp/xla/float32", "cnn:vmap/xla/float32/u0",
              "cnn:vmap/xla/float32/10/u2/u2"):
    with pytest.raises(SystemExit):
      session._args(["--variants", bad, "--out", str(tmp_path)])
    assert ": error: --variants: " in capsys.readouterr().err.strip().splitlines()[-1]
