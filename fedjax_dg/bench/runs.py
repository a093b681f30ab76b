"""One finished run as the benchmark layer reads it: its summary and evaluations (through
fedjax_dg/rundir.py), and its score under each selection rule. Both `collect` and
`difficulty` read runs through this module."""
from __future__ import annotations

import math

from fedjax_dg import rundir


def read_records(workdir: str) -> list[dict]:
  """The run's evaluations (rundir.read_metrics)."""
  return rundir.read_metrics(workdir)


def load_run(workdir: str) -> dict | None:
  """{"summary", "records"} of a finished run, None before it finishes; a file that does not
  parse raises rundir.RunDirError naming it."""
  summary = rundir.read_summary(workdir)
  if summary is None:
    return None
  return {"summary": summary, "records": read_records(workdir)}


def metric_of(split_metrics, metric):
  """A split's value of `metric`, or None where the split or the metric is absent or not finite."""
  if not split_metrics or metric not in split_metrics:
    return None
  v = split_metrics[metric]
  return None if v is None or not math.isfinite(v) else float(v)


def selectable(run: dict) -> list[dict]:
  """The evaluations selection may pick: those of the final stage of a multi-stage method
  (the runner's `selection_scope`; a record's `stage` counts from 1)."""
  stages = run["summary"].get("stages") or [None]
  return [r for r in run["records"] if r.get("stage", 1) == len(stages)]


def rule_scores(run: dict, rule: str, metric: str) -> dict | None:
  """{"round", "val", "test", "in_test"} for one selection rule, or None where the run has
  no validation split for it. The oracle takes the round of the best test score (earliest
  on ties) from metrics.jsonl."""
  records = selectable(run)
  at = {r["round"]: r for r in records}
  if rule == "oracle":
    best = None
    for r in records:
      t = metric_of(r["splits"].get("test"), metric)
      if t is not None and (best is None or t > best[1]):
        best = (r, t)
    if best is None:
      return None
    r, t = best
    return {"round": r["round"], "val": t, "test": t, "in_test": metric_of(r["splits"].get("in_test"), metric)}
  sel = run["summary"]["selection"].get(rule)
  if not sel:
    return None
  rec = at.get(sel["round"], {"splits": {}})
  return {"round": sel["round"], "val": metric_of(sel.get("val"), metric), "test": metric_of(sel.get("test"), metric),
          "in_test": metric_of(rec["splits"].get("in_test"), metric)}
