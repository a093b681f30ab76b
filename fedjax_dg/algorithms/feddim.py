"""FedDIM (seed 004): decision insight matrices.

Insight matrix of a sample (eq. 2): with a linear head `W in R^{d x K}` (bias ignored) and
features `z = g_phi(x) in R^d`, `I = W (.) z`, i.e. `I_{jk} = W_{jk} z_j`.
Client (Alg. 1): local training on (eq. 7)
    `CE + lambda (1/B) sum_i ||I_i - I_bar[y_i]||_F^2`
(CE as the batch mean, like every objective here), then the per-class mean insight
matrices `I_c^(k)` of all its samples of class `k` under the final local model (eq. 4).
Server: `theta <- mean_c theta_c` and `I_g = mean_c I_c` (eq. 5, uniform over the sampled
clients; for class `k` over the clients that have class `k`), then
`I_bar <- (1 - m) I_bar + m I_g` (eq. 6), `I_bar[k]` initialised from the first round in
which some client has class `k`. A class that no sampled client has keeps its `I_bar`,
and the regulariser is off for a class whose `I_bar` is not initialised yet.
The client sends `Delta_c` and `(has_k I_c^(k), has_k)`, so the uniform mean over the cohort
gives exactly those per-class means and the aggregate stays a sum (chunkable, shardable);
the insight means stay uniform when a rule weighs the updates otherwise (`feddim+omg`).
Needs a linear head (`model.head_hidden = ()`).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import (Algorithm, LocalSchedule, ServerRule, in_chunks, local_train,
                                       masked_cross_entropy)
from fedjax_dg.algorithms.spec import ClientSide, LogUniform, MethodSpec, compose, hparam, send


class Side(NamedTuple):
  i_bar: jax.Array        # [K, d, K] global mean insight matrix per class
  initialized: jax.Array  # [K] bool


def _head_kernel(params):
  layers = params["classifier"]
  if len(layers) != 1:
    raise ValueError("FedDIM needs a linear head: set model.head_hidden = ()")
  return next(iter(layers.values()))["kernel"]  # [d, K]


def insight_matrices(W, z):
  """`I_i = W (.) z_i` broadcast to `[B, d, K]` (eq. 2)."""
  return z[:, :, None] * W[None, :, :]


def dim_regularizer(W, z, y, mask, i_bar, initialized):
  """`(1/B) sum_i ||I_i - I_bar[y_i]||_F^2` over real examples whose class is initialised;
  `B` is the number of real examples in the batch."""
  diff = insight_matrices(W, z) - i_bar[y]
  per_example = jnp.sum(diff ** 2, axis=(1, 2)) * initialized[y] * mask
  return jnp.sum(per_example) / jnp.maximum(jnp.sum(mask), 1.0)


def class_mean_insights(W, z, y, mask, num_classes: int):
  """Per-class means `I^(k)` `[K, d, K]` and presence `has_k` `[K]` over the real rows."""
  onehot = jax.nn.one_hot(y, num_classes) * mask[:, None]
  counts = onehot.sum(0)
  sums = jnp.einsum("nk,ndj->kdj", onehot, insight_matrices(W, z))
  has = (counts > 0).astype(z.dtype)
  return sums / jnp.maximum(counts, 1.0)[:, None, None], has


def momentum_update(i_bar, initialized, mean_weighted, mean_has, m: float):
  """Eq. (6) with first-sight initialisation; classes nobody had keep their `I_bar`."""
  present = mean_has > 0
  i_g = mean_weighted / jnp.where(present, mean_has, 1.0)[:, None, None]
  new = jnp.where(initialized[:, None, None], (1 - m) * i_bar + m * i_g, i_g)
  return jnp.where(present[:, None, None], new, i_bar), initialized | present


def feddim_client(model, sched: LocalSchedule, client_opt: optax.GradientTransformation, lam: float,
                  momentum: float, num_classes: int, feature_dim: int, stat_chunk: int = 256) -> ClientSide:
  def objective_for(i_bar, initialized):
    def objective(params, batch, rng):
      del rng
      z = model.features(params, batch.x)
      ce = masked_cross_entropy(model.head(params["classifier"], z), batch.y, batch.mask)
      reg = dim_regularizer(_head_kernel(params), z, batch.y, batch.mask, i_bar, initialized)
      return ce + lam * reg, {"insight_reg": reg}
    return objective

  def update(global_params, extra, client_state, data, rng):
    params, loss = local_train(global_params, objective_for(*extra), client_opt, data, rng, sched)
    z = in_chunks(lambda xb: model.features(params, xb), data.x, stat_chunk)
    means, has = class_mean_insights(_head_kernel(params), z, data.y, data.mask, num_classes)
    return send(params, global_params, client_state, {"train_loss": loss}, side=(means * has[:, None, None], has))

  def side_update(side: Side, mean_side, round_) -> Side:
    mean_weighted, mean_has = mean_side
    return Side(*momentum_update(side.i_bar, side.initialized, mean_weighted, mean_has, momentum))

  def side_init(rng, params):
    _head_kernel(params)
    return Side(jnp.zeros((num_classes, feature_dim, num_classes)), jnp.zeros(num_classes, bool))

  return ClientSide(update, side_init=side_init, side_update=side_update,
                    broadcast=lambda side, round_: (side.i_bar, side.initialized), weighting="uniform")


def feddim(model, sched: LocalSchedule, client_opt: optax.GradientTransformation, rule: ServerRule,
           lam: float, momentum: float, num_classes: int, feature_dim: int, stat_chunk: int = 256,
           name: str = "feddim") -> Algorithm:
  return compose(name, feddim_client(model, sched, client_opt, lam, momentum, num_classes, feature_dim,
                                     stat_chunk), rule)


@dataclasses.dataclass(frozen=True)
class HParams:
  lam: float = hparam(1e-2, "regulariser weight (seed 004: 1e-4 .. 1e-1)", ge=0, search=LogUniform(1e-4, 1e-1),
                      legacy=("dim_lambda",))
  momentum: float = hparam(0.5, "momentum m of the global insight matrices (eq. 6)", gt=0, le=1,
                           legacy=("dim_momentum",))


def _check(config, hp):
  if tuple(config.model.head_hidden) != ():
    return "model.head_hidden: FedDIM needs a linear head, set it to ()"
  return None


SPEC = MethodSpec(
    "feddim", "seed 004 (Alg. 1)",
    lambda ctx, hp: feddim_client(ctx.model, ctx.sched, ctx.client_opt, hp.lam, hp.momentum, ctx.num_classes,
                                  ctx.feature_dim()),
    HParams, sends=("per-class mean insight matrices",), receives=("global insight matrices",), group="seed",
    check=_check)
