"""Fish (Shi et al. 2022) inside clients (Bai et al. 4.2), DomainBed's first-order form.

At every local step, on the minibatch of each domain present in the client's batch:

  theta~ <- theta;  for e in the present domains, in order: one step of a fresh inner
  optimizer on R_e(theta~);  theta <- theta + meta_lr (theta~ - theta)

As in DomainBed the inner optimizer (the configured client optimizer) is re-initialised at
every step. On a single-domain client this is one inner step scaled by `meta_lr`, i.e. ERM
with step size `meta_lr * lr` (the collapse to ERM of Bai et al., with a smaller step).
The server is FedAvg's (any server rule).

The inner steps run over the batch's slots (`base.slot_view`: the present domains
renumbered 0..S-1 in ascending id, S = min(B, D)), not over all D domains of the dataset:
the same steps in the same (ascending domain id) order, so the result is unchanged, and a
step costs S inner passes instead of D (Py150 has 5,477 repositories). The order of the
inner steps matters for Fish; DomainBed takes the environments' minibatches in their order.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import (Batch, LocalSchedule, ServerRule, example_view, local_loop, slot_view,
                                      tree_where)
from fedjax_dg.algorithms.spec import Choice, ClientSide, MethodSpec, compose, hparam, send


def fish_step(model, inner_opt: optax.GradientTransformation, meta_lr: float, num_domains: int):
  """`step_fn(theta, batch, rng) -> (theta, loss)` for `local_loop`."""
  def domain_loss(params, batch, e):
    batch, (logits,) = example_view(batch, model.apply(params, batch.x))  # per-token labels: tokens
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
    m = batch.mask * (batch.domain == e)
    return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1.0)

  def step_fn(theta, batch: Batch, rng):
    del rng
    batch, size = slot_view(batch, num_domains)  # present domains as slots 0..S-1, ascending id

    def inner(carry, e):
      p, st = carry
      loss, g = jax.value_and_grad(domain_loss)(p, batch, e)
      updates, st_new = inner_opt.update(g, st, p)
      present = jnp.sum(batch.mask * (batch.domain == e)) > 0
      return tree_where(present, (optax.apply_updates(p, updates), st_new), (p, st)), (loss * present, present)

    (theta_inner, _), (losses, present) = jax.lax.scan(inner, (theta, inner_opt.init(theta)),
                                                       jnp.arange(size))
    theta = jax.tree.map(lambda t, ti: t + meta_lr * (ti - t), theta, theta_inner)
    return theta, jnp.sum(losses) / jnp.maximum(jnp.sum(present), 1.0)
  return step_fn


def fish_client(model, sched: LocalSchedule, inner_opt: optax.GradientTransformation, meta_lr: float,
                num_domains: int) -> ClientSide:
  step_fn = fish_step(model, inner_opt, meta_lr, num_domains)

  def update(global_params, extra, client_state, data, rng):
    params, loss = local_loop(global_params, step_fn, data, rng, sched)
    return send(params, global_params, client_state, {"train_loss": loss})
  return ClientSide(update)


def fish(model, sched: LocalSchedule, inner_opt: optax.GradientTransformation, rule: ServerRule,
         meta_lr: float, num_domains: int):
  return compose("fish", fish_client(model, sched, inner_opt, meta_lr, num_domains), rule)


@dataclasses.dataclass(frozen=True)
class HParams:
  meta_lr: float = hparam(0.5, "meta step (DomainBed default; seed 001 Table 7: 0.1 on PACS, CelebA, Camelyon17, "
                          "IWildCam)", gt=0, le=1, search=Choice((0.05, 0.1, 0.5)))


SPEC = MethodSpec("fish", "Shi et al. 2022 (DomainBed's form)",
                  lambda ctx, hp: fish_client(ctx.model, ctx.sched, ctx.client_opt, hp.meta_lr, ctx.num_domains),
                  HParams, group="DG")
