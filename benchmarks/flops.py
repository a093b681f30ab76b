"""Model FLOPs counted from a program's jaxpr, the same on every backend.

XLA's `cost_analysis()` is not a model count: on GPU it leaves out every convolution (the
MNIST CNN's round at C = 100 read 37.5 GFLOP there, its elementwise work; the convolutions
are about 7.0 TFLOP), and on CPU it counts convolutions its own way. This counter walks the
jaxpr instead:

  conv_general_dilated   2 x output elements x kernel height x width x input channels per
                         group (the kernel's input-feature dimension, already divided by the
                         feature groups);
  dot_general            2 x lhs elements x the rhs's free size (neither contracted nor batch);
  nested jaxprs          (jit, custom_jvp / custom_vjp, remat) counted once each; a `scan`'s
                         body times its length; a `cond`'s most expensive branch; a
                         `while` loop's body once (its trip count is not static).

Elementwise work (normalisation, activations, the optimizer) is not counted. A training
example costs 3x its forward count (forward, gradient with respect to the inputs, gradient
with respect to the weights), the usual convention (Kaplan et al. 2020; the first layer's
input gradient is counted though nothing needs it).
"""
from __future__ import annotations

import math


def _inner_jaxprs(eqn):
  for v in eqn.params.values():
    for inner in (v if isinstance(v, (list, tuple)) else (v,)):
      inner = getattr(inner, "jaxpr", inner)
      if hasattr(inner, "eqns"):
        yield inner


def count_flops(jaxpr) -> float:
  """Convolution and matrix-product FLOPs of a jaxpr, nested jaxprs included.

  Args:
    jaxpr: a `jax.core.Jaxpr` (or a `ClosedJaxpr`, whose `.jaxpr` is read).

  Returns:
    The count, as a float.
  """
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "conv_general_dilated":
      rhs, out = eqn.invars[1].aval, eqn.outvars[0].aval
      spec = eqn.params["dimension_numbers"].rhs_spec  # (out features, in features, spatial...)
      total += 2.0 * math.prod(out.shape) * math.prod(rhs.shape[d] for d in spec[2:]) * rhs.shape[spec[1]]
    elif name == "dot_general":
      lhs, rhs = eqn.invars[0].aval, eqn.invars[1].aval
      (_, rc), (_, rb) = eqn.params["dimension_numbers"]
      free = math.prod(s for d, s in enumerate(rhs.shape) if d not in rc and d not in rb)
      total += 2.0 * math.prod(lhs.shape) * free
    elif name == "scan":
      total += eqn.params["length"] * count_flops(eqn.params["jaxpr"])
    elif name == "cond":
      total += max(count_flops(b) for b in eqn.params["branches"])
    elif name == "while":
      total += count_flops(eqn.params["body_jaxpr"])
    else:
      total += sum(count_flops(inner) for inner in _inner_jaxprs(eqn))
  return total


def forward_flops(model, input_shape) -> float:
  """FLOPs of one example's forward pass through `model` (a `fedjax_dg.models.Model`).

  Args:
    model: the model; its parameters are traced by shape only (nothing is initialised).
    input_shape: one example's shape, e.g. `(28, 28, 1)`.

  Returns:
    The count for a batch of one.
  """
  import jax
  import jax.numpy as jnp
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  x = jax.ShapeDtypeStruct((1,) + tuple(input_shape), jnp.float32)
  return count_flops(jax.make_jaxpr(model.apply)(params, x))


def round_flops(forward: float, clients: int, steps: int, batch: int) -> float:
  """A FedAvg round's training FLOPs: 3x the forward count per example, `clients x steps x batch`
  examples."""
  return 3.0 * forward * clients * steps * batch
