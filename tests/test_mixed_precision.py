"""`model.dtype = "bfloat16"`: float32 parameters, gradients and optimizer state, bfloat16
computation, outputs within a rounding-error bound derived for bfloat16.

The bound (one layer y = a W + b computed as Flax's Dense / Conv with dtype bfloat16: inputs,
kernel and bias rounded to bfloat16, products accumulated in float32, the product and the
sum with the bias each rounded to bfloat16), with u = 2^-8 (bfloat16's unit roundoff),
u32 = 2^-24, n the contraction length, `a` the exact (float64) input and `e` a bound on
the input's error |a_hat - a|:

    e1 = e + u (|a| + e)                                   rounding the input
    r  = (1 + u) e1 |W| + u |a| |W|                        rounded input x rounded kernel
         + g_n (|a| + e1) (1 + u) |W|,  g_n = n u32 / (1 - n u32)   float32 accumulation
    r' = r + u (|a W| + r)                                 the product rounded
    e' = r' + u |b| + u (|a W + b| + r' + u |b|)           the bias rounded, the sum rounded

(|.| elementwise, products of absolute values are matrix products), and ReLU is
1-Lipschitz. Nothing is fitted: the test fails if the computation loses more than bfloat16
rounding allows, and a second check fails if it was not done in bfloat16 at all.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from jax import lax

from fedjax_dg.models import build_model
from fedjax_dg.models.conv import GemmConv

U, U32 = 2.0 ** -8, 2.0 ** -24


def layer_bound(a_abs, w_abs, aw_abs, awb_abs, b_abs, e, n, matmul):
  """e' above for one layer; `matmul(p, q)` is the layer's linear map of |.| arrays."""
  g = n * U32 / (1 - n * U32)
  e1 = e + U * (a_abs + e)
  r = (1 + U) * matmul(e1, w_abs) + U * matmul(a_abs, w_abs) + g * (1 + U) * matmul(a_abs + e1, w_abs)
  r = r + U * (aw_abs + r)
  return r + U * b_abs + U * (awb_abs + r + U * b_abs)


def _cfg(name, dtype, impl="xla"):
  return ml_collections.ConfigDict({"name": name, "hidden": (64, 32), "dtype": dtype, "conv_impl": impl})


def test_mlp_bfloat16_within_derived_bound_of_float64():
  model = build_model(_cfg("mlp", "bfloat16"), (8, 8, 1), 10)
  params = model.init(jax.random.PRNGKey(0))
  x = np.asarray(jax.random.uniform(jax.random.PRNGKey(1), (16, 8, 8, 1)), np.float64).reshape(16, -1)
  out = np.asarray(model.apply(params, jnp.asarray(x.reshape(16, 8, 8, 1), jnp.float32)), np.float64)
  layers = [params["featurizer"]["Dense_0"], params["featurizer"]["Dense_1"], params["classifier"]["Dense_0"]]
  a, e = x, np.zeros_like(x)
  for i, layer in enumerate(layers):
    w, b = np.asarray(layer["kernel"], np.float64), np.asarray(layer["bias"], np.float64)
    aw = a @ w
    e = layer_bound(np.abs(a), np.abs(w), np.abs(aw), np.abs(aw + b), np.abs(b), e, w.shape[0], np.matmul)
    a = aw + b if i == len(layers) - 1 else np.maximum(aw + b, 0.0)  # ReLU: 1-Lipschitz, e unchanged
  assert out.dtype == np.float64 and model.apply(params, jnp.zeros((1, 8, 8, 1))).dtype == jnp.float32
  assert np.all(np.abs(out - a) <= e), float(np.max(np.abs(out - a) / e))
  f32 = np.asarray(build_model(_cfg("mlp", "float32"), (8, 8, 1), 10).apply(params, x.reshape(16, 8, 8, 1)))
  assert np.max(np.abs(out - a)) > 10 * np.max(np.abs(f32 - a))  # it did compute in bfloat16


@pytest.mark.parametrize("conv", [nn.Conv, GemmConv])
@pytest.mark.parametrize("k,s,p", [(3, 1, 1), (3, 2, 1), (5, 1, 2)])
def test_conv_layer_bfloat16_within_derived_bound(conv, k, s, p):
  layer = conv(16, (k, k), strides=s, padding=p, dtype=jnp.bfloat16)
  x = jax.random.normal(jax.random.PRNGKey(0), (4, 10, 10, 8))
  params = layer.init(jax.random.PRNGKey(1), x)
  params = jax.tree.map(lambda v: v + 0.1 * jax.random.normal(jax.random.PRNGKey(2), v.shape), params)  # bias != 0
  y = np.asarray(layer.apply(params, x).astype(jnp.float32), np.float64)
  with jax.enable_x64(True):
    def lin(v, w):
      return np.asarray(lax.conv_general_dilated(jnp.asarray(v, jnp.float64), jnp.asarray(w, jnp.float64), (s, s),
                                                 ((p, p), (p, p)), dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                                 precision=lax.Precision.HIGHEST))
    xa = np.asarray(x, np.float64)
    w = np.asarray(params["params"]["kernel"], np.float64)
    b = np.asarray(params["params"]["bias"], np.float64)
    aw = lin(xa, w)
    ex = np.asarray(aw + b)
    # The bound's input error is 0 (the float32 input is exact); |a| |W| is the convolution
    # of |x| with |W|, and e1's term is a convolution of |e1| with |W| (same padding).
    bound = layer_bound(np.abs(xa), np.abs(w), np.abs(aw), np.abs(ex), np.abs(b), np.zeros_like(xa),
                        k * k * x.shape[-1], lin)
  assert np.all(np.abs(y - ex) <= bound), float(np.max(np.abs(y - ex) / bound))
  assert np.max(np.abs(y - ex)) > 1e-4 * np.max(np.abs(ex))  # rounded to bfloat16, not float32


@pytest.mark.parametrize("name,shape,impl", [("cnn", (8, 8, 1), "xla"), ("cnn", (8, 8, 1), "gemm"),
                                             pytest.param("resnet18", (32, 32, 3), "xla", marks=pytest.mark.slow)])
def test_params_grads_and_optimizer_state_stay_float32_compute_is_bfloat16(name, shape, impl):
  model = build_model(_cfg(name, "bfloat16", impl), shape, 5)
  params = model.init(jax.random.PRNGKey(0))
  x = jax.random.uniform(jax.random.PRNGKey(1), (4,) + shape)
  y = jnp.arange(4) % 5

  def loss(p):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()
  opt = optax.adam(1e-3)

  @jax.jit  # one program (run op by op, each operation would compile on its own)
  def step(params):
    grads = jax.grad(loss)(params)
    upd, state = opt.update(grads, opt.init(params), params)
    return grads, state, optax.apply_updates(params, upd), model.apply(params, x), model.features(params, x)
  grads, state, new, logits, features = step(params)
  for tree in (params, grads, state, new):
    assert {str(l.dtype) for l in jax.tree.leaves(tree) if jnp.issubdtype(l.dtype, jnp.floating)} == {"float32"}
  assert logits.dtype == jnp.float32 and features.dtype == jnp.float32
  ops = [e for e in jax.make_jaxpr(model.apply)(params, x).jaxpr.eqns
         if e.primitive.name in ("dot_general", "conv_general_dilated")]
  assert ops and all(v.aval.dtype == jnp.bfloat16 for e in ops for v in e.invars)


def test_fedavg_round_with_bfloat16_keeps_float32_server_params():
  from fedjax_dg.algorithms.base import make_schedule
  from fedjax_dg.data.store import ClientStore
  from fedjax_dg.engine import init_round_state, make_round
  model = build_model(_cfg("cnn", "bfloat16", "gemm"), (8, 8, 1), 3)
  params = model.init(jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  store = ClientStore(rng.random((2, 8, 8, 8, 1), dtype=np.float32), rng.integers(0, 3, (2, 8)).astype(np.int32),
                      np.zeros((2, 8), np.int32), np.full(2, 8, np.int32))
  from helpers import method, sgd_config
  alg = method({**sgd_config(0.1), "server.lr": 1.0}, model, make_schedule(4, 2, 1, 8, 8), 2)
  state = init_round_state(alg, jax.random.PRNGKey(1), params, 2)
  state, _ = make_round(alg, 2, 2, "vmap")(state, jax.tree.map(jnp.asarray, store), jax.random.PRNGKey(2))
  leaves = [l for l in jax.tree.leaves(state) if jnp.issubdtype(l.dtype, jnp.floating)]
  assert {str(l.dtype) for l in leaves} == {"float32"} and all(bool(jnp.isfinite(l).all()) for l in leaves)


def test_bad_dtype_is_one_line_error():
  with pytest.raises(ValueError, match="model.dtype"):
    build_model(_cfg("cnn", "float16"), (8, 8, 1), 3)
  with pytest.raises(ValueError, match="model.dtype"):
    build_model(ml_collections.ConfigDict({"name": "distilbert", "dtype": "bfloat16"}), (16,), 2)
