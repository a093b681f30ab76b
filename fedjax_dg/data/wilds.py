"""WILDS image datasets read from their release folders (the `wilds` package is not needed).

`config.data.root` is the unpacked release, e.g. `.../iwildcam_v2.0`; `config.data.dataset`
picks the layout. Each reader mirrors the `wilds/datasets/*_dataset.py` of the release:

- `iwildcam` (v2.0): `metadata.csv` with `split` (train / val / test / id_val / id_test),
  `y` (0..181), `location_remapped` (older files: `location`) and `filename`; images
  under `train/`. Domain = location (camera trap). WILDS keeps images at their own size
  and its `image_base` transform resizes to 448 (v1 configs) or 224; here to `data.image_size`.
- `camelyon17` (v1.0): `metadata.csv` (first column an index) with `patient`, `node`,
  `x_coord`, `y_coord`, `tumor` (the label), `slide`, `center`, `split` (0 train, 1 id_val);
  patches at `patches/patient_{p}_node_{n}/patch_patient_{p}_node_{n}_x_{x}_y_{y}.png`.
  Domain = hospital (`center`). The official scheme, as `Camelyon17Dataset` codes it with
  0-indexed centres: centre 1 is the OOD validation hospital and centre 2 the test
  hospital (the paper's 1-indexed "hospital 4" and "hospital 5"), centres 0, 3, 4 train,
  and their `split` column separates train from id_val. There is no id_test.
- `celeba` (v1.0): `list_attr_celeba.csv` (`image_id` and 40 attributes in {-1, 1}),
  `list_eval_partition.csv` (`image_id`, `partition` 0 train / 1 val / 2 test), images in
  `img_align_celeba/`. Label = `Blond_Hair`, domain = `Male` (Sagawa et al.'s variant);
  images are center-cropped to 178 x 178 first, as WILDS and GroupDRO do. There is no
  id_val / id_test. WILDS reads the two tables row by row in parallel; we join them on
  `image_id`.

Text releases: `civilcomments` (v1.0, `fedjax_dg.data.civilcomments`) and `py150` (v1.0,
`fedjax_dg.data.py150`) have their own readers, reached through `load_fold` by
`data.dataset` (TEXT_LOADERS), and carry their own WILDS metric in `Fold.metrics`.

Fold splits (Bai et al. 2024 App. C.2, "the Wilds official partitions"): train -> `train`,
id_val -> `in_val`, id_test -> `in_test`, val (OOD) -> `heldout_val`, test -> `test`.
Domain ids are the contiguous indices of the sorted domain values over the whole table
(so they do not change with `data.max_per_split`), named `<field>_<value>` like
DomainBed's `WILDSEnvironment` (`location_12`, `hospital_3`, `male_1`).
`KEY_METRIC` is the metric WILDS selects and reports on; with `Male` as the domain,
`metrics.worst_group_accuracy` over groups `domain x label` is WILDS's CelebA
worst-group accuracy over `(male, y)`.
"""
from __future__ import annotations

import csv
import math
import os
from typing import NamedTuple

import numpy as np

from fedjax_dg.data.datasets import DomainDataset
from fedjax_dg.data.folders import DataError, as_dtype, cached_images, options, subsample
from fedjax_dg.data.splits import Fold, Split, carve_test_domains

KEY_METRIC = {"iwildcam": "macro_f1_label_classes", "camelyon17": "accuracy", "celeba": "worst_group_accuracy"}
IWILDCAM_CLASSES = 182  # the release's label ids are 0..181 (`IWildCamDataset._n_classes`)
SPLITS = ("train", "id_val", "id_test", "val", "test")
FOLD_SPLITS = (("train", "train"), ("in_val", "id_val"), ("in_test", "id_test"),
               ("heldout_val", "val"), ("test", "test"))


class Table(NamedTuple):
  """One row per example of the release, in metadata order."""
  paths: list          # image files
  y: np.ndarray        # int32 labels
  domain: np.ndarray   # int64 raw domain values
  split: np.ndarray    # split names (SPLITS)
  source: str          # the table naming the images; example i is its row i + 2
  num_classes: int
  domain_field: str
  center_crop: bool


def read_columns(path: str, columns, optional=()) -> dict[str, list[str]]:
  """The named columns of a CSV (and those of `optional` it has), as lists of strings;
  one-line errors for a missing file or column."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: not found; data.root must be the unpacked WILDS release folder")
  try:
    return _read_columns(path, columns, optional)
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset {e.start})") from None
  except csv.Error as e:
    raise DataError(f"{path}: not a CSV table ({e})") from None


def _read_columns(path: str, columns, optional=()) -> dict[str, list[str]]:
  with open(path, newline="", encoding="utf-8-sig") as f:  # a byte-order mark is not part of the header
    reader = csv.reader(f)
    header = next(reader, [])
    missing = [c for c in columns if c not in header]
    if missing:
      raise DataError(f"{path}: no column {missing[0]!r} (columns: {', '.join(header)})")
    names = list(columns) + [c for c in optional if c in header]
    index = [header.index(c) for c in names]
    out = {c: [] for c in names}
    for k, row in enumerate(reader):
      if len(row) != len(header):
        raise DataError(f"{path} row {k + 2}: {len(row)} fields, the header has {len(header)}")
      for c, i in zip(names, index):
        out[c].append(row[i])
  return out


def image_paths(folder: str, names, table: str, column: str) -> list[str]:
  """`folder/name` for each name of a table's column, refusing (one line naming the row) a
  name that leads out of `folder` (`../`, an absolute path).

  Args:
    folder: the folder the images lie in.
    names: the names, in table order (row k + 2 of the file, after its header).
    table: the table's path, for the message.
    column: the column the names come from.

  Returns:
    The joined paths, as `os.path.join` writes them.

  Raises:
    DataError: for the first name that leaves `folder`.
  """
  base = os.path.normpath(folder)
  out = [os.path.join(folder, n) for n in names]
  for k, p in enumerate(out):
    if not os.path.normpath(p).startswith(base + os.sep):
      raise DataError(f"{table} row {k + 2}: column {column!r} names {names[k]!r}, a path outside {folder}; "
                      "refusing it")
  return out


def _ints(values, column: str, path: str) -> np.ndarray:
  """The column as integers; a value that is not a whole finite number ('3.7', 'nan',
  'inf', '1e400') is a one-line error naming its row."""
  out = np.empty(len(values), np.int64)
  for k, v in enumerate(values):
    f = float(v) if _is_number(v) else math.nan
    if not math.isfinite(f) or f != round(f) or abs(f) >= 2 ** 62:
      raise DataError(f"{path} row {k + 2}: column {column!r} holds {v!r}, not an integer")
    out[k] = int(f)
  return out


def _in_range(values: np.ndarray, column: str, path: str, allowed: str, ok) -> np.ndarray:
  """`values`, or a one-line error naming the first row whose value fails `ok`."""
  bad = np.flatnonzero(~ok(values))
  if len(bad):
    raise DataError(f"{path} row {bad[0] + 2}: column {column!r} holds {int(values[bad[0]])}, outside {allowed} "
                    f"({len(bad)} of {len(values)} rows do)")
  return values


def _is_number(v: str) -> bool:
  try:
    float(v)
    return True
  except ValueError:
    return False


def read_iwildcam(root: str) -> Table:
  path = os.path.join(root, "metadata.csv")
  cols = read_columns(path, ("split", "y", "filename"), optional=("location_remapped", "location"))
  field = "location_remapped" if "location_remapped" in cols else "location"
  if field not in cols:
    raise DataError(f"{path}: no column 'location_remapped' or 'location'")
  bad = [k for k, s in enumerate(cols["split"]) if s not in SPLITS]
  if bad:
    raise DataError(f"{path} row {bad[0] + 2}: split {cols['split'][bad[0]]!r} is not one of {list(SPLITS)}")
  in_range = lambda v: (v >= 0) & (v < IWILDCAM_CLASSES)
  y = _in_range(_ints(cols["y"], "y", path), "y", path, f"[0, {IWILDCAM_CLASSES})", in_range).astype(np.int32)
  return Table(image_paths(os.path.join(root, "train"), cols["filename"], path, "filename"), y, _ints(cols[field], field, path),
               np.array(cols["split"]), path, int(y.max()) + 1 if len(y) else 0, "location", False)


def camelyon17_patch(patient: str, node: str, x: str, y: str) -> str:
  """The patch path of a metadata row (patient zero-padded to 3 digits, as in the release)."""
  p = f"{int(patient):03d}" if patient.isdigit() else patient
  return f"patches/patient_{p}_node_{node}/patch_patient_{p}_node_{node}_x_{x}_y_{y}.png"


CAMELYON17_VAL_CENTER, CAMELYON17_TEST_CENTER = 1, 2


def read_camelyon17(root: str) -> Table:
  path = os.path.join(root, "metadata.csv")
  cols = read_columns(path, ("patient", "node", "x_coord", "y_coord", "tumor", "center", "split"))
  center = _ints(cols["center"], "center", path)
  flag = _ints(cols["split"], "split", path)
  split = np.where(center == CAMELYON17_VAL_CENTER, "val",
                   np.where(center == CAMELYON17_TEST_CENTER, "test", np.where(flag == 1, "id_val", "train")))
  bad = np.flatnonzero((split != "val") & (split != "test") & (flag != 0) & (flag != 1))
  if len(bad):
    raise DataError(f"{path} row {bad[0] + 2}: split {flag[bad[0]]} is not 0 (train) or 1 (id_val)")
  paths = image_paths(root, [camelyon17_patch(*(v.strip() for v in row))
                             for row in zip(cols["patient"], cols["node"], cols["x_coord"], cols["y_coord"])],
                      path, "patient, node, x_coord, y_coord")
  tumor = _in_range(_ints(cols["tumor"], "tumor", path), "tumor", path, "{0, 1}", lambda v: (v == 0) | (v == 1))
  return Table(paths, tumor.astype(np.int32), center, split,
               path, 2, "hospital", False)


def read_celeba(root: str) -> Table:
  attr_path = os.path.join(root, "list_attr_celeba.csv")
  part_path = os.path.join(root, "list_eval_partition.csv")
  attrs = read_columns(attr_path, ("image_id", "Blond_Hair", "Male"))
  parts = read_columns(part_path, ("image_id", "partition"))
  flags = _ints(parts["partition"], "partition", part_path)
  bad = np.flatnonzero((flags < 0) | (flags > 2))
  if len(bad):
    raise DataError(f"{part_path} row {bad[0] + 2}: partition {flags[bad[0]]} is not 0 (train), 1 (val) or 2 (test)")
  part = dict(zip(parts["image_id"], np.array(["train", "val", "test"])[flags]))
  missing = [k for k, i in enumerate(attrs["image_id"]) if i not in part]
  if missing:
    raise DataError(f"{attr_path} row {missing[0] + 2}: image_id {attrs['image_id'][missing[0]]!r} has no row in "
                    f"{part_path}")
  pm1 = lambda v: (v == -1) | (v == 1)
  y = (_in_range(_ints(attrs["Blond_Hair"], "Blond_Hair", attr_path), "Blond_Hair", attr_path, "{-1, 1}", pm1)
       == 1).astype(np.int32)
  male = (_in_range(_ints(attrs["Male"], "Male", attr_path), "Male", attr_path, "{-1, 1}", pm1) == 1).astype(np.int64)
  return Table(image_paths(os.path.join(root, "img_align_celeba"), attrs["image_id"], attr_path, "image_id"), y, male,
               np.array([part[i] for i in attrs["image_id"]]), attr_path, 2, "male", True)


READERS = {"iwildcam": read_iwildcam, "camelyon17": read_camelyon17, "celeba": read_celeba}
# Text releases: `data.dataset` -> "module:function" returning the official-split Fold.
TEXT_LOADERS = {"civilcomments": "fedjax_dg.data.civilcomments:load_fold", "py150": "fedjax_dg.data.py150:load_fold"}
KEY_METRIC.update({"civilcomments": "worst_group_accuracy", "py150": "accuracy"})


def read_table(data_config) -> Table:
  name = data_config.get("dataset", "")
  if name not in READERS:
    raise ValueError(f"data.dataset: unknown WILDS dataset {name!r}; choose one of {sorted(READERS) + sorted(TEXT_LOADERS)}")
  root, *_ = options(data_config)
  if not os.path.isdir(root):
    raise FileNotFoundError(f"data.root: no folder {root!r} (the unpacked WILDS {name} release)")
  return READERS[name](root)


def domain_index(table: Table):
  """`(ids, names)`: contiguous domain ids over the whole table and their names."""
  values, ids = np.unique(table.domain, return_inverse=True)
  return ids.astype(np.int32), tuple(f"{table.domain_field}_{v}" for v in values)


def _check_files(table: Table, idx) -> None:
  for i in idx:
    if not os.path.isfile(table.paths[i]):
      raise FileNotFoundError(f"{table.paths[i]}: image named by {table.source} row {i + 2} does not exist")


def _rows(table: Table, split: str, max_per_split: int, seed: int) -> np.ndarray:
  """The rows of `split`, at most `max_per_split` of them (drawn with `seed`)."""
  idx = np.flatnonzero(table.split == split)
  rng = np.random.default_rng([seed, SPLITS.index(split)])
  return idx[subsample(len(idx), max_per_split, rng)]


def _images(data_config, table: Table, idx, split: str) -> np.ndarray:
  root, size, cache_dir, dtype, workers, _ = options(data_config)
  _check_files(table, idx)
  x = cached_images([table.paths[i] for i in idx], size, cache_dir, f"{data_config.dataset}_{split}", root,
                    center_crop=table.center_crop, num_workers=workers,
                    extra={"dataset": data_config.dataset, "split": split})
  return as_dtype(x, dtype)


def _text_fold(data_config) -> Fold:
  import importlib  # pylint: disable=g-import-not-at-top
  module, fn = TEXT_LOADERS[data_config.dataset].split(":")
  return getattr(importlib.import_module(module), fn)(data_config)


def load_fold(data_config) -> Fold:
  """The official split scheme as a `Fold` (see the module docstring), images decoded
  once and cached; `data.max_per_split > 0` keeps that many random rows per split."""
  carve = lambda fold, seed: carve_test_domains(fold, data_config.get("test_domain_train_fraction", 0.0),
                                                 data_config.get("test_domain_train_include", True), seed)
  if data_config.get("dataset", "") in TEXT_LOADERS:
    return carve(_text_fold(data_config), int(data_config.get("seed", 0)))
  table = read_table(data_config)
  ids, names = domain_index(table)
  max_per_split, seed = int(data_config.get("max_per_split", 0)), int(data_config.get("seed", 0))
  parts = {}
  for field, split in FOLD_SPLITS:
    idx = _rows(table, split, max_per_split, seed)
    parts[field] = Split(_images(data_config, table, idx, split), table.y[idx], ids[idx])
  if not len(parts["heldout_val"].y) and (table.split == "val").sum() == 0:
    raise DataError(f"{table.source}: no rows in the official 'val' split (held-out-domain selection needs it); "
                    "use the complete WILDS release")
  doms = lambda s: tuple(int(d) for d in np.unique(s.domain))
  fold = Fold(**parts, train_domains=doms(parts["train"]), val_domains=doms(parts["heldout_val"]),
              test_domains=doms(parts["test"]), domain_names=names, num_classes=table.num_classes)
  return carve(fold, seed)


def load(data_config) -> DomainDataset:
  """The official training split only, one entry per training domain (names as in
  `load_fold`). For experiments on WILDS use `load_fold`, which keeps the official
  validation and test splits."""
  if data_config.get("dataset", "") in TEXT_LOADERS:
    fold = _text_fold(data_config)
    tr, doms = fold.train, fold.train_domains
    return DomainDataset(f"wilds_{data_config.dataset}", tuple(fold.domain_names[k] for k in doms),
                         tuple(tr.x[tr.domain == k] for k in doms), tuple(tr.y[tr.domain == k] for k in doms),
                         fold.num_classes)
  table = read_table(data_config)
  ids, names = domain_index(table)
  idx = _rows(table, "train", int(data_config.get("max_per_split", 0)), int(data_config.get("seed", 0)))
  x = _images(data_config, table, idx, "train")
  y, d = table.y[idx], ids[idx]
  doms = np.unique(d)
  return DomainDataset(f"wilds_{data_config.dataset}", tuple(names[k] for k in doms),
                       tuple(x[d == k] for k in doms), tuple(y[d == k] for k in doms), table.num_classes)
