"""Re-scores a finished run's selected parameters on any split, or on another data set config.

    python -m fedjax_dg.evaluate --workdir W [--rule heldout_domain] [--config.data.<field>=<value> ...]

A run keeps, in `W/selected/`, the parameters at the round each selection rule chose
(fedjax_dg/rundir.py), and its resolved config in `W/config.json`. This loads both,
applies the `--config.data.*` (and `--config.eval_batch_size`) overrides, builds the data
set's fold and prints every evaluation split's metrics as JSON. Fields that define the
model or training (anything outside `data.*`) cannot change: the parameters fit one model.
With no overrides the metrics equal the selected round's in `W/metrics.jsonl`.
"""
from __future__ import annotations

import json
import os
import sys

from absl import app, flags

from fedjax_dg import rundir
from fedjax_dg.errors import ConfigError


def run_config(workdir: str):
  """The config `workdir`'s run stored; a leave-one-domain-out fold's own domains filled in."""
  stored = rundir.read_run_config(workdir)
  if stored is None:
    raise FileNotFoundError(f"{os.path.join(workdir, rundir.CONFIG_FILE)}: no stored run config "
                            "(not a run's workdir, or a run older than this version)")
  config = rundir.config_from_json(stored["config"])
  fold = stored.get("fold")
  if config.data.get("leave_one_domain_out", False) and fold:
    config.data.leave_one_domain_out = False
    config.data.test_domains, config.data.val_domains = tuple(fold["test_domains"]), tuple(fold["val_domains"])
  return config


def _load_fold(config):
  from fedjax_dg.data import datasets, splits
  d = config.data
  if d.name == "wilds":
    from fedjax_dg.data import wilds
    return wilds.load_fold(d)
  if d.get("leave_one_domain_out", False):
    raise ConfigError("data.leave_one_domain_out: re-score one fold at a time (--workdir W/fold_<d>)")
  return splits.fold_from_config(datasets.load_dataset(d), d)


def rescore(workdir: str, rule: str = "heldout_domain", config=None) -> dict:
  """Every evaluation split's metrics for the parameters `rule` selected in `workdir`'s run,
  on `config`'s data (default: the run's own)."""
  import jax
  from fedjax_dg import algorithms
  from fedjax_dg import config as config_lib
  from fedjax_dg.eval.evaluate import SELECTION_RULES, Evaluator
  from fedjax_dg.models import build_model
  if rule not in SELECTION_RULES:
    raise ConfigError(f"--rule: unknown selection rule {rule!r}; choose one of {list(SELECTION_RULES)}")
  base = run_config(workdir)
  config = base if config is None else config
  old, new = rundir.flatten(base.to_dict()), rundir.flatten(config.to_dict())
  changed = [k for k in sorted(set(old) | set(new))
             if not k.startswith("data.") and k not in rundir.RESULT_NEUTRAL and old.get(k) != new.get(k)]
  if changed:
    raise ConfigError(f"{changed[0]}: the saved parameters fit the run's model and method; a re-scoring "
                      "may change only data.* and eval_batch_size")
  config_lib.validate(config)
  fold = _load_fold(config)
  model = algorithms.model_for(config, build_model(config.model, fold.train.x.shape[1:], fold.num_classes))
  target = jax.eval_shape(model.init, jax.random.PRNGKey(0))
  params, meta = rundir.load_selected(workdir, rule, target)
  splits = Evaluator(model, fold.eval_splits(), fold.num_classes, config.eval_batch_size)(params)
  return {"workdir": workdir, "rule": rule, "round": meta["round"],
          "domains": {"test": list(fold.test_domains), "val": list(fold.val_domains)}, "splits": splits}


USAGE = __doc__


def _workdir_arg(argv) -> str | None:
  for k, a in enumerate(argv):
    if a.startswith("--workdir="):
      return a.split("=", 1)[1]
    if a == "--workdir" and k + 1 < len(argv):
      return argv[k + 1]
  return None


def run():
  from fedjax_dg import main as main_lib
  from fedjax_dg.eval.evaluate import SELECTION_RULES
  from ml_collections import config_flags
  argv = sys.argv
  if any(a in main_lib.HELP_FLAGS for a in argv[1:]):
    print(USAGE)
    sys.exit(0)
  workdir = _workdir_arg(argv[1:])
  try:
    if not workdir:
      raise ConfigError("--workdir: the run's workdir is required")
    config = run_config(workdir)
  except (ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  if "workdir" not in flags.FLAGS:  # fedjax_dg.main defines it too
    flags.DEFINE_string("workdir", None, "The run's workdir (holds config.json and selected/).")
  rule = flags.DEFINE_enum("rule", "heldout_domain", list(SELECTION_RULES), "Whose selected parameters to score.")
  cfg = config_flags.DEFINE_config_dict("config", config, "The run's config; override data.* fields.")

  def main(argv):
    del argv
    main_lib.quiet_logs()
    main_lib.one_line_warnings()
    try:
      out = rescore(workdir, rule.value, cfg.value)
    except (ValueError, OSError, FloatingPointError) as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
    print(json.dumps(out, indent=2))
    return 0

  app.run(lambda a: sys.exit(main(a)), flags_parser=main_lib.parse_flags)


if __name__ == "__main__":
  run()
