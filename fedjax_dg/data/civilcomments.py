"""CivilComments-WILDS v1.0 from its release folder (the `wilds` package is not needed).

`data.root` is the unpacked `civilcomments_v1.0/` holding `all_data_with_identities.csv`,
read as `wilds/datasets/civilcomments_dataset.py` reads it: a first unnamed index column,
`comment_text`, `toxicity` (a score in [0, 1]), `split` (`train` / `val` / `test`) and the
identity columns `male, female, LGBTQ, christian, muslim, other_religions, black, white`
(fractions of raters). Label `y = toxicity >= 0.5`; identity `k` is present when its
column is `>= 0.5` (an empty cell, NaN for pandas, is absent, as in WILDS).

Official split (Bai et al. 2024 App. C.2): train -> `train`, val -> `heldout_val`, test -> `test`;
there is no in-domain validation or test split.

Domains. WILDS evaluates on 16 groups, identity k present x label (8 x 2): Bai et al. 2024's
"D = 16" counts these. They overlap (a comment can mention several identities, or none), so
they cannot partition clients. Clients are partitioned as WILDS's training grouper and the
authors' code (`src/dataset_bundle.py: CivilComments._domain_fields = ['black', 'y']`) do:
over the combinations of `data.civil_domain_fields` (default `("black", "y")`, 4 domains,
named `black=0,y=1`); `y` is allowed there as it is in WILDS's grouper.

Metric (`wilds_metrics`, the Fold's `metrics`): average accuracy and WILDS's worst-group
accuracy, the minimum accuracy over the 16 groups present (`CivilCommentsDataset.eval`),
with each group's accuracy and count. Selection: `data.select_metric="worst_group_accuracy"`.

Text is tokenized with the local `data.tokenizer` (distilbert-base-uncased's
`tokenizer.json`), truncated to `data.max_tokens` (300, the authors' `max_length`), padded
with `text.PAD`, and cached under `data.cache_dir` (default `<root>/.fedjax_dg_cache/tokens`).
"""
from __future__ import annotations

import csv
import os
import sys

import numpy as np

from fedjax_dg.data import text
from fedjax_dg.data.folders import DataError, subsample
from fedjax_dg.data.splits import Fold, Split
from fedjax_dg.eval.metrics import accuracy, macro_f1

FILE = "all_data_with_identities.csv"
IDENTITIES = ("male", "female", "LGBTQ", "christian", "muslim", "other_religions", "black", "white")
SPLITS = ("train", "val", "test")
FOLD_SPLITS = (("train", "train"), ("heldout_val", "val"), ("test", "test"))


def read_table(root: str) -> dict[str, list[str]]:
  """The needed columns of the CSV as lists of strings; one-line errors naming the file."""
  path = os.path.join(root, FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: not found; data.root must be the unpacked civilcomments_v1.0 folder")
  csv.field_size_limit(min(sys.maxsize, 2 ** 31 - 1))  # comments can be long
  columns = ("comment_text", "toxicity", "split") + IDENTITIES
  try:
    return _read_table(path, columns)
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset {e.start})") from None


def _read_table(path: str, columns) -> dict[str, list[str]]:
  with open(path, newline="", encoding="utf-8") as f:
    reader = csv.reader(f)
    header = next(reader, [])
    missing = [c for c in columns if c not in header]
    if missing:
      raise DataError(f"{path}: no column {missing[0]!r} (columns: {', '.join(header)})")
    index = [header.index(c) for c in columns]
    out = {c: [] for c in columns}
    for k, row in enumerate(reader):
      if len(row) != len(header):
        raise DataError(f"{path} row {k + 2}: {len(row)} fields, the header has {len(header)}")
      for c, i in zip(columns, index):
        out[c].append(row[i])
  bad = [k for k, s in enumerate(out["split"]) if s not in SPLITS]
  if bad:
    raise DataError(f"{path} row {bad[0] + 2}: split {out['split'][bad[0]]!r} is not one of {list(SPLITS)}")
  return out


def scores(values, column: str, path: str, required: bool = False) -> np.ndarray:
  """Floats of a score column, each in [0, 1]; an empty cell is NaN (so `>= 0.5` is False,
  as in WILDS) unless `required`. A value that is not a number in [0, 1] ('nan', 'inf',
  '1.5', '-0.1') is a one-line error naming its row."""
  out = np.full(len(values), np.nan)
  for k, v in enumerate(values):
    if not v.strip() and not required:
      continue
    f = float(v) if v.strip() and _is_float(v) else None
    if f is None or not 0.0 <= f <= 1.0:  # NaN fails the comparison too
      what = "not a number" if f is None else "outside [0, 1]"
      raise DataError(f"{path} row {k + 2}: column {column!r} holds {v!r}, {what}")
    out[k] = f
  return out


def _is_float(v: str) -> bool:
  try:
    float(v)
    return True
  except ValueError:
    return False


def labels_and_identities(table, path: str):
  """`(y [N] int32, identities [N, 8] bool)` by WILDS's `>= 0.5` rule."""
  with np.errstate(invalid="ignore"):
    y = (scores(table["toxicity"], "toxicity", path, required=True) >= 0.5).astype(np.int32)
    ident = np.stack([scores(table[c], c, path) >= 0.5 for c in IDENTITIES], 1)
  return y, ident


def domains(y, identities, fields) -> tuple[np.ndarray, tuple[str, ...]]:
  """Domain id per comment over the combinations of the binary `fields` (identity names
  or `y`), mixed radix in field order, and the names of all 2^len(fields) domains."""
  fields = tuple(fields)
  if not fields:
    raise ValueError("data.civil_domain_fields: name at least one of " + ", ".join(IDENTITIES + ("y",)))
  cols = []
  for f in fields:
    if f == "y":
      cols.append(y.astype(np.int64))
    elif f in IDENTITIES:
      cols.append(identities[:, IDENTITIES.index(f)].astype(np.int64))
    else:
      raise ValueError(f"data.civil_domain_fields: unknown field {f!r}; choose from {list(IDENTITIES + ('y',))}")
  ids = np.zeros(len(y), np.int64)
  for c in cols:
    ids = 2 * ids + c
  names = tuple(",".join(f"{f}={(d >> (len(fields) - 1 - j)) & 1}" for j, f in enumerate(fields))
                for d in range(2 ** len(fields)))
  return ids.astype(np.int32), names


def wilds_metrics(pred, split: Split) -> dict:
  """`CivilCommentsDataset.eval`: average accuracy, and the worst accuracy over the groups
  (identity k present, y) with at least one comment; every group's accuracy and count."""
  pred, y, ident = np.asarray(pred), np.asarray(split.y), np.asarray(split.meta, bool)
  out = {"accuracy": accuracy(pred, y), "macro_f1": macro_f1(pred, y), "n": int(len(y))}
  worst = float("nan")
  for k, name in enumerate(IDENTITIES):
    for label, tag in ((0, "non_toxic"), (1, "toxic")):
      g = ident[:, k] & (y == label)
      out[f"count_{name}_{tag}"] = int(g.sum())
      if g.any():
        acc = float(np.mean(pred[g] == y[g]))
        out[f"accuracy_{name}_{tag}"] = acc
        worst = acc if not np.isfinite(worst) else min(worst, acc)
  out["worst_group_accuracy"] = worst
  return out


def _options(data_config):
  root = data_config.get("root", "")
  if not root:
    raise ValueError("data.root: set it to the unpacked civilcomments_v1.0 folder")
  if not os.path.isdir(root):
    raise FileNotFoundError(f"data.root: no folder {root!r} (the unpacked civilcomments_v1.0 release)")
  cache = data_config.get("cache_dir", "") or os.path.join(root, ".fedjax_dg_cache", "tokens")
  return root, cache, int(data_config.get("max_tokens", 300))


def load_fold(data_config) -> Fold:
  """The official split as a `Fold` (module docstring); `data.max_per_split > 0` keeps
  that many random comments per split."""
  root, cache, max_len = _options(data_config)
  path = os.path.join(root, FILE)
  table = read_table(root)
  y, ident = labels_and_identities(table, path)
  dom, names = domains(y, ident, data_config.get("civil_domain_fields", ("black", "y")))
  split = np.array(table["split"])
  max_per_split, seed = int(data_config.get("max_per_split", 0)), int(data_config.get("seed", 0))
  parts = {}
  for field, name in FOLD_SPLITS:
    idx = np.flatnonzero(split == name)
    if not len(idx):
      raise DataError(f"{path}: the {name!r} split is empty")
    idx = idx[subsample(len(idx), max_per_split, np.random.default_rng([seed, SPLITS.index(name)]))]
    ids = text.cached_encode([table["comment_text"][i] for i in idx], data_config.get("tokenizer", ""),
                             max_len, cache, f"civilcomments_{name}")
    parts[field] = Split(ids, y[idx], dom[idx], ident[idx])
  empty = Split(np.zeros((0, max_len), np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32),
                np.zeros((0, len(IDENTITIES)), bool))
  present = lambda s: tuple(int(d) for d in np.unique(s.domain))
  return Fold(train=parts["train"], in_val=empty, in_test=empty, heldout_val=parts["heldout_val"],
              test=parts["test"], train_domains=present(parts["train"]),
              val_domains=present(parts["heldout_val"]), test_domains=present(parts["test"]),
              domain_names=names, num_classes=2, metrics=wilds_metrics)
