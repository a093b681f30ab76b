"""`model.feature_projection`: FedIIR's paper (Guo et al. 2023) Sec. 5.1's extra linear layer at the end of
the featurizer, checked against float64 NumPy."""
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from safetensors.numpy import save_file

from fedjax_dg import config as config_lib
from fedjax_dg.algorithms.base import LocalSchedule
from fedjax_dg.engine import init_round_state, make_round
from fedjax_dg.models import build_model, convert, resnet
from helpers import client_arrays, method, ragged_store, sgd_config
from test_configs import _load
from test_resnet import torchvision_state_dict


def _cfg(name, width, **kw):
  return ml_collections.ConfigDict({"name": name, "hidden": (5,), "head_hidden": (), "feature_projection": width,
                                    **kw})


def _np(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _mlp_features_np(feat, x):
  """MLPFeaturizer (one hidden ReLU layer) then the projection, in float64 NumPy."""
  h = np.maximum(np.asarray(x, np.float64) @ feat["Dense_0"]["kernel"] + feat["Dense_0"]["bias"], 0.0)
  return h @ feat["projection"]["kernel"] + feat["projection"]["bias"]


def test_mlp_features_and_head_match_numpy():
  """`features` is `relu(x W1 + b1) @ P + q` (no activation after the projection), and the
  model's logits are the head `params["classifier"]` (ReLU MLP) applied to that."""
  model = build_model(_cfg("mlp", 7, head_hidden=(4,)), (6,), 3)
  params = model.init(jax.random.PRNGKey(0))
  assert set(params) == {"featurizer", "classifier"} and set(params["featurizer"]) == {"Dense_0", "projection"}
  x = np.random.default_rng(1).normal(size=(9, 6)).astype(np.float32)
  p = _np(params)
  z = _mlp_features_np(p["featurizer"], x)
  assert (z < 0).any()  # a linear layer: its outputs are not clipped at zero
  np.testing.assert_allclose(np.asarray(model.features(params, x)), z, rtol=1e-5, atol=1e-5)
  c = p["classifier"]
  logits = np.maximum(z @ c["Dense_0"]["kernel"] + c["Dense_0"]["bias"], 0) @ c["Dense_1"]["kernel"] + c["Dense_1"]["bias"]
  assert c["Dense_0"]["kernel"].shape == (7, 4)  # the head reads the projection's 7 features
  np.testing.assert_allclose(np.asarray(model.apply(params, x)), logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(model.head(params["classifier"], model.features(params, x))), logits,
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,shape,base_dim", [("cnn", (8, 8, 1), 128), ("femnist_cnn", (28, 28, 1), 2048),
                                                 ("resnet18", (32, 32, 3), 512)])
def test_image_backbones_end_in_the_projection(name, shape, base_dim):
  """Every image backbone: the base parameters keep their names (the projection sits
  beside them), and `features` equals the plain backbone's features `@ W + b` in NumPy."""
  plain = build_model(_cfg(name, 0), shape, 3)
  proj = build_model(_cfg(name, 6), shape, 3)
  shapes = jax.eval_shape(proj.init, jax.random.PRNGKey(0))  # no random init: one RNG compile per shape
  assert jax.tree.structure({k: v for k, v in shapes["featurizer"].items() if k != "projection"}) == \
      jax.tree.structure(jax.eval_shape(plain.init, jax.random.PRNGKey(0))["featurizer"])
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.1, s.shape), s.dtype), shapes)
  if name == "resnet18":  # BN variances must be positive: torchvision-format weights
    params["featurizer"].update(jax.tree.map(jnp.asarray, convert.torchvision_to_flax(torchvision_state_dict(name))))
  base = {k: v for k, v in params["featurizer"].items() if k != "projection"}
  x = np.random.default_rng(2).uniform(size=(3,) + shape).astype(np.float32)
  both = jax.jit(lambda p: (plain.features({**p, "featurizer": base}, x), proj.features(p, x)))
  f0, f1 = both(params)
  f0 = np.asarray(f0, np.float64)
  assert f0.shape == (3, base_dim) and np.abs(f0).max() > 0
  w = _np(params["featurizer"]["projection"])
  assert w["kernel"].shape == (base_dim, 6)
  np.testing.assert_allclose(np.asarray(f1), f0 @ w["kernel"] + w["bias"], rtol=1e-4, atol=1e-5)


def test_projection_init_is_torch_linear_default():
  """nn.Linear's default (the paper states none; torchvision's `fc` is one): weight and
  bias uniform on +-1/sqrt(fan_in), so std 1/sqrt(3 fan_in), bias not zero."""
  model = build_model(_cfg("mlp", 300, hidden=(400,)), (6,), 3)
  p = model.init(jax.random.PRNGKey(3))["featurizer"]["projection"]
  bound = 1 / np.sqrt(400)
  for a in (np.asarray(p["kernel"]), np.asarray(p["bias"])):
    assert np.abs(a).max() <= bound and np.abs(a).max() > 0.95 * bound
  assert abs(float(p["kernel"].std()) - bound / np.sqrt(3)) < 0.01 * bound
  assert abs(float(p["bias"].std()) - bound / np.sqrt(3)) < 0.1 * bound


def test_pretrained_resnet_load_keeps_the_projection(tmp_path, caplog):
  """Loading torchvision weights with the projection on: every converted weight equals the
  load without it, the projection stays at its initialisation, and one log line says so;
  also through FedSR's wrapper (experiment.load_pretrained)."""
  from fedjax_dg.algorithms.fedsr import probabilistic_model
  from fedjax_dg.runbook import load_pretrained
  path = str(tmp_path / "r18.safetensors")
  sd = torchvision_state_dict("resnet18")
  save_file(sd, path)
  model = build_model(_cfg("resnet18", 512), (32, 32, 3), 5)
  init = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: rng.normal(size=s.shape).astype(s.dtype), init)
  with caplog.at_level("WARNING"):
    got = load_pretrained(params, path)
  lines = [r.getMessage() for r in caplog.records if "feature_projection" in r.getMessage()]
  assert len(lines) == 1 and "512 -> 512" in lines[0] and "keeps its initialisation" in lines[0]
  base = {k: v for k, v in got["featurizer"].items() if k != "projection"}
  plain = build_model(_cfg("resnet18", 0), (32, 32, 3), 5)
  want = resnet.load_pretrained(jax.tree.map(np.zeros_like, jax.tree.map(np.asarray, {"featurizer": base})),
                                path)["featurizer"]
  assert jax.tree.structure(want) == jax.tree.structure(jax.eval_shape(plain.init, jax.random.PRNGKey(0))["featurizer"])
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), base, want))
  np.testing.assert_array_equal(base["conv1"]["kernel"], sd["conv1.weight"].transpose(2, 3, 1, 0))
  np.testing.assert_array_equal(base["layer4_1"]["bn2"]["running_var"], sd["layer4.1.bn2.running_var"])
  for k in ("kernel", "bias"):
    np.testing.assert_array_equal(got["featurizer"]["projection"][k], params["featurizer"]["projection"][k])
  np.testing.assert_array_equal(got["classifier"]["Dense_0"]["kernel"], params["classifier"]["Dense_0"]["kernel"])
  sr = probabilistic_model(model, 8)
  zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(sr.init, jax.random.PRNGKey(0)))
  from fedjax_dg.algorithms import fedsr
  got_sr = load_pretrained(zeros, path, fedsr.SPEC)["featurizer"]["base"]  # FedSR declares where its backbone goes
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)),
                                   {k: v for k, v in got_sr.items() if k != "projection"}, want))
  assert not np.any(got_sr["projection"]["kernel"])


def test_fediir_round_on_the_projected_mlp():
  """One FedIIR round with the projection: the EMA statistic is (1 - ema) times the mean over
  clients of the full-data head gradient, the head reading the projection's output
  (closed-form softmax cross-entropy gradient in float64 NumPy); the projection trains."""
  st = ragged_store()
  C, K = len(st.counts), 3
  model = build_model(_cfg("mlp", 4), (6,), K)
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=4, epochs=1, passes=1, unroll=1)
  alg = method({"algorithm.name": "fediir", "algorithm.fediir.gamma": 0.05, "algorithm.fediir.ema": 0.9,
                **sgd_config(0.1), "server.lr": 1.0}, model, sched, C)
  state = init_round_state(alg, None, params, C)
  state, _ = make_round(alg, C, C, "vmap", chunk_size=4)(state, jax.tree.map(jnp.asarray, st), jax.random.PRNGKey(0))
  p = _np(params)
  gw, gb = [], []
  for c in range(C):
    x, y = map(np.asarray, client_arrays(st, c))
    z = _mlp_features_np(p["featurizer"], x)
    logits = z @ p["classifier"]["Dense_0"]["kernel"] + p["classifier"]["Dense_0"]["bias"]
    prob = np.exp(logits - logits.max(1, keepdims=True))
    d = (prob / prob.sum(1, keepdims=True) - np.eye(K)[y]) / len(y)
    gw.append(z.T @ d)
    gb.append(d.sum(0))
  g = state.server.g_tilde["Dense_0"]
  assert g["kernel"].shape == (4, K)
  np.testing.assert_allclose(np.asarray(g["kernel"]), 0.1 * np.mean(gw, 0), rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(np.asarray(g["bias"]), 0.1 * np.mean(gb, 0), rtol=1e-4, atol=1e-6)
  moved = np.abs(np.asarray(state.server.params["featurizer"]["projection"]["kernel"]) - p["featurizer"]["projection"]["kernel"])
  assert moved.max() > 1e-4


def test_fediir_configs_carry_the_papers_width():
  """FedIIR's paper, Sec. 5.1: 512 after ResNet-18 (VLCS, PACS), 2048 after ResNet-50 (OfficeHome)."""
  got = {n: (c.model.name, c.model.feature_projection, tuple(c.model.head_hidden))
         for n, c in (("pacs", _load("pacs", "fediir")), ("vlcs", _load("vlcs")), ("office_home", _load("office_home")))}
  assert got == {"pacs": ("resnet18", 512, (256,)), "vlcs": ("resnet18", 512, (256,)),
                 "office_home": ("resnet50", 2048, (1024,))}
  assert _load("pacs").model.feature_projection == 0  # Bai et al.'s benchmark: no extra layer


@pytest.mark.parametrize("value,name,message", [
    (-1, "mlp", r"model\.feature_projection must be an integer >= 0 \(0: none\), got -1"),


    (8, "distilbert", r"model\.feature_projection: not available for model\.name='distilbert'"),
])
def test_bad_feature_projection_is_one_line_naming_the_field(tmp_path, value, name, message):
  c = _load("default")
  c.workdir = str(tmp_path / "run")
  c.model.name = name
  c.model.feature_projection = value
  with pytest.raises(config_lib.ConfigError, match=message) as e:
    config_lib.validate(c)
  assert "\n" not in str(e.value)


def test_freeze_featurizer_freezes_the_projection_too():
  """`model.freeze_featurizer` (ResNets) stops every gradient into `params["featurizer"]`,
  the projection included; the head still trains (gradient vs closed form z^T (p - y) / n)."""
  import flax.linen as nn
  from fedjax_dg.models import Classifier, ProjectedFeaturizer, SplitModel
  assert build_model(_cfg("resnet18", 8, freeze_featurizer=True), (32, 32, 3), 3).module.featurizer.freeze
  module = SplitModel(ProjectedFeaturizer(nn.Dense(5), 4, freeze=True), Classifier(3))
  x = np.random.default_rng(0).normal(size=(6, 2)).astype(np.float32)
  y = np.array([0, 1, 2, 0, 1, 2])
  params = module.init(jax.random.PRNGKey(0), x)["params"]
  loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(module.apply({"params": p}, x), y).mean()
  g = jax.grad(loss)(params)
  assert set(g["featurizer"]) == {"kernel", "bias", "projection"}  # the base shares the scope
  assert not any(np.any(a) for a in jax.tree.leaves(g["featurizer"]))
  p = _np(params)
  z = np.asarray(module.apply({"params": params}, x, method="features"), np.float64)
  logits = z @ p["classifier"]["Dense_0"]["kernel"] + p["classifier"]["Dense_0"]["bias"]
  prob = np.exp(logits - logits.max(1, keepdims=True))
  d = (prob / prob.sum(1, keepdims=True) - np.eye(3)[y]) / len(y)
  np.testing.assert_allclose(np.asarray(g["classifier"]["Dense_0"]["kernel"]), z.T @ d, rtol=1e-4, atol=1e-6)
