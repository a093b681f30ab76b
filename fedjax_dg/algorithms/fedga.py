"""FedGA (Zhang et al., CVPR 2023): generalisation adjustment of aggregation weights.

The server keeps one aggregation weight `a_c` per client (uniform at the start). Each round
every sampled client trains locally (FedAvg's client) and reports its generalisation gap
on its own data, `G_c = R_c(theta_global) - R_c(theta_c)` (the global model it received
versus its trained local model). With `Gbar = mean_c G_c` over the cohort:
    `a_c <- a_c + d_t (G_c - Gbar) / max_c' |G_c' - Gbar|`, clipped at 0, renormalised,
and the new global model is `theta + sum_c a_c Delta_c / sum_c a_c` over the cohort
(`= sum_c a_c theta_c` with normalised weights). `d_t = d (1 - t / T)` decays linearly to 0
over the `T` rounds; `d = 0.2` is the step size of the authors' released code.
Deviations (ALGORITHMS.md's form): the gap uses the client's training data and the loss
(the reference code can use a validation split and accuracy), and the updated weights
aggregate the same round (the reference applies them from the next round).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import (Algorithm, ClientOutput, LocalSchedule, erm_objective,
                                       full_pass_loss, local_train)


class ServerState(NamedTuple):
  params: Any
  weights: jax.Array  # [C] aggregation weights a_c
  round: jax.Array    # t


def ga_weights(a, ids, gaps, valid, step):
  """The generalisation-adjustment update of the weights `a` ([C]) from the cohort's gaps."""
  v = valid.astype(a.dtype)
  gbar = jnp.sum(gaps * v) / jnp.maximum(jnp.sum(v), 1.0)
  dev = (gaps - gbar) * v
  scale = jnp.max(jnp.abs(dev))
  change = jnp.where(scale > 0, step * dev / jnp.where(scale > 0, scale, 1.0), 0.0)
  a = a.at[jnp.where(valid, ids, a.shape[0])].add(change, mode="drop")
  a = jnp.maximum(a, 0.0)
  return a / jnp.maximum(jnp.sum(a), 1e-12)


def fedga(model, sched: LocalSchedule, client_opt: optax.GradientTransformation, num_clients: int,
          num_rounds: int, step_size: float = 0.2, chunk: int = 256) -> Algorithm:
  objective = erm_objective(model)

  def client_update(global_params, client_state, data, rng):
    before = full_pass_loss(model, global_params, data, chunk)
    params, loss = local_train(global_params, objective, client_opt, data, rng, sched)
    gap = before - full_pass_loss(model, params, data, chunk)
    delta = jax.tree.map(lambda a, b: a - b, params, global_params)
    return ClientOutput(message=(delta, gap, data.client_id), state=client_state, metrics={"train_loss": loss})

  def server_update(state: ServerState, stacked) -> ServerState:
    deltas, gaps, ids = stacked.messages
    valid = stacked.weights > 0
    step = step_size * (1.0 - state.round / num_rounds)
    a = ga_weights(state.weights, ids, gaps, valid, step)
    w = jnp.where(valid, a[ids], 0.0)
    w = w / jnp.maximum(jnp.sum(w), 1e-12)
    params = jax.tree.map(lambda p, d: p + jnp.tensordot(w, d, axes=1), state.params, deltas)
    return ServerState(params, a, state.round + 1)

  return Algorithm(
      name="fedga", server_init=lambda rng, p: ServerState(p, jnp.full(num_clients, 1.0 / num_clients), jnp.asarray(0)),
      client_init=lambda params: (), broadcast=lambda s: s.params, client_update=client_update,
      server_update=server_update, params_of=lambda s: s.params, aggregation="stack", weighting="uniform")
