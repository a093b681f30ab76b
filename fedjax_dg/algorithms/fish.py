"""Fish (Shi et al. 2022) inside clients (Bai et al. 4.2), DomainBed's first-order form.

At every local step, on the minibatch of each domain present in the client's batch:

  theta~ <- theta;  for e in the present domains, in a random order drawn afresh at every
  step: one step of the inner optimizer on R_e(theta~);  theta <- theta + meta_lr (theta~ - theta)

The inner optimizer (the configured client optimizer) keeps its state across the local
steps, as DomainBed's `domainbed/algorithms.py: Fish`: `update` saves
`optimizer_inner_state` after its inner steps and the next `create_clone` reloads it into
the fresh inner optimizer, so Adam's moments and step count run on from step to step while
the inner parameters restart from `theta`. Bai et al. 2024's code (FedDG_Benchmark's `Fish`) keeps
that state for the client's local round; here it starts fresh at every round, as every
method's local optimizer. On a single-domain client with plain SGD a step is one inner step
scaled by `meta_lr`, i.e. ERM with step size `meta_lr * lr` (the collapse to ERM of Bai et
al., with a smaller step). The server is FedAvg's (any server rule).

The inner steps run over the batch's slots (`base.slot_view`: the present domains
renumbered 0..S-1 in ascending id, S = min(B, D)), not over all D domains of the dataset,
so a step costs S inner passes instead of D (Py150 has 5,477 repositories).

Domain order (`domain_order`). The order of the inner steps matters for Fish: with Adam
restarted at every local step (one local step a round) the first domain of a fixed order
gets the largest, sign-like step. Shi et al. ("Gradient Matching for Domain
Generalization", ICLR 2022), Alg. 2, visit the domains in a random permutation at every
step. DomainBed (`domainbed/algorithms.py: Fish.update`) takes the environments'
minibatches in the environments' fixed order, and Bai et al.'s federated Fish
(FedDG_Benchmark, `src/client.py: Fish.step`) in ascending group id (`split_into_groups`).
The default, "random", follows the paper: a uniformly random order of the slots at each
step (`permutation(fold_in(step key, 7), S)`), so relabelling the domains changes no
result in distribution. "ascending" is DomainBed's and Bai et al.'s fixed order.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import Batch, LocalSchedule, example_view, local_loop, slot_view, tree_where
from fedjax_dg.algorithms.spec import Choice, ClientSide, MethodSpec, hparam, send


ORDERS = ("random", "ascending")


def fish_step(model, inner_opt: optax.GradientTransformation, meta_lr: float, num_domains: int,
              order: str = "ascending"):
  """`step_fn((theta, inner_state), batch, rng) -> ((theta, inner_state), loss)` for
  `local_loop`; `inner_state` is the inner optimizer's state, carried from step to step
  (DomainBed's `optimizer_inner_state`). `order`: "ascending" domain id (DomainBed's,
  Bai et al.'s; `rng` unused) or "random" (a permutation drawn from `rng` per step)."""
  if order not in ORDERS:
    raise ValueError(f"algorithm.fish.domain_order: unknown {order!r}; choose one of {ORDERS}")
  def domain_loss(params, batch, e):
    batch, (logits,) = example_view(batch, model.apply(params, batch.x))  # per-token labels: tokens
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
    m = batch.mask * (batch.domain == e)
    return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1.0)

  def step_fn(carry, batch: Batch, rng):
    theta, inner_state = carry
    batch, size = slot_view(batch, num_domains)  # present domains as slots 0..S-1, ascending id
    slots = jnp.arange(size) if order == "ascending" else jax.random.permutation(jax.random.fold_in(rng, 7), size)

    def inner(carry, e):
      p, st = carry
      loss, g = jax.value_and_grad(domain_loss)(p, batch, e)
      updates, st_new = inner_opt.update(g, st, p)
      present = jnp.sum(batch.mask * (batch.domain == e)) > 0
      return tree_where(present, (optax.apply_updates(p, updates), st_new), (p, st)), (loss * present, present)

    (theta_inner, inner_state), (losses, present) = jax.lax.scan(inner, (theta, inner_state), slots)
    theta = jax.tree.map(lambda t, ti: t + meta_lr * (ti - t), theta, theta_inner)
    return (theta, inner_state), jnp.sum(losses) / jnp.maximum(jnp.sum(present), 1.0)
  return step_fn


def fish_client(model, sched: LocalSchedule, inner_opt: optax.GradientTransformation, meta_lr: float,
                num_domains: int, order: str = "ascending") -> ClientSide:
  step_fn = fish_step(model, inner_opt, meta_lr, num_domains, order)

  def update(global_params, extra, client_state, data, rng):
    (params, _), loss = local_loop((global_params, inner_opt.init(global_params)), step_fn, data, rng, sched)
    return send(params, global_params, client_state, {"train_loss": loss})
  return ClientSide(update)


@dataclasses.dataclass(frozen=True)
class HParams:
  meta_lr: float = hparam(0.5, "meta step (DomainBed default; Bai et al. 2024 Table 7: 0.1 on PACS, CelebA, Camelyon17, "
                          "IWildCam)", gt=0, le=1, search=Choice((0.05, 0.1, 0.5)))
  domain_order: str = hparam("random", "order of the inner domain steps: random per step (Shi et al. Alg. 2) or "
                             "ascending id (DomainBed, Bai et al.)", choices=ORDERS)


SPEC = MethodSpec("fish", "Shi et al. 2022 (DomainBed's form)",
                  lambda ctx, hp: fish_client(ctx.model, ctx.sched, ctx.client_opt, hp.meta_lr, ctx.num_domains,
                                              hp.domain_order),
                  HParams, group="DG")
