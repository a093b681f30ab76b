"""Agnostic Federated Learning, modified for C != D (Bai et al. 2024 App. B, Alg. 2).

The server keeps domain weights `beta` on the simplex over the `D` training domains
(uniform over the domains the clients hold at the start). Each round:

  clients:  `K` local steps on  L_c(theta, beta) = sum_d beta_d R_{c,d}(theta)   (eq. 15)
            (`R_{c,d}` the mean loss of domain `d` in the minibatch, 0 if absent)
  server:   theta <- FedAvg of the client models (any server rule)
  clients:  report summed loss and count per domain over their training data at the new theta
  server:   L_d = sum_c loss_{c,d} / sum_c count_{c,d};   beta <- Proj_simplex(beta + gamma L)

The loss report and the `beta` step run in the engine's pre-round phase of the next
round, i.e. right before `beta` is used, and are skipped in the first round; with full
participation this is exactly Alg. 2. With partial participation the report comes from
the next round's cohort rather than the one that trained. `gamma` (`afl_step`) is ours:
App. D lists only AFL's learning rates.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import LocalSchedule, example_view, tokens_as_examples
from fedjax_dg.algorithms.fedavg import objective_client
from fedjax_dg.algorithms.spec import ClientSide, LogUniform, MethodSpec, hparam
from fedjax_dg.objectives import domain_risks


class Side(NamedTuple):
  beta: jax.Array   # [D] domain weights on the simplex


def project_simplex(v):
  """Euclidean projection onto `{w >= 0, sum w = 1}` (sort-based; Held et al. 1974,
  Duchi et al. 2008): `w = max(v - tau, 0)` with `tau = (sum_{j<=rho} u_j - 1) / rho`,
  `u` sorted descending and `rho` the largest `j` with `u_j > (sum_{i<=j} u_i - 1) / j`."""
  u = jnp.sort(v)[::-1]
  j = jnp.arange(1, v.shape[0] + 1, dtype=v.dtype)
  css = jnp.cumsum(u)
  rho = jnp.max(jnp.where(u - (css - 1) / j > 0, j, 0))
  tau = (jnp.take(css, rho.astype(jnp.int32) - 1) - 1) / rho
  return jnp.maximum(v - tau, 0.0)


def afl_objective(model, num_domains: int):
  """`beta -> objective`: `sum_d beta_d R_d` over the minibatch (eq. 15)."""
  def make(beta):
    def objective(params, batch, rng):
      del rng
      batch, (logits,) = example_view(batch, model.apply(params, batch.x))
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
      risks, _ = domain_risks(ce, batch.domain, batch.mask, num_domains)
      return jnp.sum(beta * risks), {}
    return objective
  return make


def afl_client(model, sched: LocalSchedule, client_opt: optax.GradientTransformation, gamma: float,
               num_domains: int, train_domains=None, stat_chunk: int = 256) -> ClientSide:
  """`train_domains`: the domain ids clients hold (default all); `beta` starts uniform on them
  and stays 0 elsewhere (the projection of a vector with sum >= 1 never raises a zero entry)."""
  on = jnp.zeros(num_domains).at[jnp.asarray(train_domains if train_domains is not None else range(num_domains))].set(1.0)
  make = afl_objective(model, num_domains)

  def stat(params, beta, client_state, data, rng):
    n = data.y.shape[0]
    c = min(stat_chunk, n)

    def sums(r):  # one chunk's per-domain loss sums and counts (labelled tokens, for per-token labels)
      keep = (r < n).astype(jnp.float32)
      r = jnp.minimum(r, n - 1)
      y, m, (logits,), dom = tokens_as_examples(data.y[r], data.mask[r] * keep, model.apply(params, data.x[r]),
                                                domain=data.domain[r])
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, y) * m
      # segment sums, O(chunk * T + D): no [chunk * T, D] one-hot (ids outside 0..D-1 dropped)
      return jax.ops.segment_sum(ce, dom, num_domains), jax.ops.segment_sum(m, dom, num_domains)

    loss_sum, count = jax.lax.map(sums, jnp.arange(-(-n // c) * c).reshape(-1, c))
    return jnp.sum(loss_sum, 0), jnp.sum(count, 0)  # per-domain loss sums, counts

  def prepare(side: Side, mean_stat, round_) -> Side:
    loss_sum, count = mean_stat  # cohort means; their ratio is sum loss / sum count
    losses = loss_sum / jnp.maximum(count, 1e-12)
    return Side(jnp.where(round_ > 0, project_simplex(side.beta + gamma * losses), side.beta))

  return objective_client(lambda g, beta: make(beta), client_opt, sched,
                          side_init=lambda rng, params: Side(on / jnp.sum(on)),
                          broadcast=lambda side, round_: side.beta, stat=stat, prepare=prepare)


@dataclasses.dataclass(frozen=True)
class HParams:
  step: float = hparam(0.1, "gamma_beta, the domain-weight step (ours: Bai et al. 2024 App. D lists only learning rates)",
                       ge=0, search=LogUniform(1e-3, 1.0))


SPEC = MethodSpec(
    "afl", "Mohri et al. 2019, as Bai et al. 2024 App. B",
    lambda ctx, hp: afl_client(ctx.model, ctx.sched, ctx.client_opt, hp.step, ctx.num_domains, ctx.train_domains),
    HParams, sends=("per-domain loss sums and example counts (pre-round)",), receives=("domain weights beta",),
    group="FDG")
