"""FedProx (Li et al. 2020): FedAvg with the local objective
`R_c(theta_c) + (mu / 2) ||theta_c - theta||^2` (squared norm over all parameters).

The benchmark code (Bai et al. 2024) uses an unsquared per-tensor norm; docs/ALGORITHMS.md fixes the
squared form of the paper, which we follow.
"""
from __future__ import annotations

import dataclasses

from fedjax_dg.algorithms.base import PENALTY_ACTIVITY, erm_objective, tree_sq_dist
from fedjax_dg.algorithms.fedavg import objective_client
from fedjax_dg.algorithms.spec import LogUniform, MethodSpec, hparam


def proximal_objective(model, mu: float):
  """Objective factory: `global_params -> objective` with the proximal term."""
  base = erm_objective(model)

  def make(global_params):
    def objective(params, batch, rng):
      loss, aux = base(params, batch, rng)
      term = 0.5 * mu * tree_sq_dist(params, global_params)
      return loss + term, {**aux, "penalty_term": term}
    return objective
  return make


@dataclasses.dataclass(frozen=True)
class HParams:
  mu: float = hparam(0.01, "proximal weight (Li et al. 2020; Bai et al. 2024 App. D)", ge=0,
                     search=LogUniform(1e-4, 1.0))


def prox_client(ctx, hp: HParams):
  make = proximal_objective(ctx.model, hp.mu)
  return objective_client(lambda g, extra: make(g), ctx.client_opt, ctx.sched, record=True)


SPEC = MethodSpec("fedprox", "Li et al. 2020", prox_client, HParams, activity=PENALTY_ACTIVITY)
