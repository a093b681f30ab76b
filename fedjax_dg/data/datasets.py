"""Datasets as `{domain: (x, y)}` arrays.

`rotated_digits` is the embedded default: it needs no download, because scikit-learn
ships the 1797 8x8 UCI digits. The synthetic generators make data whose ground truth is
known in closed form.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class DomainDataset:
  """Examples grouped by domain. `xs[i]`, `ys[i]` belong to domain `names[i]`.

  Attributes:
    name: the dataset's name (in errors).
    names: the domains' names, one per domain.
    xs: one input array `[N_d, ...]` per domain (floats, uint8 images or token ids).
    ys: one integer label array `[N_d]` (or `[N_d, T]`) per domain.
    num_classes: the number of classes, labels in `[0, num_classes)`; 0 for regression.
    num_domains: (property) `len(names)`.
    input_shape: (property) the shape of one input row.

  Raises:
    ValueError: on construction, when `names`, `xs` and `ys` differ in length, a domain's
      inputs and labels differ in count, or a label lies outside `[0, num_classes)`.
  """
  name: str
  names: tuple[str, ...]
  xs: tuple[np.ndarray, ...]
  ys: tuple[np.ndarray, ...]
  num_classes: int  # 0 for regression

  def __post_init__(self):
    if not (len(self.names) == len(self.xs) == len(self.ys)):
      raise ValueError(f"{self.name}: names, xs and ys must have one entry per domain")
    for n, x, y in zip(self.names, self.xs, self.ys):
      if len(x) != len(y):
        raise ValueError(f"{self.name}: domain {n!r} has {len(x)} inputs but {len(y)} labels")
      check_labels(y, self.num_classes, f"{self.name}: domain {n!r}")

  @property
  def num_domains(self) -> int:
    return len(self.names)

  @property
  def input_shape(self) -> tuple[int, ...]:
    return tuple(self.xs[0].shape[1:])


def check_labels(y: np.ndarray, num_classes: int, where: str, hint: str = "") -> None:
  """Raises a one-line ValueError naming `where`, the first label outside `[0, num_classes)`
  and its index (then `hint`); nothing for regression (`num_classes` 0)."""
  y = np.asarray(y)
  if num_classes <= 0 or not y.size:
    return
  bad = (y < 0) | (y >= num_classes)
  if y.dtype.kind == "f":
    bad |= ~np.isfinite(y) | (y != np.round(y))
  bad = np.flatnonzero(bad)
  if len(bad):
    raise ValueError(f"{where}: label {y[bad[0]].item()!r} at index {int(bad[0])} lies outside [0, {num_classes}) "
                     f"({len(bad)} of {y.size} labels do){hint}")


def deal_domains(n: int, num_domains: int, seed: int, max_per_domain: int = 0) -> list[np.ndarray]:
  """DomainBed's split: shuffle all `n` indices, domain `i` gets `perm[i::D]`; optionally
  the first `max_per_domain` of each share (a random subsample, for quick runs)."""
  perm = np.random.default_rng(seed).permutation(n)
  shares = [perm[i::num_domains] for i in range(num_domains)]
  return [s[:max_per_domain] if max_per_domain > 0 else s for s in shares]


def bundled_digits() -> tuple[np.ndarray, np.ndarray]:
  """scikit-learn's bundled 8x8 digits (`sklearn.datasets.load_digits`: images `[1797, 8, 8]`
  in 0..16, labels `[1797]`), read from the file scikit-learn ships without importing
  scikit-learn, whose import costs seconds of a small run's start-up.

  Returns:
    `(images, labels)` as float64 arrays, equal to `load_digits().images` and `.target`.
  """
  import gzip
  import importlib.util
  import os
  spec = importlib.util.find_spec("sklearn")
  if spec is None or not spec.submodule_search_locations:
    raise ModuleNotFoundError("the embedded dataset reads scikit-learn's bundled digits: pip install scikit-learn")
  path = os.path.join(list(spec.submodule_search_locations)[0], "datasets", "data", "digits.csv.gz")
  with gzip.open(path, "rt") as f:
    data = np.loadtxt(f, delimiter=",")
  return data[:, :-1].reshape(-1, 8, 8), data[:, -1]


def rotated_digits(image_size: int = 16, angles: Sequence[float] = (0, 15, 30, 45, 60, 75),
                   seed: int = 0) -> DomainDataset:
  """RotatedMNIST's recipe (DomainBed) on scikit-learn's bundled 8x8 digits.

  The 1797 images are shuffled and dealt into `len(angles)` disjoint shares
  (`perm[i::D]`, as DomainBed does), each share is upsampled (bilinear) to
  `image_size` and rotated by its domain's angle (bilinear, zero fill), pixels in [0, 1].
  """
  from scipy import ndimage

  if image_size < 8:
    raise ValueError(f"data.image_size must be >= 8, got {image_size}")
  images, labels = bundled_digits()
  images = images.astype(np.float32) / 16.0
  labels = labels.astype(np.int32)
  xs, ys = [], []
  for idx, angle in zip(deal_domains(len(images), len(angles), seed), angles):
    imgs = ndimage.zoom(images[idx], (1, image_size / 8, image_size / 8), order=1)
    imgs = ndimage.rotate(imgs, angle, axes=(1, 2), reshape=False, order=1, cval=0.0)
    xs.append(np.clip(imgs, 0.0, 1.0)[..., None].astype(np.float32))
    ys.append(labels[idx])
  return DomainDataset("rotated_digits", tuple(f"{a:g}deg" for a in angles), tuple(xs), tuple(ys), 10)


def spurious_classification(correlations: Sequence[float] = (0.95, 0.9, 0.8, 0.7, 0.5, 0.1),
                            n_per_domain: int = 400, num_noise: int = 6,
                            invariant_snr: float = 1.0, seed: int = 0) -> DomainDataset:
  """Binary task with an invariant and a spurious feature (a vector Colored-MNIST).

  `y ~ Bern(1/2)`; invariant block `x_I = (2y - 1) * snr + N(0, 1)` (2 dims, Bayes
  accuracy about 0.92 at snr 1); spurious label `s = y` with probability `rho_e`
  (the domain's correlation), else `1 - y`; spurious block `x_S = (2s - 1) * 2 + N(0, 0.25)`
  (2 dims, nearly noiseless, so ERM prefers it where `rho_e` is high);
  `num_noise` pure-noise dims.
  """
  rng = np.random.default_rng(seed)
  xs, ys = [], []
  for rho in correlations:
    y = rng.integers(0, 2, n_per_domain)
    s = np.where(rng.random(n_per_domain) < rho, y, 1 - y)
    x_inv = (2 * y - 1)[:, None] * invariant_snr + rng.normal(size=(n_per_domain, 2))
    x_sp = (2 * s - 1)[:, None] * 2.0 + 0.5 * rng.normal(size=(n_per_domain, 2))
    noise = rng.normal(size=(n_per_domain, num_noise))
    xs.append(np.concatenate([x_inv, x_sp, noise], 1).astype(np.float32))
    ys.append(y.astype(np.int32))
  return DomainDataset("spurious", tuple(f"rho={r:g}" for r in correlations), tuple(xs), tuple(ys), 2)


def linear_scm(a_inv, a_sp, sigma2_sq: Sequence[float], sigma3_sq: float = 1.0,
               sigma1_sq: float = 1.0, n_per_domain: int = 1000, seed: int = 0) -> DomainDataset:
  """The linear structural causal model of the FedLOE paper, eq. (5); regression.

  `x_I = xi_1`, `y = x_I . a_I + xi_2`, `x_S = y a_S + xi_3`, with domain `k`'s target
  noise variance `sigma2_sq[k]` and shared `Var(xi_1) = sigma1_sq I`,
  `Var(xi_3) = sigma3_sq I`. Inputs are `[x_I, x_S]`.
  """
  rng = np.random.default_rng(seed)
  a_inv, a_sp = np.asarray(a_inv, np.float64), np.asarray(a_sp, np.float64)
  xs, ys = [], []
  for s2 in sigma2_sq:
    x_i = rng.normal(scale=np.sqrt(sigma1_sq), size=(n_per_domain, len(a_inv)))
    y = x_i @ a_inv + rng.normal(scale=np.sqrt(s2), size=n_per_domain)
    x_s = y[:, None] * a_sp[None] + rng.normal(scale=np.sqrt(sigma3_sq), size=(n_per_domain, len(a_sp)))
    xs.append(np.concatenate([x_i, x_s], 1))
    ys.append(y)
  return DomainDataset("linear_scm", tuple(f"sigma2^2={s:g}" for s in sigma2_sq), tuple(xs), tuple(ys), 0)


def _builtin(data_config) -> DomainDataset:
  if data_config.name == "rotated_digits":
    return rotated_digits(image_size=data_config.image_size, angles=tuple(data_config.angles),
                          seed=data_config.seed)
  correlations = tuple(data_config.correlations)
  if not correlations:
    raise ValueError("data.correlations: give one correlation in [0, 1] per domain, got none")
  bad = [r for r in correlations if not 0.0 <= float(r) <= 1.0]
  if bad:
    raise ValueError(f"data.correlations must lie in [0, 1] (one per domain), got {bad[0]!r} in {correlations}")
  return spurious_classification(correlations=correlations,
                                 n_per_domain=data_config.n_per_domain, seed=data_config.seed)


# `config.data.name` -> "module:function" taking `config.data` and returning a DomainDataset.
# Loaders of on-disk datasets are imported only when named, so the embedded default needs
# none of their dependencies.
DATASETS = {
    "rotated_digits": "fedjax_dg.data.datasets:_builtin",
    "spurious": "fedjax_dg.data.datasets:_builtin",
    "rotated_mnist": "fedjax_dg.data.idx:load_rotated",
    "colored_mnist": "fedjax_dg.data.idx:load_colored",
    "image_folder": "fedjax_dg.data.folders:load",
    "wilds": "fedjax_dg.data.wilds:load",
    "tfds": "fedjax_dg.data.tfds_source:load",
    "femnist": "fedjax_dg.data.femnist:load",
}
BUILTIN = tuple(DATASETS)
LOADERS = {}  # name -> the function `register_dataset` was given, in this process
# What each dataset's inputs are (config validation refuses image-only methods on text).
# CivilComments and Py150 are WILDS releases: `data.name="wilds"` with `data.dataset` in
# `wilds.TEXT_LOADERS` is text; see `modality`.
TEXT_WILDS = ("civilcomments", "py150")


def modality(data_config) -> str:
  """"text" for the WILDS text releases (CivilComments, Py150), else "image" (the embedded
  and synthetic vector datasets count as "image": every method applies to them)."""
  if data_config.name == "wilds" and data_config.get("dataset", "") in TEXT_WILDS:
    return "text"
  return "image"


# The metric names `data.select_metric` may name: `eval.metrics.classification_metrics`'s,
# or for a WILDS text release its own metric's (`civilcomments.wilds_metrics`,
# `py150.wilds_metrics`, the Fold's `metrics`).
SELECT_METRICS = ("accuracy", "macro_f1", "macro_f1_label_classes", "worst_group_accuracy")
TEXT_SELECT_METRICS = {"civilcomments": ("accuracy", "macro_f1", "worst_group_accuracy"),
                       "py150": ("accuracy", "overall_accuracy", "class_accuracy", "method_accuracy")}


def select_metrics(data_config) -> tuple[str, ...]:
  """The metrics the evaluation of `config.data`'s dataset reports, to select on."""
  if modality(data_config) == "text":
    return TEXT_SELECT_METRICS[data_config.dataset]
  return SELECT_METRICS


def loader_path(fn) -> str:
  """Where `fn` can be imported from again, in another process: `"package.module:function"`,
  or `"/abs/path/script.py:function"` for a function defined in a script run as `__main__`."""
  import inspect
  import os
  qual = getattr(fn, "__qualname__", "")
  if not callable(fn) or not qual or "<" in qual or "." in qual:
    raise ValueError(f"register_dataset: the loader must be a module-level function, got {fn!r}")
  module = fn.__module__
  if module == "__main__":
    return f"{os.path.abspath(inspect.getfile(fn))}:{qual}"
  return f"{module}:{qual}"


def register_dataset(name: str, loader) -> str:
  """Makes `config.data.name = name` load the dataset `loader(config.data) -> DomainDataset`.

  The runner stores the loader's path in the run's `config.json` as `data.loader`, so
  `python -m fedjax_dg.evaluate --workdir W` finds the loader again in a new process.

  Args:
    name: the value of `config.data.name` that selects the dataset (no ':').
    loader: a module-level function `loader(data_config) -> DomainDataset`, or its
      `"module:function"` / `"/path/file.py:function"` path.

  Returns:
    The loader's import path.

  Raises:
    ValueError: the name is empty or holds ':', or names a built-in dataset (which cannot
      be replaced).
  """
  if not isinstance(name, str) or not name or ":" in name:
    raise ValueError(f"register_dataset: the name must be a non-empty string without ':', got {name!r}")
  path = loader if isinstance(loader, str) else loader_path(loader)
  if name in BUILTIN and DATASETS[name] != path:
    raise ValueError(f"register_dataset: {name!r} is a built-in dataset; choose another name")
  DATASETS[name] = path
  if callable(loader):  # this process calls the function itself; another one imports `path`
    LOADERS[name] = loader
  return path


def _import(path: str, name: str):
  """The function at `"module:function"` or `"/path/file.py:function"`."""
  module, _, fn = path.rpartition(":")
  if module.endswith(".py"):
    import os
    from importlib import util
    if not os.path.isfile(module):
      raise FileNotFoundError(f"data.loader: no such file {module!r} (the loader of dataset {name!r})")
    spec = util.spec_from_file_location(f"fedjax_dg_user_{os.path.basename(module)[:-3]}", module)
    mod = util.module_from_spec(spec)
    spec.loader.exec_module(mod)
  else:
    try:
      mod = importlib.import_module(module)
    except ImportError as e:
      raise ValueError(f"data.loader: cannot import {module!r} for dataset {name!r} ({e})") from None
  if not hasattr(mod, fn):
    raise ValueError(f"data.loader: {module!r} has no function {fn!r} (the loader of dataset {name!r})")
  return getattr(mod, fn)


def known(data_config) -> bool:
  """Whether `config.data` names a dataset this process can load (built in, registered, or
  carrying the `data.loader` path that a registered dataset's run recorded)."""
  return data_config.name in DATASETS or bool(data_config.get("loader", ""))


def load_dataset(data_config) -> DomainDataset:
  """Builds the classification dataset that `config.data` names."""
  name = data_config.name
  path = DATASETS.get(name) or data_config.get("loader", "")
  if not path:
    raise ValueError(f"data.name: unknown dataset {name!r}; choose one of {sorted(DATASETS)} "
                     "or register one with fedjax_dg.register_dataset")
  fn = LOADERS[name] if name in LOADERS and DATASETS.get(name) == path else _import(path, name)
  ds = fn(data_config)
  if not isinstance(ds, DomainDataset):
    raise ValueError(f"data.name: the loader of {name!r} returned {type(ds).__name__}, not a DomainDataset")
  return ds
