"""TensorBoard event files for runs, written without TensorFlow (tensorboardX).

Every record of a run's `metrics.jsonl` becomes scalars at step `round`:
`train/loss` and `<split>/<metric>` for each split the runner evaluated (`heldout_val`,
`in_val`, `test`, ...; the splits' sizes `n` are left out). A run with
`config.tensorboard = True` writes them as it goes into `<workdir>/tensorboard/`; any
finished run or sweep is converted afterwards by

  python -m fedjax_dg.eval.tensorboard WORKDIR_OR_SWEEP_ROOT [...]

then `tensorboard --logdir WORKDIR_OR_SWEEP_ROOT` (TensorBoard itself is not a dependency).
Needs the `tensorboard` extra (`pip install fedjax-dg[tensorboard]`).
"""
from __future__ import annotations

import math
import os
import sys

SUBDIR = "tensorboard"
SKIP = ("n",)  # per-split fields that are counts, not metrics


def scalars(record: dict) -> list[tuple[str, float]]:
  """`(tag, value)` for every finite number of one metrics.jsonl record."""
  out = []
  if isinstance(record.get("train_loss"), (int, float)):
    out.append(("train/loss", float(record["train_loss"])))
  for split, vals in sorted(record.get("splits", {}).items()):
    for k, v in sorted(vals.items()):
      if k not in SKIP and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        out.append((f"{split}/{k}", float(v)))
  for k, v in sorted(record.items()):  # other per-round numbers the runner records
    if k not in ("round", "train_loss") and isinstance(v, (int, float)) and not isinstance(v, bool) \
        and math.isfinite(v):
      out.append((f"train/{k}", float(v)))
  return out


def _writer(workdir: str):
  try:
    from tensorboardX import SummaryWriter
  except ImportError as e:
    raise ImportError("TensorBoard event files need tensorboardX: pip install 'fedjax-dg[tensorboard]'") from e
  return SummaryWriter(os.path.join(workdir, SUBDIR), flush_secs=10)


class RunWriter:
  """Appends a run's records as they are written (`add(record)`), flushed on `close()`."""

  def __init__(self, workdir: str):
    self._w = _writer(workdir)

  def add(self, record: dict) -> None:
    for tag, value in scalars(record):
      self._w.add_scalar(tag, value, global_step=int(record["round"]))

  def close(self) -> None:
    self._w.close()


def convert_run(workdir: str) -> int:
  """Writes `<workdir>/tensorboard/` from `<workdir>/metrics.jsonl` anew (older event files
  there are removed, so a converted run holds each step once). Returns the records written."""
  from fedjax_dg import rundir
  records = rundir.read_metrics(workdir)
  out = os.path.join(workdir, SUBDIR)
  if os.path.isdir(out):
    for name in os.listdir(out):
      if name.startswith("events.out.tfevents"):
        os.remove(os.path.join(out, name))
  w = RunWriter(workdir)
  for r in records:
    w.add(r)
  w.close()
  return len(records)


def run_dirs(root: str) -> list[str]:
  """Every folder under `root` (itself included) that holds a metrics.jsonl."""
  found = []
  for d, dirs, files in os.walk(root):
    dirs[:] = sorted(x for x in dirs if x not in (SUBDIR, "checkpoints") and not x.startswith("."))
    if "metrics.jsonl" in files:
      found.append(d)
  return found


def main(argv=None) -> int:
  args = list(sys.argv[1:] if argv is None else argv)
  if not args or args[0] in ("-h", "--help"):
    print(__doc__.strip())
    return 0 if args else 2
  for root in args:
    if not os.path.isdir(root):
      print(f"error: no such folder {root!r}", file=sys.stderr)
      return 2
    runs = run_dirs(root)
    if not runs:
      print(f"error: no metrics.jsonl under {root!r}", file=sys.stderr)
      return 2
    n = sum(convert_run(d) for d in runs)
    print(f"{root}: {len(runs)} run(s), {n} record(s) -> <run>/{SUBDIR}/")
  return 0


if __name__ == "__main__":
  sys.exit(main())
