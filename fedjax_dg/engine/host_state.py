"""Persistent client state in host memory, stored only for the clients that have one.

`RoundState.clients` is normally every client's state stacked on the device, `[C, ...]`.
With `HostClientStates` (`init_round_state(..., host_states=True)`) it is a host-side
table instead: one `int32` slot per client (-1: never sampled, so still the initial
state) and the states of the clients that have been sampled, in NumPy arrays that grow by
doubling. Memory is `4 C` bytes plus one state per client ever sampled, never `C` states
(SCAFFOLD's controls for 100,000 clients of a 200k-parameter MLP would be 80 GB); a round
moves only the cohort's states to the device and back (`RoundFn` does the gather and the
scatter around the jitted cohort round).
"""
from __future__ import annotations

import jax
import numpy as np


def host_value(x):
  """A NumPy copy of `x`: a global array spread over several processes' devices
  (`jax.distributed`) is gathered (a collective: every process calls it in the same order)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


class HostClientStates:
  """Client states on the host: `gather(ids)` -> the `[S, ...]` states, `scatter(ids, states)`
  writes them back (ids `>= num_clients` are skipped: padding and dropped members)."""

  def __init__(self, one_state, num_clients: int):
    leaves, self.treedef = jax.tree.flatten(one_state)
    self.init = [np.asarray(a) for a in leaves]
    self.num_clients = int(num_clients)
    self.slot = np.full((self.num_clients,), -1, np.int32)
    self.rows = [np.empty((0,) + a.shape, a.dtype) for a in self.init]
    self.used = 0

  def __len__(self):
    return self.num_clients

  @property
  def nbytes(self) -> int:
    return int(self.slot.nbytes + sum(r.nbytes for r in self.rows))

  def gather(self, ids):
    ids = np.asarray(ids)
    real = ids < self.num_clients
    slots = np.where(real, self.slot[np.minimum(ids, self.num_clients - 1)], -1)
    out = []
    for init, rows in zip(self.init, self.rows):
      a = np.broadcast_to(init, ids.shape + init.shape).copy()
      have = slots >= 0
      a[have] = rows[slots[have]]
      out.append(a)
    return jax.tree.unflatten(self.treedef, out)

  def scatter(self, ids, states):
    ids = np.asarray(ids)
    leaves = [host_value(a) for a in jax.tree.leaves(states)]  # every process keeps the whole table
    keep = np.nonzero(ids < self.num_clients)[0]
    new = [i for i in keep if self.slot[ids[i]] < 0]
    if new:
      self._grow(self.used + len(new))
      self.slot[ids[new]] = np.arange(self.used, self.used + len(new), dtype=np.int32)
      self.used += len(new)
    slots = self.slot[ids[keep]]
    for rows, a in zip(self.rows, leaves):
      rows[slots] = a[keep]

  def _grow(self, need: int):
    cap = self.rows[0].shape[0] if self.rows else 0
    if need <= cap:
      return
    cap = max(need, 2 * cap, 16)
    self.rows = [np.concatenate([r, np.empty((cap - r.shape[0],) + r.shape[1:], r.dtype)]) for r in self.rows]

  def sparse(self) -> dict:
    """The states held, for a checkpoint: `{"ids": [U] client ids, "rows": one [U, ...] array
    per leaf}`, row `j` being client `ids[j]`'s state (slot order, so `from_sparse` gives
    the same slots back)."""
    ids = np.nonzero(self.slot >= 0)[0]
    ids = ids[np.argsort(self.slot[ids])].astype(np.int32)
    return {"ids": ids, "rows": tuple(r[:self.used].copy() for r in self.rows)}

  def sparse_shape(self, used: int) -> dict:
    """`sparse()`'s shapes when `used` clients hold a state (a checkpoint's restore target)."""
    return {"ids": jax.ShapeDtypeStruct((used,), np.int32),
            "rows": tuple(jax.ShapeDtypeStruct((used,) + a.shape, a.dtype) for a in self.init)}

  def from_sparse(self, saved: dict) -> "HostClientStates":
    """A new table like this one (same initial state and clients) holding `saved`'s states."""
    ids = np.asarray(host_value(saved["ids"]), np.int64)
    rows = [np.asarray(host_value(r)) for r in saved["rows"]]
    if len(ids) and (ids.min() < 0 or ids.max() >= self.num_clients or len(np.unique(ids)) != len(ids)):
      raise ValueError(f"its host-held client ids are not distinct ids in [0, {self.num_clients})")
    out = HostClientStates(jax.tree.unflatten(self.treedef, self.init), self.num_clients)
    out.slot[ids] = np.arange(len(ids), dtype=np.int32)
    out.rows = [r.astype(i.dtype, copy=True) for r, i in zip(rows, self.init)]
    out.used = len(ids)
    return out

  def stacked(self):
    """Every client's state `[C, ...]` (for tests and small C)."""
    return self.gather(np.arange(self.num_clients))
