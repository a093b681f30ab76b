"""One run's directory bookkeeping: everything a run writes goes through its `RunBook`.

A single run and every run of a batch keep one `RunBook` each (`fedjax_dg.loop` calls it):
the resume (the newest intact checkpoint and the evaluations up to it), each evaluation's
record in metrics.jsonl (and TensorBoard), the parameters each selection rule chooses, the
checkpoints, and summary.json. The module also holds what a summary reports besides the
records: the bytes a round exchanges (`communication`), where the wall time went
(`Timing`), and the one-line error of a run that diverged (`divergence`).
"""
from __future__ import annotations

import json
import math
import os
import time
import warnings

import jax
import numpy as np

from fedjax_dg import algorithms
from fedjax_dg import checkpoint as ckpt_lib
from fedjax_dg import rundir
from fedjax_dg.algorithms.base import ClientData
from fedjax_dg.errors import ConfigError
from fedjax_dg.engine import init_round_state
from fedjax_dg.eval import tensorboard, tracking
from fedjax_dg.eval.evaluate import SELECTION_RULES, select
from fedjax_dg.models import count_params
from fedjax_dg.provenance import provenance


def load_pretrained(params, path: str, spec=None):
  """`params` with the featurizer's ResNet weights read from `path` (models/resnet.py), where
  the method `spec` puts its backbone (`MethodSpec.pretrained`; default: the featurizer)."""
  from fedjax_dg.models import resnet
  load = lambda p: resnet.load_pretrained(p, path)
  return spec.pretrained(params, load) if spec is not None and spec.pretrained else load(params)


def tree_bytes(tree) -> int:
  return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def communication(alg, state, store, cohort: int, rng) -> dict:
  """Bytes per round of `alg` (shapes only), and what it declares it sends and receives."""
  first = lambda t: jax.tree.map(lambda a: a[0], t)
  one = lambda fn: jax.eval_shape(
      lambda st, sto: fn(alg.broadcast(st.server), first(st.clients),
                         ClientData(*first((sto.x, sto.y, sto.domain, sto.counts))), rng), state, store)
  comm = {"upload_bytes_per_client": tree_bytes(one(alg.client_update).message),
          "download_bytes_per_client": tree_bytes(jax.eval_shape(alg.broadcast, state.server)),
          "clients_per_round": cohort}
  per_client = comm["upload_bytes_per_client"] + comm["download_bytes_per_client"]
  for phase, fn in (("pre_round", alg.client_stat), ("post_round", alg.client_report)):
    if fn is not None:  # an extra exchange: the statistic up, the server's answer down
      comm[f"{phase}_bytes_per_client"] = 2 * tree_bytes(one(fn))
      per_client += comm[f"{phase}_bytes_per_client"]
  comm["bytes_per_round"] = comm["clients_per_round"] * per_client
  comm.update(sends_beyond_parameters=list(alg.sends), receives_beyond_parameters=list(alg.receives),
              sends_per_example_data=alg.leaks_data, setup_bytes=alg.setup_bytes)
  return comm



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
  steps = [f"client.lr (now {config.client.lr})", f"server.lr (now {config.server.lr})"]
  steps += [f"{path} (now {_value(config, path)})" for path in step_sizes(config)]
  return f"{what} at round {done}; lower {', '.join(steps[:-1])} or {steps[-1]}"


def step_sizes(config) -> list[str]:
  """The method's and rule's own run-time step sizes (`algorithm.<key>.<field>` whose name
  ends in `lr`: the learned rule's `outer_lr`, FedLOE's `head_lr`), which a divergence may
  come from as much as the optimizers' `client.lr` and `server.lr`."""
  try:
    fields = algorithms.run_time_fields(config)
  except ValueError:
    return []
  return [p for p in fields if p.startswith("algorithm.") and p.rsplit(".", 1)[1].endswith("lr")]


def _value(config, path: str):
  node = config
  for part in path.split("."):
    node = node[part]
  return node



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



def resumed_records(workdir: str, run: str, start: int, on_schedule) -> tuple[list, list, bool]:
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


LOSSES_FILE = "checkpoint_losses.json"  # the training loss of each checkpoint's round
RUN_LIST_FILE = "runs.json"  # a batch's list of its runs (`fedjax_dg.batch.run_list`)
ACTIVITY = "activity/"  # the prefix of a round metric that measures how much a method's own term acted


def run_activity(records: list) -> dict:
  """`{name: mean}` of every activity value over a run's evaluation records (each record
  holds the values of its own round)."""
  values = {}
  for r in records:
    for name, v in r.get("activity", {}).items():
      values.setdefault(name, []).append(v)
  return {name: float(np.mean(v)) for name, v in sorted(values.items())}


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


def prepare_directory(config, fold, workdir: str) -> str:
  """The run directory checked (and its config stored) before anything compiles.

  Args:
    config: the run's config.
    fold: its data splits (their test and validation domains are stored with the config).
    workdir: the run directory.

  Returns:
    The run's identity (a resumed run keeps the one it started with).

  Raises:
    ConfigError: a fresh run over another run's files, or a resume of files whose config
      differs in a result-changing field.
  """
  if os.path.lexists(os.path.join(workdir, RUN_LIST_FILE)):
    raise ConfigError(f"workdir {workdir!r} holds a run list ({RUN_LIST_FILE}, run_<i>/); a single run does not "
                      "share a folder with a batch: choose another --config.workdir")
  return rundir.prepare(config, workdir, bool(algorithms.spec_of(config).stages),
                        fold={"test_domains": fold.test_domains, "val_domains": fold.val_domains})


class RunBook:
  """One run's bookkeeping, shared by a single run and every run of a batch: the resume (its
  newest checkpoint, its records), each evaluation's record in metrics.jsonl (and
  TensorBoard), the selected parameters, the checkpoints and summary.json. The round loop
  (`fedjax_dg.loop`) runs the rounds and computes the splits' metrics; everything written to
  the run directory goes through here.

  Attributes:
    config: the run's config.
    fold: its data splits.
    workdir: its run directory (owned by the caller).
    run: its identity (`rundir.prepare`).
    prepared: its `plan.PreparedRun`.
    plan: the prepared run's `RunPlan`.
    k_init, k_server, k_rounds: the run's keys, split from `PRNGKey(config.seed)`: the
      initial model, the server's state, and round `t`'s key `fold_in(k_rounds, t)`.
    records: the evaluations so far (metrics.jsonl).
    failed: the error that ended the run inside a batch, or None.
    preflight: what the method's preflight found (`fedjax_dg.activity`), for summary.json.
  """

  def __init__(self, config, fold, workdir: str, run: str, prepared):
    self.config, self.fold, self.workdir, self.run = config, fold, workdir, run
    self.prepared = prepared
    self.plan = prepared.plan
    self.spec = self.plan.method
    self.stages = prepared.stages
    self.total = self.plan.total_rounds
    self.metric = config.data.get("select_metric", "accuracy")
    key = jax.random.PRNGKey(config.seed)
    self.k_init, self.k_server, self.k_rounds = jax.random.split(key, 3)
    self.ckpts = self.tb = None
    self.records, self.pending, self.again, self.reporters = [], [], False, []
    self.activity = {}  # name -> value in the latest trained round
    self.failed = None
    self.preflight = list(prepared.findings)
    self.host = bool(config.engine.get("host_client_states", False))  # client states in host memory

  def on_schedule(self, t: int) -> bool:
    return self.plan.on_schedule(t)

  def stage_of(self, t: int) -> int:
    """The stage that runs round `t` (round 0: the first)."""
    return self.plan.stage_of(t)

  def initial_params(self):
    params = self.prepared.model.init(self.k_init)
    if self.config.model.get("pretrained_path", ""):  # a resumed run restores its own parameters
      params = load_pretrained(params, self.config.model.pretrained_path, self.spec)
    return params

  def initial_state(self, params):
    hp = self.stages[0].builder.hparams
    return init_state(self.stages[0], self.k_server, params, self.plan.num_clients, hparams=hp,
                      host_states=self.host)

  def next_stage_state(self, k: int, prev_state):
    """Stage `k`'s state, starting from the previous stage's model."""
    params = self.stages[k - 1].algorithm.params_of(prev_state.server)
    return init_state(self.stages[k], self.k_server, params, self.plan.num_clients,
                      hparams=self.stages[k].builder.hparams, host_states=self.host)

  def add_round(self, metrics: dict) -> None:
    """Keeps a trained round's reporters (for the next evaluation's record) and its activity
    values (`activity/<name>` metrics: the record of that round, if it is evaluated)."""
    if "reporters" in metrics:  # clients may fail (engine.dropout, engine.straggler_fraction)
      self.reporters.append(int(metrics["reporters"]))
    # the activity of the latest round (a record holds its round's values: the same after a resume)
    self.activity = {k[len(ACTIVITY):]: float(v) for k, v in metrics.items() if k.startswith(ACTIVITY)}

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
      self.records, self.pending, self.again = resumed_records(self.workdir, self.run, start, self.on_schedule)
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
    if self.activity:  # how much the method's own term acted in the evaluated round
      rec["activity"] = dict(sorted(self.activity.items()))
      self.activity = {}
    elif train_loss is None and self.saved_record_activity(done) is not None:  # a lost record written again
      rec["activity"] = self.saved_record_activity(done)
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

  def save(self, done: int, state, train_loss: float) -> None:
    """Saves the checkpoint of round `done` and, beside it (LOSSES_FILE), what a resume from
    it needs to write round `done`'s record again as a run never stopped wrote it: that
    round's training loss and its activity values."""
    self.ckpts.save(done, state)
    if rundir.is_writer():
      path = os.path.join(self.workdir, LOSSES_FILE)
      old = self._saved()
      steps = {k: v for k, v in old.items() if k.isdigit() and int(k) < done}  # a rerun's later rounds: gone
      last = self.records[-1] if self.records and self.records[-1]["round"] == done else None
      steps[str(done)] = {"train_loss": train_loss, "record_activity": last.get("activity") if last else None}
      rundir.atomic_write(path, json.dumps({"run": self.run, **steps}, sort_keys=True).encode())

  def _saved(self) -> dict:
    """This run's LOSSES_FILE (`{round: {...}}`), {} when absent, unreadable or another run's."""
    try:
      saved = rundir.read_json(os.path.join(self.workdir, LOSSES_FILE), "the checkpoints' training losses") or {}
    except rundir.RunDirError:
      return {}
    return {k: v for k, v in saved.items() if k.isdigit() and isinstance(v, dict)} if saved.get("run") == self.run \
        else {}

  def saved_loss(self, done: int):
    """The training loss saved with the checkpoint of round `done` by this run, or None."""
    v = self._saved().get(str(done), {}).get("train_loss")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

  def saved_record_activity(self, done: int):
    """The activity of round `done`'s record, saved with its checkpoint, or None."""
    v = self._saved().get(str(done), {}).get("record_activity")
    return v if isinstance(v, dict) else None

  def checks_due(self, done: int) -> tuple[bool, bool]:
    """(evaluate, checkpoint) after round `done`."""
    return self.plan.checks_due(done)

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
    """Writes summary.json (the keys are documented in `fedjax_dg.experiment`) and returns it.

    Args:
      comm: the round's communication (`communication`).
      params: the initial parameters (their count is recorded).
      timing: `Timing.summary()`.
      batch: `{"size", "index"}` of a run trained inside a batch, or None.

    Returns:
      The summary dict.
    """
    plan, stages, fold, records = self.plan, self.stages, self.fold, self.records
    selectable = [r for r in records if r.get("stage", 1) == len(stages)]  # within the final stage
    summary = {
        "run": self.run,
        "config": self.config.to_dict(),
        "wall_time_s": timing["total_s"],
        "timing": timing,
        "strategy": plan.strategy, "engine": plan.engine, "backend": jax.default_backend(),
        "devices": jax.device_count(), "processes": jax.process_count(),
        "num_clients": plan.num_clients, "client_sizes": self.prepared.packed.counts.tolist(),
        "num_params": count_params(params), "local_steps": plan.local_steps,
        "provenance": provenance(self.config.algorithm.name),
        "communication": reporter_bytes(comm, [n for r in records for n in r.get("reporters", ())]),
        "stages": [{"name": st.name, "rounds": [st.first + 1, st.first + st.rounds]} for st in stages],
        "domains": {"names": list(fold.domain_names), "train": list(fold.train_domains),
                    "val": list(fold.val_domains), "test": list(fold.test_domains)},
        "selection_scope": "all rounds" if len(stages) == 1 else f"rounds of the final stage ({stages[-1].name})",
        "selection": {rule: select(selectable, rule, metric=self.metric) for rule in SELECTION_RULES},
        "final": records[-1] if records else None,
        "activity": run_activity(records),
        "preflight": list(self.preflight),
    }
    if batch is not None:
      summary["batch"] = batch
    summary["selected_params"] = {  # kept in selected/ (python -m fedjax_dg.evaluate re-scores them)
        rule: (f"selected/{rule}.msgpack" if sel and rundir.selected_round(self.workdir, rule, self.run) == sel["round"]
               else None)
        for rule, sel in summary["selection"].items()}
    rundir.write_summary(self.workdir, summary)
    tracking.log_run(self.config, self.workdir)  # config.tracking: MLflow, once the summary is written
    return summary


