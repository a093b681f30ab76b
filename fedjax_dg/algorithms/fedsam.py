"""FedSAM (Qu et al. 2022; Caldarola et al. 2022): FedAvg whose local steps are SAM steps.

SAM step (Foret et al. 2021): `e = rho g / ||g||` with `g = grad R_c(theta)`, then step with
`grad R_c(theta + e)`. Written as an objective transformation: the loss
`R_c(theta + stop_gradient(e(theta)))` has exactly that gradient, so SAM composes with any
local objective and any server rule (`fedsam+omg`). The logged training loss is the loss at
the perturbed point.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import erm_objective
from fedjax_dg.algorithms.fedavg import objective_client
from fedjax_dg.algorithms.spec import LogUniform, MethodSpec, hparam


def sam_objective(objective: Callable, rho: float) -> Callable:
  def sam(params, batch, rng):
    g = jax.grad(lambda p: objective(p, batch, rng)[0])(params)
    norm = optax.tree.norm(g)
    e = jax.tree.map(lambda gi: rho * gi / jnp.maximum(norm, 1e-12), g)
    return objective(jax.tree.map(lambda p, ei: p + jax.lax.stop_gradient(ei), params, e), batch, rng)
  return sam


@dataclasses.dataclass(frozen=True)
class HParams:
  rho: float = hparam(0.05, "perturbation radius (Qu et al. 2022; Nguyen et al. 2025 D.6 uses 0.6 with OMG)", ge=0,
                      search=LogUniform(0.01, 1.0))


def sam_client(ctx, hp: HParams):
  objective = sam_objective(erm_objective(ctx.model), hp.rho)
  return objective_client(lambda g, extra: objective, ctx.client_opt, ctx.sched)


SPEC = MethodSpec("fedsam", "Qu et al. 2022", sam_client, HParams)
