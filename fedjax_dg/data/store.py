"""The packed client store: every client's examples in one padded array.

`x[c, i]` is client `c`'s `i`-th example for `i < counts[c]`; the rest is padding
(zeros, label 0) that is never read as data because every batch carries a mask. A cohort
is then a gather `x[cohort]`, not a Python loop.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np

from fedjax_dg.data.splits import Split


class ClientStore(NamedTuple):
  x: np.ndarray       # [C, N_max, ...]
  y: np.ndarray       # [C, N_max]
  domain: np.ndarray  # [C, N_max]
  counts: np.ndarray  # [C] int32

  @property
  def num_clients(self) -> int:
    return int(self.counts.shape[0])


def pack_clients(split: Split, client_indices: Sequence[np.ndarray]) -> ClientStore:
  counts = np.array([len(i) for i in client_indices], np.int32)
  if counts.min() <= 0:
    raise ValueError(f"every client needs at least one example; client {int(counts.argmin())} has none")
  n_max = int(counts.max())
  c = len(client_indices)
  x = np.zeros((c, n_max) + split.x.shape[1:], split.x.dtype)
  y = np.zeros((c, n_max), split.y.dtype)
  dom = np.zeros((c, n_max), np.int32)
  for k, idx in enumerate(client_indices):
    x[k, :len(idx)], y[k, :len(idx)], dom[k, :len(idx)] = split.x[idx], split.y[idx], split.domain[idx]
  return ClientStore(x, y, dom, counts)


def minibatch_reader(x, plan) -> Callable:
  """How a local loop reads its minibatches: `read(rows, step) -> x[rows]`, where `plan`
  `[steps, B]` holds every step's rows and `x` is one client's `[N_max, ...]` inputs.
  Device arrays are indexed; host-resident inputs (`host_store.HostRows`) start gathering
  the whole plan in the background here and serve each step from it (`x.reader(plan)`)."""
  if hasattr(x, "reader"):
    return x.reader(plan)
  return lambda rows, step: x[rows]
