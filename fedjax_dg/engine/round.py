"""One federated round: one skeleton, run by an executor.

    cohort   = sample(rng)                         # all, a fraction, or a count; sorted ids
    data     = store[cohort]; state_i = clients[cohort]
    [pre-round]  server = server_prepare(server, reduce(client_stat(broadcast, state_i, data_i, rng_i)))
    outputs  = client_update(broadcast, state_i, data_i, rng_i) for every member
    server   = server_update(server, reduce(outputs))
    [post-round] server = server_finish(server, reduce(client_report(broadcast', state_i', data_i, rng_i')))
    clients  = clients.at[cohort].set(new states)  # clients not sampled keep theirs

`_round` is that skeleton, written once. How the members of each phase run is an executor
(as fedjax's for-each-client backends), all with the same result up to float summation
order; `make_round`'s `strategy` picks one:

  "vmap"       `VmapExecutor`: `jax.vmap` over the whole cohort (the GPU/TPU default).
  "chunked"    `ChunkedExecutor(chunk_size)`: `vmap` inside chunks, `lax.scan` across
               chunks, the partial weighted sum carried (memory O(chunk), not O(cohort)).
  "sequential" `ChunkedExecutor(1)`.
  "host_loop"  `HostLoopExecutor(devices)`: a Python loop that dispatches one jitted client
               call per member with the partial sum carried on the device (asynchronous
               dispatch, no host sync); the server-side pieces are jitted once each. On
               XLA:CPU this is the fast way to run convolutions: a convolution's weight
               gradient inside any XLA while loop (`lax.scan` over clients or rolled local
               steps) runs tens of times slower there (JAX issue 12868).
The first three jit the whole round once. With more than one local device they are
wrapped in `ShardedExecutor`, which shards the cohort axis over a `Mesh` axis named
"clients" through `jax.shard_map`; each device reduces its share and a `psum` finishes
the aggregate. The host loop sends member `i` to device `i mod n_devices` and adds the
devices' partial sums at the end; `round_fn.place(store)` puts one replica of the store on
each device once (a store that was not placed is placed on every call).

Each member's randomness is `fold_in(round_key, client_id)` (its report's is
`fold_in(that, 1)`), so a client draws the same batches whichever strategy, cohort padding
or device count runs it.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from fedjax_dg.algorithms.base import Algorithm, ClientData, ClientOutput, Stacked

STRATEGIES = ("vmap", "chunked", "sequential", "host_loop")


class RoundState(NamedTuple):
  server: Any
  clients: Any  # every client's persistent state, stacked [C, ...]


def init_round_state(algorithm: Algorithm, rng, params, num_clients: int) -> RoundState:
  one = algorithm.client_init(params)
  clients = jax.tree.map(lambda a: jnp.broadcast_to(a, (num_clients,) + a.shape).copy(), one)
  return RoundState(algorithm.server_init(rng, params), clients)


def default_strategy(model_name: str, backend: str | None = None) -> str:
  """Measured defaults (benchmarks/round_speed.py): on CPU convolutions want the host
  loop and small dense models a chunked scan; on accelerators, full vmap."""
  backend = backend or jax.default_backend()
  if backend == "cpu":
    return "host_loop" if model_name == "cnn" else "sequential"
  return "vmap"


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


def _take(tree, idx):
  return jax.tree.map(lambda a: jnp.take(a, idx, axis=0, mode="clip"), tree)


class _CohortResult(NamedTuple):
  partial: _Partial
  states: Any         # new client states [S, ...]
  messages: Any       # stacked messages [S, ...] when stacking, else None


# ------------------------------------------------------------------ executors
# An executor runs one phase's client function over the (padded) cohort:
#   pad(n)                      the cohort length it needs for `n` members (padding has weight 0)
#   place(store)                the store as `data` reads it (the host loop: one replica per device)
#   data(store, ids)            the members' data, as its `run` reads it
#   client_pass(client_fn, stack) -> run(bcast, states, data, rngs, w) -> _CohortResult
#   server_side(fn)             how the skeleton calls a server-side piece
#   compile(skeleton)           the round function


class _JittedExecutor:
  """The executors that run the whole round as one `jax.jit`: the members' data is gathered
  inside it and server-side pieces are plain calls."""

  def pad(self, n: int) -> int:
    return n

  def place(self, store):
    return store

  def data(self, store, ids):
    return ClientData(*_take((store.x, store.y, store.domain, store.counts), ids),
                      client_id=jnp.minimum(ids, store.counts.shape[0] - 1))

  def client_pass(self, client_fn, stack: bool):
    return functools.partial(self.run, client_fn, stack)

  def server_side(self, fn):
    return fn

  compile = staticmethod(jax.jit)


class VmapExecutor(_JittedExecutor):
  """`jax.vmap` over the whole cohort."""

  def run(self, client_fn, stack: bool, bcast, states, data, rngs, w) -> _CohortResult:
    outs = jax.vmap(client_fn, in_axes=(None, 0, 0, 0))(bcast, states, data, rngs)
    return _CohortResult(_weighted_sum(outs, w), outs.state, outs.message if stack else None)


class ChunkedExecutor(_JittedExecutor):
  """`vmap` inside chunks of `chunk` members, `lax.scan` across chunks (`chunk=1`: sequential)."""

  def __init__(self, chunk: int = 1):
    self.chunk = max(1, chunk)

  def pad(self, n: int) -> int:
    c = min(self.chunk, n)
    return -(-n // c) * c

  def run(self, client_fn, stack: bool, bcast, states, data, rngs, w) -> _CohortResult:
    n = w.shape[0]
    chunk = min(self.chunk, n)
    split = lambda t: jax.tree.map(lambda a: a.reshape((n // chunk, chunk) + a.shape[1:]), t)
    merge = lambda t: jax.tree.map(lambda a: a.reshape((n,) + a.shape[2:]), t)
    one = functools.partial(VmapExecutor().run, client_fn, stack, bcast)
    xs = (split(states), split(data), split(rngs), split(w))
    shape = jax.eval_shape(one, *jax.tree.map(lambda a: a[0], xs))
    zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape.partial)

    def body(acc, x):
      res = one(*x)
      return _add(acc, res.partial), (res.states, res.messages)

    partial, (new_states, msgs) = jax.lax.scan(body, zero, xs)
    return _CohortResult(partial, merge(new_states), merge(msgs) if stack else None)


class ShardedExecutor(_JittedExecutor):
  """`inner` on each device's share of the cohort (`jax.shard_map` over the mesh axis
  "clients"); a `psum` adds the devices' partial sums."""

  def __init__(self, inner: _JittedExecutor, mesh):
    self.inner, self.mesh = inner, mesh

  def pad(self, n: int) -> int:
    return self.inner.pad(-(-n // self.mesh.size)) * self.mesh.size

  def run(self, client_fn, stack: bool, bcast, states, data, rngs, w) -> _CohortResult:
    spec = P("clients")

    def local(bcast, *members):
      res = self.inner.run(client_fn, stack, bcast, *members)
      return res._replace(partial=jax.lax.psum(res.partial, "clients"))
    shard = lambda a: jax.lax.with_sharding_constraint(a, NamedSharding(self.mesh, spec))
    members = jax.tree.map(shard, (states, data, rngs, w))
    return jax.shard_map(local, mesh=self.mesh, in_specs=(P(), spec, spec, spec, spec),
                         out_specs=_CohortResult(P(), spec, spec if stack else None),
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


class HostLoopExecutor:
  """A Python loop over the members: member `i` runs as one jitted call on device
  `i % len(devices)`, each device keeping its own partial sum; calls are dispatched
  asynchronously, so devices work in parallel and the host never waits inside a round."""

  def __init__(self, devices):
    self.devices = tuple(devices)
    self._add = jax.jit(_add)
    self._stack = jax.jit(lambda xs: jax.tree.map(lambda *a: jnp.stack(a), *xs))

  def pad(self, n: int) -> int:
    return n

  def place(self, store):
    if isinstance(store, PlacedStore):
      return store
    return PlacedStore(tuple(jax.device_put(store, d) for d in self.devices))

  def data(self, store, ids):
    return _HostData(store.replicas, ids)

  def server_side(self, fn):
    return jax.jit(fn)

  def compile(self, skeleton):
    return skeleton

  def client_pass(self, client_fn, stack: bool):
    @jax.jit
    def one_client(bcast, states, store, ids, rngs, w, i):
      num_clients = store.counts.shape[0]
      idx = jnp.minimum(ids[i], num_clients - 1)
      data = ClientData(store.x, store.y, store.domain, store.counts, jnp.arange(num_clients))
      pick = lambda t, j: jax.tree.map(lambda a: a[j], t)
      out = client_fn(bcast, pick(states, i), pick(data, idx), rngs[i])
      part = _weighted_sum(jax.tree.map(lambda a: a[None], out), w[i][None])
      return part, out.state, (out.message if stack else None)

    def run(bcast, states, data: _HostData, rngs, w) -> _CohortResult:
      n_dev = len(self.devices)
      args = [(bcast, states, data.ids, rngs, w)]
      if n_dev > 1:
        args = [jax.device_put(args[0], d) for d in self.devices]
      acc, new_states, msgs = [None] * n_dev, [], []
      for i in range(w.shape[0]):
        d = i % n_dev
        b, st, ids, r, ww = args[d]
        part, state, msg = one_client(b, st, data.stores[d], ids, r, ww, jnp.int32(i))
        acc[d] = part if acc[d] is None else self._add(acc[d], part)
        new_states.append(state)
        msgs.append(msg)
      acc = [a for a in acc if a is not None]
      if n_dev > 1:
        acc, new_states, msgs = jax.device_put((acc, new_states, msgs), self.devices[0])
      total = functools.reduce(self._add, acc)
      return _CohortResult(total, self._stack(new_states), self._stack(msgs) if stack else None)
    return run


def executor(strategy: str, chunk_size: int = 1, devices=None):
  """The executor that `strategy` names, on `devices` (default: every local device)."""
  if strategy not in STRATEGIES:
    raise ValueError(f"engine.strategy: unknown {strategy!r}; choose one of {STRATEGIES} or 'auto'")
  devices = list(devices if devices is not None else jax.local_devices())
  if strategy == "host_loop":
    return HostLoopExecutor(devices)
  inner = VmapExecutor() if strategy == "vmap" else ChunkedExecutor(1 if strategy == "sequential" else chunk_size)
  if len(devices) == 1:
    return inner
  mesh = jax.make_mesh((len(devices),), ("clients",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
  return ShardedExecutor(inner, mesh)


# ------------------------------------------------------------------ the round


class _Cohort(NamedTuple):
  ids: jax.Array          # [S] sorted client ids, padded with num_clients
  valid: jax.Array        # [S] 1 for real members
  weights: jax.Array      # [S] aggregation weights (0 for padding)
  rngs: jax.Array         # [S] each member's key
  report_rngs: jax.Array  # [S] each member's key for the post-round report


def _aggregate(res: _CohortResult, w, how: str):
  """What a server-side piece receives: the weighted mean (`"mean"`) or `Stacked`."""
  if how == "stack":
    return Stacked(res.messages, w)
  return jax.tree.map(lambda m: m / jnp.maximum(res.partial.weight, 1e-12), res.partial.message)


def _as_update(client_fn):
  """A stat or report function as a client update that sends its value and keeps the state."""
  def fn(bcast, client_state, data, rng):
    return ClientOutput(client_fn(bcast, client_state, data, rng), client_state, {})
  return fn


class _Phase(NamedTuple):
  """One exchange: every member runs `run`, then the server applies `serve`."""
  run: Callable     # (bcast, states, data, rngs, w) -> _CohortResult
  serve: Callable   # (server, result, w) -> server (the update phase: (server, metrics))


class _Round(NamedTuple):
  """Everything the skeleton calls, as the executor runs it."""
  ex: Any
  sample: Callable      # (counts, rng, client_weights) -> _Cohort
  broadcast: Callable
  take: Callable        # (clients, ids) -> states [S, ...]
  scatter: Callable     # (clients, ids, states) -> clients
  stat: _Phase | None
  update: _Phase
  report: _Phase | None


def _round(r: _Round, state: RoundState, store, rng, client_weights=None):
  """The round skeleton, shared by every executor."""
  store = r.ex.place(store)
  cohort = r.sample(store.counts, rng, client_weights)
  data = r.ex.data(store, cohort.ids)
  states = r.take(state.clients, cohort.ids)
  server = state.server
  if r.stat is not None:  # pre-round: a statistic at the global model
    res = r.stat.run(r.broadcast(server), states, data, cohort.rngs, cohort.valid)
    server = r.stat.serve(server, res, cohort.valid)
  res = r.update.run(r.broadcast(server), states, data, cohort.rngs, cohort.weights)
  server, metrics = r.update.serve(server, res, cohort.weights)
  if r.report is not None:  # post-round: a report at the updated model and states
    rep = r.report.run(r.broadcast(server), res.states, data, cohort.report_rngs, cohort.valid)
    server = r.report.serve(server, rep, cohort.valid)
  return RoundState(server, r.scatter(state.clients, cohort.ids, res.states)), metrics


class RoundFn:
  """`round_fn(state, store, rng, client_weights=None) -> (state, metrics)`; `place(store)`
  returns the store to pass on every round (computed once; the host loop's replicas)."""

  def __init__(self, fn, place):
    self._fn, self.place = fn, place

  def __call__(self, state, store, rng, client_weights=None):
    return self._fn(state, store, rng, client_weights)


def make_round(algorithm: Algorithm, num_clients: int, cohort_size: int, strategy: str = "vmap",
               chunk_size: int = 1, devices=None) -> RoundFn:
  """Returns `round_fn(state, store, rng, client_weights=None) -> (state, metrics)`.

  `client_weights` ([C], optional) replaces the algorithm's aggregation weights (examples
  or uniform) for every client; the round is differentiable with respect to it (and to
  any array in `state`, such as an injected server step size) for the jitted strategies.

  `store` is a `ClientStore` of device arrays (passed as an argument, never baked into the
  compiled program), or `round_fn.place(store)`. For every strategy but "host_loop" the
  round is one `jax.jit`; "host_loop" is a Python function around jitted pieces.
  """
  ex = executor(strategy, chunk_size, devices)
  if not 1 <= cohort_size <= num_clients:
    raise ValueError(f"cohort size must be in [1, {num_clients}], got {cohort_size}")
  padded = ex.pad(cohort_size)
  alg = algorithm

  def sample(counts, rng, client_weights):
    k_cohort, k_clients = jax.random.split(rng)
    if cohort_size == num_clients:
      ids = jnp.arange(num_clients)
    else:
      ids = jnp.sort(jax.random.choice(k_cohort, num_clients, (cohort_size,), replace=False))
    ids = jnp.concatenate([ids, jnp.full((padded - cohort_size,), num_clients, ids.dtype)])
    valid = (ids < num_clients).astype(jnp.float32)
    if client_weights is not None:  # e.g. learned aggregation weights (differentiable)
      w = valid * jnp.take(client_weights, ids, mode="clip")
    else:
      w = valid * (jnp.take(counts, ids, mode="clip").astype(jnp.float32) if alg.weighting == "examples" else 1.0)
    rngs = jax.vmap(lambda i: jax.random.fold_in(k_clients, i))(ids)
    return _Cohort(ids, valid, w, rngs, jax.vmap(lambda k: jax.random.fold_in(k, 1))(rngs))

  def update(server, res, w):
    metrics = jax.tree.map(lambda m: m / jnp.maximum(res.partial.weight, 1e-12), res.partial.metrics)
    return alg.server_update(server, _aggregate(res, w, alg.aggregation)), metrics

  def phase(client_fn, serve, how):
    return _Phase(ex.client_pass(_as_update(client_fn), how == "stack"),
                  ex.server_side(lambda server, res, w: serve(server, _aggregate(res, w, how))))

  r = _Round(
      ex, ex.server_side(sample), ex.server_side(alg.broadcast), ex.server_side(_take),
      ex.server_side(lambda clients, ids, new: jax.tree.map(lambda a, n: a.at[ids].set(n, mode="drop"), clients, new)),
      stat=phase(alg.client_stat, alg.server_prepare, alg.stat_aggregation) if alg.client_stat else None,
      update=_Phase(ex.client_pass(alg.client_update, alg.aggregation == "stack"), ex.server_side(update)),
      report=phase(alg.client_report, alg.server_finish, alg.report_aggregation) if alg.client_report else None)
  return RoundFn(ex.compile(functools.partial(_round, r)), ex.place)
