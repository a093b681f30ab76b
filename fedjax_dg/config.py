"""Config validation: every check runs before any data is packed or anything compiles,
and a failure is one line naming the field and the accepted range."""
from __future__ import annotations

import math
import os

from fedjax_dg.algorithms import ALGORITHMS
from fedjax_dg.data.datasets import DATASETS
from fedjax_dg.engine.round import STRATEGIES
from fedjax_dg.models import MODELS

PARTITIONS = ("heterogeneous", "dirichlet", "iid")


class ConfigError(ValueError):
  """A config field holds a value outside its accepted range."""


def _check(cond, msg):
  if not cond:
    raise ConfigError(msg)


def validate(config) -> None:
  """Checks that need no data."""
  _check(config.algorithm.name in ALGORITHMS,
         f"algorithm.name: unknown algorithm {config.algorithm.name!r}; choose one of {list(ALGORITHMS)}")
  _check(config.data.name in DATASETS, f"data.name: unknown dataset {config.data.name!r}; choose one of {list(DATASETS)}")
  path = config.model.get("pretrained_path", "")
  _check(not path or os.path.isfile(path), f"model.pretrained_path: no such file {path!r}")
  _check(config.model.name in MODELS, f"model.name: unknown model {config.model.name!r}; choose one of {list(MODELS)}")
  _check(config.partition.method in PARTITIONS,
         f"partition.method: unknown {config.partition.method!r}; choose one of {list(PARTITIONS)}")
  lam = config.partition.lam
  _check(isinstance(lam, (int, float)) and 0.0 <= lam <= 1.0, f"partition.lam must lie in [0, 1], got {lam}")
  _check(config.partition.alpha > 0, f"partition.alpha must be > 0, got {config.partition.alpha}")
  _check(config.num_clients >= 1, f"num_clients must be >= 1, got {config.num_clients}")
  _check(config.cohort_size >= 0, f"cohort_size must be >= 0 (0: use cohort_fraction), got {config.cohort_size}")
  _check(config.cohort_size <= config.num_clients,
         f"cohort_size ({config.cohort_size}) must not exceed num_clients ({config.num_clients})")
  _check(0.0 < config.cohort_fraction <= 1.0, f"cohort_fraction must lie in (0, 1], got {config.cohort_fraction}")
  for field, v in (("client.lr", config.client.lr), ("server.lr", config.server.lr)):
    _check(v > 0 and math.isfinite(v), f"{field} must be a positive step size, got {v}")
  _check(config.client.optimizer in ("sgd", "adam"), f"client.optimizer must be 'sgd' or 'adam', got {config.client.optimizer!r}")
  _check(config.client.batch_size >= 1, f"client.batch_size must be >= 1, got {config.client.batch_size}")
  _check(config.client.local_steps >= 0, f"client.local_steps must be >= 0, got {config.client.local_steps}")
  _check(config.client.local_steps > 0 or config.client.local_epochs >= 1,
         f"client.local_epochs must be >= 1 when client.local_steps is 0, got {config.client.local_epochs}")
  _check(config.num_rounds >= 1, f"num_rounds must be >= 1, got {config.num_rounds}")
  _check(config.eval_every >= 1, f"eval_every must be >= 1, got {config.eval_every}")
  _check(config.checkpoint_every >= 0, f"checkpoint_every must be >= 0 (0: never), got {config.checkpoint_every}")
  _check(config.engine.strategy in STRATEGIES + ("auto",),
         f"engine.strategy: unknown {config.engine.strategy!r}; choose one of {list(STRATEGIES) + ['auto']}")
  _check(config.engine.chunk_size >= 1, f"engine.chunk_size must be >= 1, got {config.engine.chunk_size}")
  if config.algorithm.name == "scaffold":
    _check(config.client.optimizer == "sgd" and config.client.momentum == 0.0,
           "client.optimizer: SCAFFOLD option II needs plain SGD (client.optimizer='sgd', client.momentum=0)")
  if "omg" in config.algorithm.name:
    _check(config.algorithm.omg_kappa >= 0, f"algorithm.omg_kappa must be >= 0, got {config.algorithm.omg_kappa}")
    _check(config.algorithm.omg_steps >= 0, f"algorithm.omg_steps must be >= 0, got {config.algorithm.omg_steps}")
  if "fediir" in config.algorithm.name:
    _check(config.algorithm.iir_gamma >= 0, f"algorithm.iir_gamma must be >= 0, got {config.algorithm.iir_gamma}")
    _check(0 <= config.algorithm.iir_ema < 1, f"algorithm.iir_ema must lie in [0, 1), got {config.algorithm.iir_ema}")
  if config.algorithm.name == "feddim":
    _check(config.algorithm.dim_lambda >= 0, f"algorithm.dim_lambda must be >= 0, got {config.algorithm.dim_lambda}")
    _check(0 < config.algorithm.dim_momentum <= 1,
           f"algorithm.dim_momentum must lie in (0, 1], got {config.algorithm.dim_momentum}")
    _check(tuple(config.model.head_hidden) == (), "model.head_hidden: FedDIM needs a linear head, set it to ()")
  if config.algorithm.name == "fedloe":
    a = config.algorithm
    _check(0 < a.loe_tune_fraction < 1, f"algorithm.loe_tune_fraction must lie in (0, 1), got {a.loe_tune_fraction}")
    _check(a.loe_stage2_rounds >= 0, f"algorithm.loe_stage2_rounds must be >= 0, got {a.loe_stage2_rounds}")
    _check(a.loe_head_lr > 0, f"algorithm.loe_head_lr must be a positive step size, got {a.loe_head_lr}")
    _check(a.loe_penalty in ("irm", "fish", "rex", "none"),
           f"algorithm.loe_penalty must be one of irm, fish, rex, none; got {a.loe_penalty!r}")
    _check(a.loe_lambda >= 0, f"algorithm.loe_lambda must be >= 0, got {a.loe_lambda}")
    _check(tuple(config.model.head_hidden) == (), "model.head_hidden: FedLOE combines linear heads, set it to ()")
  if config.algorithm.name == "fedga":
    _check(config.algorithm.ga_step >= 0, f"algorithm.ga_step must be >= 0, got {config.algorithm.ga_step}")
  if "fedsam" in config.algorithm.name:
    _check(config.algorithm.sam_rho >= 0, f"algorithm.sam_rho must be >= 0, got {config.algorithm.sam_rho}")
  if config.algorithm.name in ("irm", "vrex", "coral", "mmd"):
    a = config.algorithm
    for field in ("irm_lambda", "vrex_lambda", "coral_gamma", "mmd_gamma", "dg_anneal_steps"):
      _check(a[field] >= 0, f"algorithm.{field} must be >= 0, got {a[field]}")
  a = config.algorithm
  checks = {"mixup": [("mixup_alpha", a.mixup_alpha > 0, "> 0")],
            "fish": [("fish_meta_lr", 0 < a.fish_meta_lr <= 1, "in (0, 1]")],
            "groupdro": [("groupdro_eta", a.groupdro_eta >= 0, ">= 0")],
            "afl": [("afl_step", a.afl_step >= 0, ">= 0")],
            "fedsr": [("sr_z_dim", a.sr_z_dim >= 1, ">= 1"), ("sr_l2", a.sr_l2 >= 0, ">= 0"),
                      ("sr_cmi", a.sr_cmi >= 0, ">= 0"), ("sr_eval_samples", a.sr_eval_samples >= 0, ">= 0")],
            "fedadg": [("adg_lambda0", 0 <= a.adg_lambda0 <= 1, "in [0, 1]"),
                       ("adg_e0_epochs", a.adg_e0_epochs >= 0, ">= 0"),
                       ("adg_gen_lr", a.adg_gen_lr >= 0, ">= 0"), ("adg_disc_lr", a.adg_disc_lr >= 0, ">= 0"),
                       ("adg_noise_dim", a.adg_noise_dim >= 1, ">= 1"), ("adg_hidden", a.adg_hidden >= 1, ">= 1")],
            "feddg": [("fdg_window", 0 <= a.fdg_window <= 1, "in [0, 1]"), ("fdg_bank_size", a.fdg_bank_size >= 1, ">= 1")]}
  for field, ok, rule in checks.get(a.name.replace("+omg", ""), []):
    _check(ok, f"algorithm.{field} must be {rule}, got {a[field]}")
  if config.algorithm.name == "fedgma":
    _check(0 <= config.algorithm.gma_tau <= 1, f"algorithm.gma_tau must lie in [0, 1], got {config.algorithm.gma_tau}")
  if "fedprox" in config.algorithm.name:
    _check(config.algorithm.prox_mu >= 0, f"algorithm.prox_mu must be >= 0, got {config.algorithm.prox_mu}")


def cohort_size(config, num_clients: int) -> int:
  if config.cohort_size > 0:
    return int(config.cohort_size)
  return max(1, int(round(config.cohort_fraction * num_clients)))


def validate_data(config, num_train_examples: int, num_clients: int) -> None:
  """Checks that need the data's size."""
  _check(num_clients <= num_train_examples,
         f"num_clients ({num_clients}) exceeds the number of training examples ({num_train_examples})")
