"""FedProx (Li et al. 2020): FedAvg with the local objective
`R_c(theta_c) + (mu / 2) ||theta_c - theta||^2` (squared norm over all parameters).

The benchmark code (seed 001) uses an unsquared per-tensor norm; ALGORITHMS.md fixes the
squared form of the paper, which we follow.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_dg.algorithms.base import erm_objective
from fedjax_dg.algorithms.fedavg import fedavg


def proximal_objective(model, mu: float):
  """Objective factory: `global_params -> objective` with the proximal term."""
  base = erm_objective(model)

  def make(global_params):
    def objective(params, batch, rng):
      loss, aux = base(params, batch, rng)
      sq = sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(global_params)))
      return loss + 0.5 * mu * sq, aux
    return objective
  return make


def fedprox(model, sched, client_opt, server_opt, mu: float):
  return fedavg(model, sched, client_opt, server_opt, proximal_objective(model, mu), name="fedprox")
