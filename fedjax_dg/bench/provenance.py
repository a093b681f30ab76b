"""What produced a run: package versions and the project's git commit. The runner can record it in summary.json (`"provenance": provenance()`);
collect's CSV reads it when present."""
from __future__ import annotations

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
  """{"commit": HEAD's sha, "dirty": uncommitted changes to tracked files} of the checkout
  holding `path` (default: this package), or Nones outside a git checkout."""
  if path is None:
    import fedjax_dg
    path = os.path.dirname(os.path.dirname(os.path.abspath(fedjax_dg.__file__)))
  git = lambda *a: subprocess.run(["git", "-C", path, *a], capture_output=True, text=True, timeout=30)
  try:
    head = git("rev-parse", "HEAD")
  except (OSError, subprocess.SubprocessError):
    return {"commit": None, "dirty": None}
  if head.returncode != 0:
    return {"commit": None, "dirty": None}
  status = git("status", "--porcelain", "--untracked-files=no")
  return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def machine() -> dict:
  """The machine a run ran on: OS and processor, and the CPU cores this process may use."""
  import platform
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
          "cpu_count": os.cpu_count(), "usable_cores": cores}


def provenance() -> dict:
  return {"versions": versions(), "git": git_state(), "machine": machine()}
