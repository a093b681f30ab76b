"""A convolution written as one matrix product, so that `vmap` over clients batches it.

`jax.vmap` of `lax.conv_general_dilated` whose kernel differs per client lowers to a
*grouped* convolution (the clients become feature groups), which GPU convolution
libraries run far below their dense rate: on an H100 the MNIST CNN's cohort of 100 ran
twice as slowly under `vmap` as client by client (benchmarks/results/round_speed_gpu.json).

`GemmConv` computes the same convolution as an im2col matrix product: the input is padded,
the `kh * kw` shifted (strided) windows are stacked along the channel axis into patches
`[B, H', W', kh * kw * C_in]`, and these are multiplied by the kernel reshaped to
`[kh * kw * C_in, C_out]`:

    y[b, i, j, o] = sum_{p, q, c} x_pad[b, s_h i + p, s_w j + q, c] W[p, q, c, o].

The patches are slices of the input (no convolution primitive appears), so under `vmap`
over clients the product becomes one batched matrix product `[clients, B H' W', K] x
[clients, K, C_out]` (a batched GEMM), and its gradients are a batched GEMM and the
transposes of slices (pads and adds). A 1x1 convolution needs no patches. The cost is the
patch array, `kh * kw` times the input's size.

Parameters (`kernel` `[kh, kw, C_in, C_out]`, `bias` `[C_out]`), their initialisers and
names are those of `flax.linen.Conv`, so a model's parameter tree and initial values do not
depend on the convolution used (`model.conv_impl`), and checkpoints move between them.
Only what the models here use is supported: 2-D, explicit integer padding or "VALID" /
"SAME", strides, no dilation, no feature groups.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

CONV_IMPLS = ("xla", "gemm")  # model.conv_impl: lax.conv_general_dilated (nn.Conv) | GemmConv


def _pairs(padding, kernel, strides, in_hw) -> tuple[tuple[int, int], ...]:
  """Explicit `((lo, hi), (lo, hi))` padding for nn.Conv's padding spellings."""
  if isinstance(padding, str):
    return tuple(lax.padtype_to_pads(in_hw, kernel, strides, padding.upper()))
  if isinstance(padding, int):
    return ((padding, padding),) * 2
  return tuple((p, p) if isinstance(p, int) else tuple(p) for p in padding)


def patches(x, kernel: Sequence[int], strides: Sequence[int], pads) -> jax.Array:
  """`[B, H', W', kh * kw * C]` im2col patches of `x` `[B, H, W, C]`, ordered (p, q, c) as a
  kernel `[kh, kw, C, O]` reshaped to `[kh * kw * C, O]`."""
  kh, kw = kernel
  sh, sw = strides
  x = jnp.pad(x, ((0, 0),) + tuple(pads) + ((0, 0),))
  ho = (x.shape[1] - kh) // sh + 1
  wo = (x.shape[2] - kw) // sw + 1
  cols = [x[:, p:p + sh * (ho - 1) + 1:sh, q:q + sw * (wo - 1) + 1:sw, :] for p in range(kh) for q in range(kw)]
  return cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=-1)


def conv_gemm(x, kernel, strides=(1, 1), pads=((0, 0), (0, 0)), precision=None,
              preferred_element_type=None) -> jax.Array:
  """`lax.conv_general_dilated(x, kernel, strides, pads)` in NHWC / HWIO, as one matrix
  product over im2col patches."""
  kh, kw, cin, cout = kernel.shape
  if x.shape[-1] != cin:
    raise ValueError(f"conv_gemm: input has {x.shape[-1]} channels, kernel expects {cin}")
  cols = patches(x, (kh, kw), strides, pads)
  return jnp.einsum("bhwk,ko->bhwo", cols, kernel.reshape(kh * kw * cin, cout), precision=precision,
                    preferred_element_type=preferred_element_type)


class Conv(nn.Module):
  """`flax.linen.Conv`'s parameters and result (2-D, no dilation or groups), computed as
  an im2col matrix product (`conv_gemm`). `dtype` is the computation dtype (inputs and
  parameters are cast to it, as nn.Conv does); `param_dtype` the parameters'.

  Named `Conv` (exported as `GemmConv`) so that Flax's automatic names (`Conv_0`, ...) and
  so the parameter trees are those of `nn.Conv`."""
  features: int
  kernel_size: Sequence[int]
  strides: int | Sequence[int] = 1
  padding: Any = "SAME"
  use_bias: bool = True
  dtype: Any = None
  param_dtype: Any = jnp.float32
  precision: Any = None
  kernel_init: Callable = nn.linear.default_kernel_init
  bias_init: Callable = nn.initializers.zeros_init()

  @nn.compact
  def __call__(self, x):
    kernel_size = tuple(self.kernel_size)
    if len(kernel_size) != 2 or x.ndim != 4:
      raise ValueError(f"GemmConv: 2-D convolutions of [B, H, W, C] inputs only; got kernel {kernel_size} "
                       f"and input shape {x.shape}")
    strides = (self.strides,) * 2 if isinstance(self.strides, int) else tuple(self.strides)
    kernel = self.param("kernel", self.kernel_init, kernel_size + (x.shape[-1], self.features), self.param_dtype)
    bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
    y = conv_gemm(x, kernel, strides, _pairs(self.padding, kernel_size, strides, x.shape[1:3]), self.precision)
    return y if bias is None else y + bias


GemmConv = Conv


def conv_class(impl: str) -> type:
  """The Flax convolution class for `model.conv_impl`."""
  if impl not in CONV_IMPLS:
    raise ValueError(f"model.conv_impl: unknown {impl!r}; choose one of {list(CONV_IMPLS)}")
  return nn.Conv if impl == "xla" else GemmConv
