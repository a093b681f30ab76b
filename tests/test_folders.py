"""DomainBed-style image folders: layout, labels, resizing, the decode cache, errors."""
import json
import os

import ml_collections
import numpy as np
import pytest
from PIL import Image

from fedjax_dg.data import datasets, folders

COLORS = {"cat": (200, 30, 30), "dog": (30, 30, 200)}
# domain -> class -> number of images; the domains hold different counts.
LAYOUT = {"art_painting": {"cat": 2, "dog": 3}, "photo": {"cat": 3, "dog": 1}, "sketch": {"cat": 1, "dog": 2}}


def write_folder(root, layout=LAYOUT):
  """Solid-colour images of assorted sizes, PNG and JPEG, in root/<domain>/<class>/."""
  for d, classes in layout.items():
    for c, n in classes.items():
      os.makedirs(root / d / c, exist_ok=True)
      for i in range(n):
        ext = ("png", "jpg", "jpeg")[i % 3]
        Image.new("RGB", (10 + 3 * i, 7 + i), COLORS[c]).save(root / d / c / f"img{i}.{ext}")
  (root / "README.txt").write_text("not a domain")
  return root


def data_config(root, **kw):
  c = ml_collections.ConfigDict({"name": "image_folder", "root": str(root), "image_size": 8, "seed": 0,
                                 "num_workers": 2})
  c.update(kw)
  return c


def test_layout_shapes_labels_and_colours(tmp_path):
  root = write_folder(tmp_path / "PACS")
  ds = folders.load(data_config(root))
  assert ds.names == ("art_painting", "photo", "sketch")
  assert ds.num_classes == 2 and ds.input_shape == (8, 8, 3)
  for name, x, y in zip(ds.names, ds.xs, ds.ys):
    counts = LAYOUT[name]
    assert x.dtype == np.uint8 and x.shape == (sum(counts.values()), 8, 8, 3)
    # ImageFolder order: classes sorted ("cat" = 0, "dog" = 1), files sorted within.
    np.testing.assert_array_equal(y, [0] * counts["cat"] + [1] * counts["dog"])
    for xi, yi in zip(x, y):  # JPEG is lossy on solid colours by a few levels at most
      np.testing.assert_allclose(xi.reshape(-1, 3).mean(0), COLORS[("cat", "dog")[yi]], atol=6)
  _, classes, files, _ = folders.scan(str(root))
  assert classes == ("cat", "dog")
  assert [os.path.basename(f) for f in files[0]] == ["img0.png", "img1.jpg", "img0.png", "img1.jpg", "img2.jpeg"]


def test_resize_is_pil_bilinear_and_float32_is_x_over_255(tmp_path):
  root = tmp_path / "data"
  write_folder(root, {"a": {"cat": 1}, "b": {"cat": 1}})
  grad = (np.arange(13 * 11 * 3).reshape(13, 11, 3) * 7 % 256).astype(np.uint8)
  Image.fromarray(grad).save(root / "a" / "cat" / "img0.png")
  want = np.asarray(Image.fromarray(grad).resize((8, 8), Image.Resampling.BILINEAR))
  ds = folders.load(data_config(root))
  np.testing.assert_array_equal(ds.xs[0][0], want)
  ds32 = folders.load(data_config(root, dtype="float32"))
  assert ds32.xs[0].dtype == np.float32
  np.testing.assert_allclose(ds32.xs[0][0], want / 255.0, atol=1e-7)


def test_second_load_reads_the_cache_not_the_images(tmp_path, monkeypatch):
  root = write_folder(tmp_path / "PACS")
  first = folders.load(data_config(root))
  cache = root / ".fedjax_dg_cache" / "8"
  manifests = sorted(cache.glob("*.json"))
  assert len(manifests) == 3 and len(list(cache.glob("*.npy"))) == 3
  m = json.loads(manifests[0].read_text())
  assert m["classes"] == ["cat", "dog"] and m["image_size"] == 8 and m["count"] == 5 and len(m["digest"]) == 40

  def no_decoding(*a, **k):
    raise AssertionError("decoded an image although the cache holds it")
  monkeypatch.setattr(Image, "open", no_decoding)
  second = folders.load(data_config(root))  # the hidden cache folder is not a domain
  assert second.names == first.names
  for a, b in zip(first.xs, second.xs):
    np.testing.assert_array_equal(a, b)
  monkeypatch.undo()

  # A new file changes the digest of its domain only: one domain is decoded again.
  Image.new("RGB", (9, 9), COLORS["dog"]).save(root / "photo" / "dog" / "new.png")
  opened = []
  real_open = Image.open
  monkeypatch.setattr(Image, "open", lambda p, *a, **k: opened.append(str(p)) or real_open(p, *a, **k))
  third = folders.load(data_config(root))
  assert len(third.ys[1]) == 5 and len(opened) == 5 and all("photo" in p for p in opened)


def test_cache_dir_and_max_per_domain(tmp_path):
  root = write_folder(tmp_path / "PACS")
  cache = tmp_path / "cache"
  ds = folders.load(data_config(root, cache_dir=str(cache), max_per_domain=2))
  assert [len(y) for y in ds.ys] == [2, 2, 2]
  assert len(list(cache.glob("*.npy"))) == 3 and not (root / ".fedjax_dg_cache").exists()
  full = folders.load(data_config(root, cache_dir=str(cache)))
  # The kept rows are a subset of the full domain, labels included.
  for x, y, fx, fy in zip(ds.xs, ds.ys, full.xs, full.ys):
    for xi, yi in zip(x, y):
      match = [k for k in range(len(fx)) if np.array_equal(fx[k], xi)]
      assert match and yi in fy[match]


def test_corrupt_image_is_a_one_line_error_naming_the_file(tmp_path):
  root = write_folder(tmp_path / "PACS")
  bad = root / "photo" / "dog" / "broken.jpg"
  bad.write_bytes(b"this is not a jpeg\n" * 10)
  with pytest.raises(folders.DataError) as e:
    folders.load(data_config(root))
  assert str(bad) in str(e.value) and "\n" not in str(e.value)


def test_truncated_jpeg_decodes_as_in_domainbed(tmp_path):
  root = write_folder(tmp_path / "PACS")
  path = root / "photo" / "cat" / "img1.jpg"
  Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), np.uint8)).save(path)
  path.write_bytes(path.read_bytes()[:-200])
  ds = folders.load(data_config(root))  # ImageFile.LOAD_TRUNCATED_IMAGES, as DomainBed sets it
  assert ds.xs[1].shape == (4, 8, 8, 3)
  from PIL import ImageFile
  assert not ImageFile.LOAD_TRUNCATED_IMAGES  # restored afterwards


def test_missing_class_folder_is_a_one_line_error_naming_it(tmp_path):
  root = write_folder(tmp_path / "PACS")
  for f in (root / "sketch" / "dog").iterdir():
    f.unlink()
  (root / "sketch" / "dog").rmdir()
  with pytest.raises(FileNotFoundError) as e:
    folders.load(data_config(root))
  msg = str(e.value)
  assert str(root / "sketch" / "dog") in msg and "missing class folder" in msg and "\n" not in msg


def test_missing_root_and_registry(tmp_path):
  with pytest.raises(FileNotFoundError, match="data.root"):
    folders.load(data_config(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match="data.root"):
    folders.load(data_config(""))
  root = write_folder(tmp_path / "PACS")
  ds = datasets.load_dataset(data_config(root))
  assert ds.name == "image_folder" and ds.num_domains == 3


def _truncate(path):
  path.write_bytes(path.read_bytes()[:100])


def _wrong_shape(path):
  np.save(path, np.zeros((2, 8, 8, 3), np.uint8))


@pytest.mark.parametrize("suffix,corrupt,cause", [
    (".npy", _truncate, None),
    (".npy", lambda p: p.write_bytes(b"\x93NUMPY garbage"), None),
    (".npy", _wrong_shape, "uint8 (5, 8, 8, 3) expected, found uint8 (2, 8, 8, 3)"),
    (".json", lambda p: p.write_text('{"digest": "ab'), "Unterminated string starting at: line 1 column 12 (char 11)"),
    (".json", lambda p: p.write_text("[1, 2]"), "a JSON list, not an object"),
    (".json", lambda p: p.write_bytes(b"\xff\xfe\x00"), None)])
def test_a_corrupt_cache_entry_is_said_in_one_line_and_rebuilt(tmp_path, monkeypatch, suffix, corrupt, cause):
  root = write_folder(tmp_path / "PACS")
  first = folders.load(data_config(root))
  entry = next((root / ".fedjax_dg_cache" / "8").glob("art_painting-*.npy")).with_suffix(suffix)
  corrupt(entry)
  with pytest.warns(folders.CacheWarning) as record:
    again = folders.load(data_config(root))
  assert len(record) == 1
  msg = str(record[0].message)
  what = "corrupt image cache manifest" if suffix == ".json" else "corrupt image cache"
  assert msg.startswith(f"{entry}: {what} (") and msg.endswith("); decoding the images again"), msg
  assert "\n" not in msg and (cause is None or msg == f"{entry}: {what} ({cause}); decoding the images again")
  for a, b in zip(first.xs, again.xs):
    np.testing.assert_array_equal(a, b)
  # The entry was written again: a third load reads it without decoding or warning.
  monkeypatch.setattr(Image, "open", lambda *a, **k: pytest.fail("decoded an image although the cache holds it"))
  import warnings
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    third = folders.load(data_config(root))
  np.testing.assert_array_equal(third.xs[0], first.xs[0])


def test_directory_links_back_into_the_tree_are_not_followed(tmp_path):
  """A link loop used to list each image about 40 times (until the path got too long)."""
  root = write_folder(tmp_path / "PACS")
  dog = root / "photo" / "dog"
  os.symlink(dog, dog / "loop")                      # a loop
  os.symlink(root / "photo" / "cat", dog / "cats")   # another class of the tree
  outside = tmp_path / "more_dogs"                   # data kept elsewhere is still followed, once
  outside.mkdir()
  Image.new("RGB", (9, 9), COLORS["dog"]).save(outside / "extra.png")
  os.symlink(outside, dog / "extra")
  os.symlink(outside, dog / "extra_again")
  with pytest.warns(folders.DataWarning) as record:
    ds = folders.load(data_config(root))
  assert len(record) == 3 and sorted(str(r.message) for r in record) == [
      f"{dog}/cats: not following the directory link to {root}/photo/cat: it leads back into {root}",
      f"{dog}/extra_again: not following the directory link to {outside}: that folder is already listed",
      f"{dog}/loop: not following the directory link to {dog}: it leads back into {root}"]
  with pytest.warns(folders.DataWarning):
    _, _, files, _ = folders.scan(str(root))
  assert [os.path.relpath(f, root) for f in files[1]] == [
      "photo/cat/img0.png", "photo/cat/img1.jpg", "photo/cat/img2.jpeg", "photo/dog/img0.png",
      "photo/dog/extra/extra.png"]
  assert [len(y) for y in ds.ys] == [5, 5, 3]
  with pytest.warns(folders.DataWarning):
    assert folders.list_images(str(dog), str(root)) == [str(dog / "img0.png"), str(dog / "extra" / "extra.png")]
