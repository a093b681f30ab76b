"""One federated round as a pure, jitted function.

    cohort   = sample(rng)                         # all, a fraction, or a count; sorted ids
    data     = store[cohort]; state_i = clients[cohort]
    outputs  = client_update(broadcast, state_i, data_i, rng_i) for every member
    server   = server_update(server, reduce(outputs))
    clients  = clients.at[cohort].set(new states)  # clients not sampled keep theirs

How the members run is a strategy, all with the same result up to float summation order:

  "vmap"       `jax.vmap` over the whole cohort (the GPU/TPU default).
  "chunked"    `vmap` inside chunks of `chunk_size` clients, `lax.scan` across chunks, the
               partial weighted sum carried (memory O(chunk) instead of O(cohort)).
  "sequential" "chunked" with chunks of one client.
  "host_loop"  a Python loop that dispatches one jitted client update per member with
               the partial sum carried on the device (asynchronous dispatch, no host sync).
               On XLA:CPU this is the fast way to run convolutions: a convolution's weight
               gradient inside any XLA while loop (`lax.scan` over clients or rolled local
               steps) runs tens of times slower there (JAX issue 12868).
With more than one local device, "vmap", "chunked" and "sequential" shard the cohort axis
over a `Mesh` axis named "clients" through `jax.shard_map`; each device reduces its
share and a `psum` finishes the aggregate. "host_loop" sends member `i` to device
`i mod n_devices` and adds the devices' partial sums at the end.

Each member's randomness is `fold_in(round_key, client_id)`, so a client draws the same
batches whichever strategy, cohort padding or device count runs it.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
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
  messages: Any       # stacked messages [S, ...] when aggregation == "stack", else None


def _run_vmap(client_fn, stack: bool, bcast, states, data, rngs, w) -> _CohortResult:
  outs = jax.vmap(client_fn, in_axes=(None, 0, 0, 0))(bcast, states, data, rngs)
  return _CohortResult(_weighted_sum(outs, w), outs.state, outs.message if stack else None)


def _run_chunked(client_fn, stack: bool, chunk: int, bcast, states, data, rngs, w) -> _CohortResult:
  n = w.shape[0]
  split = lambda t: jax.tree.map(lambda a: a.reshape((n // chunk, chunk) + a.shape[1:]), t)
  merge = lambda t: jax.tree.map(lambda a: a.reshape((n,) + a.shape[2:]), t)
  xs = (split(states), split(data), split(rngs), split(w))
  shape = jax.eval_shape(lambda *a: _run_vmap(client_fn, stack, bcast, *a), *jax.tree.map(lambda a: a[0], xs))
  zero = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shape.partial)

  def body(acc, x):
    res = _run_vmap(client_fn, stack, bcast, *x)
    return _add(acc, res.partial), (res.states, res.messages)

  partial, (new_states, msgs) = jax.lax.scan(body, zero, xs)
  return _CohortResult(partial, merge(new_states), merge(msgs) if stack else None)


def _finish(algorithm: Algorithm, server, res: _CohortResult, w):
  tot = jnp.maximum(res.partial.weight, 1e-12)
  metrics = jax.tree.map(lambda m: m / tot, res.partial.metrics)
  if algorithm.aggregation == "stack":
    agg = Stacked(res.messages, w)
  else:
    agg = jax.tree.map(lambda m: m / tot, res.partial.message)
  return algorithm.server_update(server, agg), metrics


def make_round(algorithm: Algorithm, num_clients: int, cohort_size: int, strategy: str = "vmap",
               chunk_size: int = 1, devices=None):
  """Returns `round_fn(state, store, rng, client_weights=None) -> (state, metrics)`.

  `client_weights` ([C], optional) replaces the algorithm's aggregation weights (examples
  or uniform) for every client; the round is differentiable with respect to it (and to
  any array in `state`, such as an injected server step size) for the jitted strategies.

  `store` is a `ClientStore` of device arrays (passed as an argument, never baked into the
  compiled program). For every strategy but "host_loop" the returned function is one
  `jax.jit`; "host_loop" is a Python function around three jitted pieces.
  """
  if strategy not in STRATEGIES:
    raise ValueError(f"engine.strategy: unknown {strategy!r}; choose one of {STRATEGIES} or 'auto'")
  if not 1 <= cohort_size <= num_clients:
    raise ValueError(f"cohort size must be in [1, {num_clients}], got {cohort_size}")
  devices = list(devices if devices is not None else jax.local_devices())
  n_dev = len(devices) if strategy != "host_loop" else 1  # the host loop spreads clients itself
  chunk = 1 if strategy == "sequential" else max(1, chunk_size)
  per_dev = -(-cohort_size // n_dev)
  if strategy in ("chunked", "sequential"):
    chunk = min(chunk, per_dev)
    per_dev = -(-per_dev // chunk) * chunk
  padded = per_dev * n_dev
  stack = algorithm.aggregation == "stack"
  mesh = jax.make_mesh((n_dev,), ("clients",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=devices) if n_dev > 1 else None

  def prologue(state, store, rng, client_weights=None):
    k_cohort, k_clients = jax.random.split(rng)
    if cohort_size == num_clients:
      cohort = jnp.arange(num_clients)
    else:
      cohort = jnp.sort(jax.random.choice(k_cohort, num_clients, (cohort_size,), replace=False))
    cohort = jnp.concatenate([cohort, jnp.full((padded - cohort_size,), num_clients, cohort.dtype)])
    valid = (cohort < num_clients).astype(jnp.float32)
    counts = jnp.take(store.counts, cohort, mode="clip")
    if client_weights is not None:  # e.g. learned aggregation weights (differentiable)
      w = valid * jnp.take(client_weights, cohort, mode="clip")
    else:
      w = valid * (counts.astype(jnp.float32) if algorithm.weighting == "examples" else 1.0)
    rngs = jax.vmap(lambda i: jax.random.fold_in(k_clients, i))(cohort)
    return cohort, w, rngs, algorithm.broadcast(state.server)

  def client_data(store, idx):
    return ClientData(*_take((store.x, store.y, store.domain, store.counts), idx),
                      client_id=jnp.minimum(idx, num_clients - 1))

  def epilogue(state, cohort, res, w):
    server, metrics = _finish(algorithm, state.server, res, w)
    clients = jax.tree.map(lambda a, n: a.at[cohort].set(n, mode="drop"), state.clients, res.states)
    return RoundState(server, clients), metrics

  if strategy == "host_loop":
    return _host_loop_round(algorithm, num_clients, padded, stack, devices, prologue, epilogue)

  def runner(client_fn, stack_msgs: bool):
    """`run(bcast, states, data, rngs, w) -> _CohortResult` for one pass over the cohort."""
    def run_local(bcast, states, data, rngs, w):
      if strategy == "vmap":
        return _run_vmap(client_fn, stack_msgs, bcast, states, data, rngs, w)
      return _run_chunked(client_fn, stack_msgs, chunk, bcast, states, data, rngs, w)
    if mesh is None:
      return run_local

    def sharded(bcast, states, data, rngs, w):
      res = run_local(bcast, states, data, rngs, w)
      return res._replace(partial=jax.lax.psum(res.partial, "clients"))
    spec = P("clients")
    return jax.shard_map(sharded, mesh=mesh, in_specs=(P(), spec, spec, spec, spec),
                         out_specs=_CohortResult(P(), spec, spec if stack_msgs else None), check_vma=False)

  @jax.jit
  def round_fn(state, store, rng, client_weights=None):
    cohort, w, rngs, bcast = prologue(state, store, rng, client_weights)
    data = client_data(store, cohort)
    states = _take(state.clients, cohort)
    valid = (cohort < num_clients).astype(jnp.float32)
    if mesh is not None:
      shard = lambda t: jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, NamedSharding(mesh, P("clients"))), t)
      states, data, rngs, w_in, valid = shard(states), shard(data), shard(rngs), shard(w), shard(valid)
    else:
      w_in = w
    if algorithm.client_stat is not None:  # the pre-round phase: a statistic at the global model
      res = runner(_stat_as_update(algorithm.client_stat), False)(bcast, states, data, rngs, valid)
      state = state._replace(server=_prepare(algorithm, state.server, res))
      bcast = algorithm.broadcast(state.server)
    res = runner(algorithm.client_update, stack)(bcast, states, data, rngs, w_in)
    return epilogue(state, cohort, res, w)

  return round_fn


def _stat_as_update(client_stat):
  def fn(bcast, client_state, data, rng):
    return ClientOutput(client_stat(bcast, client_state, data, rng), client_state, {})
  return fn


def _prepare(algorithm, server, res: _CohortResult):
  mean_stat = jax.tree.map(lambda m: m / jnp.maximum(res.partial.weight, 1e-12), res.partial.message)
  return algorithm.server_prepare(server, mean_stat)


def _host_loop_round(algorithm, num_clients, cohort_len, stack, devices, prologue, epilogue):
  """The "host_loop" strategy: member `i` runs as one jitted call on device
  `i % len(devices)`, each device keeping its own partial sum; calls are dispatched
  asynchronously, so devices work in parallel and the host never waits inside a round."""
  dev0 = devices[0]

  def make_one(client_fn, stack_msgs):
    @jax.jit
    def one_client(bcast, clients, store, cohort, rngs, w, i):
      idx = jnp.minimum(cohort[i], num_clients - 1)
      pick = lambda t: jax.tree.map(lambda a: a[idx], t)
      data = ClientData(store.x, store.y, store.domain, store.counts, jnp.arange(num_clients))
      out = client_fn(bcast, pick(clients), pick(data), rngs[i])
      part = _weighted_sum(jax.tree.map(lambda a: a[None], out), w[i][None])
      return part, out.state, (out.message if stack_msgs else None)
    return one_client

  update_one = make_one(algorithm.client_update, stack)
  stat_one = make_one(_stat_as_update(algorithm.client_stat), False) if algorithm.client_stat else None
  accumulate = jax.jit(_add)
  jit_prologue, jit_epilogue = jax.jit(prologue), jax.jit(epilogue)
  jit_prepare = jax.jit(lambda server, res: _prepare(algorithm, server, res))
  jit_broadcast = jax.jit(algorithm.broadcast)
  stack_tree = jax.jit(lambda xs: jax.tree.map(lambda *a: jnp.stack(a), *xs))
  replicas = {}  # id(store.x) -> (store.x, [store on each device]); the store is constant across rounds

  def on_devices(store):
    key = id(store.x)
    if key not in replicas or replicas[key][0] is not store.x:
      replicas.clear()
      replicas[key] = (store.x, [jax.device_put(store, d) for d in devices])
    return replicas[key][1]

  def host_pass(one, stack_msgs, bcast, clients, store, cohort, rngs, w):
    stores = on_devices(store) if len(devices) > 1 else [store]
    args = [(bcast, clients, cohort, rngs, w)]
    if len(devices) > 1:
      args = [jax.device_put(args[0], d) for d in devices]
    acc, states, msgs = [None] * len(stores), [], []
    for i in range(cohort_len):
      d = i % len(stores)
      b, cl, co, r, ww = args[d]
      part, st, msg = one(b, cl, stores[d], co, r, ww, jnp.int32(i))
      acc[d] = part if acc[d] is None else accumulate(acc[d], part)
      states.append(st)
      msgs.append(msg)
    if len(devices) > 1:
      to0 = lambda t: jax.device_put(t, dev0)
      acc = [to0(a) for a in acc if a is not None]
      states, msgs = to0(states), to0(msgs)
    total = acc[0]
    for a in acc[1:]:
      total = accumulate(total, a)
    return _CohortResult(total, stack_tree(states), stack_tree(msgs) if stack_msgs else None)

  def round_fn(state, store, rng, client_weights=None):
    cohort, w, rngs, bcast = jit_prologue(state, store, rng, client_weights)
    if stat_one is not None:
      valid = (cohort < num_clients).astype(jnp.float32)
      res = host_pass(stat_one, False, bcast, state.clients, store, cohort, rngs, valid)
      state = state._replace(server=jit_prepare(state.server, res))
      bcast = jit_broadcast(state.server)
    res = host_pass(update_one, stack, bcast, state.clients, store, cohort, rngs, w)
    return jit_epilogue(state, cohort, res, w)
  return round_fn
