"""Client inputs that stay in host memory: for datasets larger than device memory.

`pack_clients_host(split, parts)` is `pack_clients` without the padded `[C, N_max, ...]`
copy of the inputs on the device: `x` is a `HostRows`, a pytree whose only leaf is the
client ids it stands for, with the examples (one flat host array, which may be a
`np.memmap`) and a `[C, N_max]` row table as static data. Inside the compiled round,
`data.x[i]` for a client's row indices `i` (the local scan's minibatch, a full-pass chunk)
fetches exactly those rows from the host with `jax.pure_callback`, batched over the
cohort under `vmap`. Every strategy and every method that reads `data.x` by row indices
runs unchanged and gives the in-memory results (tested); the fetch is synchronous: each
step waits for its rows (no prefetching).
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dg.data.splits import Split
from fedjax_dg.data.store import ClientStore


class HostSource:
  """The static part: examples `x` `[N, ...]` and the row table `[C, N_max]` (padding -> row 0).
  Hashed by identity, so jit treats one source as one constant."""

  def __init__(self, x: np.ndarray, table: np.ndarray):
    self.x, self.table = x, table

  def fetch(self, clients, rows):
    clients, rows = np.asarray(clients), np.asarray(rows)
    clients = clients.reshape(clients.shape + (1,) * (rows.ndim - clients.ndim))
    return np.asarray(self.x[self.table[clients, rows]])


@jax.tree_util.register_pytree_node_class
class HostRows:
  """The inputs of the clients `client` (any shape of ids), each `[N_max, ...]`."""

  def __init__(self, source: HostSource, client):
    self.source, self.client = source, client

  def tree_flatten(self):
    return (self.client,), self.source

  @classmethod
  def tree_unflatten(cls, source, children):
    return cls(source, children[0])

  @property
  def shape(self):
    return tuple(np.shape(self.client)) + (self.source.table.shape[1],) + self.source.x.shape[1:]

  @property
  def dtype(self):
    return self.source.x.dtype

  @property
  def ndim(self):
    return len(self.shape)

  def __getitem__(self, idx):
    if np.ndim(self.client) > 0:  # selecting clients
      return HostRows(self.source, self.client[idx])
    idx = jnp.asarray(idx)
    out = jax.ShapeDtypeStruct(idx.shape + self.source.x.shape[1:], self.source.x.dtype)
    return jax.pure_callback(self.source.fetch, out, self.client, idx, vmap_method="broadcast_all")


def pack_clients_host(split: Split, client_indices: Sequence[np.ndarray]) -> ClientStore:
  counts = np.array([len(i) for i in client_indices], np.int32)
  if counts.min() <= 0:
    raise ValueError(f"every client needs at least one example; client {int(counts.argmin())} has none")
  n_max, c = int(counts.max()), len(client_indices)
  table = np.zeros((c, n_max), np.int64)
  y = np.zeros((c, n_max), split.y.dtype)
  dom = np.zeros((c, n_max), np.int32)
  for k, idx in enumerate(client_indices):
    table[k, :len(idx)], y[k, :len(idx)], dom[k, :len(idx)] = idx, split.y[idx], split.domain[idx]
  return ClientStore(HostRows(HostSource(split.x, table), np.arange(c)), y, dom, counts)
