"""TensorBoard event files for runs, written without TensorFlow (tensorboardX).

Every record of a run's `metrics.jsonl` becomes scalars at step `round`:
`train/loss` and `<split>/<metric>` for each split the runner evaluated (`heldout_val`,
`in_val`, `test`, ...; the splits' sizes `n` are left out). A run with
`config.tensorboard = True` writes them as it goes into `<workdir>/tensorboard/`; any
finished run or sweep is converted afterwards by

  python -m fedjax_dg.eval.tensorboard WORKDIR_OR_SWEEP_ROOT [...]

then `tensorboard --logdir WORKDIR_OR_SWEEP_ROOT` (TensorBoard itself is not a dependency).

A sweep root (a folder of runs, not a run itself) also gets `<root>/tensorboard/<name>/`:
each run once more, in a folder named by its method and the config fields that differ
between the sweep's runs (`fedprox lam=0.0 seed=1`), with the hparams plugin's record of
those fields and the selected scores of its summary (`selected/<rule>/<split>_<metric>`), so
`tensorboard --logdir <root>/tensorboard` shows the runs by name and, under HPARAMS, as one
table of those fields against the runs' scalars. Each conversion rewrites that folder.

Needs the `tensorboard` extra (`pip install "fedjax-dg[tensorboard]"`).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys

SUBDIR = "tensorboard"
SKIP = ("n",)  # per-split fields that are counts, not metrics
# Top-level config fields that name where and how a run is kept, not what it computes.
NEUTRAL = ("workdir", "resume", "quiet", "tensorboard", "tracking", "eval_batch_size", "checkpoint_every",
           "distributed", "runs")


def scalars(record: dict) -> list[tuple[str, float]]:
  """The numbers of one evaluation, as TensorBoard and MLflow name them.

  Args:
    record: one line of a run's metrics.jsonl.

  Returns:
    `(tag, value)` for every finite number: `train/loss`, `<split>/<metric>` for each
    evaluated split (its size `n` left out), and `train/<field>` for the other per-round
    numbers the runner records.
  """
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


def _writer(workdir: str, sub: str = SUBDIR):
  try:
    from tensorboardX import SummaryWriter
  except ImportError as e:
    raise ImportError("TensorBoard event files need tensorboardX: pip install 'fedjax-dg[tensorboard]'") from e
  return SummaryWriter(os.path.join(workdir, sub) if sub else workdir, flush_secs=10)


class RunWriter:
  """Appends a run's records to `<workdir>/tensorboard/` as they are written.

  Args:
    workdir: the run directory.

  Raises:
    ImportError: one line naming the `tensorboard` extra when tensorboardX is missing.
  """

  def __init__(self, workdir: str):
    self._w = _writer(workdir)

  def add(self, record: dict) -> None:
    """Writes one metrics.jsonl record's `scalars` at step `record["round"]`."""
    for tag, value in scalars(record):
      self._w.add_scalar(tag, value, global_step=int(record["round"]))

  def close(self) -> None:
    """Flushes and closes the event file."""
    self._w.close()


def _flatten(tree, prefix: str = "") -> dict:
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def run_config(workdir: str) -> dict:
  """The run's config as `{"a.b.c": value}`.

  Args:
    workdir: a run directory.

  Returns:
    The flattened config of its `config.json` (of its `summary.json` when it has no
    config.json), or `{}` when it has neither.
  """
  from fedjax_dg import rundir
  for name in (rundir.CONFIG_FILE, rundir.SUMMARY_FILE):
    path = os.path.join(workdir, name)
    if os.path.isfile(path):
      return _flatten(rundir.read_json(path, "a run's config").get("config", {}))
  return {}


def varying_fields(configs: list[dict]) -> list[str]:
  """The config fields whose values differ between runs.

  Args:
    configs: flattened configs (`run_config`), one per run.

  Returns:
    The dotted names, sorted, of the fields that take more than one value over `configs`
    (a field a run lacks counts as the value None), leaving out `NEUTRAL` fields and the
    method's name (`algorithm.name`, which names every run anyway).
  """
  keys = sorted(set().union(*configs)) if configs else []
  return [k for k in keys if k.split(".")[0] not in NEUTRAL and k != "algorithm.name"
          and len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs}) > 1]


def short_names(fields: list[str]) -> dict:
  """Each dotted field's shortest ending that no other field of `fields` shares
  (`partition.lam` -> `lam`, unless another field also ends in `lam`)."""
  out = {}
  for f in fields:
    parts = f.split(".")
    for i in range(len(parts) - 1, -1, -1):
      tail = ".".join(parts[i:])
      if sum(g == tail or g.endswith("." + tail) for g in fields) == 1:
        out[f] = tail
        break
    else:
      out[f] = f
  return out


def _hparam_value(v):
  """A value the hparams plugin takes (bool, number or text)."""
  if isinstance(v, (bool, int, float, str)):
    return v
  return json.dumps(v, default=str)


def run_hparams(config: dict, fields: list[str]) -> dict:
  """A run's method and hyperparameters, as the hparams plugin and MLflow record them.

  Args:
    config: the run's flattened config (`run_config`).
    fields: the dotted fields to report (`varying_fields` of its sweep).

  Returns:
    `{"method": algorithm.name, <short field name>: value, ...}` in the order of `fields`,
    values as bool, number or text; `{}` for a run without a config.
  """
  if not config:
    return {}
  names = short_names(fields)
  return {"method": str(config.get("algorithm.name", "?")), **{names[f]: _hparam_value(config.get(f)) for f in fields}}


def run_name(hparams: dict) -> str:
  """The run's folder name: its method, then `field=value` for each other hyperparameter
  (`fedprox lam=0.0 seed=1`), with no path separator."""
  words = [str(hparams.get("method", ""))] + [f"{k}={v}" for k, v in hparams.items() if k != "method"]
  return " ".join(w for w in words if w).replace(os.sep, "_")


def selected_metrics(workdir: str) -> dict:
  """The scores of the models the run's summary selected.

  Args:
    workdir: a run directory.

  Returns:
    `{"selected/<rule>/<split>_<metric>": value}` for every selection rule of its
    `summary.json` (`heldout_domain`, `in_domain`), its validation (`val`) and `test`
    scores and the selected `round`; `{}` for a run without a summary.
  """
  from fedjax_dg import rundir
  path = os.path.join(workdir, rundir.SUMMARY_FILE)
  if not os.path.isfile(path):
    return {}
  out = {}
  for rule, sel in sorted(rundir.read_json(path, "a run's summary").get("selection", {}).items()):
    if not isinstance(sel, dict):
      continue
    if isinstance(sel.get("round"), int):
      out[f"selected/{rule}/round"] = float(sel["round"])
    for split in ("val", "test"):
      for k, v in sorted((sel.get(split) or {}).items()):
        if k not in SKIP and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
          out[f"selected/{rule}/{split}_{k}"] = float(v)
  return out


def write_named_run(folder: str, records: list[dict], hparams: dict, metrics: dict) -> None:
  """Writes one run's scalars and its hparams-plugin record into `folder`.

  Args:
    folder: the run's folder under the sweep's `tensorboard/` (created).
    records: its metrics.jsonl records.
    hparams: its method and hyperparameters (`run_hparams`).
    metrics: its selected scores (`selected_metrics`), written at the last round and shown
      in the hparams table.
  """
  from tensorboardX.summary import hparams as hparams_summary
  w = _writer(folder, sub="")
  try:
    for r in records:
      for tag, value in scalars(r):
        w.add_scalar(tag, value, global_step=int(r["round"]))
    if hparams:  # the session's start and end, no experiment record: TensorBoard builds the
      # table's columns from every session's hparams and every scalar of their runs
      _, start, end = hparams_summary(hparams, metrics)
      w.file_writer.add_summary(start)
      w.file_writer.add_summary(end)
    last = max((int(r["round"]) for r in records), default=0)
    for tag, value in metrics.items():
      w.add_scalar(tag, value, global_step=last)
  finally:
    w.close()


def convert_sweep(root: str) -> list[str]:
  """Writes `<root>/tensorboard/<name>/` for every run under a sweep root, anew.

  Args:
    root: a folder of run directories (not a run itself).

  Returns:
    The run folders' names, one per run, in the order of `run_dirs(root)`.
  """
  from fedjax_dg import rundir
  if os.path.isfile(os.path.join(root, rundir.METRICS_FILE)):
    raise ValueError(f"{root!r} is a run, not a folder of runs: its {SUBDIR}/ holds its own event files")
  runs = run_dirs(root)
  configs = [run_config(d) for d in runs]
  fields = varying_fields([c for c in configs if c])
  out = os.path.join(root, SUBDIR)
  if os.path.isdir(out):
    shutil.rmtree(out)
  names, taken = [], set()
  for d, config in zip(runs, configs):
    hp = run_hparams(config, fields)
    name = run_name(hp) or os.path.relpath(d, root).replace(os.sep, "_")
    if name in taken:  # equal configs (or none): the run folder tells them apart
      name = f"{name} ({os.path.relpath(d, root).replace(os.sep, '_')})"
    taken.add(name)
    names.append(name)
    write_named_run(os.path.join(out, name), rundir.read_metrics(d), hp, selected_metrics(d))
  return names


def convert_run(workdir: str) -> int:
  """Writes `<workdir>/tensorboard/` from `<workdir>/metrics.jsonl` anew.

  Older event files there are removed, so a converted run holds each step once.

  Args:
    workdir: a run directory.

  Returns:
    The number of records written.
  """
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
  """The run directories under a folder.

  Args:
    root: a run directory or a folder of them (searched at any depth).

  Returns:
    Every folder under `root`, itself included, that holds a metrics.jsonl, in sorted
    order (event-file and checkpoint folders are not searched).
  """
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
    if not os.path.isfile(os.path.join(root, "metrics.jsonl")):  # a sweep root, not a run
      convert_sweep(root)
      print(f"{root}: by method and hyperparameters -> {os.path.join(root, SUBDIR)}/ "
            f"(tensorboard --logdir {os.path.join(root, SUBDIR)})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
