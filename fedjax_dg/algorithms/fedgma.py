"""FedGMA (Tenison et al. 2022): gradient-masked averaging, a server rule.

Per coordinate, the agreement of the sampled clients' update signs
`a = |mean_c sign(Delta_c)|` (uniform over the cohort); the mask is `m = 1` where
`a >= tau`, else `a`; the server step is `theta <- theta + eta_g * m * sum_c p_c Delta_c`.
`tau` is the mask threshold (Bai et al. 2024 App. D uses 0.1 or 0.4 by dataset; default 0.4), and
`eta_g` the server step size. The public benchmark code mixes up the threshold and the
step size; here they are separate fields. With `tau = 0` every mask entry is 1: FedAvg.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_dg.algorithms.base import ServerRule
from fedjax_dg.algorithms.fedavg import erm_client
from fedjax_dg.algorithms.spec import MethodSpec, RuleSpec, Uniform, hparam


def gma_mask(deltas, valid, tau: float):
  """`m` for every leaf of the stacked updates (`[S, ...]`), over the `valid` members."""
  v = valid.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(v), 1.0)

  def leaf(d):
    agree = jnp.abs(jnp.tensordot(v, jnp.sign(d), axes=1)) / n
    return jnp.where(agree >= tau, 1.0, agree)
  return jax.tree.map(leaf, deltas)


def gma_rule(server_lr: float, tau: float) -> ServerRule:
  def apply(rule_state, params, stacked):
    valid = stacked.weights > 0
    p = stacked.weights / jnp.sum(stacked.weights)
    mean_delta = jax.tree.map(lambda d: jnp.tensordot(p, d, axes=1), stacked.messages)
    mask = gma_mask(stacked.messages, valid, tau)
    return jax.tree.map(lambda th, m, d: th + server_lr * m * d, params, mask, mean_delta), rule_state
  return ServerRule(lambda params: (), apply, "stack", name="gma")


@dataclasses.dataclass(frozen=True)
class HParams:
  tau: float = hparam(0.4, "mask threshold (Bai et al. 2024 App. D: 0.1 or 0.4)", ge=0, le=1, search=Uniform(0.0, 1.0))


RULE = RuleSpec("gma", lambda ctx, hp: gma_rule(ctx.server_value("lr"), hp.tau), HParams,
                doc="sign-agreement mask on the weighted mean update, step `server.lr`", activity=("rule_deviation",))
SPEC = MethodSpec("fedgma", "Tenison et al. 2022", erm_client, rule="gma", group="FDG")
