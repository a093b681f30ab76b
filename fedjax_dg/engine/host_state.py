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
    leaves = [np.asarray(a) for a in jax.tree.leaves(states)]
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

  def stacked(self):
    """Every client's state `[C, ...]` (for tests and small C)."""
    return self.gather(np.arange(self.num_clients))
