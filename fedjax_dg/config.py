"""Config validation: every check runs before any data is packed or anything compiles,
and a failure is one line naming the field and the accepted range."""
from __future__ import annotations

import difflib
import math
import os

from fedjax_dg import algorithms
from fedjax_dg import checks
from fedjax_dg import models
from fedjax_dg.data import datasets
from fedjax_dg.data.datasets import DATASETS
from fedjax_dg.defaults import STRATEGIES, default_config
from fedjax_dg.models import MODELS

PARTITIONS = ("heterogeneous", "dirichlet", "iid")
OPTIMIZERS = ("sgd", "adam", "yogi")  # base.make_optimizer


from fedjax_dg.errors import ConfigError  # noqa: F401  # raised here, caught by the CLI


def _check(cond, msg):
  if not cond:
    raise ConfigError(msg)


def _paths(tree, prefix: str = "") -> list[str]:
  """Every dotted path of a nested ConfigDict, inner nodes included."""
  out = []
  for k, v in tree.items():
    out.append(prefix + k)
    if hasattr(v, "items"):
      out += _paths(v, prefix + k + ".")
  return out


def unknown_key_error(path: str, schema=None, prefix: str = "") -> str:
  """The one line for an unknown config field `path` ("a.b.c"), with the closest known
  field (difflib, on the whole dotted path) as a suggestion; `prefix` ("--config.") goes
  before both names."""
  known = _paths(schema if schema is not None else default_config())
  parts = path.split(".")
  ancestors = {".".join(parts[:k]) for k in range(1, len(parts))}
  flat = {p.replace(".", "_"): p for p in known if p not in ancestors}
  near = difflib.get_close_matches(path.replace(".", "_"), list(flat), n=1, cutoff=0.6)
  hint = f"; did you mean {prefix}{flat[near[0]]}?" if near else ""
  return f"{prefix}{path}: unknown config field{hint}"


def check_keys(config, schema=None, prefix: str = "") -> None:
  """Every field of `config`, at any depth, is a field of the default config
  (`fedjax_dg.default_config()`, whose `algorithm` holds one block per registered method
  and rule); an unknown one is refused in one line naming it."""
  schema = default_config() if schema is None else schema
  root = schema

  def walk(node, ref, at):
    for k, v in node.items():
      path = at + k
      if k not in ref:
        raise ConfigError(unknown_key_error(path, root))
      if hasattr(v, "items") != hasattr(ref[k], "items") and not (ref[k] is None or v is None):
        kind = "a group of fields" if hasattr(ref[k], "items") else "a value"
        raise ConfigError(f"{path}: must be {kind}, got {v!r}")
      if hasattr(v, "items") and hasattr(ref[k], "items"):
        walk(v, ref[k], path + ".")
  walk(config, schema, prefix)


def validate(config) -> None:
  """Checks that need no data; the first: every field is known, then its type and range.
  The config's plugins (`config.imports`, `fedjax_dg.plugins`) are imported before: what
  they register is known to every check."""
  from fedjax_dg import plugins
  plugins.load(config)
  check_keys(config)
  checks.check_config(config)  # types, ranges and sizes of every field
  tb = config.get("tensorboard", False)
  _check(isinstance(tb, bool), f"tensorboard must be True or False, got {tb!r}")
  if tb:
    import importlib.util
    _check(importlib.util.find_spec("tensorboardX") is not None,
           "tensorboard: event files need tensorboardX; pip install 'fedjax-dg[tensorboard]'")
  from fedjax_dg.eval import tracking
  err = tracking.config_error(config)  # config.tracking: a known writer, its extra installed
  _check(err is None, err)
  _check(datasets.known(config.data), f"data.name: unknown dataset {config.data.name!r}; choose one of {list(DATASETS)} "
         "or register one with fedjax_dg.register_dataset")
  path = config.model.get("pretrained_path", "")
  _check(not path or os.path.isfile(path), f"model.pretrained_path: no such file {path!r}")
  _check(config.model.name in MODELS, f"model.name: unknown model {config.model.name!r}; choose one of {list(MODELS)}")
  _check(config.partition.method in PARTITIONS,
         f"partition.method: unknown {config.partition.method!r}; choose one of {list(PARTITIONS)}")
  e = config.engine
  _check(config.cohort_size <= config.num_clients,
         f"cohort_size ({config.cohort_size}) must not exceed num_clients ({config.num_clients})")
  _check(config.client.optimizer in OPTIMIZERS,
         f"client.optimizer must be one of {', '.join(OPTIMIZERS)}; got {config.client.optimizer!r}")
  _check(config.client.local_steps > 0 or config.client.local_epochs >= 1,
         f"client.local_epochs must be >= 1 when client.local_steps is 0, got {config.client.local_epochs}")
  _check(config.engine.strategy in STRATEGIES + ("auto",),
         f"engine.strategy: unknown {config.engine.strategy!r}; choose one of {list(STRATEGIES) + ['auto']}")
  _check(all(h >= 1 for h in config.model.hidden), f"model.hidden: every width must be >= 1, got {tuple(config.model.hidden)}")
  _check(all(h >= 1 for h in config.model.head_hidden),
         f"model.head_hidden: every width must be >= 1, got {tuple(config.model.head_hidden)}")
  proj = config.model.get("feature_projection", 0)
  _check(isinstance(proj, int) and not isinstance(proj, bool) and proj >= 0,
         f"model.feature_projection must be an integer >= 0 (0: none), got {proj!r}")
  _check(not proj or config.model.name not in ("distilbert", "gpt2"),
         f"model.feature_projection: not available for model.name={config.model.name!r} "
         "(image and MLP backbones only); set it to 0")
  metrics = datasets.select_metrics(config.data)
  _check(config.data.select_metric in metrics,
         f"data.select_metric: unknown {config.data.select_metric!r}"
         f"{' for ' + config.data.dataset if datasets.modality(config.data) == 'text' else ''}; "
         f"choose one of {list(metrics)}")
  d = config.data
  if not d.leave_one_domain_out and d.name != "wilds":
    _check(len(d.test_domains) >= 1, "data.test_domains must name at least one domain (or set data.leave_one_domain_out)")
    both = set(d.test_domains) & set(d.val_domains)
    _check(not both, f"data.val_domains and data.test_domains share domain(s) {sorted(both)}")
  from fedjax_dg.data.splits import LODO_VALIDATION
  lodo_val = d.get("lodo_validation", "heldout_domain")
  _check(lodo_val in LODO_VALIDATION, f"data.lodo_validation must be one of {list(LODO_VALIDATION)}, got {lodo_val!r}")
  _check(not (d.leave_one_domain_out and lodo_val == "in_domain" and d.in_val_fraction <= 0),
         "data.lodo_validation='in_domain' selects on the in-domain validation split: set data.in_val_fraction > 0")
  for field in ("test_domains", "val_domains"):
    ids = list(d[field])
    _check(len(set(ids)) == len(ids), f"data.{field} lists a domain twice: {tuple(ids)}")
  workdir = config.get("workdir", "")
  _check(bool(workdir), "workdir must be a directory path, got ''")
  _check(not os.path.isfile(workdir), f"workdir {workdir!r} is a file, not a directory")
  from fedjax_dg import distributed
  distributed.check(config)
  distributed.check_strategy(config)
  validate_modality(config)  # before the method's own checks: "does not apply" is the clearer line
  if e.get("host_client_states", False):
    spec = algorithms.spec_of(config)
    _check(not spec.stages, f"engine.host_client_states: {spec.name!r} runs in stages, whose client states "
                            "stay on the device; set it to False")
  try:  # the method, its server rule and their fields (generated from the method specs)
    algorithms.validate(config)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def validate_modality(config) -> None:
  """The model reads the data's inputs, and the method applies to them and to the model
  (the method's `not_for_text` and `not_for_models` declarations)."""
  name, dataset = config.model.name, config.data.get("dataset", "")
  text_data = datasets.modality(config.data) == "text"
  reads = models.MODALITY[name]
  if text_data:
    _check(reads != "image", f"model.name: {name!r} reads images; data.dataset={dataset!r} is text "
                             f"(use {'gpt2' if dataset == 'py150' else 'distilbert'})")
  else:
    _check(reads != "text", f"model.name: {name!r} reads token ids; data.name={config.data.name!r} is not a text "
                            "dataset (civilcomments or py150)")
  _check(dataset != "py150" or not text_data or name == "gpt2",
         f"model.name: Py150 is next-token prediction with a label per token; use 'gpt2', not {name!r}")
  try:
    spec = algorithms.spec_of(config)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  method = spec.name
  if text_data or reads == "text":
    _check(spec.not_for_text is None, f"algorithm.name: {method!r} does not apply to text: {spec.not_for_text}")
  why = spec.not_for_model(name)
  _check(why is None, f"algorithm.name: {method!r} does not apply to model.name={name!r}: {why}")


def cohort_size(config, num_clients: int) -> int:
  if config.cohort_size > 0:
    return int(config.cohort_size)
  return max(1, int(round(config.cohort_fraction * num_clients)))


def validate_data(config, num_train_examples: int, num_clients: int) -> None:
  """Checks that need the data's size."""
  _check(num_clients <= num_train_examples,
         f"num_clients ({num_clients}) exceeds the number of training examples ({num_train_examples})")
