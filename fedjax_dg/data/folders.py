"""DomainBed-style image folders, `root/<domain>/<class>/<image>`, decoded once and cached.

Layout and order follow DomainBed's `MultipleEnvironmentImageFolder`: the domains are the
sorted visible subfolders of `root`, each domain is a torchvision `ImageFolder` (classes
= sorted class folders, files in `sorted(os.walk(...))` order). Where we deviate:

- Every domain must hold the same class folders. DomainBed takes the class list of each
  domain separately, so a domain missing a class silently shifts that domain's label
  ids; here the class list is the sorted union and a missing folder is an error.
- Only `.jpg`, `.jpeg` and `.png` files are read (case-insensitive).
- Images are decoded with PIL, converted to RGB and resized once to
  `data.image_size` squared (bilinear, DomainBed's `Resize((224, 224))`), then kept as
  uint8 `[N, H, W, 3]`: DomainBed resizes on every read and its training augmentation
  crops from the full-resolution image; ours (`augment.py`) crops from the resized one,
  as the Bai et al. benchmark code does.
- Like DomainBed (`ImageFile.LOAD_TRUNCATED_IMAGES = True`) a truncated file decodes
  with what it holds; a file PIL cannot read at all is an error naming it.

The decoded arrays are cached as `<cache_dir>/<domain>-<digest>.npy` with a JSON
manifest beside each (class names, file count, image size, digest). The digest covers
the file list (relative paths and byte sizes), the image size and the crop, so a
changed folder or size decodes afresh and the old entries stay valid for their own
inputs. `wilds.py` reuses `cached_images`.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import warnings

import numpy as np
from PIL import Image, ImageFile

from fedjax_dg.data.datasets import DomainDataset

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
CACHE_VERSION = 1
DTYPES = ("uint8", "float32")


class DataError(ValueError):
  """An on-disk dataset is malformed (an image that cannot be decoded, a bad table)."""


class DataWarning(UserWarning):
  """Something in an on-disk dataset was skipped (a directory link back into the tree)."""


class CacheWarning(UserWarning):
  """The decode cache could not be read or written; the images are decoded again."""


def _one_line(text) -> str:
  return " ".join(str(text).split())


def _subdirs(path: str) -> list[str]:
  """Sorted names of the visible subfolders (the cache folder starts with a dot)."""
  return sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))


def _inside(path: str, tree: str) -> bool:
  return path == tree or path.startswith(tree.rstrip(os.sep) + os.sep)


def list_images(folder: str, root: str | None = None) -> list[str]:
  """Image files under `folder`, recursively, in torchvision `ImageFolder`'s order.

  Directory links are followed, except a link that leads back into `root` (default
  `folder`; its images are listed where they are) or to a folder already listed here: a
  link loop would otherwise list the same images once per level until the path is too
  long. Each skipped link is a one-line `DataWarning`."""
  tree = os.path.realpath(root or folder)
  seen = {os.path.realpath(folder)}
  walked = []
  for dirpath, dirnames, fnames in os.walk(folder, followlinks=True):
    keep = []
    for d in sorted(dirnames):
      full = os.path.join(dirpath, d)
      target = os.path.realpath(full)
      if os.path.islink(full) and (_inside(target, tree) or target in seen):
        why = f"it leads back into {root or folder}" if _inside(target, tree) else "that folder is already listed"
        warnings.warn(f"{full}: not following the directory link to {target}: {why}", DataWarning)
        continue
      if target in seen:  # a plain folder reached twice (through an earlier link)
        continue
      seen.add(target)
      keep.append(d)
    dirnames[:] = keep
    walked.append((dirpath, fnames))
  out = []
  for dirpath, fnames in sorted(walked):
    out += [os.path.join(dirpath, f) for f in sorted(fnames) if f.lower().endswith(IMAGE_EXTENSIONS)]
  return out


def scan(root: str):
  """`(domains, classes, files, labels)`: per domain, its image paths and label ids."""
  if not os.path.isdir(root):
    raise FileNotFoundError(f"data.root: no folder {root!r} (expected root/<domain>/<class>/<image>)")
  domains = _subdirs(root)
  if not domains:
    raise FileNotFoundError(f"data.root: {root!r} holds no domain folders (expected root/<domain>/<class>/<image>)")
  per_domain = {d: _subdirs(os.path.join(root, d)) for d in domains}
  classes = sorted(set().union(*per_domain.values()))
  if not classes:
    raise FileNotFoundError(f"data.root: {root!r} holds no class folders (expected root/<domain>/<class>/<image>)")
  for d in domains:
    for c in classes:
      if c not in per_domain[d]:
        has = next(e for e in domains if c in per_domain[e])
        raise FileNotFoundError(f"{os.path.join(root, d, c)}: missing class folder (domain {has!r} has class "
                                f"{c!r}); every domain needs the same class folders")
  files, labels = [], []
  for d in domains:
    fs, ls = [], []
    for k, c in enumerate(classes):
      imgs = list_images(os.path.join(root, d, c), root)
      if not imgs:
        raise FileNotFoundError(f"{os.path.join(root, d, c)}: no {'/'.join(IMAGE_EXTENSIONS)} image "
                                "in this class folder")
      fs += imgs
      ls += [k] * len(imgs)
    files.append(fs)
    labels.append(np.asarray(ls, np.int32))
  return tuple(domains), tuple(classes), files, labels


def decode_image(path: str, size: int, center_crop: bool = False) -> np.ndarray:
  """uint8 `[size, size, 3]`: RGB, optionally center-cropped to a square of the shorter
  side (torchvision `CenterCrop`, as WILDS does for CelebA), then bilinear-resized."""
  try:
    with Image.open(path) as img:
      img = img.convert("RGB")
      if center_crop:
        w, h = img.size
        m = min(w, h)
        top, left = int(round((h - m) / 2.0)), int(round((w - m) / 2.0))
        img = img.crop((left, top, left + m, top + m))
      img = img.resize((size, size), Image.Resampling.BILINEAR)
      return np.asarray(img, np.uint8)
  except FileNotFoundError:
    raise FileNotFoundError(f"{path}: image file not found") from None
  except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
    raise DataError(f"{path}: cannot decode image ({_one_line(e)})") from None


def decode_images(paths, size: int, center_crop: bool = False, num_workers: int = 0) -> np.ndarray:
  """uint8 `[N, size, size, 3]`, decoded by `num_workers` threads (0: one per CPU, at
  most 32; PIL releases the GIL while decoding and resizing)."""
  out = np.empty((len(paths), size, size, 3), np.uint8)

  def work(i):
    out[i] = decode_image(paths[i], size, center_crop)

  workers = num_workers or min(32, os.cpu_count() or 1)
  truncated = ImageFile.LOAD_TRUNCATED_IMAGES
  ImageFile.LOAD_TRUNCATED_IMAGES = True
  try:
    if workers <= 1 or len(paths) < 2:
      for i in range(len(paths)):
        work(i)
    else:
      with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(work, range(len(paths))):
          pass
  finally:
    ImageFile.LOAD_TRUNCATED_IMAGES = truncated
  return out


def default_cache_dir(root: str, size: int) -> str:
  return os.path.join(root, ".fedjax_dg_cache", str(size))


def files_digest(paths, root: str, size: int, center_crop: bool = False) -> str:
  """SHA-1 of the relative paths and byte sizes of `paths`, the size and the crop."""
  h = hashlib.sha1(f"v{CACHE_VERSION} size={size} center_crop={bool(center_crop)}\n".encode())
  for p in paths:
    try:
      nbytes = os.stat(p).st_size
    except FileNotFoundError:
      raise FileNotFoundError(f"{p}: image file not found") from None
    h.update(f"{os.path.relpath(p, root)}\t{nbytes}\n".encode())
  return h.hexdigest()


def _save(stem: str, x: np.ndarray, manifest: dict) -> None:
  os.makedirs(os.path.dirname(stem), exist_ok=True)
  tmp = f"{stem}.tmp{os.getpid()}"
  np.save(tmp + ".npy", x)
  os.replace(tmp + ".npy", stem + ".npy")
  with open(tmp + ".json", "w") as f:
    json.dump(manifest, f, indent=1)
  os.replace(tmp + ".json", stem + ".json")  # the manifest last: it marks the entry complete


def _read_cache(stem: str, digest: str, shape) -> np.ndarray | None:
  """The cached images of `stem`, or None when there is no entry for `digest`; an entry
  that cannot be read (a torn or corrupt `.json` or `.npy`) is a one-line warning and
  None, so that the caller decodes afresh and overwrites it."""
  if not (os.path.exists(stem + ".json") and os.path.exists(stem + ".npy")):
    return None
  try:
    with open(stem + ".json", encoding="utf-8") as f:
      manifest = json.load(f)
    if not isinstance(manifest, dict):
      raise ValueError(f"a JSON {type(manifest).__name__}, not an object")
  except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
    warnings.warn(f"{stem}.json: corrupt image cache manifest ({_one_line(e)}); decoding the images again",
                  CacheWarning)
    return None
  if manifest.get("digest") != digest:
    return None
  try:
    x = np.load(stem + ".npy", allow_pickle=False)
  except (OSError, ValueError, EOFError) as e:
    warnings.warn(f"{stem}.npy: corrupt image cache ({_one_line(e) or type(e).__name__}); decoding the images "
                  "again", CacheWarning)
    return None
  if x.shape != tuple(shape) or x.dtype != np.uint8:
    warnings.warn(f"{stem}.npy: corrupt image cache (uint8 {tuple(shape)} expected, found {x.dtype} {x.shape}); "
                  "decoding the images again", CacheWarning)
    return None
  return x


def cached_images(paths, size: int, cache_dir: str, name: str, root: str, center_crop: bool = False,
                  num_workers: int = 0, extra: dict | None = None) -> np.ndarray:
  """`decode_images(paths, ...)`, read from `cache_dir` when an entry for exactly these
  files exists and written there otherwise (a warning, not an error, if it cannot be)."""
  if not len(paths):
    return np.zeros((0, size, size, 3), np.uint8)
  digest = files_digest(paths, root, size, center_crop)
  stem = os.path.join(cache_dir, f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}-{digest[:16]}")
  shape = (len(paths), size, size, 3)
  x = _read_cache(stem, digest, shape)
  if x is not None:
    return x
  x = decode_images(paths, size, center_crop, num_workers)
  manifest = {"version": CACHE_VERSION, "name": name, "digest": digest, "count": len(paths),
              "image_size": size, "center_crop": bool(center_crop), "dtype": "uint8", **(extra or {})}
  try:
    _save(stem, x, manifest)
  except OSError as e:
    warnings.warn(f"could not write the image cache in {cache_dir} ({_one_line(e)}); set data.cache_dir "
                  "to a writable folder to decode only once", CacheWarning)
  return x


def subsample(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
  """All of `range(n)` if `k <= 0` or `k >= n`, else `k` sorted indices drawn at random."""
  if k <= 0 or k >= n:
    return np.arange(n)
  return np.sort(rng.permutation(n)[:k])


def as_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
  """uint8 as is, or float32 in [0, 1] (`x / 255`)."""
  if dtype not in DTYPES:
    raise ValueError(f"data.dtype must be one of {list(DTYPES)}, got {dtype!r}")
  return x if dtype == "uint8" else x.astype(np.float32) / 255.0


def options(data_config):
  """`(root, image_size, cache_dir, dtype, num_workers, seed)` from `config.data`."""
  root = data_config.get("root", "")
  if not root:
    raise FileNotFoundError("data.root is empty; point it at the dataset folder, e.g. --config.data.root=/data/PACS")
  root = os.path.expanduser(root)
  size = int(data_config.image_size)
  if size < 1:
    raise ValueError(f"data.image_size must be >= 1, got {size}")
  cache_dir = data_config.get("cache_dir", "") or default_cache_dir(root, size)
  dtype = data_config.get("dtype", "uint8")
  if dtype not in DTYPES:
    raise ValueError(f"data.dtype must be one of {list(DTYPES)}, got {dtype!r}")
  return root, size, cache_dir, dtype, int(data_config.get("num_workers", 0)), int(data_config.get("seed", 0))


def load(data_config) -> DomainDataset:
  """`config.data` (`root`, `image_size`, optional `cache_dir`, `max_per_domain`,
  `dtype`, `num_workers`, `seed`) -> one domain per subfolder of `root`.

  `xs[i]` is uint8 `[N_i, S, S, 3]` (`data.dtype = "float32"`: float32 in [0, 1]);
  `max_per_domain > 0` keeps that many images per domain, drawn at random with
  `data.seed` (for quick runs; only those are decoded).
  """
  root, size, cache_dir, dtype, workers, seed = options(data_config)
  max_per_domain = int(data_config.get("max_per_domain", 0))
  domains, classes, files, labels = scan(root)
  rng = np.random.default_rng(seed)
  xs, ys = [], []
  for d, fs, ls in zip(domains, files, labels):
    keep = subsample(len(fs), max_per_domain, rng)
    x = cached_images([fs[i] for i in keep], size, cache_dir, d, root, num_workers=workers,
                      extra={"domain": d, "classes": list(classes)})
    xs.append(as_dtype(x, dtype))
    ys.append(ls[keep])
  return DomainDataset("image_folder", domains, tuple(xs), tuple(ys), len(classes))
