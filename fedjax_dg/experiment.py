"""The runner's entry point: config -> data -> plan -> rounds, with evaluation, selection and
checkpoints.

`train_and_evaluate(config, workdir)` writes into `workdir`:
  metrics.jsonl   one line per evaluation: round, train loss, every split's metrics, and how
                  much the method's own term acted in the evaluated round
  summary.json    config, wall time, communication, and per selection rule the selected
                  round and the test metrics there (its keys: `train_and_evaluate`)
  checkpoints/    orbax checkpoints of the round state every `checkpoint_every` rounds
  LOCK, config.json, selected/   see fedjax_dg/rundir.py; checkpoint_sums/: fedjax_dg/checkpoint.py
One process owns a workdir at a time (LOCK). With `config.resume`, a run restarts from the
newest intact checkpoint of its own (or from round 0); because round `t` uses the key
`fold_in(key, t)`, a killed and resumed run ends with the same metrics as an uninterrupted
one. A resume must keep every result-changing field of the stored config and every
evaluation up to its checkpoint (one missing at the checkpoint's own round is evaluated
again; any other is refused); an extended run keeps one evaluation schedule. A fresh run
refuses a workdir holding another run's results, checkpoints or selected parameters.
Leave-one-domain-out runs each fold in `workdir/fold_<d>`; a run list (`config.runs`) each
run in `workdir/run_<i>` (`fedjax_dg.batch`).

The runner's modules, one job each:
  config, checks   validate the config before anything is read or compiled
  folds            which data a config runs on (its fold, or its leave-one-domain-out folds)
  plan             the run plan resolved once from config and data, and the prepared run
  loop             the round loop, written once, over one run (`Solo`) or R stacked (`Stacked`)
  runbook          one run's directory: resume, records, selection, checkpoints, summary
  batch            runs that share one compiled program, and run lists
  experiment       this entry point
"""
from __future__ import annotations

import contextlib

import ml_collections

from fedjax_dg import config as config_lib
from fedjax_dg import batch as batch_lib
from fedjax_dg import distributed
from fedjax_dg import folds as folds_lib
from fedjax_dg import loop
from fedjax_dg import plan as plan_lib
from fedjax_dg import rundir
from fedjax_dg.data import datasets, splits
from fedjax_dg.runbook import RunBook, prepare_directory as prepare_run  # noqa: F401


def run_fold(config, fold: splits.Fold, workdir: str) -> dict:
  """One run on `fold` in `workdir`, which this process owns (LOCK) while it runs.

  Args:
    config: a validated config; `config.data` is what the run records as its data.
    fold: the data splits to train and evaluate on.
    workdir: the run directory.

  Returns:
    The run's summary (`train_and_evaluate` lists its keys).

  Raises:
    ConfigError: a run directory that cannot be used, or a check that needs the data.
    FloatingPointError: the run diverged (one line naming the round and the step sizes).
  """
  config = folds_lib.with_loader(config)
  with contextlib.ExitStack() as owned:
    error = None
    try:  # before anything compiles; every process learns whether any failed (jax.distributed)
      owned.enter_context(rundir.owned(workdir))
      run = prepare_run(config, fold, workdir)
      prepared = plan_lib.prepare(config, fold)
    except Exception as e:  # pylint: disable=broad-except  # raised again by `agree`
      error = e
    distributed.agree(config, error)
    book = RunBook(config, fold, workdir, run, prepared)
    return loop.run_one(prepared, fold, book)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
  """Trains and evaluates the run (or runs) `config` describes.

  A plain config trains one run into `workdir`; with `data.leave_one_domain_out`, one run
  per fold into `workdir/fold_<d>` and the folds' summary into `workdir`; with `config.runs`,
  a batch of runs into `workdir/run_<i>` (`fedjax_dg.batch.run_list`).

  Args:
    config: an `ml_collections.ConfigDict` built on `configs/default.py`'s `get_config()`;
      every field is checked before any data is read or anything compiles.
    workdir: the run directory; None: `config.workdir`.

  Returns:
    The summary dict written to `workdir/summary.json`. For one run its keys are:
    `run` (the run's identity), `config`, `wall_time_s`, `timing` (`compile_s`, `train_s`,
    `eval_s`, `checkpoint_s`, `total_s`, `median_round_s`), `strategy` and `engine` (the
    execution strategy and how it was chosen), `backend`, `devices`, `processes`,
    `num_clients`, `client_sizes`, `num_params`, `local_steps`, `provenance` (code,
    libraries, machine), `communication` (bytes per round and what travels besides the
    model), `stages`, `domains` (names; train, validation and test domains), `selection`
    (per selection rule, "heldout_domain" and "in_domain": the selected `round` and the
    `val` and `test` metrics there, or None), `selection_scope`, `selected_params` (the
    saved parameters of each selected round), `final` (the last evaluation record),
    `activity` (the mean over the run of each activity value of the method) and
    `preflight` (what the checks before training found about whether the method can act).
    A leave-one-domain-out summary has `config`, `folds` and `selection` (per rule: the
    test accuracy's mean and std over the folds, per fold and per domain); a run list's
    has `config`, `runs` (each run's workdir, overrides and selection or error) and
    `selection` (empty).

  Raises:
    ConfigError: a bad config or run directory, in one line naming the field or file.
    FloatingPointError: a single run diverged.
  """
  distributed.initialize(config)  # config.distributed: before anything else uses JAX
  error = None
  try:
    config_lib.validate(config)
  except Exception as e:  # pylint: disable=broad-except  # raised again by `agree`, in every process
    error = e
  distributed.agree(config, error)
  config = folds_lib.with_loader(config)
  workdir = workdir or config.workdir
  if config.get("runs", ()):  # a batch of runs in one program
    return batch_lib.run_list(config, workdir)
  d = config.data
  if not d.leave_one_domain_out or d.name == "wilds":
    return run_fold(config, folds_lib.load_fold(config), workdir)
  folds = folds_lib.lodo_folds(datasets.load_dataset(d), d)
  with rundir.owned(workdir):  # the folds' summary is this workdir's
    folds_lib.check_lodo_workdir(config, workdir)
    summaries = [run_fold(config, fold, folds_lib.fold_dir(workdir, fold)) for fold in folds]
    return folds_lib.write_lodo_summary(config, workdir, folds, summaries)
