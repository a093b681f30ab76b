"""The run plan: what one run will do, resolved once from its config and its data.

`prepare(config, fold)` is the one place where a config becomes a run. It partitions the
training data into clients, packs their stores, builds the model and the method, and
resolves every engine choice, in this order, before anything compiles:

  RunPlan      a frozen record of the decisions: the method and its rule with their checked
               hyperparameter records, the number of clients and the cohort, the execution
               strategy (`auto` resolved by backend and model family), the clients that
               run in parallel under it, the local loop's step count and unrolling, the
               stages with their rounds and evaluation schedule. The runner, batched runs,
               `fedjax_dg.meta` and the memory checks all read this record; none of them
               resolves a config field again.
  PreparedRun  the plan with what it was resolved from: the packed client stores, the
               model, the local schedule, and each stage's builder, algorithm and round
               function (built once; the round function rebuilds the method inside its
               trace only from the run-time hyperparameters of the round state).

The module also owns the rules every caller used to repeat: which clients run in parallel
under each strategy (`parallel_clients`), how `engine.strategy = "auto"` resolves
(`resolve_strategy`), how many local steps a client takes (`local_steps`), and which
rounds are evaluated (`RunPlan.on_schedule`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import numpy as np

from fedjax_dg import algorithms
from fedjax_dg import checks
from fedjax_dg import distributed
from fedjax_dg.algorithms import make_schedule
from fedjax_dg.data import partition, splits, store as store_lib
from fedjax_dg.engine import make_round
from fedjax_dg.engine.round import buckets_for, default_unroll, engine_defaults, model_family
from fedjax_dg.errors import ConfigError
from fedjax_dg.models import build_model


def parallel_clients(strategy: str, cohort: int, chunk_size: int, num_devices: int = 1) -> int:
  """How many clients one round trains at the same time on one device under `strategy`.

  Args:
    strategy: a resolved execution strategy (not "auto"): "vmap", "chunked", "sequential",
      "host_loop", or a sharded form of one ("sharded_vmap" counts as "vmap").
    cohort: clients per round.
    chunk_size: `engine.chunk_size`, the clients of one chunk under "chunked".
    num_devices: the devices the jitted strategies split the cohort over (`memory_devices`):
      each trains its share, `ceil(cohort / num_devices)`.

  Returns:
    A device's share of the cohort under `vmap`, at most `chunk_size` of it under `chunked`,
    and 1 for the strategies that train one client after another (`sequential`,
    `host_loop`).
  """
  if strategy == "auto":
    raise ValueError("parallel_clients needs a resolved strategy; resolve 'auto' with resolve_strategy first")
  base = strategy.replace("sharded_", "")
  share = math.ceil(int(cohort) / max(1, int(num_devices)))
  if base == "vmap":
    return int(share)
  if base == "chunked":
    return int(min(share, chunk_size))
  return 1


def memory_devices(strategy: str, backend: str | None = None) -> int:
  """Into how many memories the engine splits a round's clients under `strategy`: every
  device of the run on an accelerator for the jitted strategies (the engine shards the
  cohort over them); on CPU, where a process's devices share its machine's memory, the
  number of processes (`jax.distributed`; 1 alone); 1 for the host loop (one client at a
  time on each device).

  Args:
    strategy: a resolved execution strategy.
    backend: "cpu", "gpu" or "tpu"; None: JAX's default backend.

  Returns:
    The number of shares.
  """
  import jax
  backend = backend or jax.default_backend()
  if strategy == "host_loop":
    return 1
  if backend == "cpu":
    return max(1, len(jax.devices()) // max(1, len(jax.local_devices())))
  return len(jax.devices())


def resolve_strategy(config, family: str, fits=None, backend: str | None = None) -> str:
  """`engine.strategy` with "auto" resolved by backend and model family.

  Args:
    config: the run's config.
    family: the model family (`engine.round.model_family`): "conv", "gemm_conv" or "dense".
    fits: `fits(strategy) -> bool`, whether a round under that strategy fits the device's
      memory; where "auto" would pick `vmap` and it does not fit, "auto" picks `chunked`
      (chunks of `engine.chunk_size`) if that fits, else `sequential`; under
      `jax.distributed` the most cautious of the processes' choices. None: no memory test.
    backend: "cpu", "gpu" or "tpu"; None: JAX's default backend.

  Returns:
    The strategy the engine runs. Under `jax.distributed` the host loop (one process's
    devices only) is refused, and "auto" picks "chunked" instead of it. An explicit
    strategy is returned as it is (`checks.check_memory` refuses it if it does not fit).
  """
  distributed.check_strategy(config)
  strategy = config.engine.strategy
  if strategy == "auto":
    strategy = engine_defaults(family, backend).strategy
    if strategy == "host_loop" and distributed.process_count() > 1:
      strategy = "chunked"
    if strategy == "vmap" and fits is not None:
      strategy = _agreed(("vmap", "chunked", "sequential"),
                         0 if fits("vmap") else 1 if fits("chunked") else 2)
  return strategy


def _agreed(choices: tuple, mine: int):
  """`choices[i]` for the largest `i` any process of the run chose (`mine` is this one's):
  processes with different memories must still compile one program."""
  if distributed.process_count() > 1:
    from jax.experimental import multihost_utils
    mine = int(np.max(multihost_utils.process_allgather(np.asarray(mine, np.int32))))
  return choices[mine]


def strategy_and_share(config, family: str, model, input_shape, cohort: int, num_steps: int) -> tuple:
  """The strategy "auto" resolves to with the device's memory tested (`resolve_strategy`,
  `checks.round_fits`), and the clients one device trains at once under it
  (`parallel_clients`, `memory_devices`): what `prepare` and `batch.run_bytes` both use."""
  share = lambda s: parallel_clients(s, cohort, int(config.engine.chunk_size), memory_devices(s))
  strategy = resolve_strategy(config, family, lambda s: checks.round_fits(config, model, input_shape, share(s),
                                                                          num_steps))
  return strategy, share(strategy)


def measured_text(family: str, default: str, strategy: str, backend: str | None = None) -> str:
  """Where "auto"'s choice comes from (`EngineDefaults.measured`), and why it differs from
  the measured default `default` when the memory test moved it to `strategy`."""
  text = engine_defaults(family, backend).measured
  if strategy != default:
    text += f"; the cohort under {default} exceeds the device's memory: {strategy}"
  return text


def num_clients_of(config, spec=None) -> int:
  """The number of clients: 1 for centralised ERM, else `config.num_clients`."""
  spec = spec or algorithms.spec_of(config)
  return 1 if spec.centralised else int(config.num_clients)


def local_steps(client_config, n_max: int) -> int:
  """Local steps per round of the client holding `n_max` examples: `client.local_steps`, or
  `ceil(local_epochs * n_max / batch_size)` in epoch mode."""
  c = client_config
  return int(c.local_steps) if c.local_steps > 0 else math.ceil(c.local_epochs * n_max / c.batch_size)


def unroll_of(config, num_steps: int, family: str):
  """`engine.unroll`, or the measured default by backend and model family when it is -1."""
  if config.engine.unroll >= 0:
    return max(1, int(config.engine.unroll))
  return default_unroll(family, num_steps)


@dataclasses.dataclass(frozen=True)
class StagePlan:
  """One stage of a run.

  Attributes:
    name: "stage 1", or a later stage's own name (FedLOE's "stage 2").
    first: rounds completed before the stage starts.
    rounds: rounds the stage runs.
    eval_every: evaluation period inside the stage, or None for the run's `eval_every`
      counted from round 0.
  """
  name: str
  first: int
  rounds: int
  eval_every: int | None = None

  @property
  def last(self) -> int:
    return self.first + self.rounds


@dataclasses.dataclass(frozen=True)
class RunPlan:
  """The decisions of one run, resolved once (see the module docstring).

  Attributes:
    method: the method's `MethodSpec`.
    rule: its server rule's `RuleSpec`.
    hp: the method's checked hyperparameter record (`config.algorithm.<method>`).
    rule_hp: the rule's checked hyperparameter record.
    num_clients: clients holding training data (1 for centralised ERM).
    cohort: clients sampled per round.
    strategy: the execution strategy, "auto" resolved.
    auto: whether the config asked for "auto".
    parallel: clients one device trains at the same time under `strategy` (`parallel_clients`).
    model_family: "conv", "gemm_conv" or "dense": what `auto` and the unrolling read.
    measured: where the engine default for this backend and family comes from.
    local_steps: local steps per round of the largest client.
    unroll: the local loop's unrolling (an int, or True: in full).
    stages: the run's stages in order.
    eval_every: the run's evaluation period (`config.eval_every`).
    checkpoint_every: the checkpoint period (`config.checkpoint_every`; 0: never).
  """
  method: Any
  rule: Any
  hp: Any
  rule_hp: Any
  num_clients: int
  cohort: int
  strategy: str
  auto: bool
  parallel: int
  model_family: str
  measured: str
  local_steps: int
  unroll: Any
  stages: tuple
  eval_every: int
  checkpoint_every: int

  @property
  def total_rounds(self) -> int:
    return self.stages[-1].last

  def stage_of(self, t: int) -> int:
    """The index of the stage that runs round `t` (round 0: the first)."""
    return max(k for k, st in enumerate(self.stages) if st.first <= max(t - 1, 0))

  def on_schedule(self, t: int) -> bool:
    """Whether round `t` is evaluated: every `eval_every` rounds (or the stage's own period,
    counted from its start) and at the end of every stage."""
    for st in self.stages:
      if st.first < t <= st.last:
        if t == st.last:
          return True
        return (t - st.first) % st.eval_every == 0 if st.eval_every else t % self.eval_every == 0
    return t % self.eval_every == 0  # round 0, or past the end (the end of a shorter run)

  def checks_due(self, done: int) -> tuple[bool, bool]:
    """(evaluate, checkpoint) after round `done`."""
    st = self.stages[self.stage_of(done)]
    every = self.checkpoint_every
    return self.on_schedule(done), bool(every) and (done % every == 0 or done == st.last)

  @property
  def engine(self) -> dict:
    """The engine's choices as summary.json records them."""
    return {"strategy": self.strategy, "unroll": self.unroll, "model_family": self.model_family,
            "auto": self.auto, "measured": self.measured}


class Stage(NamedTuple):
  """One stage of a prepared run.

  Attributes:
    name: the stage's name.
    algorithm: the stage's algorithm built with the config's hyperparameters (read for
      `params_of`, communication and what it sends).
    round_fn: the engine's round function (`engine.make_round`) over `builder`.
    first: rounds before the stage.
    rounds: rounds of the stage.
    builder: `hparams -> Algorithm` (`algorithms.Builder`): what the round function runs.
  """
  name: str
  algorithm: object
  round_fn: object
  first: int
  rounds: int
  builder: object = None


class PreparedRun(NamedTuple):
  """A run ready to compile: its plan and what the plan was resolved from.

  Attributes:
    plan: the `RunPlan`.
    packed: the training `ClientStore` (every client's padded rows).
    tune_packed: each client's held-out tuning rows (`MethodSpec.tune_fraction`), or None.
    model: the model the method trains (`algorithms.model_for`).
    sched: the local loop's `LocalSchedule`.
    stages: the `Stage`s, in order.
    reads_data: whether the method's build reads the run's data (its store, tuning split
      or held-out examples), which is then part of the compiled program: runs of a batch
      share such a program only when their data are equal.
    findings: what the preflight found about whether the method can act
      (`fedjax_dg.activity`): the warnings, as summary.json records them (an error stops
      `prepare`).
  """
  plan: RunPlan
  packed: Any
  tune_packed: Any
  model: Any
  sched: Any
  stages: tuple
  reads_data: bool
  findings: tuple = ()

  # Short names for what readers use most.
  num_clients = property(lambda self: self.plan.num_clients)
  cohort = property(lambda self: self.plan.cohort)
  strategy = property(lambda self: self.plan.strategy)
  algorithm = property(lambda self: self.stages[0].algorithm)


def partition_clients(config, fold: splits.Fold, num_clients: int):
  """Each client's row indices into `fold.train` (`config.partition`, seeded by `config.seed`)."""
  p = config.partition
  seed = config.seed
  if p.method == "heterogeneous":
    return partition.heterogeneous_partition(fold.train.domain, num_clients, p.lam, seed)
  if p.method == "dirichlet":
    return partition.dirichlet_partition(fold.train.y, num_clients, p.alpha, seed)
  return partition.iid_partition(len(fold.train), num_clients, seed)


def check_finite(fold: splits.Fold):
  """The inputs of every split must be finite: NaN or inf in the data is named as such, not
  later blamed on a step size."""
  for name, split in (("training", fold.train), *fold.eval_splits().items()):
    x = split.x
    if len(split) and np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
      where = "training" if name == "training" else f"{name!r} split's"
      raise ConfigError(f"data: the {where} inputs hold NaN or inf "
                        f"({int((~np.isfinite(x)).sum())} values); clean the data set")


def split_tuning(parts, fraction: float, seed: int, field: str):
  """Each client's indices -> (train, tune), tune = round(fraction * n) >= 1 random rows."""
  rng = np.random.default_rng(seed + 1)
  train, tune = [], []
  for c, idx in enumerate(parts):
    if len(idx) < 2:
      raise ConfigError(f"{field}: client {c} has {len(idx)} example(s); a held-out tuning "
                        "split needs at least 2 per client (one to train, one to tune)")
    perm = rng.permutation(idx)
    k = min(len(idx) - 1, max(1, int(round(fraction * len(idx)))))
    tune.append(np.sort(perm[:k]))
    train.append(np.sort(perm[k:]))
  return train, tune


def augmentation(config, fold):
  """DomainBed's training augmentation (`data.augment`, `data.augment_preset`) as the local
  loop's `(rng, x) -> x`, or None."""
  from fedjax_dg.data import augment
  params = augment.params_for(config.data)
  if params is None:
    return None
  if fold.train.x.ndim != 4 or fold.train.x.shape[-1] != 3:
    raise ConfigError(f"data.augment: DomainBed's augmentation needs RGB images [H, W, 3], "
                      f"got inputs of shape {fold.train.x.shape[1:]}")
  return lambda rng, x: augment.augment(rng, x, params)


def _stage_plans(config, hp, first_rounds: int, later) -> tuple:
  """The stages: the first over `first_rounds`, then the method's later stages (`later`:
  `algorithms.later_stages`), each with its own evaluation period where it declares one."""
  stages = [StagePlan("stage 1", 0, int(first_rounds))]
  for st, rounds, _ in later:
    every = getattr(st, "eval_every", None)
    stages.append(StagePlan(st.name, stages[-1].last, int(rounds), int(every(config, hp)) if every else None))
  return tuple(stages)


def prepare(config, fold: splits.Fold, family: str | None = None) -> PreparedRun:
  """Everything a run needs, built and validated before anything compiles.

  Args:
    config: a validated config (`config.validate`).
    fold: the run's data splits.
    family: the model family when the caller already knows it (a batch's runs share one);
      None: traced from the model.

  Returns:
    The `PreparedRun`.

  Raises:
    ConfigError: one line naming the field, for what needs the data to check (more clients
      than examples, NaN inputs, a round larger than the device's memory, a tuning split
      of a client with one example).
  """
  spec, rule = algorithms.resolve(config.algorithm.name)
  hp, rule_hp = algorithms.hparams_of(config, spec), algorithms.hparams_of(config, rule)
  num_clients = num_clients_of(config, spec)
  from fedjax_dg import config as config_lib
  config_lib.validate_data(config, len(fold.train), num_clients)
  check_finite(fold)
  parts = partition_clients(config, fold, num_clients)
  tune_packed = None
  fraction = spec.tune_fraction(hp) if spec.tune_fraction else 0.0
  if fraction > 0:  # each client holds out a tuning split (FedLOE's stage 2, FedGA's gap split)
    parts, tune_parts = split_tuning(parts, fraction, config.seed, f"algorithm.{spec.key}")
    tune_packed = store_lib.pack_clients(fold.train, tune_parts)
  if config.engine.get("host_store", False):  # inputs stay in host memory (data larger than the device)
    from fedjax_dg.data.host_store import pack_clients_host
    packed = pack_clients_host(fold.train, parts)
  else:
    packed = store_lib.pack_clients(fold.train, parts)
  cohort = config_lib.cohort_size(config, num_clients)
  input_shape = fold.train.x.shape[1:]
  model = algorithms.model_for(config, build_model(config.model, input_shape, fold.num_classes))
  n_max, n_min = int(packed.counts.max()), int(packed.counts.min())
  steps = local_steps(config.client, n_max)
  c = config.client
  rounds1, steps1 = int(config.num_rounds), steps
  if spec.first_stage:  # the method's own first-stage schedule within the run's budget (FedLOE)
    try:
      rounds1, steps1 = (int(v) for v in spec.first_stage(config, hp, steps))
    except ValueError as e:
      raise ConfigError(str(e)) from None
  family = family or model_family(model, input_shape)
  unroll = unroll_of(config, steps1, family)
  records = bool(config.get("activity", True))  # the clients' activity records (docs/activity.md)
  if (rounds1, steps1) == (int(config.num_rounds), steps):
    sched = make_schedule(c.batch_size, c.local_steps, c.local_epochs, n_max, n_min, unroll,
                          augmentation(config, fold), activity=records)
  else:  # `steps1` local steps of B examples a round (the step mode's stream of permutations)
    sched = make_schedule(c.batch_size, steps1, 0, n_max, n_min, unroll, augmentation(config, fold),
                          activity=records)
  steps = sched.num_steps
  e = config.engine
  strategy, parallel = strategy_and_share(config, family, model, input_shape, cohort, steps)
  checks.check_memory(config, model, input_shape, parallel, strategy, steps)  # before compiling
  ctx = algorithms.context(config, model, sched, num_clients, cohort, num_domains=len(fold.domain_names),
                           train_domains=fold.train_domains, store=packed, tune_store=tune_packed,
                           heldout_val=(fold.heldout_val.x, fold.heldout_val.y))
  later = algorithms.later_stages(ctx)
  plan = RunPlan(method=spec, rule=rule, hp=hp, rule_hp=rule_hp, num_clients=num_clients, cohort=cohort,
                 strategy=strategy, auto=e.strategy == "auto", parallel=parallel, model_family=family,
                 measured=measured_text(family, resolve_strategy(config, family), strategy), local_steps=sched.num_steps, unroll=sched.unroll,
                 stages=_stage_plans(config, hp, rounds1, later), eval_every=int(config.eval_every),
                 checkpoint_every=int(config.checkpoint_every))
  make = lambda alg: make_round(alg, num_clients, cohort, strategy, e.chunk_size, dropout=e.get("dropout", 0.0),
                                straggler_fraction=e.get("straggler_fraction", 0.0),
                                buckets=buckets_for(sched) if e.get("buckets", False) else None)
  builder = algorithms.Builder(ctx)
  stages = [Stage(plan.stages[0].name, builder(), make(builder), 0, plan.stages[0].rounds, builder)]
  for sp, (_, _, build) in zip(plan.stages[1:], later):
    stages.append(Stage(sp.name, build(), make(build), sp.first, sp.rounds, build))
  findings = preflight(config, plan, packed)  # before anything compiles
  return PreparedRun(plan, packed, tune_packed, model, sched, tuple(stages), algorithms.reads_data(config), findings)


def client_domains(packed) -> list[int]:
  """How many distinct training domains each client of the packed store holds."""
  domain, counts = np.asarray(packed.domain), np.asarray(packed.counts)
  return [int(len(np.unique(domain[c, :n]))) for c, n in enumerate(counts)]


def preflight(config, plan: RunPlan, packed) -> tuple:
  """Whether the run's method can act (`fedjax_dg.activity.preflight`), before training.

  Args:
    config: the run's config.
    plan: its plan (local steps per round and rounds of the first stage, where the methods'
      own terms act).
    packed: its training store (which domains each client holds).

  Returns:
    The warnings as dicts (`level`, `field`, `message`, `equals_baseline`, `inactive`), each also
    issued once as a Python warning.

  Raises:
    ConfigError: the first error finding, in one line naming the field.
  """
  import warnings
  from fedjax_dg import activity
  found = activity.preflight(config, local_steps=plan.local_steps, rounds=plan.stages[0].rounds,
                             client_domains=client_domains(packed))
  errors = [f for f in found if f.level == "error"]
  if errors:
    raise ConfigError(errors[0].message if errors[0].message.startswith(errors[0].field)
                      else f"{errors[0].field}: {errors[0].message}")
  for f in found:
    warnings.warn(f.message if f.message.startswith(f.field) else f"{f.field}: {f.message}", stacklevel=2)
  return tuple(f._asdict() for f in found)
