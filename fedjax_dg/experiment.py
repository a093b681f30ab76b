"""config -> data -> model -> algorithm -> rounds, with evaluation, selection, checkpoints.

`train_and_evaluate(config, workdir)` writes into `workdir`:
  metrics.jsonl   one line per evaluation: round, train loss, every split's metrics
  summary.json    config, wall time, communication, and per selection rule the selected
                  round and the test metrics there
  checkpoints/    orbax checkpoints of the round state every `checkpoint_every` rounds
  LOCK, config.json, selected/   see fedjax_dg/rundir.py; checkpoint_sums/: fedjax_dg/checkpoint.py
One process owns a workdir at a time (LOCK). With `config.resume`, a run restarts from the
newest intact checkpoint of its own (or from round 0); because round `t` uses the key
`fold_in(key, t)`, a killed and resumed run ends with the same metrics as an uninterrupted
one. A resume must keep every result-changing field of the stored config and every
evaluation up to its checkpoint (one missing at the checkpoint's own round is evaluated
again; any other is refused); an extended run keeps one evaluation schedule. A fresh run
refuses a workdir holding another run's results, checkpoints or selected parameters.
Leave-one-domain-out runs each fold in `workdir/fold_<d>`.
"""
from __future__ import annotations

import contextlib
import copy
import math
import os
import time
import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from fedjax_dg import config as config_lib
from fedjax_dg import algorithms
from fedjax_dg import checks
from fedjax_dg import checkpoint as ckpt_lib
from fedjax_dg import distributed
from fedjax_dg.algorithms import make_schedule
from fedjax_dg.algorithms.base import ClientData
from fedjax_dg import rundir
from fedjax_dg import stopping
from fedjax_dg.provenance import provenance
from fedjax_dg.data import datasets, partition, splits, store as store_lib
from fedjax_dg.engine import init_round_state, make_round
from fedjax_dg.engine.round import buckets_for, default_unroll, engine_defaults, model_family
from fedjax_dg.eval import tensorboard
from fedjax_dg.eval.evaluate import SELECTION_RULES, Evaluator, select
from fedjax_dg.models import build_model, count_params


def partition_clients(config, fold: splits.Fold, num_clients: int):
  p = config.partition
  seed = config.seed
  if p.method == "heterogeneous":
    return partition.heterogeneous_partition(fold.train.domain, num_clients, p.lam, seed)
  if p.method == "dirichlet":
    return partition.dirichlet_partition(fold.train.y, num_clients, p.alpha, seed)
  return partition.iid_partition(len(fold.train), num_clients, seed)


def _num_clients(config) -> int:
  return 1 if algorithms.spec_of(config).centralised else int(config.num_clients)


def _unroll(config, num_steps: int, family: str = "conv"):
  if config.engine.unroll >= 0:
    return max(1, int(config.engine.unroll))
  return default_unroll(family, num_steps)  # engine.round.ENGINE_DEFAULTS: by backend and model family


_FAMILIES = {}


def _family(config, model, input_shape) -> str:
  """`engine.round.model_family`, traced once per model config and input shape."""
  key = (config.model.to_json_best_effort(), tuple(input_shape))
  if key not in _FAMILIES:
    _FAMILIES[key] = model_family(model, input_shape)
  return _FAMILIES[key]


class Stage(NamedTuple):
  """One stage of a run: its algorithm (built with the config's hyperparameters), its
  builder (`hparams -> algorithm`, what the round function runs), round function and the
  rounds it covers."""
  name: str
  algorithm: object
  round_fn: object
  first: int  # rounds before it
  rounds: int
  builder: object = None


def setup(config, fold: splits.Fold):
  """Everything a run needs, built and validated before anything compiles."""
  spec = algorithms.spec_of(config)
  num_clients = _num_clients(config)
  config_lib.validate_data(config, len(fold.train), num_clients)
  _check_finite(fold)
  parts = partition_clients(config, fold, num_clients)
  tune_packed = None
  fraction = spec.tune_fraction(algorithms.hparams_of(config, spec)) if spec.tune_fraction else 0.0
  if fraction > 0:  # each client holds out a tuning split (FedLOE's stage 2, FedGA's gap split)
    parts, tune_parts = _split_tuning(parts, fraction, config.seed, f"algorithm.{spec.key}")
    tune_packed = store_lib.pack_clients(fold.train, tune_parts)
  if config.engine.get("host_store", False):  # inputs stay in host memory (data larger than the device)
    from fedjax_dg.data.host_store import pack_clients_host
    packed = pack_clients_host(fold.train, parts)
  else:
    packed = store_lib.pack_clients(fold.train, parts)
  cohort = config_lib.cohort_size(config, num_clients)
  model = algorithms.model_for(config, build_model(config.model, fold.train.x.shape[1:], fold.num_classes))
  c = config.client
  n_max, n_min = int(packed.counts.max()), int(packed.counts.min())
  steps = c.local_steps if c.local_steps > 0 else math.ceil(c.local_epochs * n_max / c.batch_size)
  family = _family(config, model, fold.train.x.shape[1:])  # "conv" or "dense": picks the engine defaults
  sched = make_schedule(c.batch_size, c.local_steps, c.local_epochs, n_max, n_min, _unroll(config, steps, family),
                        _augmentation(config, fold))
  ctx = algorithms.context(config, model, sched, num_clients, cohort, num_domains=len(fold.domain_names),
                           train_domains=fold.train_domains, store=packed, tune_store=tune_packed,
                           heldout_val=(fold.heldout_val.x, fold.heldout_val.y))
  strategy = _strategy(config, family)
  checks.check_memory(config, model, fold.train.x.shape[1:], cohort, strategy, steps)  # before compiling
  e = config.engine
  make = lambda alg: make_round(alg, num_clients, cohort, strategy, e.chunk_size, dropout=e.get("dropout", 0.0),
                                straggler_fraction=e.get("straggler_fraction", 0.0),
                                buckets=buckets_for(sched) if e.get("buckets", False) else None)
  builder = algorithms.Builder(ctx)
  algorithm = builder()
  stages = [Stage("stage 1", algorithm, make(builder), 0, int(config.num_rounds), builder)]
  for st, rounds, build in algorithms.later_stages(ctx):
    stages.append(Stage(st.name, build(), make(build), stages[-1].first + stages[-1].rounds, int(rounds), build))
  return dict(num_clients=num_clients, packed=packed, cohort=cohort, model=model, sched=sched,
              algorithm=algorithm, strategy=strategy, stages=stages,
              engine={"strategy": strategy, "unroll": sched.unroll, "model_family": family,
                      "auto": config.engine.strategy == "auto", "measured": engine_defaults(family).measured})


def _strategy(config, family: str) -> str:
  """`engine.strategy`, "auto" resolved by backend and model family. Under `jax.distributed`
  the host loop (this process's devices only) is refused, and "auto" picks "chunked" for it."""
  distributed.check_strategy(config)
  strategy = config.engine.strategy
  if strategy == "auto":
    strategy = engine_defaults(family).strategy
    if strategy == "host_loop" and distributed.process_count() > 1:
      strategy = "chunked"
  return strategy


def _check_finite(fold: splits.Fold):
  """The inputs of every split must be finite: NaN or inf in the data is named as such, not
  later blamed on a step size."""
  for name, split in (("training", fold.train), *fold.eval_splits().items()):
    x = split.x
    if len(split) and np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
      where = "training" if name == "training" else f"{name!r} split's"
      raise config_lib.ConfigError(f"data: the {where} inputs hold NaN or inf "
                                   f"({int((~np.isfinite(x)).sum())} values); clean the data set")


def load_pretrained(params, path: str, spec=None):
  """`params` with the featurizer's ResNet weights read from `path` (models/resnet.py), where
  the method `spec` puts its backbone (`MethodSpec.pretrained`; default: the featurizer)."""
  from fedjax_dg.models import resnet
  load = lambda p: resnet.load_pretrained(p, path)
  return spec.pretrained(params, load) if spec is not None and spec.pretrained else load(params)


def _augmentation(config, fold):
  """DomainBed's training augmentation (`data.augment`, `data.augment_preset`) as the local
  loop's `(rng, x) -> x`, or None."""
  from fedjax_dg.data import augment
  params = augment.params_for(config.data)
  if params is None:
    return None
  if fold.train.x.ndim != 4 or fold.train.x.shape[-1] != 3:
    raise config_lib.ConfigError(f"data.augment: DomainBed's augmentation needs RGB images [H, W, 3], "
                                 f"got inputs of shape {fold.train.x.shape[1:]}")
  return lambda rng, x: augment.augment(rng, x, params)


def _split_tuning(parts, fraction: float, seed: int, field: str):
  """Each client's indices -> (train, tune), tune = round(fraction * n) >= 1 random rows."""
  rng = np.random.default_rng(seed + 1)
  train, tune = [], []
  for c, idx in enumerate(parts):
    if len(idx) < 2:
      raise config_lib.ConfigError(f"{field}: client {c} has {len(idx)} example(s); a held-out tuning "
                                   "split needs at least 2 per client (one to train, one to tune)")
    perm = rng.permutation(idx)
    k = min(len(idx) - 1, max(1, int(round(fraction * len(idx)))))
    tune.append(np.sort(perm[:k]))
    train.append(np.sort(perm[k:]))
  return train, tune


def _bytes(tree) -> int:
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def _communication(alg, state, store, cohort: int, rng) -> dict:
  """Bytes per round of `alg` (shapes only), and what it declares it sends and receives."""
  first = lambda t: jax.tree.map(lambda a: a[0], t)
  one = lambda fn: jax.eval_shape(
      lambda st, sto: fn(alg.broadcast(st.server), first(st.clients),
                         ClientData(*first((sto.x, sto.y, sto.domain, sto.counts))), rng), state, store)
  comm = {"upload_bytes_per_client": _bytes(one(alg.client_update).message),
          "download_bytes_per_client": _bytes(jax.eval_shape(alg.broadcast, state.server)),
          "clients_per_round": cohort}
  per_client = comm["upload_bytes_per_client"] + comm["download_bytes_per_client"]
  for phase, fn in (("pre_round", alg.client_stat), ("post_round", alg.client_report)):
    if fn is not None:  # an extra exchange: the statistic up, the server's answer down
      comm[f"{phase}_bytes_per_client"] = 2 * _bytes(one(fn))
      per_client += comm[f"{phase}_bytes_per_client"]
  comm["bytes_per_round"] = comm["clients_per_round"] * per_client
  comm.update(sends_beyond_parameters=list(alg.sends), receives_beyond_parameters=list(alg.receives),
              sends_per_example_data=alg.leaks_data, setup_bytes=alg.setup_bytes)
  return comm


def _check_state(alg, state, done: int, train_loss: float, config):
  """Stops before a diverged state is evaluated or saved: the loss and the whole round state
  (parameters, server and client optimizer states), the state a checkpoint would hold."""
  finite = lambda tree: lambda: ckpt_lib.all_finite(tree)  # one transfer, not one per leaf
  err = divergence(train_loss, finite(alg.params_of(state.server)), finite(state), done, config)
  if err:
    raise FloatingPointError(err)
  return train_loss


def divergence(train_loss: float, params_finite, state_finite, done: int, config) -> str | None:
  """The one-line error of a run that diverged by round `done`, or None. `params_finite` and
  `state_finite` are booleans or callables returning them (checked in that order)."""
  value = lambda f: f() if callable(f) else bool(f)
  if not math.isfinite(train_loss):
    what = f"train loss is {train_loss}"
  elif not value(params_finite):
    what = "the model parameters are not finite"
  elif not value(state_finite):
    what = "the round state (server or client optimizer state) is not finite"
  else:
    return None
  return f"{what} at round {done}; lower client.lr (now {config.client.lr}) or server.lr (now {config.server.lr})"


def with_loader(config):
  """`config` with a registered dataset's loader path in `data.loader` (a copy), so the run's
  config.json names the loader and `python -m fedjax_dg.evaluate` can load the data again."""
  name = config.data.name
  if name in datasets.BUILTIN or name not in datasets.DATASETS or config.data.get("loader", "") == datasets.DATASETS[name]:
    return config
  config = copy.deepcopy(config)
  with config.unlocked():
    config.data.loader = datasets.DATASETS[name]
  return config


def progress_val(scores: dict) -> str:
  """The progress bar's validation accuracy: the held-out validation domain's, else the
  in-domain validation split's. Never the test domain's: a DG run must not peek at it."""
  for k in ("heldout_val", "in_val"):
    if k in scores and "accuracy" in scores[k]:
      return f"{scores[k]['accuracy']:.3f}"
  return "-"


def reporter_bytes(comm: dict, reporters: list[int]) -> dict:
  """`comm` with `bytes_per_round` counting only the clients that reported (engine.dropout):
  the mean number of reporters per round times a client's bytes. A dropped client takes
  part in no exchange of its round. `sampled_clients_per_round` keeps the cohort size."""
  if not reporters:
    return comm
  per_client = comm["bytes_per_round"] / comm["clients_per_round"]
  mean = float(np.mean(reporters))
  return {**comm, "sampled_clients_per_round": comm["clients_per_round"], "clients_per_round": mean,
          "bytes_per_round": mean * per_client}


def run_fold(config, fold: splits.Fold, workdir: str) -> dict:
  """One run in `workdir`, which this process owns (LOCK) while it runs; `config.data` is
  what the run records as its data."""
  config = with_loader(config)
  with contextlib.ExitStack() as owned:
    error = None
    try:  # before anything compiles; every process learns whether any failed (jax.distributed)
      owned.enter_context(rundir.owned(workdir))
      run = prepare_run(config, fold, workdir)
    except Exception as e:  # pylint: disable=broad-except  # raised again by `agree`
      error = e
    distributed.agree(config, error)
    return _run_fold(config, fold, workdir, run)


def _on_schedule(stages, eval_every: int):
  """Whether round `t` is evaluated: every `eval_every` rounds and at each stage's end."""
  ends = {st.first + st.rounds for st in stages}
  return lambda t: t % eval_every == 0 or t in ends


def _resumed_records(workdir: str, run: str, start: int, on_schedule) -> tuple[list, list, bool]:
  """(records up to the checkpoint, records past it, whether the checkpoint's own round must
  be evaluated again). Records of another run are refused; records off the schedule (the end
  of a shorter run this one extends) are dropped; a missing evaluation before the checkpoint
  is refused, one missing at the checkpoint's round is evaluated again."""
  old = rundir.read_metrics(workdir)
  rundir.check_identity(workdir, old, run)
  off = [r["round"] for r in old if not on_schedule(r["round"])]
  if off:
    warnings.warn(f"{workdir}/metrics.jsonl: dropping the evaluation(s) of round(s) {off}, off this run's "
                  "schedule (the last round of the shorter run it extends)")
  old = [r for r in old if on_schedule(r["round"])]
  have = {r["round"] for r in old}
  lost = [t for t in range(1, start + 1) if on_schedule(t) and t not in have]
  if [t for t in lost if t != start]:
    raise rundir.RunDirError(
        f"{workdir}/metrics.jsonl lacks the evaluation(s) of round(s) {lost}, which checkpoint {start} follows; "
        "restore metrics.jsonl, or move checkpoints/ away to rerun from the start")
  return [r for r in old if r["round"] <= start], [r for r in old if r["round"] > start], start in lost


class Timing:
  """Where a run's (or a batch's) wall time went, in seconds: `compile_s` (each stage's first
  round: its compilation and that one round), `train_s` (the other rounds), `eval_s`
  (evaluations, with their compilation), `checkpoint_s` (checkpoint writes) and `total_s`."""

  def __init__(self):
    self.t0 = time.time()
    self.s = {"compile_s": 0.0, "train_s": 0.0, "eval_s": 0.0, "checkpoint_s": 0.0}
    self.rounds = []  # seconds of each training round that did not compile

  def add(self, what: str, since: float) -> float:
    now = time.time()
    self.s[what] += now - since
    if what == "train_s":
      self.rounds.append(now - since)
    return now

  def summary(self) -> dict:
    """The totals, and `median_round_s`: the median of the rounds that did not compile."""
    return {**{k: round(v, 4) for k, v in self.s.items()}, "total_s": round(time.time() - self.t0, 4),
            "rounds_timed": len(self.rounds),
            "median_round_s": float(np.median(self.rounds)) if self.rounds else None}


def init_state(stage, key, params, num_clients: int, hparams=None, host_states: bool = False):
  """A stage's round state from `params`, with its builder's hyperparameters by default;
  `host_states`: persistent client states in host memory (`engine.host_client_states`)."""
  return init_round_state(stage.builder, key, params, num_clients, hparams=hparams, host_states=host_states)


class RunBook:
  """One run's bookkeeping, shared by a single run (`_run_fold`) and every run of a batch
  (`fedjax_dg.batch`): the resume (its newest checkpoint, its records), each evaluation's
  record in metrics.jsonl (and TensorBoard), the selected parameters, the divergence check,
  the checkpoints and summary.json. The caller runs the rounds and computes the splits'
  metrics; everything written to the run directory goes through here."""

  def __init__(self, config, fold: splits.Fold, workdir: str, run: str, s: dict):
    self.config, self.fold, self.workdir, self.run, self.s = config, fold, workdir, run, s
    self.spec = algorithms.spec_of(config)
    self.stages = s["stages"]
    self.total = self.stages[-1].first + self.stages[-1].rounds
    self.metric = config.data.get("select_metric", "accuracy")
    self.on_schedule = _on_schedule(self.stages, config.eval_every)
    key = jax.random.PRNGKey(config.seed)
    self.k_init, self.k_server, self.k_rounds = jax.random.split(key, 3)
    self.ckpts = self.tb = None
    self.records, self.pending, self.again, self.reporters = [], [], False, []
    self.failed = None  # the error that ended the run inside a batch
    self.host = bool(config.engine.get("host_client_states", False))  # client states in host memory

  def stage_of(self, t: int) -> int:
    """The stage that runs round `t` (round 0: the first)."""
    return max(k for k, st in enumerate(self.stages) if st.first <= max(t - 1, 0))

  def initial_params(self):
    params = self.s["model"].init(self.k_init)
    if self.config.model.get("pretrained_path", ""):  # a resumed run restores its own parameters
      params = load_pretrained(params, self.config.model.pretrained_path, self.spec)
    return params

  def initial_state(self, params):
    hp = self.stages[0].builder.hparams
    return init_state(self.stages[0], self.k_server, params, self.s["num_clients"], hparams=hp, host_states=self.host)

  def next_stage_state(self, k: int, prev_state):
    """Stage `k`'s state, starting from the previous stage's model."""
    params = self.stages[k - 1].algorithm.params_of(prev_state.server)
    return init_state(self.stages[k], self.k_server, params, self.s["num_clients"],
                      hparams=self.stages[k].builder.hparams, host_states=self.host)

  def open(self, state):
    """Opens the checkpoints and, with `config.resume`, restores the newest intact one:
    `(start round, state)`. Evaluations past the checkpoint stay in metrics.jsonl until this
    run evaluates those rounds again (with no checkpoint, from round 0): a failing resume
    loses nothing."""
    def target_of(step):  # the saved state's structure: the stage that ran round `step`
      target = ckpt_lib.shape_of(state)  # host-held client states: the (empty) table itself
      for j in range(1, self.stage_of(step) + 1):
        target = jax.eval_shape(lambda st, j=j: self.next_stage_state(j, st), target)
      return target

    self.ckpts = ckpt_lib.Checkpoints(self.workdir, run=self.run)
    start = 0
    try:
      if self.config.resume:
        step, restored = self.ckpts.restore_latest(target_of)
        if step is not None:
          start, state = int(step), restored
      self.records, self.pending, self.again = _resumed_records(self.workdir, self.run, start, self.on_schedule)
    except BaseException:
      self.ckpts.close(quietly=True)
      raise
    writer = rundir.is_writer()  # process 0 under jax.distributed
    self.tb = tensorboard.RunWriter(self.workdir) if self.config.get("tensorboard", False) and writer else None
    return start, state

  def record(self, done: int, k: int, state, train_loss, splits_metrics: dict) -> dict:
    """Writes the evaluation of round `done` (stage `k`) and keeps the parameters each
    selection rule now chooses. The test split is read only at the end: a DG run must not
    watch its test domain."""
    now = self.stages[k].algorithm.params_of(state.server)
    rec = {"round": done, "run": self.run, "train_loss": train_loss, "splits": splits_metrics}
    reporters = self.reporters
    if reporters:  # one count per round since the last evaluation; a round without reporters kept the server
      rec["reporters"] = reporters[:]
      rec["rounds_without_reporters"] = [done - len(reporters) + 1 + i for i, n in enumerate(reporters) if n == 0]
      reporters.clear()
    if len(self.stages) > 1:
      rec["stage"] = k + 1
    if self.spec.record:  # what the method logs of its server state
      rec.update(self.spec.record(state.server))
    self.records.append(rec)
    rundir.write_metrics(self.workdir, self.records + [r for r in self.pending if r["round"] > done])
    if self.tb:
      self.tb.add(rec)
    if k + 1 == len(self.stages):
      for rule in SELECTION_RULES:
        chosen = select([r for r in self.records if r.get("stage", 1) == len(self.stages)], rule, metric=self.metric)
        if chosen and chosen["round"] == done:
          rundir.save_selected(self.workdir, rule, done, now, chosen["val"], run=self.run)
    return rec

  def checks_due(self, done: int) -> tuple[bool, bool]:
    """(evaluate, checkpoint) after round `done`."""
    st = self.stages[self.stage_of(done)]
    last_of_stage = done == st.first + st.rounds
    every = self.config.checkpoint_every
    return self.on_schedule(done), bool(every) and (done % every == 0 or last_of_stage)

  def close(self, failed: bool = False):
    """Finishes (or, after a failure, removes) the background save; rewrites TensorBoard's
    event files from metrics.jsonl, so a resumed run's files hold each round once."""
    ckpts, tb, self.ckpts, self.tb = self.ckpts, self.tb, None, None  # closed once
    if ckpts is not None:
      ckpts.close(quietly=failed)
    if tb:
      tb.close()
      if not failed:
        tensorboard.convert_run(self.workdir)

  def summary(self, comm: dict, params, timing: dict, batch: dict | None = None) -> dict:
    s, stages, fold, records = self.s, self.stages, self.fold, self.records
    selectable = [r for r in records if r.get("stage", 1) == len(stages)]  # within the final stage
    summary = {
        "run": self.run,
        "config": self.config.to_dict(),
        "wall_time_s": timing["total_s"],
        "timing": timing,
        "strategy": s["strategy"], "engine": s["engine"], "backend": jax.default_backend(),
        "devices": jax.device_count(), "processes": jax.process_count(),
        "num_clients": s["num_clients"], "client_sizes": s["packed"].counts.tolist(),
        "num_params": count_params(params), "local_steps": s["sched"].num_steps,
        "provenance": provenance(),
        "communication": reporter_bytes(comm, [n for r in records for n in r.get("reporters", ())]),
        "stages": [{"name": st.name, "rounds": [st.first + 1, st.first + st.rounds]} for st in stages],
        "domains": {"names": list(fold.domain_names), "train": list(fold.train_domains),
                    "val": list(fold.val_domains), "test": list(fold.test_domains)},
        "selection_scope": "all rounds" if len(stages) == 1 else f"rounds of the final stage ({stages[-1].name})",
        "selection": {rule: select(selectable, rule, metric=self.metric) for rule in SELECTION_RULES},
        "final": records[-1] if records else None,
    }
    if batch is not None:
      summary["batch"] = batch
    summary["selected_params"] = {  # kept in selected/ (python -m fedjax_dg.evaluate re-scores them)
        rule: (f"selected/{rule}.msgpack" if sel and rundir.selected_round(self.workdir, rule, self.run) == sel["round"]
               else None)
        for rule, sel in summary["selection"].items()}
    rundir.write_summary(self.workdir, summary)
    return summary


def prepare_run(config, fold: splits.Fold, workdir: str) -> str:
  """The run directory checked (and its config stored) before anything compiles; the run's id."""
  return rundir.prepare(config, workdir, bool(algorithms.spec_of(config).stages),
                        fold={"test_domains": fold.test_domains, "val_domains": fold.val_domains})


def _run_fold(config, fold: splits.Fold, workdir: str, run: str) -> dict:
  timing = Timing()
  s = setup(config, fold)
  book = RunBook(config, fold, workdir, run, s)
  stages, total = book.stages, book.total
  params = book.initial_params()
  state = book.initial_state(params)
  store = jax.tree.map(jnp.asarray, s["packed"])
  evaluator = Evaluator(s["model"], fold.eval_splits(), fold.num_classes, config.eval_batch_size,
                        metrics=fold.metrics)
  comm = _communication(stages[0].algorithm, ckpt_lib.device_view(state), store, s["cohort"], book.k_rounds)
  start, state = book.open(state)

  def evaluate(done, k, state, train_loss):
    since = time.time()
    rec = book.record(done, k, state, train_loss, evaluator(stages[k].algorithm.params_of(state.server)))
    timing.add("eval_s", since)
    bar.set_postfix(loss=f"{train_loss:.3f}" if train_loss is not None else "-", val=progress_val(rec["splits"]))

  placed = [getattr(st.round_fn, "place", lambda x: x)(store) for st in stages]  # e.g. one copy per device
  bar = tqdm(total=total, initial=start, desc="round", disable=config.get("quiet", False) or not rundir.is_writer(),
             dynamic_ncols=True)
  phase = lambda what: bar.set_description(f"round ({what})")
  compiled = set()
  stopped = None  # (signal, round) once a stop was asked for (fedjax_dg.stopping)
  try:
    if book.again:  # the checkpoint's own evaluation was lost (a torn metrics.jsonl): evaluated again
      phase("evaluating")
      evaluate(start, book.stage_of(start), state, None)
    with stopping.StopRequest() as stop:  # SIGTERM / SIGUSR1: stop after the round, with its checkpoint
      for t in range(start, total):
        k = book.stage_of(t + 1)
        st = stages[k]
        if k > 0 and t == st.first:
          state = book.next_stage_state(k, state)
        phase("training" if k in compiled else "compiling")
        since = time.time()
        state, metrics = st.round_fn(state, placed[k], jax.random.fold_in(book.k_rounds, t))
        train_loss = float(metrics["train_loss"])  # waits for the round: the bar times work, not dispatch
        timing.add("train_s" if k in compiled else "compile_s", since)
        compiled.add(k)
        done = t + 1
        if "reporters" in metrics:  # clients may fail (engine.dropout, engine.straggler_fraction)
          book.reporters.append(int(metrics["reporters"]))
        do_eval, do_ckpt = book.checks_due(done)
        signame = stop.requested() if done < total else None
        if signame:  # stop after this round, with its checkpoint
          stopped, do_ckpt = (signame, done), bool(config.checkpoint_every)
        if do_eval or do_ckpt:  # never evaluate or save a diverged state
          _check_state(st.algorithm, state, done, train_loss, config)
        if do_eval:
          phase("evaluating")
          evaluate(done, k, state, train_loss)
        if do_ckpt:
          phase("saving")
          since = time.time()
          book.ckpts.save(done, state)
          timing.add("checkpoint_s", since)
        bar.update(1)
        if stopped:
          break
  except BaseException:  # finish or remove the background save, never hide the error
    bar.close()
    book.close(failed=True)
    raise
  bar.close()
  since = time.time()
  book.close()
  timing.add("checkpoint_s", since)
  if stopped:
    raise stopping.Stopped(*stopped, saved=bool(config.checkpoint_every))
  return book.summary(comm, params, timing.summary())


def lodo_summary(rule: str, folds, summaries, names) -> dict:
  """`{rule: {...}}`: the leave-one-domain-out test accuracy under `rule` over the folds,
  mean and sample std (ddof 1; 0 for one fold), and per test domain by name. Empty where no
  fold has that rule (no held-out domain under `data.lodo_validation = "in_domain"`)."""
  per = {names[f.test_domains[0]]: sm["selection"][rule]["test"]["accuracy"]
         for f, sm in zip(folds, summaries) if sm["selection"][rule]}
  if not per:
    return {}
  accs = list(per.values())
  std = float(np.std(accs, ddof=1)) if len(accs) > 1 else 0.0
  return {rule: {"test": {"accuracy": float(np.mean(accs)), "accuracy_std": std},
                 "per_fold_test_accuracy": accs, "per_domain_test_accuracy": per}}


def train_and_evaluate(config, workdir: str | None = None) -> dict:
  distributed.initialize(config)  # config.distributed: before anything else uses JAX
  error = None
  try:
    config_lib.validate(config)
  except Exception as e:  # pylint: disable=broad-except  # raised again by `agree`, in every process
    error = e
  distributed.agree(config, error)
  config = with_loader(config)
  workdir = workdir or config.workdir
  if config.get("runs", ()):  # a batch of runs in one program (fedjax_dg/batch.py)
    from fedjax_dg import batch
    return batch.run_list(config, workdir)
  d = config.data
  if d.name == "wilds":  # the official split scheme, not a split by domains
    from fedjax_dg.data import wilds
    return run_fold(config, wilds.load_fold(d), workdir)
  ds = datasets.load_dataset(config.data)
  if not d.leave_one_domain_out:
    return run_fold(config, splits.fold_from_config(ds, d), workdir)
  folds = lodo_folds(ds, d)
  with rundir.owned(workdir):  # the folds' summary is this workdir's
    check_lodo_workdir(config, workdir)
    summaries = [run_fold(config, fold, fold_dir(workdir, fold)) for fold in folds]
    return write_lodo_summary(config, workdir, folds, summaries)


def lodo_folds(ds, d) -> list:
  """The leave-one-domain-out folds of the data set `ds` that the data config `d` asks for."""
  return splits.leave_one_domain_out(
      ds, validation=d.get("lodo_validation", "heldout_domain"), in_val_fraction=d.in_val_fraction,
      in_test_fraction=d.in_test_fraction, seed=d.seed,
      test_domain_train_fraction=d.get("test_domain_train_fraction", 0.0),
      test_domain_train_include=d.get("test_domain_train_include", True))


def fold_dir(workdir: str, fold) -> str:
  return os.path.join(workdir, f"fold_{fold.test_domains[0]}")


def check_lodo_workdir(config, workdir: str) -> None:
  """A fresh leave-one-domain-out run refuses a workdir holding the folds' summary."""
  if not config.resume and os.path.exists(os.path.join(workdir, rundir.SUMMARY_FILE)):
    raise config_lib.ConfigError(f"workdir {workdir!r} already holds results ({rundir.SUMMARY_FILE}); pass "
                                 "--config.resume=True to continue that run or choose another --config.workdir")


def write_lodo_summary(config, workdir: str, folds, summaries) -> dict:
  """The folds' summary.json in `workdir`: each rule's test accuracy over the folds."""
  out = {"config": config.to_dict(), "folds": [fold_dir(workdir, f) for f in folds], "selection": {}}
  for rule in SELECTION_RULES:
    out["selection"].update(lodo_summary(rule, folds, summaries, folds[0].domain_names))
  rundir.write_summary(workdir, out)
  return out
