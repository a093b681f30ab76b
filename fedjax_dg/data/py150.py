"""Py150-WILDS v1.0 from its release folder (the `wilds` package is not needed).

`data.root` is the unpacked `py150_v1.0/`, read as `wilds/datasets/py150_dataset.py`
(`Py150Dataset._load_all_data`) reads it. For each split file name S in `train`, `IDval`,
`OODval`, `IDtest`, `OODtest`:
- `processed/S_input.json`: a JSON list of token-id lists, one per example (a code chunk
  already tokenized with CodeGPT-small-py's tokenizer and right-padded with its pad id,
  `data.pad_id = 1` as WILDS's `pad_token_id`), all of one length (256 in the release);
- `processed/S_input_tok_type.json`: the same shape, each token's type (WILDS's
  `_TYPE2ID`: class 0, method 1, punctuation 2, keyword 3, builtin 4, literal 5,
  other_identifier 6, masked -100);
- `metadata/repo_file_names/S.txt`: one source-file name per example, `owner/repo/...`;
and `metadata/repo_file_names/repo_ids.csv` with columns `id` and `repo_name`
(`owner/repo`). Domain = repository: `repo_ids.csv`'s id of the file's first two path
components, made contiguous over all splits and named `repo_<id>`.

Examples (as WILDS): input `x = tokens[:-1]`, labels `y = tokens[1:]` (next-token
prediction), a label ignored (`models.text.IGNORE`) where its token type is masked; the
trailing run of pad ids in `x` becomes `text.PAD` (the models' attention mask; WILDS
passes no mask, which with right padding and causal attention gives the same outputs at
every real position). `Split.meta` holds the label tokens' types `[N, T]`.

Official split (Bai et al. 2024 App. C.2): train -> `train`, IDval -> `in_val`, IDtest ->
`in_test`, OODval -> `heldout_val`, OODtest -> `test`.

Metric (`wilds_metrics`, `Py150Dataset.eval`): `accuracy` is WILDS's key metric `acc`, the
accuracy over class and method tokens (Bai et al. 2024 Table 5); also `overall_accuracy` over every
labelled token and `class_accuracy`, `method_accuracy`. An empty set of positions scores 0,
as in WILDS. The loss over all labelled tokens is `models.text.token_cross_entropy`.
"""
from __future__ import annotations

import json
import os

import numpy as np

from fedjax_dg.data import text
from fedjax_dg.data.folders import DataError, subsample
from fedjax_dg.data.splits import Fold, Split
from fedjax_dg.data.wilds import read_columns

IGNORE = -100  # models.text.IGNORE; token type "masked"
MAX_TOKEN_ID = 1 << 24  # a token id beyond it would make a vocabulary head of billions of parameters
TOKEN_TYPES = {"class": 0, "method": 1, "punctuation": 2, "keyword": 3, "builtin": 4, "literal": 5,
               "other_identifier": 6, "masked": -100}
FOLD_SPLITS = (("train", "train"), ("in_val", "IDval"), ("in_test", "IDtest"), ("heldout_val", "OODval"),
               ("test", "OODtest"))


def _json(path: str):
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: not found; data.root must be the unpacked py150_v1.0 folder")
  try:
    with open(path) as f:
      return json.load(f)
  except ValueError as e:
    raise DataError(f"{path}: not valid JSON ({e})") from None


def _matrix(rows, path: str) -> np.ndarray:
  """A list of equally long integer lists as int64 `[N, L]`."""
  if not isinstance(rows, list) or not rows:
    raise DataError(f"{path}: the split is empty (expected a list of token lists)")
  n = len(rows[0]) if isinstance(rows[0], list) else -1
  for k, r in enumerate(rows):
    if not isinstance(r, list) or len(r) != n:
      raise DataError(f"{path}: example {k} has {len(r) if isinstance(r, list) else 'no'} tokens, example 0 has {n}")
  if n < 2:
    raise DataError(f"{path}: examples need at least 2 tokens, got {n}")
  try:
    return np.array(rows, np.int64)
  except (TypeError, ValueError, OverflowError):
    raise DataError(f"{path}: token lists must hold integers") from None


def _check_ids(tokens: np.ndarray, path: str) -> np.ndarray:
  bad = np.argwhere((tokens < 0) | (tokens >= MAX_TOKEN_ID))
  if len(bad):
    k, j = (int(i) for i in bad[0])
    raise DataError(f"{path}: example {k} token {j} is {int(tokens[k, j])}, outside the token ids [0, {MAX_TOKEN_ID})")
  return tokens


def repo_table(root: str) -> dict[str, int]:
  """`repo_ids.csv`: repository name -> id."""
  path = os.path.join(root, "metadata", "repo_file_names", "repo_ids.csv")
  cols = read_columns(path, ("id", "repo_name"))
  try:
    ids = [int(v) for v in cols["id"]]
  except ValueError:
    k = next(k for k, v in enumerate(cols["id"]) if not v.strip().lstrip("-").isdigit())
    raise DataError(f"{path} row {k + 2}: column 'id' holds {cols['id'][k]!r}, not an integer") from None
  return dict(zip(cols["repo_name"], ids))


def read_split(root: str, name: str, repos: dict[str, int]):
  """`(tokens [N, L], tok_type [N, L], repo [N])` of split file name `name`."""
  inp = os.path.join(root, "processed", f"{name}_input.json")
  typ = os.path.join(root, "processed", f"{name}_input_tok_type.json")
  txt = os.path.join(root, "metadata", "repo_file_names", f"{name}.txt")
  tokens, types = _check_ids(_matrix(_json(inp), inp), inp), _matrix(_json(typ), typ)
  if tokens.shape != types.shape:
    raise DataError(f"{typ}: shape {types.shape} differs from {inp}'s {tokens.shape}")
  if not os.path.isfile(txt):
    raise FileNotFoundError(f"{txt}: not found; data.root must be the unpacked py150_v1.0 folder")
  with open(txt) as f:
    fnames = [line.strip() for line in f if line.strip()]
  if len(fnames) != len(tokens):
    raise DataError(f"{txt}: {len(fnames)} file names for the {len(tokens)} examples of {inp}")
  repo = np.empty(len(fnames), np.int64)
  for k, fn in enumerate(fnames):
    key = "/".join(fn.split("/")[:2])
    if key not in repos:
      raise DataError(f"{txt} line {k + 1}: repository {key!r} is not in repo_ids.csv")
    repo[k] = repos[key]
  return tokens, types, repo


def examples(tokens: np.ndarray, types: np.ndarray, pad_id: int):
  """WILDS's `(x, y, tok_type)`: `x = tokens[:, :-1]` with its trailing pad ids -> PAD,
  `y = tokens[:, 1:]` ignored where `types[:, 1:]` is masked, `tok_type = types[:, 1:]`."""
  x = tokens[:, :-1].astype(np.int32)
  real = x != pad_id
  last = np.where(real.any(1), x.shape[1] - 1 - np.argmax(real[:, ::-1], axis=1), -1)
  x[np.arange(x.shape[1])[None] > last[:, None]] = text.PAD
  tok_type = types[:, 1:].astype(np.int32)
  y = np.where(tok_type == TOKEN_TYPES["masked"], IGNORE, tokens[:, 1:]).astype(np.int32)
  return x, y, tok_type


def _acc(pred, y, pos) -> float:
  return float(np.mean(pred[pos] == y[pos])) if pos.any() else 0.0


def wilds_metrics(pred, split: Split) -> dict:
  """`Py150Dataset.eval` on predictions `[N, T]` (module docstring)."""
  pred, y, tt = np.asarray(pred), np.asarray(split.y), np.asarray(split.meta)
  cm = (tt == TOKEN_TYPES["class"]) | (tt == TOKEN_TYPES["method"])
  labelled = y != IGNORE
  return {"accuracy": _acc(pred, y, cm), "overall_accuracy": _acc(pred, y, labelled),
          "class_accuracy": _acc(pred, y, tt == TOKEN_TYPES["class"]),
          "method_accuracy": _acc(pred, y, tt == TOKEN_TYPES["method"]),
          "n": int(len(y)), "n_class_method_tokens": int(cm.sum()), "n_tokens": int(labelled.sum())}


def load_fold(data_config) -> Fold:
  """The official split as a `Fold` (module docstring); `data.max_per_split > 0` keeps that
  many random examples per split."""
  root = data_config.get("root", "")
  if not root:
    raise ValueError("data.root: set it to the unpacked py150_v1.0 folder")
  if not os.path.isdir(root):
    raise FileNotFoundError(f"data.root: no folder {root!r} (the unpacked py150_v1.0 release)")
  repos = repo_table(root)
  pad_id = int(data_config.get("pad_id", 1))
  raw = {field: read_split(root, name, repos) for field, name in FOLD_SPLITS}
  values = np.unique(np.concatenate([r[2] for r in raw.values()]))
  max_per_split, seed = int(data_config.get("max_per_split", 0)), int(data_config.get("seed", 0))
  parts, vocab = {}, 0
  for k, (field, _) in enumerate(FOLD_SPLITS):
    tokens, types, repo = raw[field]
    idx = subsample(len(tokens), max_per_split, np.random.default_rng([seed, k]))
    x, y, tt = examples(tokens[idx], types[idx], pad_id)
    vocab = max(vocab, int(tokens[idx].max()) + 1)
    parts[field] = Split(x, y, np.searchsorted(values, repo[idx]).astype(np.int32), tt)
  present = lambda s: tuple(int(d) for d in np.unique(s.domain))
  return Fold(**parts, train_domains=present(parts["train"]), val_domains=present(parts["heldout_val"]),
              test_domains=present(parts["test"]), domain_names=tuple(f"repo_{v}" for v in values),
              num_classes=vocab, metrics=wilds_metrics)
