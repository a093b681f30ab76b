"""Any TFDS image classification dataset as domains, read without TensorFlow.

`tfds.data_source` gives random access to a dataset prepared in the `array_record` format
and decodes examples with NumPy and PIL, so TensorFlow is never imported. Domains come from
one of two places:

- `data.tfds_domain_key` names a feature (an int, bool or string, e.g. smallnorb's
  `label_lighting`, or `attributes/Male` for a nested one): every distinct value in
  `data.tfds_split` is a domain, in sorted order;
- otherwise each split in `data.tfds_domain_splits` is a domain (TFDS split syntax, e.g.
  `("train[:50%]", "train[50%:]", "test")`).

Config fields (`config.data`): `tfds_name` (e.g. "mnist", "smallnorb", "domainnet/real"),
`tfds_data_dir` ("" = TFDS's default), `tfds_image_key` ("image"), `tfds_label_key`
("label"), `tfds_domain_key` (""), `tfds_split` ("train"), `tfds_domain_splits`
(("train", "test")), `tfds_download` (False: a missing dataset is an error rather than a
download; building most datasets needs TensorFlow, so prepare them with
`tfds build NAME --file_format=array_record` where it is installed), `image_size`
(0 keeps the stored size), `max_per_domain` (0 = all), `seed`.
"""
from __future__ import annotations

import numpy as np

from fedjax_dg.data.datasets import DomainDataset


def _feature(example: dict, key: str):
  for part in key.split("/"):
    example = example[part]
  return example


def _domain_value(value):
  """A feature value as a sortable Python scalar: bytes decode to str."""
  value = value.item() if isinstance(value, np.generic) else value
  return value.decode() if isinstance(value, bytes) else value


def to_image(image, size: int) -> np.ndarray:
  """uint8 [H, W, C] or [H, W] -> float32 [size, size, C] in [0, 1] (other dtypes are taken
  as already in [0, 1]); bilinear resize with PIL unless `size` is 0 or the image's size."""
  image = np.asarray(image)
  if image.ndim == 2:
    image = image[..., None]
  if size and image.shape[:2] != (size, size):
    from PIL import Image  # pylint: disable=g-import-not-at-top
    channels = [np.asarray(Image.fromarray(image[..., c]).resize((size, size), Image.BILINEAR))
                for c in range(image.shape[-1])]
    image = np.stack(channels, axis=-1)
  scale = 255.0 if image.dtype == np.uint8 else 1.0
  return image.astype(np.float32) / scale


def _open(name: str, split: str, data_config):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  data_dir = data_config.get("tfds_data_dir", "") or None
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir, download=data_config.get("tfds_download", False))
  except Exception as e:  # TFDS raises several types; all mean "not readable here"
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ValueError(f"data.tfds_name: cannot open {name!r} split {split!r} in data_dir "
                     f"{data_dir or 'TFDS default'} as an array_record data source ({first}); prepare it "
                     f"with `tfds build {name} --file_format=array_record` or set data.tfds_download=True") from e


def _read(source, indices, image_key: str, label_key: str, domain_key: str, size: int):
  """Decodes the examples `indices` of a data source -> (images, labels, domain values)."""
  xs, ys, ds = [], [], []
  for i in indices:
    ex = source[int(i)]
    xs.append(to_image(_feature(ex, image_key), size))
    ys.append(int(_feature(ex, label_key)))
    if domain_key:
      ds.append(_domain_value(_feature(ex, domain_key)))
  shapes = sorted({x.shape for x in xs})
  if len(shapes) != 1:
    raise ValueError(f"data.image_size: images have shapes {shapes or 'none (no examples)'}; "
                     "set data.image_size > 0 to resize them to one size")
  return np.stack(xs), np.asarray(ys, np.int32), ds


def _num_classes(source, label_key: str, labels) -> int:
  feature = source.dataset_info.features
  try:
    feature = _feature(feature, label_key)
    return int(feature.num_classes)
  except (AttributeError, KeyError, TypeError):
    return int(max(int(y.max()) for y in labels)) + 1


def _subsample(n: int, max_per_domain: int, rng) -> np.ndarray:
  if 0 < max_per_domain < n:
    return np.sort(rng.choice(n, max_per_domain, replace=False))
  return np.arange(n)


def _by_feature(name, data_config, keys, size, cap, rng):
  """Domains = the distinct values of `data.tfds_domain_key` in `data.tfds_split`."""
  source = _open(name, data_config.get("tfds_split", "train"), data_config)
  x, y, values = _read(source, np.arange(len(source)), *keys, size)
  domains = sorted(set(values))
  index = {v: i for i, v in enumerate(domains)}
  dom = np.asarray([index[v] for v in values])
  picks = [np.flatnonzero(dom == i) for i in range(len(domains))]
  picks = [p[_subsample(len(p), cap, rng)] for p in picks]
  return source, tuple(str(v) for v in domains), tuple(x[p] for p in picks), tuple(y[p] for p in picks)


def _by_split(name, data_config, keys, size, cap, rng):
  """Domains = the splits in `data.tfds_domain_splits`."""
  splits = tuple(data_config.get("tfds_domain_splits", ("train", "test")))
  sources = [_open(name, s, data_config) for s in splits]
  read = [_read(src, _subsample(len(src), cap, rng), *keys, size) for src in sources]
  return sources[0], splits, tuple(r[0] for r in read), tuple(r[1] for r in read)


def load(data_config) -> DomainDataset:
  """`config.data` -> DomainDataset read through `tfds.data_source` (see the module doc)."""
  name = data_config.get("tfds_name", "")
  if not name:
    raise ValueError("data.tfds_name: name the TFDS dataset to read, e.g. 'mnist' or 'smallnorb'")
  domain_key = data_config.get("tfds_domain_key", "")
  keys = (data_config.get("tfds_image_key", "image"), data_config.get("tfds_label_key", "label"), domain_key)
  size, cap = int(data_config.get("image_size", 0)), int(data_config.get("max_per_domain", 0))
  rng = np.random.default_rng(data_config.get("seed", 0))
  build = _by_feature if domain_key else _by_split
  source, names, xs, ys = build(name, data_config, keys, size, cap, rng)
  if len({x.shape[1:] for x in xs}) > 1:
    raise ValueError(f"data.image_size: {name!r} domains differ in image size; set data.image_size > 0")
  return DomainDataset(f"tfds:{name}", names, xs, ys, _num_classes(source, keys[1], ys))
