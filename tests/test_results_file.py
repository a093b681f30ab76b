"""`bench report --results FILE` on a file handed over: its schema checked before any cell
is computed (one line naming the file, the line and the field), its size, line length,
nesting and numbers capped, and every finished job the cells leave out named in the output."""
import gzip
import json
import os
import subprocess
import sys

import pytest

import helpers
from fedjax_dg.bench import collect, results as results_lib, sweep as sweep_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_results_file(tmp) -> str:
  """A results file of test_report2's fixture sweep (3 methods, 4 columns, 3 seeds) under `tmp`."""
  from test_report2 import fill, sweep_config
  s = sweep_config(tmp / "runs")
  fill(sweep_lib.expand(s))
  collect.collect(s, str(tmp / "out"))
  return str(tmp / "out" / collect.RESULTS_FILE)


def mutated(results_file, path, field: str, value) -> str:
  """`results_file` with `field` of the fedavg C=1 seed-1 job (or, for `header.FIELD`, of
  the header) set to `value` (KeyError: deleted), written to `path`."""
  docs = lines_of(results_file)
  head, _, rest = field.partition(".")
  if head == "header":
    _set(docs[0], rest, value)
  elif field.startswith("records.0."):
    _set(docs[job_line(docs)]["records"][0], field[len("records.0."):], value)
  else:
    _set(docs[job_line(docs)], field, value)
  return write_lines(path, docs)


@pytest.fixture(scope="module")
def results_file(tmp_path_factory):
  return make_results_file(tmp_path_factory.mktemp("results"))


def lines_of(path) -> list[dict]:
  with gzip.open(path, "rt") as f:
    return [json.loads(l) for l in f]


def write_lines(path, docs, raw: dict | None = None) -> str:
  """`docs` as a results file; `raw[k]` replaces line k + 1's text."""
  text = [json.dumps(d) for d in docs]
  for k, t in (raw or {}).items():
    text[k] = t
  with gzip.open(path, "wt") as f:
    f.write("\n".join(text) + "\n")
  return str(path)


def job_line(docs, method="fedavg", num_clients=1, seed=1) -> int:
  """The index in `docs` of the table job of `method` at C = `num_clients` and `seed`."""
  return next(k for k, d in enumerate(docs) if k and any(
      e["grid"] == "table" and e["axes"]["method"] == method and e["axes"]["num_clients"] == num_clients
      and e["axes"]["seed"] == seed for e in d["entries"]))


def report_cli(path, out):
  """`python -m fedjax_dg.bench report --results PATH --out OUT` under test_bounded_readers.MEMORY_CAP."""
  env = dict(os.environ, PYTHONPATH=helpers.pythonpath(ROOT), JAX_PLATFORMS="cpu", OPENBLAS_NUM_THREADS="1",
             OMP_NUM_THREADS="1")
  from test_bounded_readers import capped
  argv = [sys.executable, "-m", "fedjax_dg.bench", "report", f"--results={path}", f"--out={out}"]
  r = subprocess.run(capped(argv), env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
  return r.returncode, r.stdout, r.stderr


def refusal(path) -> str:
  with pytest.raises(sweep_lib.SweepError) as e:
    results_lib.read(path)
  text = str(e.value)
  assert "\n" not in text
  return text


def _set(doc, dotted, value):
  *head, last = dotted.split(".")
  for k in head:
    doc = doc[int(k)] if isinstance(doc, list) else doc[k]
  if value is KeyError:
    del doc[last]
  else:
    doc[last] = value


# Each malformed structure: (line: 0 the header, 1 a job; the field set (KeyError: deleted);
# the value; the message's tail after "<file> line <n>: ").
STRUCTURE = [
    ("header a list", 0, None, [1, 2], "not a results file of format 1 (its first line is not the header)"),
    ("a job without config", 1, "config", KeyError, "config: absent; it must be dict"),
    ("an accuracy as a string", 1, "summary.selection.heldout_domain.test.accuracy", "0.9",
     'summary.selection.heldout_domain.test.accuracy: "0.9" (str), not int or float'),
    ("entries an integer", 1, "entries", 5, "entries: 5 (int), not list"),
    ("sweep a list", 0, "sweep", [1], "sweep: [1] (list), not dict"),
    ('"stale": "no"', 1, "stale", "no", 'stale: "no" (str), not bool'),
    ("an accuracy of 1e308", 1, "summary.selection.heldout_domain.test.accuracy", 1e308,
     "summary.selection.heldout_domain.test.accuracy: 1e+308 lies outside [0, 1]"),
    ("an unknown state", 1, "state", "finished", "state: 'finished'; one of pending, running, done, failed, broken, interrupted"),
    ("a round of -1", 1, "records.0.round", -1, "records[0].round: -1 lies outside [0, 2**53)"),
    ("a count n as a boolean", 1, "records.0.splits.test.n", True, "records[0].splits.test.n: true (bool), not int"),
    ("a summary without records", 1, "records", KeyError, "records: absent while the other is present"),
    ("a method given as a number", 1, "entries.0.axes.method", 3, "entries[0].axes.method: 3 (int), not str"),
    ("an entry without its seed", 1, "entries.0.axes.seed", KeyError, "entries[0].axes.seed: absent; it must be int"),
    ("an infinite lambda", 1, "entries.0.axes.lam", float("inf"), "entries[0].axes.lam: inf, not a finite number"),
]


@pytest.mark.parametrize("name,line,field,value,tail", STRUCTURE, ids=[c[0] for c in STRUCTURE])
def test_malformed_structure_is_one_line_naming_line_and_field(results_file, tmp_path, name, line, field, value, tail):
  docs = lines_of(results_file)
  k = line if line == 0 else job_line(docs)
  if field is None:
    docs[k] = value
  elif field.startswith("records.0."):
    _set(docs[k]["records"][0], field[len("records.0."):], value)
  else:
    _set(docs[k], field, value)
  text = refusal(write_lines(tmp_path / "r.jsonl.gz", docs))
  where = f"{tmp_path / 'r.jsonl.gz'}" + ("" if field is None else f" line {k + 1}")
  assert text == f"{where}: {tail}"


def test_a_5000_digit_number_and_deep_nesting_are_refused_before_parsing(results_file, tmp_path):
  docs = lines_of(results_file)
  k = job_line(docs)
  body = json.dumps(docs[k]).replace('"stale": false', '"stale": false, "x": ' + "9" * 5000)
  path = write_lines(tmp_path / "r.jsonl.gz", docs, {k: body})
  assert refusal(path) == f"{path} line {k + 1}: the line: a number of 5000 characters (at most 40)"
  deep = "[" * 100_000 + "]" * 100_000
  path = write_lines(tmp_path / "d.jsonl.gz", docs, {k: deep})
  assert refusal(path) == f"{path} line {k + 1}: the line: nested 100000 deep, more than the 32 a results file uses"


def test_a_line_inflating_past_its_cap_is_refused_within_the_memory_cap(results_file, tmp_path):
  docs = lines_of(results_file)
  path = tmp_path / "big.jsonl.gz"
  with gzip.open(path, "wb", compresslevel=1) as g:
    g.write(json.dumps(docs[0]).encode() + b"\n")
    for _ in range(64):  # one line of 64 MiB from a file of ~64 KB
      g.write(b" " * (1 << 20))
    g.write(b"\n")
  assert os.path.getsize(path) < 1 << 20
  code, out, err = report_cli(path, tmp_path / "out")
  assert code == 2 and err.count("\n") == 1, (code, err[-3000:])
  assert err.strip() == (f"error: {path}: line 2 is longer than 16777216 bytes, the cap on one line; not reading it; "
                         "not a results file this library reads")


def test_nan_in_a_finished_job_and_done_without_summary_are_named(results_file, tmp_path):
  docs = lines_of(results_file)
  nan_k, bare_k = job_line(docs, seed=1), job_line(docs, seed=2)
  docs[nan_k]["summary"]["selection"]["heldout_domain"]["test"]["accuracy"] = float("nan")
  del docs[bare_k]["summary"], docs[bare_k]["records"]
  path = write_lines(tmp_path / "r.jsonl.gz", docs)
  data = results_lib.read(path)
  assert data.notes == [
      f"{path}: line {nan_k + 1}: job {docs[nan_k]['key']} finished with NaN in "
      "summary.selection.heldout_domain.test.accuracy; cells that read it leave the job out (its seed counts as "
      "missing)",
      f"{path}: line {bare_k + 1}: job {docs[bare_k]['key']} is marked done but holds no summary; left out of every "
      "cell (its seed counts as missing)"]
  table = collect.tables(data, "heldout_domain")
  cell = next(c for (m, col), c in table.cells.items() if m == "fedavg" and col[0] == 1)
  seed0 = docs[job_line(docs, seed=0)]["summary"]["selection"]["heldout_domain"]["test"]["accuracy"]
  assert cell.values == (seed0,) and cell.expected == 3  # n = 1/3, and the output says why
  code, out, err = report_cli(path, tmp_path / "out")
  assert code == 0, err[-3000:]
  assert [l for l in out.splitlines() if l.startswith("note: ")] == [f"note: {n}" for n in data.notes]


def test_the_files_the_report_writes_read_back_without_notes(results_file):
  data = results_lib.read(results_file)
  assert data.notes == [] and len(data.exp.jobs) == len(lines_of(results_file)) - 1
