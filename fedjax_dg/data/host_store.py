"""Client inputs that stay in host memory: for datasets larger than device memory.

`pack_clients_host(split, parts)` is `pack_clients` without the padded `[C, N_max, ...]`
copy of the inputs on the device: `x` is a `HostRows`, a pytree whose only leaf is the
client ids it stands for, with the examples (one flat host array, a `np.memmap`, or a
`FileRows` file read by row) and a `[C, N_max]` row table as static data. Inside the compiled round,
`data.x[i]` for a client's row indices `i` (a full-pass chunk, a minibatch) fetches exactly
those rows from the host with `jax.pure_callback`, batched over the cohort under `vmap`.
The local loop knows its whole `[steps, B]` index plan before its scan starts: it asks
`store.minibatch_reader(x, plan)` for its reader, which for a `HostRows` hands the plan to
`prefetch` (a background thread gathers the minibatches in the order the scan will ask for
them); each step's `rows(...)` takes its prefetched batch (or, if none matches, gathers it
then). Every strategy and every method that reads `data.x` by row indices runs
unchanged and gives the in-memory results (tested).
"""
from __future__ import annotations

import concurrent.futures
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dg.data.splits import Split
from fedjax_dg.data.store import ClientStore, padded_labels


class FileRows:
  """A `[N, ...]` array in a raw file (row-major, no header), read row by row with `pread`:
  only the rows read occupy memory. A `np.memmap` would do as the examples of a host store
  too, but the kernel maps whole page-cache folios around each row it touches (hundreds of
  kB here), so a process's resident memory grows with the rows it has ever read; here it
  does not. `x[idx]` for an integer array `idx` of any shape gives `[*idx.shape, ...]`."""

  def __init__(self, path: str, dtype, row_shape: Sequence[int], num_rows: int | None = None, offset: int = 0):
    self.path, self.dtype, self.offset = path, np.dtype(dtype), int(offset)
    self.row_shape = tuple(int(d) for d in row_shape)
    self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize
    total = (os.path.getsize(path) - self.offset) // self.row_bytes
    if num_rows is not None and num_rows > total:
      raise ValueError(f"{path} holds {total} rows of {self.row_bytes} bytes, not {num_rows}")
    self.shape = (int(total if num_rows is None else num_rows),) + self.row_shape
    self._fd = os.open(path, os.O_RDONLY)

  ndim = property(lambda self: len(self.shape))

  def __len__(self):
    return self.shape[0]

  def __getitem__(self, idx):
    idx = np.asarray(idx)
    if not np.issubdtype(idx.dtype, np.integer):
      raise IndexError("FileRows takes integer row indices")
    flat = idx.ravel()
    if flat.size and (flat.min() < 0 or flat.max() >= self.shape[0]):
      raise IndexError(f"row index out of range [0, {self.shape[0]})")
    buf = bytearray(flat.size * self.row_bytes)
    view = memoryview(buf)
    for k, r in enumerate(flat.tolist()):
      os.preadv(self._fd, [view[k * self.row_bytes:(k + 1) * self.row_bytes]], self.offset + r * self.row_bytes)
    return np.frombuffer(buf, self.dtype).reshape(idx.shape + self.row_shape)

  def __del__(self):
    try:
      os.close(self._fd)
    except (OSError, AttributeError, TypeError):  # TypeError: at interpreter exit
      pass


class HostSource:
  """The static part: examples `x` `[N, ...]` and the row table `[C, N_max]` (padding -> row 0).
  Hashed by identity, so jit treats one source as one constant."""

  def __init__(self, x: np.ndarray, table: np.ndarray):
    self.x, self.table = x, table
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    self._pending = {}  # (client, step) -> future of (rows, examples)
    self.prefetched = self.direct = 0  # minibatches served from the prefetch / gathered on demand

  def fetch(self, clients, rows):
    clients, rows = np.asarray(clients), np.asarray(rows)
    clients = clients.reshape(clients.shape + (1,) * (rows.ndim - clients.ndim))
    return np.asarray(self.x[self.table[clients, rows]])

  def _gather(self, client: int, rows: np.ndarray):
    return rows, np.asarray(self.x[self.table[client, rows]])

  def announce(self, clients, plan):
    """Queues the gathers of `plan` (`[..., steps, B]` rows per client) in step order."""
    clients, plan = np.asarray(clients), np.asarray(plan)
    plan = np.broadcast_to(plan, clients.shape + plan.shape[-2:]) if plan.ndim == 2 else plan
    for pos in np.ndindex(clients.shape):
      c = int(clients[pos])
      for s, rows in enumerate(plan[pos]):
        self._pending[(c, s)] = self._pool.submit(self._gather, c, np.array(rows))
    return np.zeros(clients.shape, np.int32)

  def step_rows(self, clients, steps, rows, token):
    """The examples of minibatch `rows` at local step `steps` of `clients` (any leading shape)."""
    del token  # only orders this call after `announce`
    clients, steps, rows = np.asarray(clients), np.asarray(steps), np.asarray(rows)
    lead = rows.shape[:-1]
    clients, steps = np.broadcast_to(clients, lead), np.broadcast_to(steps, lead)
    out = np.empty(rows.shape + self.x.shape[1:], self.x.dtype)
    for pos in np.ndindex(lead):
      fut = self._pending.pop((int(clients[pos]), int(steps[pos])), None)
      if fut is not None:
        want, examples = fut.result()
        if np.array_equal(want, rows[pos]):
          out[pos] = examples
          self.prefetched += 1
          continue
      out[pos] = self.x[self.table[int(clients[pos]), rows[pos]]]
      self.direct += 1
    return out


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

  def prefetch(self, plan):
    """Starts gathering this client's minibatches `plan` `[steps, B]`; returns the token
    that `rows` waits on."""
    return jax.pure_callback(self.source.announce, jax.ShapeDtypeStruct((), jnp.int32), self.client,
                             jnp.asarray(plan), vmap_method="broadcast_all")

  def _client_rows(self, idx: tuple):
    """`x[c, rows]` as on a packed `[C, N_max, ...]` array (NumPy indexing of the client and
    row axes, e.g. a client id and its row indices). Outside a trace: the NumPy array of
    those examples (padding rows, never read as data, hold the data's row 0 instead of
    zeros). Inside one: `x[c][rows]` for one client id `c`, fetched from the host."""
    if len(idx) != 2:
      raise IndexError(f"host-store inputs take two indices (client, rows), got {len(idx)}")
    if _traced(self.client, idx):
      if np.ndim(idx[0]) != 0:
        raise IndexError("inside a trace, host-store inputs are indexed as x[c, rows] with one client id c")
      return HostRows(self.source, jnp.asarray(self.client)[idx[0]])[idx[1]]
    plain = lambda i: i if i is None or isinstance(i, (int, np.integer, slice, type(Ellipsis))) else np.asarray(i)
    table = self.source.table[np.asarray(self.client)]  # [clients..., N_max]: rows of the flat data
    return np.asarray(self.source.x[table[tuple(plain(i) for i in idx)]])

  def rows(self, idx, step, token):
    """`self[idx]` for local step `step`, served from the prefetch."""
    out = jax.ShapeDtypeStruct(jnp.shape(idx) + self.source.x.shape[1:], self.source.x.dtype)
    return jax.pure_callback(self.source.step_rows, out, self.client, step, idx, token,
                             vmap_method="broadcast_all")

  def reader(self, plan):
    """`read(rows, step)` for `data.store.minibatch_reader`: prefetches `plan`, then serves."""
    token = self.prefetch(plan)
    return lambda rows, step: self.rows(rows, step, token)

  def __getitem__(self, idx):
    if isinstance(idx, tuple) and len(idx) == 1:
      idx = idx[0]
    if isinstance(idx, tuple) and np.ndim(self.client) > 0:  # x[c, rows]: clients and their rows
      return self._client_rows(idx)
    if np.ndim(self.client) > 0:  # selecting clients
      return HostRows(self.source, self.client[idx])
    idx = jnp.asarray(idx)
    out = jax.ShapeDtypeStruct(idx.shape + self.source.x.shape[1:], self.source.x.dtype)
    return jax.pure_callback(self.source.fetch, out, self.client, idx, vmap_method="broadcast_all")


def _traced(*values) -> bool:
  return any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(values))


def pack_clients_host(split: Split, client_indices: Sequence[np.ndarray]) -> ClientStore:
  counts = np.array([len(i) for i in client_indices], np.int32)
  if counts.min() <= 0:
    raise ValueError(f"every client needs at least one example; client {int(counts.argmin())} has none")
  n_max, c = int(counts.max()), len(client_indices)
  table = np.zeros((c, n_max), np.int64)
  y = padded_labels(split.y, c, n_max)
  dom = np.zeros((c, n_max), np.int32)
  for k, idx in enumerate(client_indices):
    table[k, :len(idx)], y[k, :len(idx)], dom[k, :len(idx)] = idx, split.y[idx], split.domain[idx]
  return ClientStore(HostRows(HostSource(split.x, table), np.arange(c)), y, dom, counts)
