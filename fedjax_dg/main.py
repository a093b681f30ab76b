"""Command line: `fedjax-dg --config configs/default.py --config.num_clients=50`."""
from __future__ import annotations

import json
import os
import re
import sys
import warnings

from absl import app, flags
from ml_collections import config_flags

_CONFIG = None  # defined in `run`
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
  one_line_warnings()
  try:
    config = _CONFIG.value
    config.keys()  # a file that failed to load raises here, on first use
  except Exception as e:  # pylint: disable=broad-except  # ml_collections loads the file lazily, here
    print(f"error: {_config_load_error(e)}", file=sys.stderr)
    return 2
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


USAGE = """fedjax-dg: federated domain generalization runs from an ml_collections config.

  fedjax-dg --config configs/default.py [--config.<field>=<value> ...] [--workdir DIR]
  python -m fedjax_dg --config configs/default.py --config.algorithm.name=fedprox --config.partition.lam=0.1

Every field of the config file is a flag --config.<field> (configs/default.py documents
each). The main ones:
  data.name                        rotated_digits (embedded), spurious, rotated_mnist, colored_mnist,
                                   image_folder, wilds, tfds
  data.test_domains, data.val_domains   test and held-out validation domain ids
  data.leave_one_domain_out        every domain as the test domain once
  partition.method, partition.lam  heterogeneous (seed 001, lam in [0, 1]), dirichlet, iid
  num_clients, cohort_size, cohort_fraction
  algorithm.name                   the method (README "Methods"); its hyperparameters are
                                   algorithm.<method>.<field>, e.g. algorithm.fedprox.mu
  client.optimizer, client.lr, client.momentum, client.batch_size, client.local_epochs, client.local_steps
  server.lr, server.momentum       eta_g, FedAvgM momentum (server.b1, b2, eps: FedAdam / FedYogi)
  model.name                       cnn, mlp, resnet18, resnet50
  engine.strategy                  auto, vmap, chunked, sequential, host_loop
  num_rounds, eval_every, checkpoint_every, resume, workdir, quiet
Writes metrics.jsonl, summary.json and checkpoints/ in the workdir. Sweeps, tables and
figures: python -m fedjax_dg.bench --help.
"""

HELP_FLAGS = ("-h", "--help", "-help", "-?")


def print_help(module: str, usage: str) -> None:
  """The usage text and the flags `module` defines (absl's --help shows only the flags of
  the script's own module, which a console script has none of)."""
  print(usage)
  print("Flags:" + flags.FLAGS.module_help(module).split(":", 1)[1].rstrip())
  print("  --helpfull: every flag, JAX's and absl's included")


def _config_path() -> str:
  args = sys.argv[1:]
  for k, a in enumerate(args):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and k + 1 < len(args):
      return args[k + 1]
  return "?"


def _root_cause(e: BaseException) -> str:
  while (e.__cause__ or e.__context__) is not None:
    e = e.__cause__ or e.__context__
  lines = str(e).strip().splitlines()
  return f"{type(e).__name__}: {lines[0] if lines else ''}"


def _config_load_error(e: BaseException) -> str:
  path = _config_path()
  if not os.path.isfile(path.split(":", 1)[0]):
    return f"--config {path}: no such config file"
  return f"--config {path}: cannot load the config file ({_root_cause(e)})"


def one_line_warnings() -> None:
  """Warnings print as `warning: <message>`, one line (Python's format adds the source line)."""
  warnings.formatwarning = lambda message, category, *a, **k: f"warning: {message}\n"


def _config_flag_error(e: Exception, argv: list[str]) -> str:
  """ml_collections' error for an unknown `--config.<field>` (a KeyError with a "did you
  mean", wrapped in an AttributeError, ~50 lines of traceback) as one line."""
  from fedjax_dg.config import unknown_key_error
  text = str(e)
  m = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
  bad = m.group(2) if m else next(iter(re.findall(r"'([^'\\]+)", text)), text.strip("'\""))
  flag = next((a.split("=")[0] for a in argv[1:] if a.startswith("--config.")
               and bad in a.split("=")[0][len("--config."):].split(".")), None)
  if flag is None:
    return f"no config field {bad!r}"
  return unknown_key_error(flag[len("--config."):], prefix="--config.")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with a bad flag or config override as one line and exit status 2."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  except (AttributeError, KeyError) as e:  # ml_collections: an unknown --config.<field>
    msg = _config_flag_error(e, argv)
  except Exception as e:  # pylint: disable=broad-except  # the config file fails to load or run
    msg = _config_load_error(e)
  print(f"error: {msg}", file=sys.stderr)
  sys.exit(2)


def _define_flags():
  global _CONFIG
  if _CONFIG is None:
    _CONFIG = config_flags.DEFINE_config_file("config", None, "Path to an ml_collections config file.")


def run():
  _define_flags()
  if any(a in HELP_FLAGS for a in sys.argv[1:]):
    print_help(__name__, USAGE)
    sys.exit(0)
  flags.mark_flag_as_required("config")
  app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags)


if __name__ == "__main__":
  run()
