"""FedGA (Zhang et al., CVPR 2023, "Federated Domain Generalization with Generalization
Adjustment", Alg. 1), following the authors' public code (FedDG-GA,
`utils/weight_adjust.py: refine_weight_dict_by_GA`) where it differs from the paper's text.

The server keeps one aggregation weight `a_c` per client (uniform at the start) and
aggregates `theta <- theta + sum_c a_c Delta_c / sum_c a_c` over the cohort. Each round:
  1. every sampled client trains locally (FedAvg's client) and records the loss of its
     trained local model on its data, `L_c(theta_c)` ("before averaging");
  2. the server aggregates with the current weights;
  3. every sampled client evaluates the new global model on its data, `L_c(theta^{t+1})`
     ("after averaging"), and reports the generalisation gap `G_c = L_c(theta^{t+1}) - L_c(theta_c)`
     (post-round exchange);
  4. `a_c <- clip(a_c + (d_t / C) G_c / max_c' |G_c'|, 0, 1)` for the reporting clients,
     then `a <- a / sum a`; the new weights aggregate from the next round on.
`d_t = d (1 - t / T)` decays linearly to 0 over the `T` rounds (the authors' step-size decay);
`d = 0.2`. The reference code does not centre the gaps (the paper writes `G_c - mean G`)
and scales the step by one over the number of clients (`1/3` for its three training
domains, `1/len(weight_dict)` in Bai et al.'s port): we follow the code. Deviation: the
losses are computed on the client's training data (the reference uses a per-client
validation split, which our clients do not hold).

As a composition: FedGA's client side sends its weight `a_c` with its update (the rule
`ga` reads it as a per-client signal and is refused with clients that do not send one).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import (Algorithm, LocalSchedule, ServerRule, erm_objective, full_pass_loss,
                                       local_train)
from fedjax_dg.algorithms.spec import ClientSide, MethodSpec, RuleSpec, compose, hparam, send

WEIGHT = "aggregation weight (generalisation adjustment)"


class Side(NamedTuple):
  weights: jax.Array  # [C] aggregation weights a_c


def ga_weights(a, ids, gaps, valid, step):
  """`refine_weight_dict_by_GA` with `fair_metric='loss'`: the weights `a` ([C]) after the
  cohort's gaps (`valid` marks real members); `step` is `d_t / C`."""
  v = valid.astype(a.dtype)
  scale = jnp.max(jnp.abs(gaps * v))
  change = jnp.where(scale > 0, step * gaps * v / jnp.where(scale > 0, scale, 1.0), 0.0)
  a = a.at[jnp.where(valid, ids, a.shape[0])].add(change, mode="drop")
  a = jnp.clip(a, 0.0, 1.0)
  return a / jnp.maximum(jnp.sum(a), 1e-12)


def ga_rule() -> ServerRule:
  """`theta + sum_c a_c Delta_c / sum_c a_c` with the weights the clients send."""
  def apply(rule_state, params, stacked):
    a = jnp.where(stacked.weights > 0, stacked.extras, 0.0)
    w = a / jnp.maximum(jnp.sum(a), 1e-12)
    return jax.tree.map(lambda p, d: p + jnp.tensordot(w, d, axes=1), params, stacked.messages), rule_state
  return ServerRule(lambda params: (), apply, "stack", name="ga", needs=(WEIGHT,), weighting="uniform")


def fedga_client(model, sched: LocalSchedule, client_opt: optax.GradientTransformation, num_clients: int,
                 num_rounds: int, step_size: float = 0.2, chunk: int = 256) -> ClientSide:
  objective = erm_objective(model)

  def update(global_params, a, client_state, data, rng):
    params, loss = local_train(global_params, objective, client_opt, data, rng, sched)
    before = full_pass_loss(model, params, data, chunk)          # 1.
    return send(params, global_params, before, {"train_loss": loss}, side=a[data.client_id])

  def report(new_global, a, before, data, rng):                   # 3.
    return full_pass_loss(model, new_global, data, chunk) - before, data.client_id

  def finish(side: Side, stacked, round_) -> Side:               # 4. (`round_` rounds done)
    gaps, ids = stacked.messages
    d_t = step_size * (1.0 - (round_ - 1) / num_rounds)
    return Side(ga_weights(side.weights, ids, gaps, stacked.weights > 0, d_t / num_clients))

  return ClientSide(update, init=lambda params: jnp.zeros(()),
                    side_init=lambda rng, params: Side(jnp.full(num_clients, 1.0 / num_clients)),
                    broadcast=lambda side, round_: side.weights, report=report, finish=finish,
                    report_aggregation="stack", weighting="uniform", provides=(WEIGHT,))


def fedga(model, sched: LocalSchedule, client_opt: optax.GradientTransformation, num_clients: int,
          num_rounds: int, step_size: float = 0.2, chunk: int = 256) -> Algorithm:
  return compose("fedga", fedga_client(model, sched, client_opt, num_clients, num_rounds, step_size, chunk), ga_rule())


@dataclasses.dataclass(frozen=True)
class HParams:
  step: float = hparam(0.2, "step size d (authors' code), decays linearly to 0", ge=0, le=1)


RULE = RuleSpec("ga", lambda ctx, hp: ga_rule(), doc="aggregation by the clients' generalisation-adjusted weights")
SPEC = MethodSpec(
    "fedga", "Zhang et al. 2023 (Alg. 1; authors' code)",
    lambda ctx, hp: fedga_client(ctx.model, ctx.sched, ctx.client_opt, ctx.num_clients, ctx.config.num_rounds, hp.step),
    HParams, rule="ga", sends=("its aggregation weight; generalisation gap (post-round)",),
    receives=("aggregation weights",), group="FDG")
