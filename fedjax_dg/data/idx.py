"""MNIST-format (IDX) files and DomainBed's RotatedMNIST and ColoredMNIST recipes on them.

Any directory holding `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
`t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte` (each optionally `.gz`) works: MNIST,
Fashion-MNIST (Debian package `dataset-fashion-mnist`, installed to
`DEBIAN_FASHION_MNIST`), KMNIST, or EMNIST with a file-name prefix. Like DomainBed, the
recipes pool the training and test files (70000 images for MNIST) before dealing them out
to domains. Labels must lie in `[0, data.num_classes)` (default 10: MNIST, Fashion-MNIST,
KMNIST, EMNIST digits; set it for other EMNIST splits). Every unreadable file, and a label
file holding a label outside that range, is a one-line ValueError that names it. A gzipped
file is inflated (a plain one read) only up to the size its IDX header declares, a header
declaring more than `MAX_IDX_BYTES` is refused before anything is inflated, and a FIFO or
device (or a link to one) is not read.
"""
from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

from fedjax_dg import bounded
from fedjax_dg.data.datasets import DomainDataset, check_labels, deal_domains

# Where Debian's `dataset-fashion-mnist` puts the four gzipped IDX files.
DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
DEBIAN_PACKAGES = {DEBIAN_FASHION_MNIST: "dataset-fashion-mnist"}

# IDX type codes (third magic byte) -> big-endian dtype.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
DEFAULT_NUM_CLASSES = 10  # `data.num_classes` when unset: the ten digits (or Fashion-MNIST's ten classes)
_FILES = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
          "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}


MAX_IDX_BYTES = 2 << 30  # one IDX file, inflated (EMNIST ByClass's training images: 547 MB)


def _declared_bytes(head: bytes, name: str) -> int:
  """Header and data bytes the IDX header `head` declares (one line if it is bad or too large)."""
  if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in _IDX_DTYPES:
    raise ValueError(f"{name}: not an IDX file (bad magic bytes {head[:4].hex() or 'none'})")
  header = 4 + 4 * head[3]
  if len(head) < header:
    raise ValueError(f"{name}: truncated IDX header ({len(head)} bytes, need {header})")
  shape = tuple(int(d) for d in np.frombuffer(head, ">u4", head[3], offset=4))
  total = header + int(np.prod(shape, dtype=object)) * np.dtype(_IDX_DTYPES[head[2]]).itemsize
  if total > MAX_IDX_BYTES:
    raise ValueError(f"{name}: its IDX header declares shape {shape} ({total} bytes), more than the "
                     f"{MAX_IDX_BYTES} allowed for one file")
  return total


def _read_bytes(path: str) -> bytes:
  """The IDX bytes of `path`; a file is read (a gzipped one inflated) no further than its
  header declares (one byte more, to tell a file longer than its header)."""
  if not os.path.lexists(path):
    raise ValueError(f"{path}: no such IDX file")
  bounded.regular_file(path)  # not a FIFO or a device (a link to one included)
  with open(path, "rb") as f:
    magic = f.read(2)
  if not (path.endswith(".gz") or magic == b"\x1f\x8b"):
    with open(path, "rb") as f:
      head = f.read(4)
      head += f.read(4 * head[3]) if len(head) == 4 else b""
      total = _declared_bytes(head, path)
      return head + f.read(total - len(head) + 1)
  try:
    with gzip.open(path, "rb") as g:
      head = g.read(4)
      head += g.read(4 * head[3]) if len(head) == 4 else b""
      total = _declared_bytes(head, path)
      return head + g.read(total - len(head) + 1)
  except (OSError, EOFError, zlib.error) as e:
    raise ValueError(f"{path}: corrupt gzip data ({' '.join(str(e).split())})") from None


def parse_idx(raw: bytes, name: str = "<bytes>") -> np.ndarray:
  """IDX bytes -> array: magic `0, 0, type code, ndim`, then `ndim` big-endian uint32
  sizes, then the data in row-major order, big-endian."""
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
    raise ValueError(f"{name}: not an IDX file (bad magic bytes {raw[:4].hex() or 'none'})")
  ndim = raw[3]
  header = 4 + 4 * ndim
  if len(raw) < header:
    raise ValueError(f"{name}: truncated IDX header ({len(raw)} bytes, need {header})")
  shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, offset=4))
  dtype = np.dtype(_IDX_DTYPES[raw[2]])
  expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if len(raw) - header != expected:
    raise ValueError(f"{name}: IDX data size {len(raw) - header} bytes does not match its header "
                     f"shape {shape} ({expected} bytes); the file is truncated or corrupt")
  return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def read_idx(path: str) -> np.ndarray:
  """Reads one IDX file, gzipped (by `.gz` suffix or gzip magic) or plain."""
  return parse_idx(_read_bytes(path), path)


def _find(root: str, stem: str) -> str:
  for candidate in (os.path.join(root, stem), os.path.join(root, stem + ".gz")):
    if os.path.isfile(candidate):
      return candidate
  raise ValueError(f"{os.path.join(root, stem)}[.gz]: no such IDX file")


def _pair(root: str, prefix: str, split: str, num_classes: int = 0):
  xpath, ypath = _find(root, prefix + _FILES[split + "_x"]), _find(root, prefix + _FILES[split + "_y"])
  x, y = read_idx(xpath), read_idx(ypath)
  if x.ndim != 3 or y.ndim != 1:
    raise ValueError(f"{xpath}: expected images [N, H, W] and labels [N], got {x.shape} and {y.shape}")
  if len(x) != len(y):
    raise ValueError(f"{xpath}: {len(x)} images but {ypath} has {len(y)} labels")
  if x.dtype != np.uint8:
    raise ValueError(f"{xpath}: images must be unsigned bytes (IDX type 0x08, pixels 0..255), got {x.dtype} "
                     f"(values up to {float(x.max()) if x.size else 0.0:g})")
  check_labels(y, num_classes, ypath, "; data.num_classes sets the number of classes")
  return x, y


def _num_classes(data_config) -> int:
  k = int(data_config.get("num_classes", DEFAULT_NUM_CLASSES))
  if k < 2:
    raise ValueError(f"data.num_classes must be >= 2 (the labels in the IDX files lie in [0, num_classes)), got {k}")
  return k


def load_mnist_dir(root: str, prefix: str = "", num_classes: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """`(images uint8 [N, H, W], labels int32 [N])` of `root`'s train and t10k files,
  concatenated in that order (DomainBed uses all 70000 MNIST images); with
  `num_classes > 0`, a label outside `[0, num_classes)` is an error naming its file."""
  (xtr, ytr), (xte, yte) = _pair(root, prefix, "train", num_classes), _pair(root, prefix, "test", num_classes)
  if xtr.shape[1:] != xte.shape[1:]:
    raise ValueError(f"{root}: train images are {xtr.shape[1:]} but t10k images are {xte.shape[1:]}")
  return np.concatenate([xtr, xte]), np.concatenate([ytr, yte]).astype(np.int32)


def _source_dir(data_config) -> str:
  """`data.path`, else `data.fallback_path`: the first that holds the training images."""
  prefix = data_config.get("prefix", "")
  candidates = [p for p in (data_config.get("path", ""), data_config.get("fallback_path", "")) if p]
  for root in candidates:
    stem = os.path.join(root, prefix + _FILES["train_x"])
    if os.path.isfile(stem) or os.path.isfile(stem + ".gz"):
      return root
  if not candidates:
    raise ValueError(f"data.path: set it to a directory with MNIST-format files ({_FILES['train_x']}[.gz], ...)")
  hints = [f"sudo apt-get install {DEBIAN_PACKAGES[p]} (or scripts/install_fashion_mnist.sh)"
           for p in candidates if p in DEBIAN_PACKAGES]
  raise ValueError(f"data.path: no {prefix}{_FILES['train_x']}[.gz] in "
                   + " or ".join(repr(p) for p in candidates)
                   + (f"; install with: {hints[0]}" if hints else ""))


def rotate(images: np.ndarray, angle: float) -> np.ndarray:
  """uint8 [N, H, W] -> float32 [N, H, W, 1] in [0, 1], rotated `angle` degrees
  counter-clockwise about the centre, bilinear, zero fill, same size."""
  from scipy import ndimage  # pylint: disable=g-import-not-at-top
  x = images.astype(np.float32) / 255.0
  if angle % 360:
    x = ndimage.rotate(x, angle, axes=(1, 2), reshape=False, order=1, mode="constant", cval=0.0)
  return x[..., None]


def load_rotated(data_config) -> DomainDataset:
  """DomainBed's RotatedMNIST on the IDX files in `data.path` (or `data.fallback_path`).

  All train + t10k images are shuffled (`data.seed`) and dealt into one disjoint share per
  angle in `data.angles` (`perm[i::D]`); share `i` is rotated by `angles[i]` degrees
  (bilinear, zero fill, 28x28x1, pixels in [0, 1]); 10 classes. `data.max_per_domain > 0`
  keeps that many random images per domain. Deviations: DomainBed rotates each uint8
  image with PIL and shuffles with torch's global RNG; we rotate the float images with
  `scipy.ndimage.rotate` (same direction and centre, so pixels differ from PIL's only by
  its uint8 rounding) and shuffle with NumPy's seeded generator.
  """
  root = _source_dir(data_config)
  num_classes = _num_classes(data_config)
  images, labels = load_mnist_dir(root, data_config.get("prefix", ""), num_classes)
  angles = tuple(data_config.get("angles", (0, 15, 30, 45, 60, 75)))
  shares = deal_domains(len(images), len(angles), data_config.get("seed", 0), data_config.get("max_per_domain", 0))
  xs = tuple(rotate(images[s], a) for s, a in zip(shares, angles))
  ys = tuple(labels[s] for s in shares)
  name = data_config.get("name", "rotated_mnist")
  return DomainDataset(name, tuple(f"{a:g}deg" for a in angles), xs, ys, num_classes)


def colored_domain_name(flip: float) -> str:
  """DomainBed's environment names: colour-flip probability 0.1 -> '+90%', 0.9 -> '-90%'."""
  return f"{'+' if flip < 0.5 else '-'}{round(100 * max(flip, 1 - flip))}%"


def color(images: np.ndarray, digits: np.ndarray, flip: float, label_noise: float, rng,
          stride: int = 2) -> tuple[np.ndarray, np.ndarray]:
  """One ColoredMNIST environment: `y = (digit < 5) xor Bern(label_noise)`, colour
  `c = y xor Bern(flip)`; the image is copied into two channels and channel `1 - c` is
  zeroed. Returns float32 [N, H/stride, W/stride, 2] in [0, 1] and int32 labels."""
  y = (digits < 5).astype(np.int32) ^ (rng.random(len(digits)) < label_noise)
  c = y ^ (rng.random(len(digits)) < flip)
  x = images[:, ::stride, ::stride].astype(np.float32) / 255.0
  x = np.stack([x * (c == 0)[:, None, None], x * (c == 1)[:, None, None]], axis=-1)
  return x, y.astype(np.int32)


def load_colored(data_config) -> DomainDataset:
  """DomainBed's ColoredMNIST (from Arjovsky et al.'s IRM) on the IDX files in `data.path`.

  All train + t10k images are shuffled (`data.seed`) and dealt into one share per
  colour-flip probability in `data.color_flips` (DomainBed: 0.1, 0.2, 0.9, named '+90%',
  '+80%', '-90%'); each share becomes a binary task by `color`, with label noise
  `data.label_noise` (0.25). Labels follow DomainBed's code: digits 0-4 are class 1 (the
  IRM paper's text says class 0; only the class names swap). `data.downsample` is the
  pixel stride: 2 gives IRM's and early DomainBed's 14x14 images, 1 keeps 28x28 as
  DomainBed does now. Deviation: NumPy's seeded generator replaces torch's global RNG.
  """
  root = _source_dir(data_config)
  images, digits = load_mnist_dir(root, data_config.get("prefix", ""), _num_classes(data_config))
  flips = tuple(data_config.get("color_flips", (0.1, 0.2, 0.9)))
  seed = data_config.get("seed", 0)
  shares = deal_domains(len(images), len(flips), seed, data_config.get("max_per_domain", 0))
  rng = np.random.default_rng([seed, 1])
  noise, stride = data_config.get("label_noise", 0.25), data_config.get("downsample", 2)
  envs = [color(images[s], digits[s], e, noise, rng, stride) for s, e in zip(shares, flips)]
  name = data_config.get("name", "colored_mnist")
  return DomainDataset(name, tuple(colored_domain_name(e) for e in flips), tuple(x for x, _ in envs),
                       tuple(y for _, y in envs), 2)
