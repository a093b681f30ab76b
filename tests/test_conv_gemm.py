"""The GEMM convolution (models/conv.py) against `lax.conv_general_dilated`, in float64.

Values and gradients (input and kernel) for the strides, paddings and kernel sizes the
models use, alone and under `vmap` over clients with per-client kernels; whole models
with `model.conv_impl="gemm"` against the same models with "xla" (same parameters).
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax import lax

from fedjax_dg.engine.round import engine_defaults, model_family
from fedjax_dg.models import build_model
from fedjax_dg.models.conv import GemmConv, conv_gemm

# (kernel, stride, padding, H, W): MNIST CNN (3, 1|2, 1), LEAF CNN (5, 1, 2), ResNet stem
# (7, 2, 3), ResNet 3x3 (1|2, 1) and 1x1 (1|2, 0); odd sizes so strides drop rows.
CASES = [(3, 1, 1, 9, 7), (3, 2, 1, 9, 7), (5, 1, 2, 8, 8), (7, 2, 3, 11, 9), (1, 1, 0, 6, 5), (1, 2, 0, 7, 7),
         (3, 1, "SAME", 6, 6), (3, 2, "VALID", 9, 8)]


def _rel(a, b):
  return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(np.asarray(b)))


def _pads(padding, k, s, hw):
  if isinstance(padding, str):
    return lax.padtype_to_pads(hw, (k, k), (s, s), padding)
  return ((padding, padding), (padding, padding))


@pytest.mark.parametrize("k,s,padding,h,w", CASES)
def test_conv_gemm_value_and_grads_equal_lax_conv(k, s, padding, h, w):
  with jax.enable_x64(True):
    rng = np.random.default_rng(k * 10 + s)
    x = jnp.asarray(rng.normal(size=(3, h, w, 4)))
    kern = jnp.asarray(rng.normal(size=(k, k, 4, 5)))
    pads = _pads(padding, k, s, (h, w))
    ref = lambda x, kern: lax.conv_general_dilated(x, kern, (s, s), pads, dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                                   precision=lax.Precision.HIGHEST)
    mine = lambda x, kern: conv_gemm(x, kern, (s, s), pads, precision=lax.Precision.HIGHEST)
    # The value and a vector-Jacobian product, as one program each (not one per primitive).
    run = lambda f: jax.jit(lambda x, kern, ct: (f(x, kern), jax.vjp(f, x, kern)[1](ct)))  # noqa: E731
    ct = jnp.asarray(rng.normal(size=jax.eval_shape(ref, x, kern).shape))  # a random cotangent
    y_ref, grads_ref = run(ref)(x, kern, ct)
    y, grads = run(mine)(x, kern, ct)
    assert y.shape == y_ref.shape and y.dtype == jnp.float64
    assert _rel(y, y_ref) < 1e-13
    for g, g_ref in zip(grads, grads_ref):
      assert _rel(g, g_ref) < 1e-13


@pytest.mark.parametrize("k,s,padding,h,w", CASES[:4])
def test_vmap_over_clients_equals_per_client_conv_and_is_a_batched_gemm(k, s, padding, h, w):
  """Per-client kernels under vmap: nn.Conv (grouped convolution) and GemmConv agree, in
  value and in the gradient of a loss w.r.t. each client's kernel and bias; GemmConv's
  program holds no convolution and a dot_general batched over the client axis."""
  with jax.enable_x64(True):
    clients = 3
    ref_mod = nn.Conv(6, (k, k), strides=s, padding=padding)
    gemm_mod = GemmConv(6, (k, k), strides=s, padding=padding)
    xs = jax.random.normal(jax.random.PRNGKey(0), (clients, 2, h, w, 3), jnp.float64)
    params = jax.vmap(lambda r: ref_mod.init(r, xs[0]))(jax.random.split(jax.random.PRNGKey(1), clients))
    params = jax.tree.map(lambda a: a.astype(jnp.float64), params)
    gemm_params = jax.vmap(lambda r: gemm_mod.init(r, xs[0]))(jax.random.split(jax.random.PRNGKey(1), clients))
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), params,
                                     jax.tree.map(lambda a: a.astype(jnp.float64), gemm_params)))

    def loss(mod):
      return lambda p, x: jnp.sum(jnp.sin(mod.apply(p, x, )))
    f_ref = jax.vmap(jax.value_and_grad(loss(ref_mod)))
    f_gemm = jax.vmap(jax.value_and_grad(loss(gemm_mod)))
    (v_ref, g_ref), (v, g) = jax.jit(f_ref)(params, xs), jax.jit(f_gemm)(params, xs)  # one program each
    assert _rel(v, v_ref) < 1e-12
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
      assert _rel(a, b) < 1e-12
    text = str(jax.make_jaxpr(f_gemm)(params, xs))
    assert "conv_general_dilated" not in text and "conv_general_dilated" in str(jax.make_jaxpr(f_ref)(params, xs))
    dots = [e for e in jax.make_jaxpr(f_gemm)(params, xs).jaxpr.eqns if e.primitive.name == "dot_general"]
    assert dots and all(e.params["dimension_numbers"][1][0] for e in dots)  # every product batched


def _model(name, impl, shape):
  return build_model(ml_collections.ConfigDict({"name": name, "hidden": (16,), "conv_impl": impl}), shape, 7)


# In the slow suite: by default the same two models are checked in float32 (below), and the
# GEMM convolution layer by layer in float64 (above).
@pytest.mark.parametrize("name,shape", [pytest.param("cnn", (12, 12, 1), marks=pytest.mark.slow),
                                        pytest.param("femnist_cnn", (28, 28, 1), marks=pytest.mark.slow),
                                        pytest.param("resnet18", (32, 32, 3), marks=pytest.mark.slow)])
def test_models_with_gemm_conv_equal_xla_conv(name, shape):
  with jax.enable_x64(True):
    xla, gemm = _model(name, "xla", shape), _model(name, "gemm", shape)
    params = xla.init(jax.random.PRNGKey(0))
    p_gemm = gemm.init(jax.random.PRNGKey(0))
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), params, p_gemm))
    params = jax.tree.map(lambda a: a.astype(jnp.float64), params)
    x = jax.random.uniform(jax.random.PRNGKey(1), (3,) + shape, jnp.float64)
    y = jax.random.randint(jax.random.PRNGKey(2), (3,), 0, 7)

    def loss(m):
      return lambda p: -jnp.mean(jax.nn.log_softmax(m.apply(p, x))[jnp.arange(3), y])
    # compiled as the engine compiles them (one program each, not one per operation)
    (l_ref, g_ref), (l, g) = jax.jit(jax.value_and_grad(loss(xla)))(params), jax.jit(jax.value_and_grad(loss(gemm)))(params)
    assert abs(float(l - l_ref)) < 1e-12 * abs(float(l_ref))
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
      assert float(jnp.max(jnp.abs(a - b))) <= 1e-10 * max(float(jnp.max(jnp.abs(b))), 1e-30)


def test_engine_family_and_bad_impl():
  shape = (12, 12, 1)
  assert model_family(_model("cnn", "xla", shape), shape) == "conv"
  assert model_family(_model("cnn", "gemm", shape), shape) == "gemm_conv"
  assert model_family(_model("mlp", "gemm", shape), shape) == "dense"
  for backend in ("cpu", "gpu"):
    assert engine_defaults("gemm_conv", backend).strategy == {"cpu": "host_loop", "gpu": "vmap"}[backend]
  with pytest.raises(ValueError, match="model.conv_impl"):
    _model("cnn", "im2col", shape)


@pytest.mark.parametrize("name,shape", [("cnn", (28, 28, 1)), ("femnist_cnn", (28, 28, 1))])
def test_float32_gemm_conv_agrees_with_xla_conv_to_float32_rounding(name, shape):
  """What a user runs (float32, default precision): the loss and every gradient of the
  two convolutions agree to float32 rounding. Bound: a float32 sum of K products carries a
  relative error of at most about K * 2^-24 (K = kh * kw * C_in = 1152 for the MNIST CNN's
  128-channel layers, 400 for the FEMNIST CNN's second), so norm-wise 1152 * 6e-8 < 1e-4."""
  xla, gemm = _model(name, "xla", shape), _model(name, "gemm", shape)
  params = xla.init(jax.random.PRNGKey(0))
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), params, gemm.init(jax.random.PRNGKey(0))))
  x = jax.random.uniform(jax.random.PRNGKey(1), (8,) + shape, jnp.float32)
  y = jax.random.randint(jax.random.PRNGKey(2), (8,), 0, 7)

  def loss(m):
    return lambda p: -jnp.mean(jax.nn.log_softmax(m.apply(p, x))[jnp.arange(8), y])
  (l_ref, g_ref), (l, g) = jax.jit(jax.value_and_grad(loss(xla)))(params), jax.jit(jax.value_and_grad(loss(gemm)))(params)
  assert l.dtype == jnp.float32 and abs(float(l - l_ref)) <= 1e-4 * abs(float(l_ref))
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
    assert a.dtype == jnp.float32 and _rel(a, b) < 1e-4
