"""Domain-generalization penalties as pure functions (DomainBed's forms, docs/ALGORITHMS.md).

Every function takes an optional `mask` (1 for real examples) so that it works on the
padded batches of the engine; without a mask every row counts. Inside a client they are
applied over the domains present in its batch (Bai et al. 4.2).

  irm_penalty(logits, labels)     IRMv1: (d/ds R_even(s z)) (d/ds R_odd(s z)) at s = 1, the
                                  unbiased even/odd estimate of ||d/ds R||^2 (may be negative)
  vrex_penalty(domain_losses)     V-REx: mean_e (R_e - mean R)^2 over the present domains
  coral_penalty(z_a, z_b)         mean((mu_a - mu_b)^2) + mean((Cov_a - Cov_b)^2), Cov with n - 1
  mmd_penalty(z_a, z_b)           MMD^2 with the Gaussian kernel mix sum_g exp(-g ||x - y||^2),
                                  g in {1e-3, 1e-2, 1e-1, 1, 10, 100, 1e3}

Over a batch's domains (`domain_slots`: the present domains renumbered to slots 0..S-1,
S = min(B, num_domains), so nothing costs O(num_domains) per batch):

  domain_risks                    per-domain mean loss and presence (segment sums)
  irm_penalties                   irm_penalty of every slot, from one softmax
  mean_pairwise_coral / _mmd      the mean of coral_penalty / mmd_penalty over present pairs
  mixup_partners                  DomainBed's pairing under a random order of the slots

The public benchmark code computes IRM's and VREx's penalties with the weight reset to
zero and MMD's and CORAL's as identically zero; these are the formulas, tested to be
positive with non-zero gradients on two domains whose features differ.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

MMD_GAMMAS = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0)


def _mask(mask, n, dtype=jnp.float32):
  return jnp.ones(n, dtype) if mask is None else jnp.asarray(mask, dtype)


def _mean_ce(logits, labels, w):
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1.0)


def irm_penalty(logits, labels, mask=None):
  """IRMv1 on one domain's examples; even/odd split by rank among the real rows."""
  m = _mask(mask, labels.shape[0], logits.dtype)
  rank = jnp.cumsum(m) - 1
  even = m * (rank % 2 == 0)
  odd = m * (rank % 2 == 1)
  g_even = jax.grad(lambda s: _mean_ce(s * logits, labels, even))(jnp.asarray(1.0, logits.dtype))
  g_odd = jax.grad(lambda s: _mean_ce(s * logits, labels, odd))(jnp.asarray(1.0, logits.dtype))
  return g_even * g_odd


def vrex_penalty(domain_losses, present=None):
  """Variance of the per-domain losses over the domains present."""
  r = jnp.asarray(domain_losses)
  p = _mask(present, r.shape[0], r.dtype)
  n = jnp.maximum(jnp.sum(p), 1.0)
  mean = jnp.sum(r * p) / n
  return jnp.sum(p * (r - mean) ** 2) / n


def _moments(z, m):
  n = jnp.sum(m)
  mu = jnp.sum(z * m[:, None], 0) / jnp.maximum(n, 1.0)
  c = (z - mu) * m[:, None]
  cov = c.T @ c / jnp.maximum(n - 1.0, 1.0)
  return mu, cov, n


def coral_penalty(z_a, z_b, mask_a=None, mask_b=None):
  """CORAL between two domains' features. The covariance term needs two examples per
  domain (n - 1 normalisation); with fewer it is left out."""
  mu_a, cov_a, n_a = _moments(z_a, _mask(mask_a, z_a.shape[0], z_a.dtype))
  mu_b, cov_b, n_b = _moments(z_b, _mask(mask_b, z_b.shape[0], z_b.dtype))
  both = (n_a >= 2) & (n_b >= 2)
  return jnp.mean((mu_a - mu_b) ** 2) + jnp.where(both, jnp.mean((cov_a - cov_b) ** 2), 0.0)


def _kernel(x, y, gammas):
  d2 = jnp.sum(x ** 2, 1)[:, None] + jnp.sum(y ** 2, 1)[None, :] - 2 * x @ y.T
  d2 = jnp.maximum(d2, 0.0)
  return sum(jnp.exp(-g * d2) for g in gammas)


def mmd_penalty(z_a, z_b, mask_a=None, mask_b=None, gammas=MMD_GAMMAS):
  """Biased MMD^2 estimate with DomainBed's Gaussian kernel mix."""
  ma, mb = _mask(mask_a, z_a.shape[0], z_a.dtype), _mask(mask_b, z_b.shape[0], z_b.dtype)
  wmean = lambda k, u, v: jnp.sum(k * u[:, None] * v[None, :]) / jnp.maximum(jnp.sum(u) * jnp.sum(v), 1.0)
  return (wmean(_kernel(z_a, z_a, gammas), ma, ma) + wmean(_kernel(z_b, z_b, gammas), mb, mb)
          - 2 * wmean(_kernel(z_a, z_b, gammas), ma, mb))


def domain_slots(domain, mask, num_domains: int):
  """The domains present in a batch renumbered to slots: `(slot [B], ids [S])` with the
  static `S = min(B, num_domains)` (a batch of B rows holds at most B domains). The present
  domains get slots `0..n_p - 1` in ascending domain id (`ids[s]` is slot `s`'s domain id,
  `num_domains` for an unused slot); a padding row (mask 0), or a row whose id is outside
  `0..num_domains - 1` (which the per-domain computations over `num_domains` ignore), gets
  slot 0 and must be read with its mask (`slot_mask`). Costs a sort of B ids, never
  anything of size `num_domains`, so the per-batch penalties below compile and run alike
  for 3 domains or Py150's 5,477 repositories."""
  n = domain.shape[0]
  size = max(1, min(n, num_domains))
  real = slot_mask(domain, mask, num_domains) > 0
  key = jnp.where(real, domain, num_domains)  # padding sorts last
  order = jnp.argsort(key, stable=True)
  sk = key[order]
  first = jnp.concatenate([jnp.ones(1, bool), sk[1:] != sk[:-1]]) if n else jnp.zeros(0, bool)
  slot_sorted = (jnp.cumsum(first) - 1).astype(jnp.int32)
  slot = jnp.zeros(n, jnp.int32).at[order].set(slot_sorted)
  ids = jnp.full(size, num_domains, domain.dtype).at[slot_sorted].set(sk, mode="drop")
  return jnp.where(real, slot, 0), ids


def slot_mask(domain, mask, num_domains: int):
  """`mask` with the rows whose domain id is outside `0..num_domains - 1` zeroed (as the
  per-domain sums over `num_domains` drop them)."""
  return jnp.asarray(mask) * ((domain >= 0) & (domain < num_domains)).astype(jnp.asarray(mask).dtype)


def domain_risks(per_example_loss, domain, mask, num_domains: int):
  """`(R_e, present_e)` for e in 0..num_domains-1: each domain's mean loss over its real
  rows (0 for an absent domain) and whether it has a real row. Segment sums, O(B +
  num_domains): no `[B, num_domains]` array (a per-token batch has B * T rows)."""
  m = jnp.asarray(mask, per_example_loss.dtype)
  counts = jax.ops.segment_sum(m, domain, num_domains)  # ids outside 0..num_domains-1 are dropped
  sums = jax.ops.segment_sum(per_example_loss * m, domain, num_domains)
  return sums / jnp.maximum(counts, 1.0), (counts > 0).astype(per_example_loss.dtype)


def irm_penalties(logits, labels, slot, mask, num_slots: int):
  """`[num_slots]`: `irm_penalty` of each slot's examples (0 for an empty slot), from one
  softmax over the batch: `d/ds CE(s z, y)` at s = 1 is `softmax(z) . z - z_y` per example,
  so slot `s`'s even/odd gradients are segment means of it (the even/odd split by rank
  among the slot's real rows, as `irm_penalty`). Vectorising `irm_penalty` over slots
  instead would redo the softmax of a `[B * T, vocab]` per-token batch once per slot."""
  m = jnp.asarray(mask, logits.dtype)
  g = jnp.sum(jax.nn.softmax(logits) * logits, -1) - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0]
  onehot = (slot[:, None] == jnp.arange(num_slots)[None]) * m[:, None]
  rank = jnp.sum((jnp.cumsum(onehot, 0) - onehot) * onehot, 1)  # rank within its slot's real rows
  even, odd = m * (rank % 2 == 0), m * (rank % 2 == 1)
  mean = lambda w: (jax.ops.segment_sum(g * w, slot, num_slots)
                    / jnp.maximum(jax.ops.segment_sum(w, slot, num_slots), 1.0))
  return mean(even) * mean(odd)


def _pair_sum_sq(a, w):
  """`sum_{i<j} w_i w_j mean((a_i - a_j)^2)` for 0/1 weights `w`, as
  `|W| sum_i w_i mean((a_i - abar)^2)` (`abar` the mean over W): O(S) instead of O(S^2)
  differences of `[d, d]` covariances, and without the cancellation of `sum ||a||^2 - ||sum a||^2`."""
  n = jnp.sum(w)
  wb = w.reshape((-1,) + (1,) * (a.ndim - 1))
  abar = jnp.sum(a * wb, 0) / jnp.maximum(n, 1.0)
  dev = jnp.mean(((a - abar) * wb) ** 2, axis=tuple(range(1, a.ndim)))
  return n * jnp.sum(dev)


def _cov_pair_sum_gram(c, weights, two):
  """`_pair_sum_sq(cov, two)` for the slots' covariances `cov_s = C^T diag(weights_s) C`
  (`weights` [N, S]: each slot's row indicators over its `n_s - 1`) without forming them:
  `cov_s - covbar = C^T diag(e_s) C` with `e_s = weights_s - sum_t two_t weights_t / |two|`,
  so `||cov_s - covbar||_F^2 = e_s^T (G o G) e_s` for the Gram matrix `G = C C^T` of the
  centred rows. O(N^2 d + S N^2) and an [N, N] matrix instead of O(S N d^2) and [S, d, d]."""
  n2 = jnp.sum(two)
  e = weights - (weights @ two)[:, None] / jnp.maximum(n2, 1.0)
  g = c @ c.T
  sq = jnp.einsum("ns,nm,ms->s", e, g * g, e) / c.shape[1] ** 2  # mean((cov_s - covbar)^2)
  return n2 * jnp.sum(two * sq)


def mean_pairwise_coral(z, slot, mask, num_slots: int, covariance: str = "auto"):
  """The mean of `coral_penalty(z_i, z_j)` over the pairs `i < j` of present slots (0 with
  fewer than two): per-slot means once, then the pair sums of `_pair_sum_sq` (the
  covariance term over the pairs whose slots both have >= 2 rows, as `coral_penalty`).
  Equal to the loop over pairs up to float rounding.

  Args:
    z: features [N, d].
    slot: each row's slot [N] (`domain_slots`).
    mask: 1 for real rows [N].
    num_slots: S, the static number of slots.
    covariance: how the covariance term is computed: "moments" forms the S covariances
      ([S, d, d], O(S N d^2)); "gram" reads the same sums off the rows' Gram matrix
      ([N, N], O(N^2 d): `_cov_pair_sum_gram`); "auto" takes "gram" where it is the
      cheaper (N < S d; for 64 rows of 256 features the term's gradient is about 20 times
      faster, a whole MLP step with CORAL 6.5 times: benchmarks/penalty_cost.py). The Gram form's float rounding is relative to the covariances' own
      squared scale rather than to the penalty's: where the slots' covariances nearly
      coincide the penalty's relative error grows (float32, measured against float64: about
      1e-7 on rows that differ, 2e-2 on domains whose rows agree to 1e-3, a penalty of
      about 1e-6), its absolute error staying below float32's resolution of the covariances.

  Returns:
    The penalty, a scalar.
  """
  if covariance not in ("auto", "gram", "moments"):
    raise ValueError(f"covariance: {covariance!r}; choose auto, gram or moments")
  m = jnp.asarray(mask, z.dtype)
  onehot = (slot[:, None] == jnp.arange(num_slots)[None]) * m[:, None]  # [N, S]
  n = jnp.sum(onehot, 0)
  mu = onehot.T @ z / jnp.maximum(n, 1.0)[:, None]
  c = (z - mu[slot]) * m[:, None]
  present, two = (n > 0).astype(z.dtype), (n >= 2).astype(z.dtype)
  n_pairs = jnp.sum(present) * (jnp.sum(present) - 1) / 2
  weights = onehot / jnp.maximum(n - 1.0, 1.0)[None]
  if covariance == "gram" or (covariance == "auto" and z.shape[0] < num_slots * z.shape[1]):
    cov_term = _cov_pair_sum_gram(c, weights, two)
  else:
    cov_term = _pair_sum_sq(jnp.einsum("ns,nd,ne->sde", weights, c, c), two)
  return (_pair_sum_sq(mu, present) + cov_term) / jnp.maximum(n_pairs, 1.0)


def mean_pairwise_mmd(z, slot, mask, num_slots: int, gammas=MMD_GAMMAS):
  """The mean of `mmd_penalty(z_i, z_j)` over the pairs `i < j` of present slots (0 with
  fewer than two), from one kernel matrix: `M = W^T K W` holds every slot pair's mean
  kernel value (`W` the row-normalised slot indicators), `MMD_ij = M_ii + M_jj - 2 M_ij`."""
  m = jnp.asarray(mask, z.dtype)
  onehot = (slot[:, None] == jnp.arange(num_slots)[None]) * m[:, None]
  n = jnp.sum(onehot, 0)
  w = onehot / jnp.maximum(n, 1.0)[None]
  M = w.T @ _kernel(z, z, gammas) @ w
  d = jnp.diag(M)
  vals = d[:, None] + d[None, :] - 2 * M
  present = n > 0
  pairs = present[:, None] & present[None, :] & (jnp.arange(num_slots)[:, None] < jnp.arange(num_slots)[None, :])
  return jnp.sum(jnp.where(pairs, vals, 0.0)) / jnp.maximum(jnp.sum(pairs), 1.0)


def mixup_partners(domain, mask, num_domains: int, order=None):
  """Mixup's pairing of a padded batch by domain. DomainBed's `random_pairs_of_minibatches`
  draws a random order of the domains' minibatches each step and pairs the `i`-th with the
  `(i + 1)`-th, cyclically. Here the order is over the batch's slots (`domain_slots`: the
  present domains renumbered 0..n_p - 1 in ascending id, S = min(B, num_domains) slots):
  `order` is a permutation of `range(S)` (None: the identity, i.e. ascending domain id) and
  the present domains follow in the order their slots have in it. A uniformly random
  permutation of the S slots induces a uniformly random order of the present domains,
  which is all DomainBed's pairing reads, so drawing over S instead of all `num_domains`
  changes no distribution (and costs O(B) at Py150's 5,477 domains). Example `k` of domain
  `e` with rank `r` among `e`'s real rows is paired with the example of rank `r mod n_e'`
  of the next present domain `e'` in the order (cyclic); if `e` is the only present domain
  the partner is the example of rank `(r + 1) mod n_e`, so a single-domain client mixes
  within its domain. DomainBed truncates both minibatches to the smaller one's length; a
  federated client's batch holds unequal domain counts, so every row is kept and the
  smaller domain's rows repeat (`r mod n_e'`). Returns partner indices `[B]` (padding
  rows: themselves)."""
  slot, ids = domain_slots(domain, mask, num_domains)
  mask = slot_mask(domain, mask, num_domains)
  size = ids.shape[0]
  pos = jnp.arange(size) if order is None else jnp.argsort(order)  # pos[s]: slot s's place in the order
  onehot = (slot[:, None] == jnp.arange(size)[None]) * mask[:, None]
  counts = jnp.sum(onehot, 0)
  rank = jnp.sum((jnp.cumsum(onehot, 0) - onehot) * onehot, 1)
  # next present slot after s in the order, cyclically (s itself when it is the only one)
  order_ = jnp.where(counts[None] > 0, (pos[None] - pos[:, None] - 1) % size, size)
  nxt = jnp.argmin(order_, 1)[slot]
  partner_rank = jnp.where(nxt == slot, rank + 1, rank) % jnp.maximum(counts[nxt], 1.0)
  match = (slot[None, :] == nxt[:, None]) & (rank[None, :] == partner_rank[:, None]) & (mask[None, :] > 0)
  return jnp.where(mask > 0, jnp.argmax(match, 1), jnp.arange(domain.shape[0]))
