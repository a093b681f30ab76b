"""Heterogeneous Partitioning (Bai et al. Alg. 1) and the other partitioners."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fedjax_dg.data import partition as P


def test_paper_example_1():
  # Bai et al., Example 1: five domains of 10, 20, 30, 40, 100 examples into two clients.
  counts = P.heterogeneous_counts([10, 20, 30, 40, 100], 2, 0.0)
  assert sorted(map(tuple, counts.tolist())) == [(0, 0, 0, 0, 100), (10, 20, 30, 40, 0)]


def _check_counts(sizes, C, lam):
  counts = P.heterogeneous_counts(sizes, C, lam)
  D = len(sizes)
  assert counts.shape == (C, D)
  assert counts.dtype.kind == "i" and counts.min() >= 0
  np.testing.assert_array_equal(counts.sum(0), sizes)          # column sums exact
  assert counts.sum() == sum(sizes)                            # row sums add to everything
  assert counts.sum(1).min() >= 1                              # every client non-empty
  if lam == 0.0:
    held = counts > 0
    if C >= D:
      assert (held.sum(1) == 1).all(), "a client holds two domains at lambda=0"
    if C <= D:
      assert (held.sum(0) <= 1).all(), "a domain is shared at lambda=0"
  if lam == 1.0:  # homogeneous: every domain split evenly to within one example
    assert (counts.max(0) - counts.min(0) <= 1).all()
  return counts


sizes_strategy = st.lists(st.integers(1, 400), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(sizes=sizes_strategy, c=st.integers(1, 60), lam=st.sampled_from([0.0, 0.1, 0.5, 1.0]))
def test_counts_properties(sizes, c, lam):
  c = min(c, sum(sizes))
  _check_counts(sizes, c, lam)


@pytest.mark.parametrize("sizes", [[317, 89, 1203, 45, 660], [7, 7, 7], [1000, 3, 2, 1]])
@pytest.mark.parametrize("regime", ["C<D", "C=D", "C>D"])
@pytest.mark.parametrize("lam", [0.0, 0.1, 0.5, 1.0])
def test_counts_regimes(sizes, regime, lam):
  D = len(sizes)
  C = {"C<D": max(1, D - 1), "C=D": D, "C>D": min(sum(sizes), 4 * D + 3)}[regime]
  _check_counts(sizes, C, lam)


def test_lambda_zero_c_greater_d_balances_by_largest_average():
  # C > D: extra clients join the domain with the most samples per client (eq. 6).
  counts = P.heterogeneous_counts([600, 300, 100], 6, 0.0)
  owners = (counts > 0).sum(0)
  np.testing.assert_array_equal(owners, [3, 2, 1])  # 200, 150, 100 per client
  assert counts.sum(1).max() - counts.sum(1).min() == 100


def test_lambda_zero_minimal_variance_when_divisible():
  # Equal domains, C a multiple of D: every client gets exactly n_d * D / C.
  counts = P.heterogeneous_counts([120] * 4, 12, 0.0)
  assert set(counts.sum(1).tolist()) == {40}


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_partition_disjoint_exhaustive_and_matches_counts(lam):
  rng = np.random.default_rng(1)
  domain_ids = rng.integers(0, 5, 777)
  parts = P.heterogeneous_partition(domain_ids, 13, lam, seed=3)
  allidx = np.concatenate(parts)
  assert len(allidx) == len(domain_ids) and len(np.unique(allidx)) == len(domain_ids)
  sizes = [int((domain_ids == d).sum()) for d in range(5)]
  counts = P.heterogeneous_counts(sizes, 13, lam)
  got = np.array([[int((domain_ids[p] == d).sum()) for d in range(5)] for p in parts])
  np.testing.assert_array_equal(got, counts)
  # Seeded: same seed same partition, other seed another draw.
  again = P.heterogeneous_partition(domain_ids, 13, lam, seed=3)
  assert all((a == b).all() for a, b in zip(parts, again))
  other = P.heterogeneous_partition(domain_ids, 13, lam, seed=4)
  assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


def test_iid_and_dirichlet():
  labels = np.random.default_rng(0).integers(0, 10, 500)
  for parts in (P.iid_partition(500, 7, 0), P.dirichlet_partition(labels, 7, 0.3, 0)):
    allidx = np.concatenate(parts)
    assert sorted(allidx.tolist()) == list(range(500))
    assert min(len(p) for p in parts) > 0
  # Small alpha concentrates each class on few clients.
  parts = P.dirichlet_partition(labels, 7, 0.05, 0)
  label_sets = [len(np.unique(labels[p])) for p in parts]
  assert np.mean(label_sets) < 8


@pytest.mark.parametrize("bad", [dict(lam=-0.1), dict(lam=1.5), dict(num_clients=0), dict(num_clients=100)])
def test_counts_bad_input(bad):
  kw = dict(domain_sizes=[10, 20], num_clients=3, lam=0.5)
  kw.update(bad)
  with pytest.raises(ValueError):
    P.heterogeneous_counts(**kw)
