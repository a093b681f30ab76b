"""Hypergradients: the gradient of an outer objective after federated rounds with respect
to the run-time hyperparameters and the aggregation weights.

Every round is a pure JAX function of the round state, whose `hparams` hold the run's
continuous hyperparameters (client and server step sizes, momenta, FedProx's `mu`, ...;
`algorithms.hyperparameters`), so the derivative of any function of the state after K
rounds is plain reverse-mode autodiff through every local step and server update.

The outer variables (`Meta`):

  hparams   `{"client.lr": x, "method.mu": y, ...}`: values that replace those fields of
            `state.hparams` (any continuous hyperparameter of the method, its rule, the
            client or the server optimizer).
  weights   `AggregationWeights(client [C], domain [D], shrink [])`: client `c`'s weight
            in the aggregate is `p_c exp(client_c) sum_d s_cd exp(domain_d)`, with `p_c`
            the method's own weight (examples or uniform) and `s_cd` the share of client
            `c`'s examples from domain `d` (1 for a single-domain client), so zeros give the
            method's own aggregation; after every server update the global model is
            multiplied by `shrink` (FedLAW's global shrink factor `gamma`, Li et al., ICML
            2023: `theta <- gamma sum_c lambda_c theta_c`; for FedAvg at `server.lr = 1` this
            is exactly FedLAW's aggregate).

The outer objective (`Objective(fn, split)`) sees the model after the rounds and one
named split: `fn(params, data, state) -> scalar`, `data = (x, y)` of `split`. Only
validation splits can be named (`OUTER_SPLITS`); a test split is refused before anything
runs, so no hyperparameter is tuned on the test domain. `validation_loss(model)` is the
usual one: the mean cross-entropy on the held-out validation domain.

Three estimators, one function (`hypergradient(problem, objective, rounds, truncate)`):

  exact      `truncate=None`: through all `rounds` unrolled rounds.
  truncated  `truncate=K < rounds`: the first `rounds - K` rounds run forward only, the
             gradient flows through the last K (a biased, cheaper estimate: the effect of
             the outer variables on the first rounds is dropped).
  one-step   `one_step(problem, objective)`: K = 1 from the current state (online use
             during training).

Rounds run in a `lax.scan` (one compiled round whatever K); with `remat=True` each round
is a `jax.checkpoint`: the backward pass recomputes one round's forward at a time, so
memory holds K round states rather than K rounds of activations
(benchmarks/hypergrad_memory.py measures both).

Strategies: "vmap", "chunked" and "sequential" run the round as one traced JAX function and
are differentiable. "host_loop" is refused: it is a Python loop over per-client jitted
calls whose partial sums are dispatched from the host; traced into a differentiable
program it would no longer be that loop (every member is inlined into one program, which
is what the strategy exists to avoid on XLA:CPU), and with failing clients or local-step
buckets it reads the cohort on the host, which cannot be traced at all. Client states in
host memory (`host_states`) and inputs in host memory (`engine.host_store`) are refused
for the same reason: they are updated outside the traced program.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dg.engine.host_state import HostClientStates
from fedjax_dg.algorithms.base import unrolled
from fedjax_dg.engine.round import RoundState, as_builder, make_round

DIFFERENTIABLE_STRATEGIES = ("vmap", "chunked", "sequential")
OUTER_SPLITS = ("heldout_val", "in_val")   # what an outer objective may read
TEST_SPLITS = ("test", "in_test")          # refused by name


class AggregationWeights(NamedTuple):
  """Log-multipliers of the aggregation weights (zeros: the method's own) and the global
  shrink factor (1: none).

  Attributes:
    client: `[C]` log-multiplier of each client's weight.
    domain: `[D]` log-multiplier of each domain's weight, by dataset domain id.
    shrink: `[]` the factor the global model is multiplied by after every server update.
  """
  client: jax.Array  # [C]
  domain: jax.Array  # [D], dataset domain ids
  shrink: jax.Array  # []


class Meta(NamedTuple):
  """The outer variables: hyperparameter values by dotted name, and aggregation weights.

  Attributes:
    hparams: `{"client.lr": x, "method.mu": y, ...}`: values that replace those fields of
      `state.hparams`.
    weights: the `AggregationWeights`, or None: the method's own aggregation.
  """
  hparams: dict = {}
  weights: AggregationWeights | None = None


class Objective(NamedTuple):
  """The outer objective on the model after the rounds.

  Attributes:
    fn: `fn(params, data, state) -> scalar`; `data = (x, y)` of the split `split`.
    split: the validation split `fn` reads (`OUTER_SPLITS`); None: `fn` reads no data.
  """
  fn: Callable
  split: str | None = "heldout_val"


class Problem(NamedTuple):
  """The inner problem: the rounds, the clients' data, and the data an outer objective may
  read. Build it with `problem(...)` or `from_config(...)`.

  Attributes:
    round_fn: the engine's round (`make_round`, a differentiable strategy).
    store: the `ClientStore` of device arrays.
    base_weights: `[C]` the method's own aggregation weights `p_c`.
    domain_shares: `[C, D]` the share of client c's examples from domain d.
    params_of: server state -> model parameters.
    splits: `{name: (x, y)}` of the validation splits an objective may read (only `OUTER_SPLITS`).
    hparams: the default run-time hyperparameters (the builder's).
    strategy: the engine strategy of `round_fn`.
    model: the model (`model.apply(params, x)`), when known.
  """
  round_fn: Callable       # engine RoundFn (a differentiable strategy)
  store: Any               # ClientStore of device arrays
  base_weights: jax.Array  # [C] the method's own aggregation weights p_c
  domain_shares: jax.Array  # [C, D] share of client c's examples from domain d
  params_of: Callable      # server state -> model parameters
  splits: dict             # {name: (x, y)}: only OUTER_SPLITS
  hparams: dict            # the default run-time hyperparameters (the builder's)
  strategy: str
  model: Any = None        # the model (`model.apply(params, x)`), when known


def check_strategy(strategy: str, field: str = "engine.strategy") -> None:
  """One line for a strategy that cannot be differentiated.

  Args:
    strategy: the engine strategy.
    field: the config field the error names.

  Raises:
    ValueError: `strategy` is not in `DIFFERENTIABLE_STRATEGIES` ("host_loop").
  """
  if strategy not in DIFFERENTIABLE_STRATEGIES:
    raise ValueError(f"{field}: {strategy!r} cannot be differentiated through rounds (host_loop dispatches "
                     f"clients from a Python loop); use one of {DIFFERENTIABLE_STRATEGIES}")


def check_split(split: str | None, field: str = "objective.split") -> None:
  """One line for an outer objective that would read a test split or an unknown one.

  Args:
    split: the split's name, or None (no data).
    field: the field the error names.

  Raises:
    ValueError: `split` is a test split (`TEST_SPLITS`) or not in `OUTER_SPLITS`.
  """
  if split is None or split in OUTER_SPLITS:
    return
  if split in TEST_SPLITS:
    raise ValueError(f"{field}: {split!r} is a test split; an outer objective may read only {OUTER_SPLITS}")
  raise ValueError(f"{field}: unknown split {split!r}; an outer objective may read {OUTER_SPLITS}")


def _is_count(v) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def check_rounds(rounds: int, truncate: int | None) -> None:
  """One line for a round count that is not a positive integer (`True` and `2.0` are not),
  or a truncation outside [1, rounds].

  Args:
    rounds: the number of rounds differentiated through.
    truncate: K, the last rounds the gradient flows through, or None: all.

  Raises:
    ValueError: `rounds` is not a positive integer, or `truncate` is not an integer in
      `[1, rounds]`.
  """
  if not _is_count(rounds) or rounds < 1:
    raise ValueError(f"rounds: must be a positive integer, got {rounds!r}")
  if truncate is not None and not (_is_count(truncate) and 1 <= truncate <= rounds):
    raise ValueError(f"truncate: K={truncate!r} must lie in [1, rounds={rounds}] (the gradient flows through "
                     f"the last K of the run's rounds)")


def domain_shares(store, num_domains: int | None = None) -> np.ndarray:
  """The share of each client's examples from each domain.

  Args:
    store: the `ClientStore` (its `domain` and `counts`).
    num_domains: `D` (default: the largest domain id in the store plus one).

  Returns:
    `[C, D]` float64 shares; each row sums to 1.
  """
  dom, counts = np.asarray(store.domain), np.asarray(store.counts)
  D = int(num_domains if num_domains is not None else dom.max() + 1)
  real = np.arange(dom.shape[1])[None, :] < counts[:, None]
  shares = np.stack([((dom == d) & real).sum(1) for d in range(D)], 1).astype(np.float64)
  return shares / np.maximum(shares.sum(1, keepdims=True), 1)


def problem(builder, store, num_clients: int, cohort_size: int, strategy: str = "vmap", *, chunk_size: int = 1,
            splits: dict | None = None, num_domains: int | None = None, model=None, **engine) -> Problem:
  """The inner problem for `builder` on the client store `store`.

  Args:
    builder: an `algorithms.Builder`, or an `Algorithm`.
    store: the `ClientStore` (arrays; inputs in host memory are refused).
    num_clients: `C`.
    cohort_size: clients per round.
    strategy: a differentiable engine strategy ("vmap", "chunked", "sequential").
    chunk_size: clients per chunk ("chunked").
    splits: `{name: (x, y)}` of validation data for the objective (test splits refused).
    num_domains: `D` of `domain_shares` (default: from the store).
    model: the model, kept in the problem for objectives that need it.
    **engine: `make_round`'s keyword arguments (dropout, straggler_fraction, buckets).

  Returns:
    The `Problem`.

  Raises:
    ValueError: a strategy that cannot be differentiated, a test or unknown split, or
      inputs in host memory.
  """
  check_strategy(strategy)
  splits = dict(splits or {})
  for name in splits:
    check_split(name, f"splits[{name!r}]")
  if not isinstance(store.x, (np.ndarray, jax.Array)):
    raise ValueError(f"store.x: inputs in host memory ({type(store.x).__name__}) cannot be differentiated; "
                     "pack the clients' data as arrays (engine.host_store = False)")
  alg = as_builder(builder)(None)
  counts = np.asarray(store.counts)
  base = counts.astype(np.float64) if alg.weighting == "examples" else np.ones(len(counts))
  store = jax.tree.map(jnp.asarray, store)
  rf = make_round(builder, num_clients, cohort_size, strategy, chunk_size, **engine)
  dtype = jnp.result_type(float)
  return Problem(rf, store, jnp.asarray(base, dtype), jnp.asarray(domain_shares(store, num_domains), dtype),
                 alg.params_of, {k: tuple(jnp.asarray(a) for a in v) for k, v in splits.items()},
                 getattr(builder, "hparams", ()), strategy, model)


def from_config(config, fold=None):
  """The problem for the run `config` describes, built as the runner builds it
  (`plan.prepare`); the objective may read the fold's held-out validation domain and
  in-domain validation split.

  Args:
    config: the experiment config.
    fold: the data (default: `load_fold(config)`).

  Returns:
    `(problem, state, round_key)`: round `t` uses `fold_in(round_key, t)`; `state` is the
    run's initial `RoundState`.

  Raises:
    ValueError: a strategy that cannot be differentiated, or `engine.host_store` set.
  """
  from fedjax_dg import folds as folds_lib, plan as plan_lib
  from fedjax_dg.engine import init_round_state
  if config.engine.strategy != "auto":
    check_strategy(config.engine.strategy)
  if config.engine.get("host_store", False):
    raise ValueError("engine.host_store: inputs in host memory cannot be differentiated; set it False")
  if fold is None:
    fold = folds_lib.load_fold(config)
  s = plan_lib.prepare(config, fold)
  check_strategy(s.plan.strategy, "engine.strategy (auto)")
  stage = s.stages[0]
  e = config.engine
  val = {"heldout_val": (fold.heldout_val.x, fold.heldout_val.y), "in_val": (fold.in_val.x, fold.in_val.y)}
  p = problem(stage.builder, s.packed, s.plan.num_clients, s.plan.cohort, s.plan.strategy, chunk_size=e.chunk_size,
              splits={k: v for k, v in val.items() if len(v[1])}, num_domains=len(fold.domain_names), model=s.model,
              dropout=e.get("dropout", 0.0), straggler_fraction=e.get("straggler_fraction", 0.0))
  k_init, k_server, k_rounds = jax.random.split(jax.random.PRNGKey(config.seed), 3)
  state = init_round_state(stage.builder, k_server, s.model.init(k_init), s.plan.num_clients)
  return p, state, k_rounds


# ------------------------------------------------------------------ the outer variables


def init_meta(p: Problem, hparams=(), weights: bool = True) -> Meta:
  """The outer variables at the run's own values.

  Args:
    p: the problem.
    hparams: dotted names of the hyperparameters to differentiate (e.g. `("client.lr",
      "method.mu")`); their values come from the problem's defaults.
    weights: include the aggregation weights: zero log-multipliers and shrink 1.

  Returns:
    The `Meta`.

  Raises:
    ValueError: a name the round state does not hold.
  """
  values = {name: _lookup(p.hparams, name) for name in hparams}
  w = None
  if weights:
    dtype = p.base_weights.dtype
    w = AggregationWeights(jnp.zeros(p.base_weights.shape, dtype), jnp.zeros(p.domain_shares.shape[1], dtype),
                           jnp.ones((), dtype))
  return Meta(values, w)


def _lookup(tree, name: str):
  group, _, field = name.partition(".")
  if not isinstance(tree, dict) or group not in tree or field not in tree[group]:
    have = [f"{g}.{f}" for g, d in (tree.items() if isinstance(tree, dict) else ()) for f in d]
    raise ValueError(f"meta.hparams: unknown hyperparameter {name!r}; the round state holds {have}")
  return tree[group][field]


def check_meta(p: Problem, meta: Meta, state: RoundState) -> None:
  """One line for an outer variable the problem does not have.

  Args:
    p: the problem.
    meta: the outer variables.
    state: the round state they apply to.

  Raises:
    ValueError: client states in host memory, an unknown hyperparameter name, a weight of
      the wrong shape, a NaN or infinite value, or weights that give every client zero.
  """
  if isinstance(state.clients, HostClientStates):
    raise ValueError("state.clients: client states in host memory cannot be differentiated; "
                     "use init_round_state(host_states=False)")
  for name, v in meta.hparams.items():
    _lookup(state.hparams, name)
    _check_finite(f"meta.hparams[{name!r}]", v)
  w = meta.weights
  if w is not None:
    C, D = p.domain_shares.shape
    for field, arr, shape in (("client", w.client, (C,)), ("domain", w.domain, (D,)), ("shrink", w.shrink, ())):
      if jnp.shape(arr) != shape:
        raise ValueError(f"meta.weights.{field}: shape {jnp.shape(arr)}, expected {shape}")
      _check_finite(f"meta.weights.{field}", arr)
    if not isinstance(w.client, jax.core.Tracer) and not np.any(np.asarray(client_weights(p, w)) > 0):
      raise ValueError("meta.weights: every client's aggregation weight is zero (the base weights p_c times the "
                       "multipliers), so no update would be aggregated; give some client a positive weight")


def _check_finite(field: str, value) -> None:
  """One line for a NaN or infinite outer variable (values only; traced ones pass)."""
  if isinstance(value, jax.core.Tracer):
    return
  a = np.asarray(value, dtype=np.float64)
  if not np.isfinite(a).all():
    raise ValueError(f"{field}: must be finite, got {value!r}")


def with_hparams(state: RoundState, values: dict) -> RoundState:
  """`state` with the dotted `values` written into `state.hparams`.

  Args:
    state: the round state.
    values: `{"group.field": value}`; each value is cast to the stored dtype.

  Returns:
    The new `RoundState` (`state` itself when `values` is empty).
  """
  if not values:
    return state
  hp = {g: dict(d) for g, d in state.hparams.items()}
  for name, v in values.items():
    group, _, field = name.partition(".")
    hp[group][field] = jnp.asarray(v, hp[group][field].dtype)
  return state._replace(hparams=hp)


def client_weights(p: Problem, w: AggregationWeights):
  """Each client's aggregation weight `p_c exp(client_c) sum_d s_cd exp(domain_d)`.

  Args:
    p: the problem (its `base_weights` `p_c` and `domain_shares` `s_cd`).
    w: the `AggregationWeights`.

  Returns:
    `[C]` weights.
  """
  return p.base_weights * jnp.exp(w.client) * (p.domain_shares @ jnp.exp(w.domain))


def shrink(state: RoundState, gamma) -> RoundState:
  """The round state with the server's parameters multiplied by `gamma`.

  Args:
    state: the round state.
    gamma: the shrink factor (FedLAW's global `gamma`).

  Returns:
    The new `RoundState`.
  """
  server = state.server
  params = jax.tree.map(lambda a: (gamma * a).astype(a.dtype), server.params)
  return state._replace(server=server._replace(params=params))


# ------------------------------------------------------------------ rounds and gradients


def rounds(p: Problem, meta: Meta, state: RoundState, round_key, first, num: int, remat: bool = True):
  """The round state after `num` rounds from `state` with the outer variables `meta`.
  Differentiable in `meta` and `state`.

  Args:
    p: the problem.
    meta: the outer variables.
    state: the round state to start from.
    round_key: round `t` (counted from 0 at the run's start) uses `fold_in(round_key, t)`.
    first: the index `t` of the first of these rounds.
    num: the number of rounds (an integer >= 0).
    remat: each round is a `jax.checkpoint` (the backward pass recomputes one round at a time).

  Returns:
    The `RoundState` after the rounds.

  Raises:
    ValueError: `num` is not an integer >= 0.
  """
  if not _is_count(num) or num < 0:
    raise ValueError(f"num: the number of rounds must be an integer >= 0, got {num!r}")
  state = with_hparams(state, meta.hparams)
  w = meta.weights

  def one(st, t):
    cw = None if w is None else client_weights(p, w)
    st, _ = p.round_fn(st, p.store, jax.random.fold_in(round_key, t), cw)
    return (st if w is None else shrink(st, w.shrink)), None
  return unrolled(one, state, first + jnp.arange(num), remat)


def _value(p: Problem, objective: Objective, state: RoundState):
  data = p.splits[objective.split] if objective.split is not None else None
  return objective.fn(p.params_of(state.server), data, state)


def hypergradient(p: Problem, objective: Objective, rounds_: int, truncate: int | None = None,
                  remat: bool = True, jit: bool = True):
  """The objective after `rounds_` rounds and its gradient with respect to the outer variables.

  Args:
    p: the problem.
    objective: the outer objective.
    rounds_: the number of rounds.
    truncate: K: the gradient flows through the last K rounds only (the first
      `rounds_ - K` run forward); None: through all.
    remat: each differentiated round is a `jax.checkpoint`.
    jit: compile the whole computation as one program.

  Returns:
    `fn(meta, state, round_key, first=0) -> (value, grad, final_state)`: the objective
    after rounds `first .. first + rounds_ - 1` from `state`, and its gradient with respect
    to `meta` (a `Meta` shaped like it). `fn` checks its arguments (`check_meta`) before
    anything compiles.

  Raises:
    ValueError: a test or unknown split, a split the problem lacks, or a bad round count
      or truncation.
  """
  check_split(objective.split)
  if objective.split is not None and objective.split not in p.splits:
    raise ValueError(f"objective.split: {objective.split!r} is not among the problem's splits {sorted(p.splits)}")
  check_rounds(rounds_, truncate)
  K = rounds_ if truncate is None else int(truncate)

  def run(meta, state, round_key, first):
    if K < rounds_:  # forward only: the outer variables' effect on these rounds is dropped
      state = rounds(p, jax.lax.stop_gradient(meta), state, round_key, first, rounds_ - K, remat=False)

    def outer(m):
      final = rounds(p, m, state, round_key, first + rounds_ - K, K, remat)
      return _value(p, objective, final), final
    (value, final), grad = jax.value_and_grad(outer, has_aux=True)(meta)
    return value, grad, final
  compiled = jax.jit(run) if jit else run

  def fn(meta, state, round_key, first=0):
    check_meta(p, meta, state)
    return compiled(meta, state, round_key, jnp.asarray(first, jnp.int32))
  return fn


def one_step(p: Problem, objective: Objective, remat: bool = False, jit: bool = True):
  """The online estimator: the gradient of the objective after one round from `state`.

  Args:
    p: the problem.
    objective: the outer objective.
    remat: the round is a `jax.checkpoint`.
    jit: compile it as one program.

  Returns:
    `fn(meta, state, round_key, t) -> (value, grad, next_state)`, for round `t` alone.
  """
  h = hypergradient(p, objective, 1, remat=remat, jit=jit)
  return lambda meta, state, round_key, t: h(meta, state, round_key, t)


def validation_loss(model, split: str = "heldout_val") -> Objective:
  """The mean cross-entropy of the model on `split` (the held-out validation domain).

  Args:
    model: the model (`model.apply(params, x)`).
    split: the validation split to read.

  Returns:
    The `Objective`.
  """
  def fn(params, data, state):
    x, y = data
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y).mean()
  return Objective(fn, split)
