"""Self-describing methods: hyperparameters, client sides, server rules, and `compose`.

A method is two halves that meet in one function:

  ClientSide   what a client does with the broadcast model (its local objective and loop),
               plus whatever the client side keeps on the server (FedIIR's `g~`, AFL's
               `beta`, SCAFFOLD's `c`, FedDIM's `I_bar`) and the pre-round statistic it needs.
  ServerRule   how the server turns the cohort's updates `Delta_c` into new parameters
               (FedAvg/FedOpt's optax step, FedOMG's gradient matching, FedGMA's mask, ...).

`compose(name, client, rule)` builds the engine's `Algorithm` from any client side and any
rule whose aggregation it can feed, so `irm+omg`, `fediir+omg`, `fedprox+gma` exist without
a line written for them; a pairing that cannot work is refused with one line saying why
(a rule that needs a per-client signal the client side does not send: FedGA's rule needs
the generalisation gap).

Each method file exports `MethodSpec`s (and server rules export `RuleSpec`s): a name, a
frozen hyperparameter record whose fields carry the paper's default, the accepted range and
a random-search distribution (DomainBed's `_hparam(name, default, range)`, one level up),
a builder for its client side, its default rule, and what it sends and receives beyond the
model. Config defaults (`config.algorithm.<method>.<field>`), range checks, random search and
the documentation's tables (docs/methods/index.md) are generated from these records (`fedjax_dg/algorithms/__init__.py`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dg.algorithms.base import Algorithm, ClientOutput, ServerRule, Stacked, rule_deviation


# ---------------------------------------------------------------------------------------------
# Hyperparameters


@dataclasses.dataclass(frozen=True)
class LogUniform:
  """`exp(U(log lo, log hi))`, DomainBed's `10 ** uniform(...)`."""
  lo: float
  hi: float

  def __call__(self, rng: np.random.Generator):
    return float(math.exp(rng.uniform(math.log(self.lo), math.log(self.hi))))


@dataclasses.dataclass(frozen=True)
class Uniform:
  lo: float
  hi: float

  def __call__(self, rng: np.random.Generator):
    return float(rng.uniform(self.lo, self.hi))


@dataclasses.dataclass(frozen=True)
class Choice:
  values: tuple

  def __call__(self, rng: np.random.Generator):
    return self.values[int(rng.integers(len(self.values)))]


def hparam(default, doc: str = "", *, ge=None, gt=None, le=None, lt=None, choices=None, integer: bool = False,
           search=None, static: bool | None = None):
  """A hyperparameter field of a method's (or rule's) frozen dataclass record.

  Its default, accepted range and random-search distribution become the config default
  (`config.algorithm.<method>.<field>`), its range check and its sweep distribution.

  Args:
    default: the paper's value.
    doc: what the field means (and where its default comes from), for the docs' tables.
    ge: accepted values are `>= ge` (None: no such bound).
    gt: accepted values are `> gt`.
    le: accepted values are `<= le`.
    lt: accepted values are `< lt`.
    choices: the accepted values, instead of bounds.
    integer: the value must be an integer.
    search: a random-search distribution (`LogUniform`, `Uniform`, `Choice`), or None:
      random search leaves the field at its default.
    static: whether the value decides the compiled program (a step count, a width, a
      choice, a share of the data split off before training) rather than being a number
      read when the round runs. None (default): a float without `choices` is a run-time
      value (it lives in the round state's `hparams`, `continuous`) and anything else is
      static.

  Returns:
    A `dataclasses.field` carrying the above as metadata.
  """
  meta = dict(doc=doc, ge=ge, gt=gt, le=le, lt=lt, choices=choices, integer=integer, search=search, static=static)
  return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class NoHParams:
  """A method without hyperparameters of its own."""


def range_text(m) -> str:
  """The accepted values of a hyperparameter field's metadata `m`, as the docs and errors say them."""
  if m["choices"] is not None:
    return "one of " + ", ".join(map(str, m["choices"]))
  lo = f"[{m['ge']}" if m["ge"] is not None else f"({m['gt']}" if m["gt"] is not None else None
  hi = f"{m['le']}]" if m["le"] is not None else f"{m['lt']})" if m["lt"] is not None else None
  if lo and hi:
    return f"in {lo}, {hi}"
  if lo:
    return (">= " if lo[0] == "[" else "> ") + lo[1:]
  if hi:
    return ("<= " if hi[-1] == "]" else "< ") + hi[:-1]
  return "any value"


def hparam_error(field: dataclasses.Field, value, path: str) -> str | None:
  """The one-line error for `value` of `field` (config path `path`), or None if accepted."""
  m = field.metadata
  if m.get("choices") is not None:
    return None if value in m["choices"] else f"{path} must be {range_text(m)}; got {value!r}"
  if isinstance(field.default, bool):
    return None if isinstance(value, bool) else f"{path} must be True or False, got {value!r}"
  if isinstance(field.default, (int, float)):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
      return f"{path} must be a finite number, got {value!r}"
    if m.get("integer") and int(value) != value:
      return f"{path} must be an integer, got {value!r}"
    ok = ((m["ge"] is None or value >= m["ge"]) and (m["gt"] is None or value > m["gt"])
          and (m["le"] is None or value <= m["le"]) and (m["lt"] is None or value < m["lt"]))
    return None if ok else f"{path} must be {range_text(m)}, got {value}"
  return None


def hparam_fields(cls) -> tuple[dataclasses.Field, ...]:
  return dataclasses.fields(cls)


def continuous(field: dataclasses.Field) -> bool:
  """A run-time value (read from the round state when the round runs), not a static one."""
  m = field.metadata
  if m.get("static") is not None:
    return not m["static"]
  return (isinstance(field.default, float) and not isinstance(field.default, bool) and m.get("choices") is None
          and not m.get("integer"))


def run_time_values(hp) -> dict:
  """`{field: value}` of a record's continuous fields (the part that goes into the state)."""
  return {f.name: getattr(hp, f.name) for f in hparam_fields(type(hp)) if continuous(f)}


def with_values(hp, values):
  """The record `hp` with its continuous fields replaced by `values` (arrays, tracers)."""
  return dataclasses.replace(hp, **values) if values else hp


def defaults(cls) -> dict:
  return {f.name: f.default for f in hparam_fields(cls)}


def sample(cls, rng: np.random.Generator) -> dict:
  """Random-search values of every field that declares a `search` distribution."""
  return {f.name: f.metadata["search"](rng) for f in hparam_fields(cls) if f.metadata.get("search")}


def read(cls, values, path: str):
  """The record `cls(**values)`, every field checked; `values` a mapping (a ConfigDict)."""
  values = dict(values)
  names = {f.name for f in hparam_fields(cls)}
  unknown = sorted(set(values) - names)
  if unknown:
    raise ValueError(f"{path}.{unknown[0]}: unknown field; {path} has {sorted(names) or 'no fields'}")
  for f in hparam_fields(cls):
    if f.name in values:
      err = hparam_error(f, values[f.name], f"{path}.{f.name}")
      if err:
        raise ValueError(err)
  kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in values.items()}
  return cls(**kw)


# ---------------------------------------------------------------------------------------------
# What a builder gets


SEED_FIELDS = ("seed", "data.seed")


class RunTimeValueError(ValueError):
  """A builder read a number that differs between the runs of one compiled program."""


class _RunTimeValue:
  """A continuous hyperparameter or a seed seen through `StaticView`: it may be compared with
  0 (whether momentum or weight decay is present decides the program, and the runs of a batch
  agree on it), any other use raises one line naming the field."""
  __slots__ = ("_path", "_zero", "_why")

  def __init__(self, path: str, value, why: str):
    self._path, self._why = path, why
    self._zero = None if value is None else value == 0

  def _refuse(self, *_):
    raise RunTimeValueError(f"{self._path} was read by a method's builder from ctx.config; {self._why}")

  def _compare(op):  # pylint: disable=no-self-argument
    def compare(self, other):
      if isinstance(other, (int, float)) and other == 0 and self._zero is not None:
        return op(0 if self._zero else 1, 0)  # the sign is all that is known: the value is >= 0
      self._refuse()
    return compare

  import operator as _op
  __eq__, __ne__ = _compare(_op.eq), _compare(_op.ne)
  __gt__, __ge__, __lt__, __le__ = _compare(_op.gt), _compare(_op.ge), _compare(_op.lt), _compare(_op.le)
  del _op, _compare
  __hash__ = None
  __float__ = __int__ = __index__ = __bool__ = __round__ = __abs__ = __neg__ = __pos__ = _refuse
  __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refuse
  __pow__ = __rpow__ = __floordiv__ = __rfloordiv__ = __mod__ = __format__ = _refuse
  __array__ = __jax_array__ = _refuse

  def __repr__(self):
    return f"<run-time value {self._path}>"


class StaticView:
  """A read-only view of a run's config for method builders: what decides the compiled program.

  A builder runs once per compiled program, and the runs of a batch share that program
  while their seeds and continuous hyperparameters differ. Reading one of those numbers
  from the config would build every run of the batch with run 0's value, so this view
  refuses it: `ctx.config.<path>` of a seed or of a continuous hyperparameter (the
  optimizers' `lr`, `momentum`, `weight_decay`, `b1`, `b2`, `eps`; the method's and rule's
  float fields in `config.algorithm`) raises `RunTimeValueError` naming the field and
  where to read it instead. Comparing such a field with 0 is allowed (the runs of a batch
  agree on it). Every other field reads as in the config; nothing can be written.

  Args:
    config: the run's `ml_collections.ConfigDict`.
    run_time: `{dotted path: where to read it instead}` of the refused fields.
    prefix: the dotted path of this node (internal).
  """
  __slots__ = ("_node", "_run_time", "_prefix")

  def __init__(self, config, run_time: dict, prefix: str = ""):
    object.__setattr__(self, "_node", config)
    object.__setattr__(self, "_run_time", run_time)
    object.__setattr__(self, "_prefix", prefix)

  def _wrap(self, key: str, value):
    path = self._prefix + key
    if path in self._run_time:  # a seed is no switch: not even its comparison with 0 is allowed
      zero_ok = isinstance(value, (int, float)) and path not in SEED_FIELDS
      return _RunTimeValue(path, value if zero_ok else None, self._run_time[path])
    if hasattr(value, "items"):
      return StaticView(value, self._run_time, path + ".")
    return value

  def __getattr__(self, key: str):
    if key.startswith("__"):
      raise AttributeError(key)
    return self._wrap(key, getattr(self._node, key))

  def __getitem__(self, key: str):
    return self._wrap(key, self._node[key])

  def get(self, key: str, default=None):
    return self._wrap(key, self._node.get(key, default))

  def __contains__(self, key) -> bool:
    return key in self._node

  def keys(self):
    return self._node.keys()

  def items(self):
    return [(k, self[k]) for k in self._node.keys()]

  def to_dict(self) -> dict:
    return {k: (v.to_dict() if isinstance(v, StaticView) else v) for k, v in self.items()}

  def __setattr__(self, key, value):
    raise AttributeError(f"{self._prefix}{key}: a method's builder cannot change the config")

  __setitem__ = __setattr__

  def __repr__(self):
    return f"StaticView({self._prefix or 'config'})"


class Context(NamedTuple):
  """Everything a client side or rule may need, fixed before anything compiles.

  Attributes:
    model: the `fedjax_dg.models.Model` (after the method's `model` transform).
    sched: the local loop's `LocalSchedule`.
    client_opt: the configured local optimizer (optax), its numbers read when the round runs.
    config: the experiment config. A builder sees it through `StaticView`: reading a seed
      or a continuous hyperparameter there raises, since a batch's runs differ in them;
      read your own hyperparameters from `hp` and the optimizers' numbers with
      `client_value` / `server_value`.
    num_clients: clients holding training data.
    cohort_size: clients per round.
    num_domains: domains of the data set.
    train_domains: the training domains.
    store: the training `ClientStore`. Only a method's `prepare` reads it; a builder gets
      None and reads what `prepare` made of it in `prepared`.
    tune_store: each client's held-out tuning rows (`MethodSpec.tune_fraction`); for
      `prepare` only, like `store`.
    heldout_val: `(x, y)` of the held-out validation domain (never the test domain); for
      `prepare` only, like `store`.
    values: the run-time values of this build: `{"client": {lr, momentum, ...}, "server":
      {lr, ...}, "method": {...}, "rule": {...}}` (arrays, traced inside the round).
    prepared: what the method's (for a rule: the rule's; for a later stage: the stage's)
      `prepare` computed from the run's data, once per run, outside any trace; None when it
      has none.
  """
  model: Any
  sched: Any
  client_opt: Any
  config: Any
  num_clients: int = 1
  cohort_size: int = 1
  num_domains: int = 1
  train_domains: tuple = ()
  store: Any = None
  tune_store: Any = None
  heldout_val: Any = None
  values: Any = None
  prepared: Any = None

  def client_value(self, name: str):
    """`client.<name>` as this build reads it (a run-time value)."""
    return self.values["client"][name] if self.values else self.config.client[name]

  def server_value(self, name: str):
    """`server.<name>` as this build reads it (a run-time value): `server.lr` is `eta_g`."""
    return self.values["server"][name] if self.values else self.config.server[name]

  @property
  def num_classes(self) -> int:
    return self.model.module.classifier.num_classes

  def feature_dim(self) -> int:
    params = jax.eval_shape(self.model.init, jax.random.PRNGKey(0))
    return jax.eval_shape(self.model.features, params, jnp.zeros((1,) + self.model.input_shape)).shape[-1]


# ---------------------------------------------------------------------------------------------
# The two halves


class ClientSide(NamedTuple):
  """A method's client half.

  Attributes:
    update: `(params, extra, client_state, data, rng) -> ClientOutput(message, state,
      metrics)`. `message` is `Delta_c` (a pytree shaped like the trained parameters), or
      `(Delta_c, side_message)` when the client side has a `side_update` or `provides` a
      per-client signal to the rule.
    init: `(params) -> client_state`, persistent per-client state (default none).
    side_init: `(rng, params) -> side_state`, what the client side keeps on the server.
    side_update: `(side_state, mean_side_message, round) -> side_state`, after the server rule.
    broadcast: `(side_state, round) -> extra`, sent with the parameters (None: nothing).
    stat: `(params, extra, client_state, data, rng)`, an optional pre-round statistic at
      the global model.
    prepare: `(side_state, mean_stat, round) -> side_state`, consumes the uniform mean of `stat`.
    nets_init: `(rng, params) -> trained`, what the rule trains (FedADG: model and generator).
    params_of: `(trained) -> params`, the model part of `nets_init`'s result.
    weighting: "examples" or "uniform" aggregation weights.
    provides: per-client signals in the side message that a rule may need (FedGA's rule
      reads "generalisation_gap").
    report: `(new_params, extra, client_state, data, rng)`, an optional post-round report at
      the aggregated model.
    finish: `(side_state, aggregate, round) -> side_state`, consumes `report`'s aggregate.
    report_aggregation: "mean" or "stack", how `report` is aggregated.
    stat_aggregation: "mean" or "stack", how `stat` is aggregated.
    objective: the client objective factory `(params, extra) -> objective(params, batch,
      rng) -> (loss, aux)`, set by `fedavg.objective_client`; when present, building the
      method checks once that the loss ignores the padded rows of a batch
      (`base.check_padding`). None: the client side runs its own loop and masks itself.
  """
  update: Callable
  init: Callable = lambda params: ()
  side_init: Callable = lambda rng, params: ()
  side_update: Callable | None = None
  broadcast: Callable | None = None
  stat: Callable | None = None
  prepare: Callable | None = None
  nets_init: Callable | None = None
  params_of: Callable | None = None
  weighting: str = "examples"
  provides: tuple[str, ...] = ()
  report: Callable | None = None
  finish: Callable | None = None
  report_aggregation: str = "mean"
  stat_aggregation: str = "mean"
  objective: Callable | None = None

  @property
  def sends_side(self) -> bool:
    return self.side_update is not None or bool(self.provides)


class ServerState(NamedTuple):
  """A composed method's server state. Attributes of the client side's server state read
  through (`state.g_tilde` is `state.side.g_tilde`)."""
  params: Any     # what the rule updates: the model (FedADG: model and generator)
  opt_state: Any  # the server rule's state
  side: Any = ()  # the client side's server state
  round: Any = 0  # rounds completed

  def __getattr__(self, name):
    if name.startswith("_") or name in ServerState._fields:
      raise AttributeError(name)
    return getattr(self.side, name)


def _weighted_mean(tree, w):
  tot = jnp.maximum(jnp.sum(w), 1e-12)
  return jax.tree.map(lambda a: jnp.tensordot(w.astype(a.dtype), a, axes=1) / tot, tree)


def compose(name: str, client: ClientSide, rule: ServerRule) -> Algorithm:
  """The algorithm `client` + `rule`: the engine's `Algorithm` from any client side and any
  rule whose aggregation it can feed.

  Args:
    name: the `algorithm.name` (for the result and the error).
    client: the method's client half.
    rule: the server rule.

  Returns:
    The `Algorithm`, whose server state is a `ServerState(params, opt_state, side, round)`.

  Raises:
    ValueError: the rule needs a per-client signal (`rule.needs`) the client side does not
      send (`client.provides`).
  """
  for need in rule.needs:
    if need not in client.provides:
      raise ValueError(f"algorithm.name={name!r}: server rule {rule.name!r} needs the clients' {need}, "
                       f"which this method's clients do not send")
  weighting = rule.weighting or client.weighting
  has_extra = client.broadcast is not None

  def server_init(rng, params):
    trained = client.nets_init(rng, params) if client.nets_init else params
    return ServerState(trained, rule.init(trained), client.side_init(rng, params), jnp.asarray(0, jnp.int32))

  def broadcast(s: ServerState):
    return (s.params, client.broadcast(s.side, s.round)) if has_extra else s.params

  def split(b):
    return b if has_extra else (b, ())

  def client_update(b, client_state, data, rng):
    params, extra = split(b)
    return client.update(params, extra, client_state, data, rng)

  def mean_update(aggregate):
    """The plain weighted average of the updates `Delta_c` in what the rule receives."""
    if rule.aggregation == "stack":
      deltas = aggregate.messages[0] if client.sends_side else aggregate.messages
      return _weighted_mean(deltas, aggregate.weights)
    return aggregate[0] if client.sends_side else aggregate

  def server_activity(s: ServerState, aggregate, new: ServerState):
    """`activity/rule_deviation`: the rule's step against the plain average (`base.rule_deviation`)."""
    return {"activity/rule_deviation": jax.lax.stop_gradient(rule_deviation(s.params, new.params,
                                                                            mean_update(aggregate)))}

  def server_update(s: ServerState, aggregate) -> ServerState:
    if rule.aggregation == "stack":
      msgs, w = aggregate.messages, aggregate.weights
      if client.sends_side:
        (deltas, side_msgs) = msgs
        side_w = w if client.weighting == weighting else (w > 0).astype(w.dtype)
        mean_side = _weighted_mean(side_msgs, side_w)
        aggregate = Stacked(deltas, w, side_msgs)
      else:
        mean_side = ()
    else:
      aggregate, mean_side = aggregate if client.sends_side else (aggregate, ())
    params, rule_state = rule.apply(s.opt_state, s.params, aggregate)
    side = client.side_update(s.side, mean_side, s.round) if client.side_update else s.side
    return ServerState(params, rule_state, side, s.round + 1)

  def phase(on_client, on_server):
    """An optional exchange (`stat`/`prepare`, `report`/`finish`) in the engine's contract."""
    if on_client is None:
      return None, None

    def client_fn(b, client_state, data, rng):
      params, extra = split(b)
      return on_client(params, extra, client_state, data, rng)

    def server_fn(s: ServerState, aggregate) -> ServerState:
      return s._replace(side=on_server(s.side, aggregate, s.round))
    return client_fn, server_fn

  stat, prepare = phase(client.stat, client.prepare)
  report, finish = phase(client.report, client.finish)

  params_of = (lambda s: client.params_of(s.params)) if client.params_of else (lambda s: s.params)
  return Algorithm(name=name, server_init=server_init, client_init=client.init, broadcast=broadcast,
                   client_update=client_update, server_update=server_update, params_of=params_of,
                   aggregation=rule.aggregation, weighting=weighting, client_stat=stat, server_prepare=prepare,
                   client_report=report, server_finish=finish, report_aggregation=client.report_aggregation,
                   stat_aggregation=client.stat_aggregation, server_activity=server_activity)


def delta(new, old):
  """`Delta_c = theta_c - theta`."""
  return jax.tree.map(lambda a, b: a - b, new, old)


def send(params, global_params, state, metrics, side=None) -> ClientOutput:
  """The usual client output: `Delta_c`, with `side` appended when given."""
  d = delta(params, global_params)
  return ClientOutput(message=d if side is None else (d, side), state=state, metrics=metrics)


# ---------------------------------------------------------------------------------------------
# Specs


@dataclasses.dataclass(frozen=True)
class RuleSpec:
  """A server rule, registered with `fedjax_dg.register_rule`.

  Its hyperparameters live under `config.algorithm.<name>` (FedOMG's `kappa`, FedGMA's
  `tau`); `server.*` holds the server optimizer's shared fields (`server.lr` is `eta_g` for
  every rule).

  Attributes:
    name: the rule's name: `algorithm.name` is `<method>+<name>`.
    build: `(ctx, hp) -> ServerRule`.
    hparams: a frozen dataclass of `hparam` fields (default: none).
    doc: one line for the docs' table of rules.
    sends: what the rule sends clients beyond the model.
    receives: what the rule needs from clients beyond their updates.
    prepare: optional `(ctx, hp) -> constants`: the rule's data-derived constants, computed
      once per run outside any trace and read by `build` as `ctx.prepared`.
  """
  name: str
  build: Callable
  hparams: type = NoHParams
  doc: str = ""
  sends: tuple[str, ...] = ()
  receives: tuple[str, ...] = ()
  prepare: Callable | None = None
  activity: tuple[str, ...] = ()  # activity records the rule's server step emits (`activity/<name>`)


@dataclasses.dataclass(frozen=True)
class Stage:
  """One stage of a multi-stage method after the first (FedLOE's stage 2).

  Attributes:
    name: the stage's name.
    build: `(ctx, hp) -> Algorithm`, whose `server_init(rng, params)` starts from the
      previous stage's parameters.
    rounds: `(config, hp) -> int`, the number of rounds of this stage.
    prepare: optional `(ctx, hp) -> constants`: the stage's data-derived constants
      (`ctx.prepared`).
    eval_every: optional `(config, hp) -> int`: the stage is evaluated every that many of
      its rounds and at its end (None: every `config.eval_every` rounds of the run).
  """
  name: str
  build: Callable
  rounds: Callable
  prepare: Callable | None = None
  eval_every: Callable | None = None


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  """One method, registered with `fedjax_dg.register_method`.

  Config defaults, range checks, random search, the compositions with every server rule
  and the documentation's tables are generated from this record.

  Attributes:
    name: the `algorithm.name` it answers to (no '+').
    paper: the paper (and the section the formulas come from).
    client: `(ctx: Context, hp) -> ClientSide`, the builder of its client half.
    hparams: a frozen dataclass of `hparam` fields; values come from
      `config.algorithm.<config_key>`.
    config_key: the config block's name, when it differs from `name`.
    rule: the default server rule's name (`"fedavg"`, `"omg"`, ...).
    sends: what travels from a client besides the model update.
    receives: what travels to a client besides the model.
    leaks_data: whether anything computed per example leaves a client.
    group: the benchmark table's row group (Bai, Bagchi and Inouye, "Benchmarking
      Algorithms for Federated Domain Generalization", ICLR 2024, Table 3).
    model: optional `(model, hp) -> model` (FedSR's probabilistic featurizer).
    check: optional `(config, hp) -> error line or None`, for what the method needs of the
      rest of the config (a linear head, plain SGD).
    centralised: True for centralised ERM: one client holding all training data.
    tune_fraction: optional `hp -> fraction`: each client holds out that share of its rows
      as a tuning split (`ctx.tune_store`).
    stages: optional `hp -> (Stage, ...)` after the first stage (FedLOE's stage 2).
    first_stage: optional `(config, hp, steps_per_round) -> (rounds, local_steps)`: the
      first stage's own communication schedule within the run's budget of
      `config.num_rounds * steps_per_round` local steps (FedLOE's infrequent
      synchronisation); None: the config's rounds and local schedule.
    setup_bytes: optional `(ctx, hp) -> bytes` of a one-off exchange before training.
    composable: False for a whole algorithm that takes no other server rule.
    not_for_text: why the method does not apply to text data (None: it applies).
    not_for_models: `((model name, why), ...)`: models the method does not apply to.
    pretrained: optional `(params, load) -> params`: where a pretrained backbone goes in the
      method's parameters (`load(params)` fills a plain model's featurizer).
    record: optional `server_state -> dict`: extra fields for each evaluation record.
    claim: who claims the method beats FedAvg (the paper, as the report names it); the
      benchmark report tests that claim in every federated column ("": none).
    prepare: optional `(ctx, hp) -> constants`: what the method computes from the run's
      data (`ctx.store`, `ctx.tune_store`, `ctx.heldout_val`) and seeds before training,
      once per run and outside any trace; its builder reads the result as `ctx.prepared`
      (FedDG's amplitude bank). Only `prepare` sees the data and the seeds: the builder's
      context has neither.
    activity: the activity records its clients emit as metrics `activity/<name>`: how much
      the method's own term acted (docs/activity.md); the server rule's are the rule's
      `RuleSpec.activity`.
  """
  name: str
  paper: str
  client: Callable
  hparams: type = NoHParams
  config_key: str | None = None
  rule: str = "fedavg"
  sends: tuple[str, ...] = ()
  receives: tuple[str, ...] = ()
  leaks_data: bool = False
  group: str = "FL"
  model: Callable | None = None
  check: Callable | None = None
  centralised: bool = False
  tune_fraction: Callable | None = None
  stages: Callable | None = None
  first_stage: Callable | None = None
  setup_bytes: Callable | None = None
  composable: bool = True
  not_for_text: str | None = None
  not_for_models: tuple = ()
  pretrained: Callable | None = None
  record: Callable | None = None
  claim: str = ""
  prepare: Callable | None = None
  activity: tuple[str, ...] = ()

  def not_for_model(self, model_name: str) -> str | None:
    return dict(self.not_for_models).get(model_name)

  @property
  def key(self) -> str:
    return self.config_key or self.name
