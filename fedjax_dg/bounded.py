"""Reading files a user was handed without trusting what they hold.

Every reader here streams with a byte cap, so a file (or a compressed stream) larger than
the cap is refused once the cap is passed, never read whole first; archives are checked
from their declared sizes (each member, their total, and the inflation ratio over the
archive's own size) before anything is extracted; links, devices and FIFOs are refused,
and member paths must stay inside the folder they unpack into. Each refusal is one
`UntrustedFileError` line naming the file.
"""
from __future__ import annotations

import bz2
import dataclasses
import gzip
import io
import lzma
import os
import shutil
import stat
import tarfile
import zipfile
import zlib

GiB = 1 << 30
MiB = 1 << 20


class UntrustedFileError(ValueError):
  """A file larger than allowed, or not what it claims to be (one line naming it)."""


# ---------------------------------------------------------------------------- paths

def inside(folder: str, relative: str, what: str) -> str:
  """`folder/relative`, refusing a path that leaves `folder` (`..`, an absolute path).

  The check is on the path as written, not on where links lead, so a dataset folder whose
  images are a link to another disk still works.

  Args:
    folder: the folder the path must stay in.
    relative: the path read from a file (a table row, an archive member).
    what: where `relative` was read, for the message.

  Returns:
    The joined, normalised path.

  Raises:
    UntrustedFileError: when the path leaves `folder`.
  """
  base = os.path.normpath(folder)
  target = os.path.normpath(os.path.join(base, relative))
  if target != base and not target.startswith(base.rstrip(os.sep) + os.sep):
    raise UntrustedFileError(f"{what}: path {relative!r} would land outside {folder}; refusing it")
  return target


def regular_file(path: str, folder: str | None = None) -> str:
  """`path`, when it is a regular file; with `folder`, a link must lead inside it.

  Args:
    path: the file to read.
    folder: when given, the folder a link at `path` may point into.

  Returns:
    `path`.

  Raises:
    UntrustedFileError: for a link out of `folder`, a FIFO, a device or a folder.
    FileNotFoundError: when nothing is there.
  """
  if folder is not None and os.path.islink(path):
    real, base = os.path.realpath(path), os.path.realpath(folder)
    if not real.startswith(base.rstrip(os.sep) + os.sep):
      raise UntrustedFileError(f"{path}: a link out of the dataset folder (to {real}); not following it")
  try:
    mode = os.stat(path).st_mode
  except FileNotFoundError:
    if os.path.islink(path):
      raise UntrustedFileError(f"{path}: a link to nothing (to {os.readlink(path)})") from None
    raise
  if not stat.S_ISREG(mode):
    kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "not a regular file")
    raise UntrustedFileError(f"{path}: {kind}, not a regular file; not reading it")
  return path


# ---------------------------------------------------------------------------- streams

class Capped(io.RawIOBase):
  """A read-only stream over `raw` that refuses to produce more than `cap` bytes."""

  def __init__(self, raw, cap: int, name: str, what: str = "its contents"):
    super().__init__()
    self._raw, self.cap, self.name, self._what, self.count = raw, int(cap), name, what, 0

  def readable(self) -> bool:
    return True

  def readinto(self, b) -> int:
    try:
      data = self._raw.read(min(len(b), self.cap + 1 - self.count))
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as e:
      raise UntrustedFileError(f"{self.name}: corrupt compressed data ({' '.join(str(e).split())})") from None
    self.count += len(data)
    if self.count > self.cap:
      raise UntrustedFileError(f"{self.name}: {self._what} exceed {self.cap} bytes, the cap on this file; "
                               "not reading further")
    b[:len(data)] = data
    return len(data)

  def close(self) -> None:
    try:
      self._raw.close()
    finally:
      super().close()


def _decompressor(path: str, f):
  """`f` itself, or a decompressing stream over it when `path` starts with gzip, bzip2 or
  xz magic bytes."""
  magic = f.read(6)
  f.seek(0)
  if magic[:2] == b"\x1f\x8b":
    return gzip.GzipFile(fileobj=f, mode="rb")
  if magic[:3] == b"BZh":
    return bz2.BZ2File(f, "rb")
  if magic == b"\xfd7zXZ\x00":
    return lzma.LZMAFile(f, "rb")
  return f


def open_capped(path: str, cap: int, folder: str | None = None, decompress: bool = False) -> io.BufferedReader:
  """A buffered stream of `path` that raises once more than `cap` bytes come out of it.

  Args:
    path: a regular file (see `regular_file`).
    cap: the most bytes the stream may produce (after decompression, with `decompress`).
    folder: see `regular_file`.
    decompress: inflate gzip, bzip2 or xz data, recognised by its magic bytes.

  Returns:
    A binary stream; reading past `cap` raises `UntrustedFileError`.

  Raises:
    UntrustedFileError: see `regular_file`.
  """
  regular_file(path, folder)
  f = open(path, "rb")  # pylint: disable=consider-using-with  # closed with the returned stream
  raw = _decompressor(path, f) if decompress else f
  what = "its inflated contents" if raw is not f else "its contents"
  return io.BufferedReader(Capped(raw, cap, path, what), buffer_size=1 << 16)


def read_capped(path: str, cap: int, folder: str | None = None, decompress: bool = False) -> bytes:
  """The bytes of `path` (inflated with `decompress`), at most `cap` of them.

  Args:
    path: the file.
    cap: the most bytes allowed.
    folder: see `regular_file`.
    decompress: see `open_capped`.

  Returns:
    The bytes.

  Raises:
    UntrustedFileError: past `cap`, or for a file that is not a regular one.
  """
  with open_capped(path, cap, folder, decompress) as f:
    return f.read()


def capped_lines(path: str, cap: int, line_cap: int, decompress: bool = True):
  """Yields `(line number, bytes)` of `path`, each line at most `line_cap` bytes and all of
  them at most `cap` (inflated), without holding more than one line.

  Args:
    path: the file.
    cap: the most bytes the whole file may inflate to.
    line_cap: the most bytes of one line.
    decompress: see `open_capped`.

  Yields:
    `(number from 1, the line without its newline)`.

  Raises:
    UntrustedFileError: for a line longer than `line_cap` or a file past `cap`.
  """
  with open_capped(path, cap, decompress=decompress) as f:
    for number in range(1, 1 << 62):
      line = f.readline(line_cap + 1)
      if not line:
        return
      if len(line) > line_cap and not (len(line) == line_cap + 1 and line.endswith(b"\n")):
        raise UntrustedFileError(f"{path}: line {number} is longer than {line_cap} bytes, the cap on one line; "
                                 "not reading it")
      yield number, line.rstrip(b"\n")


# ---------------------------------------------------------------------------- archives

@dataclasses.dataclass(frozen=True)
class ArchiveLimits:
  """What an archive may declare: bytes per member and in all, members, and how many times
  its own size its members may inflate to (`ratio`; members under `small` bytes are exempt
  one by one, and the total may exceed the ratio by `small`)."""
  member: int = 64 * GiB
  total: int = 1024 * GiB
  members: int = 1_000_000
  ratio: float = 200.0
  small: int = 16 * MiB


@dataclasses.dataclass(frozen=True)
class Member:
  name: str
  size: int
  kind: str  # "file" | "dir"


def _mode_kind(mode: int) -> str:
  if stat.S_ISLNK(mode):
    return "a link"
  if stat.S_ISFIFO(mode):
    return "a FIFO"
  if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
    return "a device"
  if stat.S_ISSOCK(mode):
    return "a socket"
  return ""


def _check_member(path: str, name: str, size: int, compressed: int | None, limits: ArchiveLimits) -> None:
  if size > limits.member:
    raise UntrustedFileError(f"{path}: member {name!r} declares {size} bytes, more than the {limits.member} "
                             "allowed for one member; not extracting anything")
  if compressed is not None and size > limits.small and size > limits.ratio * max(compressed, 1):
    raise UntrustedFileError(f"{path}: member {name!r} declares {size} bytes from {compressed} compressed "
                             f"(more than {limits.ratio:g} times); not extracting anything")


def _allowed_total(path: str, limits: ArchiveLimits) -> int:
  return min(limits.total, int(limits.ratio * os.path.getsize(path) + limits.small))


def _check_total(path: str, count: int, total: int, limits: ArchiveLimits) -> None:
  if count > limits.members:
    raise UntrustedFileError(f"{path}: more than {limits.members} members; not extracting anything")
  if total > _allowed_total(path, limits):
    raise UntrustedFileError(f"{path}: its members declare {total} bytes in all, more than the "
                             f"{_allowed_total(path, limits)} allowed for an archive of {os.path.getsize(path)} "
                             "bytes; not extracting anything")


def _zip_members(path: str, dest: str, limits: ArchiveLimits) -> list[Member]:
  out = []
  with zipfile.ZipFile(path) as z:
    for info in z.infolist():
      inside(dest, info.filename, f"{path}: member {info.filename!r}")
      kind = _mode_kind(info.external_attr >> 16) if info.create_system == 3 else ""
      if kind:
        raise UntrustedFileError(f"{path}: member {info.filename!r} is {kind}; refusing the archive")
      _check_member(path, info.filename, info.file_size, info.compress_size, limits)
      out.append(Member(info.filename, 0 if info.is_dir() else info.file_size, "dir" if info.is_dir() else "file"))
  _check_total(path, len(out), sum(m.size for m in out), limits)
  return out


def _tar_stream(path: str, limits: ArchiveLimits):
  """The archive's (decompressed) tar stream, capped at what its size allows it to inflate to."""
  return open_capped(path, _allowed_total(path, limits) + 1024 * (limits.members + 2), decompress=True)


def _tar_member(path: str, dest: str, m: tarfile.TarInfo, limits: ArchiveLimits) -> Member:
  inside(dest, m.name, f"{path}: member {m.name!r}")
  if m.issym() or m.islnk():
    raise UntrustedFileError(f"{path}: member {m.name!r} is a link; refusing the archive")
  if not (m.isfile() or m.isdir()):
    kind = "a FIFO" if m.isfifo() else "a device" if (m.ischr() or m.isblk()) else "not a file or folder"
    raise UntrustedFileError(f"{path}: member {m.name!r} is {kind}; refusing the archive")
  _check_member(path, m.name, m.size, None, limits)
  return Member(m.name, m.size, "dir" if m.isdir() else "file")


def _tar_members(path: str, dest: str, limits: ArchiveLimits) -> list[Member]:
  """The members, each refused at its header (before its data is read), and the running
  total refused as soon as it passes what the archive's size allows."""
  out, total = [], 0
  with _tar_stream(path, limits) as stream, tarfile.open(fileobj=stream, mode="r|") as t:
    for m in t:
      out.append(_tar_member(path, dest, m, limits))
      total += out[-1].size
      _check_total(path, len(out), total, limits)
      t.members.clear()  # stream mode keeps every header read; these are checked already
  return out


def archive_members(path: str, dest: str, limits: ArchiveLimits = ArchiveLimits()) -> list[Member]:
  """The members of a zip or tar (plain, gzip, bzip2, xz) archive, each checked from what
  the archive declares, before anything is extracted.

  Args:
    path: the archive.
    dest: the folder it would unpack into (member paths must stay inside it).
    limits: the caps.

  Returns:
    The members, in archive order.

  Raises:
    UntrustedFileError: a member too large, inflating too many times its compressed size,
      a link, FIFO or device, a path out of `dest`; too many members or bytes in all; a
      file that is not a readable archive (truncated, corrupt).
  """
  regular_file(path)
  try:
    if zipfile.is_zipfile(path):
      members = _zip_members(path, dest, limits)
    else:
      members = _tar_members(path, dest, limits)
  except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError) as e:
    raise UntrustedFileError(f"{path}: not a readable zip or tar archive ({type(e).__name__}: "
                             f"{' '.join(str(e).split()) or 'truncated'})") from None
  except OSError as e:
    raise UntrustedFileError(f"{path}: cannot read the archive ({type(e).__name__}: {' '.join(str(e).split())})") from None
  return members


def extract_archive(path: str, dest: str, limits: ArchiveLimits = ArchiveLimits()) -> list[Member]:
  """Checks `path` (`archive_members`) and the free space under `dest`, then extracts it.

  Args:
    path: the archive.
    dest: the folder to unpack into (created).
    limits: the caps.

  Returns:
    The members extracted.

  Raises:
    UntrustedFileError: see `archive_members`; also when the members declare more bytes
      than `dest` has free, and for data that turns out corrupt while extracting (a bad
      CRC, a stream cut short).
  """
  os.makedirs(dest, exist_ok=True)
  members = archive_members(path, dest, limits)
  need, free = sum(m.size for m in members), _free_bytes(dest)
  if need > free:
    raise UntrustedFileError(f"{path}: its members declare {need} bytes, {dest} has {free} free; make room first")
  try:
    if zipfile.is_zipfile(path):
      with zipfile.ZipFile(path) as z:
        z.extractall(dest)
    else:
      with _tar_stream(path, limits) as stream, tarfile.open(fileobj=stream, mode="r|") as t:
        for m in t:
          _tar_member(path, dest, m, limits)
          t.extract(m, dest, filter="data")
          t.members.clear()
  except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError) as e:
    raise UntrustedFileError(f"{path}: corrupt archive data ({type(e).__name__}: "
                             f"{' '.join(str(e).split()) or 'truncated'})") from None
  return members


def _free_bytes(folder: str) -> int:
  return shutil.disk_usage(folder).free
