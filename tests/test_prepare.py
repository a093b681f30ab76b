"""Dataset preparation on small archives written here in each release's layout: extraction
into the loader's layout, and verification naming the missing, extra and corrupt files."""
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
import pytest
from PIL import Image

from fedjax_dg.data import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _png(seed: int, fmt: str = "PNG") -> bytes:
  buf = io.BytesIO()
  Image.fromarray(np.random.default_rng(seed).integers(0, 255, (6, 6, 3), dtype=np.uint8)).save(buf, fmt)
  return buf.getvalue()


def _small_pacs(path, per_class=2, prefix="kfold/", ext="png", extra=()):
  """PACS.zip as DomainBed's archive holds it: kfold/<domain>/<class>/*.png (another
  release's layout: `prefix` before the domain folders, `extra` members beside them)."""
  names = []
  with zipfile.ZipFile(path, "w") as z:
    for d, domain in enumerate(("art_painting", "cartoon", "photo", "sketch")):
      for c, cls in enumerate(("dog", "horse")):
        for i in range(per_class):
          name = f"{prefix}{domain}/{cls}/{i}.{ext}"
          z.writestr(name, _png(100 * d + 10 * c + i, "JPEG" if ext == "jpg" else "PNG"))
          names.append(name[len(prefix):])
    for name, data in extra:
      z.writestr(name, data)
  return names


@pytest.fixture
def tiny_pacs(monkeypatch):
  """pacs with published counts that fit the small archive (2 classes x 2 images)."""
  spec = prepare.SOURCES["pacs"]
  small = prepare.Source(**{**spec.__dict__, "domains": tuple((d, 4) for d, _ in spec.domains)})
  monkeypatch.setitem(prepare.SOURCES, "pacs", small)
  return small


def _cli(*args):
  env = {**os.environ, "PYTHONPATH": ROOT}
  return subprocess.run([sys.executable, "-m", "fedjax_dg.data.prepare", *args], env=env, capture_output=True,
                        text=True, timeout=120)


def test_pacs_extracts_into_the_loaders_layout_and_verifies(tmp_path, tiny_pacs):
  names = _small_pacs(tmp_path / "PACS.zip")
  dest = prepare.prepare("pacs", str(tmp_path))
  assert dest == str(tmp_path / "PACS")
  assert sorted(prepare._files(dest)) == sorted(names)
  rep = prepare.verify("pacs", str(tmp_path))
  assert rep.ok and rep.counts == {"art_painting": 4, "cartoon": 4, "photo": 4, "sketch": 4}
  from fedjax_dg.data import folders
  import ml_collections
  c = ml_collections.ConfigDict({"root": dest, "image_size": 6, "cache_dir": str(tmp_path / "cache"),
                                 "dtype": "uint8", "num_workers": 1, "max_per_domain": 0})
  ds = folders.load(c)
  assert ds.names == ("art_painting", "cartoon", "photo", "sketch") and sum(map(len, ds.ys)) == 16


def test_verify_names_missing_extra_and_corrupt_in_one_line(tmp_path, tiny_pacs):
  _small_pacs(tmp_path / "PACS.zip")
  dest = tmp_path / "PACS"
  prepare.prepare("pacs", str(tmp_path))
  os.remove(dest / "photo" / "horse" / "1.png")
  with open(dest / "sketch" / "dog" / "0.png", "r+b") as f:  # same size, other bytes
    f.seek(20)
    f.write(b"\xff" * 8)
  (dest / "cartoon" / "dog" / "notes.txt").write_text("x")
  rep = prepare.verify("pacs", str(tmp_path))
  line = rep.line("pacs", str(dest))
  assert "\n" not in line and line.startswith("verify pacs: FAILED")
  assert rep.missing == ["photo/horse/1.png", "1 of 4 images of domain photo"]
  assert rep.extra == ["cartoon/dog/notes.txt"]
  assert rep.corrupt[0].startswith("sketch/dog/0.png: SHA-256 differs")
  assert len(rep.corrupt) == 1  # the decode check does not repeat a file the manifest caught
  r = _cli("verify", "pacs", "--root", str(tmp_path))  # the real counts: far more are missing
  assert r.returncode == 1 and len(r.stdout.strip().splitlines()) == 1
  assert "photo/horse/1.png" in r.stdout and "sketch/dog/0.png" in r.stdout and "notes.txt" in r.stdout


def test_verify_without_manifest_decodes_every_image(tmp_path, tiny_pacs):
  _small_pacs(tmp_path / "PACS.zip")
  dest = tmp_path / "PACS"
  prepare.prepare("pacs", str(tmp_path))
  os.remove(dest / prepare.MANIFEST)
  (dest / "art_painting" / "dog" / "0.png").write_bytes(b"not a png")
  rep = prepare.verify("pacs", str(tmp_path))
  assert rep.missing == [] and rep.extra == []
  assert len(rep.corrupt) == 1 and rep.corrupt[0].startswith("art_painting/dog/0.png: UnidentifiedImageError")


def test_archive_members_outside_the_root_are_refused(tmp_path):
  with tarfile.open(tmp_path / "evil.tar.gz", "w:gz") as t:
    data = b"x"
    info = tarfile.TarInfo("../escape.txt")
    info.size = len(data)
    t.addfile(info, io.BytesIO(data))
  with pytest.raises(prepare.PrepareError, match="outside"):
    prepare.unpack_archive(str(tmp_path / "evil.tar.gz"), str(tmp_path / "out"))
  assert not (tmp_path / "escape.txt").exists()


def test_published_size_is_checked(tmp_path):
  (tmp_path / "civilcomments_v1.0.tar.gz").write_bytes(b"short")
  with pytest.raises(prepare.PrepareError, match="5 bytes, the release has 90644480"):
    prepare.prepare("civilcomments", str(tmp_path))
  r = _cli("civilcomments", "--root", str(tmp_path))
  assert r.returncode == 2 and r.stderr.count("\n") == 1 and "90644480" in r.stderr


def test_wilds_archive_and_idx_files(tmp_path):
  """A WILDS release unpacks to its versioned folder; a truncated IDX file is corrupt."""
  with tarfile.open(tmp_path / "civil.tar.gz", "w:gz") as t:
    csv = b"id,comment_text,split,toxicity\n0,hi,train,0.1\n1,yo,test,0.9\n"
    info = tarfile.TarInfo("civilcomments_v1.0/all_data_with_identities.csv")
    info.size = len(csv)
    t.addfile(info, io.BytesIO(csv))
  prepare.prepare("civilcomments", str(tmp_path), [str(tmp_path / "civil.tar.gz")])
  assert prepare.verify("civilcomments", str(tmp_path)).ok
  mnist = tmp_path / "src"
  mnist.mkdir()
  for a in prepare.SOURCES["mnist"].archives:
    n, shape = (3, (3, 2, 2)) if "images" in a.filename else (3, (3,))
    header = bytes([0, 0, 8, len(shape)]) + np.array(shape, ">u4").tobytes()
    body = np.arange(int(np.prod(shape)), dtype=np.uint8).tobytes()
    if a.filename.startswith("t10k-images"):
      body = body[:-1]  # truncated
    (mnist / a.filename).write_bytes(gzip.compress(header + body))
  prepare.prepare("mnist", str(tmp_path), [str(mnist / a.filename) for a in prepare.SOURCES["mnist"].archives])
  os.remove(tmp_path / "mnist" / prepare.MANIFEST)
  rep = prepare.verify("mnist", str(tmp_path))
  assert rep.corrupt == ["t10k-images-idx3-ubyte.gz: IDX data size 11 bytes does not match its header shape "
                         "(3, 2, 2) (12 bytes); the file is truncated or corrupt"] and not rep.missing


def test_terra_incognita_is_reorganised_by_location_and_category(tmp_path):
  ann = {"categories": [{"id": 1, "name": "bobcat"}, {"id": 2, "name": "deer"}],
         "images": [{"id": "a", "location": 38, "file_name": "a.png"}, {"id": "b", "location": 38, "file_name": "b.png"},
                    {"id": "c", "location": 99, "file_name": "c.png"}, {"id": "d", "location": 100, "file_name": "d.png"}],
         "annotations": [{"image_id": "a", "category_id": 1}, {"image_id": "b", "category_id": 2},
                         {"image_id": "c", "category_id": 1}, {"image_id": "d", "category_id": 1}]}
  with tarfile.open(tmp_path / "eccv_18_all_images_sm.tar.gz", "w:gz") as t:
    for k, f in enumerate("abcd"):
      data = _png(k)
      info = tarfile.TarInfo(f"eccv_18_all_images_sm/{f}.png")
      info.size = len(data)
      t.addfile(info, io.BytesIO(data))
  with zipfile.ZipFile(tmp_path / "caltech_camera_traps.json.zip", "w") as z:
    z.writestr("caltech_images_20210113.json", json.dumps(ann))
  dest = prepare.prepare("terra_incognita", str(tmp_path))
  assert sorted(prepare._files(dest)) == ["location_100/bobcat/d.png", "location_38/bobcat/a.png"]
  rep = prepare.verify("terra_incognita", str(tmp_path))
  assert rep.missing == ["the images of domain location_43", "the images of domain location_46"]


def test_every_dataset_config_has_a_source():
  configs = {f for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".py")}
  covered = {c for s in prepare.SOURCES.values() for c in s.configs}
  embedded_or_shared = {"default.py", "benchmark_common.py", "fedloe.py"}  # embedded data, helpers
  assert configs - embedded_or_shared == covered
  r = _cli("list")
  assert r.returncode == 0 and all(name in r.stdout for name in prepare.SOURCES)


RELEASE_LAYOUTS = {  # the folder before the domain folders, and what else the archive holds
    "domainbed": ("kfold/", ()),
    "official": ("PACS/kfold/", (("PACS/pacs_label/photo_test_kfold.txt", b"photo/dog/0.jpg 1\n"),
                                 ("__MACOSX/PACS/kfold/photo/dog/._0.jpg", b"\x00\x05\x16\x07"))),
    "kaggle": ("pacs_data/pacs_data/", (("pacs_label/sketch_train_kfold.txt", b"sketch/dog/0.jpg 1\n"),)),
    "dassl": ("pacs/images/", (("pacs/splits/art_painting_train_kfold.txt", b"art_painting/dog/0.jpg 1\n"),)),
    "domains at the top": ("", (("README.txt", b"PACS"),)),
}


@pytest.mark.parametrize("layout", sorted(RELEASE_LAYOUTS))
def test_pacs_release_layouts_unpack_the_domain_folders(tmp_path, tiny_pacs, layout):
  """Each distributed layout of PACS.zip: the folder holding the four domain folders becomes
  `<root>/PACS`, with exactly the images written and the files beside them, nothing else."""
  prefix, extra = RELEASE_LAYOUTS[layout]
  names = _small_pacs(tmp_path / "PACS.zip", prefix=prefix, ext="jpg", extra=extra)
  names += [n[len(prefix):] for n, _ in extra if n.startswith(prefix)]
  dest = prepare.prepare("pacs", str(tmp_path))
  assert dest == str(tmp_path / "PACS")
  assert sorted(prepare._files(dest)) == sorted(names)
  rep = prepare.verify("pacs", str(tmp_path))
  assert rep.ok and rep.counts == {"art_painting": 4, "cartoon": 4, "photo": 4, "sketch": 4}
  assert sorted(os.listdir(tmp_path)) == ["PACS", "PACS.zip"]  # the unpacking folder is gone


def test_pacs_release_with_two_copies_takes_the_shallower(tmp_path, tiny_pacs):
  """PACS/kfold/... and PACS/pacs_data/pacs_data/... in one archive: kfold's images (PNG)."""
  other = [(f"PACS/pacs_data/pacs_data/{d}/dog/9.jpg", _png(7, "JPEG"))
           for d in ("art_painting", "cartoon", "photo", "sketch")]
  names = _small_pacs(tmp_path / "PACS.zip", prefix="PACS/kfold/", extra=other)
  dest = prepare.prepare("pacs", str(tmp_path))
  assert sorted(prepare._files(dest)) == sorted(names)


def test_pacs_archive_without_the_domain_folders_is_one_line(tmp_path, tiny_pacs):
  with zipfile.ZipFile(tmp_path / "PACS.zip", "w") as z:  # sketch is missing
    for d in ("art_painting", "cartoon", "photo"):
      z.writestr(f"PACS/kfold/{d}/dog/0.png", _png(0))
  with pytest.raises(prepare.PrepareError) as e:
    prepare.prepare("pacs", str(tmp_path))
  assert str(e.value) == ("PACS.zip: expected a folder holding the domain folders art_painting, cartoon, photo, "
                          "sketch (e.g. kfold/art_painting/<class>/*.jpg); the top level holds ['PACS']")
  assert not (tmp_path / "PACS").exists() and sorted(os.listdir(tmp_path)) == ["PACS.zip"]
  r = _cli("pacs", "--root", str(tmp_path))
  assert r.returncode == 2 and r.stderr == f"error: {e.value}\n"


def test_release_without_its_top_folder_is_one_line(tmp_path):
  """A dataset without domain folders (a WILDS release) names the folder it expected."""
  with tarfile.open(tmp_path / "civil.tar.gz", "w:gz") as t:
    info = tarfile.TarInfo("other/all_data_with_identities.csv")
    info.size = 3
    t.addfile(info, io.BytesIO(b"a,b"))
  with pytest.raises(prepare.PrepareError) as e:
    prepare.prepare("civilcomments", str(tmp_path), [str(tmp_path / "civil.tar.gz")])
  assert str(e.value) == ("civil.tar.gz: expected a folder 'civilcomments_v1.0' at the top or one level down; "
                          "the top level holds ['other']")


def test_root_is_the_parent_or_the_dataset_folder(tmp_path):
  """`--root` as documented (the archives' folder), as the config's `data.root` (ends in the
  dataset's folder name; for verify, a folder holding the dataset), and `--data-root`."""
  (tmp_path / "data").mkdir()
  parent, folder = str(tmp_path / "data"), str(tmp_path / "data" / "PACS")
  assert prepare.resolve_root("pacs", parent) == prepare.Place(parent, folder)
  itself = prepare.resolve_root("pacs", folder)
  assert (itself.parent, itself.folder) == (parent, folder)
  assert itself.note == (f"--root {folder} is read as the dataset folder itself (the config's data.root), "
                         f"not as the folder holding PACS/; archives are read from {parent}")
  assert prepare.resolve_root("pacs", data_root=folder) == prepare.Place(parent, folder)
  custom = tmp_path / "pacs_images"  # a dataset folder of another name: only verify can tell
  for d, _ in prepare.SOURCES["pacs"].domains:
    (custom / d).mkdir(parents=True)
  assert prepare.resolve_root("pacs", str(custom)).folder == str(custom / "PACS")
  got = prepare.resolve_root("pacs", str(custom), existing=True)
  assert (got.parent, got.folder) == (str(tmp_path), str(custom)) and got.note
  (tmp_path / "data" / "PACS").mkdir()
  (tmp_path / "data" / "PACS" / "PACS.zip").write_bytes(b"")  # the release archive inside: the parent, as documented
  assert prepare.resolve_root("pacs", folder) == prepare.Place(folder, os.path.join(folder, "PACS"))
  os.remove(tmp_path / "data" / "PACS" / "PACS.zip")
  (tmp_path / "data" / "PACS" / "PACS").mkdir()  # a PACS folder inside: the parent, as documented
  assert prepare.resolve_root("pacs", folder, existing=True) == prepare.Place(folder, os.path.join(folder, "PACS"))
  with pytest.raises(prepare.PrepareError, match=r"^--root and --data-root: give one"):
    prepare.resolve_root("pacs", parent, folder)
  with pytest.raises(prepare.PrepareError, match=r"^--root: the folder for the archives"):
    prepare.resolve_root("pacs")


def test_cli_accepts_the_dataset_folder_as_root(tmp_path, tiny_pacs):
  """`prepare pacs --root D/PACS` and `--data-root D/PACS` unpack D/PACS.zip into D/PACS,
  saying so in one line; verify reads the same folder from each spelling."""
  _small_pacs(tmp_path / "PACS.zip")
  dest = tmp_path / "PACS"
  assert prepare.main(["pacs", "--root", str(dest)]) in (0, 1)  # the real counts: 1 (images missing)
  assert sorted(prepare._files(str(dest)))[:1] == ["art_painting/dog/0.png"]
  for args in (["--root", str(tmp_path)], ["--root", str(dest)], ["--data-root", str(dest)]):
    r = _cli("verify", "pacs", *args)
    assert len(r.stdout.strip().splitlines()) == 1 and f"FAILED: {dest}: " in r.stdout, r.stdout + r.stderr
    assert r.stderr == ("" if args[0] == "--data-root" or args[1] == str(tmp_path) else
                        f"note: --root {dest} is read as the dataset folder itself (the config's data.root), "
                        f"not as the folder holding PACS/; archives are read from {tmp_path}\n")
  renamed = tmp_path / "mine"
  os.rename(dest, renamed)  # any name: verify finds the dataset in it; the manifest agrees
  assert prepare.verify("pacs", str(tmp_path), folder=str(renamed)).ok
  r = _cli("verify", "pacs", "--root", str(renamed))
  assert r.returncode == 1 and f"FAILED: {renamed}: " in r.stdout and "note: --root" in r.stderr
  shutil.rmtree(renamed)
  r = _cli("pacs", "--data-root", str(tmp_path / "x" / "pacs_here"), "--archive", str(tmp_path / "PACS.zip"))
  assert f"prepared pacs in {tmp_path / 'x' / 'pacs_here'}\n" in r.stdout and r.stderr == ""
  r = _cli("verify", "pacs", "--data-root", str(tmp_path / "nowhere"))
  assert r.returncode == 1 and f"--data-root {tmp_path / 'nowhere'})" in r.stdout
