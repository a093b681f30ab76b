"""Text inputs: a local `tokenizer.json` (the `tokenizers` package), token-id arrays padded
with `PAD`, and a cache of encoded splits.

Every text loader stores int32 token ids `[N, T]` with `PAD = -1` at padded positions: a
value no tokenizer emits, so the models (`fedjax_dg.models.text`) derive their attention
masks from the ids alone and no config field has to repeat the tokenizer's pad id.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from fedjax_dg.data.folders import DataError

PAD = -1


def check_tokenizer_path(path: str) -> None:
  if not path:
    raise ValueError("data.tokenizer: set it to a local tokenizer.json (e.g. distilbert-base-uncased's)")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"data.tokenizer: no such file {path!r}")


def load_tokenizer(path: str):
  """A `tokenizers.Tokenizer` from a local `tokenizer.json` (Hugging Face's fast-tokenizer
  file, e.g. from distilbert-base-uncased); never downloaded."""
  check_tokenizer_path(path)
  try:
    from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError("the text datasets need the `tokenizers` package: pip install 'fedjax-dg[data]'") from None
  try:
    return Tokenizer.from_file(path)
  except Exception as e:  # pylint: disable=broad-except  # any parse failure is a bad file
    raise DataError(f"{path}: not a tokenizer.json ({' '.join(str(e).split())})") from None


def encode(tokenizer, texts, max_len: int) -> np.ndarray:
  """int32 `[N, max_len]`: each text's ids (with the tokenizer's special tokens, e.g.
  [CLS] ... [SEP]), truncated to `max_len` as HF's `truncation=True` does (the special
  tokens kept), then `PAD`."""
  if max_len < 2:
    raise ValueError(f"data.max_tokens must be >= 2, got {max_len}")
  tokenizer.no_padding()
  tokenizer.enable_truncation(max_length=max_len)
  out = np.full((len(texts), max_len), PAD, np.int32)
  for i, enc in enumerate(tokenizer.encode_batch(list(texts))):
    out[i, :len(enc.ids)] = enc.ids
  return out


def decode(tokenizer, ids) -> str:
  """The text of one row of `encode`'s output (padding and special tokens dropped)."""
  ids = [int(i) for i in ids if i != PAD]
  return tokenizer.decode(ids, skip_special_tokens=True)


def cached_encode(texts, tokenizer_path: str, max_len: int, cache_dir: str, name: str) -> np.ndarray:
  """`encode` of `texts`, saved once as `<cache_dir>/<name>_<key>.npy`; the key hashes the
  tokenizer file, `max_len` and the texts, so a changed input never reads a stale cache."""
  check_tokenizer_path(tokenizer_path)
  h = hashlib.sha256()
  with open(tokenizer_path, "rb") as f:
    h.update(f.read())
  h.update(str(max_len).encode())
  for t in texts:
    h.update(t.encode("utf-8", "surrogatepass"))
    h.update(b"\0")
  path = os.path.join(cache_dir, f"{name}_{h.hexdigest()[:20]}.npy") if cache_dir else ""
  if path and os.path.isfile(path):
    cached = _read_cache(path, len(texts), max_len)
    if cached is not None:
      return cached
  ids = encode(load_tokenizer(tokenizer_path), texts, max_len)
  if path:
    os.makedirs(cache_dir, exist_ok=True)
    tmp = path + ".tmp.npy"
    np.save(tmp, ids)
    os.replace(tmp, path)
  return ids


def _read_cache(path: str, n: int, max_len: int):
  """The cached ids, or None (with a one-line warning; the texts are encoded again) when
  the file is cut short, corrupt or of another shape."""
  import warnings
  try:
    ids = np.load(path, allow_pickle=False)
    if ids.shape == (n, max_len) and ids.dtype.kind in "iu":
      return ids
    why = f"holds {ids.dtype}{list(ids.shape)}, expected [{n}, {max_len}] integers"
  except (OSError, ValueError, EOFError) as e:
    why = f"{type(e).__name__}: {' '.join(str(e).split())}"
  warnings.warn(f"{path}: unreadable token cache ({why}); encoding the texts again")
  return None
