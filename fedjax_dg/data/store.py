"""The packed client store: every client's examples in one padded array.

`x[c, i]` is client `c`'s `i`-th example for `i < counts[c]`; the rest is padding
(zeros, label 0) that is never read as data because every batch carries a mask. A cohort
is then a gather `x[cohort]`, not a Python loop.

The store's arrays start on a 64-byte boundary (`aligned_empty`): XLA:CPU then takes a
host array as a device array without copying it (`jax.device_put`), so on a CPU the store
is held once, not twice (`to_device`).
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np

from fedjax_dg.data.splits import Split


ALIGNMENT = 64  # bytes: what XLA:CPU needs to use a host buffer in place


def aligned_empty(shape, dtype) -> np.ndarray:
  """An uninitialised array whose data starts on a `ALIGNMENT`-byte boundary.

  Args:
    shape: the array's shape.
    dtype: its dtype.

  Returns:
    A C-contiguous writable array (a view into a slightly larger byte buffer).
  """
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.empty(nbytes + ALIGNMENT, np.uint8)
  start = (-raw.ctypes.data) % ALIGNMENT
  return raw[start:start + nbytes].view(dtype).reshape(shape)


def aligned_full(shape, fill, dtype) -> np.ndarray:
  """`np.full` on a `ALIGNMENT`-byte boundary (`aligned_empty`)."""
  a = aligned_empty(shape, dtype)
  a.fill(fill)
  return a


def to_device(store):
  """The store as device arrays, each array placed once: on a CPU an aligned host array
  (as `pack_clients` makes) becomes the device array without a copy, where
  `jnp.asarray` copies it (docs/peers.md: where the memory goes). Do not write into the
  host arrays afterwards.

  Args:
    store: a `ClientStore` (or any pytree) of host arrays.

  Returns:
    The same pytree of `jax.Array`s on the default device.
  """
  import jax
  return jax.device_put(store)


def padded_labels(y: np.ndarray, num_clients: int, n_max: int) -> np.ndarray:
  """The `[C, N_max, ...]` label array: zeros for one label per example; for per-token
  labels `[N, T]` (Py150) `IGNORE` (-100), so padding rows carry no labelled token even
  without the row mask."""
  fill = -100 if y.ndim > 1 else 0
  return aligned_full((num_clients, n_max) + y.shape[1:], fill, y.dtype)


class ClientStore(NamedTuple):
  x: np.ndarray       # [C, N_max, ...]
  y: np.ndarray       # [C, N_max] (or [C, N_max, T]: per-token labels)
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
  x = aligned_full((c, n_max) + split.x.shape[1:], 0, split.x.dtype)
  y = padded_labels(split.y, c, n_max)
  dom = aligned_full((c, n_max), 0, np.int32)
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
