"""One federated round: one skeleton, run by an executor.

    cohort   = sample(rng)                         # all, a fraction, or a count; sorted ids
    data     = store[cohort]; state_i = clients[cohort]
    [pre-round]  server = server_prepare(server, reduce(client_stat(broadcast, state_i, data_i, rng_i)))
    outputs  = client_update(broadcast, state_i, data_i, rng_i) for every member
    server   = server_update(server, reduce(outputs))
    [post-round] server = server_finish(server, reduce(client_report(broadcast', state_i', data_i, rng_i')))
    clients  = clients.at[cohort].set(new states)  # clients not sampled keep theirs

`_round` is that skeleton, written once, for client states on the device and in host
memory alike (`_Clients` says where they live). The engine's other concerns have their
own modules: cohort sampling with failing clients (cohort.py), executors (executors.py),
the measured defaults (measured.py), host-held client states (host_state.py). How the
members of each phase run is an executor (as fedjax's for-each-client backends), all with
the same result up to float summation order; `make_round`'s `strategy` picks one:

  "vmap"       `VmapExecutor`: `jax.vmap` over the whole cohort (the GPU/TPU default for dense models).
  "chunked"    `ChunkedExecutor(chunk_size)`: `vmap` inside chunks, `lax.scan` across
               chunks, the partial weighted sum carried (memory O(chunk), not O(cohort)).
  "sequential" `ChunkedExecutor(1)`.
  "host_loop"  `HostLoopExecutor(devices, threads)`: a Python loop that dispatches one jitted
               client call per member with the partial sum carried on the device (on CPU
               from two host threads, two members at a time; elsewhere asynchronous
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

Scale (`make_round`'s arguments): clients that drop out or straggle
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

from fedjax_dg.algorithms.base import Algorithm, ClientOutput, Stacked, tree_where
from fedjax_dg.defaults import STRATEGIES  # noqa: F401  (re-exported)
from fedjax_dg.engine.cohort import Cohort, make_sampler
from fedjax_dg.engine.executors import (Buckets, ChunkedExecutor, HostLoopExecutor, PlacedStore,  # noqa: F401
                                        ShardedExecutor, VmapExecutor, CohortResult, take_clients, buckets_for, executor)
from fedjax_dg.engine.host_state import HostClientStates
from fedjax_dg.engine.measured import (ENGINE_DEFAULTS, EngineDefaults, default_strategy,  # noqa: F401
                                       default_unroll, engine_defaults, model_family)



class RoundState(NamedTuple):
  """What a round carries from one round to the next.

  Attributes:
    server: the algorithm's server state (`algorithm.params_of(server)` is the model).
    clients: every client's persistent state, stacked `[C, ...]` (or `HostClientStates`).
    hparams: the run-time hyperparameters (learning rates, momenta, penalty weights, ...):
      a pytree of scalar arrays that the round reads when it runs (`make_round` with a
      builder), so runs that differ only in them share one compiled program (vmap over
      states) and a loss after some rounds is differentiable in them. () for a fixed
      algorithm.
  """
  server: Any
  clients: Any
  hparams: Any = ()


def as_builder(algorithm) -> Callable:
  """`hparams -> Algorithm`: `algorithm` itself when it is a builder (a callable, such as
  `algorithms.Builder`), else a builder that ignores the hyperparameters."""
  if isinstance(algorithm, Algorithm):
    return lambda hparams=None: algorithm
  return algorithm


def init_round_state(algorithm, rng, params, num_clients: int, host_states: bool = False,
                     hparams=None) -> RoundState:
  """The server's state and every client's, before the first round.

  Args:
    algorithm: an `Algorithm`, or a builder `hparams -> Algorithm` (`algorithms.Builder`,
      with the default values in its `hparams` attribute).
    rng: the key of the server's initialisation (`server_init(rng, params)`).
    params: the model's initial parameters (`model.init(rng)`).
    num_clients: `C`, the clients holding training data.
    host_states: the client states live in host memory, stored only for clients once
      sampled (`HostClientStates`).
    hparams: the run-time hyperparameters the state holds (default: the builder's; () for
      an `Algorithm`).

  Returns:
    The `RoundState` of round 0.
  """
  if hparams is None:
    hparams = getattr(algorithm, "hparams", ())
  alg = as_builder(algorithm)(hparams if hparams != () else None)
  one = alg.client_init(params)
  if host_states:
    return RoundState(alg.server_init(rng, params), HostClientStates(one, num_clients), hparams)
  clients = jax.tree.map(lambda a: jnp.broadcast_to(a, (num_clients,) + a.shape).copy(), one)
  return RoundState(alg.server_init(rng, params), clients, hparams)


def _aggregate(res: CohortResult, w, how: str):
  """What a server-side piece receives: the weighted mean (`"mean"`) or `Stacked`."""
  if how == "stack":
    return Stacked(res.messages, w)
  return jax.tree.map(lambda m: m / jnp.maximum(res.partial.weight, 1e-12), res.partial.message)


class _Phase(NamedTuple):
  """One exchange: every member runs `run`, then the server applies `serve`."""
  run: Callable     # ((hparams, bcast), states, data, rngs, w) -> CohortResult
  serve: Callable   # (hparams, server, result, w) -> server (the update phase: (server, metrics))


class _Round(NamedTuple):
  """Everything the skeleton calls, as the executor runs it."""
  ex: Any
  failures: bool        # clients may drop out or straggle: count reporters, keep the server if none
  sample: Callable      # (counts, rng, client_weights) -> Cohort
  broadcast: Callable   # (hparams, server) -> (hparams, what the clients receive)
  take: Callable        # (clients, ids) -> states [S, ...]
  scatter: Callable     # (clients, ids, states) -> clients
  stat: _Phase | None
  update: _Phase
  report: _Phase | None
  count: Callable = None    # (valid) -> the number of reporters
  keep_if: Callable = None  # (cond, new, old) -> new if cond else old


class _Clients(NamedTuple):
  """Where the client states live: `take(clients, ids) -> states [S, ...]` and
  `scatter(clients, ids, states) -> clients`, and the cohort round to run between them."""
  take: Callable
  scatter: Callable
  cohort_round: Callable  # (hparams, server, states, store, cohort) -> (server, states, metrics)


def _round(r: _Round, where: _Clients, state: RoundState, store, rng, client_weights=None):
  """The round skeleton, written once: shared by every executor, for client states on the
  device (the whole skeleton traced into one jit by the jitted executors) and in host
  memory (the skeleton runs in Python; the cohort round is one compiled call)."""
  store = r.ex.place(store)
  cohort = r.sample(store.counts, rng, client_weights)
  server, new_states, metrics = where.cohort_round(state.hparams, state.server, where.take(state.clients, cohort.ids),
                                                   store, cohort)
  clients = where.scatter(state.clients, cohort.keep if r.failures else cohort.ids, new_states)
  return RoundState(server, clients, state.hparams), metrics


def _host_clients(cohort_fn) -> _Clients:
  """Client states in host memory (`HostClientStates`): the cohort's states move to the
  device and back."""
  def take(clients, ids):
    return jax.tree.map(jnp.asarray, clients.gather(np.asarray(ids)))

  def scatter(clients, ids, states):
    clients.scatter(np.asarray(ids), states)
    return clients
  return _Clients(take, scatter, cohort_fn)


def _cohort_round(r: _Round, hp, server, states, store, cohort: Cohort):
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

  def __init__(self, r: _Round):
    self.place = r.ex.place
    on_device = _Clients(r.take, r.scatter, functools.partial(_cohort_round, r))
    self._device = r.ex.compile(functools.partial(_round, r, on_device))
    self._host = functools.partial(_round, r, _host_clients(r.ex.compile(functools.partial(_cohort_round, r))))

  def __call__(self, state, store, rng, client_weights=None):
    fn = self._host if isinstance(state.clients, HostClientStates) else self._device
    return fn(state, store, rng, client_weights)


def make_round(algorithm, num_clients: int, cohort_size: int, strategy: str = "vmap",
               chunk_size: int = 1, devices=None, *, dropout: float = 0.0, straggler_fraction: float = 0.0,
               buckets: Buckets | None = None) -> RoundFn:
  """The round: cohort sampling, the clients' updates, the server's update.

  Args:
    algorithm: an `Algorithm`, or a builder `hparams -> Algorithm` (see below).
    num_clients: `C`, the clients holding training data (the store's first axis).
    cohort_size: clients sampled per round, in `[1, C]`.
    strategy: how the cohort's clients run: "vmap", "chunked", "sequential" or
      "host_loop" (`STRATEGIES`; docs/concepts/execution-strategies.md).
    chunk_size: clients per vectorised chunk ("chunked").
    devices: the devices the cohort is spread over (default: every device; "host_loop":
      this process's).
    dropout: the probability that a sampled client drops out (below).
    straggler_fraction: the share of the cohort that straggles (below).
    buckets: local-step buckets (`buckets_for(schedule)`, epoch mode; below), or None.

  Returns:
    `round_fn(state, store, rng, client_weights=None) -> (state, metrics)`.

  Raises:
    ValueError: an unknown strategy, a cohort size outside `[1, C]`, `dropout` outside
      [0, 1) or `straggler_fraction` outside [0, 1].

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
  any array in `state`, such as the hyperparameters in `state.hparams`) for the jitted strategies.

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
  padded = ex.pad(cohort_size)
  build = as_builder(algorithm)
  alg = build(None)  # the static structure
  sample = make_sampler(num_clients, cohort_size, padded, alg.weighting, dropout, straggler_fraction)

  def update(hp, server, res, w):
    metrics = jax.tree.map(lambda m: m / jnp.maximum(res.partial.weight, 1e-12), res.partial.metrics)
    a, aggregate = build(hp), _aggregate(res, w, alg.aggregation)
    new = a.server_update(server, aggregate)
    if a.server_activity is not None:  # the server step's activity records (`activity/rule_deviation`)
      metrics = {**metrics, **a.server_activity(server, aggregate, new)}
    return new, metrics

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
      ex.server_side(take_clients),
      ex.server_side(lambda clients, ids, new: jax.tree.map(lambda a, n: a.at[ids].set(n, mode="drop"), clients, new)),
      stat=phase("client_stat", "server_prepare", alg.stat_aggregation) if alg.client_stat else None,
      update=_Phase(ex.client_pass(client_update, alg.aggregation == "stack", bucketed=True),
                    ex.server_side(update)),
      report=phase("client_report", "server_finish", alg.report_aggregation) if alg.client_report else None,
      count=ex.server_side(lambda valid: jnp.sum(valid).astype(jnp.int32)),
      keep_if=ex.server_side(lambda cond, new, old: tree_where(cond, new, old)))
  return RoundFn(r)
