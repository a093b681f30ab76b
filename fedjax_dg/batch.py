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
(`runbook.RunBook`, through the round loop of `fedjax_dg.loop`). Its summary.json adds `"batch": {"size", "index"}` and the batch's
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
from typing import Any, NamedTuple

import jax

from fedjax_dg import algorithms
from fedjax_dg import checks
from fedjax_dg import config as config_lib
from fedjax_dg import folds as folds_lib
from fedjax_dg import loop
from fedjax_dg import plan as plan_lib
from fedjax_dg import rundir
from fedjax_dg import runbook as runbook_lib
from fedjax_dg.algorithms.spec import SEED_FIELDS as SEEDS
from fedjax_dg.data import store as store_lib
from fedjax_dg.errors import ConfigError
from fedjax_dg.runbook import RunBook, communication, prepare_directory


# ----------------------------------------------------------------------------- static key

def continuous_fields(config) -> tuple[str, ...]:
  """The config paths of the run-time hyperparameters of `config`'s method (and its rule)."""
  return tuple(algorithms.run_time_fields(config))


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
  (`checks.round_memory`, with the strategy resolved as the runner resolves it, on one
  device where the engine shards the cohort over several), and its
  own copy of the training data (stacked per run when the seeds differ). `input_shape`
  (one example's) is read from the data when not given."""
  from fedjax_dg.engine.round import model_family
  from fedjax_dg.models import build_model
  config_lib.validate(config)
  fold = folds_lib.load_fold(config)
  shape = tuple(fold.train.x.shape[1:]) if input_shape is None else tuple(input_shape)
  model = algorithms.model_for(config, build_model(config.model, shape, fold.num_classes))
  num_clients = plan_lib.num_clients_of(config)
  cohort = config_lib.cohort_size(config, num_clients)
  n_max = math.ceil(len(fold.train) / max(1, num_clients)) * 2
  steps = plan_lib.local_steps(config.client, n_max)
  _, parallel = plan_lib.strategy_and_share(config, model_family(model, shape), model, shape, cohort, steps)
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
  name = configs[0].algorithm.name
  for i, c in enumerate(configs[1:], 1):
    if c.algorithm.name != name:  # the method decides which other fields exist: name it first
      raise ConfigError(f"run {i} ({workdirs[i]}): algorithm.name is {c.algorithm.name!r}, run 0's is {name!r}; the "
                        "runs of one batch may differ only in seeds and continuous hyperparameters")
  first = static_fields(configs[0])
  for i, c in enumerate(configs[1:], 1):
    other = static_fields(c)
    for k in sorted(set(first) | set(other)):
      if first.get(k) != other.get(k):
        raise ConfigError(f"run {i} ({workdirs[i]}): {k} is {other.get(k)!r}, run 0's is {first.get(k)!r}; the runs "
                          "of one batch may differ only in seeds and continuous hyperparameters")


# ----------------------------------------------------------------------------- data

def _shapes(tree) -> tuple:
  return tuple((tuple(a.shape), str(a.dtype)) for a in jax.tree.leaves(tree))


def _data_id(run) -> tuple:
  """Runs with equal ids hold equal data: the same fold (splits) and the same seed (partition)."""
  return (int(run.config.seed), id(run.fold))


def _eval_id(config) -> str:
  return rundir.canonical_json(rundir.plain(config.data.to_dict()))


def _program_key(run) -> tuple:
  """Runs with equal keys share one compiled program: equal data shapes, and for a method
  that prepares constants from its data (`MethodSpec.prepare`), equal data."""
  p = run.prepared
  shapes = (_shapes(p.packed), p.sched.num_steps, p.sched.passes,
            tuple((k, _shapes((v.x, v.y, v.domain))) for k, v in run.fold.eval_splits().items()))
  return _data_id(run) if p.reads_data else shapes


# ----------------------------------------------------------------------------- runs

class _Run(NamedTuple):
  index: int
  config: Any
  workdir: str
  fold: Any
  run: str
  prepared: Any  # plan.PreparedRun
  book: Any      # runbook.RunBook


def _loops(config, prepared) -> bool:
  """Whether the batch runs one run after another: strategies that cannot be vmapped, and
  inputs or client states held in host memory."""
  e = config.engine
  return (prepared.plan.strategy == "host_loop" or bool(e.get("host_store", False))
          or bool(e.get("host_client_states", False)))


def train_and_evaluate_batch(configs, workdirs) -> list:
  """Runs the validated `configs` (equal `static_key`) as one compiled program per stage,
  each into its workdir.

  Each run writes an ordinary run directory; leave-one-domain-out runs train one batch per
  fold, into each run's `fold_<d>`, then write each run's folds' summary.

  Args:
    configs: the runs' configs; they may differ only in seeds, continuous hyperparameters
      and result-neutral fields.
    workdirs: one distinct run directory per config.

  Returns:
    Per run, its summary dict or the exception that ended it (a `FloatingPointError` for a
    run that diverged; a `ConfigError` for a run directory that cannot be resumed).

  Raises:
    ConfigError: a bad run list (a differing static field, a value out of its range), in one
      line naming the run and the field, before anything compiles.
  """
  configs = [folds_lib.with_loader(c) for c in configs]
  workdirs = [str(w) for w in workdirs]
  check_batch(configs, workdirs)
  if configs[0].data.get("leave_one_domain_out", False):
    return _lodo(configs, workdirs)
  folds, cache = [], {}
  for c in configs:
    key = _eval_id(c)
    if key not in cache:
      cache[key] = folds_lib.load_fold(c)
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
      cache[key] = folds_lib.lodo_folds(datasets.load_dataset(c.data), c.data)
    folds.append(cache[key])
  results: list = [None] * len(configs)
  done: list = [[] for _ in configs]
  with contextlib.ExitStack() as owned:
    for i, (c, w) in enumerate(zip(configs, workdirs)):
      owned.enter_context(rundir.owned(w))
      try:
        folds_lib.check_lodo_workdir(c, w)
      except ConfigError as e:
        results[i] = e
    for j in range(len(folds[0])):
      live = [i for i in range(len(configs)) if results[i] is None]
      if not live:
        break
      dirs = [folds_lib.fold_dir(workdirs[i], folds[i][j]) for i in live]
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
        results[i] = folds_lib.write_lodo_summary(c, workdirs[i], folds[i], done[i])
  return results


def _batch_folds(configs, folds, workdirs, indices, size) -> list:
  """The runs `configs` on their `folds`, into `workdirs` (owned by the caller); `indices`:
  their places in the batch of `size` runs."""
  results: list = [None] * len(configs)
  built = []
  family = None
  for i, (c, w, f) in enumerate(zip(configs, workdirs, folds)):
    try:
      run = prepare_directory(c, f, w)  # every run directory checked before compiling
    except (ConfigError, ValueError) as e:
      results[i] = e
      continue
    prepared = plan_lib.prepare(c, f, family)
    family = prepared.plan.model_family  # the runs share the model: traced once
    built.append(_Run(indices[i], c, w, f, run, prepared, RunBook(c, f, w, run, prepared)))
  if built and _loops(built[0].config, built[0].prepared):
    for r in built:  # one after another, as ordinary runs (same results, same files)
      i = indices.index(r.index)
      try:
        summary = loop.run_one(r.prepared, r.fold, r.book)
      except FloatingPointError as e:
        results[i] = e
        continue
      summary["batch"] = {"size": size, "index": r.index, "vectorized": False}
      rundir.write_summary(r.workdir, summary)
      results[i] = summary
    return results
  groups: dict = {}
  for r in built:
    groups.setdefault(_program_key(r), []).append(r)
  for group in groups.values():
    for r, out in zip(group, _run_program(group, size)):
      results[indices.index(r.index)] = out
  return results


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


def _run_program(group: list, size: int) -> list:
  """One compiled program (per stage) for the runs of `group`, through the round loop."""
  books = [r.book for r in group]
  params = [b.initial_params() for b in books]
  init = [b.initial_state(p) for b, p in zip(books, params)]
  shared = len({_data_id(r) for r in group}) == 1
  stores = [store_lib.to_device(r.prepared.packed) for r in (group[:1] if shared else group)]
  store = stores[0] if shared else loop.stack(stores)
  p0 = group[0].prepared
  comm = communication(p0.stages[0].algorithm, init[0], stores[0], p0.cohort, books[0].k_rounds)
  program = loop.Stacked([r.prepared for r in group], [r.fold for r in group], books, store,
                         None if shared else 0, run_axis(group[0].config))
  return loop.run(program, books, init, comm, params, batch=[{"size": size, "index": r.index} for r in group])


# ----------------------------------------------------------------------------- run lists

RUN_LIST_FILE = runbook_lib.RUN_LIST_FILE


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
  found = rundir.holds_results(workdir)
  if found:
    raise ConfigError(f"workdir {workdir!r} holds a single run's files ({', '.join(found)}); a run list writes "
                      f"run_<i>/ and {RUN_LIST_FILE} beside no run of its own: choose another --config.workdir")
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
