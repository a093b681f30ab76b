"""Many runs as one unit of work: which runs may share a compiled program (`static_key`),
what one run adds to a batch's memory (`run_bytes`), and running a batch of runs
(`train_and_evaluate_batch`), each into its own ordinary run directory.

This version runs a batch's runs one after another in this process (each with
`experiment.train_and_evaluate`); it keeps the batch's contract: one run directory per run,
each run's `resume`, and a run that raises ends alone while the others go on.
"""
from __future__ import annotations

import hashlib
import math
import time

from fedjax_dg import algorithms, checks, rundir
from fedjax_dg import config as config_lib

# Fields a run's seed sets: runs differing in them share a program.
SEED_FIELDS = ("seed", "data.seed")
# Optimizer fields whose value is read when the round runs; only whether momentum and weight
# decay are present (> 0) shapes the optimizer (`algorithms.base.make_optimizer`).
_OPTIMIZER_VALUES = ("lr", "momentum", "weight_decay", "b1", "b2", "eps")
_OPTIMIZER_PRESENCE = ("momentum", "weight_decay")


def _continuous_fields(config) -> set[str]:
  """Dotted paths of the method's and its rule's run-time hyperparameters (`spec.continuous`)."""
  from fedjax_dg.algorithms.spec import continuous, hparam_fields
  spec, rule = algorithms.resolve(config.algorithm.name)
  out = set()
  for owner, key in ((spec, spec.key), (rule, rule.name)):
    out |= {f"algorithm.{key}.{f.name}" for f in hparam_fields(owner.hparams) if continuous(f)}
  return out


def static_key(config) -> str:
  """sha256 of the config without its seeds, continuous hyperparameters and result-neutral
  fields: runs with equal keys compute the same program on arrays of the same shapes."""
  drop = _continuous_fields(config) | set(SEED_FIELDS)
  flat = {}
  for k, v in rundir.flatten(config).items():
    if k.split(".")[0] in rundir.RESULT_NEUTRAL or k in drop:
      continue
    head, _, field = k.partition(".")
    if head in ("client", "server") and field in _OPTIMIZER_VALUES:
      if field in _OPTIMIZER_PRESENCE:
        flat[k] = float(v) > 0
      continue
    flat[k] = v
  return hashlib.sha256(rundir.canonical_json(flat).encode()).hexdigest()


def run_bytes(config) -> int:
  """Estimated device bytes of one run: the round's state, activations and index arrays
  (`checks.round_memory`, every cohort client in parallel) plus its packed training data."""
  from fedjax_dg import experiment
  from fedjax_dg.data import datasets, splits
  from fedjax_dg.models import build_model
  fold = splits.fold_from_config(datasets.load_dataset(config.data), config.data)
  num_clients = experiment._num_clients(config)  # pylint: disable=protected-access
  n_max = max(len(p) for p in experiment.partition_clients(config, fold, num_clients))
  c = config.client
  steps = c.local_steps if c.local_steps > 0 else math.ceil(c.local_epochs * n_max / c.batch_size)
  shape = fold.train.x.shape[1:]
  model = algorithms.model_for(config, build_model(config.model, shape, fold.num_classes))
  m = checks.round_memory(config, model, shape, config_lib.cohort_size(config, num_clients), steps)
  data = num_clients * n_max * (math.prod(shape) * fold.train.x.dtype.itemsize + 8)
  return int(m["state"] + m["activations"] + m["indices"] + data)


def train_and_evaluate_batch(configs, workdirs) -> list:
  """Runs `configs` (equal static keys) into `workdirs`; per run its summary dict or the
  exception that ended it. Mismatched static keys: `config.ConfigError` before any run."""
  if len(configs) != len(workdirs):
    raise config_lib.ConfigError(f"train_and_evaluate_batch: {len(configs)} configs but {len(workdirs)} workdirs")
  keys = [static_key(c) for c in configs]
  for i, k in enumerate(keys):
    if k != keys[0]:
      raise config_lib.ConfigError(f"run {i} ({workdirs[i]}): its static configuration differs from run 0's "
                                   f"({workdirs[0]}); a batch runs one program")
  from fedjax_dg import experiment
  out = []
  for c, w in zip(configs, workdirs):
    t0 = time.time()
    try:
      summary = experiment.train_and_evaluate(c, w)
    except Exception as e:  # pylint: disable=broad-except  # the run ends alone
      out.append(e)
      continue
    summary.setdefault("timing", {"compile_s": None, "train_s": None, "eval_s": None, "checkpoint_s": None,
                                  "total_s": time.time() - t0})  # this version does not split the time
    summary["batch"] = {"size": len(configs), "index": len(out)}
    rundir.write_summary(w, summary)
    out.append(summary)
  return out
