"""DistilBERT and GPT-2 in Flax Linen, with the featurizer / classifier split, and Hugging
Face checkpoints read from local files (never downloaded).

Inputs are int32 token ids `[B, T]`; padded positions hold `PAD = -1` (`fedjax_dg.data.text`),
so the attention mask is `ids >= 0` and no config has to agree with a tokenizer on a pad
id. Padded positions are looked up as token 0 and masked out of every attention; their
outputs are never read by a loss (`token_cross_entropy`) or a metric.

DistilBERT (Sanh et al. 2019; `transformers.DistilBertModel`): word + position embeddings,
LayerNorm (eps 1e-12), `n_layers` post-LN blocks (`sa_layer_norm(x + out_lin(attn))`,
`output_layer_norm(x + lin2(gelu(lin1(x))))`, exact erf GELU), attention scores masked with
the dtype's minimum as HF does. The featurizer returns the first token's ([CLS]) vector,
as the authors' `DistilBertFeaturizer` (Bai et al. 2024's code) and WILDS's classifier read it;
the classifier is `Classifier(num_classes, model.head_hidden)`: a linear layer (the
authors' code), or with `head_hidden=(dim,)` HF's `pre_classifier` + ReLU + `classifier`.
Dropout is left out (evaluation-mode forward).

GPT-2 (Radford et al. 2019; CodeGPT-small-py is GPT-2 small with its own vocabulary;
`transformers.GPT2LMHeadModel`): token + position embeddings, `n_layer` pre-LN blocks
(`x + c_proj(attn(ln_1(x)))`, `x + c_proj(gelu_new(c_fc(ln_2(x))))`), `ln_f`, causal
attention also masked by the padding. HF ties the LM head to the input embedding
(`lm_head.weight is transformer.wte.weight`). Here the tied matrix lives ONCE, in
`params["classifier"]["wte"]` `[V, d]`: the head is `h @ wte.T` and the featurizer reads
its input embeddings from the same leaf (`TiedSplitModel.features`). So
- aggregation sees the tied matrix as one leaf (averaged once, sent once, as HF's
  `state_dict` averaging does it);
- a gradient of the full model w.r.t. `params["classifier"]["wte"]` is the tied gradient
  (output path + input-embedding path), as in PyTorch;
- a head gradient at fixed features, `grad_psi L(head(psi, z))` (FedIIR's statistic,
  FedLOE's head training), is the output path only: the LM head's own gradient.
`params["featurizer"]` holds `wpe`, the blocks `h_{i}` and `ln_f`. `Model.apply` returns
per-token logits `[B, T, V]`; `Model.features` per-token hidden states `[B, T, d]`.

Checkpoint keys (HF naming, a leading `distilbert.` / `transformer.` optional): PyTorch
`nn.Linear` weights are `[out, in]` and are transposed; GPT-2's `Conv1D` weights are
already `[in, out]`. Buffers (`position_ids`, `attn.bias`, `attn.masked_bias`) and
DistilBERT's masked-LM head (`vocab_*`) are ignored; any other unknown key is an error.
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

IGNORE = -100  # a label position that no loss or metric reads (WILDS / PyTorch's ignore_index)


class TextConfig(NamedTuple):
  """Transformer sizes, from a Hugging Face `config.json` or the base defaults."""
  vocab_size: int
  max_positions: int
  dim: int
  num_layers: int
  num_heads: int
  ffn_dim: int
  eps: float


DEFAULTS = {  # distilbert-base-uncased; GPT-2 small (CodeGPT-small-py's vocabulary differs: use its config.json)
    "distilbert": TextConfig(30522, 512, 768, 6, 12, 3072, 1e-12),
    "gpt2": TextConfig(50257, 1024, 768, 12, 12, 3072, 1e-5),
}
# The largest size accepted per TextConfig field (vocabulary, positions, width, layers, heads,
# feed-forward width): a config beyond them is not a DistilBERT or GPT-2 (and would not fit).
SIZE_CAPS = (1 << 22, 1 << 16, 1 << 15, 256, 256, 1 << 17, None)
# HF config.json field names per architecture, in TextConfig order.
HF_FIELDS = {
    "distilbert": ("vocab_size", "max_position_embeddings", "dim", "n_layers", "n_heads", "hidden_dim", None),
    "gpt2": ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "layer_norm_epsilon"),
}


def read_hf_config(name: str, path: str) -> TextConfig:
  """The sizes in a Hugging Face `config.json` (GPT-2's `n_inner: null` is `4 n_embd`)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"model.hf_config: no such file {path!r}")
  try:
    with open(path) as f:
      raw = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: not a JSON config ({e})") from None
  if not isinstance(raw, dict):
    raise ValueError(f"{path}: not a JSON object of model sizes")
  base = DEFAULTS[name]
  vals = []
  for field, default in zip(HF_FIELDS[name], base):
    v = raw.get(field) if field else None
    if field in ("n_inner",) and v is None:
      v = 4 * int(raw.get("n_embd", base.dim))
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 and (
        isinstance(default, float) or float(v) == int(v))
    if v is not None and not ok:
      raise ValueError(f"{path}: {field} must be a positive {'number' if isinstance(default, float) else 'integer'}, "
                       f"got {v!r}")
    vals.append(default if v is None else type(default)(v))
  cfg = TextConfig(*vals)
  for field, v, cap in zip(HF_FIELDS[name], cfg, SIZE_CAPS):
    if cap and v > cap:
      raise ValueError(f"{path}: {field} = {v} exceeds {cap} (not a {name} size)")
  if cfg.dim % cfg.num_heads:
    raise ValueError(f"{path}: hidden size {cfg.dim} is not a multiple of the {cfg.num_heads} heads")
  return cfg


def text_config(name: str, model_config) -> TextConfig:
  path = model_config.get("hf_config", "")
  return read_hf_config(name, path) if path else DEFAULTS[name]


def attention(q, k, v, allowed, num_heads: int):
  """Multi-head softmax attention; `allowed` `[B, Tq, Tk]` bool. Masked scores are the
  dtype's minimum (HF's `masked_fill(finfo.min)`), so a fully masked row stays finite."""
  b, tq, d = q.shape
  hd = d // num_heads
  split = lambda a: a.reshape(a.shape[0], a.shape[1], num_heads, hd)
  s = jnp.einsum("bqhd,bkhd->bhqk", split(q) / math.sqrt(hd), split(k))
  s = jnp.where(allowed[:, None], s, jnp.finfo(s.dtype).min)
  return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), split(v)).reshape(b, tq, d)


class DistilBertLayer(nn.Module):
  cfg: TextConfig

  @nn.compact
  def __call__(self, x, allowed):
    c = self.cfg
    q, k, v = (nn.Dense(c.dim, name=n)(x) for n in ("q_lin", "k_lin", "v_lin"))
    x = nn.LayerNorm(c.eps, name="sa_layer_norm")(x + nn.Dense(c.dim, name="out_lin")(attention(q, k, v, allowed, c.num_heads)))
    f = nn.Dense(c.dim, name="lin2")(jax.nn.gelu(nn.Dense(c.ffn_dim, name="lin1")(x), approximate=False))
    return nn.LayerNorm(c.eps, name="output_layer_norm")(x + f)


class DistilBertFeaturizer(nn.Module):
  """Token ids `[B, T]` (PAD = -1) -> the [CLS] vector `[B, dim]`."""
  cfg: TextConfig

  @nn.compact
  def __call__(self, ids):
    c = self.cfg
    ids = ids.astype(jnp.int32)
    keep = ids >= 0
    pos = jnp.arange(ids.shape[1])
    x = nn.Embed(c.vocab_size, c.dim, name="word_embeddings")(jnp.maximum(ids, 0))
    x = x + nn.Embed(c.max_positions, c.dim, name="position_embeddings")(pos)[None]
    x = nn.LayerNorm(c.eps, name="embeddings_LayerNorm")(x)
    allowed = jnp.broadcast_to(keep[:, None, :], (ids.shape[0], ids.shape[1], ids.shape[1]))
    for i in range(c.num_layers):
      x = DistilBertLayer(c, name=f"layer_{i}")(x, allowed)
    return x[:, 0]


def gelu_new(x):
  """GPT-2's tanh approximation of GELU (HF `gelu_new`)."""
  return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


class GPT2Block(nn.Module):
  cfg: TextConfig

  @nn.compact
  def __call__(self, x, allowed):
    c = self.cfg
    q, k, v = jnp.split(nn.Dense(3 * c.dim, name="c_attn")(nn.LayerNorm(c.eps, name="ln_1")(x)), 3, axis=-1)
    x = x + nn.Dense(c.dim, name="attn_c_proj")(attention(q, k, v, allowed, c.num_heads))
    h = gelu_new(nn.Dense(c.ffn_dim, name="c_fc")(nn.LayerNorm(c.eps, name="ln_2")(x)))
    return x + nn.Dense(c.dim, name="mlp_c_proj")(h)


class GPT2Featurizer(nn.Module):
  """Token embeddings `[B, T, d]` and the keep mask `[B, T]` -> hidden states `[B, T, d]`
  (position embeddings, causal + padding attention, the blocks, `ln_f`)."""
  cfg: TextConfig

  @nn.compact
  def __call__(self, tok, keep):
    c = self.cfg
    t = tok.shape[1]
    x = tok + nn.Embed(c.max_positions, c.dim, name="wpe")(jnp.arange(t))[None]
    allowed = keep[:, None, :] & jnp.tril(jnp.ones((t, t), bool))[None]
    for i in range(c.num_layers):
      x = GPT2Block(c, name=f"h_{i}")(x, allowed)
    return nn.LayerNorm(c.eps, name="ln_f")(x)


class TiedLMHead(nn.Module):
  """The tied LM head: `wte` `[V, d]` embeds the input and maps hidden states to logits."""
  num_classes: int  # the vocabulary size (the algorithms read `classifier.num_classes`)
  dim: int

  def setup(self):
    self.wte = self.param("wte", nn.initializers.normal(0.02), (self.num_classes, self.dim))

  def embed(self, ids):
    return jnp.take(self.wte, ids, axis=0)

  def __call__(self, h):
    return h @ self.wte.T


class TiedSplitModel(nn.Module):
  """`f = head o g` where `g` reads its input embeddings from the head's `wte`."""
  featurizer: GPT2Featurizer
  classifier: TiedLMHead

  def features(self, ids):
    ids = ids.astype(jnp.int32)
    return self.featurizer(self.classifier.embed(jnp.maximum(ids, 0)), ids >= 0)

  def __call__(self, ids):
    return self.classifier(self.features(ids))


# ---------------------------------------------------------------------------- losses


def token_loss_sums(logits, labels, mask=None):
  """Per example: the summed cross-entropy over its labelled tokens and their number
  (`labels == IGNORE` and padded examples, `mask == 0`, count nothing). `[B]`, `[B]`."""
  valid = labels != IGNORE
  if mask is not None:
    valid = valid & (mask[:, None] > 0)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.where(valid, labels, 0))
  return jnp.sum(jnp.where(valid, ce, 0.0), -1), jnp.sum(valid, -1).astype(logits.dtype)


def token_cross_entropy(logits, labels, mask=None):
  """Mean cross-entropy over all labelled tokens of the real examples of a batch: WILDS's
  Py150 loss (`CrossEntropyLoss(ignore_index=-100)` over the flattened tokens)."""
  sums, counts = token_loss_sums(logits, labels, mask)
  return jnp.sum(sums) / jnp.maximum(jnp.sum(counts), 1.0)


# ---------------------------------------------------------------------------- checkpoints

_LINEAR = "kernel"
_DISTILBERT_IGNORED = re.compile(r"(vocab_transform|vocab_layer_norm|vocab_projector)\..*|.*position_ids")
_GPT2_IGNORED = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)|.*position_ids")
_LN = {"weight": "scale", "bias": "bias"}


def _distilbert_path(key: str, head_layers: int):
  """(flax path, transpose) of a DistilBERT key, or None when ignored."""
  key = key.removeprefix("distilbert.")
  if _DISTILBERT_IGNORED.fullmatch(key):
    return None
  m = re.fullmatch(r"embeddings\.(word_embeddings|position_embeddings)\.weight", key)
  if m:
    return ("featurizer", m[1], "embedding"), False
  m = re.fullmatch(r"embeddings\.LayerNorm\.(weight|bias)", key)
  if m:
    return ("featurizer", "embeddings_LayerNorm", _LN[m[1]]), False
  m = re.fullmatch(r"transformer\.layer\.(\d+)\.(?:attention|ffn)\.(q_lin|k_lin|v_lin|out_lin|lin1|lin2)\.(weight|bias)", key)
  if m:
    return ("featurizer", f"layer_{m[1]}", m[2], _LINEAR if m[3] == "weight" else "bias"), m[3] == "weight"
  m = re.fullmatch(r"transformer\.layer\.(\d+)\.(sa_layer_norm|output_layer_norm)\.(weight|bias)", key)
  if m:
    return ("featurizer", f"layer_{m[1]}", m[2], _LN[m[3]]), False
  m = re.fullmatch(r"(pre_classifier|classifier)\.(weight|bias)", key)
  if m:
    layer = 0 if m[1] == "pre_classifier" else head_layers - 1
    if m[1] == "pre_classifier" and head_layers < 2:
      raise ValueError(f"checkpoint key {key!r} needs model.head_hidden=(dim,) (HF's pre_classifier)")
    return ("classifier", f"Dense_{layer}", _LINEAR if m[2] == "weight" else "bias"), m[2] == "weight"
  raise ValueError(f"not a DistilBERT key: {key!r}")


def _gpt2_path(key: str, head_layers: int):
  """(flax path, transpose) of a GPT-2 key, or None when ignored (Conv1D needs no transpose)."""
  del head_layers
  if key == "lm_head.weight":
    return ("classifier", "wte"), False
  key = key.removeprefix("transformer.")
  if _GPT2_IGNORED.fullmatch(key):
    return None
  if key == "wte.weight":
    return ("classifier", "wte"), False
  if key == "wpe.weight":
    return ("featurizer", "wpe", "embedding"), False
  m = re.fullmatch(r"ln_f\.(weight|bias)", key)
  if m:
    return ("featurizer", "ln_f", _LN[m[1]]), False
  m = re.fullmatch(r"h\.(\d+)\.(ln_1|ln_2)\.(weight|bias)", key)
  if m:
    return ("featurizer", f"h_{m[1]}", m[2], _LN[m[3]]), False
  m = re.fullmatch(r"h\.(\d+)\.(attn|mlp)\.(c_attn|c_proj|c_fc)\.(weight|bias)", key)
  if m:
    name = {"c_proj": f"{m[2]}_c_proj"}.get(m[3], m[3])
    return ("featurizer", f"h_{m[1]}", name, _LINEAR if m[4] == "weight" else "bias"), False
  raise ValueError(f"not a GPT-2 key: {key!r}")


PATHS = {"distilbert": _distilbert_path, "gpt2": _gpt2_path}


def hf_to_flax(name: str, state_dict: dict, head_layers: int = 1) -> dict:
  """Flat `{flax path: array}` of a Hugging Face state_dict for `name` (see the module
  docstring); the tied GPT-2 matrix may appear as `wte` and/or `lm_head` (equal if both)."""
  out = {}
  for key, value in state_dict.items():
    hit = PATHS[name](key, head_layers)
    if hit is None:
      continue
    path, transpose = hit
    value = np.asarray(value)
    value = value.T if transpose else value
    if path in out and not np.array_equal(out[path], value):
      raise ValueError(f"checkpoint key {key!r}: the tied lm_head and wte differ")
    out[path] = value
  return out


def load_hf_weights(name: str, params, path: str):
  """`params` with every leaf the checkpoint at `path` (`.safetensors`, or `.bin` / `.pth`
  through `convert.read_state_dict`'s restricted unpickler) holds. Every featurizer leaf
  must be in the file; the head is loaded when the file has it (a fine-tuned model) and
  kept at its initialisation otherwise (a base checkpoint). Shapes must match."""
  from fedjax_dg.models import convert  # pylint: disable=g-import-not-at-top
  flat = traverse_util.flatten_dict(params)
  head_layers = sum(1 for k in flat if k[0] == "classifier" and k[-1] == _LINEAR)
  state_dict = convert.read_state_dict(path)  # its errors name the file
  try:
    loaded = hf_to_flax(name, state_dict, head_layers)
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None
  for key in flat:
    if key[0] == "featurizer" and key not in loaded:
      raise ValueError(f"{path}: missing parameter {'/'.join(key)} (not in the checkpoint)")
  head = [k for k in flat if k[0] == "classifier"]
  if any(k in loaded for k in head) and not all(k in loaded for k in head):
    missing = next(k for k in head if k not in loaded)
    raise ValueError(f"{path}: the checkpoint has part of the head but not {'/'.join(missing)}")
  for key, value in loaded.items():
    if key not in flat:
      raise ValueError(f"{path}: parameter {'/'.join(key)} is not in the model (check model.hf_config)")
    if tuple(value.shape) != tuple(flat[key].shape):
      raise ValueError(f"{path}: shape mismatch at {'/'.join(key)}: file {tuple(value.shape)}, "
                       f"model {tuple(flat[key].shape)} (check model.hf_config)")
  new = {k: jnp.asarray(loaded[k], dtype=v.dtype) if k in loaded else v for k, v in flat.items()}
  return traverse_util.unflatten_dict(new)
