"""Command line: `fedjax-dg --config configs/default.py --config.num_clients=50`."""
from __future__ import annotations

import json
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = None  # defined in `run`, after the command line's flat names are translated
_WORKDIR = flags.DEFINE_string("workdir", None, "Overrides config.workdir.")


def _summary_line(summary) -> str:
  parts = []
  for rule, sel in summary["selection"].items():
    if sel and sel.get("test"):
      rnd = f" (round {sel['round']})" if "round" in sel else ""
      parts.append(f"{rule}-selected test accuracy {sel['test']['accuracy']:.4f}{rnd}")
  return "; ".join(parts)


def main(argv):
  del argv
  from fedjax_dg.config import ConfigError
  from fedjax_dg.experiment import train_and_evaluate
  from absl import logging
  logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint step at INFO
  config = _CONFIG.value
  if config is None:
    print("error: --config is required, e.g. --config configs/default.py", file=sys.stderr)
    return 2
  workdir = _WORKDIR.value or config.workdir
  try:
    summary = train_and_evaluate(config, workdir)
  except (ConfigError, FloatingPointError, FileNotFoundError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"done: {_summary_line(summary)}")
  print(f"results in {workdir}/summary.json")
  if "communication" in summary:
    print("communication: " + json.dumps(summary["communication"]))
  return 0


def translate_legacy(argv: list[str]) -> list[str]:
  """Rewrites flat hyperparameter flags of earlier versions (`--config.algorithm.prox_mu=0.1`)
  to their nested fields (`--config.algorithm.fedprox.mu=0.1`), saying so on stderr."""
  from fedjax_dg.algorithms import legacy_names
  legacy, out = legacy_names(), []
  for arg in argv:
    head, eq, value = arg.partition("=")
    old = head[len("--config.algorithm."):] if head.startswith("--config.algorithm.") else None
    if old in legacy and eq:
      new = [f"--config.algorithm.{path}" for path in legacy[old]]
      print(f"note: {head} is now {' and '.join(new)}", file=sys.stderr)
      out += [f"{n}={value}" for n in new]
    else:
      out.append(arg)
  return out


def _define_flags():
  global _CONFIG
  if _CONFIG is None:
    _CONFIG = config_flags.DEFINE_config_file("config", None, "Path to an ml_collections config file.")


def run():
  sys.argv[:] = translate_legacy(sys.argv)   # before the config flag reads its overrides
  _define_flags()
  flags.mark_flag_as_required("config")
  app.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
  run()
