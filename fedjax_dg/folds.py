"""Which data a config runs on: its fold, or its leave-one-domain-out folds.

  load_fold(config)           the one fold of a run (WILDS: its official split scheme;
                              otherwise `splits.fold_from_config`, R_DG's carve included)
  lodo_folds(dataset, data)   every leave-one-domain-out fold (`data.lodo_validation`)
  fold_dir(workdir, fold)     where a fold's run goes: `workdir/fold_<d>`
  write_lodo_summary(...)     the folds' summary.json: each rule's test accuracy over folds
  with_loader(config)         the config naming a registered dataset's loader in
                              `data.loader`, so a run's config.json can load its data again
"""
from __future__ import annotations

import copy
import os

import numpy as np

from fedjax_dg import rundir
from fedjax_dg.data import datasets, splits
from fedjax_dg.errors import ConfigError
from fedjax_dg.eval.evaluate import SELECTION_RULES


def load_fold(config) -> splits.Fold:
  """The fold a (non leave-one-domain-out) run of `config` trains and tests on."""
  d = config.data
  if d.name == "wilds":  # the official split scheme, not a split by domains
    from fedjax_dg.data import wilds
    return wilds.load_fold(d)
  return splits.fold_from_config(datasets.load_dataset(d), d)


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
    raise ConfigError(f"workdir {workdir!r} already holds results ({rundir.SUMMARY_FILE}); pass "
                                 "--config.resume=True to continue that run or choose another --config.workdir")


def write_lodo_summary(config, workdir: str, folds, summaries) -> dict:
  """The folds' summary.json in `workdir`: each rule's test accuracy over the folds."""
  out = {"config": config.to_dict(), "folds": [fold_dir(workdir, f) for f in folds], "selection": {}}
  for rule in SELECTION_RULES:
    out["selection"].update(lodo_summary(rule, folds, summaries, folds[0].domain_names))
  rundir.write_summary(workdir, out)
  return out
