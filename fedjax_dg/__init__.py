"""fedjax-dg: federated domain generalization in JAX/Flax.

The entry points, importable from the package (each loads its module on first use, so
`import fedjax_dg` stays light):

- `default_config()`: the default experiment config (an ml_collections ConfigDict).
- `train_and_evaluate(config, workdir)`: a whole run: data, clients, rounds, evaluation, selection.
- `run_fold(config, fold, workdir)`: the same on a fold you built.
- `load_fold`, `pack`, `build_method`, `local_schedule`, `cohort_size`: the run's pieces (`fedjax_dg.api`).
- `make_round`, `init_round_state`: the round engine.
- `default_strategy`: the engine's measured strategy for a model (what "auto" picks).
- `build_model`, `Model`, `SplitModel`, `Classifier`: models (a featurizer and a classifier).
- `DomainDataset`, `Fold`, `register_dataset`: data types and custom datasets.
- `register_method`, `MethodSpec`: custom methods (`fedjax_dg.algorithms.spec`).
- `register_rule`: custom server rules (a `RuleSpec`; `<method>+<rule>` in `algorithm.name`).
- `Algorithm`, `ClientData`: the engine's contract.

JAX's persistent compilation cache is on from the first use of an entry point (in
`~/.cache/fedjax_dg/jax`; `FEDJAX_DG_COMPILATION_CACHE=off` or a folder: see
`fedjax_dg.compilation_cache`). Importing the package runs a CPU's convolutions in XLA
rather than YNNPACK, the faster on a CPU (`FEDJAX_DG_XLA_CPU_DEFAULTS=off`: see
`fedjax_dg.xla_cpu`).
"""
from __future__ import annotations

import importlib

from fedjax_dg import xla_cpu as _xla_cpu

_xla_cpu.apply()  # XLA_FLAGS, before JAX starts its CPU backend (fedjax_dg/xla_cpu.py)

__version__ = "0.1.0"

_EXPORTS = {
    "default_config": "fedjax_dg.defaults",
    "train_and_evaluate": "fedjax_dg.experiment",
    "run_fold": "fedjax_dg.experiment",
    "load_fold": "fedjax_dg.api",
    "pack": "fedjax_dg.api",
    "build_method": "fedjax_dg.api",
    "local_schedule": "fedjax_dg.api",
    "cohort_size": "fedjax_dg.api",
    "make_round": "fedjax_dg.engine.round",
    "init_round_state": "fedjax_dg.engine.round",
    "default_strategy": "fedjax_dg.engine.measured",
    "build_model": "fedjax_dg.models",
    "Model": "fedjax_dg.models",
    "SplitModel": "fedjax_dg.models",
    "Classifier": "fedjax_dg.models",
    "DomainDataset": "fedjax_dg.data.datasets",
    "register_dataset": "fedjax_dg.data.datasets",
    "Fold": "fedjax_dg.data.splits",
    "MethodSpec": "fedjax_dg.algorithms.spec",
    "Algorithm": "fedjax_dg.algorithms.base",
    "ClientData": "fedjax_dg.algorithms.base",
}
_RENAMED = {"register_method": ("fedjax_dg.algorithms", "register"),
            "register_rule": ("fedjax_dg.algorithms", "register_rule")}

__all__ = sorted([*_EXPORTS, *_RENAMED, "__version__"])


def __getattr__(name: str):
  if name in _EXPORTS or name in _RENAMED:
    importlib.import_module("fedjax_dg.compilation_cache").enable()
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  if name in _RENAMED:
    module, attr = _RENAMED[name]
    return getattr(importlib.import_module(module), attr)
  raise AttributeError(f"module 'fedjax_dg' has no attribute {name!r}")


def __dir__():
  return __all__
