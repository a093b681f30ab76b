"""Flax (Linen) models with an explicit featurizer / classifier split.

We use Linen's functional `apply` everywhere: parameters are a plain pytree
`{"featurizer": ..., "classifier": ...}`, so an algorithm addresses the head as
`params["classifier"]` (seed papers' `psi`) and the featurizer as `params["featurizer"]`
(`phi`), and `vmap` / `grad` see nothing but arrays.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLPFeaturizer(nn.Module):
  hidden: Sequence[int] = (200, 200)

  @nn.compact
  def __call__(self, x):
    x = x.reshape((x.shape[0], -1))
    for h in self.hidden:
      x = nn.relu(nn.Dense(h)(x))
    return x


class MNISTCNNFeaturizer(nn.Module):
  """DomainBed's `MNIST_CNN` featurizer: four 3x3 convs (64, 128/2, 128, 128), each
  followed by ReLU and GroupNorm(8), then global average pooling to 128 features."""

  @nn.compact
  def __call__(self, x):
    for width, stride in ((64, 1), (128, 2), (128, 1), (128, 1)):
      x = nn.Conv(width, (3, 3), strides=stride, padding=1)(x)
      x = nn.GroupNorm(num_groups=8)(nn.relu(x))
    return x.mean(axis=(1, 2))


class Classifier(nn.Module):
  """The head `h_psi`: a linear layer, or an MLP head if `hidden` is given."""
  num_classes: int
  hidden: Sequence[int] = ()

  @nn.compact
  def __call__(self, z):
    for h in self.hidden:
      z = nn.relu(nn.Dense(h)(z))
    return nn.Dense(self.num_classes)(z)


class SplitModel(nn.Module):
  """`f = h_psi o g_phi`; parameters under `featurizer` and `classifier`."""
  featurizer: nn.Module
  classifier: nn.Module

  def __call__(self, x):
    return self.classifier(self.featurizer(x))

  def features(self, x):
    return self.featurizer(x)


@dataclasses.dataclass(frozen=True)
class Model:
  """Pure functions over a parameter pytree. `preprocess` maps stored inputs (uint8 images,
  or floats) to what the network reads (`to_float`, plus ImageNet normalisation for the
  ResNets), so uint8 stores never need a float copy."""
  module: SplitModel
  input_shape: tuple[int, ...]
  preprocess: Callable | None = None

  def _in(self, x):
    return x if self.preprocess is None else self.preprocess(x)

  def init(self, rng) -> dict:
    return self.module.init(rng, self._in(jnp.zeros((1,) + self.input_shape, jnp.float32)))["params"]

  def apply(self, params, x):
    return self.module.apply({"params": params}, self._in(x))

  def features(self, params, x):
    return self.module.apply({"params": params}, self._in(x), method=SplitModel.features)

  def head(self, classifier_params, z):
    return self.module.classifier.apply({"params": classifier_params}, z)


MODELS = ("mlp", "cnn", "resnet18", "resnet50")


def build_model(model_config, input_shape, num_classes: int) -> Model:
  name = model_config.name
  if name == "mlp":
    feat = MLPFeaturizer(tuple(model_config.hidden))
  elif name == "cnn":
    if len(input_shape) != 3:
      raise ValueError(f"model.name='cnn' needs image inputs [H, W, C], got input shape {input_shape}")
    feat = MNISTCNNFeaturizer()
  elif name in ("resnet18", "resnet50"):
    from fedjax_dg.models import resnet  # pylint: disable=g-import-not-at-top
    feat = resnet.featurizer(name, model_config)
  else:
    raise ValueError(f"model.name: unknown model {name!r}; choose one of {list(MODELS)}")
  head = Classifier(num_classes, tuple(model_config.get("head_hidden", ())))
  from fedjax_dg.data.augment import normalize, to_float  # pylint: disable=g-import-not-at-top
  # ImageNet statistics for the ResNets (their pretrained weights expect them, as DomainBed's).
  prep = (lambda x: normalize(to_float(x))) if name.startswith("resnet") else to_float
  return Model(SplitModel(featurizer=feat, classifier=head), tuple(input_shape), prep)


def count_params(params) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(params))
