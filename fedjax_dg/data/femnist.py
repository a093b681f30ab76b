"""FEMNIST in LEAF's JSON layout (Caldas et al. 2018, `leaf/data/femnist`), each writer a domain.

`data.root` holds LEAF's `train/` and `test/` folders of `*.json` files, each
`{"users": [writer, ...], "num_samples": [n, ...], "user_data": {writer: {"x": [[784
floats in [0, 1]], ...], "y": [label, ...]}}}` (`"hierarchies"` may also appear and is
ignored). A writer's rows from both folders are pooled: LEAF's train/test split is a
per-writer sample split, while Bai et al. 2024 (App. C.2) holds whole writers out and splits the
training writers 10% / 10% into in-domain validation / test itself (`splits.make_fold`).
Images are 28 x 28 x 1 (row-major, as LEAF flattens them), labels 0..61 (10 digits,
26 upper-case, 26 lower-case letters). With `data.dtype="uint8"` pixels are stored as
`round(255 x)`, exact for LEAF's `k / 255` values, and reach the model through
`Model.preprocess` (`/ 255`).

Held-out writers (seeded): writers sorted by id are permuted with `data.seed`; the first
`data.femnist_val_writers` form the held-out validation domains and the next
`data.femnist_test_writers` the test domains. The dataset lists them first, so their
domain ids are `heldout_ids(V, T)`: `data.val_domains = (0, ..., V-1)`, `data.test_domains =
(V, ..., V+T-1)` (configs/femnist.py sets them; a mismatch is an error). Bai et al. 2024 does not
say how it held writers out; Table 6 counts 2586 training writers, i.e. 964 of LEAF's 3550
held out, which the config reads as 482 + 482.

Clients: Heterogeneous Partitioning over writers (`partition.method="heterogeneous"`,
C = 100 < D); the natural partition, one client per writer, is
`num_clients = <training writers>` with `partition.lam = 0`.
"""
from __future__ import annotations

import glob
import json
import os

import numpy as np

from fedjax_dg import bounded
from fedjax_dg.data.datasets import DomainDataset
from fedjax_dg.data.folders import DataError

NUM_CLASSES = 62
PIXELS = 784
MAX_LEAF_BYTES = 2 << 30  # one LEAF JSON file (LEAF's own files are ~100-300 MB each)


def read_leaf_file(path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """`{writer: (x [n, 784] float32, y [n] int32)}` of one LEAF JSON file."""
  try:
    obj = json.loads(bounded.read_capped(path, MAX_LEAF_BYTES).decode("utf-8"))
  except bounded.UntrustedFileError as e:
    raise DataError(str(e)) from None
  except ValueError as e:  # UnicodeDecodeError included
    raise DataError(f"{path}: not valid JSON ({' '.join(str(e).split())})") from None
  except RecursionError:
    raise DataError(f"{path}: JSON nested too deeply (LEAF's files nest three levels)") from None
  try:
    return _writers(obj, path)
  except (TypeError, ValueError, AttributeError) as e:
    if isinstance(e, DataError):
      raise
    raise DataError(f"{path}: not LEAF's layout of users / num_samples / user_data ({type(e).__name__}: "
                    f"{' '.join(str(e).split())})") from None


def _writers(obj, path: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  for key in ("users", "num_samples", "user_data"):
    if not isinstance(obj, dict) or key not in obj:
      raise DataError(f"{path}: no key {key!r} (LEAF's users / num_samples / user_data)")
  if len(obj["users"]) != len(obj["num_samples"]):
    raise DataError(f"{path}: {len(obj['users'])} users but {len(obj['num_samples'])} num_samples")
  out = {}
  for writer, n in zip(obj["users"], obj["num_samples"]):
    data = obj["user_data"].get(writer)
    if not isinstance(data, dict) or "x" not in data or "y" not in data:
      raise DataError(f"{path}: user_data has no 'x' and 'y' for writer {writer!r}")
    x, y = data["x"], data["y"]
    if len(x) != n or len(y) != n:
      raise DataError(f"{path}: writer {writer!r} has {len(x)} images and {len(y)} labels, num_samples says {n}")
    bad = next((k for k, row in enumerate(x) if len(row) != PIXELS), None)
    if bad is not None:
      raise DataError(f"{path}: writer {writer!r} image {bad} has {len(x[bad])} pixels, not {PIXELS}")
    y = np.asarray(y)
    if n and (y.dtype.kind not in "iuf" or (y.dtype.kind == "f" and not np.all(y == np.round(y)))):
      raise DataError(f"{path}: writer {writer!r} has labels that are not whole numbers (e.g. {y.reshape(-1)[0]!r})")
    x, y = np.asarray(x, np.float32).reshape(n, PIXELS), y.astype(np.int64).reshape(n)
    if n and (y.min() < 0 or y.max() >= NUM_CLASSES):
      raise DataError(f"{path}: writer {writer!r} has label {int(y[(y < 0) | (y >= NUM_CLASSES)][0])}, "
                      f"not in 0..{NUM_CLASSES - 1}")
    bad = np.argwhere(~((x >= 0) & (x <= 1)))  # NaN fails both comparisons
    if len(bad):
      k, j = (int(v) for v in bad[0])
      raise DataError(f"{path}: writer {writer!r} image {k} pixel {j} is {float(x[k, j])!r}, outside [0, 1] "
                      f"({len(bad)} of the writer's {x.size} pixels are)")
    out[writer] = (x, y.astype(np.int32))
  return out


def read_leaf(root: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Every writer's pooled rows from `root/train/*.json` and `root/test/*.json`."""
  if not root:
    raise ValueError("data.root: set it to LEAF's femnist data folder (holding train/ and test/)")
  writers: dict[str, list] = {}
  for sub in ("train", "test"):
    folder = os.path.join(root, sub)
    if not os.path.isdir(folder):
      raise FileNotFoundError(f"{folder}: not found; data.root must hold LEAF's train/ and test/ folders")
    files = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not files:
      raise DataError(f"{folder}: no .json files (the {sub} split is empty)")
    for path in files:
      for w, xy in read_leaf_file(path).items():
        writers.setdefault(w, []).append(xy)
  total = sum(len(y) for parts in writers.values() for _, y in parts)
  if not total:
    raise DataError(f"{root}: the LEAF files hold no images")
  pooled = {w: (np.concatenate([x for x, _ in p]), np.concatenate([y for _, y in p])) for w, p in writers.items()}
  return {w: xy for w, xy in pooled.items() if len(xy[1])}  # a writer without images is no domain


def heldout_ids(num_val: int, num_test: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """`(val_domains, test_domains)` of the dataset `load` builds."""
  return tuple(range(num_val)), tuple(range(num_val, num_val + num_test))


def writer_order(writers, num_val: int, num_test: int, seed: int) -> list[str]:
  """Held-out validation writers, then test writers, then training writers (each sorted)."""
  names = sorted(writers)
  if num_val < 1 or num_test < 1 or num_val + num_test >= len(names):
    raise ValueError(f"data.femnist_val_writers ({num_val}) and data.femnist_test_writers ({num_test}) must be "
                     f">= 1 and leave a training writer of the {len(names)}")
  perm = np.random.default_rng(seed).permutation(len(names))
  pick = lambda idx: sorted(names[i] for i in idx)
  val, test = pick(perm[:num_val]), pick(perm[num_val:num_val + num_test])
  return val + test + pick(perm[num_val + num_test:])


def load(data_config) -> DomainDataset:
  """FEMNIST with one domain per writer, held-out writers first (module docstring)."""
  nv, nt = int(data_config.get("femnist_val_writers", 1)), int(data_config.get("femnist_test_writers", 1))
  val, test = heldout_ids(nv, nt)
  for field, want in (("val_domains", val), ("test_domains", test)):
    got = tuple(int(d) for d in data_config.get(field, ()))
    if got != want:
      raise ValueError(f"data.{field} must be tuple(range({want[0]}, {want[-1] + 1})) for femnist (the seeded "
                       f"held-out writers come first), got {got[:5]}{'...' if len(got) > 5 else ''}")
  if data_config.get("leave_one_domain_out", False):
    raise ValueError("data.leave_one_domain_out: not for femnist (held-out writers are chosen by data.seed)")
  writers = read_leaf(data_config.get("root", ""))
  order = writer_order(writers, nv, nt, int(data_config.get("seed", 0)))
  dtype = data_config.get("dtype", "uint8")
  if dtype not in ("uint8", "float32"):
    raise ValueError(f"data.dtype must be 'uint8' or 'float32', got {dtype!r}")
  conv = ((lambda x: np.rint(x * 255).astype(np.uint8)) if dtype == "uint8" else (lambda x: x))
  xs = tuple(conv(writers[w][0]).reshape(-1, 28, 28, 1) for w in order)
  return DomainDataset("femnist", tuple(order), xs, tuple(writers[w][1] for w in order), NUM_CLASSES)
