"""SCAFFOLD (Karimireddy et al. 2020), option II.

Server control `c`, client controls `c_i` (persistent client state, zero-initialised).
Local step: `theta_c <- theta_c - eta_l (grad R_c - c_i + c)`.
After the client's `K_c` local steps (the steps that touched data, so a smaller client in
epoch mode uses its own K): `c_i+ = c_i - c + (theta - theta_c) / (K_c eta_l)`.
Server: `theta <- theta + eta_g mean_c Delta_c`, `c <- c + (|S| / C) mean_c (c_i+ - c_i)`,
means uniform over the cohort, as in the paper's Alg. 1.
Option II assumes plain SGD locally, so the local optimizer is `sgd(eta_l)` without momentum.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import (Algorithm, ClientOutput, LocalSchedule, erm_objective,
                                       local_train, real_steps)


class ServerState(NamedTuple):
  params: Any
  control: Any  # c


def scaffold(model, sched: LocalSchedule, local_lr: float, server_lr: float,
             cohort_size: int, num_clients: int) -> Algorithm:
  objective = erm_objective(model)
  client_opt = optax.sgd(local_lr)
  zeros = lambda p: jax.tree.map(jnp.zeros_like, p)

  def client_update(bcast, c_i, data, rng):
    params0, c = bcast
    correction = lambda g: jax.tree.map(lambda gi, ci, cc: gi - ci + cc, g, c_i, c)
    params, loss = local_train(params0, objective, client_opt, data, rng, sched, grad_correction=correction)
    k = jnp.maximum(real_steps(data.count, sched), 1).astype(jnp.float32)
    c_new = jax.tree.map(lambda ci, cc, p0, p: ci - cc + (p0 - p) / (k * local_lr), c_i, c, params0, params)
    delta = jax.tree.map(lambda a, b: a - b, params, params0)
    dc = jax.tree.map(lambda a, b: a - b, c_new, c_i)
    return ClientOutput(message=(delta, dc), state=c_new, metrics={"train_loss": loss})

  def server_update(state, mean_msg):
    mean_delta, mean_dc = mean_msg
    params = jax.tree.map(lambda p, d: p + server_lr * d, state.params, mean_delta)
    control = jax.tree.map(lambda c, d: c + (cohort_size / num_clients) * d, state.control, mean_dc)
    return ServerState(params, control)

  return Algorithm(
      name="scaffold", server_init=lambda rng, p: ServerState(p, zeros(p)), client_init=zeros,
      broadcast=lambda s: (s.params, s.control), client_update=client_update,
      server_update=server_update, params_of=lambda s: s.params, aggregation="mean",
      weighting="uniform")
