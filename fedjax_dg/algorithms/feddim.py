"""FedDIM (Liao et al. 2025): decision insight matrices.

Insight matrix of a sample (eqs. 2-3): with the last linear layer `W in R^{d x K}` (bias
ignored) and its input `z in R^d`, `I = W (.) z`, i.e. `I_{jk} = W_{jk} z_j` (so
`sum_j I_{jk} = o_k`, the bias-free logit of eq. 2).
Client (Alg. 1): local training on (eq. 7)
    `CE + lambda (1/B) sum_i ||I_i - I_bar[y_i]||_F^2`
(CE as the batch mean, like every objective here, where eq. 7 writes a sum over the batch:
the sum only rescales `lambda` by `B`), then the per-class mean insight matrices `I_c^(k)`
of all its samples of class `k` under the final local model (eq. 4). Server:
`theta <- mean_c theta_c` and `I_g = mean_c I_c` (eq. 5, uniform over the sampled clients;
for class `k` over the clients that have class `k`), then `I_bar <- (1 - m) I_bar + m I_g`
(eq. 6).

Initialisation (Alg. 1 line 1, "I_bar is initialized from the first iteration"): before
round 1, every client computes its `I_c` at the initial global model and the server sets
`I_bar = I_g` of those (a one-off setup exchange, counted in `setup_bytes`; it runs in
`side_init` over the training store, so no round pays an extra pass). Line 1 comes before
the first cohort is sampled, so all clients take part in it, not only round 1's cohort.
So round 1 already trains with the regulariser. A class no client has stays
uninitialised, its regulariser off, until some sampled client reports it.

Ablations of Liao et al. 2025 Sec. 5.3 / Table 3, as `algorithm.feddim.*` values:
  `momentum = 0`   "W/m = 0": `I_bar` is the initial model's and stays fixed (eq. 6 with
                   `m = 0`); clients then send no class means.
  `momentum = 1`   "W/m = 1": `I_bar` is the current round's `I_g`.
  `variant = "feature"`  "W/Fea": the regulariser's statistic is the feature `z_i` itself,
                   `(1/B) sum_i ||z_i - z_bar[y_i]||^2`.
  `variant = "logit"`    "W/Log": it is the logit vector `o_i = W^T z_i` (eq. 2's `o`, bias
                   ignored as there, i.e. `sum_j I_{i,jk}`), `(1/B) sum_i ||o_i - o_bar[y_i]||^2`.
The variants change only the per-sample statistic; the class means `z_bar`, `o_bar` are
formed, exchanged, initialised and momentum-updated exactly like `I_bar` (Sec. 5.3 replaces
only eq. 7's second term).

Two-layer heads: Liao et al. 2025 (Sec. 5.1) uses "two fully connected layers" as the classifier for
PACS, VLCS and OfficeHome, while eqs. 2-4 define `I` for one linear map `o = W^T z` ("the
penultimate layer's features [multiplied] with the classifier's weights", Sec. 1). With a
head `Dense -> ReLU -> ... -> Dense` this module takes `W` as the last layer's kernel and
`z` as that layer's input (the last hidden activation), i.e. the first layers are read as
part of the feature extractor `h(phi, .)`. That is the only reading under which `I` is
`D x K` with `o = W^T z` as the paper writes. A linear head (`model.head_hidden = ()`)
gives `z = g_phi(x)`.

The class means are linear in `z` at a fixed `W` (`mean_k(W (.) z) = W (.) mean_k(z)`), so a
client averages its last-layer inputs per class and applies the statistic once.
The client sends `Delta_c` and `(has_k S_c^(k), has_k)`, so the uniform mean over the cohort
gives exactly those per-class means and the aggregate stays a sum (chunkable, shardable);
the class means stay uniform when a rule weighs the updates otherwise (`feddim+omg`).
"""
from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import (PENALTY_ACTIVITY, ClientData, LocalSchedule, in_chunks, masked_cross_entropy,
                                       recorded_train)
from fedjax_dg.algorithms.spec import ClientSide, LogUniform, MethodSpec, hparam, send

VARIANTS = ("insight", "feature", "logit")


class Side(NamedTuple):
  i_bar: jax.Array        # [K, *stat] global class means of the statistic ([K, d, K] for insight)
  initialized: jax.Array  # [K] bool


def _dense_layers(classifier_params):
  """The head's Dense layers in order (`Dense_0`, `Dense_1`, ...)."""
  names = list(classifier_params)
  if not names or not all(re.fullmatch(r"Dense_\d+", n) for n in names):
    raise ValueError(f"FedDIM needs a head of Dense layers (models.Classifier); got classifier params {names}")
  return [classifier_params[n] for n in sorted(names, key=lambda n: int(n.split("_")[1]))]


def last_kernel(classifier_params):
  """`W in R^{d x K}`: the kernel of the head's last layer."""
  return _dense_layers(classifier_params)[-1]["kernel"]


def last_input(classifier_params, z):
  """The input of the head's last layer: `z` through the hidden `Dense -> ReLU` layers
  (`models.Classifier`); `z` itself for a linear head."""
  for layer in _dense_layers(classifier_params)[:-1]:
    z = jax.nn.relu(z @ layer["kernel"] + layer["bias"])
  return z


def statistic(variant: str, W, z):
  """The per-sample statistic `[..., *stat]` of `z` `[..., d]`: the insight matrix
  `W (.) z` (`[..., d, K]`), the feature `z`, or the bias-free logit `W^T z` (`[..., K]`)."""
  if variant == "insight":
    return z[..., :, None] * W
  if variant == "feature":
    return z
  if variant == "logit":
    return z @ W
  raise ValueError(f"algorithm.feddim.variant must be one of {VARIANTS}, got {variant!r}")


def insight_matrices(W, z):
  """`I_i = W (.) z_i` broadcast to `[B, d, K]` (eq. 2)."""
  return statistic("insight", W, z)


def _per_class(v, like):
  return v.reshape(v.shape + (1,) * (like.ndim - 1))


def dim_regularizer(s, y, mask, i_bar, initialized):
  """`(1/B) sum_i ||s_i - S_bar[y_i]||^2` (Frobenius) over real examples whose class is
  initialised; `s` `[B, *stat]` the per-sample statistics; `B` the number of real examples."""
  diff = s - i_bar[y]
  per_example = jnp.sum(diff.reshape(diff.shape[0], -1) ** 2, axis=1) * initialized[y] * mask
  return jnp.sum(per_example) / jnp.maximum(jnp.sum(mask), 1.0)


def class_means(z, y, mask, num_classes: int):
  """Per-class means `[K, ...]` of `z` `[N, ...]` and presence `has_k` `[K]` over the real rows."""
  onehot = jax.nn.one_hot(y, num_classes, dtype=z.dtype) * mask[:, None]
  counts = onehot.sum(0)
  sums = jnp.tensordot(onehot, z, axes=(0, 0))
  has = (counts > 0).astype(z.dtype)
  return sums / _per_class(jnp.maximum(counts, 1.0), sums), has


def class_mean_insights(W, z, y, mask, num_classes: int):
  """Per-class mean insight matrices `I^(k)` `[K, d, K]` (eq. 4) and presence `has_k` `[K]`."""
  mean_z, has = class_means(z, y, mask, num_classes)
  return statistic("insight", W, mean_z), has


def momentum_update(i_bar, initialized, mean_weighted, mean_has, m: float):
  """Eq. (6); a class seen for the first time takes `I_g`; classes nobody had keep their `I_bar`."""
  present = mean_has > 0
  i_g = mean_weighted / _per_class(jnp.where(present, mean_has, 1.0), mean_weighted)
  new = jnp.where(_per_class(initialized, i_bar), (1 - m) * i_bar + m * i_g, i_g)
  return jnp.where(_per_class(present, i_bar), new, i_bar), initialized | present


def feddim_client(model, sched: LocalSchedule, client_opt: optax.GradientTransformation, lam: float,
                  momentum: float, num_classes: int, store, variant: str = "insight",
                  stat_chunk: int = 256) -> ClientSide:
  """`store`: the training `ClientStore` (all clients), read once by the setup exchange that
  initialises `I_bar` at the initial model."""
  statistic(variant, jnp.zeros((1, 1)), jnp.zeros((1,)))  # checks the variant

  def class_stats(params, data: ClientData):
    """`(has_k S^(k), has_k)`: the client's per-class mean statistics at `params` (eq. 4)."""
    cls = params["classifier"]
    z = in_chunks(lambda xb: last_input(cls, model.features(params, xb)), data.x, stat_chunk)
    mean_z, has = class_means(z, data.y, data.mask, num_classes)
    s = statistic(variant, last_kernel(cls), mean_z)
    return s * _per_class(has, s), has

  def objective_for(i_bar, initialized):
    def objective(params, batch, rng):
      del rng
      z = model.features(params, batch.x)
      cls = params["classifier"]
      ce = masked_cross_entropy(model.head(cls, z), batch.y, batch.mask)
      s = statistic(variant, last_kernel(cls), last_input(cls, z))
      reg = dim_regularizer(s, batch.y, batch.mask, i_bar, initialized)
      return ce + lam * reg, {"insight_reg": reg, "penalty_term": lam * reg}
    return objective

  def update(global_params, extra, client_state, data, rng):
    params, _, loss, activity = recorded_train(global_params, client_opt.init(global_params), objective_for(*extra),
                                               client_opt, data, rng, sched)
    metrics = {"train_loss": loss, **activity}
    if momentum == 0:  # W/m = 0: I_bar stays the initial model's, nothing to send
      return send(params, global_params, client_state, metrics)
    return send(params, global_params, client_state, metrics, side=class_stats(params, data))

  def side_update(side: Side, mean_side, round_) -> Side:
    mean_weighted, mean_has = mean_side
    return Side(*momentum_update(side.i_bar, side.initialized, mean_weighted, mean_has, momentum))

  @jax.jit
  def setup(params, store):
    """The setup exchange: the uniform mean over all clients of `(has_k S_c^(k), has_k)` at
    the initial model, one client at a time (memory of one client's statistic)."""
    C = store.counts.shape[0]
    data = ClientData(store.x, store.y, store.domain, store.counts, jnp.arange(C))

    def body(acc, c):
      one = class_stats(params, jax.tree.map(lambda a: a[c], data))
      return jax.tree.map(jnp.add, acc, one), None
    shape = jax.eval_shape(lambda: class_stats(params, jax.tree.map(lambda a: a[0], data)))
    zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape)
    total, _ = jax.lax.scan(body, zero, jnp.arange(C))
    return jax.tree.map(lambda a: a / C, total)

  def side_init(rng, params):
    if store is None:
      raise ValueError("FedDIM initialises its class insight from every client's data at the initial model "
                       "(Liao et al. 2025 Alg. 1 line 1); it needs the training client store")
    W = last_kernel(params["classifier"])
    shape = jax.eval_shape(lambda: statistic(variant, W, jnp.zeros(W.shape[:1], W.dtype))).shape
    empty = Side(jnp.zeros((num_classes,) + shape, W.dtype), jnp.zeros(num_classes, bool))
    mean_weighted, mean_has = setup(params, store)
    return Side(*momentum_update(empty.i_bar, empty.initialized, mean_weighted, mean_has, 1.0))

  return ClientSide(update, side_init=side_init, side_update=side_update if momentum > 0 else None,
                    broadcast=lambda side, round_: (side.i_bar, side.initialized), weighting="uniform")


@dataclasses.dataclass(frozen=True)
class HParams:
  lam: float = hparam(1e-2, "regulariser weight (Liao et al. 2025: 1e-4 .. 1e-1)", ge=0, search=LogUniform(1e-4, 1e-1))
  momentum: float = hparam(0.5, "momentum m of the global insight matrices (eq. 6); 0 keeps the initial "
                           "model's (Table 3's W/m = 0)", ge=0, le=1,
                           static=True)  # 0 removes the server's update of the matrices
  variant: str = hparam("insight", "the regularised statistic: insight matrix, or Table 3's W/Fea (feature) and "
                        "W/Log (logit) ablations", choices=VARIANTS)


def _check(config, hp):
  if config.model.name == "gpt2":
    return "model.name: FedDIM needs a Dense classifier head; gpt2's head is tied to the token embedding"
  return None


def _setup_bytes(ctx, hp):
  """Every client uploads its per-class statistic at the initial model once (float32)."""
  W = last_kernel(jax.eval_shape(ctx.model.init, jax.random.PRNGKey(0))["classifier"])
  size = jax.eval_shape(lambda w: statistic(hp.variant, w, jnp.zeros(w.shape[:1])), W).size
  return ctx.num_clients * ctx.num_classes * (size + 1) * 4


SPEC = MethodSpec(
    "feddim", "Liao et al. 2025 (Alg. 1)",
    lambda ctx, hp: feddim_client(ctx.model, ctx.sched, ctx.client_opt, hp.lam, hp.momentum, ctx.num_classes,
                                  ctx.prepared, hp.variant),
    HParams, sends=("per-class mean insight matrices",), receives=("global insight matrices",), group="FDG papers",
    prepare=lambda ctx, hp: ctx.store,  # the setup exchange reads every client's rows
    check=_check, setup_bytes=_setup_bytes, claim="Liao et al. 2025", activity=PENALTY_ACTIVITY,
    not_for_models=(("gpt2", "FedDIM's insight matrices are [V, d, V] for a V-token vocabulary (V = 50k with d = 768: "
                             "2e12 numbers per client) and it needs an untied linear head"),))
