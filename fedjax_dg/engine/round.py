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

  "vmap"       `VmapExecutor`: `jax.vmap` over the whole cohort (the GPU/TPU default for dense models).
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

Scale (issue 12; `make_round`'s arguments): clients that drop out or straggle
(`dropout`, `straggler_fraction`), local-step buckets so ragged clients cost their own
steps (`buckets`), client states in host memory (`init_round_state(host_states=True)`,
host_state.py), and the jitted strategies over every process's devices under
`jax.distributed`. `ENGINE_DEFAULTS` picks the strategy and unrolling by backend and
model family.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from fedjax_dg.defaults import STRATEGIES
from fedjax_dg.engine.host_state import HostClientStates
from fedjax_dg.algorithms.base import Algorithm, ClientData, ClientOutput, LocalSchedule, Stacked, tree_where



class RoundState(NamedTuple):
  server: Any
  clients: Any  # every client's persistent state, stacked [C, ...]
  # The run-time hyperparameters (learning rates, momenta, penalty weights, ...): a pytree
  # of scalar arrays that the round reads when it runs (`make_round` with a builder), so
  # runs that differ only in them share one compiled program (vmap over states) and a
  # loss after some rounds is differentiable in them. () for a fixed algorithm.
  hparams: Any = ()


def as_builder(algorithm) -> Callable:
  """`hparams -> Algorithm`: `algorithm` itself when it is a builder (a callable, such as
  `algorithms.Builder`), else a builder that ignores the hyperparameters."""
  if isinstance(algorithm, Algorithm):
    return lambda hparams=None: algorithm
  return algorithm


def init_round_state(algorithm, rng, params, num_clients: int, host_states: bool = False,
                     hparams=None) -> RoundState:
  """The server's state and every client's; with `host_states`, the client states live in
  host memory, stored only for clients once sampled (`HostClientStates`).

  `algorithm` is an `Algorithm` or a builder `hparams -> Algorithm` (with the default
  values in its `hparams` attribute); the state holds `hparams` (default: the builder's)."""
  if hparams is None:
    hparams = getattr(algorithm, "hparams", ())
  alg = as_builder(algorithm)(hparams if hparams != () else None)
  one = alg.client_init(params)
  if host_states:
    return RoundState(alg.server_init(rng, params), HostClientStates(one, num_clients), hparams)
  clients = jax.tree.map(lambda a: jnp.broadcast_to(a, (num_clients,) + a.shape).copy(), one)
  return RoundState(alg.server_init(rng, params), clients, hparams)


class EngineDefaults(NamedTuple):
  strategy: str
  unroll_upto: int  # local loops of at most this many steps are unrolled in full (0: never)
  measured: str     # where the choice comes from


# Measured on the 2-core CPU machine (benchmarks/results/round_speed_cpu.json, DomainBed's
# MNIST CNN and the 784-200-200-10 MLP): with convolutions the host loop is 35x faster
# than the `lax.scan` over clients ("sequential"), since XLA:CPU runs a convolution's weight
# gradient inside any while loop tens of times slower (JAX issue 12868), which is also why
# the local loop is unrolled there; for dense models the scan is fastest (host loop 1.46x,
# vmap 4.5x slower).
ENGINE_DEFAULTS = {
    ("cpu", "conv"): EngineDefaults("host_loop", 64, "round_speed_cpu.json: cnn, host_loop 0.028x sequential"),
    ("cpu", "dense"): EngineDefaults("sequential", 64, "round_speed_cpu.json: mlp, sequential fastest"),
    # Measured on an H100 (round_speed_gpu.json, 2026-11-23): the CNN's cohort of 100 runs
    # 0.235 s per round client by client in one scan, 0.284 s in the host loop and 0.465 s
    # under vmap (a vmapped convolution with per-client weights lowers to a grouped one);
    # the 1000-client MLP runs 22x faster under vmap than client by client.
    ("accelerator", "conv"): EngineDefaults("sequential", 0, "round_speed_gpu.json (H100): cnn, sequential 0.51x vmap"),
    ("accelerator", "dense"): EngineDefaults("vmap", 0, "round_speed_gpu.json (H100): mlp, vmap 0.05x sequential"),
}


def model_family(model, input_shape) -> str:
  """"conv" if the model's forward pass holds a convolution (traced on shapes only,
  nothing runs), else "dense"."""
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  x = jax.ShapeDtypeStruct((1,) + tuple(input_shape), jnp.float32)
  jaxpr = jax.make_jaxpr(model.apply)(params, x)

  def has_conv(jx) -> bool:
    for eqn in jx.eqns:
      if eqn.primitive.name == "conv_general_dilated":
        return True
      for v in eqn.params.values():  # nested jaxprs: pjit, remat, scan, cond branches, ...
        for inner in (v if isinstance(v, (list, tuple)) else (v,)):
          inner = getattr(inner, "jaxpr", inner)
          if hasattr(inner, "eqns") and has_conv(inner):
            return True
    return False
  return "conv" if has_conv(jaxpr.jaxpr) else "dense"


def engine_defaults(family: str, backend: str | None = None) -> EngineDefaults:
  """The strategy and unrolling for a model family ("conv" or "dense") on `backend`."""
  backend = backend or jax.default_backend()
  return ENGINE_DEFAULTS[("cpu" if backend == "cpu" else "accelerator", family)]


def default_unroll(family: str, num_steps: int, backend: str | None = None) -> int | bool:
  """`True` (unroll the local loop in full) or 1, from `engine_defaults`."""
  return True if num_steps <= engine_defaults(family, backend).unroll_upto else 1


def default_strategy(model_or_name, backend: str | None = None, input_shape=None) -> str:
  """The measured default strategy (`ENGINE_DEFAULTS`) for a model, from its operations:
  pass the model and its input shape. A model name is still accepted ("cnn" means
  convolutional, any other name dense); prefer the model."""
  if isinstance(model_or_name, str):
    family = "conv" if model_or_name == "cnn" else "dense"
  else:
    family = model_family(model_or_name, input_shape)
  return engine_defaults(family, backend).strategy


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

  buckets: Buckets | None = None  # set by make_round: run each (chunk of) members at its bucket's steps

  def data(self, store, ids, work=None, up=None):
    del up  # dropped members run and are discarded (weight 0, state not kept)
    return ClientData(*_take((store.x, store.y, store.domain, store.counts), ids),
                      client_id=jnp.minimum(ids, store.counts.shape[0] - 1), work=work)

  def client_pass(self, client_fn, stack: bool, bucketed: bool = False):
    return functools.partial(self.run, client_fn, stack, self.buckets if bucketed else None)

  def server_side(self, fn):
    return fn

  compile = staticmethod(jax.jit)


class VmapExecutor(_JittedExecutor):
  """`jax.vmap` over the whole cohort (with buckets: at the steps of its largest member)."""

  @staticmethod
  def run(client_fn, stack: bool, buckets, bcast, states, data, rngs, w) -> _CohortResult:
    go = lambda fn: lambda *a: jax.vmap(fn, in_axes=(None, 0, 0, 0))(*a)
    if buckets is None:
      outs = go(client_fn)(bcast, states, data, rngs)
    else:
      outs = jax.lax.switch(buckets.index(data.count), [go(_capped(client_fn, c)) for c in buckets.caps],
                            bcast, states, data, rngs)
    return _CohortResult(_weighted_sum(outs, w), outs.state, outs.message if stack else None)


class ChunkedExecutor(_JittedExecutor):
  """`vmap` inside chunks of `chunk` members, `lax.scan` across chunks (`chunk=1`: sequential)."""

  def __init__(self, chunk: int = 1):
    self.chunk = max(1, chunk)

  def pad(self, n: int) -> int:
    c = min(self.chunk, n)
    return -(-n // c) * c

  def run(self, client_fn, stack: bool, buckets, bcast, states, data, rngs, w) -> _CohortResult:
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
    return _CohortResult(partial, merge(new_states), merge(msgs) if stack else None)


class ShardedExecutor(_JittedExecutor):
  """`inner` on each device's share of the cohort (`jax.shard_map` over the mesh axis
  "clients"); a `psum` adds the devices' partial sums."""

  def __init__(self, inner: _JittedExecutor, mesh):
    self.inner, self.mesh = inner, mesh

  def pad(self, n: int) -> int:
    return self.inner.pad(-(-n // self.mesh.size)) * self.mesh.size

  def run(self, client_fn, stack: bool, buckets, bcast, states, data, rngs, w) -> _CohortResult:
    spec = P("clients")

    def local(bcast, *members):
      res = self.inner.run(client_fn, stack, buckets, bcast, *members)
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
  work: Any = None  # [S] stragglers' shares of their steps (ClientData.work), or None
  up: Any = None    # [S] 1 for members that report (with failing clients), or None


class HostLoopExecutor:
  """A Python loop over the members: member `i` runs as one jitted call on device
  `i % len(devices)`, each device keeping its own partial sum; calls are dispatched
  asynchronously, so devices work in parallel and the host never waits inside a round."""

  buckets: Buckets | None = None

  def __init__(self, devices):
    self.devices = tuple(devices)
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

    def run(bcast, states, data: _HostData, rngs, w) -> _CohortResult:
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
      acc, new_states, msgs = [None] * n_dev, [], []
      for i in range(w.shape[0]):
        d = i % n_dev
        b, st, ids, wk, r, ww = args[d]
        if skip[i]:
          new_states.append(self._pick(st, jnp.int32(i)))
          msgs.append(zeros(shape[2]) if stack else None)
          continue
        part, state, msg = one_client(b, st, data.stores[d], ids, wk, r, ww, jnp.int32(i), cap=caps[i])
        acc[d] = part if acc[d] is None else self._add(acc[d], part)
        new_states.append(state)
        msgs.append(msg)
      acc = [a for a in acc if a is not None] or [zeros(shape[0])]
      if n_dev > 1:
        acc, new_states, msgs = jax.device_put((acc, new_states, msgs), self.devices[0])
      total = functools.reduce(self._add, acc)
      return _CohortResult(total, self._stack(new_states), self._stack(msgs) if stack else None)
    return run


def executor(strategy: str, chunk_size: int = 1, devices=None):
  """The executor that `strategy` names, on `devices` (default: every device, of every
  process under `jax.distributed`; the host loop: this process's)."""
  if strategy not in STRATEGIES:
    raise ValueError(f"engine.strategy: unknown {strategy!r}; choose one of {STRATEGIES} or 'auto'")
  if devices is None:  # the jitted strategies span every process's devices (jax.distributed)
    devices = jax.local_devices() if strategy == "host_loop" else jax.devices()
  devices = list(devices)
  if strategy == "host_loop":
    if any(d.process_index != jax.process_index() for d in devices):
      raise ValueError("engine.strategy: host_loop dispatches to this process's devices only; across "
                       "jax.distributed processes use vmap, chunked or sequential")
    return HostLoopExecutor(devices)
  inner = VmapExecutor() if strategy == "vmap" else ChunkedExecutor(1 if strategy == "sequential" else chunk_size)
  if len(devices) == 1:
    return inner
  mesh = jax.make_mesh((len(devices),), ("clients",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)
  return ShardedExecutor(inner, mesh)


# ------------------------------------------------------------------ the round


class _Cohort(NamedTuple):
  ids: jax.Array          # [S] sorted client ids, padded with num_clients
  valid: jax.Array        # [S] 1 for real members (that report)
  weights: jax.Array      # [S] aggregation weights (0 for padding and dropped members)
  rngs: jax.Array         # [S] each member's key
  report_rngs: jax.Array  # [S] each member's key for the post-round report
  work: Any = None        # [S] stragglers' shares of their local steps (1: all), or None
  keep: Any = None        # [S] ids whose new state is kept (dropped members: num_clients), or None


def _aggregate(res: _CohortResult, w, how: str):
  """What a server-side piece receives: the weighted mean (`"mean"`) or `Stacked`."""
  if how == "stack":
    return Stacked(res.messages, w)
  return jax.tree.map(lambda m: m / jnp.maximum(res.partial.weight, 1e-12), res.partial.message)


class _Phase(NamedTuple):
  """One exchange: every member runs `run`, then the server applies `serve`."""
  run: Callable     # ((hparams, bcast), states, data, rngs, w) -> _CohortResult
  serve: Callable   # (hparams, server, result, w) -> server (the update phase: (server, metrics))


class _Round(NamedTuple):
  """Everything the skeleton calls, as the executor runs it."""
  ex: Any
  failures: bool        # clients may drop out or straggle: count reporters, keep the server if none
  sample: Callable      # (counts, rng, client_weights) -> _Cohort
  broadcast: Callable   # (hparams, server) -> (hparams, what the clients receive)
  take: Callable        # (clients, ids) -> states [S, ...]
  scatter: Callable     # (clients, ids, states) -> clients
  stat: _Phase | None
  update: _Phase
  report: _Phase | None
  count: Callable = None    # (valid) -> the number of reporters
  keep_if: Callable = None  # (cond, new, old) -> new if cond else old


def _round(r: _Round, state: RoundState, store, rng, client_weights=None):
  """The round skeleton, shared by every executor."""
  store = r.ex.place(store)
  cohort = r.sample(store.counts, rng, client_weights)
  server, new_states, metrics = _cohort_round(r, state.hparams, state.server, r.take(state.clients, cohort.ids),
                                              store, cohort)
  clients = r.scatter(state.clients, cohort.keep if r.failures else cohort.ids, new_states)
  return RoundState(server, clients, state.hparams), metrics


def _cohort_round(r: _Round, hp, server, states, store, cohort: _Cohort):
  """The round on the cohort's states `[S, ...]` with the run-time hyperparameters `hp`:
  (server, the members' new states, metrics)."""
  old_server = server
  data = r.ex.data(store, cohort.ids, cohort.work, cohort.valid if r.failures else None)
  if r.stat is not None:  # pre-round: a statistic at the global model
    res = r.stat.run(r.broadcast(hp, server), states, data, cohort.rngs, cohort.valid)
    server = r.stat.serve(hp, server, res, cohort.valid)
  res = r.update.run(r.broadcast(hp, server), states, data, cohort.rngs, cohort.weights)
  server, metrics = r.update.serve(hp, server, res, cohort.weights)
  if r.report is not None:  # post-round: a report at the updated model and states
    rep = r.report.run(r.broadcast(hp, server), res.states, data, cohort.report_rngs, cohort.valid)
    server = r.report.serve(hp, server, rep, cohort.valid)
  if r.failures:  # only the reporters' states change (`cohort.keep`); no reporter: the server stays
    reporters = r.count(cohort.valid)
    server = r.keep_if(reporters > 0, server, old_server)
    metrics = {**metrics, "reporters": reporters}
  return server, res.states, metrics


class RoundFn:
  """`round_fn(state, store, rng, client_weights=None) -> (state, metrics)`; `place(store)`
  returns the store to pass on every round (computed once; the host loop's replicas).
  With client states in host memory (`HostClientStates`), the cohort is drawn first, its
  states move to the device, the cohort round runs (one jit for the jitted strategies) and
  the new states go back to the host table."""

  def __init__(self, fn, place, r: _Round | None = None):
    self._fn, self.place, self._r = fn, place, r
    if r is not None:
      self._cohort_fn = r.ex.compile(functools.partial(_cohort_round, r))

  def __call__(self, state, store, rng, client_weights=None):
    if not isinstance(state.clients, HostClientStates):
      return self._fn(state, store, rng, client_weights)
    r = self._r
    store = r.ex.place(store)
    cohort = r.sample(store.counts, rng, client_weights)
    ids = np.asarray(cohort.ids)
    states = jax.tree.map(jnp.asarray, state.clients.gather(ids))
    server, new_states, metrics = self._cohort_fn(state.hparams, state.server, states, store, cohort)
    state.clients.scatter(np.asarray(cohort.keep) if r.failures else ids, new_states)
    return RoundState(server, state.clients, state.hparams), metrics


def make_round(algorithm, num_clients: int, cohort_size: int, strategy: str = "vmap",
               chunk_size: int = 1, devices=None, *, dropout: float = 0.0, straggler_fraction: float = 0.0,
               buckets: Buckets | None = None) -> RoundFn:
  """Returns `round_fn(state, store, rng, client_weights=None) -> (state, metrics)`.

  `algorithm` is an `Algorithm`, or a builder `hparams -> Algorithm` (`algorithms.Builder`):
  the round then builds the algorithm inside the traced round from `state.hparams`, so
  every continuous hyperparameter is an array read when the round runs (vmap over states
  that differ in them; differentiate a loss with respect to them). What decides the
  compiled program (aggregation, weighting, the optional phases) comes from
  `algorithm(None)`, the builder with its default values.

  Failing clients (FedProx's systems heterogeneity), with `k = fold_in(rng, 1)` split in
  (k_drop, k_slow, k_work): a sampled client `c` drops out with probability `dropout`
  (`bernoulli(fold_in(k_drop, c), dropout)`): it sends nothing in any phase, the server
  aggregates the reporters with their weights renormalised, and its state is unchanged.
  `round(straggler_fraction * cohort_size)` members (the first cohort positions of
  `permutation(k_slow, cohort_size)`) straggle: each takes only its first
  `floor(u K_c) + 1` of its `K_c` local steps, `u = uniform(fold_in(k_work, c))`
  (`ClientData.work`); stragglers still report. With either, `metrics["reporters"]` counts
  the reporters, and a round without one keeps the server state (a new `server` only if
  `reporters > 0`). With both 0 the round is today's, bit for bit.

  `buckets` (`buckets_for(schedule)`, epoch mode): members run only their own local steps
  (the steps past a client's data are no-ops): the host loop runs each member at its
  bucket's steps, the jitted strategies each vmapped group (the cohort, a chunk, one
  client for "sequential") at the steps of its largest member (`lax.switch`); results
  equal the masked run's.

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
  if not 0.0 <= dropout < 1.0:
    raise ValueError(f"engine.dropout must lie in [0, 1), got {dropout}")
  if not 0.0 <= straggler_fraction <= 1.0:
    raise ValueError(f"engine.straggler_fraction must lie in [0, 1], got {straggler_fraction}")
  ex.buckets = buckets
  failures = dropout > 0 or straggler_fraction > 0
  n_slow = int(round(straggler_fraction * cohort_size))
  padded = ex.pad(cohort_size)
  build = as_builder(algorithm)
  alg = build(None)  # the static structure

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
    report_rngs = jax.vmap(lambda k: jax.random.fold_in(k, 1))(rngs)
    if not failures:
      return _Cohort(ids, valid, w, rngs, report_rngs)
    k_drop, k_slow, k_work = jax.random.split(jax.random.fold_in(rng, 1), 3)
    per_client = lambda k: jax.vmap(lambda i: jax.random.fold_in(k, i))(ids)
    up = 1.0 - jax.vmap(lambda k: jax.random.bernoulli(k, dropout))(per_client(k_drop)).astype(jnp.float32)
    slow = jnp.zeros((padded,), bool).at[jax.random.permutation(k_slow, cohort_size)[:n_slow]].set(True)
    work = jnp.where(slow, jax.vmap(lambda k: jax.random.uniform(k))(per_client(k_work)), 1.0)
    return _Cohort(ids, valid * up, w * up, rngs, report_rngs, work if n_slow else None,
                   jnp.where(up > 0, ids, num_clients))

  def update(hp, server, res, w):
    metrics = jax.tree.map(lambda m: m / jnp.maximum(res.partial.weight, 1e-12), res.partial.metrics)
    return build(hp).server_update(server, _aggregate(res, w, alg.aggregation)), metrics

  def client_update(b, client_state, data, rng):  # b = (hparams, broadcast)
    return build(b[0]).client_update(b[1], client_state, data, rng)

  def phase(on_client, on_server, how):
    def client_fn(b, client_state, data, rng):  # sends its value and keeps the state
      return ClientOutput(getattr(build(b[0]), on_client)(b[1], client_state, data, rng), client_state, {})

    def serve(hp, server, res, w):
      return getattr(build(hp), on_server)(server, _aggregate(res, w, how))
    return _Phase(ex.client_pass(client_fn, how == "stack"), ex.server_side(serve))

  r = _Round(
      ex, failures, ex.server_side(sample), ex.server_side(lambda hp, server: (hp, build(hp).broadcast(server))),
      ex.server_side(_take),
      ex.server_side(lambda clients, ids, new: jax.tree.map(lambda a, n: a.at[ids].set(n, mode="drop"), clients, new)),
      stat=phase("client_stat", "server_prepare", alg.stat_aggregation) if alg.client_stat else None,
      update=_Phase(ex.client_pass(client_update, alg.aggregation == "stack", bucketed=True),
                    ex.server_side(update)),
      report=phase("client_report", "server_finish", alg.report_aggregation) if alg.client_report else None,
      count=ex.server_side(lambda valid: jnp.sum(valid).astype(jnp.int32)),
      keep_if=ex.server_side(lambda cond, new, old: tree_where(cond, new, old)))
  return RoundFn(ex.compile(functools.partial(_round, r)), ex.place, r)
