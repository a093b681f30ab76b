"""FedSAM (Qu et al. 2022; Caldarola et al. 2022): FedAvg whose local steps are SAM steps.

SAM step (Foret et al. 2021): `e = rho g / ||g||` with `g = grad R_c(theta)`, then step with
`grad R_c(theta + e)`. Written as an objective transformation: the loss
`R_c(theta + stop_gradient(e(theta)))` has exactly that gradient, so SAM composes with any
local objective and any server rule (`fedsam+omg`). The logged training loss is the loss at
the perturbed point.

Activity (`activity/step_deviation`): `||grad R_c(theta + e) - g|| / ||g||`, the
sharpness-aware gradient against the plain gradient at the same point and batch (both
computed by every SAM step, so the record costs two norms), averaged over the local steps
with data. 0 at `rho = 0`; with SGD it is also the distance of SAM's step from the plain
step, relative to the plain step.
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
  """The SAM objective of `objective`: `R(theta + stop_gradient(e(theta)))`, `e = rho g / ||g||`.

  Args:
    objective: `objective(params, batch, rng) -> (loss, aux)`.
    rho: the perturbation radius.

  Returns:
    `sam(params, batch, rng) -> (loss at the perturbed point, aux)`; aux is the wrapped
    objective's, with `plain_grad` (the plain gradient `g`, not differentiated) added, from
    which the client records `activity/step_deviation` (`base.recording_step`).
  """
  def sam(params, batch, rng):
    g = jax.grad(lambda p: objective(p, batch, rng)[0])(params)
    norm = optax.tree.norm(g)
    e = jax.tree.map(lambda gi: rho * gi / jnp.maximum(norm, 1e-12), g)
    loss, aux = objective(jax.tree.map(lambda p, ei: p + jax.lax.stop_gradient(ei), params, e), batch, rng)
    return loss, {**aux, "plain_grad": jax.lax.stop_gradient(g)}
  return sam


@dataclasses.dataclass(frozen=True)
class HParams:
  rho: float = hparam(0.05, "perturbation radius (Qu et al. 2022; Nguyen et al. 2025 D.6 uses 0.6 with OMG)", ge=0,
                      search=LogUniform(0.01, 1.0))


def sam_client(ctx, hp: HParams):
  objective = sam_objective(erm_objective(ctx.model), hp.rho)
  return objective_client(lambda g, extra: objective, ctx.client_opt, ctx.sched, record=True)


SPEC = MethodSpec("fedsam", "Qu et al. 2022", sam_client, HParams, activity=("step_deviation",))
