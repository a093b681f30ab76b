"""Benchmark splits (Bai et al. 2024 Sec. 4, App. C-D).

Per fold: training domains -> train / in-domain validation / in-domain test; one or more
held-out validation domains; the test domain(s). Domain ids are indices into the
dataset's domain list everywhere.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from fedjax_dg.data.datasets import DomainDataset


@dataclasses.dataclass(frozen=True)
class Split:
  """Examples of one split. `y` is `[N]` (one label per example) or `[N, T]` (Py150's
  per-token labels, `models.text.IGNORE` where unlabelled). `meta`, if set, is what the
  dataset's own metric reads besides predictions and labels (CivilComments: identity
  indicators `[N, 8]`; Py150: token types `[N, T]`)."""
  x: np.ndarray
  y: np.ndarray
  domain: np.ndarray
  meta: np.ndarray | None = None

  def __len__(self):
    return len(self.y)


@dataclasses.dataclass(frozen=True)
class Fold:
  """One fold of the benchmark: the splits a run trains, selects and tests on.

  Attributes:
    train: the training domains' training rows (partitioned over the clients).
    in_val: the training domains' in-domain validation rows.
    in_test: the training domains' in-domain test rows.
    heldout_val: the held-out validation domains' rows (model selection).
    test: the test domains' rows.
    train_domains: ids of the training domains.
    val_domains: ids of the held-out validation domains.
    test_domains: ids of the test domains.
    domain_names: every domain's name, indexed by id.
    num_classes: the number of classes.
    metrics: the dataset's metric `metrics(pred, split) -> dict` (WILDS's CivilComments
      worst-group accuracy, Py150's class/method token accuracy); None:
      `eval.metrics.classification_metrics`.
  """
  train: Split
  in_val: Split
  in_test: Split
  heldout_val: Split
  test: Split
  train_domains: tuple[int, ...]
  val_domains: tuple[int, ...]
  test_domains: tuple[int, ...]
  domain_names: tuple[str, ...]
  num_classes: int
  metrics: Callable | None = None

  def eval_splits(self) -> dict[str, Split]:
    return {"in_val": self.in_val, "in_test": self.in_test,
            "heldout_val": self.heldout_val, "test": self.test}


def _concat(ds: DomainDataset, parts):
  xs = [ds.xs[d][i] for d, i in parts]
  ys = [ds.ys[d][i] for d, i in parts]
  doms = [np.full(len(i), d, np.int32) for d, i in parts]
  if not xs:
    return Split(np.zeros((0,) + ds.input_shape, np.float32), np.zeros(0, np.int32), np.zeros(0, np.int32))
  return Split(np.concatenate(xs), np.concatenate(ys), np.concatenate(doms))


def make_fold(ds: DomainDataset, test_domains: Sequence[int], val_domains: Sequence[int],
              in_val_fraction: float = 0.1, in_test_fraction: float = 0.1, seed: int = 0,
              test_domain_train_fraction: float = 0.0, test_domain_train_include: bool = True) -> Fold:
  """Holds out `test_domains` and `val_domains`; splits each remaining domain at random.

  `test_domain_train_fraction > 0` carves that fraction off every test domain
  (`carve_test_domains`): Bai et al. 2024's R_DG (Sec. 4.1) trains with it and tests on the rest.
  """
  d_all = set(range(ds.num_domains))
  test_domains, val_domains = tuple(int(d) for d in test_domains), tuple(int(d) for d in val_domains)
  for field, doms in (("test_domains", test_domains), ("val_domains", val_domains)):
    bad = [d for d in doms if d not in d_all]
    if bad:
      raise ValueError(f"data.{field}: domain ids {bad} not in 0..{ds.num_domains - 1} ({ds.names})")
  if set(test_domains) & set(val_domains):
    raise ValueError(f"data.val_domains {val_domains} overlaps data.test_domains {test_domains}")
  train_domains = tuple(sorted(d_all - set(test_domains) - set(val_domains)))
  if not train_domains:
    raise ValueError("data: no training domain left after removing test and validation domains")
  if not (0 <= in_val_fraction and 0 <= in_test_fraction and in_val_fraction + in_test_fraction < 1):
    raise ValueError("data.in_val_fraction + data.in_test_fraction must lie in [0, 1)")
  rng = np.random.default_rng(seed)
  tr, va, te = [], [], []
  for d in train_domains:
    perm = rng.permutation(len(ds.ys[d]))
    n_va, n_te = int(round(in_val_fraction * len(perm))), int(round(in_test_fraction * len(perm)))
    va.append((d, np.sort(perm[:n_va])))
    te.append((d, np.sort(perm[n_va:n_va + n_te])))
    tr.append((d, np.sort(perm[n_va + n_te:])))
  whole = lambda doms: [(d, np.arange(len(ds.ys[d]))) for d in doms]
  fold = Fold(train=_concat(ds, tr), in_val=_concat(ds, va), in_test=_concat(ds, te),
              heldout_val=_concat(ds, whole(val_domains)), test=_concat(ds, whole(test_domains)),
              train_domains=train_domains, val_domains=val_domains, test_domains=test_domains,
              domain_names=ds.names, num_classes=ds.num_classes)
  return carve_test_domains(fold, test_domain_train_fraction, test_domain_train_include, seed)


def _take(s: Split, idx: np.ndarray) -> Split:
  return Split(s.x[idx], s.y[idx], s.domain[idx], None if s.meta is None else s.meta[idx])


def _join(a: Split, b: Split) -> Split:
  if a.x.shape[1:] != b.x.shape[1:] or a.y.shape[1:] != b.y.shape[1:]:
    raise ValueError(f"data.test_domain_train_fraction: test examples {b.x.shape[1:]} / labels {b.y.shape[1:]} "
                     f"cannot join training examples {a.x.shape[1:]} / labels {a.y.shape[1:]}")
  meta = None if a.meta is None or b.meta is None else np.concatenate([a.meta, b.meta])
  return Split(np.concatenate([a.x, b.x]), np.concatenate([a.y, b.y]), np.concatenate([a.domain, b.domain]), meta)


def carve_test_domains(fold: Fold, fraction: float, include: bool = True, seed: int = 0) -> Fold:
  """Bai et al. 2024's R_DG split (Sec. 4.1): `round(fraction * n_d)` random examples of every
  test domain `d` (S''_DG-test) leave the test split, which keeps the rest (S'_DG-test).

  With `include` they join the training set as examples of their own domain `d` (which
  becomes a training domain); without, they are set aside, so the run trains exactly as
  on the plain fold and is tested on the same S'. The carve draws from its own stream
  (seeded by `seed`), so the two runs test on identical examples and the training-domain
  splits do not change."""
  if not (isinstance(fraction, (int, float)) and 0.0 <= fraction < 1.0):
    raise ValueError(f"data.test_domain_train_fraction must lie in [0, 1), got {fraction}")
  if fraction == 0.0:
    return fold
  rng = np.random.default_rng([int(seed), 20240901])
  keep, moved = [], []
  for d in sorted(set(int(v) for v in np.unique(fold.test.domain))):
    rows = np.flatnonzero(fold.test.domain == d)
    perm = rng.permutation(rows)
    k = int(round(fraction * len(rows)))
    moved.append(perm[:k])
    keep.append(perm[k:])
  keep, moved = np.sort(np.concatenate(keep)), np.sort(np.concatenate(moved))
  test, train, train_domains = _take(fold.test, keep), fold.train, fold.train_domains
  if include:
    extra = _take(fold.test, moved)
    train = _join(train, extra)
    train_domains = tuple(sorted(set(train_domains) | set(int(d) for d in np.unique(extra.domain))))
  return dataclasses.replace(fold, train=train, test=test, train_domains=train_domains)


def fold_from_config(ds: DomainDataset, data_config) -> Fold:
  """`make_fold` with every split field of `config.data` (test / validation domains,
  in-domain fractions, seed, and R_DG's `test_domain_train_fraction` / `_include`)."""
  d = data_config
  return make_fold(ds, d.test_domains, d.val_domains, in_val_fraction=d.in_val_fraction,
                   in_test_fraction=d.in_test_fraction, seed=d.seed,
                   test_domain_train_fraction=d.get("test_domain_train_fraction", 0.0),
                   test_domain_train_include=d.get("test_domain_train_include", True))


# How a leave-one-domain-out fold validates (`data.lodo_validation`):
#   "heldout_domain"  Bai et al. 2024 (Sec. 4, App. C): the domain after the test domain is held
#                     out whole for validation; the rest train (with their in-domain splits).
#   "in_domain"       the FedLOE paper (App. D.3), Nguyen et al. 2025, Guo et al. 2023 (Sec. 5.1) and Liao et al. 2025 (Sec. 5.1): every
#                     non-test domain trains and model selection reads the in-domain
#                     validation split (`data.in_val_fraction`, 10% there; the FedLOE paper takes
#                     5% validation and 5% in-domain test). No held-out domain.
LODO_VALIDATION = ("heldout_domain", "in_domain")


def lodo_domains(num_domains: int, validation: str = "heldout_domain",
                 val_offset: int = 1) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
  """`(test_domains, val_domains)` of every leave-one-domain-out fold: domain `t` tests, and
  under "heldout_domain" the domain `val_offset` places after it (cyclically) validates."""
  if validation not in LODO_VALIDATION:
    raise ValueError(f"data.lodo_validation must be one of {LODO_VALIDATION}, got {validation!r}")
  if validation == "heldout_domain" and num_domains < 3:
    raise ValueError(f"data.lodo_validation='heldout_domain' needs at least 3 domains (test, validation, "
                     f"training); the dataset has {num_domains}: use 'in_domain'")
  return [((t,), ((t + val_offset) % num_domains,) if validation == "heldout_domain" else ())
          for t in range(num_domains)]


def leave_one_domain_out(ds: DomainDataset, val_offset: int = 1, validation: str = "heldout_domain",
                         **kwargs) -> list[Fold]:
  """One fold per domain as the test domain, validated as `validation` says
  (`LODO_VALIDATION`); `kwargs` go to `make_fold`."""
  return [make_fold(ds, test, val, **kwargs) for test, val in lodo_domains(ds.num_domains, validation, val_offset)]
