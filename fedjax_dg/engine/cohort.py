"""Cohort sampling: which clients take part in a round, their aggregation weights and keys,
and which of them fail (drop out or straggle)."""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp


class Cohort(NamedTuple):
  """One round's cohort: member ids, which report, their weights and keys."""
  ids: jax.Array          # [S] sorted client ids, padded with num_clients
  valid: jax.Array        # [S] 1 for real members (that report)
  weights: jax.Array      # [S] aggregation weights (0 for padding and dropped members)
  rngs: jax.Array         # [S] each member's key
  report_rngs: jax.Array  # [S] each member's key for the post-round report
  work: Any = None        # [S] stragglers' shares of their local steps (1: all), or None
  keep: Any = None        # [S] ids whose new state is kept (dropped members: num_clients), or None


# Above this many clients a cohort is drawn by Floyd's algorithm (O(cohort^2) work) instead
# of a permutation of every client (a sort of all of them: O(C log C), the largest cost of a
# round at 100,000 clients). Both draw a uniformly random subset; at or below it, cohorts are
# those of `jax.random.choice(..., replace=False)`, as before.
FLOYD_ABOVE = 1 << 14


@functools.partial(jax.jit, static_argnums=(1, 2))  # compiled once: the host-state round calls it eagerly
def floyd_sample(key, n: int, k: int):
  """`k` distinct ids of `range(n)`, a uniformly random subset, sorted (Floyd's algorithm:
  for i = n-k, ..., n-1 draw j uniform in [0, i] and take j, or i when j is taken)."""
  keys = jax.random.split(key, k)

  def body(t, chosen):
    i = n - k + t
    j = jax.random.randint(keys[t], (), 0, i + 1)
    return chosen.at[t].set(jnp.where(jnp.any(chosen == j), i, j))
  return jnp.sort(jax.lax.fori_loop(0, k, body, jnp.full((k,), -1, jnp.int32)))


def make_sampler(num_clients: int, cohort_size: int, padded: int, weighting: str, dropout: float = 0.0,
                 straggler_fraction: float = 0.0) -> Callable:
  """`sample(counts, rng, client_weights) -> Cohort` for a cohort of `cohort_size` of
  `num_clients` clients, padded to `padded` members (padding: id `num_clients`, weight 0);
  the cohort is a uniformly random subset (`floyd_sample` above `FLOYD_ABOVE` clients).

  Without `client_weights` a member's weight is its example count (`weighting="examples"`)
  or 1. Failing clients (FedProx's systems heterogeneity), with `k = fold_in(rng, 1)` split
  in (k_drop, k_slow, k_work): a sampled client `c` drops out with probability `dropout`
  (`bernoulli(fold_in(k_drop, c), dropout)`); `round(straggler_fraction * cohort_size)`
  members (the first cohort positions of `permutation(k_slow, cohort_size)`) straggle,
  each doing a share `u = uniform(fold_in(k_work, c))` of its local steps."""
  failures = dropout > 0 or straggler_fraction > 0
  n_slow = int(round(straggler_fraction * cohort_size))

  def sample(counts, rng, client_weights):
    k_cohort, k_clients = jax.random.split(rng)
    if cohort_size == num_clients:
      ids = jnp.arange(num_clients)
    elif num_clients <= FLOYD_ABOVE:
      ids = jnp.sort(jax.random.choice(k_cohort, num_clients, (cohort_size,), replace=False))
    else:
      ids = floyd_sample(k_cohort, num_clients, cohort_size)
    ids = jnp.concatenate([ids, jnp.full((padded - cohort_size,), num_clients, ids.dtype)])
    valid = (ids < num_clients).astype(jnp.float32)
    if client_weights is not None:  # e.g. learned aggregation weights (differentiable)
      w = valid * jnp.take(client_weights, ids, mode="clip")
    else:
      w = valid * (jnp.take(counts, ids, mode="clip").astype(jnp.float32) if weighting == "examples" else 1.0)
    rngs = jax.vmap(lambda i: jax.random.fold_in(k_clients, i))(ids)
    report_rngs = jax.vmap(lambda k: jax.random.fold_in(k, 1))(rngs)
    if not failures:
      return Cohort(ids, valid, w, rngs, report_rngs)
    k_drop, k_slow, k_work = jax.random.split(jax.random.fold_in(rng, 1), 3)
    per_client = lambda k: jax.vmap(lambda i: jax.random.fold_in(k, i))(ids)
    up = 1.0 - jax.vmap(lambda k: jax.random.bernoulli(k, dropout))(per_client(k_drop)).astype(jnp.float32)
    slow = jnp.zeros((padded,), bool).at[jax.random.permutation(k_slow, cohort_size)[:n_slow]].set(True)
    work = jnp.where(slow, jax.vmap(lambda k: jax.random.uniform(k))(per_client(k_work)), 1.0)
    return Cohort(ids, valid * up, w * up, rngs, report_rngs, work if n_slow else None,
                   jnp.where(up > 0, ids, num_clients))

  return sample
