"""Flax (Linen) models with an explicit featurizer / classifier split.

We use Linen's functional `apply` everywhere: parameters are a plain pytree
`{"featurizer": ..., "classifier": ...}`, so an algorithm addresses the head as
`params["classifier"]` (the method papers' `psi`) and the featurizer as `params["featurizer"]`
(`phi`), and `vmap` / `grad` see nothing but arrays.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_dg.models.conv import conv_class


class MLPFeaturizer(nn.Module):
  hidden: Sequence[int] = (200, 200)
  dtype: Any = None  # computation dtype (`model.dtype`); parameters stay float32

  @nn.compact
  def __call__(self, x):
    x = x.reshape((x.shape[0], -1))
    for h in self.hidden:
      x = nn.relu(nn.Dense(h, dtype=self.dtype)(x))
    return x


class MNISTCNNFeaturizer(nn.Module):
  """DomainBed's `MNIST_CNN` featurizer: four 3x3 convs (64, 128/2, 128, 128), each
  followed by ReLU and GroupNorm(8), then global average pooling to 128 features.
  `conv_impl` picks the convolution (models/conv.py), `dtype` the computation dtype."""
  conv_impl: str = "xla"
  dtype: Any = None

  @nn.compact
  def __call__(self, x):
    conv = conv_class(self.conv_impl)
    for width, stride in ((64, 1), (128, 2), (128, 1), (128, 1)):
      x = conv(width, (3, 3), strides=stride, padding=1, dtype=self.dtype)(x)
      x = nn.GroupNorm(num_groups=8, dtype=self.dtype)(nn.relu(x))
    return x.mean(axis=(1, 2))


class LeafCNNFeaturizer(nn.Module):
  """The FEMNIST CNN of Bai et al. 2024's code (`src/models.py: CNN`, LEAF's FEMNIST model): two
  5x5 convs (16, 64 channels, padding 2) each with ReLU and 2x2 max-pooling, then a linear
  layer to 2048 features (no activation). For 28 x 28 x 1 inputs."""
  features: int = 2048
  conv_impl: str = "xla"
  dtype: Any = None

  @nn.compact
  def __call__(self, x):
    conv = conv_class(self.conv_impl)
    for width in (16, 64):
      x = conv(width, (5, 5), padding=2, dtype=self.dtype)(x)
      x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
    return nn.Dense(self.features, dtype=self.dtype)(x.reshape((x.shape[0], -1)))


class Classifier(nn.Module):
  """The head `h_psi`: a linear layer, or an MLP head if `hidden` is given.

  Attributes:
    num_classes: the number of outputs.
    hidden: widths of the head's hidden ReLU layers (none: linear).
    dtype: the computation dtype (`model.dtype`); parameters stay float32.
  """
  num_classes: int
  hidden: Sequence[int] = ()
  dtype: Any = None

  @nn.compact
  def __call__(self, z):
    for h in self.hidden:
      z = nn.relu(nn.Dense(h, dtype=self.dtype)(z))
    return to_float32(nn.Dense(self.num_classes, dtype=self.dtype)(z))


def torch_linear_init(key, shape, dtype=jnp.float32, fan_in: int | None = None):
  """PyTorch's `nn.Linear` default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (`kaiming_uniform_`
  with a = sqrt(5) for the weight, the same bound for the bias). `fan_in` defaults to
  `shape[0]`, right for a Flax kernel [in, out]; a bias passes it explicitly."""
  bound = 1.0 / jnp.sqrt(shape[0] if fan_in is None else fan_in)
  return jax.random.uniform(key, shape, dtype, -bound, bound)


class ProjectedFeaturizer(nn.Module):
  """A featurizer followed by one linear layer to `width` features (`model.feature_projection`).

  Guo et al. 2023 (FedIIR) Sec. 5.1: for VLCS and PACS it uses "ResNet-18 as the feature
  representation Phi, replacing the last fully connected layer with a 512-dimensional
  linear layer", and for OfficeHome ResNet-50 with "a 2048-dimensional linear layer"; its
  classifier `w` (two FC layers there) reads that layer's output, so FedIIR's penalty acts
  on the head over it. A *linear* layer: no activation follows it (the paper names none).
  Its initialisation is not stated; torchvision's `fc` that it replaces is an `nn.Linear`,
  so we use `nn.Linear`'s default (`torch_linear_init`, weight and bias
  U(+-1/sqrt(fan_in))). (The authors' released code, YamingGuo98/FedIIR at 3e7a785, sets
  `fc = Identity()` with no such layer; width 0, our default, is that code.)

  The base module shares this module's scope (`nn.share_scope`), so the parameters are
  the base's own, unchanged (torchvision names for a ResNet), plus `projection/{kernel,
  bias}`; pretrained loading (models/resnet.py `load_pretrained`) fills the base and
  leaves `projection` at its initialisation. `freeze` stops the gradient at the output,
  so nothing under `params["featurizer"]` trains (`model.freeze_featurizer`).
  """
  base: nn.Module
  width: int
  freeze: bool = False
  dtype: Any = None

  def setup(self):
    nn.share_scope(self, self.base)

  @nn.compact
  def __call__(self, x):
    z = self.base(x)
    fan_in = z.shape[-1]
    z = nn.Dense(self.width, kernel_init=torch_linear_init, name=PROJECTION, dtype=self.dtype,
                 bias_init=lambda k, s, d=jnp.float32: torch_linear_init(k, s, d, fan_in=fan_in))(z)
    return jax.lax.stop_gradient(z) if self.freeze else z


PROJECTION = "projection"  # the key of ProjectedFeaturizer's layer under params["featurizer"]


class SplitModel(nn.Module):
  """`f = h_psi o g_phi`; parameters under `featurizer` and `classifier`.

  Attributes:
    featurizer: `g_phi`, inputs -> features (`features(x)`).
    classifier: `h_psi`, features -> logits (a `Classifier`).
  """
  featurizer: nn.Module
  classifier: nn.Module

  def __call__(self, x):
    return self.classifier(self.featurizer(x))

  def features(self, x):
    return to_float32(self.featurizer(x))


DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}  # model.dtype: the computation dtype


def to_float32(z):
  """Low-precision (bfloat16 / float16) outputs as float32; anything else unchanged, so
  losses, penalties and metrics stay in float32 (float64 in float64 tests)."""
  return z.astype(jnp.float32) if z.dtype in (jnp.bfloat16, jnp.float16) else z


def compute_dtype(model_config):
  """The computation dtype for `model.dtype` ("float32" or "bfloat16"; None means float32).

  Mixed precision: with "bfloat16" every layer casts its inputs and its float32 parameters
  to bfloat16 and computes in it (matrix products accumulate in float32 on GPUs and TPUs;
  normalisation statistics are reduced in float32), while the parameters, their gradients
  (the transpose of the cast) and the optimizer state stay float32; logits and features
  leave the model as float32."""
  name = model_config.get("dtype", "float32")
  if name not in DTYPES:
    raise ValueError(f"model.dtype: unknown {name!r}; choose one of {list(DTYPES)}")
  return DTYPES[name]


# XLA's backend optimisation level for the initialisation program. Flax's `init` run eagerly
# compiles one small program per initializer and parameter shape (truncated normals, uniforms),
# which on a fresh machine (an empty compilation cache) is most of the time before the first
# round. One program at level 1 compiles 2.7-4x faster than those eager programs and gives
# their parameters bit for bit for the MLP and the small CNNs (tests/test_model_init.py);
# XLA's default level is slower still, and level 0 changes the last bit of some values
# (benchmarks/init_compile.py, docs/peers.md#start-up).
INIT_OPTIMIZATION_LEVEL = 1


def _flax_init(module: nn.Module, input_shape: tuple, preprocess, rng):
  """Flax's `module.init` on a zero input row of `input_shape` (after `preprocess`): its
  "params" collection."""
  x = jnp.zeros((1,) + tuple(input_shape), jnp.float32)
  return module.init(rng, x if preprocess is None else preprocess(x))["params"]


_compiled_init = jax.jit(_flax_init, static_argnums=(0, 1, 2),
                         compiler_options={"xla_backend_optimization_level": INIT_OPTIMIZATION_LEVEL})


@dataclasses.dataclass(frozen=True)
class Model:
  """Pure functions over a parameter pytree. `preprocess` maps stored inputs (uint8 images,
  or floats) to what the network reads (`to_float`, plus ImageNet normalisation for the
  ResNets), so uint8 stores never need a float copy. `load`, if set, maps freshly
  initialised params to pretrained ones (the text models' local Hugging Face weights,
  `model.hf_weights`), so `init` returns the starting point of training. `modality` is
  `MODALITY[model.name]`.

  Attributes:
    module: the Flax module: a `SplitModel`, or models.text.TiedSplitModel (GPT-2's tied head).
    input_shape: the shape of one input row.
    preprocess: stored inputs -> network inputs, or None.
    load: freshly initialised params -> pretrained ones, or None.
    modality: "image", "text" or "any".
    conv_impl: `model.conv_impl`, which convolution the image models use (models/conv.py).
  """
  module: nn.Module  # SplitModel, or models.text.TiedSplitModel (GPT-2's tied head)
  input_shape: tuple[int, ...]
  preprocess: Callable | None = None
  load: Callable | None = None
  modality: str = "image"
  conv_impl: str = "xla"  # model.conv_impl: which convolution the image models use (models/conv.py)

  def _in(self, x):
    return x if self.preprocess is None else self.preprocess(x)

  def init(self, rng) -> dict:
    """The initial parameters: Flax's `init` on a zero input, compiled as one program at
    `INIT_OPTIMIZATION_LEVEL` (for ResNet-18 this differs from Flax's eager `init` in the
    last bit of some convolution kernels: a different rounding of the same draw; inside a
    caller's `jit` or `vmap`, Flax's `init` traced into the caller's program), then `load`
    (pretrained weights) where set.

    Args:
      rng: a PRNG key.

    Returns:
      The parameter pytree.
    """
    if isinstance(rng, jax.core.Tracer):  # inside a caller's jit or vmap: traced into its program
      params = _flax_init(self.module, self.input_shape, self.preprocess, rng)
    else:
      params = _compiled_init(self.module, self.input_shape, self.preprocess, rng)
    return params if self.load is None else self.load(params)

  def apply(self, params, x):
    return self.module.apply({"params": params}, self._in(x))

  def features(self, params, x):
    return self.module.apply({"params": params}, self._in(x), method="features")

  def head(self, classifier_params, z):
    return self.module.classifier.apply({"params": classifier_params}, z)


MODELS = ("mlp", "cnn", "femnist_cnn", "resnet18", "resnet50", "distilbert", "gpt2")
# What each model reads: config validation can refuse methods that do not apply to a modality.
MODALITY = {"mlp": "any", "cnn": "image", "femnist_cnn": "image", "resnet18": "image", "resnet50": "image",
            "distilbert": "text", "gpt2": "text"}
def modality(model_name: str) -> str:
  """"image", "text" or "any" for a `model.name` in MODELS."""
  if model_name not in MODALITY:
    raise ValueError(f"model.name: unknown model {model_name!r}; choose one of {list(MODELS)}")
  return MODALITY[model_name]


def _build_text(name: str, model_config, input_shape, num_classes: int) -> Model:
  """DistilBERT (classifier on the [CLS] vector) or GPT-2 (tied LM head) on token ids
  `[T]`; weights from `model.hf_weights` when set (models/text.py)."""
  from fedjax_dg.models import text  # pylint: disable=g-import-not-at-top
  if len(input_shape) != 1:
    raise ValueError(f"model.name={name!r} needs token-id inputs [T], got input shape {tuple(input_shape)}")
  if model_config.get("feature_projection", 0):
    raise ValueError(f"model.feature_projection: not available for model.name={name!r} (image and MLP "
                     f"backbones only); set it to 0")
  if model_config.get("dtype", "float32") != "float32" or model_config.get("conv_impl", "xla") != "xla":
    raise ValueError(f"model.dtype / model.conv_impl: only 'float32' / 'xla' for model.name={name!r} "
                     f"(mixed precision and the GEMM convolution are for image and MLP models)")
  cfg = text.text_config(name, model_config)
  if input_shape[0] > cfg.max_positions:
    raise ValueError(f"model.name={name!r}: sequences of {input_shape[0]} tokens exceed the model's "
                     f"{cfg.max_positions} positions (data.max_tokens)")
  if name == "distilbert":
    module = SplitModel(featurizer=text.DistilBertFeaturizer(cfg),
                        classifier=Classifier(num_classes, tuple(model_config.get("head_hidden", ()))))
  else:
    if num_classes > cfg.vocab_size:
      raise ValueError(f"model.name='gpt2': the data has token ids up to {num_classes - 1}, beyond the "
                       f"model's vocabulary of {cfg.vocab_size} (model.hf_config)")
    module = text.TiedSplitModel(featurizer=text.GPT2Featurizer(cfg), classifier=text.TiedLMHead(cfg.vocab_size, cfg.dim))
  path = model_config.get("hf_weights", "")
  load = (lambda params: text.load_hf_weights(name, params, path)) if path else None
  return Model(module, tuple(input_shape), lambda x: jnp.asarray(x).astype(jnp.int32), load, "text")


def build_model(model_config, input_shape, num_classes: int) -> Model:
  """The model `model_config.name` names, for inputs of `input_shape` and `num_classes` classes.

  Args:
    model_config: `config.model` (`name`, `hidden`, `head_hidden`, `dtype`, `conv_impl`,
      `feature_projection`, ...).
    input_shape: the shape of one input row.
    num_classes: the head's outputs.

  Returns:
    The `Model`.

  Raises:
    ValueError: an unknown `model.name` or `model.conv_impl`, or non-image inputs for a
      convolutional model.
  """
  name = model_config.name
  if name in ("distilbert", "gpt2"):
    return _build_text(name, model_config, input_shape, num_classes)
  dtype = compute_dtype(model_config)
  impl = model_config.get("conv_impl", "xla")
  conv_class(impl)  # a clear error for an unknown model.conv_impl
  if name == "mlp":
    feat = MLPFeaturizer(tuple(model_config.hidden), dtype)
  elif name == "cnn":
    if len(input_shape) != 3:
      raise ValueError(f"model.name='cnn' needs image inputs [H, W, C], got input shape {input_shape}")
    feat = MNISTCNNFeaturizer(impl, dtype)
  elif name == "femnist_cnn":
    if len(input_shape) != 3:
      raise ValueError(f"model.name='femnist_cnn' needs image inputs [H, W, C], got input shape {input_shape}")
    feat = LeafCNNFeaturizer(conv_impl=impl, dtype=dtype)
  elif name in ("resnet18", "resnet50"):
    from fedjax_dg.models import resnet  # pylint: disable=g-import-not-at-top
    feat = resnet.featurizer(name, model_config, dtype)
  else:
    raise ValueError(f"model.name: unknown model {name!r}; choose one of {list(MODELS)}")
  width = int(model_config.get("feature_projection", 0))
  if width:  # Guo et al. 2023 Sec. 5.1's extra linear layer at the end of the featurizer
    freeze = name.startswith("resnet") and bool(model_config.get("freeze_featurizer", False))
    feat = ProjectedFeaturizer(feat, width, freeze, dtype)
  head = Classifier(num_classes, tuple(model_config.get("head_hidden", ())), dtype)
  from fedjax_dg.data.augment import normalize, to_float  # pylint: disable=g-import-not-at-top
  # ImageNet statistics for the ResNets (their pretrained weights expect them, as DomainBed's).
  prep = (lambda x: normalize(to_float(x))) if name.startswith("resnet") else to_float
  return Model(SplitModel(featurizer=feat, classifier=head), tuple(input_shape), prep,
               modality="any" if name == "mlp" else "image", conv_impl=impl)


def count_params(params) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(params))
