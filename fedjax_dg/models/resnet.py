"""ResNet-18 / ResNet-50 featurizers, torchvision's architecture in Flax Linen.

The layout follows `torchvision.models.resnet` (v1.5: a Bottleneck block strides on its
3x3 conv) up to the global average pool; torchvision's `fc` is dropped and replaced by our
classifier head, as DomainBed does (or, with `model.feature_projection` > 0, by a fresh
linear layer ending the featurizer, Guo et al. 2023 Sec. 5.1: models.ProjectedFeaturizer). Parameter names mirror torchvision's `state_dict`
(`conv1`, `bn1`, `layer1_0/conv1`, `layer1_0/downsample_conv`, ...) so that
`fedjax_dg.models.convert` is a renaming plus a kernel transpose.

Batch norm. DomainBed freezes the BN statistics of its pretrained ResNet. Our engine has
a single `params` collection (it averages and vmaps that pytree), so `BatchNorm` keeps
`running_mean` / `running_var` *in the params* and reads them through
`jax.lax.stop_gradient`: their gradient is exactly zero, so gradient steps, momentum and
Adam leave them unchanged and federated averaging of identical copies returns them; the
affine `scale` / `bias` stay trainable. An optimizer that moves parameters without a
gradient would still move them: mask decoupled weight decay with `trainable_mask`.

With `model_config.freeze_bn = False` every batch is normalised by its own statistics
(training-mode BN *without* running averages, since there is nowhere to keep them).
Limitation: evaluation then also normalises by the statistics of the evaluation batch,
so predictions depend on batch composition, and the stored running statistics are unused.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging
from flax import traverse_util

from fedjax_dg.models.conv import conv_class

BN_STATS = ("running_mean", "running_var")

# torchvision initialises convolutions with kaiming_normal_(mode="fan_out", relu).
_conv_init = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class Ops(NamedTuple):
  """How the layers compute: `conv_impl` (models/conv.py: "xla" or "gemm") and the
  computation `dtype` (None: float32; parameters are float32 either way)."""
  conv_impl: str = "xla"
  dtype: Any = None


def conv(features: int, kernel: int, stride: int = 1, name: str | None = None, ops: Ops = Ops()) -> nn.Module:
  """torchvision's bias-free conv with symmetric padding `kernel // 2` (not 'SAME')."""
  pad = kernel // 2
  return conv_class(ops.conv_impl)(features, (kernel, kernel), strides=(stride, stride),
                                   padding=((pad, pad), (pad, pad)), use_bias=False, kernel_init=_conv_init,
                                   name=name, dtype=ops.dtype)


class BatchNorm(nn.Module):
  """BN over [B, H, W, C] with its running statistics held as (frozen) params."""
  freeze: bool = True
  eps: float = 1e-5  # torchvision's BatchNorm2d default
  dtype: Any = None  # computation dtype; statistics and the affine factors are formed in float32

  @nn.compact
  def __call__(self, x):
    c = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (c,))
    bias = self.param("bias", nn.initializers.zeros, (c,))
    mean = self.param("running_mean", nn.initializers.zeros, (c,))
    var = self.param("running_var", nn.initializers.ones, (c,))
    if self.freeze:
      mean, var = jax.lax.stop_gradient(mean), jax.lax.stop_gradient(var)
    else:
      axes = tuple(range(x.ndim - 1))
      xf = x.astype(jnp.promote_types(x.dtype, jnp.float32))
      mean = xf.mean(axes)
      var = jnp.square(xf - mean).mean(axes)  # biased, as torch normalises in training mode
    dt = self.dtype or jnp.promote_types(x.dtype, scale.dtype)
    x = x.astype(dt)
    return (x - mean.astype(dt)) * (scale * jax.lax.rsqrt(var + self.eps)).astype(dt) + bias.astype(dt)


class BasicBlock(nn.Module):
  """ResNet-18/34 block: two 3x3 convs, identity or 1x1-conv shortcut."""
  planes: int
  stride: int = 1
  freeze_bn: bool = True
  ops: Ops = Ops()

  @nn.compact
  def __call__(self, x):
    bn, o = lambda name: BatchNorm(self.freeze_bn, name=name, dtype=self.ops.dtype), self.ops
    y = nn.relu(bn("bn1")(conv(self.planes, 3, self.stride, "conv1", o)(x)))
    y = bn("bn2")(conv(self.planes, 3, 1, "conv2", o)(y))
    return nn.relu(y + shortcut(x, self.planes, self.stride, self.freeze_bn, o))


class Bottleneck(nn.Module):
  """ResNet-50 block (v1.5): 1x1, 3x3 with the stride, 1x1 to `4 * planes`."""
  planes: int
  stride: int = 1
  freeze_bn: bool = True
  ops: Ops = Ops()

  @nn.compact
  def __call__(self, x):
    bn, o = lambda name: BatchNorm(self.freeze_bn, name=name, dtype=self.ops.dtype), self.ops
    y = nn.relu(bn("bn1")(conv(self.planes, 1, 1, "conv1", o)(x)))
    y = nn.relu(bn("bn2")(conv(self.planes, 3, self.stride, "conv2", o)(y)))
    y = bn("bn3")(conv(4 * self.planes, 1, 1, "conv3", o)(y))
    return nn.relu(y + shortcut(x, 4 * self.planes, self.stride, self.freeze_bn, o))


def shortcut(x, features: int, stride: int, freeze_bn: bool, ops: Ops = Ops()):
  """Identity, or torchvision's `downsample` (1x1 conv + BN) when the shape changes.

  Called inside a block's compact `__call__`, so the submodules belong to that block."""
  if stride == 1 and x.shape[-1] == features:
    return x
  return BatchNorm(freeze_bn, name="downsample_bn", dtype=ops.dtype)(conv(features, 1, stride, "downsample_conv", ops)(x))


class ResNet(nn.Module):
  """torchvision ResNet without `fc`: images [B, H, W, 3] -> features [B, 512] (BasicBlock)
  or [B, 2048] (Bottleneck). `freeze_featurizer` stops all gradients into it."""
  stage_sizes: Sequence[int]
  block: type
  freeze_bn: bool = True
  freeze_featurizer: bool = False
  ops: Ops = Ops()

  @nn.compact
  def __call__(self, x):
    x = nn.relu(BatchNorm(self.freeze_bn, name="bn1", dtype=self.ops.dtype)(conv(64, 7, 2, "conv1", self.ops)(x)))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))  # pads with -inf, as torch
    for stage, blocks in enumerate(self.stage_sizes):
      for i in range(blocks):
        stride = 2 if stage > 0 and i == 0 else 1
        x = self.block(64 * 2 ** stage, stride, self.freeze_bn, self.ops, name=f"layer{stage + 1}_{i}")(x)
    x = x.mean(axis=(1, 2))
    return jax.lax.stop_gradient(x) if self.freeze_featurizer else x


ARCHITECTURES = {"resnet18": ((2, 2, 2, 2), BasicBlock), "resnet50": ((3, 4, 6, 3), Bottleneck)}


def featurizer(name: str, model_config, dtype=None) -> ResNet:
  """The featurizer for `model.name` in ARCHITECTURES, configured by `model.freeze_bn`
  (default True, as DomainBed), `model.freeze_featurizer` (default False),
  `model.conv_impl` (default "xla") and the computation `dtype` (`models.compute_dtype`)."""
  if name not in ARCHITECTURES:
    raise ValueError(f"model.name: unknown ResNet {name!r}; choose one of {list(ARCHITECTURES)}")
  stages, block = ARCHITECTURES[name]
  return ResNet(stages, block, freeze_bn=bool(model_config.get("freeze_bn", True)),
                freeze_featurizer=bool(model_config.get("freeze_featurizer", False)),
                ops=Ops(model_config.get("conv_impl", "xla"), dtype))


def trainable_mask(params):
  """A bool pytree like `params`: False at BN running statistics, True elsewhere. Pass as
  `optax.add_decayed_weights(wd, mask=trainable_mask)` so weight decay leaves them alone."""
  flat = traverse_util.flatten_dict(params)
  return traverse_util.unflatten_dict({k: k[-1] not in BN_STATS for k in flat})


def load_pretrained(params, path: str):
  """`params` with `params["featurizer"]` replaced by the weights in `path`.

  `path` is a torchvision checkpoint (`.pth` / `.pt`, `.safetensors`) or the output of
  `scripts/convert_torchvision_weights.py` (`.npz`, `.msgpack`). Every key and shape must
  match the initialised featurizer; arrays take the dtype of the params they replace.
  The extra linear layer of `model.feature_projection` (`featurizer/projection`, Guo et al. 2023
  Sec. 5.1) has no torchvision weights: it keeps its initialisation, and one line in the
  log says so.
  """
  from fedjax_dg.models import PROJECTION, convert  # pylint: disable=g-import-not-at-top
  loaded = traverse_util.flatten_dict(convert.load_featurizer_weights(path), sep="/")
  target = traverse_util.flatten_dict(params["featurizer"], sep="/")
  kept = {k: v for k, v in target.items() if k.split("/")[0] == PROJECTION}
  target = {k: v for k, v in target.items() if k not in kept}
  if kept:
    kernel = kept.get(f"{PROJECTION}/kernel")
    shape = "" if kernel is None else f" ({kernel.shape[0]} -> {kernel.shape[1]})"
    logging.warning("model.feature_projection: the featurizer's extra linear layer%s has no weights in %s; "
                    "it keeps its initialisation", shape, path)
  for key in list(target) + sorted(set(loaded) - set(target)):
    if key not in loaded:
      raise ValueError(f"{path}: missing featurizer parameter {key!r}")
    if key not in target:
      raise ValueError(f"{path}: unexpected parameter {key!r} (not in the {len(target)}-parameter featurizer)")
    if tuple(loaded[key].shape) != tuple(target[key].shape):
      raise ValueError(f"{path}: shape mismatch at {key!r}: file {tuple(loaded[key].shape)}, "
                       f"model {tuple(target[key].shape)}")
  new = {**{k: jnp.asarray(loaded[k], dtype=v.dtype) for k, v in target.items()}, **kept}
  return {**params, "featurizer": traverse_util.unflatten_dict(new, sep="/")}
