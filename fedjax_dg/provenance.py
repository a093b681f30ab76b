"""What produced a run: package versions, the machine, the project's git commit (and whether
the tree was clean) and a fingerprint of the package's source. The runner records it in
summary.json (`"provenance": provenance()`); the benchmark layer reads it: a finished job
whose source fingerprint differs from the current code's is *stale* (`bench status`), and
`collect` / `report` refuse stale jobs unless told otherwise."""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import subprocess

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml-collections")


def versions(packages=PACKAGES) -> dict:
  """Installed version of each distribution (None where it is not installed)."""
  out = {}
  for p in packages:
    try:
      out[p] = importlib.metadata.version(p)
    except importlib.metadata.PackageNotFoundError:
      out[p] = None
  return out


def git_state(path: str | None = None) -> dict:
  """{"commit": HEAD's sha, "dirty": uncommitted changes to tracked files, "package_clean": no
  change and no untracked file under fedjax_dg/} of the checkout holding `path` (default:
  this package), or Nones outside a git checkout."""
  if path is None:
    import fedjax_dg
    path = os.path.dirname(os.path.dirname(os.path.abspath(fedjax_dg.__file__)))
  git = lambda *a: subprocess.run(["git", "-C", path, *a], capture_output=True, text=True, timeout=30)
  try:
    head = git("rev-parse", "HEAD")
  except (OSError, subprocess.SubprocessError):
    return {"commit": None, "dirty": None, "package_clean": None}
  if head.returncode != 0:
    return {"commit": None, "dirty": None}
  status = git("status", "--porcelain", "--untracked-files=no")
  package = git("status", "--porcelain", "--", "fedjax_dg")  # untracked source counts here
  return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None,
          "package_clean": (not package.stdout.strip()) if package.returncode == 0 else None}


def machine() -> dict:
  """The machine a run ran on: OS and processor, and the CPU cores this process may use."""
  import platform
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
          "cpu_count": os.cpu_count(), "usable_cores": cores}


def package_dir() -> str:
  import fedjax_dg
  return os.path.dirname(os.path.abspath(fedjax_dg.__file__))


# The benchmark layer's readers: they only read finished runs (tables, figures, the report),
# so a change to them does not make a run's numbers stale. Everything else under fedjax_dg/,
# the sweep expansion and the launcher included, enters the fingerprint.
READERS = ("bench/cli.py", "bench/collect.py", "bench/difficulty.py", "bench/figures.py", "bench/report.py",
           "bench/results.py", "bench/runs.py", "bench/stats.py")


def fingerprint_of(root: str, skip: tuple = READERS) -> dict:
  """sha256 over every `.py` file under `root` but those in `skip` (its path relative to
  `root`, then its bytes, in sorted path order), and how many files it covers. Caches
  (`__pycache__`) and other file types do not enter: the fingerprint changes exactly when
  the Python source that produces a run changes."""
  h, n = hashlib.sha256(), 0
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
    for name in sorted(f for f in filenames if f.endswith(".py")):
      path = os.path.join(dirpath, name)
      rel = os.path.relpath(path, root).replace(os.sep, "/")
      if rel in skip:
        continue
      with open(path, "rb") as f:
        data = f.read()
      h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
      n += 1
  return {"sha256": h.hexdigest(), "files": n}


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> dict:
  """`fingerprint_of` this package's directory (without the benchmark layer's readers),
  computed once per process (the code a process imported does not change under it)."""
  return fingerprint_of(package_dir())


def provenance() -> dict:
  return {"versions": versions(), "git": git_state(), "machine": machine(), "source": source_fingerprint()}


def recorded_fingerprint(summary: dict) -> str | None:
  """The source fingerprint a run's summary records (None: the run predates fingerprints)."""
  return ((summary.get("provenance") or {}).get("source") or {}).get("sha256")
