"""Weight and array files that declare more than they hold: refused before inflating, in one line."""
import gzip
import io
import pickle
import struct
import time
import zipfile

import numpy as np
import pytest

from test_resnet import STORAGE_NAMES, _StorageRef, _TensorRef, fake_torch, write_torch_zip

from fedjax_dg.data import idx
from fedjax_dg.models import convert


def _pth_of(path, make_obj, storages):
  """A torch zip file whose pickled object is `make_obj(tensor)`, `tensor(key, size)` a 1-d view."""
  with fake_torch() as torch_mod:
    refs = {k: _StorageRef(k, a) for k, a in storages.items()}
    obj = make_obj(lambda key, n: _TensorRef(torch_mod._utils._rebuild_tensor_v2, refs[key], 0, (n,), (1,)))

    class Pickler(pickle.Pickler):
      def persistent_id(self, o):
        if isinstance(o, _StorageRef):
          return ("storage", getattr(torch_mod, STORAGE_NAMES[o.array.dtype]), o.key, "cpu", o.array.size)
        return None
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(obj)
  with zipfile.ZipFile(path, "w") as zf:
    zf.writestr("archive/data.pkl", buf.getvalue())
    for key, a in storages.items():
      zf.writestr(f"archive/data/{key}", a.tobytes())
  return str(path)


def _one_line_error(fn) -> str:
  with pytest.raises(ValueError) as e:
    fn()
  assert "\n" not in str(e.value)
  return str(e.value)


def test_pickle_whose_dicts_share_children_is_walked_once(tmp_path):
  def dag(tensor):
    node = {"w": tensor("0", 4)}
    for _ in range(60):  # 2**60 paths through 60 dicts: as a tree it never ends
      node = {"a": node, "b": node}
    return node
  path = _pth_of(tmp_path / "dag.pth", dag, {"0": np.ones(4, np.float32)})
  assert (tmp_path / "dag.pth").stat().st_size < 2000
  t0 = time.time()
  msg = _one_line_error(lambda: convert.read_state_dict(path))
  assert time.time() - t0 < 5
  assert msg == f"{path}: expected a state_dict (a dict of tensors), got dict"


def test_many_views_of_one_storage_are_capped_in_all(tmp_path, monkeypatch):
  monkeypatch.setattr(convert, "MAX_WEIGHT_BYTES", 4 * 1000 * 100)
  views = lambda tensor: {f"t{i}": tensor("0", 1000) for i in range(200)}  # 200 copies of 4 KB
  path = _pth_of(tmp_path / "views.pth", views, {"0": np.ones(1000, np.float32)})
  msg = _one_line_error(lambda: convert.read_state_dict(path))
  assert msg.startswith(f"{path}: tensor 't100': a view of size (1000,) brings the tensors to more than 400000 bytes")


def write_oversized_storage_pth(path: str) -> None:
  """A `.pth` whose pickle declares a storage of 2**30 floats (4 GiB); its record holds 16 bytes."""
  write_torch_zip(path, {"0": np.ones(4, np.float32)}, {"conv1.weight": ("0", 0, (4,), (1,))})
  with zipfile.ZipFile(path) as zf:
    members = {n: zf.read(n) for n in zf.namelist()}
  members["archive/data.pkl"] = _with_numel(members["archive/data.pkl"], 2 ** 30)
  with zipfile.ZipFile(path, "w") as zf:
    for n, b in members.items():
      zf.writestr(n, b)


def test_storage_declaring_more_than_the_cap_is_refused_before_reading(tmp_path):
  path = str(tmp_path / "big.pth")
  write_oversized_storage_pth(path)
  msg = _one_line_error(lambda: convert.read_state_dict(path))
  assert msg == (f"{path}: storage '0' (1073741824 elements) brings the tensors to more than {2 << 30} bytes in all "
                 "(the cap on one weights file's inflated size); not a ResNet's weights")


def _with_numel(pkl: bytes, numel: int) -> bytes:
  """The pickle with its storage's element count (BININT1 4 before the persistent id's
  TUPLE) replaced by `numel`."""
  old = b"K\x04t"  # BININT1 4, TUPLE: the last field of ('storage', cls, key, 'cpu', 4)
  assert pkl.count(old) == 1
  return pkl.replace(old, b"J" + struct.pack("<i", numel) + b"t")


def test_record_size_must_match_its_storage(tmp_path):
  path = str(tmp_path / "mismatch.pth")
  write_torch_zip(path, {"0": np.ones(4, np.float32)}, {"conv1.weight": ("0", 0, (4,), (1,))})
  with zipfile.ZipFile(path) as zf:
    members = {n: zf.read(n) for n in zf.namelist()}
  members["archive/data/0"] = bytes(4000)  # a deflated record ten times its storage's size
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
    for n, b in members.items():
      zf.writestr(n, b)
  assert _one_line_error(lambda: convert.read_state_dict(path)) == (
      f"{path}: record 'archive/data/0' declares 4000 bytes, its storage 16")


def test_npz_member_whose_header_declares_more_than_it_holds(tmp_path):
  header = io.BytesIO()
  np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2 ** 31,)})
  path = str(tmp_path / "w.npz")
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
    zf.writestr("conv1/kernel.npy", header.getvalue() + bytes(64))
  msg = _one_line_error(lambda: convert.load_converted(path))
  assert msg == (f"{path}: member 'conv1/kernel.npy' declares {len(header.getvalue()) + 64} bytes, its array "
                 f"header [2147483648] float32 needs {len(header.getvalue()) + 2 ** 33}")


def test_npz_over_the_cap_is_refused_before_inflating(tmp_path, monkeypatch):
  path = str(tmp_path / "w.npz")
  np.savez_compressed(path, **{"a/kernel": np.zeros(1000, np.float32), "b/kernel": np.zeros(1000, np.float32)})
  assert convert.load_converted(path)["a"]["kernel"].shape == (1000,)  # under the cap it loads
  monkeypatch.setattr(convert, "MAX_WEIGHT_BYTES", 6000)
  assert _one_line_error(lambda: convert.load_converted(path)) == (
      f"{path}: member 'b/kernel.npy' ([1000] float32) brings the tensors to more than 6000 bytes in all (the cap "
      "on one weights file's inflated size); not a ResNet's weights")


def _gz_idx(path, shape, payload: bytes):
  head = bytes([0, 0, 0x08, len(shape)]) + b"".join(struct.pack(">I", d) for d in shape)
  with gzip.open(path, "wb") as f:
    f.write(head + payload)
  return str(path)


def test_gzipped_idx_declaring_too_much_is_refused_before_inflating(tmp_path):
  path = _gz_idx(tmp_path / "train-images-idx3-ubyte.gz", (60000, 1000, 1000), bytes(1000))
  with pytest.raises(ValueError) as e:
    idx.read_idx(path)
  assert str(e.value) == (f"{path}: its IDX header declares shape (60000, 1000, 1000) (60000000016 bytes), more "
                          f"than the {idx.MAX_IDX_BYTES} allowed for one file")


def test_gzipped_idx_inflates_no_further_than_its_header(tmp_path, monkeypatch):
  path = _gz_idx(tmp_path / "x.gz", (10, 28, 28), bytes(50 * 2 ** 20))  # 7840 bytes declared, 50 MiB inflating
  sizes = []
  real = idx.parse_idx
  monkeypatch.setattr(idx, "parse_idx", lambda raw, name="": sizes.append(len(raw)) or real(raw, name))
  with pytest.raises(ValueError, match=r"IDX data size 7841 bytes does not match its header shape \(10, 28, 28\)"):
    idx.read_idx(path)
  assert sizes == [16 + 7840 + 1]
