"""DistilBERT and GPT-2: tiny configurations with random weights written as Hugging Face
checkpoints (HF key naming, PyTorch layouts) equal an independent float64 NumPy forward
pass, with padding; padding never changes a loss or a penalty; the tied head."""
import json
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from safetensors.numpy import save_file

from fedjax_dg import objectives
from fedjax_dg.models import build_model, text
from test_resnet import write_state_dict_pth  # the hand-written torch-zip writer

jax.config.update("jax_enable_x64", False)

D, H, FFN, L, V, P = 16, 4, 24, 2, 50, 20


# ----------------------------------------------------------------- HF-format random weights

def distilbert_state(rng, num_labels=3, pre_classifier=True):
  s = {"distilbert.embeddings.word_embeddings.weight": rng.normal(0, 0.5, (V, D)),
       "distilbert.embeddings.position_embeddings.weight": rng.normal(0, 0.5, (P, D)),
       "distilbert.embeddings.LayerNorm.weight": 1 + 0.1 * rng.normal(size=D),
       "distilbert.embeddings.LayerNorm.bias": 0.1 * rng.normal(size=D),
       "distilbert.embeddings.position_ids": np.arange(P)[None],  # a buffer some versions save
       "vocab_projector.weight": rng.normal(size=(V, D))}          # the MLM head: ignored
  for i in range(L):
    p = f"distilbert.transformer.layer.{i}."
    for n in ("q_lin", "k_lin", "v_lin", "out_lin"):
      s[p + f"attention.{n}.weight"] = rng.normal(0, 0.3, (D, D))  # torch Linear: [out, in]
      s[p + f"attention.{n}.bias"] = 0.1 * rng.normal(size=D)
    s[p + "ffn.lin1.weight"], s[p + "ffn.lin1.bias"] = rng.normal(0, 0.3, (FFN, D)), 0.1 * rng.normal(size=FFN)
    s[p + "ffn.lin2.weight"], s[p + "ffn.lin2.bias"] = rng.normal(0, 0.3, (D, FFN)), 0.1 * rng.normal(size=D)
    for n in ("sa_layer_norm", "output_layer_norm"):
      s[p + f"{n}.weight"], s[p + f"{n}.bias"] = 1 + 0.1 * rng.normal(size=D), 0.1 * rng.normal(size=D)
  if pre_classifier:
    s["pre_classifier.weight"], s["pre_classifier.bias"] = rng.normal(0, 0.3, (D, D)), 0.1 * rng.normal(size=D)
  s["classifier.weight"], s["classifier.bias"] = rng.normal(0, 0.3, (num_labels, D)), 0.1 * rng.normal(size=num_labels)
  return {k: np.asarray(v, np.float32) if v.dtype.kind == "f" else v for k, v in s.items()}


def gpt2_state(rng, tied_key="transformer.wte.weight"):
  s = {tied_key: rng.normal(0, 0.5, (V, D)), "transformer.wpe.weight": rng.normal(0, 0.5, (P, D)),
       "transformer.ln_f.weight": 1 + 0.1 * rng.normal(size=D), "transformer.ln_f.bias": 0.1 * rng.normal(size=D)}
  for i in range(L):
    p = f"transformer.h.{i}."
    s[p + "attn.bias"] = np.tril(np.ones((P, P)))[None, None]  # causal-mask buffer: ignored
    for n in ("ln_1", "ln_2"):
      s[p + f"{n}.weight"], s[p + f"{n}.bias"] = 1 + 0.1 * rng.normal(size=D), 0.1 * rng.normal(size=D)
    # Conv1D weights are [in, out]
    s[p + "attn.c_attn.weight"], s[p + "attn.c_attn.bias"] = rng.normal(0, 0.3, (D, 3 * D)), 0.1 * rng.normal(size=3 * D)
    s[p + "attn.c_proj.weight"], s[p + "attn.c_proj.bias"] = rng.normal(0, 0.3, (D, D)), 0.1 * rng.normal(size=D)
    s[p + "mlp.c_fc.weight"], s[p + "mlp.c_fc.bias"] = rng.normal(0, 0.3, (D, FFN)), 0.1 * rng.normal(size=FFN)
    s[p + "mlp.c_proj.weight"], s[p + "mlp.c_proj.bias"] = rng.normal(0, 0.3, (FFN, D)), 0.1 * rng.normal(size=D)
  return {k: np.asarray(v, np.float32) for k, v in s.items()}


def write_hf(tmp_path, name, state):
  """A local HF model folder: config.json and model.safetensors."""
  cfg = ({"model_type": "distilbert", "vocab_size": V, "max_position_embeddings": P, "dim": D, "n_layers": L,
          "n_heads": H, "hidden_dim": FFN} if name == "distilbert" else
         {"model_type": "gpt2", "vocab_size": V, "n_positions": P, "n_embd": D, "n_layer": L, "n_head": H,
          "n_inner": FFN, "layer_norm_epsilon": 1e-5})
  d = tmp_path / name
  d.mkdir(exist_ok=True)
  (d / "config.json").write_text(json.dumps(cfg))
  save_file(state, str(d / "model.safetensors"))
  return str(d / "config.json"), str(d / "model.safetensors")


def model_config(name, hf_config, hf_weights, head_hidden=()):
  return ml_collections.ConfigDict({"name": name, "hf_config": hf_config, "hf_weights": hf_weights,
                                    "head_hidden": head_hidden})


# ----------------------------------------------------------------- float64 NumPy forwards

def ln(x, w, b, eps):
  mu = x.mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def softmax(s):
  s = s - s.max(-1, keepdims=True)
  e = np.exp(s)
  return e / e.sum(-1, keepdims=True)


def mha(q, k, v, allowed):
  """One sequence: q, k, v [T, D]; allowed [T, T]."""
  t, hd = q.shape[0], D // H
  out = np.zeros_like(q)
  for h in range(H):
    sl = slice(h * hd, (h + 1) * hd)
    s = q[:, sl] @ k[:, sl].T / math.sqrt(hd)
    s = np.where(allowed, s, -1e300)
    out[:, sl] = softmax(s) @ v[:, sl]
  return out


def erf_gelu(x):
  from scipy.special import erf
  return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def numpy_distilbert(s, ids):
  """HF DistilBertForSequenceClassification (eval mode) on one unpadded sequence."""
  g = lambda k: s[k].astype(np.float64)
  p = "distilbert."
  x = g(p + "embeddings.word_embeddings.weight")[ids] + g(p + "embeddings.position_embeddings.weight")[:len(ids)]
  x = ln(x, g(p + "embeddings.LayerNorm.weight"), g(p + "embeddings.LayerNorm.bias"), 1e-12)
  allowed = np.ones((len(ids), len(ids)), bool)
  for i in range(L):
    q = f"{p}transformer.layer.{i}."
    lin = lambda n, h: h @ g(q + n + ".weight").T + g(q + n + ".bias")
    a = lin("attention.out_lin", mha(lin("attention.q_lin", x), lin("attention.k_lin", x), lin("attention.v_lin", x), allowed))
    x = ln(a + x, g(q + "sa_layer_norm.weight"), g(q + "sa_layer_norm.bias"), 1e-12)
    f = lin("ffn.lin2", erf_gelu(lin("ffn.lin1", x)))
    x = ln(f + x, g(q + "output_layer_norm.weight"), g(q + "output_layer_norm.bias"), 1e-12)
  cls = x[0]
  h = np.maximum(cls @ g("pre_classifier.weight").T + g("pre_classifier.bias"), 0)
  return cls, h @ g("classifier.weight").T + g("classifier.bias")


def numpy_gpt2(s, ids):
  """HF GPT2LMHeadModel on one unpadded sequence: hidden states and logits [T, V]."""
  g = lambda k: s[k].astype(np.float64)
  wte = g("transformer.wte.weight") if "transformer.wte.weight" in s else g("lm_head.weight")
  t = len(ids)
  x = wte[ids] + g("transformer.wpe.weight")[:t]
  causal = np.tril(np.ones((t, t), bool))
  for i in range(L):
    q = f"transformer.h.{i}."
    conv = lambda n, h: h @ g(q + n + ".weight") + g(q + n + ".bias")
    h = ln(x, g(q + "ln_1.weight"), g(q + "ln_1.bias"), 1e-5)
    qq, kk, vv = np.split(conv("attn.c_attn", h), 3, -1)
    x = x + conv("attn.c_proj", mha(qq, kk, vv, causal))
    h = ln(x, g(q + "ln_2.weight"), g(q + "ln_2.bias"), 1e-5)
    u = conv("mlp.c_fc", h)
    x = x + conv("mlp.c_proj", 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3))))
  x = ln(x, g("transformer.ln_f.weight"), g("transformer.ln_f.bias"), 1e-5)
  return x, x @ wte.T


def padded(seqs, t):
  out = np.full((len(seqs), t), -1, np.int32)
  for i, s in enumerate(seqs):
    out[i, :len(s)] = s
  return out


SEQS = [[3, 17, 9, 41, 2, 5, 11], [7, 1, 30], [49, 0, 12, 12, 8, 22, 31, 4, 19, 6, 13, 44]]


# ----------------------------------------------------------------- tests

def test_distilbert_equals_numpy_with_padding(tmp_path):
  state = distilbert_state(np.random.default_rng(0))
  model = build_model(model_config("distilbert", *write_hf(tmp_path, "distilbert", state), head_hidden=(D,)), (P,), 3)
  params = model.init(jax.random.PRNGKey(1))  # loads the checkpoint over the random init
  x = padded(SEQS, P)
  logits, feats = np.asarray(model.apply(params, x)), np.asarray(model.features(params, x))
  for i, s in enumerate(SEQS):
    cls, want = numpy_distilbert(state, np.array(s))
    np.testing.assert_allclose(feats[i], cls, atol=1e-5, rtol=0)
    np.testing.assert_allclose(logits[i], want, atol=1e-5, rtol=0)
  assert np.abs(want).max() > 0.1  # not a trivially small output


def test_gpt2_equals_numpy_with_padding_and_tied_head(tmp_path):
  state = gpt2_state(np.random.default_rng(1))
  model = build_model(model_config("gpt2", *write_hf(tmp_path, "gpt2", state)), (P,), V)
  params = model.init(jax.random.PRNGKey(2))
  assert set(params) == {"featurizer", "classifier"} and set(params["classifier"]) == {"wte"}
  assert "wte" not in params["featurizer"]  # the tied matrix is one leaf
  x = padded(SEQS, P)
  logits, feats = np.asarray(model.apply(params, x)), np.asarray(model.features(params, x))
  assert logits.shape == (3, P, V) and np.all(np.isfinite(logits))
  for i, s in enumerate(SEQS):
    hid, want = numpy_gpt2(state, np.array(s))
    np.testing.assert_allclose(feats[i, :len(s)], hid, atol=1e-5, rtol=0)
    np.testing.assert_allclose(logits[i, :len(s)], want, atol=1e-5, rtol=0)
  # Left padding: the keys are masked, positions shift (HF's default arange positions).
  left = np.full((1, P), -1, np.int32)
  left[0, -3:] = SEQS[1]
  np.testing.assert_allclose(np.asarray(model.features(params, left))[0, -1],
                             numpy_gpt2_left(state, SEQS[1], P), atol=1e-5, rtol=0)


def numpy_gpt2_left(state, seq, t):
  """Last hidden state of a left-padded sequence: positions t-len..t-1, pad keys masked."""
  g = lambda k: state[k].astype(np.float64)
  n = len(seq)
  x = g("transformer.wte.weight")[np.array(seq)] + g("transformer.wpe.weight")[t - n:t]
  causal = np.tril(np.ones((n, n), bool))
  for i in range(L):
    q = f"transformer.h.{i}."
    conv = lambda nm, h: h @ g(q + nm + ".weight") + g(q + nm + ".bias")
    h = ln(x, g(q + "ln_1.weight"), g(q + "ln_1.bias"), 1e-5)
    qq, kk, vv = np.split(conv("attn.c_attn", h), 3, -1)
    x = x + conv("attn.c_proj", mha(qq, kk, vv, causal))
    u = conv("mlp.c_fc", ln(x, g(q + "ln_2.weight"), g(q + "ln_2.bias"), 1e-5))
    x = x + conv("mlp.c_proj", 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3))))
  return ln(x, g("transformer.ln_f.weight"), g("transformer.ln_f.bias"), 1e-5)[-1]


def test_gpt2_lm_head_key_and_torch_bin(tmp_path):
  """The tie stored as `lm_head.weight` only, read from a zip-format torch `.bin` written by hand."""
  state = gpt2_state(np.random.default_rng(3), tied_key="lm_head.weight")
  cfg_path, _ = write_hf(tmp_path, "gpt2", state)
  bin_path = str(tmp_path / "pytorch_model.bin")
  write_state_dict_pth(bin_path, {k: v for k, v in state.items() if v.dtype == np.float32})
  model = build_model(model_config("gpt2", cfg_path, bin_path), (P,), V)
  params = model.init(jax.random.PRNGKey(0))
  np.testing.assert_array_equal(np.asarray(params["classifier"]["wte"]), state["lm_head.weight"])
  _, want = numpy_gpt2(state, np.array(SEQS[0]))
  got = np.asarray(model.apply(params, padded(SEQS, P)))[0, :len(SEQS[0])]
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_bad_checkpoints_are_one_line_errors(tmp_path):
  state = distilbert_state(np.random.default_rng(0), pre_classifier=False)
  cfg, path = write_hf(tmp_path, "distilbert", {k: v for k, v in state.items()
                                                 if k != "distilbert.transformer.layer.1.ffn.lin2.bias"})
  with pytest.raises(ValueError, match=r"model.safetensors: missing parameter featurizer/layer_1/lin2/bias"):
    build_model(model_config("distilbert", cfg, path), (P,), 3).init(jax.random.PRNGKey(0))
  save_file({**state, "distilbert.pooler.dense.weight": np.zeros((2, 2), np.float32)}, path)
  with pytest.raises(ValueError, match=r"not a DistilBERT key: 'pooler.dense.weight'"):
    build_model(model_config("distilbert", cfg, path), (P,), 3).init(jax.random.PRNGKey(0))
  save_file(state, path)
  with pytest.raises(ValueError, match=r"shape mismatch at classifier/Dense_0/bias: file \(3,\), model \(2,\)"):
    build_model(model_config("distilbert", cfg, path), (P,), 2).init(jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match=r"needs token-id inputs \[T\]"):
    build_model(model_config("distilbert", cfg, path), (P, 2), 2)
  with pytest.raises(ValueError, match=r"exceed the model's 20 positions"):
    build_model(model_config("distilbert", cfg, path), (P + 1,), 2)


def test_base_checkpoint_keeps_the_head_initialisation(tmp_path):
  state = {k: v for k, v in distilbert_state(np.random.default_rng(0)).items()
           if not k.startswith(("classifier", "pre_classifier"))}
  model = build_model(model_config("distilbert", *write_hf(tmp_path, "distilbert", state)), (P,), 2)
  params = model.init(jax.random.PRNGKey(5))
  np.testing.assert_array_equal(np.asarray(params["featurizer"]["word_embeddings"]["embedding"]),
                                state["distilbert.embeddings.word_embeddings.weight"])
  assert params["classifier"]["Dense_0"]["kernel"].shape == (D, 2)


# ----------------------------------------------------------------- padding changes nothing

def test_padding_never_changes_a_loss_or_a_penalty(tmp_path):
  """The same sequences padded to 12 and to 20 tokens (and a padded example row) give the
  same classification loss, IRM / VREx / CORAL / MMD penalties (in float64, where MMD's
  gamma = 1000 kernel would otherwise amplify float32 summation-order noise) and token loss."""
  ds = distilbert_state(np.random.default_rng(0), num_labels=2, pre_classifier=False)
  bert = build_model(model_config("distilbert", *write_hf(tmp_path, "distilbert", ds)), (P,), 2)
  with jax.enable_x64(True):
    bp = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), bert.init(jax.random.PRNGKey(0)))
    values = _bert_losses(bert, bp)
  assert np.all(np.abs(values[0][1:]) > 1e-8)  # penalties are not trivially zero
  np.testing.assert_allclose(values[1], values[0], rtol=1e-10, atol=1e-12)

  gs = gpt2_state(np.random.default_rng(1))
  gpt = build_model(model_config("gpt2", *write_hf(tmp_path, "gpt2", gs)), (P,), V)
  gp = gpt.init(jax.random.PRNGKey(0))
  losses = []
  for t in (12, 20):
    x = padded(SEQS, t)
    labels = np.full(x.shape, text.IGNORE, np.int32)
    for i, s in enumerate(SEQS):
      labels[i, :len(s) - 1] = s[1:]
    losses.append(float(text.token_cross_entropy(gpt.apply(gp, x), jnp.asarray(labels))))
  # independent: float64 NumPy log-softmax over every labelled token
  nll = []
  for s in SEQS:
    _, lg = numpy_gpt2(gs, np.array(s))
    lp = lg - lg.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    nll += [-lp[j, s[j + 1]] for j in range(len(s) - 1)]
  np.testing.assert_allclose(losses, [np.mean(nll)] * 2, rtol=1e-5)


def _bert_losses(bert, bp):
  """[CE, IRM, VREx, CORAL, MMD] for the batch padded two ways."""
  from fedjax_dg.algorithms.base import masked_cross_entropy
  seqs = SEQS + [[5, 6], [9, 9, 9, 9, 1]]
  y = jnp.array([0, 1, 1, 0, 1])
  dom = jnp.array([0, 0, 1, 1, 1])

  @jax.jit  # one program per padding (eagerly, each of the model's operations compiles alone)
  def losses(bp, x, yy, dd, mask):
    z = bert.features(bp, x)
    logits = bert.head(bp["classifier"], z)
    ce = masked_cross_entropy(logits, yy, mask)
    ma, mb = mask * (dd == 0), mask * (dd == 1)
    per_ex = optax.softmax_cross_entropy_with_integer_labels(logits, yy)
    risks, present = objectives.domain_risks(per_ex, dd, mask, 2)
    pens = [objectives.irm_penalty(logits, yy, ma) + objectives.irm_penalty(logits, yy, mb),
            objectives.vrex_penalty(risks, present),
            objectives.coral_penalty(z, z, ma, mb), objectives.mmd_penalty(z, z, ma, mb)]
    return jnp.stack([ce] + pens)

  values = []
  for t, extra_row in ((12, False), (20, True)):
    x = padded(seqs + ([[1, 2, 3]] if extra_row else []), t)
    mask = jnp.array([1.0] * 5 + ([0.0] if extra_row else []))
    yy = jnp.concatenate([y, jnp.array([1])]) if extra_row else y
    dd = jnp.concatenate([dom, jnp.array([0])]) if extra_row else dom
    values.append(np.asarray(losses(bp, x, yy, dd, mask), np.float64))
  return values


def test_token_loss_ignores_labels_and_rows():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 4, 6)).astype(np.float32)
  labels = np.array([[1, 2, -100, -100], [0, -100, 5, 3], [4, 4, 4, 4]], np.int32)
  mask = np.array([1.0, 1.0, 0.0], np.float32)
  lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  want = [-lp[b, t, labels[b, t]] for b in range(2) for t in range(4) if labels[b, t] != -100]
  got = text.token_cross_entropy(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(mask))
  np.testing.assert_allclose(float(got), np.mean(want), rtol=1e-6)
  sums, counts = text.token_loss_sums(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(mask))
  np.testing.assert_array_equal(np.asarray(counts), [2, 3, 0])


# ----------------------------------------------------------------- per-token labels in the algorithm layer

def _token_batch(t, extra_row):
  """Five sequences (domains 0, 0, 1, 1, 1) padded to `t` tokens, next-token labels with one
  IGNORE inside a sequence; `extra_row` appends a padding row (mask 0) whose labels are NOT
  ignored, so only the row mask keeps it out."""
  from fedjax_dg.algorithms.base import Batch
  seqs = SEQS + [[5, 6, 7], [9, 9, 9, 9, 1]]
  x = padded(seqs + ([[1, 2, 3, 4, 5, 6]] if extra_row else []), t)
  y = np.full(x.shape, text.IGNORE, np.int32)
  for i, s in enumerate(seqs):
    y[i, :len(s) - 1] = s[1:]
  y[0, 2] = text.IGNORE  # a masked token type inside the code
  if extra_row:
    y[5, :5] = [2, 3, 4, 5, 6]
  dom = np.array([0, 0, 1, 1, 1] + ([0] if extra_row else []), np.int32)
  mask = np.array([1.0] * 5 + ([0.0] if extra_row else []))
  return Batch(jnp.asarray(x), jnp.asarray(y), jnp.asarray(dom), jnp.asarray(mask), 0), seqs


def _token_values(model, params, batch, which):
  """The per-example objectives `which` of the algorithm layer on a per-token batch (one
  compiled program: faster than tracing op by op)."""
  out = jax.jit(lambda p, b: _token_values_jax(model, p, b, which))(params, batch)
  return {k: np.asarray(v) for k, v in out.items()}


def _token_values_jax(model, params, batch, which):
  from fedjax_dg.algorithms import afl, dg, fish, groupdro
  from fedjax_dg.algorithms.base import ClientData, erm_objective, full_pass_loss
  from fedjax_dg.algorithms.fediir import iir_penalty
  rng = jax.random.PRNGKey(0)
  out = {"erm": erm_objective(model)(params, batch, rng)[0]}
  for kind in ("irm", "vrex", "coral", "mmd"):
    if kind in which:
      out[kind] = dg.dg_objective(model, kind, 1.0, 2)(0)(params, batch, rng)[1]["penalty"]
  if "groupdro" in which:
    out["groupdro"] = groupdro.groupdro_loss(model, params, batch, jnp.array([0.5, 0.5]), 0.3, 2)[1]
  if "afl" in which:
    out["afl"] = afl.afl_objective(model, 2)(jnp.array([0.3, 0.7]))(params, batch, rng)[0]
  if "fish" in which:
    (theta, _), out["fish"] = fish.fish_step(model, optax.sgd(0.1), 0.5, 2)((params, optax.sgd(0.1).init(params)), batch, rng)
    out["fish_wte"] = theta["classifier"]["wte"]
  if "fediir" in which:
    out["fediir"] = iir_penalty(model, params, batch, jax.tree.map(jnp.zeros_like, params["classifier"]))[0]
  if "full_pass" in which:
    out["full_pass"] = full_pass_loss(model, params, ClientData(batch.x, batch.y, batch.domain, jnp.asarray(5)),
                                      chunk=2)
  return out


@pytest.mark.parametrize("which", [("vrex", "coral", "mmd", "groupdro", "afl", "fediir", "full_pass"),
                                   pytest.param(("irm", "fish"), marks=pytest.mark.slow)])
def test_per_token_labels_padding_never_changes_a_loss_penalty_or_statistic(tmp_path, which):
  """Py150's labels [B, T]: the same batch padded to 12 and to 20 tokens, the latter with a
  padding row whose labels are real, gives the same ERM loss, IRM / VREx / CORAL / MMD
  penalties, GroupDRO weights, AFL objective, Fish step, FedIIR penalty and full-pass loss
  (float64); each equals a float64 NumPy computation over the labelled tokens of the real
  rows (GPT-2 forward by `numpy_gpt2`), token-weighted as WILDS's loss. (IRM and Fish,
  slower to trace, in `-m slow`.)"""
  gs = gpt2_state(np.random.default_rng(1))
  gpt = build_model(model_config("gpt2", *write_hf(tmp_path, "gpt2", gs)), (P,), V)
  with jax.enable_x64(True):
    gp = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), gpt.init(jax.random.PRNGKey(0)))
    (short, seqs), (long_, _) = _token_batch(12, False), _token_batch(20, True)
    a, b = _token_values(gpt, gp, short, which), _token_values(gpt, gp, long_, which)
  assert set(a) == {"erm", *which} | ({"fish_wte"} if "fish" in which else set())
  for k in a:
    np.testing.assert_allclose(b[k], a[k], rtol=1e-10, atol=1e-12, err_msg=k)

  # independent: per labelled token (row-major), its domain, logits, hidden state, label
  y = np.asarray(short.y)
  toks = []
  for i, s in enumerate(seqs):
    hid, lg = numpy_gpt2(gs, np.array(s))
    toks += [(int(short.domain[i]), lg[j], hid[j], y[i, j]) for j in range(len(s) - 1) if y[i, j] != text.IGNORE]
  nll = lambda l, c: np.log(np.exp(l - l.max()).sum()) + l.max() - l[c]
  dz = lambda l: np.exp(l - l.max()) @ l / np.exp(l - l.max()).sum()  # d/ds logsumexp(s l) at s = 1
  risk = [np.mean([nll(l, c) for d, l, _, c in toks if d == e]) for e in (0, 1)]
  np.testing.assert_allclose(a["erm"], np.mean([nll(l, c) for _, l, _, c in toks]), rtol=1e-9)
  za, zb = (np.array([h for d, _, h, _ in toks if d == e]) for e in (0, 1))
  k = lambda u, v: sum(np.exp(-g * ((u[:, None] - v[None]) ** 2).sum(-1)) for g in objectives.MMD_GAMMAS)
  q = 0.5 * np.exp(0.3 * np.array(risk))
  irm = []
  for e in (0, 1):
    g = [dz(l) - l[c] for d, l, _, c in toks if d == e]
    irm.append(np.mean(g[0::2]) * np.mean(g[1::2]))
  want = {"full_pass": a["erm"], "vrex": np.var(risk), "irm": np.mean(irm),
          "coral": np.mean((za.mean(0) - zb.mean(0)) ** 2) + np.mean((np.cov(za.T) - np.cov(zb.T)) ** 2),
          "mmd": k(za, za).mean() + k(zb, zb).mean() - 2 * k(za, zb).mean(), "groupdro": q / q.sum(),
          "afl": 0.3 * risk[0] + 0.7 * risk[1]}
  for name in set(want) & set(which):
    np.testing.assert_allclose(a[name], want[name], rtol=1e-9, err_msg=name)
  for name in {"irm", "vrex", "coral", "mmd", "fediir"} & set(which):
    assert abs(a[name]) > 1e-8, name  # not trivially zero
