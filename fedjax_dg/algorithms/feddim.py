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
The client sends `(Delta_c, has_k I_c^(k), has_k)`, so the uniform mean over the cohort
gives exactly those per-class means and the aggregate stays a sum (chunkable, shardable).
Needs a linear head (`model.head_hidden = ()`).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import (Algorithm, ClientOutput, LocalSchedule, ServerRule, in_chunks,
                                       local_train, masked_cross_entropy)


class ServerState(NamedTuple):
  params: Any
  opt_state: Any
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


def feddim(model, sched: LocalSchedule, client_opt: optax.GradientTransformation, rule: ServerRule,
           lam: float, momentum: float, num_classes: int, feature_dim: int, stat_chunk: int = 256,
           name: str = "feddim") -> Algorithm:
  if rule.aggregation != "mean":
    raise ValueError("feddim: the server rule must aggregate by mean")

  def objective_for(i_bar, initialized):
    def objective(params, batch, rng):
      del rng
      z = model.features(params, batch.x)
      ce = masked_cross_entropy(model.head(params["classifier"], z), batch.y, batch.mask)
      reg = dim_regularizer(_head_kernel(params), z, batch.y, batch.mask, i_bar, initialized)
      return ce + lam * reg, {"insight_reg": reg}
    return objective

  def client_update(bcast, client_state, data, rng):
    global_params, i_bar, initialized = bcast
    params, loss = local_train(global_params, objective_for(i_bar, initialized), client_opt, data, rng, sched)
    z = in_chunks(lambda xb: model.features(params, xb), data.x, stat_chunk)
    means, has = class_mean_insights(_head_kernel(params), z, data.y, data.mask, num_classes)
    delta = jax.tree.map(lambda a, b: a - b, params, global_params)
    msg = (delta, means * has[:, None, None], has)
    return ClientOutput(message=msg, state=client_state, metrics={"train_loss": loss})

  def server_update(state: ServerState, mean_msg) -> ServerState:
    mean_delta, mean_weighted, mean_has = mean_msg
    params, rule_state = rule.apply(state.opt_state, state.params, mean_delta)
    i_bar, initialized = momentum_update(state.i_bar, state.initialized, mean_weighted, mean_has, momentum)
    return ServerState(params, rule_state, i_bar, initialized)

  def server_init(rng, params):
    _head_kernel(params)
    return ServerState(params, rule.init(params), jnp.zeros((num_classes, feature_dim, num_classes)),
                       jnp.zeros(num_classes, bool))

  return Algorithm(
      name=name, server_init=server_init, client_init=lambda params: (),
      broadcast=lambda s: (s.params, s.i_bar, s.initialized), client_update=client_update,
      server_update=server_update, params_of=lambda s: s.params, aggregation="mean", weighting="uniform")
