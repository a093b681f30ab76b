"""The readers of files a user was handed (`fedjax_dg.bounded`, `data.prepare`, `verify`,
the WILDS tables): archives refused from what they declare before anything is extracted,
streams capped, links and special members refused, paths kept inside the dataset folder.
The hostile files are written here, small: archives that declare large members, streams
that inflate far past their size. The command-line cases run under an address-space cap
(`MEMORY_CAP`) and must answer in one line within it."""
import gzip
import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib

import numpy as np
import pytest

import helpers
from fedjax_dg import bounded
from fedjax_dg.data import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMORY_CAP = 1 << 30  # RLIMIT_AS of the command-line cases: a 3 GiB member cannot be held within it
GIB3 = 3 << 30


# ---------------------------------------------------------------------------- hostile files

def zip_declaring(path, name: str, declared: int, data: bytes = bytes(1024)) -> str:
  """A zip of one deflated member whose headers declare `declared` bytes (it holds `data`)."""
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr(name, data)
  raw = bytearray(open(path, "rb").read())
  for sig, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):  # local header, central directory
    at = raw.index(sig)
    raw[at + offset:at + offset + 4] = struct.pack("<I", declared)
  open(path, "wb").write(bytes(raw))
  return str(path)


def zeros_zip(path, name: str, size: int) -> str:
  """A genuine zip of `size` zero bytes (deflate shrinks them about 1000 times)."""
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z, z.open(name, "w", force_zip64=True) as f:
    chunk = bytes(1 << 20)
    for _ in range(size >> 20):
      f.write(chunk)
  return str(path)


def gzip_of_zeros(path, head: bytes, mib: int) -> str:
  """A genuine gzip file of `head` followed by `mib` MiB of zero bytes (about 1 KB per MiB).
  Each MiB is deflated once and its bytes repeated: a full flush after every MiB resets the
  compressor, so every MiB compresses to the same bytes (compressing 1 GiB at level 9 took
  6 s of CPU, this takes a few tenths)."""
  co = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: the gzip header and trailer are written here
  zeros = bytes(1 << 20)
  start = co.compress(head) + co.flush(zlib.Z_FULL_FLUSH)
  chunk = co.compress(zeros) + co.flush(zlib.Z_FULL_FLUSH)
  crc = zlib.crc32(head)
  for _ in range(mib):
    crc = zlib.crc32(zeros, crc)
  with open(path, "wb") as f:
    f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + start)  # deflate, no name, mtime 0, best compression
    for _ in range(mib):
      f.write(chunk)
    f.write(co.flush() + struct.pack("<II", crc, (len(head) + (mib << 20)) & 0xFFFFFFFF))
  return str(path)


def tar_gz_declaring(path, name: str, declared: int, data: bytes = bytes(1024)) -> str:
  """A tar.gz whose one member's header declares `declared` bytes, followed by `data` only."""
  info = tarfile.TarInfo(name)
  info.size = declared
  with gzip.open(path, "wb") as g:
    g.write(info.tobuf(format=tarfile.GNU_FORMAT) + data)
  return str(path)


def tar_gz_of(path, members) -> str:
  """A tar.gz of `members`: (TarInfo, bytes or None)."""
  with tarfile.open(path, "w:gz") as t:
    for info, data in members:
      t.addfile(info, io.BytesIO(data) if data is not None else None)
  return str(path)


def special(name: str, kind) -> tarfile.TarInfo:
  info = tarfile.TarInfo(name)
  info.type = kind
  if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
    info.devmajor, info.devminor = 1, 5  # /dev/zero's numbers
  return info


def regular(name: str, data: bytes):
  info = tarfile.TarInfo(name)
  info.size = len(data)
  return info, data


def capped(argv) -> list:
  """`argv` run under `MEMORY_CAP` (bash's `ulimit -v`: RLIMIT_AS, in KiB), without a
  preexec function (a fork of this multithreaded process)."""
  return ["bash", "-c", f'ulimit -v {MEMORY_CAP >> 10} && exec "$@"', "bash", *argv]


def prepare_cli(*args):
  """`python -m fedjax_dg.data.prepare ARGS` under `MEMORY_CAP`: (exit status, stdout, stderr)."""
  env = dict(os.environ, PYTHONPATH=helpers.pythonpath(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
  out = subprocess.run(capped([sys.executable, "-m", "fedjax_dg.data.prepare", *args]), env=env,
                       capture_output=True, text=True, timeout=300)
  return out.returncode, out.stdout, out.stderr


def _error_line(args) -> str:
  code, _, err = prepare_cli(*args)
  assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), (code, err[-3000:])
  return err.strip()


# ---------------------------------------------------------------------------- archives

def test_zip_declaring_a_3_gib_member_is_refused_before_extracting(tmp_path):
  path = zip_declaring(tmp_path / "PACS.zip", "kfold/art_painting/dog/0.png", GIB3)
  assert os.path.getsize(path) < 2000
  line = _error_line(["pacs", "--root", str(tmp_path)])
  assert f"member 'kfold/art_painting/dog/0.png' declares {GIB3} bytes from" in line and "not extracting" in line
  assert not (tmp_path / "PACS").exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".unpack")]


def test_genuine_zip_bomb_is_refused_from_its_ratio(tmp_path):
  path = zeros_zip(tmp_path / "b.zip", "VLCS/x.bin", 64 << 20)
  assert os.path.getsize(path) < 200_000
  with pytest.raises(bounded.UntrustedFileError, match=r"member 'VLCS/x.bin' declares 67108864 bytes from \d+ "
                     r"compressed \(more than 200 times\)"):
    bounded.archive_members(path, str(tmp_path / "out"))
  with pytest.raises(prepare.PrepareError, match="not extracting anything"):
    prepare.unpack_archive(path, str(tmp_path / "out"))
  assert os.listdir(tmp_path / "out") == []


def test_tar_gz_declaring_a_3_gib_member_is_refused_from_its_header(tmp_path):
  path = tar_gz_declaring(tmp_path / "VLCS.tar.gz", "VLCS/big.bin", GIB3)
  line = _error_line(["vlcs", "--root", str(tmp_path)])
  assert f"VLCS.tar.gz: its members declare {GIB3} bytes in all, more than the " in line  # at its header
  assert not (tmp_path / "VLCS").exists()


def test_many_members_summing_past_the_ratio_are_refused_in_all(tmp_path):
  members = [regular(f"VLCS/{k}.bin", bytes(4 << 20)) for k in range(8)]  # 32 MiB of zeros, each member small
  path = tar_gz_of(tmp_path / "v.tar.gz", members)
  limits = bounded.ArchiveLimits(small=8 << 20)
  allowed = 200 * os.path.getsize(path) + (8 << 20)
  first = next(k for k in range(1, 9) if k * (4 << 20) > allowed)  # refused at the header that passes it
  with pytest.raises(bounded.UntrustedFileError, match=rf"its members declare {first * (4 << 20)} bytes in all, "
                     rf"more than the {allowed} allowed for an archive of {os.path.getsize(path)} bytes"):
    bounded.archive_members(path, str(tmp_path / "out"), limits)
  assert len(bounded.archive_members(path, str(tmp_path / "out"), bounded.ArchiveLimits(ratio=2000))) == 8


def test_gzip_of_zeros_is_a_genuine_gzip_of_its_bytes(tmp_path):
  """The hostile-file helper: Python's gzip (which checks the CRC and the length) reads it
  back as the header and the zeros, and it stays about 1 KB per MiB."""
  head = b"header\x00\x01"
  path = gzip_of_zeros(tmp_path / "z.gz", head, 3)
  assert gzip.decompress(open(path, "rb").read()) == head + bytes(3 << 20)
  assert os.path.getsize(path) < 8 << 10


def test_gzip_inflating_past_the_cap_stops_at_the_cap(tmp_path):
  path = tmp_path / "z.gz"
  with gzip.open(path, "wb") as g:
    for _ in range(64):
      g.write(bytes(1 << 20))
  with pytest.raises(bounded.UntrustedFileError, match=r"z.gz: its inflated contents exceed 1048576 bytes"):
    bounded.read_capped(str(path), 1 << 20, decompress=True)
  assert bounded.read_capped(str(path), 64 << 20, decompress=True) == bytes(64 << 20)


@pytest.mark.parametrize("kind,word", [(tarfile.FIFOTYPE, "a FIFO"), (tarfile.CHRTYPE, "a device"),
                                       (tarfile.BLKTYPE, "a device"), (tarfile.SYMTYPE, "a link"),
                                       (tarfile.LNKTYPE, "a link")])
def test_special_tar_members_are_refused(tmp_path, kind, word):
  info = special("VLCS/labels.json", kind)
  if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
    info.linkname = "/dev/zero"
  path = tar_gz_of(tmp_path / "VLCS.tar.gz", [regular("VLCS/a.txt", b"a"), (info, None)])
  line = _error_line(["vlcs", "--root", str(tmp_path)])
  assert line.endswith(f"VLCS.tar.gz: member 'VLCS/labels.json' is {word}; refusing the archive")
  assert not (tmp_path / "VLCS").exists()


def test_zip_link_member_is_refused(tmp_path):
  with zipfile.ZipFile(tmp_path / "l.zip", "w") as z:
    info = zipfile.ZipInfo("PACS/labels.json")
    info.create_system = 3
    info.external_attr = (0o120777 << 16)
    z.writestr(info, "/dev/zero")
  with pytest.raises(bounded.UntrustedFileError, match="member 'PACS/labels.json' is a link; refusing the archive"):
    bounded.archive_members(str(tmp_path / "l.zip"), str(tmp_path / "out"))


def test_truncated_tar_gz_and_bad_crc_zip_are_one_line(tmp_path):
  path = tar_gz_of(tmp_path / "VLCS.tar.gz", [regular("VLCS/a.bin", np.random.default_rng(0).bytes(50_000))])
  os.truncate(path, os.path.getsize(path) - 1000)
  line = _error_line(["vlcs", "--root", str(tmp_path)])
  assert "VLCS.tar.gz: corrupt compressed data (Compressed file ended before the end-of-stream marker" in line
  os.remove(path)
  zpath = tmp_path / "PACS.zip"
  with zipfile.ZipFile(zpath, "w", zipfile.ZIP_STORED) as z:
    z.writestr("kfold/photo/dog/0.png", b"hello world, a member whose bytes change")
  raw = bytearray(zpath.read_bytes())
  raw[raw.index(b"hello")] = ord("j")  # same size, other bytes: its CRC no longer matches
  zpath.write_bytes(bytes(raw))
  line = _error_line(["pacs", "--root", str(tmp_path)])
  assert "PACS.zip: corrupt archive data (BadZipFile: Bad CRC-32 for file 'kfold/photo/dog/0.png')" in line


def test_member_paths_outside_the_folder_are_refused(tmp_path):
  path = tar_gz_of(tmp_path / "e.tar.gz", [regular("/etc/escape", b"x")])
  with pytest.raises(bounded.UntrustedFileError, match="path '/etc/escape' would land outside"):
    bounded.archive_members(path, str(tmp_path / "out"))


def test_an_archive_that_fits_extracts_exactly(tmp_path):
  data = {f"VLCS/{k}.bin": np.random.default_rng(k).bytes(1000 + k) for k in range(5)}
  path = tar_gz_of(tmp_path / "ok.tar.gz", [regular(n, d) for n, d in data.items()])
  members = bounded.extract_archive(path, str(tmp_path / "out"))
  assert sorted(m.name for m in members) == sorted(data) and sum(m.size for m in members) == 5010
  for n, d in data.items():
    assert (tmp_path / "out" / n).read_bytes() == d


# ---------------------------------------------------------------------------- verify

def _verified_civil(tmp_path):
  csv = b"id,comment_text,split,toxicity\n0,hi,train,0.1\n1,yo,test,0.9\n"
  path = tar_gz_of(tmp_path / "civil.tar.gz", [regular("civilcomments_v1.0/all_data_with_identities.csv", csv)])
  prepare.prepare("civilcomments", str(tmp_path), [path])
  return tmp_path / "civilcomments_v1.0"


def test_verify_does_not_follow_a_link_to_dev_zero(tmp_path):
  folder = _verified_civil(tmp_path)
  os.symlink("/dev/zero", folder / "labels.json")
  code, out, err = prepare_cli("verify", "civilcomments", "--root", str(tmp_path))
  assert code == 1 and out.count("\n") == 1, (code, out, err[-2000:])
  assert "labels.json: a link out of the dataset folder (to /dev/zero); not following it" in out
  os.remove(folder / "labels.json")
  os.mkfifo(folder / "fifo.json")
  code, out, err = prepare_cli("verify", "civilcomments", "--root", str(tmp_path))
  assert code == 1 and "fifo.json: a FIFO, not a regular file; not reading it" in out, (out, err[-2000:])


def test_verify_reads_a_gzipped_idx_no_further_than_its_header(tmp_path):
  folder = tmp_path / "mnist"
  folder.mkdir()
  header = bytes([0, 0, 8, 3]) + np.array((10, 28, 28), ">u4").tobytes()
  gzip_of_zeros(folder / "train-images-idx3-ubyte.gz", header, 1024)  # 7840 bytes declared, 1 GiB inflated
  assert os.path.getsize(folder / "train-images-idx3-ubyte.gz") < 2 << 20
  code, out, err = prepare_cli("verify", "mnist", "--root", str(tmp_path), "--fast")
  assert code == 1, (code, out, err[-2000:])
  assert ("train-images-idx3-ubyte.gz: IDX data size 7841 bytes does not match its header shape (10, 28, 28) "
          "(7840 bytes)") in out


@pytest.mark.parametrize("text,fragment", [
    ("garbage", "not a manifest written by prepare (JSONDecodeError: Expecting value"),
    ("[1, 2]", "not a manifest written by prepare (a list, not an object of file -> [size, SHA-256])"),
    ('{"all_data_with_identities.csv": "x"}', "entry 'all_data_with_identities.csv' is \"x\", not [size, SHA-256]"),
    ('{"all_data_with_identities.csv": [true, "' + "0" * 64 + '"]}', "is [true, "),
])
def test_a_bad_manifest_is_one_line(tmp_path, text, fragment):
  folder = _verified_civil(tmp_path)
  (folder / prepare.MANIFEST).write_text(text)
  line = _error_line(["verify", "civilcomments", "--root", str(tmp_path)])
  assert fragment in line and "remove" in line


def test_terra_incognita_annotations_of_the_wrong_shape_are_one_line(tmp_path):
  tar_gz_of(tmp_path / "eccv_18_all_images_sm.tar.gz", [regular("eccv_18_all_images_sm/a.png", b"x")])
  with zipfile.ZipFile(tmp_path / "caltech_camera_traps.json.zip", "w") as z:
    z.writestr("caltech_images_20210113.json", json.dumps({"categories": 5, "images": [], "annotations": []}))
  line = _error_line(["terra_incognita", "--root", str(tmp_path)])
  assert "caltech_images_20210113.json: not the Caltech Camera Traps annotations" in line and "TypeError" in line


def test_verify_without_pillow_names_the_extra(tmp_path, monkeypatch):
  folder = tmp_path / "PACS" / "photo" / "dog"
  folder.mkdir(parents=True)
  from PIL import Image
  Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(folder / "0.png")
  monkeypatch.setitem(sys.modules, "PIL", None)
  with pytest.raises(prepare.PrepareError) as e:
    prepare.verify("pacs", str(tmp_path))
  assert str(e.value) == 'checking images needs Pillow: pip install "fedjax-dg[data]"'


def test_idx_reader_stops_at_its_header_and_refuses_devices(tmp_path):
  from fedjax_dg.data import idx
  path = tmp_path / "train-images-idx3-ubyte"
  header = bytes([0, 0, 8, 3]) + np.array((2, 2, 2), ">u4").tobytes()
  path.write_bytes(header + bytes(8) + bytes(1 << 20))  # 8 bytes declared, 1 MiB more on disk
  with pytest.raises(ValueError, match=r"IDX data size 9 bytes does not match its header shape \(2, 2, 2\) \(8 bytes\)"):
    idx.read_idx(str(path))
  os.symlink("/dev/zero", tmp_path / "t10k-images-idx3-ubyte")
  with pytest.raises(bounded.UntrustedFileError, match="a device, not a regular file; not reading it"):
    idx.read_idx(str(tmp_path / "t10k-images-idx3-ubyte"))


def test_the_memory_cap_of_the_command_line_cases_holds():
  """The cap the cases run under is real: holding a 3 GiB member within it fails."""
  out = subprocess.run(capped([sys.executable, "-c", "bytearray(3 << 30)"]), capture_output=True, text=True,
                       timeout=60)
  assert out.returncode != 0 and "MemoryError" in out.stderr
