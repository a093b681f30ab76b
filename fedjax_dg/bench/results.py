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
A file handed over is read with caps (`MAX_RESULTS_BYTES` inflated, `MAX_LINE_BYTES` per
line, `MAX_DEPTH` of nesting, `MAX_DIGITS` per number) and checked against the schema
above (types, booleans as booleans, metrics finite or NaN and within [0, 1] but for the
count `n`) before any cell is computed; each refusal is one line naming the file, the line
and the field. A finished job that no cell can use (marked done without a summary, or with
a NaN where a selection rule reads its score) is kept out of the cells and named in
`Data.notes`, which the report command prints.
"""
from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
import re
import warnings

import ml_collections
import numpy as np

from fedjax_dg import bounded, provenance, rundir
from fedjax_dg.bench import sweep as sweep_lib
from fedjax_dg.bench.runs import load_run

FORMAT = 1
MAX_RESULTS_BYTES = 256 << 20  # inflated; a sweep of 1,853 jobs with every round's evaluations takes 50 MB
MAX_LINE_BYTES = 16 << 20      # one job; such a job's line takes 35 kB
MAX_DEPTH = 32                 # nesting of one line; a job's line nests 7 deep
MAX_DIGITS = 40                # characters of one number
STATES = ("pending", "running", "done", "failed", "broken", "interrupted")


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
  notes: list = dataclasses.field(default_factory=list)    # one line per job a results file's cells leave out


def is_stale(summary: dict) -> bool:
  """A finished run is stale when the code that decides its numbers changed since it ran:
  some file of the current code, in the run's own scope, differs from what the run recorded
  (`provenance.changed_files`; per file where the run recorded per-file hashes, else by the
  whole fingerprint). A run that recorded none predates fingerprints: its code is unknown,
  so it is stale too."""
  return bool(provenance.changed_files(summary))


def load_results(exp: sweep_lib.Expansion) -> dict:
  """The finished runs of a sweep, from their run directories.

  Args:
    exp: the sweep's expansion.

  Returns:
    key -> {"summary", "records"}; jobs not finished, or whose files do not parse, are
    absent (the latter with a one-line warning naming the file).
  """
  out = {}
  for key, job in exp.jobs.items():
    try:
      run = load_run(job.workdir)
    except rundir.RunDirError as e:
      warnings.warn(f"{e}; leaving the job out")
      run = None
    if run is not None:
      out[key] = run
  return out


def from_runs(sweep, exp=None, sweep_arg: str = "") -> Data:
  """The bundle from the sweep's run directories."""
  # Imported here, not above: the launcher imports the runner (and JAX), which reading a results file does not need.
  from fedjax_dg.bench import launch
  exp = exp or sweep_lib.expand(sweep)
  results = load_results(exp)
  states = {k: launch.job_state(j.workdir) for k, j in exp.jobs.items()}
  errors = {}
  for k, state in states.items():
    if state == "failed":
      ev = [e for e in launch.read_events(exp.jobs[k].workdir) if e["event"] == "failed"]
      errors[k] = ev[-1].get("error", "") if ev else ""
  stale = frozenset(k for k, r in results.items() if is_stale(r["summary"]))
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
  """The bundle from a results file, checked before anything is computed from it.

  Args:
    path: a `results.jsonl.gz` (see the module docstring).

  Returns:
    The bundle; `notes` names the finished jobs its cells leave out, and why.

  Raises:
    FileNotFoundError: when there is no such file.
    SweepError: one line naming the file, the line and the field, for a file that is not
      a results file, is larger than the caps, or breaks the schema.
  """
  docs = []
  try:
    with open(bounded.regular_file(path), "rb") as f:
      magic = f.read(2)
    if magic != b"\x1f\x8b":
      raise sweep_lib.SweepError(f"{path}: not a results file (gzip JSON lines): Not a gzipped file ({magic!r})")
    for number, raw in bounded.capped_lines(path, MAX_RESULTS_BYTES, MAX_LINE_BYTES, decompress=True):
      if raw.strip():
        docs.append((number, _parse_line(raw, path, number)))
  except FileNotFoundError:
    raise
  except bounded.UntrustedFileError as e:
    raise sweep_lib.SweepError(f"{e}; not a results file this library reads") from None
  except (OSError, EOFError) as e:
    raise sweep_lib.SweepError(f"{path}: not a results file (gzip JSON lines): {e}") from None
  if not docs or not isinstance(docs[0][1], dict) or docs[0][1].get("kind") != "header" \
      or docs[0][1].get("format") != FORMAT:
    raise sweep_lib.SweepError(f"{path}: not a results file of format {FORMAT} (its first line is not the header)")
  head = _check_header(docs[0][1], _Where(path, docs[0][0]))
  sweep = ml_collections.ConfigDict(head["sweep"])
  exp = sweep_lib.Expansion({}, [])
  results, states, stale, errors, notes = {}, {}, set(), {}, []
  for number, d in docs[1:]:
    where = _Where(path, number)
    _check_job(d, where)
    key = d["key"]
    if key in exp.jobs:
      raise where.error("key", f"job {key!r} appears twice")
    try:
      config = sweep_lib.from_json_dict(d["config"])
    except (TypeError, ValueError, AttributeError, KeyError) as e:
      raise where.error("config", f"not a config ({type(e).__name__}: {e})") from None
    exp.jobs[key] = sweep_lib.Job(key, config.workdir, config)
    exp.entries.extend(sweep_lib.Entry(e["grid"], key, e["axes"]) for e in d["entries"])
    states[key] = d["state"]
    if d["error"]:
      errors[key] = d["error"]
    if d["stale"]:
      stale.add(key)
    if "summary" in d:
      results[key] = {"summary": {**d["summary"], "config": d["config"]}, "records": d["records"]}
    note = _left_out(d, number)
    if note:
      notes.append(f"{path}: {note}")
  return Data(sweep, exp, results, states, frozenset(stale), head["sweep_arg"], f"the results file `{path}`",
              errors, notes)


# ---------------------------------------------------------------------------- the schema

_ABSENT = object()  # a field the line does not have


@dataclasses.dataclass(frozen=True)
class _Where:
  path: str
  line: int

  def error(self, field: str, what: str) -> sweep_lib.SweepError:
    return sweep_lib.SweepError(f"{self.path} line {self.line}: {field}: {' '.join(str(what).split())[:300]}")


_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')


_LONG_NUMBER = re.compile(rb"[-+0-9.eE]{%d,}" % (MAX_DIGITS + 1))


def _depth(bare: bytes) -> int:
  """How deep JSON whose strings are emptied (`bare`) nests, without parsing it."""
  b = np.frombuffer(bare, np.uint8)
  step = np.isin(b, (ord("["), ord("{"))).astype(np.int64) - np.isin(b, (ord("]"), ord("}")))
  return int(np.cumsum(step).max(initial=0))


def _parse_line(raw: bytes, path: str, number: int):
  """One line, its nesting and the length of its numbers checked before it is parsed."""
  where = _Where(path, number)
  bare = _STRINGS.sub(b'""', raw)
  depth = _depth(bare)
  if depth > MAX_DEPTH:
    raise where.error("the line", f"nested {depth} deep, more than the {MAX_DEPTH} a results file uses")
  long = _LONG_NUMBER.search(bare)
  if long:
    raise where.error("the line", f"a number of {len(long.group())} characters (at most {MAX_DIGITS})")
  try:
    return json.loads(raw)
  except (ValueError, RecursionError) as e:  # UnicodeDecodeError included
    raise where.error("the line", f"not JSON ({type(e).__name__}: {e})") from None


def _type(v, want, where: _Where, field: str):
  if v is _ABSENT:
    raise where.error(field, f"absent; it must be {' or '.join(t.__name__ for t in (want if isinstance(want, tuple) else (want,)))}")
  ok = isinstance(v, want) and not (isinstance(v, bool) and bool not in (want if isinstance(want, tuple) else (want,)))
  if not ok:
    names = " or ".join(t.__name__ for t in (want if isinstance(want, tuple) else (want,)))
    raise where.error(field, f"{json.dumps(v)[:60]} ({type(v).__name__}), not {names}")
  return v


def _int(v, where: _Where, field: str, lo: int = 0) -> int:
  _type(v, int, where, field)
  if not lo <= v < 2 ** 53:
    raise where.error(field, f"{v} lies outside [{lo}, 2**53)")
  return v


def _check_header(head: dict, where: _Where) -> dict:
  _type(head.get("sweep", _ABSENT), dict, where, "sweep")
  _type(head.get("sweep_arg", ""), str, where, "sweep_arg")
  _type(head.get("source", {}), dict, where, "source")
  sweep = head["sweep"]
  for field in ("name", "root"):
    _type(sweep.get(field, _ABSENT), str, where, f"sweep.{field}")
  _type(sweep.get("grids", _ABSENT), dict, where, "sweep.grids")
  for name, g in sweep["grids"].items():
    _type(g, dict, where, f"sweep.grids.{name}")
  return {**head, "sweep_arg": head.get("sweep_arg", "")}


def _check_job(d, where: _Where) -> None:
  _type(d, dict, where, "the line")
  key = _type(d.get("key", _ABSENT), str, where, "key")
  if not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", key):
    raise where.error("key", f"{key[:70]!r} is not a job key")
  state = _type(d.get("state", _ABSENT), str, where, "state")
  if state not in STATES:
    raise where.error("state", f"{state[:40]!r}; one of {', '.join(STATES)}")
  _type(d.get("stale", _ABSENT), bool, where, "stale")
  _type(d.get("error", ""), str, where, "error")
  d.setdefault("error", "")
  for k, e in enumerate(_type(d.get("entries", _ABSENT), list, where, "entries")):
    _type(e, dict, where, f"entries[{k}]")
    _type(e.get("grid", _ABSENT), str, where, f"entries[{k}].grid")
    _check_axes(_type(e.get("axes", _ABSENT), dict, where, f"entries[{k}].axes"), where, f"entries[{k}].axes")
  if not d["entries"]:
    raise where.error("entries", "empty; a job belongs to at least one grid")
  config = _type(d.get("config", _ABSENT), dict, where, "config")
  _type(config.get("workdir", _ABSENT), str, where, "config.workdir")
  if ("summary" in d) != ("records" in d):
    raise where.error("summary" if "records" in d else "records", "absent while the other is present")
  if "summary" in d:
    _check_summary(_type(d["summary"], dict, where, "summary"), where)
    for k, r in enumerate(_type(d["records"], list, where, "records")):
      _check_record(r, where, f"records[{k}]")


_AXES = {"method": str, "algorithm": str, "num_clients": int, "seed": int, "trial": int}  # every entry's
_OPTIONAL_AXES = {"local_epochs": int, "num_rounds": int, "local_steps": int, "role": str}


def _check_axes(axes: dict, where: _Where, field: str) -> None:
  for name, want in {**_AXES, **{k: v for k, v in _OPTIONAL_AXES.items() if k in axes}}.items():
    if want is int:
      _int(axes.get(name, _ABSENT), where, f"{field}.{name}")
    else:
      _type(axes.get(name, _ABSENT), want, where, f"{field}.{name}")
  for name in ("lam", "fraction"):
    if axes.get(name) is not None:
      v = _type(axes[name], (int, float), where, f"{field}.{name}")
      if not math.isfinite(v):
        raise where.error(f"{field}.{name}", f"{v!r}, not a finite number")


def _check_metrics(m, where: _Where, field: str) -> None:
  for name, v in _type(m, dict, where, field).items():
    if name == "n":
      _int(v, where, f"{field}.n")
    elif v is not None:
      _type(v, (int, float), where, f"{field}.{name}")
      if not math.isnan(v) and not 0 <= v <= 1:
        raise where.error(f"{field}.{name}", f"{v!r} lies outside [0, 1]")


def _check_summary(s: dict, where: _Where) -> None:
  for rule, sel in _type(s.get("selection", {}), dict, where, "summary.selection").items():
    if sel is None:
      continue
    field = f"summary.selection.{rule}"
    _type(sel, dict, where, field)
    _int(sel.get("round", _ABSENT), where, f"{field}.round")
    for split in ("val", "test"):
      if split in sel:
        _check_metrics(sel[split], where, f"{field}.{split}")
  if s.get("stages") is not None:
    for k, st in enumerate(_type(s["stages"], list, where, "summary.stages")):
      _type(st, dict, where, f"summary.stages[{k}]")
  if "wall_time_s" in s:
    t = _type(s["wall_time_s"], (int, float), where, "summary.wall_time_s")
    if not (math.isfinite(t) and t >= 0):
      raise where.error("summary.wall_time_s", f"{t!r}, not a finite number >= 0")
  for field in ("timing", "provenance", "final", "domains", "communication"):
    if s.get(field) is not None:
      _type(s[field], dict, where, f"summary.{field}")
  if isinstance(s.get("final"), dict) and "splits" in s["final"]:
    for split, m in _type(s["final"]["splits"], dict, where, "summary.final.splits").items():
      _check_metrics(m, where, f"summary.final.splits.{split}")


def _check_record(r, where: _Where, field: str) -> None:
  _type(r, dict, where, field)
  _int(r.get("round", _ABSENT), where, f"{field}.round")
  if "stage" in r:
    _int(r["stage"], where, f"{field}.stage", lo=1)
  if r.get("train_loss") is not None:
    _type(r["train_loss"], (int, float), where, f"{field}.train_loss")
  for split, m in _type(r.get("splits", _ABSENT), dict, where, f"{field}.splits").items():
    _check_metrics(m, where, f"{field}.splits.{split}")


def _nan_fields(m: dict, field: str) -> list[str]:
  return [f"{field}.{k}" for k, v in m.items() if k != "n" and isinstance(v, float) and math.isnan(v)]


def _left_out(d: dict, number: int) -> str:
  """Why the cells leave this finished job out ("" when they use it)."""
  if d["state"] != "done":
    return ""
  label = f"line {number}: job {d['key']}"
  if "summary" not in d:
    return f"{label} is marked done but holds no summary; left out of every cell (its seed counts as missing)"
  nan = [f for rule, sel in d["summary"].get("selection", {}).items() if sel
         for split in ("val", "test") for f in _nan_fields(sel.get(split) or {}, f"summary.selection.{rule}.{split}")]
  if nan:
    return (f"{label} finished with NaN in {nan[0]}" + (f" (and {len(nan) - 1} more)" if len(nan) > 1 else "")
            + "; cells that read it leave the job out (its seed counts as missing)")
  return ""
