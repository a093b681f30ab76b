"""Client partitions: Heterogeneous Partitioning (Bai et al. 2024, Alg. 1), Dirichlet, IID.

Every partitioner returns one integer index array per client into the pooled training
examples; together they are disjoint and exhaustive, and no client is empty.
"""
from __future__ import annotations

import numpy as np


def _assign_domains(domain_sizes: np.ndarray, num_clients: int) -> np.ndarray:
  """Step 1 of Alg. 1: the complete-heterogeneity ownership matrix `1[d in D_c]`.

  Returns a boolean array `[C, D]`. `C <= D`: domains in descending size go to the
  client with the fewest samples so far (eq. 5), so no domain is shared. `C > D`: one
  domain per client first, then each new client joins the domain with the largest
  current samples-per-client `n_d / #clients(d)` (eq. 6), so no client holds two.
  Ties go to the lowest index.
  """
  n = np.asarray(domain_sizes, dtype=np.int64)
  num_domains = len(n)
  order = np.argsort(-n, kind="stable")  # descending sizes, stable on ties
  owns = np.zeros((num_clients, num_domains), dtype=bool)
  if num_clients <= num_domains:
    load = np.zeros(num_clients, dtype=np.int64)
    for d in order:
      c = int(np.argmin(load))
      owns[c, d] = True
      load[c] += n[d]
  else:
    for c, d in enumerate(order):
      owns[c, d] = True
    sharers = owns.sum(0)
    for c in range(num_domains, num_clients):
      d = int(np.argmax(n / sharers))
      owns[c, d] = True
      sharers[d] += 1
  return owns


def heterogeneous_counts(domain_sizes, num_clients: int, lam: float) -> np.ndarray:
  """Integer counts `n_{d,c}(lambda)` of Bai et al. 2024 eq. (7), as an array `[C, D]`.

  `n_{d,c} = lam n_d / C + (1 - lam) 1[d in D_c] n_d / #{c': d in D_c'}`.

  Rounding (where we deviate from the benchmark code, which hands leftovers to the
  lowest-indexed clients whatever their domain and so breaks complete heterogeneity at
  `lam = 0`): per domain, floor every entry, then give the remaining `r_d` examples one
  each to the entries with the largest fractional parts (ties: owners of `d` first, then
  the client with fewest examples so far, then the lowest index). At `lam = 0` only
  owners have a fractional part, so clients stay single-domain (C >= D) and no domain
  is shared (C <= D). Column sums are exact; a last pass moves single examples so that
  no client is empty (never needed at `lam = 0`).
  """
  n = np.asarray(domain_sizes, dtype=np.int64)
  if n.ndim != 1 or len(n) == 0 or np.any(n < 0):
    raise ValueError(f"domain_sizes must be a non-empty 1-D array of non-negative counts, got {domain_sizes!r}")
  if not 0.0 <= lam <= 1.0:
    raise ValueError(f"lam must lie in [0, 1], got {lam}")
  if num_clients < 1 or num_clients > n.sum():
    raise ValueError(f"num_clients must be in [1, {n.sum()}] (the number of examples), got {num_clients}")
  owns = _assign_domains(n, num_clients)
  sharers = owns.sum(0)
  real = lam * n[None, :] / num_clients + (1.0 - lam) * owns * (n / np.maximum(sharers, 1))[None, :]
  counts = np.floor(real + 1e-9).astype(np.int64)
  counts = np.minimum(counts, n[None, :])
  frac = real - counts
  for d in range(len(n)):
    remainder = int(n[d] - counts[:, d].sum())
    if remainder < 0:  # float slack pushed a floor too high: take back from the largest
      for c in np.argsort(-counts[:, d], kind="stable")[:-remainder]:
        counts[c, d] -= 1
      continue
    totals = counts.sum(1)
    key = np.lexsort((np.arange(num_clients), totals, ~owns[:, d], -np.round(frac[:, d], 9)))
    counts[key[:remainder], d] += 1
  # Repair empty clients (possible only for lam > 0 with many tiny domains).
  for c in np.flatnonzero(counts.sum(1) == 0):
    totals = counts.sum(1)
    donors = [(counts[c2, d], d, c2) for c2 in range(num_clients) for d in range(len(n))
              if counts[c2, d] > 0 and totals[c2] > 1]
    _, d, c2 = max(donors, key=lambda t: (owns[c, t[1]], t[0]))
    counts[c2, d] -= 1
    counts[c, d] += 1
  return counts


def _domain_index(domain_ids):
  domain_ids = np.asarray(domain_ids)
  domains = np.unique(domain_ids)
  return domains, [np.flatnonzero(domain_ids == d) for d in domains]


def heterogeneous_partition(domain_ids, num_clients: int, lam: float, seed: int = 0):
  """Heterogeneous Partitioning of examples: one index array per client.

  `domain_ids[i]` is example `i`'s domain; domains are the sorted unique values. Each
  domain's examples are drawn without replacement from a seeded permutation.
  """
  domains, members = _domain_index(domain_ids)
  counts = heterogeneous_counts([len(m) for m in members], num_clients, lam)
  rng = np.random.default_rng(seed)
  parts = [[] for _ in range(num_clients)]
  for j, idx in enumerate(members):
    perm = rng.permutation(idx)
    bounds = np.concatenate([[0], np.cumsum(counts[:, j])])
    for c in range(num_clients):
      parts[c].append(perm[bounds[c]:bounds[c + 1]])
  return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def iid_partition(num_examples: int, num_clients: int, seed: int = 0):
  """Uniformly random, near-equal client shards."""
  if num_clients < 1 or num_clients > num_examples:
    raise ValueError(f"num_clients must be in [1, {num_examples}], got {num_clients}")
  perm = np.random.default_rng(seed).permutation(num_examples)
  return [np.sort(p).astype(np.int64) for p in np.array_split(perm, num_clients)]


def dirichlet_partition(labels, num_clients: int, alpha: float, seed: int = 0, max_tries: int = 100):
  """Label-skew partition: per class, client shares ~ Dirichlet(alpha) (Hsu et al. 2019).

  Redraws (up to `max_tries`) until no client is empty.
  """
  labels = np.asarray(labels)
  if alpha <= 0:
    raise ValueError(f"alpha must be > 0, got {alpha}")
  if num_clients < 1 or num_clients > len(labels):
    raise ValueError(f"num_clients must be in [1, {len(labels)}], got {num_clients}")
  rng = np.random.default_rng(seed)
  for _ in range(max_tries):
    parts = [[] for _ in range(num_clients)]
    for k in np.unique(labels):
      idx = rng.permutation(np.flatnonzero(labels == k))
      shares = rng.dirichlet(alpha * np.ones(num_clients))
      cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(np.int64)
      for c, chunk in enumerate(np.split(idx, cuts)):
        parts[c].append(chunk)
    parts = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
    if min(len(p) for p in parts) > 0:
      return parts
  raise ValueError(f"dirichlet_partition: could not make {num_clients} non-empty clients with alpha={alpha}")
