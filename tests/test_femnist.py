"""FEMNIST in LEAF's JSON layout: writers as domains, seeded held-out writers, errors, and
two rounds of FedAvg and IRM from configs/femnist.py."""
import json
import os
import shutil
import sys

import numpy as np
import pytest

from fedjax_dg import experiment
from fedjax_dg.data import femnist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs"))
import femnist as femnist_config  # noqa: E402


def leaf_rows(rng, n, writer_id):
  """n images (k / 255 pixel values) whose label is drawn from 0..61."""
  x = rng.integers(0, 256, (n, 784)) / 255.0
  y = rng.integers(0, 62, n)
  x[:, writer_id] = 1.0  # a writer-specific pixel
  return x, y


def write_leaf(root, num_writers=8, seed=0):
  """LEAF's layout: train/ in two files, test/ in one; returns {writer: (x, y)} pooled."""
  rng = np.random.default_rng(seed)
  truth = {}
  files = {("train", 0): {}, ("train", 1): {}, ("test", 0): {}}
  for w in range(num_writers):
    name = f"f{w:04d}_{w * 7 % 10:02d}"
    xtr, ytr = leaf_rows(rng, 6 + w, w)
    xte, yte = leaf_rows(rng, 2, w)
    files[("train", w % 2)][name] = (xtr, ytr)
    files[("test", 0)][name] = (xte, yte)
    truth[name] = (np.concatenate([xtr, xte]), np.concatenate([ytr, yte]))
  for (sub, k), users in files.items():
    os.makedirs(os.path.join(root, sub), exist_ok=True)
    obj = {"users": list(users), "num_samples": [len(y) for _, y in users.values()], "hierarchies": [],
           "user_data": {u: {"x": x.tolist(), "y": y.tolist()} for u, (x, y) in users.items()}}
    with open(os.path.join(root, sub, f"all_data_{k}_niid_0_keep_0_{sub}_9.json"), "w") as f:
      json.dump(obj, f)
  return truth


def config(root, heldout="2,2"):
  c = femnist_config.get_config(heldout)
  c.data.root = str(root)
  return c


def test_writers_are_domains_and_heldout_writers_are_seeded(tmp_path):
  truth = write_leaf(tmp_path)
  ds = femnist.load(config(tmp_path).data)
  assert ds.num_classes == 62 and ds.input_shape == (28, 28, 1) and ds.xs[0].dtype == np.uint8
  assert sorted(ds.names) == sorted(truth)
  for name, x, y in zip(ds.names, ds.xs, ds.ys):
    want_x, want_y = truth[name]
    np.testing.assert_array_equal(x.reshape(len(x), -1), np.rint(want_x * 255).astype(np.uint8))
    np.testing.assert_array_equal(y, want_y)
  val, test, train = ds.names[:2], ds.names[2:4], ds.names[4:]
  assert list(val) == sorted(val) and list(test) == sorted(test) and list(train) == sorted(train)
  # another seed holds out other writers; the same seed the same ones
  c = config(tmp_path)
  c.data.seed = 1
  other = femnist.load(c.data)
  assert set(other.names[:4]) != set(ds.names[:4])
  assert femnist.load(config(tmp_path).data).names == ds.names


def test_float32_pixels_are_leafs_values(tmp_path):
  truth = write_leaf(tmp_path, num_writers=5)
  c = config(tmp_path, "1,1")
  c.data.dtype = "float32"
  ds = femnist.load(c.data)
  np.testing.assert_allclose(ds.xs[-1].reshape(len(ds.ys[-1]), -1), truth[ds.names[-1]][0], atol=1e-7)


def test_errors_name_the_file_or_field(tmp_path):
  write_leaf(tmp_path)
  c = config(tmp_path)
  c.data.val_domains = (0,)
  with pytest.raises(ValueError, match=r"data.val_domains must be tuple\(range\(0, 2\)\) for femnist"):
    femnist.load(c.data)
  path = tmp_path / "train" / "all_data_1_niid_0_keep_0_train_9.json"
  obj = json.loads(path.read_text())
  bad = dict(obj)
  del bad["user_data"]
  path.write_text(json.dumps(bad))
  with pytest.raises(ValueError, match=rf"{path}: no key 'user_data'"):
    femnist.load(config(tmp_path).data)
  u = obj["users"][0]
  obj["user_data"][u]["x"][1] = obj["user_data"][u]["x"][1][:700]
  path.write_text(json.dumps(obj))
  with pytest.raises(ValueError, match=rf"{path}: writer '{u}' image 1 has 700 pixels, not 784"):
    femnist.load(config(tmp_path).data)
  path.unlink()
  (tmp_path / "train" / "all_data_0_niid_0_keep_0_train_9.json").unlink()
  with pytest.raises(ValueError, match=r"train: no .json files \(the train split is empty\)"):
    femnist.load(config(tmp_path).data)
  write_leaf(tmp_path / "ok")
  with pytest.raises(ValueError, match=r"data.femnist_val_writers \(6\) and data.femnist_test_writers \(6\)"):
    femnist.load(config(tmp_path / "ok", "6,6").data)
  shutil.rmtree(tmp_path / "ok" / "test")
  with pytest.raises(FileNotFoundError, match=rf"{tmp_path / 'ok' / 'test'}: not found"):
    femnist.load(config(tmp_path / "ok").data)


@pytest.mark.parametrize("value,shown", [(float("nan"), "nan"), (1.5, "1.5"), (-0.25, "-0.25")])
def test_a_pixel_outside_0_1_or_nan_is_refused_naming_it(tmp_path, value, shown):
  write_leaf(tmp_path)
  path = tmp_path / "train" / "all_data_1_niid_0_keep_0_train_9.json"
  obj = json.loads(path.read_text())
  u = obj["users"][1]
  obj["user_data"][u]["x"][2][300] = value
  x_size = 784 * len(obj["user_data"][u]["x"])
  path.write_text(json.dumps(obj))  # json writes NaN as LEAF's Python writer would
  with pytest.raises(femnist.DataError) as e:
    femnist.load(config(tmp_path).data)
  assert str(e.value) == f"{path}: writer '{u}' image 2 pixel 300 is {shown}, outside [0, 1] (1 of the writer's {x_size} pixels are)"


def test_a_leaf_file_that_is_a_link_to_a_device_is_not_read(tmp_path):
  write_leaf(tmp_path)
  path = tmp_path / "train" / "all_data_1_niid_0_keep_0_train_9.json"
  path.unlink()
  os.symlink("/dev/zero", path)
  with pytest.raises(femnist.DataError, match=rf"{path}: a device, not a regular file; not reading it"):
    femnist.load(config(tmp_path).data)


@pytest.mark.parametrize("method", ["fedavg", pytest.param("irm", marks=pytest.mark.slow)])
def test_two_rounds_from_the_config(tmp_path, method):
  write_leaf(tmp_path / "leaf")
  c = config(tmp_path / "leaf")
  c.algorithm.name = method
  c.num_clients, c.num_rounds, c.eval_every, c.checkpoint_every, c.quiet = 4, 2, 1, 0, True
  c.client.batch_size = 8
  c.model.name, c.model.hidden = "mlp", (16,)  # the config's CNN compiles for minutes on 2 CPU cores
  summary = experiment.train_and_evaluate(c, str(tmp_path / "run"))
  assert summary["domains"]["val"] == [0, 1] and summary["domains"]["test"] == [2, 3]
  assert len(summary["domains"]["train"]) == 4 and summary["num_clients"] == 4
  sel = summary["selection"]["heldout_domain"]
  assert sel is not None and 0.0 <= sel["test"]["accuracy"] <= 1.0
