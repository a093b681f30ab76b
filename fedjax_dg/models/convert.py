"""torchvision ResNet checkpoints -> the Flax params of `fedjax_dg.models.resnet`, without torch.

Reading. `.safetensors` through `safetensors.numpy`. `.pth` / `.pt` / `.bin` as written by
`torch.save`, parsed here by a restricted unpickler that admits only tensors, storages and
(Ordered)dicts, in both of torch's layouts:

* zip (torch >= 1.6): `<prefix>/data.pkl` pickles the object; each tensor is
  `torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
  backward_hooks[, metadata])` (offset and strides in elements), and each storage a
  persistent id `('storage', torch.FloatStorage, key, location, numel)` whose raw bytes
  are the record `<prefix>/data/<key>`, in the order of `<prefix>/byteorder` (default little).
* legacy (`_use_new_zipfile_serialization=False`): pickles of the magic number, protocol
  version and sys info, then the object (persistent ids carry a sixth field, the view
  metadata), then the list of storage keys, then per key an int64 element count and the
  raw little-endian bytes.

Conversion. `conv1.weight` -> `conv1/kernel` (OIHW -> HWIO), `bn1.{weight, bias,
running_mean, running_var}` -> `bn1/{scale, bias, running_mean, running_var}`,
`layer1.0.conv1.weight` -> `layer1_0/conv1/kernel`, `layer1.0.downsample.{0,1}` ->
`layer1_0/downsample_{conv,bn}`; `fc.*` and `num_batches_tracked` are dropped.

Untrusted files are bounded: every size a file declares (a zip member's uncompressed size,
a storage's element count, an `.npz` member's array header) is checked against the others
and against `MAX_WEIGHT_BYTES` in all before anything is inflated or allocated, and a
pickle's shared structure (a dict referenced many times) is walked once. A ResNet-50's
weights are about 100 MB; a file declaring more than the cap is refused in one line.
"""
from __future__ import annotations

import collections
import io
import math
import os
import pickle
import re
import struct
import zipfile
from typing import NamedTuple

import ml_dtypes
import numpy as np
from flax import serialization, traverse_util

_STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
    "ComplexFloatStorage": np.complex64, "ComplexDoubleStorage": np.complex128, "UntypedStorage": np.uint8,
}
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
CONVERTED_SUFFIXES = (".npz", ".msgpack")
MAX_WEIGHT_BYTES = 2 << 30  # all tensors of one weights file, inflated (2 GiB)
MAX_PICKLE_BYTES = 64 << 20  # the pickled object graph itself (a ResNet-50's is ~50 KB)


class _Budget:
  """Bytes a file may still make this process allocate (`MAX_WEIGHT_BYTES` in all)."""

  def __init__(self, cap: int | None = None):
    self.cap = MAX_WEIGHT_BYTES if cap is None else cap
    self.left = self.cap

  def take(self, n: int, what: str) -> None:
    if n < 0:
      raise BadTensor(f"{what} declares a negative size ({n})")
    self.left -= n
    if self.left < 0:
      raise BadTensor(f"{what} brings the tensors to more than {self.cap} bytes in all (the cap on one weights "
                      "file's inflated size); not a ResNet's weights")


class BadTensor(ValueError):
  """A tensor record whose size, stride or offset does not fit its storage."""


class _Storage:
  """`numel` elements of `dtype` starting `start` elements into `root`'s data (a legacy
  view; otherwise `root` is itself). The root's `data` is filled from the file."""

  def __init__(self, dtype, numel: int, root: _Storage | None = None, start: int = 0):
    self.dtype, self.numel, self.root, self.start = np.dtype(dtype), numel, root or self, start
    self.data = None

  def array(self) -> np.ndarray:
    return self.root.data[self.start:self.start + self.numel]


class _Tensor(NamedTuple):
  """A strided view of a storage, as `_rebuild_tensor_v2` describes it (in elements)."""
  storage: _Storage
  offset: int
  size: tuple
  stride: tuple

  def numpy(self) -> np.ndarray:
    flat = self.storage.array()
    native = flat.dtype.newbyteorder("=")
    if len(self.stride) != len(self.size) or min(self.size, default=0) < 0:
      raise BadTensor(f"size {self.size} and stride {self.stride} do not describe a tensor")
    if math.prod(self.size) == 0:
      return np.zeros(self.size, native)
    # A stride that is not positive (a broadcast view) or a view with more elements than
    # its storage would make a tiny file allocate any amount of memory; torchvision
    # state_dicts hold neither. A dimension of size 1 never moves, so its stride is free.
    bad = next((k for k, (n, s) in enumerate(zip(self.size, self.stride)) if n > 1 and s <= 0), None)
    if bad is not None:
      raise BadTensor(f"stride {self.stride[bad]} in dimension {bad} (size {self.size[bad]}); strides must be "
                      "positive")
    if self.offset < 0 or self.offset > flat.size:
      raise BadTensor(f"offset {self.offset} lies outside its storage of {flat.size} elements")
    if math.prod(self.size) > flat.size - self.offset:
      raise BadTensor(f"a view of {math.prod(self.size)} elements (size {self.size}) on a storage of {flat.size} "
                      f"elements from offset {self.offset}; a view may not be larger than its storage")
    last = self.offset + sum((n - 1) * s for n, s in zip(self.size, self.stride))
    if last >= flat.size:
      raise BadTensor(f"size {self.size} stride {self.stride} at offset {self.offset} exceeds its storage of "
                      f"{flat.size} elements")
    view = np.lib.stride_tricks.as_strided(flat[self.offset:], self.size,
                                           [s * flat.itemsize for s in self.stride], writeable=False)
    return np.array(view, dtype=native, order="C")  # a copy; ascontiguousarray would make 0-d 1-d


def _rebuild_tensor(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                    metadata=None):
  """Stands in for `torch._utils._rebuild_tensor(_v2)`."""
  del requires_grad, backward_hooks
  if metadata:
    raise ValueError(f"tensors with metadata {metadata!r} (conjugate / negative views) are not supported")
  return _Tensor(storage, int(storage_offset), tuple(size), tuple(stride))


def _rebuild_parameter(data, requires_grad, backward_hooks, state=None):
  """Stands in for `torch._utils._rebuild_parameter(_with_state)`: a Parameter is its data."""
  del requires_grad, backward_hooks, state
  return data


class _TorchUnpickler(pickle.Unpickler):
  """Unpickles `torch.save` output, refusing every global but tensors, storages and dicts;
  `storage(dtype, key, numel, view)` resolves persistent ids."""
  _GLOBALS = {
      ("collections", "OrderedDict"): collections.OrderedDict,
      ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
      ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
      ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
      ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
      ("torch", "Size"): tuple,
  }

  def __init__(self, file, storage=None):
    super().__init__(file)
    self._storage = storage

  def find_class(self, module, name):
    if module == "torch" and name in _STORAGE_DTYPES:
      return np.dtype(_STORAGE_DTYPES[name])
    if (module, name) not in self._GLOBALS:
      raise pickle.UnpicklingError(f"refusing to load global {module}.{name} (only tensors and dicts are read)")
    return self._GLOBALS[(module, name)]

  def persistent_load(self, pid):
    typename = pid[0].decode("ascii") if isinstance(pid[0], bytes) else pid[0]
    if typename != "storage" or self._storage is None:
      raise pickle.UnpicklingError(f"unsupported persistent id {typename!r}")
    dtype, key, _, numel = pid[1:5]
    return self._storage(dtype, str(key), int(numel), pid[5] if len(pid) > 5 else None)


def _member(zf: zipfile.ZipFile, name: str, size: int | None = None, cap: int | None = None) -> bytes:
  """A zip member's bytes, its declared size checked first (`size`: exactly; `cap`: at most).
  zipfile stops inflating at the declared size, so the check bounds the allocation."""
  try:
    info = zf.getinfo(name)
  except KeyError:
    raise BadTensor(f"no record {name!r} in the archive") from None
  if size is not None and info.file_size != size:
    raise BadTensor(f"record {name!r} declares {info.file_size} bytes, its storage {size}")
  if cap is not None and info.file_size > cap:
    raise BadTensor(f"record {name!r} declares {info.file_size} bytes, more than the {cap} allowed")
  return zf.read(name)


def _read_torch_zip(path: str, budget: _Budget):
  """The object in a zip-format `torch.save` file, tensors as `_Tensor`s."""
  with zipfile.ZipFile(path) as zf:
    names = zf.namelist()
    pkl = next((n for n in names if n == "data.pkl" or n.endswith("/data.pkl")), None)
    if pkl is None:
      raise ValueError("zip archive without data.pkl (not a torch.save file)")
    prefix = pkl[:-len("data.pkl")]
    order = _member(zf, prefix + "byteorder", cap=16).decode().strip() if prefix + "byteorder" in names else "little"
    storages = {}

    def storage(dtype, key, numel, view):
      del view  # always None in the zip format
      if key not in storages:
        nbytes = numel * np.dtype(dtype).itemsize
        budget.take(nbytes, f"storage {key!r} ({numel} elements)")
        storages[key] = _Storage(dtype, numel)
        byte_dtype = dtype.newbyteorder("<" if order == "little" else ">")
        storages[key].data = np.frombuffer(_member(zf, f"{prefix}data/{key}", size=nbytes), byte_dtype, count=numel)
      return storages[key]

    return _TorchUnpickler(io.BytesIO(_member(zf, pkl, cap=MAX_PICKLE_BYTES)), storage).load()


def _read_torch_legacy(path: str, budget: _Budget):
  """The object in a legacy (non-zip) `torch.save` file, tensors as `_Tensor`s."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    magic, _, _ = (_TorchUnpickler(f).load() for _ in range(3))  # magic, protocol, sys_info
    if magic != _LEGACY_MAGIC:
      raise ValueError("bad magic number (not a torch.save file)")
    roots = {}

    def storage(dtype, key, numel, view):
      root = roots.setdefault(key, _Storage(dtype, numel))
      return root if view is None else _Storage(dtype, int(view[2]), root, int(view[1]))

    obj = _TorchUnpickler(f, storage).load()
    for key in _TorchUnpickler(f).load():
      root = roots[str(key)]
      (count,) = struct.unpack("<q", f.read(8))
      nbytes = count * root.dtype.itemsize
      if count < 0 or nbytes > size - f.tell():
        raise BadTensor(f"storage {key!r} declares {count} elements, more than the file holds")
      budget.take(nbytes, f"storage {key!r}")
      raw = f.read(nbytes)
      root.data = np.frombuffer(raw, root.dtype.newbyteorder("<"), count=count)
  return obj


def _materialize(obj, budget: _Budget, key: str = "", memo: dict | None = None):
  """`obj` with every `_Tensor` replaced by a numpy array (dicts become plain dicts); a
  bad tensor is a `BadTensor` whose message starts with its key (`a.b` for nested dicts).
  An object the pickle shares (a memo reference) is converted once (`memo`, by id), so a
  small pickle whose dicts share children is not walked as the tree it unfolds into; each
  copy a tensor makes counts against `budget`."""
  memo = {} if memo is None else memo
  if id(obj) in memo:
    return memo[id(obj)][1]
  if isinstance(obj, _Tensor):
    try:
      budget.take(math.prod(obj.size) * obj.storage.dtype.itemsize if min(obj.size, default=1) >= 0 else 0,
                  f"a view of size {obj.size}")
      out = obj.numpy()
    except BadTensor as e:
      raise BadTensor(f"tensor {key or '<top level>'!r}: {e}") from None
  elif isinstance(obj, dict):
    out = {k: _materialize(v, budget, f"{key}.{k}" if key else str(k), memo) for k, v in obj.items()}
  elif isinstance(obj, (list, tuple)):
    out = type(obj)(_materialize(v, budget, f"{key}[{i}]", memo) for i, v in enumerate(obj))
  else:
    return obj
  memo[id(obj)] = (obj, out)  # holding `obj` keeps its id from being reused meanwhile
  return out


def _check_file(path: str):
  if not os.path.isfile(path):
    raise FileNotFoundError(f"pretrained weights not found: {path}")


def _unreadable(path: str, e: Exception) -> ValueError:
  return ValueError(f"{path}: cannot read weights ({type(e).__name__}: {' '.join(str(e).split())})")


def read_state_dict(path: str) -> dict[str, np.ndarray]:
  """The `{name: array}` state_dict in a `.safetensors` or `torch.save` (`.pth`) file.

  A checkpoint `{"state_dict": ...}` is unwrapped."""
  _check_file(path)
  try:
    if path.endswith(".safetensors"):
      from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
      return dict(load_file(path))
    budget = _Budget()
    obj = _materialize(_read_torch_zip(path, budget) if zipfile.is_zipfile(path) else _read_torch_legacy(path, budget),
                       _Budget())
  except BadTensor as e:
    raise ValueError(f"{path}: {e}") from None
  except Exception as e:  # pylint: disable=broad-except  # any parse failure is a bad file
    raise _unreadable(path, e) from e
  if isinstance(obj, dict) and "state_dict" in obj:
    obj = obj["state_dict"]
  if not isinstance(obj, dict) or not all(isinstance(v, np.ndarray) for v in obj.values()):
    raise ValueError(f"{path}: expected a state_dict (a dict of tensors), got {type(obj).__name__}")
  return obj


_BLOCK = re.compile(r"(layer\d+)\.(\d+)\.(.+)")
_MODULE = re.compile(r"conv[1-3]|bn[1-3]|downsample\.[01]")
_BN_LEAVES = {"weight": "scale", "bias": "bias", "running_mean": "running_mean", "running_var": "running_var"}


def flax_path(key: str) -> tuple[str, ...] | None:
  """The Flax path of a torchvision ResNet key; None for keys we drop (`fc.*`,
  `num_batches_tracked`). A leading `module.` (DataParallel) is ignored."""
  key = key.removeprefix("module.")
  if key.startswith("fc.") or key.endswith(".num_batches_tracked"):
    return None
  block = _BLOCK.fullmatch(key)
  prefix, rest = ((f"{block[1]}_{block[2]}",), block[3]) if block else ((), key)
  module, _, leaf = rest.rpartition(".")
  if _MODULE.fullmatch(module) and (block or module in ("conv1", "bn1")):
    module = {"downsample.0": "downsample_conv", "downsample.1": "downsample_bn"}.get(module, module)
    if module.startswith(("conv", "downsample_conv")) and leaf == "weight":
      return prefix + (module, "kernel")
    if module.startswith(("bn", "downsample_bn")) and leaf in _BN_LEAVES:
      return prefix + (module, _BN_LEAVES[leaf])
  raise ValueError(f"not a torchvision ResNet key: {key!r}")


def torchvision_to_flax(state_dict: dict[str, np.ndarray]) -> dict:
  """The nested featurizer params of a torchvision ResNet state_dict."""
  flat = {}
  for key, value in state_dict.items():
    path = flax_path(key)
    if path is not None:
      flat[path] = np.transpose(value, (2, 3, 1, 0)) if path[-1] == "kernel" else np.asarray(value)
  return traverse_util.unflatten_dict(flat)


def save_converted(tree: dict, path: str):
  """Writes converted params to `.npz` (keys `conv1/kernel`, ...) or `.msgpack` (flax.serialization)."""
  if path.endswith(".npz"):
    np.savez(path, **traverse_util.flatten_dict(tree, sep="/"))
  elif path.endswith(".msgpack"):
    with open(path, "wb") as f:
      f.write(serialization.msgpack_serialize(tree))
  else:
    raise ValueError(f"{path}: converted weights are written as one of {CONVERTED_SUFFIXES}")


def load_converted(path: str) -> dict:
  """The nested params written by `save_converted`."""
  _check_file(path)
  try:
    if path.endswith(".npz"):
      _check_npz(path)
      with np.load(path, allow_pickle=False) as f:
        return traverse_util.unflatten_dict({k: f[k] for k in f.files}, sep="/")
    with open(path, "rb") as f:
      return serialization.msgpack_restore(f.read())
  except BadTensor as e:
    raise ValueError(f"{path}: {e}") from None
  except Exception as e:  # pylint: disable=broad-except
    raise _unreadable(path, e) from e


def _check_npz(path: str, cap: int | None = None) -> None:
  """Each `.npy` member's array header against its zip entry's declared size, and their
  total against `cap`, before any member is inflated."""
  budget = _Budget(cap)
  with zipfile.ZipFile(path) as zf:
    for info in zf.infolist():
      with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        shape, _, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)(f)
        header = f.tell() if f.seekable() else None
      if dtype.hasobject:
        raise BadTensor(f"member {info.filename!r} holds Python objects, not numbers")
      nbytes = math.prod(shape) * dtype.itemsize
      if header is not None and info.file_size != header + nbytes:
        raise BadTensor(f"member {info.filename!r} declares {info.file_size} bytes, its array header "
                        f"{list(shape)} {dtype} needs {header + nbytes}")
      budget.take(nbytes, f"member {info.filename!r} ({list(shape)} {dtype})")


def load_featurizer_weights(path: str) -> dict:
  """Featurizer params from a converted file (`.npz`, `.msgpack`) or a torchvision
  checkpoint (`.safetensors`, `.pth`, `.pt`, `.bin`)."""
  if path.endswith(CONVERTED_SUFFIXES):
    return load_converted(path)
  return torchvision_to_flax(read_state_dict(path))
