"""Executors: how the members of one phase of a round run (as fedjax's for-each-client
backends), all with the same result up to float summation order.

  VmapExecutor        `jax.vmap` over the whole cohort.
  ChunkedExecutor     `vmap` inside chunks, `lax.scan` across chunks, the partial weighted
                      sum carried (memory O(chunk)); `chunk = 1` is "sequential".
  ShardedExecutor     one of those on each device's share of the cohort (`jax.shard_map`
                      over the mesh axis "clients"), a `psum` adding the partial sums.
  HostLoopExecutor    a Python loop dispatching one jitted client call per member, member
                      `i` on device `i mod n_devices`, partial sums carried on the devices.

`executor(strategy, chunk_size, devices)` picks one; local-step buckets (`buckets_for`) let
ragged clients run only their own steps.
"""
from __future__ import annotations

import concurrent.futures
import functools
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from fedjax_dg import compilation_cache
from fedjax_dg.algorithms.base import ClientData, LocalSchedule
from fedjax_dg.defaults import STRATEGIES


class _Partial(NamedTuple):
  """A weighted partial sum over some clients."""
  message: Any
  metrics: Any
  weight: jax.Array


def _weighted_sum(outs, w) -> _Partial:
  s = lambda t: jax.tree.map(lambda a: jnp.tensordot(w.astype(a.dtype), a, axes=1), t)
  return _Partial(s(outs.message), s(outs.metrics), jnp.sum(w))


def _add(a: _Partial, b: _Partial) -> _Partial:
  return jax.tree.map(jnp.add, a, b)


def take_clients(tree, idx):
  """Rows `idx` of every leaf of `tree` (the clients of a cohort; an index past the end is clipped)."""
  return jax.tree.map(lambda a: jnp.take(a, idx, axis=0, mode="clip"), tree)


class Buckets(NamedTuple):
  """Local-step buckets for ragged clients (epoch mode): a client with `count` examples
  needs `ceil(count / batch)` steps per epoch; it runs in the first bucket `caps[b]` that
  covers them (caps: powers of two below the schedule's steps per epoch, then that)."""
  caps: tuple
  batch: int

  def index(self, counts):
    need = (jnp.max(counts) + self.batch - 1) // self.batch
    return jnp.searchsorted(jnp.asarray(self.caps), need)


def buckets_for(sched: LocalSchedule | None) -> Buckets | None:
  """The buckets for `sched`, or None where every client runs the same steps (fixed
  `local_steps`, or a single step per epoch)."""
  if sched is None or sched.epochs <= 0:
    return None
  per_epoch = sched.num_steps // sched.epochs
  caps = tuple(sorted({2 ** k for k in range(per_epoch.bit_length()) if 2 ** k < per_epoch} | {per_epoch}))
  return Buckets(caps, sched.batch_size) if len(caps) > 1 else None


def _capped(fn, cap):
  """`fn` with its client's local loop compiled at `cap` steps per epoch (`ClientData.step_cap`)."""
  def run(bcast, client_state, data, rng):
    return fn(bcast, client_state, data._replace(step_cap=int(cap)), rng)
  return run


class CohortResult(NamedTuple):
  """What an executor returns for a cohort: the weighted partial sums, the new client states
  and, when the rule stacks, the stacked messages."""
  partial: _Partial
  states: Any         # new client states [S, ...]
  messages: Any       # stacked messages [S, ...] when stacking, else None


# ------------------------------------------------------------------ executors
# An executor runs one phase's client function over the (padded) cohort:
#   pad(n)                      the cohort length it needs for `n` members (padding has weight 0)
#   place(store)                the store as `data` reads it (the host loop: one replica per device)
#   data(store, ids)            the members' data, as its `run` reads it
#   client_pass(client_fn, stack) -> run(bcast, states, data, rngs, w) -> CohortResult
#   server_side(fn)             how the skeleton calls a server-side piece
#   compile(skeleton)           the round function


class _JittedExecutor:
  """The executors that run the whole round as one `jax.jit`: the members' data is gathered
  inside it and server-side pieces are plain calls."""

  def pad(self, n: int) -> int:
    return n

  def place(self, store):
    return store

  buckets: Buckets | None = None  # set by make_round: run each (chunk of) members at its bucket's steps

  def data(self, store, ids, work=None, up=None):
    del up  # dropped members run and are discarded (weight 0, state not kept)
    return ClientData(*take_clients((store.x, store.y, store.domain, store.counts), ids),
                      client_id=jnp.minimum(ids, store.counts.shape[0] - 1), work=work)

  def client_pass(self, client_fn, stack: bool, bucketed: bool = False):
    return functools.partial(self.run, client_fn, stack, self.buckets if bucketed else None)

  def server_side(self, fn):
    return fn

  compile = staticmethod(jax.jit)


class VmapExecutor(_JittedExecutor):
  """`jax.vmap` over the whole cohort (with buckets: at the steps of its largest member)."""

  @staticmethod
  def run(client_fn, stack: bool, buckets, bcast, states, data, rngs, w) -> CohortResult:
    go = lambda fn: lambda *a: jax.vmap(fn, in_axes=(None, 0, 0, 0))(*a)
    if buckets is None:
      outs = go(client_fn)(bcast, states, data, rngs)
    else:
      outs = jax.lax.switch(buckets.index(data.count), [go(_capped(client_fn, c)) for c in buckets.caps],
                            bcast, states, data, rngs)
    return CohortResult(_weighted_sum(outs, w), outs.state, outs.message if stack else None)


class ChunkedExecutor(_JittedExecutor):
  """`vmap` inside chunks of `chunk` members, `lax.scan` across chunks (`chunk=1`: sequential)."""

  def __init__(self, chunk: int = 1):
    self.chunk = max(1, chunk)

  def pad(self, n: int) -> int:
    c = min(self.chunk, n)
    return -(-n // c) * c

  def run(self, client_fn, stack: bool, buckets, bcast, states, data, rngs, w) -> CohortResult:
    n = w.shape[0]
    chunk = min(self.chunk, n)
    split = lambda t: jax.tree.map(lambda a: a.reshape((n // chunk, chunk) + a.shape[1:]), t)
    merge = lambda t: jax.tree.map(lambda a: a.reshape((n,) + a.shape[2:]), t)
    one = functools.partial(VmapExecutor.run, client_fn, stack, buckets, bcast)
    xs = (split(states), split(data), split(rngs), split(w))
    shape = jax.eval_shape(one, *jax.tree.map(lambda a: a[0], xs))
    zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape.partial)

    def body(acc, x):
      res = one(*x)
      return _add(acc, res.partial), (res.states, res.messages)

    partial, (new_states, msgs) = jax.lax.scan(body, zero, xs)
    return CohortResult(partial, merge(new_states), merge(msgs) if stack else None)


class ShardedExecutor(_JittedExecutor):
  """`inner` on each device's share of the cohort (`jax.shard_map` over the mesh axis
  "clients"); a `psum` adds the devices' partial sums."""

  def __init__(self, inner: _JittedExecutor, mesh):
    self.inner, self.mesh = inner, mesh

  def pad(self, n: int) -> int:
    return self.inner.pad(-(-n // self.mesh.size)) * self.mesh.size

  def run(self, client_fn, stack: bool, buckets, bcast, states, data, rngs, w) -> CohortResult:
    spec = P("clients")

    def local(bcast, *members):
      res = self.inner.run(client_fn, stack, buckets, bcast, *members)
      return res._replace(partial=jax.lax.psum(res.partial, "clients"))
    shard = lambda a: jax.lax.with_sharding_constraint(a, NamedSharding(self.mesh, spec))
    members = jax.tree.map(shard, (states, data, rngs, w))
    return jax.shard_map(local, mesh=self.mesh, in_specs=(P(), spec, spec, spec, spec),
                         out_specs=CohortResult(P(), spec, spec if stack else None),
                         check_vma=False)(bcast, *members)


class PlacedStore(NamedTuple):
  """A client store with one replica on each of the host loop's devices."""
  replicas: tuple

  @property
  def counts(self):
    return self.replicas[0].counts


class _HostData(NamedTuple):
  stores: tuple     # the store on each device
  ids: jax.Array    # [S] member ids (padding: num_clients)
  work: Any = None  # [S] stragglers' shares of their steps (ClientData.work), or None
  up: Any = None    # [S] 1 for members that report (with failing clients), or None


class HostLoopExecutor:
  """A Python loop over the members: member `i` runs as one jitted call on device
  `i % len(devices)`, each device keeping its own partial sum, added in member order.

  With `threads == 1` the calls are dispatched asynchronously from the calling thread, so
  devices work in parallel and the host never waits inside a round. With `threads > 1`
  that many host threads make the calls, each waiting for its own call to finish before
  taking the next member, so that `threads` members train at once even on one device;
  the partial sums are added afterwards in the same member order, so the result is the
  same bit for bit.
  """

  buckets: Buckets | None = None

  def __init__(self, devices, threads: int = 1):
    """Args:
      devices: the devices the members are placed on, in turn.
      threads: host threads calling the members' jitted programs (1: no threads).

    Raises:
      ValueError: `threads` is below 1.
    """
    if int(threads) < 1:
      raise ValueError(f"host_loop threads: must be at least 1, got {threads}")
    self.devices = tuple(devices)
    self.threads = int(threads)
    self._add = jax.jit(_add)
    self._stack = jax.jit(lambda xs: jax.tree.map(lambda *a: jnp.stack(a), *xs))
    self._pick = jax.jit(lambda t, i: jax.tree.map(lambda a: a[i], t))

  def pad(self, n: int) -> int:
    return n

  def place(self, store):
    if isinstance(store, PlacedStore):
      return store
    return PlacedStore(tuple(jax.device_put(store, d) for d in self.devices))

  def data(self, store, ids, work=None, up=None):
    return _HostData(store.replicas, ids, work, up)

  def server_side(self, fn):
    return jax.jit(fn)

  def compile(self, skeleton):
    return skeleton

  def client_pass(self, client_fn, stack: bool, bucketed: bool = False):
    buckets = self.buckets if bucketed else None

    @functools.partial(jax.jit, static_argnames="cap")
    def one_client(bcast, states, store, ids, work, rngs, w, i, cap=None):
      num_clients = store.counts.shape[0]
      idx = jnp.minimum(ids[i], num_clients - 1)
      data = ClientData(store.x, store.y, store.domain, store.counts, jnp.arange(num_clients))
      pick = lambda t, j: jax.tree.map(lambda a: a[j], t)
      fn = client_fn if cap is None else _capped(client_fn, cap)
      out = fn(bcast, pick(states, i), pick(data, idx)._replace(work=pick(work, i)), rngs[i])
      part = _weighted_sum(jax.tree.map(lambda a: a[None], out), w[i][None])
      return part, out.state, (out.message if stack else None)

    def run(bcast, states, data: _HostData, rngs, w) -> CohortResult:
      n_dev = len(self.devices)
      args = [(bcast, states, data.ids, data.work, rngs, w)]
      if n_dev > 1:
        args = [jax.device_put(args[0], d) for d in self.devices]
      # members that drop out are not run (one transfer of S flags): their state stays, they send zeros
      skip = np.zeros(w.shape[0], bool) if data.up is None else np.asarray(data.up) == 0
      if skip.any():
        shape = jax.eval_shape(functools.partial(one_client, cap=None), *args[0][:2], data.stores[0],
                               *args[0][2:], jnp.int32(0))
        zeros = lambda t: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), t)
      caps = [None] * w.shape[0]
      if buckets is not None:  # each member at its own bucket's steps (one transfer of S counts)
        counts = jnp.take(data.stores[0].counts, data.ids, mode="clip")
        caps = [buckets.caps[int(b)] for b in np.asarray(jax.vmap(buckets.index)(counts[:, None]))]

      def call(i):
        d = i % n_dev
        b, st, ids, wk, r, ww = args[d]
        return one_client(b, st, data.stores[d], ids, wk, r, ww, jnp.int32(i), cap=caps[i])
      members = [i for i in range(w.shape[0]) if not skip[i]]
      pool = concurrent.futures.ThreadPoolExecutor(self.threads) if self.threads > 1 and len(members) > 1 else None
      # the members' outputs in member order; with threads, each as soon as it and those before it are done
      done = pool.map(lambda i: jax.block_until_ready(call(i)), members) if pool else map(call, members)
      acc, new_states, msgs = [None] * n_dev, [], []
      try:
        for i in range(w.shape[0]):
          d = i % n_dev
          if skip[i]:
            new_states.append(self._pick(args[d][1], jnp.int32(i)))
            msgs.append(zeros(shape[2]) if stack else None)
            continue
          part, state, msg = next(done)
          acc[d] = part if acc[d] is None else self._add(acc[d], part)
          new_states.append(state)
          msgs.append(msg)
      finally:
        if pool:
          pool.shutdown(cancel_futures=True)
      acc = [a for a in acc if a is not None] or [zeros(shape[0])]
      if n_dev > 1:
        acc, new_states, msgs = jax.device_put((acc, new_states, msgs), self.devices[0])
      total = functools.reduce(self._add, acc)
      return CohortResult(total, self._stack(new_states), self._stack(msgs) if stack else None)
    return run


def host_loop_threads(devices) -> int:
  """The host threads the host loop calls its members from: 2 on CPU devices (two
  members train at once, as a peer's two single-threaded workers do), else 1 (the
  asynchronous dispatch already keeps an accelerator busy). On a shared 2-core machine
  workload B of docs/peers.md took 0.77-0.93x the one-thread loop's time per round in 4
  of 5 processes, 1.46x in the fifth at load 10, the same bits in every round
  (`benchmarks/host_loop_overlap.py`).

  Args:
    devices: the host loop's devices.

  Returns:
    The number of threads, 1 or 2.
  """
  return 2 if all(d.platform == "cpu" for d in devices) and (os.cpu_count() or 1) >= 2 else 1


def executor(strategy: str, chunk_size: int = 1, devices=None):
  """The executor that `strategy` names, on `devices` (default: every device, of every
  process under `jax.distributed`; the host loop: this process's)."""
  if strategy not in STRATEGIES:
    raise ValueError(f"engine.strategy: unknown {strategy!r}; choose one of {STRATEGIES} or 'auto'")
  compilation_cache.enable()  # idempotent: the library's rounds compile once per machine
  if devices is None:  # the jitted strategies span every process's devices (jax.distributed)
    devices = jax.local_devices() if strategy == "host_loop" else jax.devices()
  devices = list(devices)
  if strategy == "host_loop":
    if any(d.process_index != jax.process_index() for d in devices):
      raise ValueError("engine.strategy: host_loop dispatches to this process's devices only; across "
                       "jax.distributed processes use vmap, chunked or sequential")
    return HostLoopExecutor(devices, host_loop_threads(devices))
  inner = VmapExecutor() if strategy == "vmap" else ChunkedExecutor(1 if strategy == "sequential" else chunk_size)
  if len(devices) == 1:
    return inner
  mesh = jax.make_mesh((len(devices),), ("clients",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
  return ShardedExecutor(inner, mesh)
