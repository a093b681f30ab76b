"""Many runs in one program: runs that differ only in seeds and continuous hyperparameters
share one compiled round, their round states stacked on a leading run axis.

  static_key(config)                   equal keys: the runs can share one compiled program
  run_bytes(config)                    device bytes one run adds to a batch (an estimate)
  train_and_evaluate_batch(configs, workdirs) -> [summary dict or the exception that ended the run]

What may differ inside a batch (and is left out of `static_key`):
  - the seeds `seed` and `data.seed`: each run has its own PRNG keys (initial parameters,
    cohorts, batches) and its own partition and splits;
  - every continuous hyperparameter (`client.lr`, `client.momentum`, `server.lr`, ...,
    and the method's and rule's `algorithm.<key>.<field>` that live in `RoundState.hparams`),
    except whether it is 0: a zero removes a piece from the program (momentum or weight decay
    from the optimizer), so the key keeps `field == 0`;
  - the result-neutral fields (`rundir.RESULT_NEUTRAL`: workdir, resume, checkpoint_every, ...).
Everything else (method, model, data set, partition method and lambda, clients, cohort,
rounds, schedule, strategy) is static and must be equal.

Seeds change data, so a batch first groups its runs into programs:
  - runs whose partitions and splits are equal (same `seed` and `data.seed`, or any seeds of a
    method whose data enters only through the round's store) whose data arrays have equal
    shapes share one program; their stores are stacked on the run axis when they differ (the
    local step count `ceil(local_epochs * n_max / batch)` and the loop's index arrays depend
    on the largest client, so the shapes must agree: with `partition.lam = 0` they always do,
    the clients' sizes being the domains' shares);
  - a method that reads data outside the store when it is built (a held-out tuning split,
    an amplitude bank, a validation subset) shares a program only among runs of equal seeds.
Runs whose shapes differ run as separate programs of the same call, one after another;
results never depend on the grouping.

Every run writes an ordinary run directory (metrics.jsonl, summary.json, config.json,
selected/, checkpoints/, TensorBoard), through the same bookkeeping as a single run
(`experiment.RunBook`). Its summary.json adds `"batch": {"size", "index"}` and the batch's
`"timing"` totals. With `resume`, every run restarts from its own newest checkpoint: the
batch starts at the smallest start round, and a run whose checkpoint is newer joins at its
own round (its slot before that is computed and ignored); a finished run only rewrites its
summary. A run that diverges (NaN or inf in its loss or round state) fails with the same
one-line error as alone, at the same round (checked, as alone, when it would be evaluated or
saved); from then on its state is frozen (`jnp.where` per run) and the others go on, their
results unchanged.

Strategies: "vmap", "chunked" and "sequential" (and their sharded forms over several
devices) run the batch as one compiled program per stage over the run axis: a `jax.lax.map`
loop through the single run's round (`engine.run_axis="map"`, the default on CPU: each run's
arithmetic is the single run's, bit for bit) or `jax.vmap` of the round (`"vmap"`, the
default on GPU and TPU: the run axis fills the device; results equal to float32 rounding). "host_loop" (a Python loop dispatching one client at a time) and host-held inputs
(`engine.host_store`) cannot be traced under `vmap`: there the runs of the batch run one
after another as ordinary runs in this process (same results, same files), each with its own
timing.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from fedjax_dg import algorithms
from fedjax_dg import checks
from fedjax_dg import config as config_lib
from fedjax_dg import experiment
from fedjax_dg import rundir
from fedjax_dg import stopping
from fedjax_dg.algorithms.base import tree_where
from fedjax_dg.algorithms.spec import continuous, hparam_fields
from fedjax_dg.errors import ConfigError
from fedjax_dg.eval.metrics import classification_metrics

# The optimizer numbers a run reads when its round runs (`algorithms.base.optimizer_values`).
CLIENT_VALUES = ("lr", "momentum", "weight_decay", "b1", "b2", "eps")
SERVER_VALUES = ("lr", "momentum", "b1", "b2", "eps")
SEEDS = ("seed", "data.seed")


# ----------------------------------------------------------------------------- static key

def continuous_fields(config) -> tuple[str, ...]:
  """The config paths of the run-time hyperparameters of `config`'s method (and its rule)."""
  spec, rule = algorithms.resolve(config.algorithm.name)
  paths = [f"client.{f}" for f in CLIENT_VALUES] + [f"server.{f}" for f in SERVER_VALUES]
  for owner, key in ((spec, spec.key), (rule, rule.name)):
    paths += [f"algorithm.{key}.{f.name}" for f in hparam_fields(owner.hparams) if continuous(f)]
  return tuple(paths)


def static_fields(config) -> dict:
  """`{path: value}` of every field that decides the compiled program (flattened config
  without the seeds, the continuous hyperparameters and the result-neutral fields; each
  continuous hyperparameter as `path == 0`)."""
  flat = rundir.flatten(rundir.plain(config.to_dict()))
  varying = set(continuous_fields(config))
  out = {}
  for k, v in flat.items():
    if k in SEEDS or k.split(".")[0] in rundir.RESULT_NEUTRAL or k == "runs":
      continue
    if k in varying:
      out[f"{k} == 0"] = v == 0
    else:
      out[k] = v
  return out


def static_key(config) -> str:
  """A hex digest of `static_fields(config)`: runs with equal keys can share one compiled
  program (seeds, continuous hyperparameters and result-neutral fields may differ)."""
  text = rundir.canonical_json(static_fields(config))
  return hashlib.sha256(text.encode()).hexdigest()


def run_bytes(config, input_shape=None) -> int:
  """Estimated device bytes one run adds to a batch: its round state (parameters, server and
  client optimizer states), the activations and index arrays of its clients in parallel
  (`checks.round_memory`), and its own copy of the training data (stacked per run when the
  seeds differ). `input_shape` (one example's) is read from the data when not given."""
  from fedjax_dg.data import datasets, splits
  from fedjax_dg.models import build_model
  config_lib.validate(config)
  fold = splits.fold_from_config(datasets.load_dataset(config.data), config.data)
  shape = tuple(fold.train.x.shape[1:]) if input_shape is None else tuple(input_shape)
  model = algorithms.model_for(config, build_model(config.model, shape, fold.num_classes))
  num_clients = 1 if algorithms.spec_of(config).centralised else int(config.num_clients)
  cohort = config_lib.cohort_size(config, num_clients)
  strategy = config.engine.strategy
  parallel = {"vmap": cohort, "chunked": min(cohort, int(config.engine.chunk_size))}.get(strategy, cohort)
  c = config.client
  n_max = math.ceil(len(fold.train) / max(1, num_clients)) * 2
  steps = c.local_steps if c.local_steps > 0 else math.ceil(c.local_epochs * n_max / c.batch_size)
  m = checks.round_memory(config, model, shape, parallel, steps)
  clients_state = num_clients * m["params"] * 4 * 2  # persistent client states (e.g. SCAFFOLD's controls)
  data = fold.train.x.nbytes + fold.train.y.nbytes * 3
  return int(m["state"] + m["activations"] + m["indices"] + clients_state + data)


# ----------------------------------------------------------------------------- checks

def check_batch(configs, workdirs) -> None:
  """Every run valid (its values in their declared ranges) and every static field equal to
  run 0's; one line naming the run (and the field) otherwise. Nothing has compiled yet."""
  if len(configs) != len(workdirs) or not configs:
    raise ConfigError(f"a batch needs one workdir per run: {len(configs)} config(s), {len(workdirs)} workdir(s)")
  if len(set(map(str, workdirs))) != len(workdirs):
    raise ConfigError("a batch's runs need distinct workdirs; two runs name the same one")
  for i, (c, w) in enumerate(zip(configs, workdirs)):
    try:
      config_lib.validate(c)
    except (ConfigError, ValueError) as e:
      raise ConfigError(f"run {i} ({w}): {' '.join(str(e).split())}") from None
  first = static_fields(configs[0])
  for i, c in enumerate(configs[1:], 1):
    other = static_fields(c)
    for k in sorted(set(first) | set(other)):
      if first.get(k) != other.get(k):
        raise ConfigError(f"run {i} ({workdirs[i]}): {k} is {other.get(k)!r}, run 0's is {first.get(k)!r}; the runs "
                          "of one batch may differ only in seeds and continuous hyperparameters")


# ----------------------------------------------------------------------------- data

class _Probe:
  """Stands for a run's data in a method's build: any use of it is recorded."""

  def __init__(self):
    self.touched = False

  def _touch(self, *_):
    self.touched = True
    raise _Touched()

  __getitem__ = __len__ = __iter__ = __array__ = __jax_array__ = _touch

  def __getattr__(self, name):
    if name.startswith("__") and name not in ("__array_interface__", "__array_struct__"):
      raise AttributeError(name)
    self._touch()


class _Touched(Exception):
  pass


def reads_run_data(config, s: dict, fold) -> bool:
  """Whether building `config`'s method (every stage) reads the run's data (its store, its
  tuning split or held-out examples), which is then baked into the compiled program."""
  probe = _Probe()
  ctx = algorithms.context(config, s["model"], s["sched"], s["num_clients"], s["cohort"],
                           num_domains=len(fold.domain_names), train_domains=fold.train_domains,
                           store=probe, tune_store=probe, heldout_val=probe)
  try:
    algorithms.Builder(ctx)()
    for _, _, build in algorithms.later_stages(ctx):
      build()
  except Exception:  # pylint: disable=broad-except  # a build that failed on the probe read it
    return True
  return probe.touched


def _shapes(tree) -> tuple:
  return tuple((tuple(a.shape), str(a.dtype)) for a in jax.tree.leaves(tree))


def _data_id(run) -> tuple:
  """Runs with equal ids hold equal data: the same fold (splits) and the same seed (partition)."""
  return (int(run.config.seed), id(run.fold))


def _eval_id(config) -> str:
  return rundir.canonical_json(rundir.plain(config.data.to_dict()))


def _program_key(run) -> tuple:
  """Runs with equal keys share one compiled program."""
  s = run.s
  shapes = (_shapes(s["packed"]), s["sched"].num_steps, s["sched"].passes,
            tuple((k, _shapes((v.x, v.y, v.domain))) for k, v in run.fold.eval_splits().items()))
  return _data_id(run) if run.reads_data else shapes


def _stack(trees):
  return jax.tree.map(lambda *a: jnp.stack(a), *trees)


@jax.jit
def _take(tree, r):
  return jax.tree.map(lambda a: a[r], tree)


def _pick(tree, r: int):
  """Run `r`'s slice of every leaf of the stacked `tree`: one compiled gather for the whole
  tree, not one dispatch per leaf (a record or a checkpoint of a run reads its state)."""
  return _take(tree, jnp.int32(r))


def _put(tree, r: int, one):
  return jax.tree.map(lambda a, x: a.at[r].set(x), tree, one)


class BatchEvaluator:
  """Every split's predictions for every run of a batch in one call per split (`vmap` of the
  runner's `Evaluator` prediction over the run axis); the data shared by all runs when their
  splits are equal, stacked per run otherwise. Metrics as the runner's `Evaluator`."""

  def __init__(self, model, folds: list, batch_size: int, axis: str = "vmap"):
    self.folds = folds
    self.shared = len(folds) == 1
    self.splits = [{k: v for k, v in f.eval_splits().items() if len(v)} for f in folds]
    self.padded = {}
    for name in self.splits[0]:
      xs = []
      for sp in self.splits:
        s = sp[name]
        nb = math.ceil(len(s) / batch_size)
        x = np.zeros((nb * batch_size,) + s.x.shape[1:], s.x.dtype)
        x[:len(s)] = s.x
        xs.append(x.reshape((nb, batch_size) + s.x.shape[1:]))
      self.padded[name] = jnp.asarray(xs[0] if self.shared else np.stack(xs))

    def predict(params, xb):
      pred = jax.lax.map(lambda x: jnp.argmax(model.apply(params, x), -1), xb)  # [batches, B, ...]
      return pred.reshape((-1,) + pred.shape[2:])
    if axis == "map":  # each run's predictions through the single run's program (`Evaluator`)
      if self.shared:
        self._predict = jax.jit(lambda params, xb: jax.lax.map(lambda p: predict(p, xb), params))
      else:
        self._predict = jax.jit(lambda params, xb: jax.lax.map(lambda a: predict(*a), (params, xb)))
    else:
      self._predict = jax.jit(jax.vmap(predict, in_axes=(0, None if self.shared else 0)))

  def __call__(self, params, runs) -> dict:
    """`{run: {split: metrics}}` for the runs `runs` of the stacked `params`."""
    preds = {k: np.asarray(self._predict(params, xb)) for k, xb in self.padded.items()}
    out = {}
    for r in runs:
      f = self.folds[0 if self.shared else r]
      sp = self.splits[0 if self.shared else r]
      res = {}
      for k, p in preds.items():
        s = sp[k]
        p = p[r][:len(s)]
        res[k] = f.metrics(p, s) if f.metrics is not None else classification_metrics(p, s.y, s.domain, f.num_classes)
      out[r] = res
    return out


# ----------------------------------------------------------------------------- runs

class _Run(NamedTuple):
  index: int
  config: Any
  workdir: str
  fold: Any
  run: str
  s: dict
  book: Any
  reads_data: bool


def _fold(config):
  from fedjax_dg.data import datasets, splits
  d = config.data
  if d.name == "wilds":
    from fedjax_dg.data import wilds
    return wilds.load_fold(d)
  return splits.fold_from_config(datasets.load_dataset(d), d)


def _loops(config, s) -> bool:
  """Whether the batch runs one run after another: strategies that cannot be vmapped, and
  inputs or client states held in host memory."""
  e = config.engine
  return s["strategy"] == "host_loop" or bool(e.get("host_store", False)) or bool(e.get("host_client_states", False))


def train_and_evaluate_batch(configs, workdirs) -> list:
  """Runs the validated `configs` (equal `static_key`) as one compiled program per stage,
  each into its workdir (an ordinary run directory; leave-one-domain-out runs: one batch
  per fold, into each run's `fold_<d>`, then each run's folds' summary). Returns, per run,
  its summary dict or the exception that ended it (a `FloatingPointError` for a run that
  diverged; a `ConfigError` for a run directory that cannot be resumed). A bad run list (a
  differing static field, a value out of its range) is refused in one line before anything
  compiles."""
  configs = [experiment.with_loader(c) for c in configs]
  workdirs = [str(w) for w in workdirs]
  check_batch(configs, workdirs)
  if configs[0].data.get("leave_one_domain_out", False):
    return _lodo(configs, workdirs)
  folds, cache = [], {}
  for c in configs:
    key = _eval_id(c)
    if key not in cache:
      cache[key] = _fold(c)
    folds.append(cache[key])
  with contextlib.ExitStack() as owned:
    for w in workdirs:
      owned.enter_context(rundir.owned(w))
    return _batch_folds(configs, folds, workdirs, list(range(len(configs))), len(configs))


def _lodo(configs, workdirs) -> list:
  """Leave-one-domain-out runs: fold `j` of every run in one batch, fold after fold."""
  from fedjax_dg.data import datasets
  folds, cache = [], {}
  for c in configs:
    key = _eval_id(c)
    if key not in cache:
      cache[key] = experiment.lodo_folds(datasets.load_dataset(c.data), c.data)
    folds.append(cache[key])
  results: list = [None] * len(configs)
  done: list = [[] for _ in configs]
  with contextlib.ExitStack() as owned:
    for i, (c, w) in enumerate(zip(configs, workdirs)):
      owned.enter_context(rundir.owned(w))
      try:
        experiment.check_lodo_workdir(c, w)
      except ConfigError as e:
        results[i] = e
    for j in range(len(folds[0])):
      live = [i for i in range(len(configs)) if results[i] is None]
      if not live:
        break
      dirs = [experiment.fold_dir(workdirs[i], folds[i][j]) for i in live]
      with contextlib.ExitStack() as fold_owned:
        for d in dirs:
          fold_owned.enter_context(rundir.owned(d))
        out = _batch_folds([configs[i] for i in live], [folds[i][j] for i in live], dirs, live, len(configs))
      for i, o in zip(live, out):
        if isinstance(o, BaseException):
          results[i] = o
        else:
          done[i].append(o)
    for i, c in enumerate(configs):
      if results[i] is None:
        results[i] = experiment.write_lodo_summary(c, workdirs[i], folds[i], done[i])
  return results


def _batch_folds(configs, folds, workdirs, indices, size) -> list:
  """The runs `configs` on their `folds`, into `workdirs` (owned by the caller); `indices`:
  their places in the batch of `size` runs."""
  results: list = [None] * len(configs)
  runs = []
  for i, (c, w, f) in enumerate(zip(configs, workdirs, folds)):
    try:
      runs.append((i, experiment.prepare_run(c, f, w)))  # every run directory checked before compiling
    except (ConfigError, ValueError) as e:
      results[i] = e
  setups = {}
  if runs:
    i = runs[0][0]
    setups[i] = experiment.setup(configs[i], folds[i])
    if _loops(configs[i], setups[i]):
      return _one_after_another(configs, workdirs, folds, runs, results, indices, size)
  built = []
  for i, run in runs:
    s = setups.pop(i) if i in setups else experiment.setup(configs[i], folds[i])
    reads = reads_run_data(configs[i], s, folds[i])
    built.append(_Run(indices[i], configs[i], workdirs[i], folds[i], run, s,
                      experiment.RunBook(configs[i], folds[i], workdirs[i], run, s), reads))
  groups: dict = {}
  for r in built:
    groups.setdefault(_program_key(r), []).append(r)
  for group in groups.values():
    for r, out in zip(group, _run_program(group, size)):
      results[indices.index(r.index)] = out
  return results


def _one_after_another(configs, workdirs, folds, runs, results, indices, size) -> list:
  """The runs as ordinary runs, one after another (host_loop, host-held inputs)."""
  for i, run in runs:
    try:
      summary = experiment._run_fold(configs[i], folds[i], workdirs[i], run)  # pylint: disable=protected-access
    except FloatingPointError as e:
      results[i] = e
      continue
    summary["batch"] = {"size": size, "index": indices[i], "vectorized": False}
    rundir.write_summary(workdirs[i], summary)
    results[i] = summary
  return results


@jax.jit
def _finite_flags(params, state):
  """Per run: whether its model parameters, and its whole round state, are finite."""
  def one(p, st):
    flag = lambda t: jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(t)
                                        if jnp.issubdtype(x.dtype, jnp.inexact)] or [jnp.bool_(True)]))
    return flag(p), flag(st)
  return jax.vmap(one)(params, state)


def run_axis(config) -> str:
  """`engine.run_axis` resolved: "auto" is "map" on CPU, "vmap" on GPU and TPU.

  "map" (`jax.lax.map`, a loop over the run axis inside the one compiled program) runs each
  run through the single run's own round, so its arithmetic is the single run's bit for bit
  on CPU and the program compiles in about a single run's time. "vmap" adds the run axis to
  every array: it fills a GPU with many small runs, but its batched matrix products sum in
  another order (results equal the single run's to float32 rounding, which a long run may
  amplify), and XLA:CPU gains nothing from the extra axis while compiling it takes several
  times longer (docs/batched_runs.md)."""
  axis = config.engine.get("run_axis", "auto")
  if axis == "auto":
    return "map" if jax.default_backend() == "cpu" else "vmap"
  return axis


@jax.jit
def _round_keys(k_rounds, rounds):
  """`[runs, rounds, 2]`: every run's key of every round, `fold_in(k_rounds[r], t)` (as a
  single run draws it), in one call instead of one per run and round."""
  return jax.vmap(lambda k: jax.vmap(lambda t: jax.random.fold_in(k, t))(rounds))(k_rounds)


def _batched_round(round_fn, store_axis, axis: str = "vmap"):
  """`step(states, store, keys, active) -> (states, metrics)`: the round over the run axis,
  `vmap`ped or (`axis="map"`) looped with `jax.lax.map`; a run not active (waiting for its
  start, or failed) keeps its state."""
  if axis == "map":
    def step(state, store, keys, active):
      def one(x):
        st, k, a = x[:3]
        new, metrics = round_fn(st, store if store_axis is None else x[3], k)
        return tree_where(a, new, st), metrics
      return jax.lax.map(one, (state, keys, active) if store_axis is None else (state, keys, active, store))
    return jax.jit(step)

  def step(state, store, keys, active):
    new, metrics = jax.vmap(lambda st, sto, k: round_fn(st, sto, k), in_axes=(0, store_axis, 0))(state, store, keys)
    return jax.vmap(tree_where)(active, new, state), metrics
  return jax.jit(step)


def _run_program(group: list, size: int) -> list:
  """One compiled program (per stage) for the runs of `group`."""
  timing = experiment.Timing()
  R = len(group)
  books = [r.book for r in group]
  s0, b0 = group[0].s, books[0]
  stages, total = b0.stages, b0.total
  params = [b.initial_params() for b in books]
  init = [b.initial_state(p) for b, p in zip(books, params)]
  shared = len({_data_id(r) for r in group}) == 1
  stores = [jax.tree.map(jnp.asarray, r.s["packed"]) for r in (group[:1] if shared else group)]
  store = stores[0] if shared else _stack(stores)
  comm = experiment._communication(stages[0].algorithm, init[0], stores[0], s0["cohort"], b0.k_rounds)  # pylint: disable=protected-access
  out: list = [None] * R
  starts, states = [None] * R, [None] * R
  opened = []
  try:
    for r, b in enumerate(books):
      try:
        starts[r], states[r] = b.open(init[r])
        opened.append(r)
      except (ConfigError, ValueError) as e:  # this run's directory cannot be resumed; the others go on
        out[r] = e
    live = [r for r in range(R) if out[r] is None]
    stopped = _train(group, books, live, starts, states, store, None if shared else 0, timing) if live else None
  except BaseException:
    for r in opened:
      books[r].close(failed=True)
    raise
  if stopped:  # every run's checkpoint of the stop round written, nothing summarised
    for r in opened:
      books[r].close()
    raise stopping.Stopped(*stopped, saved=all(bool(g.config.checkpoint_every) for g in group))
  summary_timing = timing.summary()
  for r in range(R):
    if out[r] is None and books[r].failed is None:
      books[r].close()
      out[r] = books[r].summary(comm, params[r], summary_timing, batch={"size": size, "index": group[r].index})
    elif out[r] is None:
      out[r] = books[r].failed
  return out


def _train(group, books, live, starts, states, store, store_axis, timing):
  """The rounds of the batch, from the smallest start round of its live runs; returns
  (signal, round) when a signal stopped them (`fedjax_dg.stopping`), else None."""
  R = len(books)
  b0 = books[0]
  stages, total = b0.stages, b0.total
  t0 = min(starts[r] for r in live)
  ref = next(r for r in live if starts[r] == t0)
  state = _stack([states[r] if (r in live and starts[r] == t0) else states[ref] for r in range(R)])
  active = np.zeros(R, bool)
  axis = run_axis(group[0].config)
  steps = [_batched_round(st.round_fn, store_axis, axis) for st in stages]
  same_splits = all(r.fold is group[0].fold for r in group)
  evaluator = BatchEvaluator(group[0].s["model"], [group[0].fold] if same_splits else [r.fold for r in group],
                             group[0].config.eval_batch_size, axis)
  bar = tqdm(total=total - t0, desc=f"round (batch of {R})", dynamic_ncols=True,
             disable=all(r.config.get("quiet", False) for r in group))
  compiled = set()
  round_keys = np.asarray(_round_keys(jnp.stack([b.k_rounds for b in books]), jnp.arange(total)))

  def evaluate(done, k, runs, losses):
    since = time.time()
    params = jax.vmap(stages[k].algorithm.params_of)(state.server)
    scores = evaluator(params, runs)
    for r in runs:
      loss = None if losses is None else float(losses[r])
      books[r].record(done, k, _pick(state, r), loss, scores[r])
    timing.add("eval_s", since)

  def join(t):  # runs whose own start is round t enter the batch (and evaluate a lost evaluation)
    nonlocal state
    new = [r for r in live if starts[r] == t and not active[r]]
    for r in new:
      if t != t0:
        state = _put(state, r, states[r])
      active[r] = True
    again = [r for r in new if books[r].again]
    if again:
      evaluate(t, b0.stage_of(t), again, None)

  with bar, stopping.StopRequest() as stop:
    for t in range(t0, total):
      join(t)
      k = b0.stage_of(t + 1)
      st = stages[k]
      if k > 0 and t == st.first:
        state = _stack([books[r].next_stage_state(k, _pick(state, r)) for r in range(R)])
      keys = jnp.asarray(round_keys[:, t])
      since = time.time()
      state, metrics = steps[k](state, store, keys, jnp.asarray(active))
      losses = np.asarray(metrics["train_loss"])  # waits for the round
      timing.add("train_s" if k in compiled else "compile_s", since)
      compiled.add(k)
      done = t + 1
      running = [r for r in range(R) if active[r]]
      if "reporters" in metrics:
        rep = np.asarray(metrics["reporters"])
        for r in running:
          books[r].reporters.append(int(rep[r]))
      due = {r: books[r].checks_due(done) for r in running}
      signame = stop.requested() if done < total else None
      if signame:  # stop after this round: every running run saves it (its own checkpoint cadence aside)
        due = {r: (due[r][0], bool(books[r].config.checkpoint_every)) for r in running}
      checked = [r for r in running if any(due[r])]
      if checked:  # never evaluate or save a diverged state (experiment._check_state's order)
        pf, sf = map(np.asarray, _finite_flags(jax.vmap(st.algorithm.params_of)(state.server), state))
        for r in checked:
          err = experiment.divergence(float(losses[r]), pf[r], sf[r], done, group[r].config)
          if err:
            books[r].failed = FloatingPointError(err)
            books[r].close(failed=True)
            active[r] = False
      ev = [r for r in checked if active[r] and due[r][0]]
      if ev:
        evaluate(done, k, ev, losses)
      saves = [r for r in checked if active[r] and due[r][1]]
      if saves:
        since = time.time()
        for r in saves:
          books[r].ckpts.save(done, _pick(state, r))
        timing.add("checkpoint_s", since)
      bar.update(1)
      if signame:
        return signame, done
  join(total)  # a run already finished: its lost last evaluation
  return None


# ----------------------------------------------------------------------------- run lists

RUN_LIST_FILE = "runs.json"


def expand(config, workdir: str) -> tuple[list, list]:
  """`config.runs` -> (one config per run, its workdir `<workdir>/run_<i>`)."""
  import copy
  base = copy.deepcopy(config)
  with base.unlocked():
    base.runs = ()
  known = rundir.flatten(base)
  configs = []
  for i, entry in enumerate(config.runs):
    c = copy.deepcopy(base)
    for field, value in checks.parse_run(entry, i, known).items():
      *path, last = field.split(".")
      node = c
      for p in path:
        node = node[p]
      try:
        node[last] = tuple(value) if isinstance(value, list) else value
      except (TypeError, ValueError) as e:
        raise ConfigError(f"runs[{i}]: {field}={value!r}: {' '.join(str(e).split())}") from None
    configs.append(c)
  return configs, [os.path.join(workdir, f"run_{i}") for i in range(len(configs))]


def run_list(config, workdir: str) -> dict:
  """The CLI's batch (`config.runs`): every run into `<workdir>/run_<i>`, a list of the runs
  and their outcomes in `<workdir>/runs.json`. A run that failed is reported (one line)
  after the others finished."""
  configs, workdirs = expand(config, workdir)
  results = train_and_evaluate_batch(configs, workdirs)
  runs = [{"workdir": w, "overrides": entry, "static_key": static_key(c),
           **({"error": " ".join(str(r).split())} if isinstance(r, BaseException) else
              {"selection": r["selection"]})}
          for c, w, entry, r in zip(configs, workdirs, config.runs, results)]
  os.makedirs(workdir, exist_ok=True)
  text = json.dumps({"runs": runs}, indent=1, default=rundir.json_default)
  rundir.atomic_write(os.path.join(workdir, RUN_LIST_FILE), text.encode())
  failed = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
  if failed:
    i, e = failed[0]
    more = f" (and {len(failed) - 1} more run(s))" if len(failed) > 1 else ""
    raise type(e)(f"run {i} ({workdirs[i]}): {' '.join(str(e).split())}{more}; the other runs' results are in "
                  f"their directories ({RUN_LIST_FILE})")
  return {"config": config.to_dict(), "runs": runs, "selection": {}}
