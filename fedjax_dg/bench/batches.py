"""A sweep's jobs in batches: runs that may share one compiled program (equal
`fedjax_dg.batch.static_key`) run together, as many as a memory budget and a size cap allow.

  group      jobs by static key, in sweep order; a job whose key cannot be computed (an
             invalid config) is set apart with its error, to be recorded failed alone
  units      each group cut into pieces of at most `max_runs` jobs, the largest pieces
             halved until every worker has one (the launcher's units of work)
  split      a unit's jobs into batches whose estimated bytes (`batch.run_bytes`) fit the
             budget (done where the batch runs, so the budget is that machine's)
  Memory     the budget: bytes (`4G`, `512M`, `3e9`) or a share of the device's memory
             (`50%`): a GPU's memory limit, or the host's RAM on CPU; the default share is
             `DEFAULT_SHARE`, divided among the workers that share the device

A batch never mixes static keys; a job too large for the budget alone runs as a batch of one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re

from fedjax_dg.bench.sweep import SweepError

DEFAULT_SHARE = 0.5   # of the device's memory, for all of this machine's workers together
DEFAULT_MAX_RUNS = 64

_UNITS = {"": 1, "b": 1, "k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30, "t": 2 ** 40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_SHARE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*%\s*$")


@dataclasses.dataclass(frozen=True)
class Memory:
  """A batch's memory budget: `nbytes`, or `share` of the device's memory (0 < share <= 1)."""
  nbytes: int | None = None
  share: float | None = None

  def budget(self, device_bytes: int, workers: int = 1) -> int:
    """Bytes one batch may use when `workers` batches share a device of `device_bytes`."""
    if self.nbytes is not None:
      return self.nbytes
    share = DEFAULT_SHARE if self.share is None else self.share
    return int(share * device_bytes / max(1, workers))

  def describe(self) -> str:
    if self.nbytes is not None:
      return f"{self.nbytes / 2 ** 30:.3g} GiB per batch"
    share = DEFAULT_SHARE if self.share is None else self.share
    return f"{100 * share:g}% of the device's memory"


def parse_memory(text, flag: str = "--batch-memory") -> Memory:
  """`text` (None or "" for the default share; "4G", "512MiB", "3e9", "1024"; "50%") as a
  `Memory`; one line naming the flag for anything else."""
  if text is None or str(text).strip() == "":
    return Memory()
  text = str(text)
  m = _SHARE.match(text)
  if m:
    share = float(m.group(1)) / 100
    if not 0 < share <= 1:
      raise SweepError(f"{flag}: a share of the device's memory must lie in (0%, 100%], got {text!r}")
    return Memory(share=share)
  if text.strip().startswith("-"):
    raise SweepError(f"{flag} must be > 0, got {text!r}")
  m = _SIZE.match(text)
  if not m:
    raise SweepError(f"{flag}: cannot read {text!r} as a size; give bytes with an optional unit "
                     "(e.g. 4G, 512M, 3e9) or a share of the device's memory (e.g. 50%)")
  nbytes = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
  if nbytes < 1:
    raise SweepError(f"{flag} must be > 0, got {text!r}")
  return Memory(nbytes=nbytes)


def check_max_runs(max_runs, flag: str = "--max-batch") -> int:
  if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
    raise SweepError(f"{flag} (runs per batch) must be an integer >= 1, got {max_runs!r}")
  return max_runs


def group(jobs, key_of) -> tuple[dict, dict]:
  """`({static key: [job, ...]}, {job.key: exception})`: jobs in sweep order under their
  static key (`key_of(job.config)`); a job whose key raises is set apart with its error."""
  groups, errors = {}, {}
  for job in jobs:
    try:
      k = key_of(job.config)
    except Exception as e:  # pylint: disable=broad-except  # an invalid config fails alone
      errors[job.key] = e
      continue
    groups.setdefault(k, []).append(job)
  return groups, errors


def units(groups: dict, max_runs: int, workers: int = 1) -> list[list]:
  """Each group in pieces of at most `max_runs` jobs; while there are fewer pieces than
  `workers`, the largest piece is halved, so no worker idles while another holds a queue."""
  out = [jobs[i:i + max_runs] for jobs in groups.values() for i in range(0, len(jobs), max_runs)]
  while 0 < len(out) < workers:
    big = max(range(len(out)), key=lambda i: len(out[i]))
    if len(out[big]) < 2:
      break
    piece = out.pop(big)
    half = (len(piece) + 1) // 2
    out[big:big] = [piece[:half], piece[half:]]
  return out


def split(items: list, sizes: list[int], budget: int, max_runs: int) -> list[list]:
  """`items` in order, cut into batches of at most `max_runs` whose `sizes` sum to at most
  `budget` bytes; an item larger than the budget alone is a batch of one."""
  out, cur, used = [], [], 0
  for item, size in zip(items, sizes):
    if cur and (used + size > budget or len(cur) >= max_runs):
      out.append(cur)
      cur, used = [], 0
    cur.append(item)
    used += size
  if cur:
    out.append(cur)
  return out


def batch_id(job_keys) -> str:
  """A batch's name: a digest of its jobs' keys (the same jobs, the same name)."""
  return "b" + hashlib.sha256(",".join(sorted(job_keys)).encode()).hexdigest()[:11]
