"""WILDS layouts (IWildCam v2.0, Camelyon17 v1.0, CelebA v1.0) written in their release
format: official splits, domains, labels, the cache, errors, and one training run."""
import csv
import os

import ml_collections
import numpy as np
import pytest
from PIL import Image

from fedjax_dg import experiment
from fedjax_dg.data import wilds
from fedjax_dg.eval import metrics

PALETTE = [(220, 20, 20), (20, 220, 20), (20, 20, 220), (220, 220, 20)]  # colour = label


def write_csv(path, header, rows):
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(rows)


def image(path, label, size=(12, 10)):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  Image.new("RGB", size, PALETTE[label]).save(path)


# IWildCam: (split, location_remapped, y); locations 0, 3 train, 7 OOD val, 8 test.
IWILDCAM = [("train", 0, 0), ("train", 0, 1), ("train", 3, 2), ("train", 3, 0), ("train", 3, 1), ("train", 0, 3),
            ("id_val", 0, 1), ("id_val", 3, 2), ("id_test", 3, 0), ("id_test", 0, 3),
            ("val", 7, 1), ("val", 7, 0), ("test", 8, 2), ("test", 8, 3)]


def write_iwildcam(root):
  rows = []
  for k, (split, loc, y) in enumerate(IWILDCAM):
    fname = f"{k:04x}abcd.jpg"
    image(os.path.join(root, "train", fname), y, (14 + k, 9))
    rows.append([k, split, loc, 100 + loc, k // 2, f"seq{k // 2}", y, 10 * y, "2013-06-05 10:11:12.000",
                 f"id{k}", fname])
  header = ["", "split", "location_remapped", "location", "sequence_remapped", "seq_id", "y", "category_id",
            "datetime", "image_id", "filename"]
  write_csv(os.path.join(root, "metadata.csv"), header, rows)
  return root


# Camelyon17: (center, split column, tumor); centres 0, 3, 4 train, 1 OOD val, 2 test.
CAMELYON = [(c, s, (c + i) % 2) for c in range(5) for i, s in enumerate((0, 0, 0, 1))]


def write_camelyon17(root):
  rows = []
  for k, (center, split, tumor) in enumerate(CAMELYON):
    patient, node, x, y = 4 + 10 * center, k % 5, 3328 + 32 * k, 21792
    path = f"patches/patient_{patient:03}_node_{node}/patch_patient_{patient:03}_node_{node}_x_{x}_y_{y}.png"
    image(os.path.join(root, path), tumor, (12, 12))
    rows.append([k, f"{patient:03}", node, x, y, tumor, 2 * center, center, split])
  write_csv(os.path.join(root, "metadata.csv"),
            ["", "patient", "node", "x_coord", "y_coord", "tumor", "slide", "center", "split"], rows)
  return root


# CelebA: (partition, Blond_Hair, Male) in {-1, 1}.
CELEBA = [(0, 1, -1), (0, -1, -1), (0, 1, 1), (0, -1, 1), (0, -1, 1), (1, 1, -1), (1, -1, 1), (2, 1, 1), (2, -1, -1)]


def write_celeba(root):
  attrs, parts = [], []
  for k, (part, blond, male) in enumerate(CELEBA):
    name = f"{k + 1:06d}.jpg"
    img = np.zeros((14, 10, 3), np.uint8)  # 10 wide, 14 tall: the centre square is rows 2..11
    img[:] = PALETTE[int(blond == 1)]
    img[:2], img[12:] = PALETTE[3], PALETTE[3]
    os.makedirs(os.path.join(root, "img_align_celeba"), exist_ok=True)
    Image.fromarray(img).save(os.path.join(root, "img_align_celeba", name), quality=100)
    attrs.append([name, 1, blond, -1, male, 1])
    parts.append([name, part])
  write_csv(os.path.join(root, "list_attr_celeba.csv"),
            ["image_id", "5_o_Clock_Shadow", "Blond_Hair", "Eyeglasses", "Male", "Young"], attrs)
  write_csv(os.path.join(root, "list_eval_partition.csv"), ["image_id", "partition"], parts[::-1])  # any order
  return root


def data_config(root, dataset, **kw):
  c = ml_collections.ConfigDict({"name": "wilds", "dataset": dataset, "root": str(root), "image_size": 8,
                                 "seed": 0, "num_workers": 2})
  c.update(kw)
  return c


def labels_from_colour(x):
  return np.array([int(np.argmin([np.abs(xi.reshape(-1, 3).mean(0) - p).sum() for p in PALETTE])) for xi in x])


def test_iwildcam_official_splits_domains_labels(tmp_path):
  root = write_iwildcam(str(tmp_path / "iwildcam_v2.0"))
  fold = wilds.load_fold(data_config(root, "iwildcam"))
  assert fold.domain_names == ("location_0", "location_3", "location_7", "location_8")
  assert fold.num_classes == 4
  assert (fold.train_domains, fold.val_domains, fold.test_domains) == ((0, 1), (2,), (3,))
  want = {"train": "train", "in_val": "id_val", "in_test": "id_test", "heldout_val": "val", "test": "test"}
  ids = {0: 0, 3: 1, 7: 2, 8: 3}
  for field, split in want.items():
    s = getattr(fold, field)
    rows = [r for r in IWILDCAM if r[0] == split]
    assert s.x.shape == (len(rows), 8, 8, 3) and s.x.dtype == np.uint8
    np.testing.assert_array_equal(s.y, [r[2] for r in rows])
    np.testing.assert_array_equal(s.domain, [ids[r[1]] for r in rows])
    np.testing.assert_array_equal(labels_from_colour(s.x), s.y)
  ds = wilds.load(data_config(root, "iwildcam"))
  assert ds.names == ("location_0", "location_3") and [len(y) for y in ds.ys] == [3, 3]
  np.testing.assert_array_equal(ds.ys[0], [0, 1, 3])
  assert wilds.KEY_METRIC["iwildcam"] == "macro_f1_label_classes"


def test_camelyon17_official_scheme(tmp_path):
  root = write_camelyon17(str(tmp_path / "camelyon17_v1.0"))
  fold = wilds.load_fold(data_config(root, "camelyon17", dtype="float32"))
  assert fold.domain_names == tuple(f"hospital_{c}" for c in range(5)) and fold.num_classes == 2
  # WILDS's 0-indexed centres: 1 is the OOD validation hospital, 2 the test hospital.
  assert (fold.train_domains, fold.val_domains, fold.test_domains) == ((0, 3, 4), (1,), (2,))
  expect = {"train": lambda c, s: c in (0, 3, 4) and s == 0, "in_val": lambda c, s: c in (0, 3, 4) and s == 1,
            "in_test": lambda c, s: False, "heldout_val": lambda c, s: c == 1, "test": lambda c, s: c == 2}
  for field, keep in expect.items():
    s = getattr(fold, field)
    rows = [r for r in CAMELYON if keep(r[0], r[1])]
    assert s.x.shape == (len(rows), 8, 8, 3) and s.x.dtype == np.float32 and np.all(s.x <= 1.0)
    np.testing.assert_array_equal(s.domain, [r[0] for r in rows])
    np.testing.assert_array_equal(s.y, [r[2] for r in rows])
    np.testing.assert_array_equal(labels_from_colour(s.x * 255), s.y)
  want = "patches/patient_004_node_1/patch_patient_004_node_1_x_32_y_64.png"
  assert wilds.camelyon17_patch("4", "1", "32", "64") == want


def test_celeba_target_domain_crop_and_worst_group_matches_wilds_groups(tmp_path):
  root = write_celeba(str(tmp_path / "celebA_v1.0"))
  fold = wilds.load_fold(data_config(root, "celeba"))
  assert fold.domain_names == ("male_0", "male_1") and fold.num_classes == 2
  for field, part in (("train", 0), ("heldout_val", 1), ("test", 2)):
    s = getattr(fold, field)
    rows = [r for r in CELEBA if r[0] == part]
    np.testing.assert_array_equal(s.y, [int(r[1] == 1) for r in rows])
    np.testing.assert_array_equal(s.domain, [int(r[2] == 1) for r in rows])
    # The centre crop drops the top and bottom stripes (PALETTE[3]) before resizing.
    np.testing.assert_array_equal(labels_from_colour(s.x), s.y)
  assert len(fold.in_val) == 0 and len(fold.in_test) == 0
  # WILDS groups CelebA by (male, y); metrics group by domain * num_classes + label.
  s = fold.train
  pred = np.array([1, 0, 1, 0, 1])  # wrong once, in group (male 1, not blond) of 2
  wilds_groups = {(m, y): np.mean(pred[(s.domain == m) & (s.y == y)] == y)
                  for m in (0, 1) for y in (0, 1) if np.any((s.domain == m) & (s.y == y))}
  got = metrics.classification_metrics(pred, s.y, s.domain, fold.num_classes)["worst_group_accuracy"]
  assert len(wilds_groups) == 4 and got == min(wilds_groups.values()) == 0.5
  assert wilds.KEY_METRIC["celeba"] == "worst_group_accuracy"


def test_max_per_split_cache_and_missing_file(tmp_path, monkeypatch):
  root = write_iwildcam(str(tmp_path / "iwildcam_v2.0"))
  small = wilds.load_fold(data_config(root, "iwildcam", max_per_split=1))
  assert [len(s) for s in (small.train, small.in_val, small.in_test, small.heldout_val, small.test)] == [1] * 5
  assert small.domain_names == ("location_0", "location_3", "location_7", "location_8")
  first = wilds.load_fold(data_config(root, "iwildcam"))
  monkeypatch.setattr(Image, "open", lambda *a, **k: pytest.fail("decoded an image although the cache holds it"))
  again = wilds.load_fold(data_config(root, "iwildcam"))
  np.testing.assert_array_equal(again.train.x, first.train.x)
  np.testing.assert_array_equal(again.test.x, first.test.x)
  monkeypatch.undo()
  missing = os.path.join(root, "train", "0003abcd.jpg")
  os.remove(missing)
  with pytest.raises(FileNotFoundError) as e:
    wilds.load_fold(data_config(root, "iwildcam"))
  msg = str(e.value)
  assert missing in msg and "metadata.csv row 5" in msg and "\n" not in msg


def test_bad_tables_are_one_line_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="metadata.csv"):
    wilds.load_fold(data_config(tmp_path, "camelyon17"))
  with pytest.raises(ValueError, match="data.dataset"):
    wilds.load_fold(data_config(tmp_path, "fmow"))
  write_csv(tmp_path / "metadata.csv", ["split", "y", "filename"], [["train", 0, "a.jpg"]])
  with pytest.raises(wilds.DataError, match="location"):
    wilds.load_fold(data_config(tmp_path, "iwildcam"))


def test_run_fold_trains_on_a_wilds_fold(tiny_config, tmp_path):
  root = write_camelyon17(str(tmp_path / "camelyon17_v1.0"))
  c = tiny_config
  c.data.name, c.data.dataset, c.data.root, c.data.dtype = "wilds", "camelyon17", root, "float32"
  c.model.hidden = (8,)
  c.num_clients, c.num_rounds, c.eval_every, c.checkpoint_every = 4, 1, 1, 0
  c.client.batch_size = 4
  fold = wilds.load_fold(c.data)
  summary = experiment.run_fold(c, fold, str(tmp_path / "run"))
  assert summary["num_clients"] == 4 and sum(summary["client_sizes"]) == len(fold.train) == 9
  splits = summary["final"]["splits"]
  assert set(splits) == {"in_val", "heldout_val", "test"}  # Camelyon17 has no id_test
  assert np.isfinite(summary["final"]["train_loss"])
  assert 0.0 <= splits["test"][wilds.KEY_METRIC["camelyon17"]] <= 1.0
  assert summary["domains"] == {"names": [f"hospital_{k}" for k in range(5)], "train": [0, 3, 4], "val": [1],
                                "test": [2]}


def set_cell(path, row, column, value):
  """Rewrites one cell of a CSV (`row` counts data rows from 0)."""
  with open(path, newline="") as f:
    rows = list(csv.reader(f))
  rows[row + 1][rows[0].index(column)] = value
  write_csv(path, rows[0], rows[1:])


@pytest.mark.parametrize("layout,table,column,value,allowed", [
    ("iwildcam", "metadata.csv", "y", "-1", "[0, 182)"),
    ("iwildcam", "metadata.csv", "y", "182", "[0, 182)"),
    ("camelyon17", "metadata.csv", "tumor", "2", "{0, 1}"),
    ("celeba", "list_attr_celeba.csv", "Blond_Hair", "0", "{-1, 1}"),
    ("celeba", "list_attr_celeba.csv", "Male", "2", "{-1, 1}")])
def test_labels_outside_their_range_are_refused(tmp_path, layout, table, column, value, allowed):
  """WILDS `y = -1` used to train; now the table, row, column and value are named."""
  root = {"iwildcam": write_iwildcam, "camelyon17": write_camelyon17, "celeba": write_celeba}[layout](
      str(tmp_path / layout))
  set_cell(os.path.join(root, table), 3, column, value)
  n = {"iwildcam": len(IWILDCAM), "camelyon17": len(CAMELYON), "celeba": len(CELEBA)}[layout]
  with pytest.raises(wilds.DataError) as e:
    wilds.load_fold(data_config(root, layout))
  assert str(e.value) == f"{root}/{table} row 5: column {column!r} holds {value}, outside {allowed} (1 of {n} rows do)"


@pytest.mark.parametrize("layout", ["iwildcam", "camelyon17", "celeba"])
def test_tables_saved_with_a_byte_order_mark_read_as_without(tmp_path, layout):
  """Excel's "CSV UTF-8" starts the file with U+FEFF, which used to become part of the
  first column's name (CelebA: "no column 'image_id'")."""
  write = {"iwildcam": write_iwildcam, "camelyon17": write_camelyon17, "celeba": write_celeba}[layout]
  plain = wilds.read_table(data_config(write(str(tmp_path / "plain")), layout))
  root = write(str(tmp_path / "bom"))
  for name in os.listdir(root):
    if name.endswith(".csv"):
      path = os.path.join(root, name)
      with open(path, encoding="utf-8") as f:
        text = f.read()
      with open(path, "w", encoding="utf-8-sig", newline="") as f:
        f.write(text)
      with open(path, "rb") as f:
        assert f.read(3) == b"\xef\xbb\xbf"
  bom = wilds.read_table(data_config(root, layout))
  assert [os.path.relpath(p, root) for p in bom.paths] == [os.path.relpath(p, str(tmp_path / "plain"))
                                                          for p in plain.paths]
  for field in ("y", "domain", "split"):
    np.testing.assert_array_equal(getattr(bom, field), getattr(plain, field))
  assert bom.num_classes == plain.num_classes


@pytest.mark.parametrize("name", ["../../../../../../etc/passwd", "/etc/passwd", "a/../../b.jpg"])
def test_image_names_leading_out_of_the_release_are_refused(tmp_path, name):
  root = write_iwildcam(str(tmp_path / "iwildcam_v2.0"))
  path = os.path.join(root, "metadata.csv")
  lines = open(path).read().splitlines()
  header = lines[0].split(",")
  row = lines[2].split(",")
  row[header.index("filename")] = name
  lines[2] = ",".join(row)
  open(path, "w").write("\n".join(lines) + "\n")
  with pytest.raises(wilds.DataError) as e:
    wilds.load_fold(data_config(root, "iwildcam"))
  assert str(e.value) == (f"{path} row 3: column 'filename' names {name!r}, a path outside "
                          f"{os.path.join(root, 'train')}; refusing it")
