"""GroupDRO (Sagawa et al. 2020) inside clients (Bai et al. 4.2), DomainBed's online form.

Each client keeps group weights `q` over the domains (persistent client state, never sent;
uniform at the start). At every local step, with `R_e` the mean loss of domain `e` in the
minibatch:

  q_e <- q_e exp(eta R_e)   for the present domains, then q <- q / sum q
  loss = sum_e q_e R_e / sum_e q_e        (sums over the present domains)

With every domain present this is DomainBed's `sum_e q_e R_e`; renormalising over the
present domains keeps the loss a weighted mean when a minibatch lacks a domain, and makes
it ERM on a single-domain client. The server is FedAvg's (any server rule).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import LocalSchedule, example_view, local_loop
from fedjax_dg.algorithms.fedavg import keeps_optimizer
from fedjax_dg.algorithms.spec import ClientSide, LogUniform, MethodSpec, hparam, send
from fedjax_dg.objectives import domain_risks


def update_group_weights(q, risks, present, eta: float):
  """`q_e <- q_e exp(eta R_e)` on the present domains, normalised to sum 1."""
  q = q * jnp.exp(eta * risks * present)
  return q / jnp.sum(q)


def groupdro_loss(model, params, batch, q, eta: float, num_domains: int):
  """`(loss, q_new)`: the robust loss under the group weights updated on this minibatch
  (the weights see the losses as constants, as DomainBed's `.detach()`)."""
  batch, (logits,) = example_view(batch, model.apply(params, batch.x))  # per-token labels: tokens
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
  risks, present = domain_risks(ce, batch.domain, batch.mask, num_domains)
  q_new = update_group_weights(q, jax.lax.stop_gradient(risks), present, eta)
  w = q_new * present
  return jnp.sum(w * risks) / jnp.maximum(jnp.sum(w), 1e-30), q_new


def groupdro_client(model, sched: LocalSchedule, client_opt: optax.GradientTransformation, eta: float,
                    num_domains: int, keep_optimizer: bool = False) -> ClientSide:
  """The client's persistent state is its group weights `q`, and with `keep_optimizer`
  (the centralised C = 1 run) also its optimizer state, so rounds are epochs of one run."""
  def update(global_params, extra, state, data, rng):
    q, opt_state = state if keep_optimizer else (state, client_opt.init(global_params))

    def step_fn(carry, batch, key):
      params, opt_state, q_ = carry
      (loss, q_new), g = jax.value_and_grad(
          lambda p: groupdro_loss(model, p, batch, q_, eta, num_domains), has_aux=True)(params)
      updates, opt_state = client_opt.update(g, opt_state, params)
      return (optax.apply_updates(params, updates), opt_state, q_new), loss

    (params, opt_state, q), loss = local_loop((global_params, opt_state, q), step_fn, data, rng, sched)
    return send(params, global_params, (q, opt_state) if keep_optimizer else q, {"train_loss": loss})

  q0 = lambda params: jnp.full((num_domains,), 1.0 / num_domains)
  init = (lambda params: (q0(params), client_opt.init(params))) if keep_optimizer else q0
  return ClientSide(update, init=init)


@dataclasses.dataclass(frozen=True)
class HParams:
  eta: float = hparam(0.01, "group-weight step (DomainBed default)", ge=0, search=LogUniform(1e-3, 1e-1))


SPEC = MethodSpec("groupdro", "Sagawa et al. 2020 (DomainBed's online form)",
                  lambda ctx, hp: groupdro_client(ctx.model, ctx.sched, ctx.client_opt, hp.eta, ctx.num_domains,
                                                  keeps_optimizer(ctx)),
                  HParams, group="DG")
