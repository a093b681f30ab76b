"""The method registry: one line per method file. Everything else here is generated from
the specs (`spec.py`): config defaults, range checks, random search, the documentation's tables (docs/methods/index.md).

`algorithm.name` is a method (`fediir`) or a method and a server rule (`fediir+omg`,
`irm+omg`, `fedprox+gma`, `fedprox+adam`): the method's clients with that rule.
"""
from __future__ import annotations

import dataclasses

import jax
import ml_collections
import numpy as np

from fedjax_dg.algorithms import (afl, dg, fedadg, fedavg, feddg, feddim, fedga, fedgma, fediir, fedloe, fedomg,
                                  fedprox, fedsam, fedsr, fish, groupdro, learned, scaffold)
import jax.numpy as jnp

from fedjax_dg.algorithms.base import (Algorithm, ClientOutput, Stacked, check_padding, make_optimizer, make_schedule,
                                       optimizer_values)
from fedjax_dg.algorithms.spec import (SEED_FIELDS, ClientSide, Context, MethodSpec, RuleSpec, StaticView, compose, continuous,
                                       defaults, hparam_fields, read, run_time_values, sample, with_values)

METHODS: dict[str, MethodSpec] = {}
RULES: dict[str, RuleSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
  """Adds a method: `config.algorithm.name = spec.name` then builds it, alone or with any
  server rule (`<name>+<rule>`), and `config.algorithm.<spec.key>` holds its
  hyperparameters. Exported as `fedjax_dg.register_method`; a method file in the package
  needs this one line in `fedjax_dg/algorithms/__init__.py`.

  Registering a name again replaces the method. When the method is built (`Builder`), its
  client objective is checked once for reading padded rows (`base.check_padding`).

  Args:
    spec: the method's record.

  Returns:
    `spec`, so the call can decorate or assign.

  Raises:
    ValueError: the name holds '+', which joins a method and a server rule.
  """
  if "+" in spec.name:
    raise ValueError(f"method name {spec.name!r}: '+' joins a method and a server rule")
  METHODS[spec.name] = spec
  return spec


def register_rule(rule: RuleSpec) -> RuleSpec:
  """Adds a server rule: `config.algorithm.name = "<method>+<rule.name>"` then runs any
  composable method's clients with it, and `config.algorithm.<rule.name>` holds its
  hyperparameters. Exported as `fedjax_dg.register_rule`.

  Registering a name again replaces the rule. `compose` refuses, when a method is built,
  a rule whose `needs` the method's clients do not provide.

  Args:
    rule: the rule's record: `RuleSpec(name, build)` with `build(ctx, hp) -> ServerRule`.

  Returns:
    `rule`, so the call can decorate or assign.

  Raises:
    ValueError: the name is empty or holds '+'.
  """
  if not isinstance(rule.name, str) or not rule.name or "+" in rule.name:
    raise ValueError(f"server rule name {rule.name!r}: a non-empty name without '+' ('+' joins a method and a rule)")
  RULES[rule.name] = rule
  return rule


for _spec in (*fedavg.SPECS, fedprox.SPEC, scaffold.SPEC, fedsam.SPEC, fedomg.SPEC, fediir.SPEC, feddim.SPEC,
              fedga.SPEC, fedloe.SPEC, *dg.SPECS, fish.SPEC, groupdro.SPEC, afl.SPEC, fedsr.SPEC, feddg.SPEC,
              fedadg.SPEC, fedgma.SPEC, learned.SPEC):
  register(_spec)
for _rule in (*fedavg.RULES, fedomg.RULE, fedgma.RULE, fedga.RULE, learned.RULE):
  register_rule(_rule)

# The methods the documentation, the tests and the sweeps list: every registered method and the
# compositions the method papers report (Nguyen et al. 2025 Table 2; FedIIR+OMG and FedSR+OMG).
COMPOSITIONS = ("fedprox+omg", "fedsam+omg", "fediir+omg", "fedsr+omg")
ALGORITHMS = tuple(METHODS) + COMPOSITIONS
BAI_FIG2 = ("fedavg", "feddg", "fedadg", "fedsr")  # Bai et al. 2024, App. E i: the methods of their Fig. 2
BASELINE = "fedavg"  # the method others are compared with (Bai et al. 2024 Remark 4.1: FedAvg-ERM)


def resolve(name: str) -> tuple[MethodSpec, RuleSpec]:
  """`name` -> (method, server rule); a one-line error for an unknown method or rule."""
  base, _, rule = name.partition("+")
  if base not in METHODS:
    raise ValueError(f"algorithm.name: unknown algorithm {name!r}; choose one of {list(METHODS)}, "
                     f"optionally followed by '+<rule>' with a rule in {list(RULES)}")
  spec = METHODS[base]
  if rule and rule not in RULES:
    raise ValueError(f"algorithm.name: unknown server rule {rule!r} in {name!r}; choose one of {list(RULES)}")
  if rule and not spec.composable:
    raise ValueError(f"algorithm.name: {base!r} takes no other server rule")
  return spec, RULES[rule or spec.rule]


def default_hparams() -> ml_collections.ConfigDict:
  """`config.algorithm`: `name`, and one block of defaults per method and rule with fields."""
  c = ml_collections.ConfigDict()
  c.name = "fedavg"
  for owner in (*METHODS.values(), *RULES.values()):
    key = owner.key if isinstance(owner, MethodSpec) else owner.name
    if hparam_fields(owner.hparams) and key not in c:
      c[key] = ml_collections.ConfigDict(defaults(owner.hparams))
  return c


def hparams_of(config, owner):
  """The checked hyperparameter record of a method or rule from `config.algorithm`."""
  key = owner.key if isinstance(owner, MethodSpec) else owner.name
  return read(owner.hparams, config.algorithm.get(key, {}), f"algorithm.{key}")


def validate(config) -> None:
  """The method's and its rule's fields, and what the method needs of the config."""
  spec, rule = resolve(config.algorithm.name)
  hp = hparams_of(config, spec)
  hparams_of(config, rule)
  err = spec.check(config, hp) if spec.check else None
  if err:
    raise ValueError(err)


def sample_hparams(name: str, rng: np.random.Generator) -> dict:
  """Random-search values (DomainBed-style) of `name`'s method and rule, as dotted config
  overrides: `{"algorithm.fedprox.mu": 0.0031, ...}`."""
  spec, rule = resolve(name)
  out = {}
  for owner, key in ((spec, spec.key), (rule, rule.name)):
    out.update({f"algorithm.{key}.{k}": v for k, v in sample(owner.hparams, rng).items()})
  return out


def spec_of(config) -> MethodSpec:
  return resolve(config.algorithm.name)[0]


def model_for(config, model):
  """The model a method trains (FedSR's probabilistic version), otherwise `model`."""
  spec = spec_of(config)
  return spec.model(model, hparams_of(config, spec)) if spec.model else model


def context(config, model, sched, num_clients: int, cohort_size: int, num_domains: int = 1, train_domains=None,
            store=None, tune_store=None, heldout_val=None) -> Context:
  """`heldout_val`: `(x, y)` of the held-out validation domain, for rules that learn on it."""
  return Context(model, sched, make_optimizer(config.client), config, num_clients, cohort_size, num_domains,
                 tuple(train_domains if train_domains is not None else range(num_domains)), store, tune_store,
                 heldout_val)


def run_time_fields(config) -> dict:
  """`{dotted config path: group}` of every number a run reads when its round runs (the
  round state's `hparams`: `hyperparameters(config)`), group one of "client", "server",
  "method", "rule". Runs that differ only in these (and in seeds) share one program."""
  spec, rule = resolve(config.algorithm.name)
  out = {f"client.{f}": "client" for f in optimizer_values(config.client)}
  out.update({f"server.{f}": "server" for f in optimizer_values(config.server) if f != "weight_decay"})
  for owner, key, group in ((spec, spec.key, "method"), (rule, rule.name, "rule")):
    out.update({f"algorithm.{key}.{f.name}": group for f in hparam_fields(owner.hparams) if continuous(f)})
  return out


def static_view(config) -> StaticView:
  """`config` as a method's builder sees it: seeds and run-time numbers refused (`StaticView`)."""
  where = {"client": "read it with ctx.client_value(name) (or use ctx.client_opt)",
           "server": "read it with ctx.server_value(name)",
           "method": "read it from the method's hyperparameter record `hp`",
           "rule": "read it from the rule's hyperparameter record `hp`"}
  why = lambda group: (f"it is a run-time value that differs between the runs of one compiled program: {where[group]}, "
                       "never from ctx.config")
  refused = {path: why(group) for path, group in run_time_fields(config).items()}
  refused.update({path: ("each run of a batch has its own seeds: compute what depends on a seed in the method's "
                         "`prepare(ctx, hp)`, which sees the run's own config")
                  for path in SEED_FIELDS})
  return StaticView(config, refused)


def reads_data(config) -> bool:
  """Whether the method (a stage of it, or its rule) computes constants from the run's data
  or seeds before training (`prepare`): its compiled program then holds them, so a batch's
  runs share it only when their data and seeds are equal."""
  spec, rule = resolve(config.algorithm.name)
  stages = spec.stages(hparams_of(config, spec)) if spec.stages else ()
  return spec.prepare is not None or rule.prepare is not None or any(st.prepare is not None for st in stages)


def hyperparameters(config) -> dict:
  """The run's continuous hyperparameters as the round state holds them (`RoundState.hparams`):
  `{"client": {lr, momentum, weight_decay, b1, b2, eps}, "server": {lr, momentum, b1, b2, eps},
  "method": {...}, "rule": {...}}`, every value a scalar array (float32; float64 under x64).
  Everything else in the config is static: it decides the compiled program."""
  spec, rule = resolve(config.algorithm.name)
  server = optimizer_values(config.server)
  server.pop("weight_decay")
  tree = {"client": optimizer_values(config.client), "server": server,
          "method": run_time_values(hparams_of(config, spec)), "rule": run_time_values(hparams_of(config, rule))}
  return {k: {f: jnp.asarray(v, dtype=jnp.result_type(float)) for f, v in d.items()} for k, d in tree.items()}


class Builder:
  """`builder(values) -> Algorithm`: the method `ctx.config` names, built with the run-time
  hyperparameters `values` (`hyperparameters(config)`'s tree, arrays or tracers; None: the
  config's). The engine calls it inside the traced round with the round state's `hparams`,
  so every number in that tree is read when the round runs.

  Construction runs the method's (its rule's, or the stage's) `prepare` once, outside any
  trace, on the run's full context (data and config); every later build passes the method
  a context without the data and with the config seen through `static_view`, so a builder
  cannot bake a run's seed or its continuous hyperparameters into a program that a batch's
  runs share.

  Attributes:
    hparams: the config's run-time values (`hyperparameters(config)`).
    hp, rule_hp: the method's and rule's hyperparameter records.
    stage: a later stage (FedLOE's stage 2) built instead of the first, or None.
    ctx: the context every build passes on (the config's static view, no data).
    source_ctx: the whole context the builder was made from (data and config), for
      `later_stages`.
  """

  def __init__(self, ctx: Context, stage=None):
    config = ctx.config
    self.config, self.stage = config, stage
    self.hparams = hyperparameters(config)
    self.spec, self.rule = resolve(config.algorithm.name)
    self.hp, self.rule_hp = hparams_of(config, self.spec), hparams_of(config, self.rule)
    self._setup_bytes = self.spec.setup_bytes(ctx, self.hp) if self.spec.setup_bytes else 0
    owner = stage if stage is not None else self.spec
    self._prepared = owner.prepare(ctx, self.hp) if owner.prepare else None  # once, outside any trace
    self._rule_prepared = self.rule.prepare(ctx, self.rule_hp) if stage is None and self.rule.prepare else None
    self.source_ctx = ctx  # the whole context (data, config) the builder was made from
    self.ctx = ctx._replace(config=static_view(config), store=None, tune_store=None, heldout_val=None)
    if stage is None and not _in_package(self.spec):  # once, outside any trace, with the config's values
      label_shape = tuple(ctx.store.y.shape[2:]) if ctx.store is not None else ()
      padding_check(self.spec.name, self._client_side(self.hparams), self.ctx, label_shape)

  def _client_side(self, values):
    ctx = self.ctx._replace(client_opt=make_optimizer(self.config.client, values=values["client"]), values=values,
                            prepared=self._prepared)
    return self.spec.client(ctx, with_values(self.hp, values["method"]))

  def __call__(self, values=None) -> Algorithm:
    values = self.hparams if values is None else values
    ctx = self.ctx._replace(client_opt=make_optimizer(self.config.client, values=values["client"]), values=values)
    hp, rule_hp = with_values(self.hp, values["method"]), with_values(self.rule_hp, values["rule"])
    if self.stage is not None:
      return self.stage.build(ctx._replace(prepared=self._prepared), hp)
    spec, rule = self.spec, self.rule
    alg = compose(self.config.algorithm.name, self._client_side(values),
                  rule.build(ctx._replace(prepared=self._rule_prepared), rule_hp))
    return alg._replace(sends=spec.sends + rule.sends, receives=spec.receives + rule.receives,
                        leaks_data=spec.leaks_data, setup_bytes=self._setup_bytes)


def _in_package(spec) -> bool:
  """Whether a method is one of the library's own: tests/test_padding_check.py checks every
  one of those, so a run spends no start-up time on them (the check compiles a program)."""
  return getattr(spec.client, "__module__", "").startswith("fedjax_dg.")


def padding_check(name: str, client: ClientSide, ctx: Context, label_shape=()) -> None:
  """`check_padding` of a client side's objective (`ClientSide.objective`, which
  `objective_client` sets), at the parameters `ctx.model.init` gives (pretrained weights
  not loaded) and the broadcast of a fresh server state. A client side without an
  objective (a method with its own local loop) is not checked.

  Args:
    name: the method's name, for the error.
    client: the method's client side, built with concrete values.
    ctx: the builder's context (its model, classes and domains).
    label_shape: the shape of one label row (`(T,)` for per-token labels).

  Raises:
    ValueError: one line naming the method and `batch.mask`, when the objective's loss
      depends on the padded rows of its batch.
  """
  if client.objective is None:
    return
  model = ctx.model
  if dataclasses.is_dataclass(model) and getattr(model, "load", None) is not None:
    model = dataclasses.replace(model, load=None)
  rng = jax.random.PRNGKey(0)
  params = model.init(rng)
  trained = client.nets_init(rng, params) if client.nets_init else params
  extra = client.broadcast(client.side_init(rng, params), jnp.asarray(0, jnp.int32)) if client.broadcast else ()
  num_classes = getattr(getattr(model.module, "classifier", None), "num_classes", 2)
  check_padding(name, client.objective(trained, extra), trained, model.input_shape, label_shape, num_classes,
                ctx.num_domains)


def build(ctx: Context) -> Algorithm:
  """The algorithm `ctx.config.algorithm.name` with the config's hyperparameters: its client
  side composed with its rule (`Builder(ctx)()`)."""
  return Builder(ctx)()


def later_stages(ctx: Context):
  """`[(stage, rounds, builder)]` after the first stage (FedLOE's stage 2); `builder` is a
  `Builder` of that stage."""
  spec = spec_of(ctx.config)
  if not spec.stages:
    return []
  hp = hparams_of(ctx.config, spec)
  return [(st, st.rounds(ctx.config, hp), Builder(ctx, st)) for st in spec.stages(hp)]


def build_algorithm(config, model, sched, num_clients: int, cohort_size: int, num_domains: int = 1,
                    train_domains=None, store=None, tune_store=None, heldout_val=None) -> Algorithm:
  """`build` from the runner's pieces (FedSR expects `model_for(config, model)`)."""
  return build(context(config, model, sched, num_clients, cohort_size, num_domains, train_domains, store,
                       tune_store, heldout_val))


def communication_of(name: str) -> dict:
  """What `name` (a method or method+rule) declares it sends and receives besides the model
  and its update, and whether anything computed per example leaves a client."""
  spec, rule = resolve(name)
  return {"sends": spec.sends + rule.sends, "receives": spec.receives + rule.receives, "leaks_data": spec.leaks_data}


COMMUNICATION = {name: communication_of(name) for name in ALGORITHMS}


def communication_table() -> str:
  """The documentation's table: what every method sends and receives beyond the model and its
  update, and whether it sends anything computed per example (Bai et al. 2024 Table 12's
  "free of leakage" is the opposite of the last column)."""
  rows = ["| method | sends beyond the model update | receives beyond the model | per-example data leaves the client |",
          "| --- | --- | --- | --- |"]
  fmt = lambda items: "; ".join(items) if items else "-"
  for name in ALGORITHMS:
    c = COMMUNICATION[name]
    rows.append(f"| `{name}` | {fmt(c['sends'])} | {fmt(c['receives'])} | {'yes' if c['leaks_data'] else 'no'} |")
  return "\n".join(rows)


def hparams_table() -> str:
  """The documentation's table of every method's and rule's hyperparameters: config path, default,
  accepted range, random-search distribution."""
  from fedjax_dg.algorithms.spec import range_text
  rows = ["| config field | default | accepted | random search | meaning |", "| --- | --- | --- | --- | --- |"]
  seen = set()
  for owner in (*METHODS.values(), *RULES.values()):
    key = owner.key if isinstance(owner, MethodSpec) else owner.name
    if key in seen:
      continue
    seen.add(key)
    for f in hparam_fields(owner.hparams):
      m = f.metadata
      search = m.get("search")
      rows.append(f"| `algorithm.{key}.{f.name}` | {f.default!r} | {range_text(m)} | "
                  f"{search_text(search)} | {m.get('doc', '')} |")
  return "\n".join(rows)


def search_text(search) -> str:
  """A random-search distribution as the documentation's tables print it ("-": none)."""
  if search is None:
    return "-"
  name = type(search).__name__
  args = ", ".join(map(str, search.values)) if name == "Choice" else f"{search.lo:g}, {search.hi:g}"
  return f"{name}({args})"


def methods_table() -> str:
  """The documentation's table of methods: name, paper, benchmark group, default server rule."""
  rows = ["| name | paper | group | default server rule |", "| --- | --- | --- | --- |"]
  for name, spec in METHODS.items():
    rows.append(f"| `{name}` | {spec.paper} | {spec.group} | `{spec.rule}` |")
  rows.append("")
  rows.append("| server rule | what it does |")
  rows.append("| --- | --- |")
  for name, rule in RULES.items():
    rows.append(f"| `+{name}` | {rule.doc} |")
  return "\n".join(rows)
