"""IDX files and the RotatedMNIST / ColoredMNIST recipes, on fixtures written byte by byte."""
import gzip
import os
import struct

import ml_collections
import numpy as np
import pytest
from scipy import ndimage

from fedjax_dg import config as config_lib
from fedjax_dg import experiment
from fedjax_dg.data import datasets, idx

STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D}


def idx_bytes(a: np.ndarray) -> bytes:
  """The IDX encoding written out independently of the reader."""
  a = np.asarray(a)
  header = bytes([0, 0, CODES[a.dtype], a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape)
  return header + a.astype(a.dtype.newbyteorder(">")).tobytes()


def write(path, data: bytes, gz: bool):
  with (gzip.open if gz else open)(path, "wb") as f:
    f.write(data)
  return str(path)


def write_mnist_dir(root, images, labels, n_train, gz=(True, False, True, False), prefix=""):
  """Splits (images, labels) into train / t10k files the way MNIST ships them."""
  os.makedirs(root, exist_ok=True)
  parts = (images[:n_train], labels[:n_train], images[n_train:], labels[n_train:])
  for stem, part, z in zip(STEMS, parts, gz):
    write(os.path.join(root, prefix + stem + (".gz" if z else "")), idx_bytes(part), z)
  return str(root)


def fake_mnist(n, size=28, seed=0):
  rng = np.random.default_rng(seed)
  images = rng.integers(0, 256, (n, size, size), dtype=np.uint8)
  images[:, :size // 4] = 0  # a blank band, so rotations move visible structure
  return images, rng.integers(0, 10, n).astype(np.uint8)


def data_config(**kw):
  return ml_collections.ConfigDict({"seed": 3, "max_per_domain": 0, "fallback_path": "", **kw})


# ----------------------------------------------------------------------------- IDX files

@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float32])
@pytest.mark.parametrize("form", ["plain", "gz", "gz_without_suffix"])
def test_idx_round_trip(tmp_path, dtype, form):
  a = (np.random.default_rng(1).normal(size=(4, 3, 5)) * 50).astype(dtype)
  name = "a.idx.gz" if form == "gz" else "a.idx"
  path = write(tmp_path / name, idx_bytes(a), gz=form != "plain")
  b = idx.read_idx(path)
  assert b.shape == a.shape and b.dtype == np.dtype(dtype) and b.dtype.isnative
  np.testing.assert_array_equal(a, b)


def test_load_mnist_dir_concatenates_train_then_test(tmp_path):
  images, labels = fake_mnist(13)
  root = write_mnist_dir(tmp_path / "m", images, labels, n_train=9, prefix="emnist-digits-")
  x, y = idx.load_mnist_dir(root, prefix="emnist-digits-")
  assert x.shape == (13, 28, 28) and x.dtype == np.uint8 and y.dtype == np.int32
  np.testing.assert_array_equal(x, images)
  np.testing.assert_array_equal(y, labels)


def _one_line(excinfo, *needles):
  msg = str(excinfo.value)
  assert "\n" not in msg, msg
  for n in needles:
    assert n in msg, msg


def test_truncated_file(tmp_path):
  raw = idx_bytes(np.zeros((3, 4, 4), np.uint8))
  path = write(tmp_path / "t.gz", raw[:-5], gz=True)
  with pytest.raises(ValueError) as e:
    idx.read_idx(path)
  _one_line(e, path, "truncated")


def test_bad_magic(tmp_path):
  path = write(tmp_path / "b", b"\x89PNG" + bytes(20), gz=False)
  with pytest.raises(ValueError) as e:
    idx.read_idx(path)
  _one_line(e, path, "magic")


def test_missing_file_is_named(tmp_path):
  images, labels = fake_mnist(6)
  root = write_mnist_dir(tmp_path / "m", images, labels, n_train=4)
  os.remove(os.path.join(root, "t10k-labels-idx1-ubyte"))
  with pytest.raises(ValueError) as e:
    idx.load_mnist_dir(root)
  _one_line(e, os.path.join(root, "t10k-labels-idx1-ubyte"))


def test_image_label_count_mismatch(tmp_path):
  images, labels = fake_mnist(6)
  root = write_mnist_dir(tmp_path / "m", images, labels, n_train=4)
  write(os.path.join(root, "train-labels-idx1-ubyte"), idx_bytes(labels[:3]), gz=False)
  with pytest.raises(ValueError) as e:
    idx.load_mnist_dir(root)
  _one_line(e, "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "4 images", "3 labels")


def test_both_paths_missing_names_both_and_the_package(tmp_path, monkeypatch):
  debian = str(tmp_path / "usr-share-datasets-fashion-mnist")
  monkeypatch.setattr(idx, "DEBIAN_PACKAGES", {debian: "dataset-fashion-mnist"})
  cfg = data_config(path=str(tmp_path / "mine"), fallback_path=debian)
  with pytest.raises(ValueError) as e:
    idx.load_rotated(cfg)
  _one_line(e, str(tmp_path / "mine"), debian, "apt-get install dataset-fashion-mnist")
  # The fallback is used when the first path has no files.
  images, labels = fake_mnist(12)
  write_mnist_dir(debian, images, labels, n_train=10, gz=(True,) * 4)
  assert sum(len(y) for y in idx.load_rotated(cfg).ys) == 12


# ----------------------------------------------------------------------------- RotatedMNIST

def test_rotated_recipe(tmp_path):
  images, labels = fake_mnist(70)
  angles = (0, 30, 45)
  cfg = data_config(path=write_mnist_dir(tmp_path / "m", images, labels, n_train=58), angles=angles)
  ds = idx.load_rotated(cfg)
  assert ds.names == ("0deg", "30deg", "45deg") and ds.num_classes == 10
  assert [len(y) for y in ds.ys] == [24, 23, 23]  # 70 images dealt round-robin
  assert all(x.shape[1:] == (28, 28, 1) and x.dtype == np.float32 for x in ds.xs)
  # The documented deal: perm = default_rng(seed).permutation(N), domain i gets perm[i::D].
  perm = np.random.default_rng(cfg.seed).permutation(70)
  for i, angle in enumerate(angles):
    src = perm[i::3]
    np.testing.assert_array_equal(ds.ys[i], labels[src])
    for j in (0, 7):
      want = ndimage.rotate(images[src[j]] / 255.0, angle, reshape=False, order=1, mode="constant", cval=0.0)
      np.testing.assert_allclose(ds.xs[i][j, ..., 0], want, atol=1e-5)
  np.testing.assert_array_equal(ds.xs[0][..., 0], images[perm[0::3]] / np.float32(255))
  np.testing.assert_array_equal(np.sort(np.concatenate(ds.ys)), np.sort(labels))


def test_rotation_direction_matches_pil():
  pil = pytest.importorskip("PIL.Image")
  img = fake_mnist(1)[0][0]
  ours = idx.rotate(img[None], 30)[0, ..., 0]
  ref = np.asarray(pil.fromarray(img).rotate(30, resample=pil.BILINEAR, fillcolor=0)) / 255.0
  mirrored = idx.rotate(img[None], -30)[0, ..., 0]
  inner = (slice(4, -4), slice(4, -4))
  assert np.abs(ours - ref)[inner].mean() < 0.01 < np.abs(mirrored - ref)[inner].mean()


def test_rotated_max_per_domain(tmp_path):
  images, labels = fake_mnist(70)
  cfg = data_config(path=write_mnist_dir(tmp_path / "m", images, labels, n_train=58), max_per_domain=5)
  ds = idx.load_rotated(cfg)
  assert ds.num_domains == 6 and [len(y) for y in ds.ys] == [5] * 6


# ----------------------------------------------------------------------------- ColoredMNIST

def _tolerance(p, n, z=5.0):
  """z binomial standard errors of a proportion p from n draws."""
  return z * np.sqrt(p * (1 - p) / n)


def test_colored_recipe(tmp_path):
  n = 30000
  digits = np.random.default_rng(5).integers(0, 10, n).astype(np.uint8)
  # Each image is constant 10 * digit + 5, so the digit can be read back after coloring.
  images = np.broadcast_to((10 * digits + 5)[:, None, None], (n, 4, 4)).astype(np.uint8)
  cfg = data_config(path=write_mnist_dir(tmp_path / "m", images, digits, n_train=25000),
                    color_flips=(0.1, 0.2, 0.9), label_noise=0.25, downsample=2)
  ds = idx.load_colored(cfg)
  assert ds.names == ("+90%", "+80%", "-90%") and ds.num_classes == 2
  noisy = []
  for x, y, e in zip(ds.xs, ds.ys, (0.1, 0.2, 0.9)):
    assert x.shape == (len(y), 2, 2, 2) and x.dtype == np.float32
    on = x.reshape(len(x), -1, 2).sum(1) > 0
    assert np.all(on.sum(1) == 1)  # exactly one channel lit
    colour = on[:, 1].astype(int)
    digit = np.round((x.max(axis=(1, 2, 3)) * 255 - 5) / 10).astype(int)
    agree = np.mean(colour == y)
    assert abs(agree - (1 - e)) < _tolerance(1 - e, len(y)), (e, agree)
    noisy.append(y != (digit < 5))
  noisy = np.concatenate(noisy)
  assert abs(noisy.mean() - 0.25) < _tolerance(0.25, len(noisy)), noisy.mean()


def test_colored_full_resolution(tmp_path):
  images, labels = fake_mnist(30)
  cfg = data_config(path=write_mnist_dir(tmp_path / "m", images, labels, n_train=20), downsample=1)
  ds = idx.load_colored(cfg)
  assert [x.shape[1:] for x in ds.xs] == [(28, 28, 2)] * 3 and sum(map(len, ds.ys)) == 30


# ----------------------------------------------------------------------------- end to end

def test_rotated_mnist_trains_end_to_end(tiny_config, tmp_path, monkeypatch):
  monkeypatch.setattr(config_lib, "DATASETS", tuple(datasets.DATASETS), raising=False)
  images, labels = fake_mnist(120)
  c = tiny_config
  c.data.name = "rotated_mnist"
  c.data.path = write_mnist_dir(tmp_path / "m", images, labels, n_train=100)
  c.data.max_per_domain = 0
  c.num_clients, c.model.hidden, c.num_rounds, c.eval_every = 4, (8,), 1, 1
  c.client.batch_size = 8
  out = experiment.train_and_evaluate(c, str(tmp_path / "w"))
  assert out["domains"]["names"] == ["0deg", "15deg", "30deg", "45deg", "60deg", "75deg"]
  assert 0.0 <= out["final"]["splits"]["test"]["accuracy"] <= 1.0


@pytest.mark.skipif(not os.path.isdir("/usr/share/datasets/fashion-mnist"),
                    reason="Debian's dataset-fashion-mnist is not installed (make fashion-mnist)")
def test_rotated_fashion_mnist_config_trains_on_the_debian_files(tmp_path):
  """The real files, through the shipped config (its Debian fallback path), for four rounds."""
  import sys
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"))
  import rotated_fashion_mnist
  from fedjax_dg import experiment
  c = rotated_fashion_mnist.get_config()
  c.data.path = str(tmp_path / "absent")  # forces the fallback
  c.data.max_per_domain = 300
  c.model.name, c.model.hidden = "mlp", (64,)
  c.num_rounds, c.eval_every, c.checkpoint_every, c.quiet = 4, 1, 0, True
  out = experiment.train_and_evaluate(c, str(tmp_path / "run"))
  assert out["domains"]["names"] == ["0deg", "15deg", "30deg", "45deg", "60deg", "75deg"]
  assert sum(out["client_sizes"]) == 300 * len(out["domains"]["train"]) - round(0.1 * 300) * len(out["domains"]["train"])
  val = out["final"]["splits"]["in_val"]
  assert val["accuracy"] > 0.1 + 5 * np.sqrt(0.1 * 0.9 / val["n"])  # above chance (ten classes) by 5 sd


# ----------------------------------------------------------------------------- label range

def test_label_outside_num_classes_names_the_label_file(tmp_path):
  """A label 255 used to make a 256-class model; now the label file and the value are named."""
  images, labels = fake_mnist(12)
  labels[10] = 255  # the second t10k label
  root = write_mnist_dir(tmp_path / "m", images, labels, n_train=9)
  with pytest.raises(ValueError) as e:
    idx.load_rotated(data_config(path=root, angles=(0, 15)))
  assert str(e.value) == (f"{root}/t10k-labels-idx1-ubyte: label 255 at index 1 lies outside [0, 10) "
                          "(1 of 3 labels do); data.num_classes sets the number of classes")
  with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte: label 255 at index 1 lies outside \[0, 10\)"):
    idx.load_colored(data_config(path=root))


def test_num_classes_sets_the_label_range_and_the_class_count(tmp_path):
  images, labels = fake_mnist(12)
  labels[3] = 26  # EMNIST letters: labels 1..26
  root = write_mnist_dir(tmp_path / "m", images, labels, n_train=9)
  ds = idx.load_rotated(data_config(path=root, angles=(0, 15), num_classes=27))
  assert ds.num_classes == 27 and max(int(y.max()) for y in ds.ys) == 26
  small = write_mnist_dir(tmp_path / "s", *fake_mnist(12, seed=1), n_train=9)
  assert idx.load_rotated(data_config(path=small, angles=(0,))).num_classes == 10  # not the largest label + 1
  with pytest.raises(ValueError) as e:
    idx.load_rotated(data_config(path=root, num_classes=1))
  assert str(e.value) == ("data.num_classes must be >= 2 (the labels in the IDX files lie in [0, num_classes)), "
                          "got 1")
