"""A sweep's results as one compressed file, and the bundle every table, figure and reading
is computed from.

`results.jsonl.gz` (gzip with a zero timestamp, so equal contents give equal bytes): line 1
is a header (`{"format", "sweep", "sweep_arg", "source"}`: the sweep config, the `--sweep`
argument that named it, and the source fingerprint of the code that collected it), then
one line per job in expansion order: `{"key", "state", "stale", "entries": [{"grid",
"axes"}], "config", "summary", "records"}` where `summary` is the run's summary.json without
its config (kept once, under "config") and `records` its metrics.jsonl, every evaluation
round (both absent for an unfinished job). Keys are sorted and floats written by Python's
shortest round-trip repr, so a file read back gives the same numbers bit for bit.

`python -m fedjax_dg.bench report --results FILE` regenerates the report from the file
alone: the sweep config, the jobs, their states and their stale marks all come from it.
"""
from __future__ import annotations

import dataclasses
import gzip
import io
import json

import ml_collections

from fedjax_dg import provenance, rundir
from fedjax_dg.bench import sweep as sweep_lib

FORMAT = 1


class StaleError(sweep_lib.SweepError):
  """Jobs ran under other code than the current one."""


@dataclasses.dataclass
class Data:
  """What the report reads: the sweep config, its expansion, finished runs (key -> {"summary",
  "records"}), every job's state, the keys of stale jobs, and where it all came from."""
  sweep: ml_collections.ConfigDict
  exp: sweep_lib.Expansion
  results: dict
  states: dict
  stale: frozenset
  sweep_arg: str = ""
  source: str = ""
  errors: dict = dataclasses.field(default_factory=dict)  # key -> first line of a failed job's error


def is_stale(summary: dict, current: str) -> bool:
  """A finished run is stale when its recorded source fingerprint is not `current` (a run
  that recorded none predates fingerprints: its code is unknown, so it is stale too)."""
  return provenance.recorded_fingerprint(summary) != current


def from_runs(sweep, exp=None, sweep_arg: str = "") -> Data:
  """The bundle from the sweep's run directories."""
  from fedjax_dg.bench import collect, launch
  exp = exp or sweep_lib.expand(sweep)
  results = collect.load_results(exp)
  current = provenance.source_fingerprint()["sha256"]
  states = {k: launch.job_state(j.workdir) for k, j in exp.jobs.items()}
  errors = {}
  for k, state in states.items():
    if state == "failed":
      ev = [e for e in launch.read_events(exp.jobs[k].workdir) if e["event"] == "failed"]
      errors[k] = ev[-1].get("error", "") if ev else ""
  stale = frozenset(k for k, r in results.items() if is_stale(r["summary"], current))
  return Data(sweep, exp, results, states, stale, sweep_arg, f"the runs under `{sweep.root}`", errors)


def stale_error(data: Data, allow_stale: bool) -> str | None:
  """One line refusing stale jobs (None when there are none or they are allowed)."""
  if not data.stale or allow_stale:
    return None
  n = len(data.stale)
  return (f"{n} finished job(s) ran under other code than the current fedjax_dg (source fingerprint differs; "
          f"`bench status` lists them as stale), e.g. {data.exp.jobs[sorted(data.stale)[0]].workdir}; rerun them into "
          "a new sweep.root, or pass --allow-stale to use them, marked with a dagger")


def check_stale(data: Data, allow_stale: bool) -> None:
  err = stale_error(data, allow_stale)
  if err:
    raise StaleError(err)


# ---------------------------------------------------------------------------- the file

def _dumps(obj) -> str:
  return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=rundir.strict_default,
                    allow_nan=True)


def lines(data: Data) -> list[str]:
  by_key = {}
  for e in data.exp.entries:
    by_key.setdefault(e.key, []).append({"grid": e.grid, "axes": e.axes})
  out = [_dumps({"format": FORMAT, "kind": "header", "sweep": data.sweep.to_dict(), "sweep_arg": data.sweep_arg,
                 "source": provenance.source_fingerprint()})]
  for key, job in data.exp.jobs.items():
    doc = {"key": key, "state": data.states.get(key, "pending"), "stale": key in data.stale,
           "error": data.errors.get(key, ""),
           "entries": by_key[key], "config": job.config.to_dict()}
    run = data.results.get(key)
    if run is not None:
      doc["summary"] = {k: v for k, v in run["summary"].items() if k != "config"}
      doc["records"] = run["records"]
    out.append(_dumps(doc))
  return out


def write(data: Data, path: str) -> str:
  """Writes `path` (gzip, mtime 0, no file name in the header); returns it."""
  buf = io.BytesIO()
  with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
    gz.write(("\n".join(lines(data)) + "\n").encode())
  with open(path, "wb") as f:
    f.write(buf.getvalue())
  return path


def read(path: str) -> Data:
  """The bundle from a results file; a file that is not one raises a one-line error."""
  try:
    with gzip.open(path, "rt", encoding="utf-8") as f:
      docs = [json.loads(l) for l in f if l.strip()]
  except FileNotFoundError:
    raise
  except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as e:
    raise sweep_lib.SweepError(f"{path}: not a results file (gzip JSON lines): {e}") from None
  if not docs or docs[0].get("kind") != "header" or docs[0].get("format") != FORMAT:
    raise sweep_lib.SweepError(f"{path}: not a results file of format {FORMAT} (its first line is not the header)")
  head = docs[0]
  sweep = ml_collections.ConfigDict(head["sweep"])
  exp = sweep_lib.Expansion({}, [])
  results, states, stale, errors = {}, {}, set(), {}
  for d in docs[1:]:
    key = d["key"]
    config = sweep_lib.from_json_dict(d["config"])
    exp.jobs[key] = sweep_lib.Job(key, config.workdir, config)
    exp.entries.extend(sweep_lib.Entry(e["grid"], key, e["axes"]) for e in d["entries"])
    states[key] = d["state"]
    if d.get("error"):
      errors[key] = d["error"]
    if d["stale"]:
      stale.add(key)
    if "summary" in d:
      results[key] = {"summary": {**d["summary"], "config": d["config"]}, "records": d["records"]}
  return Data(sweep, exp, results, states, frozenset(stale), head.get("sweep_arg", ""), f"the results file `{path}`",
              errors)
