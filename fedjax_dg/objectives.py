"""Domain-generalization penalties as pure functions (DomainBed's forms, ALGORITHMS.md).

Every function takes an optional `mask` (1 for real examples) so that it works on the
padded batches of the engine; without a mask every row counts. Inside a client they are
applied over the domains present in its batch (Bai et al. 4.2).

  irm_penalty(logits, labels)     IRMv1: (d/ds R_even(s z)) (d/ds R_odd(s z)) at s = 1, the
                                  unbiased even/odd estimate of ||d/ds R||^2 (may be negative)
  vrex_penalty(domain_losses)     V-REx: mean_e (R_e - mean R)^2 over the present domains
  coral_penalty(z_a, z_b)         mean((mu_a - mu_b)^2) + mean((Cov_a - Cov_b)^2), Cov with n - 1
  mmd_penalty(z_a, z_b)           MMD^2 with the Gaussian kernel mix sum_g exp(-g ||x - y||^2),
                                  g in {1e-3, 1e-2, 1e-1, 1, 10, 100, 1e3}

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


def domain_onehot(domain, mask, num_domains: int):
  """`[B, num_domains]`: 1 where a real row belongs to the domain."""
  return (domain[:, None] == jnp.arange(num_domains)[None]) * mask[:, None]


def domain_risks(per_example_loss, domain, mask, num_domains: int):
  """`(R_e, present_e)` for e in 0..num_domains-1: each domain's mean loss over its real
  rows (0 for an absent domain) and whether it has a real row."""
  onehot = domain_onehot(domain, mask, num_domains)
  counts = jnp.sum(onehot, 0)
  risks = jnp.sum(onehot * per_example_loss[:, None], 0) / jnp.maximum(counts, 1.0)
  return risks, (counts > 0).astype(per_example_loss.dtype)


def mixup_partners(domain, mask, num_domains: int, order=None):
  """Mixup's pairing of a padded batch by domain. DomainBed's `random_pairs_of_minibatches`
  draws a random order of the domains' minibatches each step and pairs the `i`-th with the
  `(i + 1)`-th, cyclically; `order` is that permutation of `range(num_domains)` (None: the
  identity). Example `k` of domain `e` with rank `r` among `e`'s real rows is paired with
  the example of rank `r mod n_e'` of the next present domain `e'` in `order` (cyclic); if
  `e` is the only present domain the partner is the example of rank `(r + 1) mod n_e`, so a
  single-domain client mixes within its domain. DomainBed truncates both minibatches to the
  smaller one's length; a federated client's batch holds unequal domain counts, so every
  row is kept and the smaller domain's rows repeat (`r mod n_e'`). Returns partner
  indices `[B]` (padding rows: themselves)."""
  d = jnp.arange(num_domains)
  pos = d if order is None else jnp.argsort(order)  # pos[e]: e's place in the drawn order
  onehot = domain_onehot(domain, mask, num_domains)
  counts = jnp.sum(onehot, 0)
  rank = jnp.sum((jnp.cumsum(onehot, 0) - onehot) * onehot, 1)
  # next present domain after e in the drawn order, cyclically (e itself when it is the only one)
  order_ = jnp.where(counts[None] > 0, (pos[None] - pos[:, None] - 1) % num_domains, num_domains)
  nxt = jnp.argmin(order_, 1)[domain]
  partner_rank = jnp.where(nxt == domain, rank + 1, rank) % jnp.maximum(counts[nxt], 1.0)
  match = (domain[None, :] == nxt[:, None]) & (rank[None, :] == partner_rank[:, None]) & (mask[None, :] > 0)
  return jnp.where(mask > 0, jnp.argmax(match, 1), jnp.arange(domain.shape[0]))
