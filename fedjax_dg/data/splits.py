"""Benchmark splits (seed 001 Sec. 4, App. C-D).

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
  # The dataset's metric `metrics(pred, split) -> dict` (WILDS's CivilComments worst-group
  # accuracy, Py150's class/method token accuracy); None: `eval.metrics.classification_metrics`.
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
              in_val_fraction: float = 0.1, in_test_fraction: float = 0.1, seed: int = 0) -> Fold:
  """Holds out `test_domains` and `val_domains`; splits each remaining domain at random."""
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
  return Fold(train=_concat(ds, tr), in_val=_concat(ds, va), in_test=_concat(ds, te),
              heldout_val=_concat(ds, whole(val_domains)), test=_concat(ds, whole(test_domains)),
              train_domains=train_domains, val_domains=val_domains, test_domains=test_domains,
              domain_names=ds.names, num_classes=ds.num_classes)


def leave_one_domain_out(ds: DomainDataset, val_offset: int = 1, **kwargs) -> list[Fold]:
  """One fold per domain as the test domain; the held-out validation domain is the
  domain `val_offset` places after it (cyclically)."""
  return [make_fold(ds, [t], [(t + val_offset) % ds.num_domains], **kwargs)
          for t in range(ds.num_domains)]
