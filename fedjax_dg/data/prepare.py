"""Dataset preparation: where each dataset comes from, how its release unpacks into the
layout the loaders read, and a check of what is on disk.

    python -m fedjax_dg.data.prepare list
    python -m fedjax_dg.data.prepare NAME --root DIR [--archive FILE ...] [--download]
    python -m fedjax_dg.data.prepare verify NAME --root DIR [--fast]
    python -m fedjax_dg.data.prepare [verify] NAME --data-root DIR/<folder> ...

`--root DIR` is the folder holding the archives; the dataset is unpacked into
`DIR/<folder>` (`list` names each folder), the folder the dataset's config reads:
`--config.data.root=DIR/<folder>` (`data.path` for the MNIST-format datasets). The
dataset folder itself is accepted too: `--data-root DIR/<folder>` names it exactly as the
config does (the archives are then read from its parent), and a `--root` holding neither
the dataset's folder nor a release archive that ends in the dataset's folder name
(`--root /data/PACS`), or for `verify` holds the dataset's manifest or domain folders, is
read as the dataset folder, with a one-line note on stderr saying so. `prepare` and `verify` print the dataset folder they used.

`NAME --root DIR` unpacks the release archives (given with `--archive`, or found in `DIR`
under their release file names), finding the dataset wherever the archive puts it (for a
dataset of domain folders: the folder holding all of them), checks each archive's SHA-256
where the source publishes one (and its size where it states one), and writes a manifest
of every unpacked file (`.fedjax_dg_manifest.json`: size and SHA-256). `--download` first
fetches the archives from their official URLs with `urllib` (a thin call; Google Drive and
Kaggle links need a browser or `gdown`, and this library never downloads at run time).

`verify NAME --root DIR` prints one line naming what is missing, extra or corrupt, and
exits 1 if anything is: with a manifest, every file against its size and SHA-256 (`--fast`:
size only); always, the files the loader needs, the published image count per domain, and
that every image decodes and every CSV / JSON / IDX file parses.

Archives and files are untrusted (`fedjax_dg.bounded`): an archive is checked from what it
declares before anything is extracted (each member's size, their total, the inflation
ratio over the archive's size, the free space; no link, FIFO or device member, no path out
of the folder), `verify` reads every file with a byte cap and reports a link out of the
dataset folder, a FIFO or a device as corrupt without reading it; each refusal is one line.

No source here publishes SHA-256 checksums of its archives (DomainBed's download script
has none, WILDS' dataset classes state a download URL and an approximate compressed size,
LEAF and MNIST publish none): `Archive.sha256` is empty for each, and the manifest
written at extraction is what later verifications compare against.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile

from fedjax_dg import bounded

MANIFEST = ".fedjax_dg_manifest.json"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
IGNORED = (MANIFEST, ".fedjax_dg_cache")  # written by this library, never extra
MAX_JSON_BYTES = 2 << 30      # one JSON file verify parses, or the annotations terra_incognita reads
MAX_MANIFEST_BYTES = 256 << 20  # the manifest: ~100 bytes per file, so millions of files
PIL_MISSING = 'checking images needs Pillow: pip install "fedjax-dg[data]"'


@dataclasses.dataclass(frozen=True)
class Archive:
  """One release file: `url` to fetch, `filename` it is saved as, its SHA-256 where the
  source publishes one ("" otherwise) and its size in bytes where the source states one."""
  url: str
  filename: str
  sha256: str = ""
  size: int | None = None


@dataclasses.dataclass(frozen=True)
class Source:
  """A dataset: its archives, the folder under `--root` its loader reads, how the archives
  unpack (`rename`: the archive's top folder -> `folder`; `unpack`: a special step), the
  files the loader needs, and the published count of images per domain folder."""
  name: str
  configs: tuple[str, ...]
  folder: str
  archives: tuple[Archive, ...]
  reference: str
  rename: str = ""
  unpack: str = "archive"            # archive | copy (files used as they are) | terra_incognita
  required: tuple[str, ...] = ()
  domains: tuple[tuple[str, int | None], ...] = ()  # None: no published count
  note: str = ""


_GDRIVE = "https://drive.google.com/uc?id="
_CODALAB = "https://worksheets.codalab.org/rest/bundles/{}/contents/blob/"
_MNIST = tuple(Archive(f"https://ossci-datasets.s3.amazonaws.com/mnist/{f}", f) for f in (
    "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz"))
_MNIST_FILES = tuple(a.filename for a in _MNIST)

SOURCES = {s.name: s for s in (
    Source("pacs", ("pacs.py",), "PACS", (Archive(_GDRIVE + "1JFr8f805nMUelQWWmfnJR3y4_SYoN5Pd", "PACS.zip"),),
           "DomainBed's download script (domainbed/scripts/download.py); original: "
           "http://www.eecs.qmul.ac.uk/~dl307/project_iccv2017", rename="kfold",
           domains=(("art_painting", 2048), ("cartoon", 2344), ("photo", 1670), ("sketch", 3929)),
           note="any common layout of the archive is read: DomainBed's (`kfold/<domain>/<class>/*.jpg`), the "
                "official release's (`PACS/kfold/...`), Kaggle's (`pacs_data/pacs_data/...`), or any other "
                "folder holding the four domain folders"),
    Source("vlcs", ("vlcs.py",), "VLCS", (Archive(_GDRIVE + "1skwblH1_okBwxWxmRsp9_qi15hyPpxg8", "VLCS.tar.gz"),),
           "DomainBed's download script", rename="VLCS",
           domains=(("Caltech101", 1415), ("LabelMe", 2656), ("SUN09", 3282), ("VOC2007", 3376))),
    Source("office_home", ("office_home.py",), "office_home",
           (Archive(_GDRIVE + "1uY0pj7oFsjMxRwaD3Sxy0jgel0fsYXLC", "office_home.zip"),),
           "DomainBed's download script; original: http://hemanthdv.org/OfficeHome-Dataset/",
           rename="OfficeHomeDataset_10072016",
           domains=(("Art", 2427), ("Clipart", 4365), ("Product", 4439), ("Real World", 4357))),
    Source("terra_incognita", ("terra_incognita.py",), "terra_incognita", (
        Archive("https://lilablobssc.blob.core.windows.net/caltechcameratraps/eccv_18_all_images_sm.tar.gz",
                "eccv_18_all_images_sm.tar.gz"),
        Archive("https://lilablobssc.blob.core.windows.net/caltechcameratraps/labels/caltech_camera_traps.json.zip",
                "caltech_camera_traps.json.zip")),
           "DomainBed's download script (locations 38, 43, 46, 100; ten categories); original: "
           "https://lila.science/datasets/caltech-camera-traps", unpack="terra_incognita",
           domains=(("location_100", None), ("location_38", None), ("location_43", None), ("location_46", None)),
           note="per-location counts depend on the annotation release; each location folder must hold images"),
    Source("mnist", ("rotated_mnist.py", "colored_mnist.py"), "mnist", _MNIST,
           "MNIST (http://yann.lecun.com/exdb/mnist/), the mirror torchvision uses", unpack="copy",
           required=_MNIST_FILES, note="60,000 training and 10,000 test images; read as they are (.gz)"),
    Source("fashion_mnist", ("rotated_fashion_mnist.py",), "fashion-mnist", tuple(
        Archive(f"http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/{a.filename}", a.filename)
        for a in _MNIST), "Fashion-MNIST (https://github.com/zalandoresearch/fashion-mnist); or Debian's "
           "dataset-fashion-mnist package (make fashion-mnist)", unpack="copy", required=_MNIST_FILES,
           note="60,000 training and 10,000 test images"),
    Source("femnist", ("femnist.py",), "femnist", (
        Archive("https://s3.amazonaws.com/nist-srd/SD19/by_class.zip", "by_class.zip"),
        Archive("https://s3.amazonaws.com/nist-srd/SD19/by_write.zip", "by_write.zip")),
           "LEAF (https://github.com/TalwalkarLab/leaf, data/femnist): its preprocess.sh turns NIST's "
           "archives into train/*.json and test/*.json; pass an archive of that data folder as --archive",
           unpack="leaf", required=("train", "test"),
           note="LEAF states 3,550 writers and 805,263 images (62 classes) for the full dataset"),
    Source("iwildcam", ("iwildcam.py",), "iwildcam_v2.0",
           (Archive(_CODALAB.format("0x5a405f743c4b4c66a16cc09cc3a858ca"), "iwildcam_v2.0.tar.gz"),),
           "WILDS (wilds/datasets/iwildcam_dataset.py, version 2.0: compressed size about 12 GB)",
           rename="iwildcam_v2.0", required=("metadata.csv", "train")),
    Source("camelyon17", ("camelyon17.py",), "camelyon17_v1.0",
           (Archive(_CODALAB.format("0xe45e15f39fb54e9d9e919556af67aabe"), "camelyon17_v1.0.tar.gz"),),
           "WILDS (wilds/datasets/camelyon17_dataset.py, version 1.0)", rename="camelyon17_v1.0",
           required=("metadata.csv", "patches")),
    Source("celeba", ("celeba.py",), "celebA_v1.0",
           (Archive(_CODALAB.format("0xfe55077f5cd541f985ebf9ec50473293"), "celebA_v1.0.tar.gz"),),
           "WILDS (wilds/datasets/celebA_dataset.py, version 1.0)", rename="celebA_v1.0",
           required=("list_attr_celeba.csv", "list_eval_partition.csv", "img_align_celeba")),
    Source("civilcomments", ("civilcomments.py",), "civilcomments_v1.0",
           (Archive(_CODALAB.format("0x8cd3de0634154aeaad2ee6eb96723c6e"), "civilcomments_v1.0.tar.gz",
                    size=90_644_480),),
           "WILDS (wilds/datasets/civilcomments_dataset.py, version 1.0)", rename="civilcomments_v1.0",
           required=("all_data_with_identities.csv",),
           note="the tokenizer (data.tokenizer) is a separate local tokenizer.json"),
    Source("py150", ("py150.py",), "py150_v1.0",
           (Archive(_CODALAB.format("0x442a0661a84649e69c0a946cc5f84237"), "py150_v1.0.tar.gz",
                    size=162_811_706),),
           "WILDS (wilds/datasets/py150_dataset.py, version 1.0)", rename="py150_v1.0",
           required=tuple(f"processed/{s}_input{t}.json" for s in ("train", "IDval", "OODval", "IDtest", "OODtest")
                          for t in ("", "_tok_type")) + tuple(
               f"metadata/repo_file_names/{s}.txt" for s in ("train", "IDval", "OODval", "IDtest", "OODtest"))
           + ("metadata/repo_file_names/repo_ids.csv",)),
)}


class PrepareError(ValueError):
  """A one-line error of preparation (a missing or wrong archive, an unsafe member)."""


def sha256(path: str, chunk: int = 1 << 20) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(chunk), b""):
      h.update(block)
  return h.hexdigest()


def source(name: str) -> Source:
  if name not in SOURCES:
    raise PrepareError(f"unknown dataset {name!r}; choose one of {sorted(SOURCES)}")
  return SOURCES[name]


@dataclasses.dataclass(frozen=True)
class Place:
  """Where a dataset's archives and folder are.

  Attributes:
    parent: the folder the archives are read from (`--root` as documented).
    folder: the dataset folder, the config's `data.root` (`data.path` for MNIST formats).
    note: one line saying how `--root` was read when it named the dataset folder itself,
      else "".
  """
  parent: str
  folder: str
  note: str = ""


def _looks_prepared(folder: str, spec: Source) -> bool:
  """Whether `folder` itself holds the dataset: its manifest, or every domain folder or
  required file."""
  if os.path.isfile(os.path.join(folder, MANIFEST)):
    return True
  needed = [d for d, _ in spec.domains] + list(spec.required)
  return bool(needed) and all(os.path.exists(os.path.join(folder, n)) for n in needed)


def resolve_root(name: str, root: str | None = None, data_root: str | None = None,
                 existing: bool = False) -> Place:
  """The archives' folder and the dataset folder from `--root` or `--data-root`.

  `--root` is the folder holding the archives, with the dataset in `root/<folder>`; a
  `--root` that is the dataset folder itself (it holds neither such a folder nor a release
  archive, and it ends in the dataset's folder name or, with `existing`, holds the
  dataset's manifest, domain folders or required files) is read as that, as the config's
  `data.root` names it.
  `--data-root` is always the dataset folder.

  Args:
    name: the dataset.
    root: `--root`, or None.
    data_root: `--data-root`, or None.
    existing: whether the dataset is expected on disk already (`verify`).

  Returns:
    The `Place`: the archives' folder, the dataset folder, and a note when `root` was read
    as the dataset folder.

  Raises:
    PrepareError: one line when neither or both are given, or the dataset is unknown.
  """
  spec = source(name)
  if root and data_root:
    raise PrepareError("--root and --data-root: give one (--root: the folder holding the archives; "
                       "--data-root: the dataset folder, as the config's data.root)")
  if data_root:
    return Place(os.path.dirname(os.path.normpath(data_root)) or ".", data_root)
  if not root:
    raise PrepareError("--root: the folder for the archives and the dataset is required "
                       "(or --data-root: the dataset folder, as the config's data.root)")
  inside = os.path.join(root, spec.folder)
  holds_archives = any(os.path.isfile(os.path.join(root, a.filename)) for a in spec.archives)
  if not os.path.isdir(inside) and not holds_archives:
    itself = os.path.basename(os.path.normpath(root)) == spec.folder
    if itself or (existing and os.path.isdir(root) and _looks_prepared(root, spec)):
      parent = os.path.dirname(os.path.normpath(root)) or "."
      return Place(parent, root, f"--root {root} is read as the dataset folder itself (the config's data.root), "
                                 f"not as the folder holding {spec.folder}/; archives are read from {parent}")
  return Place(root, inside)


def download(src: Source, root: str) -> list[str]:
  """Fetches every archive of `src` into `root` (urllib; nothing else). The thin documented
  call: Google Drive links may answer with a confirmation page instead of the file."""
  import urllib.request
  os.makedirs(root, exist_ok=True)
  out = []
  for a in src.archives:
    dest = os.path.join(root, a.filename)
    if not os.path.exists(dest):
      urllib.request.urlretrieve(a.url, dest)
    out.append(dest)
  return out


def check_archive(a: Archive, path: str) -> None:
  """The published size and SHA-256 of an archive, where there are any."""
  if not os.path.isfile(path):
    raise PrepareError(f"{path}: no such archive (download {a.url})")
  if a.size is not None and os.path.getsize(path) != a.size:
    raise PrepareError(f"{path}: {os.path.getsize(path)} bytes, the release has {a.size}")
  if a.sha256 and sha256(path) != a.sha256:
    raise PrepareError(f"{path}: SHA-256 differs from the release's {a.sha256}")


def unpack_archive(path: str, dest: str, limits: bounded.ArchiveLimits = bounded.ArchiveLimits()) -> None:
  """Extracts a zip or tar (plain, gzip, bzip2, xz) archive into `dest`.

  Every member is checked from what the archive declares before anything is extracted
  (`fedjax_dg.bounded.archive_members`: sizes per member and in all, the inflation ratio,
  no links, FIFOs or devices, no path outside `dest`), and the total against the free space.

  Args:
    path: the archive.
    dest: the folder to unpack into.
    limits: the caps on what the archive may declare.

  Raises:
    PrepareError: one line naming the archive and what is wrong with it.
  """
  try:
    bounded.extract_archive(path, dest, limits)
  except bounded.UntrustedFileError as e:
    raise PrepareError(str(e)) from None


def _top(folder: str, name: str) -> str:
  """`folder/name` if it exists, else the only directory inside `folder` that holds it."""
  if os.path.isdir(os.path.join(folder, name)):
    return os.path.join(folder, name)
  for entry in sorted(os.listdir(folder)):
    if os.path.isdir(os.path.join(folder, entry, name)):
      return os.path.join(folder, entry, name)
  raise PrepareError(f"the archive holds no folder {name!r} (found {sorted(os.listdir(folder))})")


def _holds_domains(folder: str, domains: tuple[str, ...]) -> bool:
  return all(os.path.isdir(os.path.join(folder, d)) for d in domains)


def find_dataset_folder(unpacked: str, spec: Source, archives: list[str]) -> str:
  """The folder of an unpacked release that the loader reads.

  A dataset with domain folders is found wherever its release puts them: the folder
  `spec.rename` at the top or one level down when it holds every domain folder
  (DomainBed's `PACS.zip`: `kfold/<domain>/<class>/*.jpg`), else the shallowest folder
  holding every domain folder (`PACS/kfold/...`, Kaggle's `pacs_data/pacs_data/...`,
  `pacs/images/...`); folders named `__MACOSX` or starting with a dot are not searched.
  Any other dataset is the folder `spec.rename` at the top or one level down.

  Args:
    unpacked: the folder the archives were unpacked into.
    spec: the dataset.
    archives: the archives' paths, named in the error.

  Returns:
    The path of the dataset folder inside `unpacked`.

  Raises:
    PrepareError: one line naming the archives, what they were expected to hold and what
      their top level holds, when no folder matches.
  """
  domains = tuple(d for d, _ in spec.domains)
  names = ", ".join(os.path.basename(a) for a in archives)
  found = sorted(os.listdir(unpacked))
  if not domains:
    try:
      return _top(unpacked, spec.rename)
    except PrepareError:
      raise PrepareError(f"{names}: expected a folder {spec.rename!r} at the top or one level down; "
                         f"the top level holds {found}") from None
  named = [os.path.join(unpacked, *top, spec.rename) for top in [()] + [(e,) for e in found]] if spec.rename else []
  for folder in named:
    if _holds_domains(folder, domains):
      return folder
  candidates = []  # (depth, path) of every folder holding the domain folders
  for d, dirs, _ in os.walk(unpacked):
    dirs[:] = sorted(x for x in dirs if x != "__MACOSX" and not x.startswith("."))
    if _holds_domains(d, domains):
      candidates.append((0 if d == unpacked else os.path.relpath(d, unpacked).count(os.sep) + 1, d))
      dirs[:] = []  # a dataset folder is not searched further
  if candidates:
    return min(candidates)[1]
  raise PrepareError(f"{names}: expected a folder holding the domain folders {', '.join(domains)} "
                     f"(e.g. {spec.rename or spec.folder}/{domains[0]}/<class>/*.jpg); the top level holds {found}")


def _terra_incognita(tmp: str, dest: str, spec: Source) -> None:
  """DomainBed's selection: images of locations 38, 43, 46, 100 whose annotation is one of
  ten categories, copied to `location_<id>/<category>/<file>`."""
  locations = {"38", "43", "46", "100"}
  categories = {"bird", "bobcat", "cat", "coyote", "dog", "empty", "opossum", "rabbit", "raccoon", "squirrel"}
  jsons = [os.path.join(d, f) for d, _, fs in os.walk(tmp) for f in fs if f.endswith(".json")]
  if len(jsons) != 1:
    raise PrepareError(f"terra_incognita: expected one annotation .json in the archives, found {len(jsons)}")
  try:
    data = json.loads(bounded.read_capped(jsons[0], MAX_JSON_BYTES))
    names = {c["id"]: c["name"] for c in data["categories"]}
    by_image = {}
    for ann in data["annotations"]:
      by_image.setdefault(ann["image_id"], []).append(names[ann["category_id"]])
    todo = [(str(img["location"]), img["id"], img["file_name"]) for img in data["images"]]
  except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
    raise PrepareError(f"{jsons[0]}: not the Caltech Camera Traps annotations (categories, images, annotations) "
                       f"({type(e).__name__}: {' '.join(str(e).split())})") from None
  images = _top(tmp, "eccv_18_all_images_sm")
  for loc, image_id, file_name in todo:
    for cat in by_image.get(image_id, ()):
      if loc in locations and cat in categories:
        out = os.path.join(dest, f"location_{loc}", cat)
        os.makedirs(out, exist_ok=True)
        where = f"{jsons[0]}: image {image_id!r}"
        shutil.copyfile(bounded.inside(images, str(file_name), where), bounded.inside(out, str(file_name), where))


def prepare(name: str, root: str, archives: list[str] | None = None, dest: str | None = None) -> str:
  """Unpacks a dataset's release archives into its folder and writes the folder's manifest.

  Args:
    name: the dataset (`SOURCES`).
    root: the folder the archives are read from (under their release file names) when
      `archives` is not given.
    archives: the archives' paths, else those in `root`.
    dest: the dataset folder, default `root/<folder>`; it must be absent or empty.

  Returns:
    The dataset folder.

  Raises:
    PrepareError: one line naming the archive or folder and what is wrong.
  """
  spec = source(name)
  paths = archives or [os.path.join(root, a.filename) for a in spec.archives]
  published = {a.filename: a for a in spec.archives}
  for p in paths:  # a regular file each (not a link to a device), with the release's size and SHA-256 where published
    if os.path.lexists(p):
      bounded.regular_file(p)
    if os.path.basename(p) in published or not archives:
      check_archive(published.get(os.path.basename(p), spec.archives[paths.index(p)]), p)
  dest = dest or os.path.join(root, spec.folder)
  if os.path.exists(dest) and os.listdir(dest):
    raise PrepareError(f"{dest}: exists and is not empty; remove it or verify it")
  work = os.path.dirname(os.path.normpath(dest)) or "."  # beside the dataset folder: a rename moves it in
  os.makedirs(work, exist_ok=True)
  if spec.unpack == "copy":
    os.makedirs(dest, exist_ok=True)
    for p in paths:
      shutil.copyfile(p, os.path.join(dest, os.path.basename(p)))
  else:
    tmp = tempfile.mkdtemp(dir=work, prefix=".unpack-")
    try:
      for p in paths:
        if not os.path.isfile(p):
          raise PrepareError(f"{p}: no such archive")
        unpack_archive(p, tmp)
      if spec.unpack == "terra_incognita":
        _terra_incognita(tmp, dest, spec)
      elif spec.unpack == "leaf":
        os.makedirs(dest, exist_ok=True)
        for part in ("train", "test"):
          shutil.move(_top(tmp, part), os.path.join(dest, part))
      else:
        shutil.move(find_dataset_folder(tmp, spec, paths), dest)
    finally:
      shutil.rmtree(tmp, ignore_errors=True)
  write_manifest(dest)
  return dest


def _files(folder: str) -> list[str]:
  out = []
  for d, dirs, fs in os.walk(folder):
    dirs[:] = sorted(x for x in dirs if x not in IGNORED)
    out += [os.path.relpath(os.path.join(d, f), folder) for f in sorted(fs) if f not in IGNORED]
  return out


def write_manifest(folder: str) -> None:
  manifest = {f: [os.path.getsize(os.path.join(folder, f)), sha256(os.path.join(folder, f))] for f in _files(folder)}
  with open(os.path.join(folder, MANIFEST), "w") as f:
    json.dump(manifest, f, indent=0, sort_keys=True)


def _unreadable(path: str, folder: str) -> str | None:
  """Why `path` is not read at all (a link out of `folder`, a FIFO, a device), or None."""
  try:
    bounded.regular_file(path, folder)
  except bounded.UntrustedFileError as e:
    return str(e)[len(path) + 2:]
  return None


def _corrupt(path: str) -> str | None:
  """Why a file cannot be read (an image that does not decode, a CSV or JSON that does not
  parse, an IDX file whose header disagrees with its length), or None. Every file is read
  with a byte cap; a missing Pillow raises `PrepareError` (one line for the whole check)."""
  low = path.lower()
  try:
    if low.endswith(IMAGE_EXTENSIONS):
      try:
        from PIL import Image
      except ImportError:
        raise PrepareError(PIL_MISSING) from None
      with Image.open(path) as im:
        im.load()
    elif low.endswith(".json"):
      json.loads(bounded.read_capped(path, MAX_JSON_BYTES))
    elif low.endswith(".csv"):
      return _csv_error(path)
    elif "idx" in low and "-ubyte" in low:
      return _idx_error(path)
  except PrepareError:
    raise
  except Exception as e:  # pylint: disable=broad-except  # any failure to read is the answer
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text[len(path) + 2:] if text.startswith(path + ': ') else text}".rstrip(": ")
  return None


def _csv_error(path: str) -> str | None:
  """Rows of different lengths or an empty table; the rows are streamed, never held."""
  import csv
  widths = set()
  with open(path, newline="", encoding="utf-8-sig") as f:
    for row in csv.reader(f):
      if row:
        widths.add(len(row))
        if len(widths) > 1:
          return "rows of different lengths"
  return None if widths else "rows of different lengths"


def _idx_error(path: str) -> str | None:
  """The IDX loader's own one-line refusal (a gzipped file is inflated no further than its
  header declares, and a header declaring too much is refused before inflating)."""
  from fedjax_dg.data import idx
  try:
    idx.read_idx(path)
  except ValueError as e:
    text = str(e)
    return text[len(path) + 2:] if text.startswith(path + ": ") else text
  return None


def _manifest(path: str) -> dict:
  """The manifest: relative path -> [size, SHA-256]; anything else is one line."""
  try:
    manifest = json.loads(bounded.read_capped(path, MAX_MANIFEST_BYTES))
  except (ValueError, RecursionError) as e:
    raise PrepareError(f"{path}: not a manifest written by prepare ({type(e).__name__}: "
                       f"{' '.join(str(e).split())}); remove it to verify without one") from None
  if not isinstance(manifest, dict):
    raise PrepareError(f"{path}: not a manifest written by prepare (a {type(manifest).__name__}, not an object "
                       "of file -> [size, SHA-256]); remove it to verify without one")
  for f, entry in manifest.items():
    if not (isinstance(entry, list) and len(entry) == 2 and type(entry[0]) is int and entry[0] >= 0
            and isinstance(entry[1], str) and len(entry[1]) == 64):
      raise PrepareError(f"{path}: entry {f!r} is {json.dumps(entry)[:80]}, not [size, SHA-256]; remove the "
                         "manifest to verify without one")
  return manifest


@dataclasses.dataclass
class Report:
  missing: list[str] = dataclasses.field(default_factory=list)
  extra: list[str] = dataclasses.field(default_factory=list)
  corrupt: list[str] = dataclasses.field(default_factory=list)
  counts: dict = dataclasses.field(default_factory=dict)

  @property
  def ok(self) -> bool:
    return not (self.missing or self.extra or self.corrupt)

  def line(self, name: str, folder: str) -> str:
    if self.ok:
      counts = ", ".join(f"{d} {n}" for d, n in self.counts.items())
      return f"verify {name}: ok: {folder}" + (f" ({counts})" if counts else "")
    parts = [f"{len(v)} {k} ({'; '.join(v[:5])}{'; ...' if len(v) > 5 else ''})"
             for k, v in (("missing", self.missing), ("extra", self.extra), ("corrupt", self.corrupt)) if v]
    return f"verify {name}: FAILED: {folder}: " + ", ".join(parts)


def verify(name: str, root: str, fast: bool = False, folder: str | None = None) -> Report:
  """What is missing, extra or corrupt in a dataset folder (see the module docstring).

  Args:
    name: the dataset (`SOURCES`).
    root: the folder holding the dataset folder.
    fast: compare sizes only with the manifest, no SHA-256 of every file.
    folder: the dataset folder, default `root/<folder>`.

  Returns:
    The `Report`: missing, extra and corrupt files, and the image count per domain.
  """
  spec = source(name)
  folder = folder or os.path.join(root, spec.folder)
  rep = Report()
  if not os.path.isdir(folder):
    how = f"--root {root}" if folder == os.path.join(root, spec.folder) else f"--data-root {folder}"
    rep.missing.append(f"{folder}/ (run: python -m fedjax_dg.data.prepare {name} {how})")
    return rep
  present = set(_files(folder))
  unread = {f: why for f in sorted(present) if (why := _unreadable(os.path.join(folder, f), folder))}
  rep.corrupt += [f"{f}: {why}" for f, why in unread.items()]
  manifest_path = os.path.join(folder, MANIFEST)
  if os.path.exists(manifest_path):
    manifest = _manifest(manifest_path)
    rep.missing += sorted(set(manifest) - present)
    rep.extra += sorted(present - set(manifest))
    for f in sorted(present & set(manifest) - set(unread)):
      size, digest = manifest[f]
      p = os.path.join(folder, f)
      if os.path.getsize(p) != size:
        rep.corrupt.append(f"{f}: {os.path.getsize(p)} bytes, {size} unpacked")
      elif not fast and sha256(p) != digest:
        rep.corrupt.append(f"{f}: SHA-256 differs from the unpacked file's")
  for r in spec.required:
    if not os.path.exists(os.path.join(folder, r)) and r not in rep.missing:
      rep.missing.append(r)
  for domain, want in spec.domains:
    have = sum(1 for f in present if f.startswith(domain + os.sep) and f.lower().endswith(IMAGE_EXTENSIONS))
    rep.counts[domain] = have
    if want is None:
      if not have:
        rep.missing.append(f"the images of domain {domain}")
    elif have < want:
      rep.missing.append(f"{want - have} of {want} images of domain {domain}")
    elif have > want:
      rep.extra.append(f"{have - want} images beyond the {want} of domain {domain}")
  known = {f.split(": ")[0] for f in rep.corrupt}
  for f in sorted(present):
    why = None if f in known else _corrupt(os.path.join(folder, f))
    if why:
      rep.corrupt.append(f"{f}: {why}")
  return rep


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m fedjax_dg.data.prepare", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog="datasets: " + ", ".join(SOURCES))
  p.add_argument("name", help="a dataset, or 'verify' / 'list'")
  p.add_argument("dataset", nargs="?", help="after 'verify': the dataset")
  p.add_argument("--root", help="the folder holding the archives; the dataset is unpacked into ROOT/<folder> "
                 "(the dataset folder itself is accepted too, see above)")
  p.add_argument("--data-root", metavar="DIR", help="the dataset folder itself, as the config's data.root "
                 "(data.path for MNIST formats); the archives are read from its parent")
  p.add_argument("--archive", action="append", help="an archive to unpack (repeat for several)")
  p.add_argument("--download", action="store_true", help="fetch the archives from their official URLs first")
  p.add_argument("--fast", action="store_true", help="verify: sizes only, no SHA-256 of every file")
  return p


def _list() -> str:
  rows = []
  for s in SOURCES.values():
    counts = ", ".join(f"{d} {n if n is not None else '(count not published)'}" for d, n in s.domains)
    rows.append(f"{s.name:16s} -> <root>/{s.folder}  configs/{', configs/'.join(s.configs)}"
                + (f"\n{'':20s}per domain: {counts}" if counts else "") + (f"\n{'':20s}{s.note}" if s.note else "")
                + "".join(f"\n{'':20s}{a.url}" + (f" ({a.size:,} bytes)" if a.size else "") for a in s.archives))
  return "\n".join(rows)


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  try:
    if args.name == "list":
      print(_list())
      return 0
    if args.name == "verify" and not args.dataset:
      raise PrepareError("verify: name the dataset, e.g. verify pacs --root DIR")
    name = args.dataset if args.name == "verify" else args.name
    place = resolve_root(name, args.root, args.data_root, existing=args.name == "verify")
    if place.note:
      print(f"note: {place.note}", file=sys.stderr)
    if args.name == "verify":
      rep = verify(name, place.parent, args.fast, place.folder)
      print(rep.line(name, place.folder))
      return 0 if rep.ok else 1
    if args.download:
      download(source(name), place.parent)
    dest = prepare(name, place.parent, args.archive, place.folder)
    rep = verify(name, place.parent, True, dest)
    print(f"prepared {name} in {dest}\n" + rep.line(name, dest))
    return 0 if rep.ok else 1
  except (PrepareError, bounded.UntrustedFileError, OSError) as e:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
