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
gets the largest, sign-like step. The references differ:
  - Shi, Seely, Torr, Siddharth, Hannun, Usunier and Synnaeve, "Gradient Matching for
    Domain Generalization" (ICLR 2022), in their own code (`src/main.py: train_fish`
    with `src/utils.py: sample_domains`): at every iteration `meta_steps` distinct
    domains are drawn at random (weighted by the batches each has left in the epoch)
    and the inner steps follow the order of the draw, a random order that changes from
    step to step (their meta step is `meta_lr / meta_steps`).
  - DomainBed (`domainbed/algorithms.py: Fish.update`) loops over the environments'
    minibatches in the environments' fixed order.
  - Bai et al.'s federated Fish (FedDG_Benchmark, `src/client.py: Fish.step`) loops over
    `split_into_groups` of the batch, i.e. ascending group id, a fixed order.
The default, "random", follows Shi et al.'s code: a uniformly random order of the
present domains at each step (`permutation(fold_in(step key, 7), S)`), so relabelling the
domains changes no result in distribution. "ascending" is DomainBed's and Bai et al.'s
fixed order.

Activity (`activity/step_deviation`), at each client's first local step of the round:
`||d_fish - d_plain|| / ||d_plain||` with `d_fish = meta_lr (theta~ - theta)` the step
Fish takes and `d_plain = meta_lr S u(g_bar)` the plain step from the same point on the
same batch: `S` (the present domains) steps of the inner optimizer on the mean gradient
`g_bar = grad mean_e R_e(theta)`, all taken at `theta` (`u` is the inner optimizer's
update from the step's inner state). For SGD `d_plain = -meta_lr lr S g_bar`, the step
Fish's inner loop takes to first order in `lr` (`theta~ - theta = -lr sum_e g_e +
O(lr^2)`, each `g_e` at `theta`), so the record measures what the sequential inner loop (the
gradient matching) adds: 0 on a single-domain client, whatever the optimizer. It costs
one more gradient of the batch's mean domain risk once a round.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import (Batch, LocalSchedule, example_view, local_loop, local_loop_recording,
                                       relative_distance, slot_view, tree_where)
from fedjax_dg.algorithms.spec import Choice, ClientSide, MethodSpec, hparam, send
from fedjax_dg.objectives import domain_risks


ORDERS = ("random", "ascending")


def fish_step(model, inner_opt: optax.GradientTransformation, meta_lr: float, num_domains: int,
              order: str = "ascending", record: bool = False):
  """One Fish local step.

  Args:
    model: the model (`apply`).
    inner_opt: the inner optimizer; its state is carried from step to step (DomainBed's
      `optimizer_inner_state`).
    meta_lr: the meta step `theta <- theta + meta_lr (theta~ - theta)`.
    num_domains: the dataset's domains.
    order: "ascending" domain id (DomainBed's, Bai et al.'s; `rng` unused) or "random"
      (a permutation drawn from `rng` per step).
    record: the step also returns `{"step_deviation": (value, 1.0)}` (the module
      docstring), for `local_loop_recording`.

  Returns:
    `step_fn((theta, inner_state), batch, rng) -> ((theta, inner_state), loss)` for
    `local_loop`, with the record as a third output when `record`.

  Raises:
    ValueError: an unknown `order`, naming `algorithm.fish.domain_order`.
  """
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

    (theta_inner, inner_state_new), (losses, present) = jax.lax.scan(inner, (theta, inner_state), slots)
    new_theta = jax.tree.map(lambda t, ti: t + meta_lr * (ti - t), theta, theta_inner)
    loss = jnp.sum(losses) / jnp.maximum(jnp.sum(present), 1.0)
    if not record:
      return (new_theta, inner_state_new), loss
    plain = plain_step(theta, inner_state, batch, size)
    d_fish = jax.tree.map(jnp.subtract, new_theta, theta)
    return (new_theta, inner_state_new), loss, {"step_deviation": (relative_distance(d_fish, plain), 1.0)}

  def plain_step(theta, inner_state, batch, size):
    """`meta_lr S u(g_bar)`: S inner steps on the mean domain gradient, all at `theta`."""
    def mean_risk(p):
      b, (logits,) = example_view(batch, model.apply(p, batch.x))
      risks, present = domain_risks(optax.softmax_cross_entropy_with_integer_labels(logits, b.y), b.domain, b.mask,
                                    size)
      return jnp.sum(risks * present) / jnp.maximum(jnp.sum(present), 1.0), jnp.sum(present)
    g_bar, n_present = jax.grad(mean_risk, has_aux=True)(theta)
    u, _ = inner_opt.update(g_bar, inner_state, theta)
    return jax.tree.map(lambda a: meta_lr * n_present * a, u)
  return step_fn


def fish_client(model, sched: LocalSchedule, inner_opt: optax.GradientTransformation, meta_lr: float,
                num_domains: int, order: str = "ascending") -> ClientSide:
  """Fish's client: `K` Fish steps (`fish_step`) from the broadcast model, sending `Delta_c`;
  with `sched.activity` it records `activity/step_deviation` at the round's first step.

  Args:
    model: the model.
    sched: the local schedule.
    inner_opt: the inner optimizer (the configured client optimizer), fresh each round.
    meta_lr: the meta step.
    num_domains: the dataset's domains.
    order: the inner loop's domain order ("random" or "ascending").

  Returns:
    The `ClientSide`.
  """
  step_fn = fish_step(model, inner_opt, meta_lr, num_domains, order)
  first_fn = fish_step(model, inner_opt, meta_lr, num_domains, order, record=True)

  def update(global_params, extra, client_state, data, rng):
    carry = (global_params, inner_opt.init(global_params))
    if not sched.activity:
      (params, _), loss = local_loop(carry, step_fn, data, rng, sched)
      return send(params, global_params, client_state, {"train_loss": loss})
    (params, _), loss, record = local_loop_recording(carry, lambda c, b, k: (*step_fn(c, b, k), {}), data, rng, sched,
                                                     first_step_fn=first_fn)
    return send(params, global_params, client_state,
                {"train_loss": loss, **{f"activity/{n}": v for n, v in record.items()}})
  return ClientSide(update)


@dataclasses.dataclass(frozen=True)
class HParams:
  meta_lr: float = hparam(0.5, "meta step (DomainBed default; Bai et al. 2024 Table 7: 0.1 on PACS, CelebA, Camelyon17, "
                          "IWildCam)", gt=0, le=1, search=Choice((0.05, 0.1, 0.5)))
  domain_order: str = hparam("random", "order of the inner domain steps: random per step (Shi et al.'s code) or "
                             "ascending id (DomainBed, Bai et al.)", choices=ORDERS)


SPEC = MethodSpec("fish", "Shi et al. 2022 (DomainBed's form)",
                  lambda ctx, hp: fish_client(ctx.model, ctx.sched, ctx.client_opt, hp.meta_lr, ctx.num_domains,
                                              hp.domain_order),
                  HParams, group="DG", activity=("step_deviation",))
