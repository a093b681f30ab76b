"""The embedded and synthetic datasets, splits and the packed store."""
import numpy as np
import pytest

from fedjax_dg.data import datasets, splits, store
from fedjax_dg.data.partition import heterogeneous_partition


def test_rotated_digits_domains_are_disjoint_rotations():
  ds = datasets.rotated_digits(image_size=16)
  assert ds.names == ("0deg", "15deg", "30deg", "45deg", "60deg", "75deg")
  assert sum(len(y) for y in ds.ys) == 1797 and ds.input_shape == (16, 16, 1)
  assert all(0.0 <= x.min() and x.max() <= 1.0 for x in ds.xs)
  # Domain 0 is unrotated: the upsampled originals. Rotating an image by 0 changes nothing,
  # by 75 degrees changes it a lot.
  from scipy import ndimage
  from sklearn.datasets import load_digits
  raw = load_digits().images.astype(np.float32) / 16.0
  perm = np.random.default_rng(0).permutation(1797)
  up = ndimage.zoom(raw[perm[0::6]], (1, 2, 2), order=1)
  np.testing.assert_allclose(ds.xs[0][..., 0], np.clip(up, 0, 1), atol=1e-6)
  np.testing.assert_array_equal(ds.ys[0], load_digits().target[perm[0::6]])
  up5 = ndimage.zoom(raw[perm[5::6]], (1, 2, 2), order=1)
  assert np.abs(ds.xs[5][..., 0] - up5).mean() > 0.05
  assert datasets.rotated_digits(image_size=28).input_shape == (28, 28, 1)


def test_spurious_correlation_follows_the_domain():
  ds = datasets.spurious_classification(correlations=(0.9, 0.1), n_per_domain=4000, seed=1)
  for rho, x, y in zip((0.9, 0.1), ds.xs, ds.ys):
    agree = np.mean((x[:, 2] > 0) == (y == 1))
    assert agree == pytest.approx(rho, abs=0.03)
    inv = np.mean((x[:, 0] + x[:, 1] > 0) == (y == 1))  # invariant block: same in every domain
    assert inv == pytest.approx(0.92, abs=0.03)


def test_linear_scm_ols_matches_closed_form():
  # FedLOE's paper, App. A eq. (22): per-domain OLS converges to
  # a_I^(k) = s3/(s2 |a_S|^2 + s3) a_I and a_S^(k) = s2/(s2 |a_S|^2 + s3) a_S.
  a_i, a_s = np.array([1.0, -0.5]), np.array([0.8, 0.6])
  s2s, s3 = (0.5, 2.0), 1.0
  ds = datasets.linear_scm(a_i, a_s, s2s, sigma3_sq=s3, n_per_domain=200000, seed=0)
  for s2, x, y in zip(s2s, ds.xs, ds.ys):
    w = np.linalg.lstsq(x, y, rcond=None)[0]
    denom = s2 * a_s @ a_s + s3
    np.testing.assert_allclose(w[:2], s3 / denom * a_i, atol=0.02)
    np.testing.assert_allclose(w[2:], s2 / denom * a_s, atol=0.02)


def test_fold_splits_are_disjoint_and_domain_correct():
  ds = datasets.rotated_digits(image_size=8)
  fold = splits.make_fold(ds, test_domains=[5], val_domains=[0], seed=0)
  assert fold.train_domains == (1, 2, 3, 4)
  assert set(fold.test.domain) == {5} and set(fold.heldout_val.domain) == {0}
  assert set(fold.train.domain) == set(fold.in_val.domain) == set(fold.in_test.domain) == {1, 2, 3, 4}
  n_train_domains = sum(len(ds.ys[d]) for d in (1, 2, 3, 4))
  assert len(fold.train) + len(fold.in_val) + len(fold.in_test) == n_train_domains
  assert len(fold.in_val) == pytest.approx(0.1 * n_train_domains, abs=4)
  # No example appears in two splits: compare raw bytes of images within the training domains.
  key = lambda s: {(int(d), xi.tobytes()) for d, xi in zip(s.domain, s.x)}
  assert not key(fold.train) & key(fold.in_val) and not key(fold.train) & key(fold.in_test)
  folds = splits.leave_one_domain_out(ds)
  assert [f.test_domains for f in folds] == [(d,) for d in range(6)]
  assert [f.val_domains for f in folds] == [((d + 1) % 6,) for d in range(6)]
  with pytest.raises(ValueError, match="val_domains"):
    splits.make_fold(ds, [1], [1])
  with pytest.raises(ValueError, match="test_domains"):
    splits.make_fold(ds, [9], [0])


def test_pack_clients_pads_and_counts():
  ds = datasets.rotated_digits(image_size=8)
  fold = splits.make_fold(ds, [5], [0])
  parts = heterogeneous_partition(fold.train.domain, 7, 0.0, seed=0)
  cs = store.pack_clients(fold.train, parts)
  assert cs.x.shape[:2] == (7, max(len(p) for p in parts))
  for c, p in enumerate(parts):
    n = len(p)
    assert cs.counts[c] == n
    np.testing.assert_array_equal(cs.x[c, :n], fold.train.x[p])
    np.testing.assert_array_equal(cs.y[c, :n], fold.train.y[p])
    assert len(set(cs.domain[c, :n])) == 1      # lambda = 0, C >= D: single-domain clients
    assert not cs.x[c, n:].any()


def test_spurious_correlations_must_be_probabilities():
  import ml_collections
  cfg = lambda corr: ml_collections.ConfigDict({"name": "spurious", "correlations": corr, "n_per_domain": 10,
                                                "seed": 0})
  with pytest.raises(ValueError) as e:
    datasets.load_dataset(cfg((0.9, 1.5, -0.2)))
  assert str(e.value) == "data.correlations must lie in [0, 1] (one per domain), got 1.5 in (0.9, 1.5, -0.2)"
  with pytest.raises(ValueError) as e:
    datasets.load_dataset(cfg(()))
  assert str(e.value) == "data.correlations: give one correlation in [0, 1] per domain, got none"
  assert datasets.load_dataset(cfg((0.0, 1.0))).names == ("rho=0", "rho=1")


def test_domain_dataset_refuses_labels_outside_its_classes():
  x = np.zeros((3, 2), np.float32)
  with pytest.raises(ValueError) as e:
    datasets.DomainDataset("toy", ("a", "b"), (x, x), (np.array([0, 1, 2]), np.array([1, -1, 0])), 3)
  assert str(e.value) == "toy: domain 'b': label -1 at index 1 lies outside [0, 3) (1 of 3 labels do)"
  with pytest.raises(ValueError, match=r"toy: domain 'a': label 3 at index 2 lies outside \[0, 3\)"):
    datasets.DomainDataset("toy", ("a",), (x,), (np.array([0, 1, 3]),), 3)
  reg = datasets.DomainDataset("reg", ("a",), (x,), (np.array([-4.5, 0.1, 9.0]),), 0)  # regression: any target
  assert reg.num_classes == 0


def test_bundled_digits_equal_scikit_learns_loader():
  """The embedded dataset reads scikit-learn's digits file itself (no scikit-learn import at
  start-up): the same images and labels as `load_digits`."""
  from sklearn.datasets import load_digits
  from fedjax_dg.data import datasets
  images, labels = datasets.bundled_digits()
  d = load_digits()
  np.testing.assert_array_equal(images, d.images)
  np.testing.assert_array_equal(labels, d.target)
