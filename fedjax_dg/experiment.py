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
Under `jax.distributed` (`config.distributed`, fedjax_dg/distributed.py) every process runs
this loop on its share of the cohort; process 0 alone writes the workdir and shows the bar,
every process takes part in each checkpoint, and start-up failures are agreed.
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
  if not math.isfinite(train_loss):
    what = f"train loss is {train_loss}"
  elif not ckpt_lib.all_finite(alg.params_of(state.server)):  # one transfer, not one per leaf
    what = "the model parameters are not finite"
  elif not ckpt_lib.all_finite(state):
    what = "the round state (server or client optimizer state) is not finite"
  else:
    return train_loss
  raise FloatingPointError(f"{what} at round {done}; lower client.lr (now {config.client.lr}) "
                           f"or server.lr (now {config.server.lr})")


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
      run = rundir.prepare(config, workdir, bool(algorithms.spec_of(config).stages),
                           fold={"test_domains": fold.test_domains, "val_domains": fold.val_domains})
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


def _run_fold(config, fold: splits.Fold, workdir: str, run: str) -> dict:
  spec = algorithms.spec_of(config)
  t0 = time.time()
  s = setup(config, fold)
  stages = s["stages"]
  total = stages[-1].first + stages[-1].rounds
  key = jax.random.PRNGKey(config.seed)
  k_init, k_server, k_rounds = jax.random.split(key, 3)
  params = s["model"].init(k_init)
  if config.model.get("pretrained_path", ""):  # a resumed run restores its own parameters below
    params = load_pretrained(params, config.model.pretrained_path, spec)
  C = s["num_clients"]
  host = bool(config.engine.get("host_client_states", False))  # client states in host memory
  state = init_round_state(stages[0].builder, k_server, params, C, host_states=host)
  store = jax.tree.map(jnp.asarray, s["packed"])
  evaluator = Evaluator(s["model"], fold.eval_splits(), fold.num_classes, config.eval_batch_size,
                        metrics=fold.metrics)
  stage_of = lambda t: max(k for k, st in enumerate(stages) if st.first <= max(t - 1, 0))  # round t's stage
  metric = config.data.get("select_metric", "accuracy")

  def next_stage_state(k, prev_state):  # stage k starts from the previous stage's model
    return init_round_state(stages[k].builder, k_server, stages[k - 1].algorithm.params_of(prev_state.server), C,
                            host_states=host)

  def target_of(step):  # the saved state's structure: the stage that ran round `step`
    target = ckpt_lib.shape_of(state)  # host-held client states: the (empty) table itself
    for j in range(1, stage_of(step) + 1):
      target = jax.eval_shape(lambda st, j=j: next_stage_state(j, st), target)
    return target

  comm = _communication(stages[0].algorithm, ckpt_lib.device_view(state), store, s["cohort"], k_rounds)
  ckpts = ckpt_lib.Checkpoints(workdir, run=run)
  start = 0
  try:
    if config.resume:
      step, restored = ckpts.restore_latest(target_of)
      if step is not None:
        start, state = int(step), restored
  except BaseException:
    ckpts.close(quietly=True)
    raise
  # Evaluations past the checkpoint stay in metrics.jsonl until this run evaluates those
  # rounds again (with no checkpoint, from round 0): a failing resume loses nothing.
  on_schedule = _on_schedule(stages, config.eval_every)
  try:
    records, pending, again = _resumed_records(workdir, run, start, on_schedule)
  except BaseException:
    ckpts.close(quietly=True)
    raise

  def evaluate(done, k, state, train_loss, reporters):
    now = stages[k].algorithm.params_of(state.server)
    rec = {"round": done, "run": run, "train_loss": train_loss, "splits": evaluator(now)}
    if reporters:  # one count per round since the last evaluation; a round without reporters kept the server
      rec["reporters"] = reporters[:]
      rec["rounds_without_reporters"] = [done - len(reporters) + 1 + i for i, n in enumerate(reporters) if n == 0]
      reporters.clear()
    if len(stages) > 1:
      rec["stage"] = k + 1
    if spec.record:  # what the method logs of its server state
      rec.update(spec.record(state.server))
    records.append(rec)
    rundir.write_metrics(workdir, records + [r for r in pending if r["round"] > done])
    if tb:
      tb.add(rec)
    if k + 1 == len(stages):  # keep the parameters each selection rule now chooses
      for rule in SELECTION_RULES:
        chosen = select([r for r in records if r.get("stage", 1) == len(stages)], rule, metric=metric)
        if chosen and chosen["round"] == done:
          rundir.save_selected(workdir, rule, done, now, chosen["val"], run=run)
    # the test split only at the end: a DG run must not watch its test domain
    bar.set_postfix(loss=f"{train_loss:.3f}" if train_loss is not None else "-", val=progress_val(rec["splits"]))

  placed = [getattr(st.round_fn, "place", lambda x: x)(store) for st in stages]  # e.g. one copy per device
  writer = rundir.is_writer()  # process 0 under jax.distributed
  tb = tensorboard.RunWriter(workdir) if config.get("tensorboard", False) and writer else None  # live event files
  reporters = []  # per round since the last evaluation, when clients may fail
  bar = tqdm(total=total, initial=start, desc="round", disable=config.get("quiet", False) or not writer,
             dynamic_ncols=True)
  phase = lambda what: bar.set_description(f"round ({what})")
  compiled = set()
  round_seconds = []  # each round this process ran, compiling ones included
  try:
    if again:  # the checkpoint's own evaluation was lost (a torn metrics.jsonl): evaluated again
      phase("evaluating")
      evaluate(start, stage_of(start), state, None, [])
    for t in range(start, total):
      k = stage_of(t + 1)
      st = stages[k]
      if k > 0 and t == st.first:
        state = next_stage_state(k, state)
      phase("training" if k in compiled else "compiling")
      began = time.perf_counter()
      state, metrics = st.round_fn(state, placed[k], jax.random.fold_in(k_rounds, t))
      train_loss = float(metrics["train_loss"])  # waits for the round: the bar times work, not dispatch
      round_seconds.append(time.perf_counter() - began)
      compiled.add(k)
      done = t + 1
      if "reporters" in metrics:  # clients may fail (engine.dropout, engine.straggler_fraction)
        reporters.append(int(metrics["reporters"]))
      last_of_stage = done == st.first + st.rounds
      do_eval = on_schedule(done)
      do_ckpt = bool(config.checkpoint_every) and (done % config.checkpoint_every == 0 or last_of_stage)
      if do_eval or do_ckpt:  # never evaluate or save a diverged state
        _check_state(st.algorithm, state, done, train_loss, config)
      if do_eval:
        phase("evaluating")
        evaluate(done, k, state, train_loss, reporters)
      if do_ckpt:
        phase("saving")
        ckpts.save(done, state)
      bar.update(1)
  except BaseException:  # finish or remove the background save, never hide the error
    bar.close()
    ckpts.close(quietly=True)
    if tb:
      tb.close()
    raise
  bar.close()
  ckpts.close()
  if tb:  # rewritten from metrics.jsonl: a resumed run's event files hold each round once
    tb.close()
    tensorboard.convert_run(workdir)

  final_stage = len(stages)  # a multi-stage method is selected within its final stage
  selectable = [r for r in records if r.get("stage", 1) == final_stage]
  metric = config.data.get("select_metric", "accuracy")
  summary = {
      "run": run,
      "config": config.to_dict(),
      "wall_time_s": time.time() - t0,
      "strategy": s["strategy"], "engine": s["engine"], "backend": jax.default_backend(), "devices": jax.device_count(),
      "processes": jax.process_count(),
      "num_clients": s["num_clients"], "client_sizes": s["packed"].counts.tolist(),
      "num_params": count_params(params), "local_steps": s["sched"].num_steps,
      "provenance": provenance(),
      "timing": _timing(round_seconds, {0} | {st.first - start for st in stages if st.first > start}),
      "communication": reporter_bytes(comm, [n for r in records for n in r.get("reporters", ())]),
      "stages": [{"name": st.name, "rounds": [st.first + 1, st.first + st.rounds]} for st in stages],
      "domains": {"names": list(fold.domain_names), "train": list(fold.train_domains),
                  "val": list(fold.val_domains), "test": list(fold.test_domains)},
      "selection_scope": "all rounds" if len(stages) == 1 else f"rounds of the final stage ({stages[-1].name})",
      "selection": {rule: select(selectable, rule, metric=metric) for rule in SELECTION_RULES},
      "final": records[-1] if records else None,
  }
  summary["selected_params"] = {  # kept in selected/ (python -m fedjax_dg.evaluate re-scores them)
      rule: (f"selected/{rule}.msgpack" if sel and rundir.selected_round(workdir, rule, run) == sel["round"] else None)
      for rule, sel in summary["selection"].items()}
  rundir.write_summary(workdir, summary)
  return summary


def _timing(seconds: list, compiling: set) -> dict:
  """The rounds this process ran (`seconds`, in order): how many, the seconds of those that
  compiled (positions `compiling`: the first, and each later stage's first), and the median
  of the others."""
  rest = [x for i, x in enumerate(seconds) if i not in compiling]
  return {"rounds_run": len(seconds), "compiling_rounds_s": [x for i, x in enumerate(seconds) if i in compiling],
          "median_round_s": float(np.median(rest)) if rest else None}


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
  d = config.data
  if d.name == "wilds":  # the official split scheme, not a split by domains
    from fedjax_dg.data import wilds
    return run_fold(config, wilds.load_fold(d), workdir)
  ds = datasets.load_dataset(config.data)
  if not d.leave_one_domain_out:
    return run_fold(config, splits.fold_from_config(ds, d), workdir)
  folds = splits.leave_one_domain_out(
      ds, validation=d.get("lodo_validation", "heldout_domain"), in_val_fraction=d.in_val_fraction, in_test_fraction=d.in_test_fraction, seed=d.seed,
      test_domain_train_fraction=d.get("test_domain_train_fraction", 0.0),
      test_domain_train_include=d.get("test_domain_train_include", True))
  with rundir.owned(workdir):  # the folds' summary is this workdir's
    if not config.resume and os.path.exists(os.path.join(workdir, rundir.SUMMARY_FILE)):
      raise config_lib.ConfigError(f"workdir {workdir!r} already holds results ({rundir.SUMMARY_FILE}); pass "
                                   "--config.resume=True to continue that run or choose another --config.workdir")
    summaries = [run_fold(config, fold, os.path.join(workdir, f"fold_{fold.test_domains[0]}")) for fold in folds]
    out = {"config": config.to_dict(), "folds": [os.path.join(workdir, f"fold_{f.test_domains[0]}") for f in folds],
           "selection": {}}
    for rule in SELECTION_RULES:
      out["selection"].update(lodo_summary(rule, folds, summaries, folds[0].domain_names))
    rundir.write_summary(workdir, out)
  return out
