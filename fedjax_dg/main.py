"""Command line: `fedjax-dg --config configs/default.py --config.num_clients=50`."""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import warnings

from absl import app, flags
from ml_collections import config_flags

_CONFIG = None  # defined in `run`
_WORKDIR = flags.DEFINE_string("workdir", None, "Overrides config.workdir.")


def _summary_line(summary) -> str:
  """One line: each rule's selected test accuracy; over leave-one-domain-out folds the mean
  +- sample std and each test domain's accuracy by name."""
  parts = []
  for rule, sel in summary["selection"].items():
    if sel and sel.get("test"):
      test = sel["test"]
      if "per_domain_test_accuracy" in sel:
        each = ", ".join(f"{name} {acc:.4f}" for name, acc in sel["per_domain_test_accuracy"].items())
        parts.append(f"{rule}-selected test accuracy {test['accuracy']:.4f} +- {test['accuracy_std']:.4f} "
                     f"over {len(sel['per_domain_test_accuracy'])} test domains ({each})")
        continue
      rnd = f" (round {sel['round']})" if "round" in sel else ""
      parts.append(f"{rule}-selected test accuracy {test['accuracy']:.4f}{rnd}")
  return "; ".join(parts)


def _workdir_given(argv) -> bool:
  return any(a.split("=", 1)[0] in ("--workdir", "--config.workdir") for a in argv[1:])


def default_workdir(config, argv, now=None) -> str:
  """The run's workdir: `--workdir`, or `--config.workdir`, as given; otherwise the config
  file's `workdir` with the UTC start time appended (`runs/default-20250101-120000`), so two
  plain runs never collide. A resume (`--config.resume=True`) uses the config's as is."""
  import time
  if _WORKDIR.value:
    return _WORKDIR.value
  if _workdir_given(argv) or config.resume:
    return config.workdir
  return f"{config.workdir}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}"


def main(argv):
  del argv
  from fedjax_dg.config import ConfigError
  from fedjax_dg.experiment import train_and_evaluate
  quiet_logs()
  one_line_warnings()
  from fedjax_dg.checkpoint import quiet_failed_saves
  quiet_failed_saves()  # a failed checkpoint save: one line (WriteError), not orbax's tracebacks
  from fedjax_dg import compilation_cache
  compilation_cache.enable()  # ~/.cache/fedjax_dg/jax; FEDJAX_DG_COMPILATION_CACHE=off turns it off
  try:
    config = _CONFIG.value
    config.keys()  # a file that failed to load raises here, on first use
  except Exception as e:  # pylint: disable=broad-except  # ml_collections loads the file lazily, here
    print(f"error: {_config_load_error(e)}", file=sys.stderr)
    return 2
  if config is None:
    print("error: --config is required, e.g. --config configs/default.py", file=sys.stderr)
    return 2
  if not_a_config(config):
    print(f"error: {not_a_config(config)}", file=sys.stderr)
    return 2
  from fedjax_dg import distributed, stopping
  try:
    distributed.initialize(config)  # config.distributed: before anything uses JAX (a watchdog bounds it)
  except ConfigError as e:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  workdir = default_workdir(config, sys.argv)
  if distributed.mode(config) != "off" and not _workdir_given(sys.argv) and not config.resume:
    workdir = config.workdir  # every process must name the same folder: no start time appended
  if not config.get("quiet", False) and distributed.is_writer():  # the seconds before the progress bar
    print(f"{workdir}: reading the data, partitioning the clients and building the method; the first "
          "round compiles next", flush=True)
  try:
    summary = train_and_evaluate(config, workdir)
  except stopping.Stopped as e:  # SIGTERM / SIGUSR1: the round finished and saved
    if distributed.is_writer():
      print(f"stopped: {e}; resume with --workdir={workdir} --config.resume=True", file=sys.stderr)
    return 128 + int(getattr(signal, e.signame))
  except (ConfigError, FloatingPointError, OSError, ValueError) as e:  # OSError: a full disk, a file-size limit
    if distributed.process_count() > 1:
      distributed.fail(e)  # one line for the whole job, then exits
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  except Exception as e:  # pylint: disable=broad-except
    if distributed.process_count() > 1 and distributed.peer_lost(e):
      distributed.fail(e)
    raise
  if not distributed.is_writer():
    return 0
  if "runs" in summary:  # a run list: each run's line, and the list's file
    for i, r in enumerate(summary["runs"]):
      line = _summary_line(r) if "selection" in r else f"error: {r.get('error', '')}"
      print(f"run {i} ({r['workdir']}): {line or 'no selection'}")
    print(f"results in {workdir}/runs.json and each run's summary.json")
  else:
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
  data.name                        {datasets}
  data.test_domains, data.val_domains   test and held-out validation domain ids
  data.leave_one_domain_out        every domain as the test domain once
  partition.method, partition.lam  heterogeneous (Bai et al. 2024, lam in [0, 1]), dirichlet, iid
  num_clients, cohort_size, cohort_fraction
  algorithm.name                   {methods}
                                   or method+rule, rule one of {rules};
                                   hyperparameters: algorithm.<method>.<field>, e.g. algorithm.fedprox.mu
  client.optimizer, client.lr, client.momentum, client.batch_size, client.local_epochs, client.local_steps
  server.lr, server.momentum       eta_g, FedAvgM momentum (server.b1, b2, eps: FedAdam / FedYogi)
  model.name                       {models}
  engine.strategy                  auto, vmap, chunked, sequential, host_loop
  num_rounds, eval_every, checkpoint_every, resume, workdir, quiet
Writes metrics.jsonl, summary.json and checkpoints/ in the workdir: --workdir or
--config.workdir as given, otherwise the config's workdir plus the UTC start time
(runs/default-<YYYYmmdd-HHMMSS>). Sweeps, tables and figures: python -m fedjax_dg.bench --help.
"""

HELP_FLAGS = ("-h", "--help", "-help", "-?")


def usage_text() -> str:
  """USAGE with every dataset, model, method and server rule the library knows."""
  import textwrap
  from fedjax_dg import algorithms
  from fedjax_dg.data.datasets import DATASETS
  from fedjax_dg.models import MODELS
  wrap = lambda items: textwrap.fill(", ".join(items), 100, initial_indent=" " * 35,
                                    subsequent_indent=" " * 35).lstrip()
  return USAGE.format(datasets=wrap(["rotated_digits (embedded)", *[d for d in DATASETS if d != "rotated_digits"]]),
                      models=wrap(MODELS), methods=wrap(algorithms.METHODS), rules=", ".join(algorithms.RULES))


def print_help(module: str, usage: str) -> None:
  """The usage text and the flags `module` defines (absl's --help shows only the flags of
  the script's own module, which a console script has none of)."""
  print(usage)
  print("Flags:" + flags.FLAGS.module_help(module).split(":", 1)[1].rstrip())
  print("  --helpfull: every flag, JAX's and absl's included")


def _config_path(flag: str = "config") -> str:
  args = sys.argv[1:]
  for k, a in enumerate(args):
    if a.startswith(f"--{flag}="):
      return a.split("=", 1)[1]
    if a == f"--{flag}" and k + 1 < len(args):
      return args[k + 1]
  return "?"


def _root_cause(e: BaseException) -> str:
  while (e.__cause__ or e.__context__) is not None:
    e = e.__cause__ or e.__context__
  lines = str(e).strip().splitlines()
  return f"{type(e).__name__}: {lines[0] if lines else ''}"


def _config_load_error(e: BaseException, flag: str = "config") -> str:
  path = _config_path(flag)
  if not os.path.isfile(path.split(":", 1)[0]):
    return f"--{flag} {path}: no such config file"
  return f"--{flag} {path}: cannot load the config file ({_root_cause(e)})"


def _not_a_config(flag: str = "config") -> str | None:
  """When --config's get_config returned something other than a ConfigDict (None, a dict):
  the line saying so; else None. Runs the file again, on the error path only."""
  import importlib.util
  import ml_collections
  path = _config_path(flag)
  file, _, arg = path.partition(":")
  try:
    spec = importlib.util.spec_from_file_location("_fedjax_dg_config_check", file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not callable(getattr(mod, "get_config", None)):
      with open(file, encoding="utf-8", errors="replace") as f:
        what = "is empty" if not f.read(1 << 20).strip() else "defines no get_config()"
      return f"--{flag} {path}: the config file {what}; it must define get_config() returning an ml_collections.ConfigDict"
    got = mod.get_config(arg) if arg else mod.get_config()
  except BaseException:  # pylint: disable=broad-except  # then the original error says it
    return None
  if isinstance(got, ml_collections.ConfigDict):
    return None
  return f"--{flag} {path}: get_config() returned {type(got).__name__}, not an ml_collections.ConfigDict"


def not_a_config(config) -> str | None:
  """The line for a loaded config that is not a ConfigDict, or None."""
  import ml_collections
  if config is None or isinstance(config, ml_collections.ConfigDict):
    return None
  return f"--config {_config_path()}: get_config() returned {type(config).__name__}, not an ml_collections.ConfigDict"


def quiet_logs() -> None:
  """absl's log level to WARNING: `app.run` logs at INFO, where JAX reports every backend it
  could not start ("Unable to initialize backend 'tpu'") and orbax every checkpoint step.
  The platforms JAX may use are left alone."""
  from absl import logging
  logging.set_verbosity(logging.WARNING)


def one_line_warnings() -> None:
  """Warnings print as `warning: <message>`, one line (Python's format adds the source line)."""
  warnings.formatwarning = lambda message, category, *a, **k: f"warning: {message}\n"


def _config_flag_error(e: Exception, argv: list[str], flag: str = "config") -> str:
  """ml_collections' error for an unknown `--config.<field>` (a KeyError with a "did you
  mean", wrapped in an AttributeError, ~50 lines of traceback) as one line."""
  from fedjax_dg.config import unknown_key_error
  text = str(e)
  m = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
  bad = m.group(2) if m else next(iter(re.findall(r"'([^'\\]+)", text)), text.strip("'\""))
  arg = next((a.split("=")[0] for a in argv[1:] if a.startswith(f"--{flag}.")
              and bad in a.split("=")[0][len(f"--{flag}."):].split(".")), None)
  if arg is not None and flag == "config":  # the library's schema: its nearest field
    return unknown_key_error(arg[len(f"--{flag}."):], prefix=f"--{flag}.")
  head = f"{arg}: " if arg else ""  # another config file (a sweep): ml_collections' suggestion
  if not m:
    return f"{head}no config field {bad!r}"
  hint = ".".join(m.group(1) if part == bad else part for part in arg.split(".")) if arg else m.group(1)
  return f"{head}no config field {bad!r}; did you mean {hint}?"


def last_overrides(argv: list[str]) -> list[str]:
  """`argv` with each dotted override (`--config.a.b=v`, `--config.a.b v`) kept only at its
  last occurrence: ml_collections would concatenate a tuple field given twice
  (`--config.model.hidden=(64,) --config.model.hidden=(32,)` -> (64, 32)) instead of replacing it."""
  items, k = [], 0
  while k < len(argv):
    a = argv[k]
    head = a.split("=", 1)[0]
    dotted = k > 0 and a.startswith("--") and "." in head and not a.startswith("---")
    if dotted and "=" not in a and k + 1 < len(argv) and not argv[k + 1].startswith("--"):
      items.append((head, [a, argv[k + 1]]))
      k += 2
      continue
    items.append((head if dotted else None, [a]))
    k += 1
  last = {h: n for n, (h, _) in enumerate(items) if h}
  return [x for n, (h, group) in enumerate(items) if h is None or last[h] == n for x in group]


_EXAMPLES = {"config": "configs/default.py", "sweep": "configs/sweeps/tiny.py"}


def parse_flags(argv: list[str], flag: str = "config") -> list[str]:
  """absl's flag parsing, with a bad flag or config override as one line and exit status 2;
  an override given twice takes its last value."""
  try:
    return flags.FLAGS(last_overrides(argv))
  except flags.Error as e:
    if not any(a == f"--{flag}" or a.startswith(f"--{flag}=") for a in argv[1:]) and (
        f"'{flag}." in str(e) or f"--{flag} must have a value" in str(e)):  # its overrides are unknown then
      msg = f"--{flag}: no config file given; pass one, e.g. --{flag} {_EXAMPLES.get(flag, 'FILE.py')}"
    elif "Error whilst parsing config file" in str(e):  # the file's own error is its cause
      msg = _config_load_error(e, flag)
    elif f"--{flag} must have a value other than None" in str(e) and _config_path(flag) != "?":
      msg = _not_a_config(flag) or f"--{flag} {_config_path(flag)}: get_config() returned None"
    else:
      msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  except (AttributeError, KeyError) as e:  # ml_collections: an unknown --config.<field>
    msg = _not_a_config(flag) or _config_flag_error(e, argv, flag)
  except SystemExit as e:  # the config file called sys.exit
    msg = f"--{flag} {_config_path(flag)}: the config file exited (status {e.code}) instead of returning a config"
  except Exception as e:  # pylint: disable=broad-except  # the config file fails to load or run
    msg = _config_load_error(e, flag)
  if not _a_later_process(argv):  # one line for a job of several processes: process 0's
    print(f"error: {msg}", file=sys.stderr)
  sys.exit(2)


def _a_later_process(argv: list[str]) -> bool:
  """Whether the command line names a process other than 0 of a `jax.distributed` job
  (read before the flags parse: `--config.distributed.process_id`, or Slurm's task id with
  `--config.distributed.initialize=auto`)."""
  given = dict(a.split("=", 1) for a in argv[1:] if a.startswith("--config.distributed.") and "=" in a)
  if given.get("--config.distributed.initialize") == "auto":
    return os.environ.get("SLURM_PROCID", "0") != "0"
  return given.get("--config.distributed.process_id", "0").strip() not in ("0", "")


def _quiet_absl_before_parsing() -> None:
  """ml_collections logs (through absl, with a "Logging before flag parsing" line) what a
  config file does wrong; the one error line says it instead."""
  from absl import logging
  logging.set_verbosity(logging.ERROR)


def _define_flags():
  global _CONFIG
  if _CONFIG is None:
    _CONFIG = config_flags.DEFINE_config_file("config", None, "Path to an ml_collections config file.")


def run():
  _define_flags()
  if any(a in HELP_FLAGS for a in sys.argv[1:]):
    print_help(__name__, usage_text())
    sys.exit(0)
  flags.mark_flag_as_required("config")
  _quiet_absl_before_parsing()
  app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags)


if __name__ == "__main__":
  run()
