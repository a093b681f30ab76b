"""The committed reports' tables recomputed from their results files with gzip, json, the
statistics module and SciPy only (none of fedjax_dg's reading code): every held-out-domain and
in-domain cell, which cells are bold, and, where the table ran seeds at a search's winners,
that each cell's trial is the search trial with the best held-out validation score."""
import gzip
import json
import math
import os
import re
import statistics

import pytest
from scipy import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = sorted(d for d in os.listdir(os.path.join(ROOT, "experiments"))
                 if os.path.exists(os.path.join(ROOT, "experiments", d, "results.jsonl.gz"))
                 and os.path.exists(os.path.join(ROOT, "experiments", d, "tables.md")))
RULES = {"heldout_domain": "held-out-domain validation", "in_domain": "in-domain validation"}


def read_docs(folder):
  with gzip.open(os.path.join(ROOT, "experiments", folder, "results.jsonl.gz"), "rt") as f:
    docs = [json.loads(line) for line in f]
  assert docs[0]["kind"] == "header"
  return docs[0]["sweep"], docs[1:]


def column_of(axes):
  C = int(axes["num_clients"])
  return "C=1 (centralised)" if C == 1 else f"C={C}, λ={float(axes['lam']):g}"


def score_at(doc, rule):
  """Test accuracy at the round the run's own `rule` selection names (its summary)."""
  r = doc["summary"]["selection"][rule]["round"]
  return next(rec["splits"]["test"]["accuracy"] for rec in doc["records"] if rec["round"] == r)


def expected_cells(sweep, docs, rule):
  """(display name, column) -> {seed: score} from the table grid's finished runs, and
  (display name, column) -> number of seeds the grid asked for."""
  grid, display = sweep["table"]["grid"], sweep["table"]["display"]
  scores, asked = {}, {}
  for d in docs:
    for e in d["entries"]:
      if e["grid"] != grid:
        continue
      k = (display.get(e["axes"]["method"], e["axes"]["method"]), column_of(e["axes"]))
      asked.setdefault(k, set()).add(e["axes"]["seed"])
      if d["state"] == "done":
        scores.setdefault(k, {})[e["axes"]["seed"]] = score_at(d, rule)
  return scores, asked


def parse_table(text, title):
  """{(method label, column label): cell text} of the markdown table under `title`."""
  block = text.split(title, 1)[1].split("\n\n", 2)[1]
  lines = block.strip().splitlines()
  header = [h.strip() for h in lines[0].split("|")[1:-1]]
  cells = {}
  for line in lines[2:]:
    parts = [p.strip() for p in line.split("|")[1:-1]]
    for col, text_ in zip(header[2:], parts[2:]):
      cells[(parts[1], col)] = text_
  return cells


def welch_significant(a, b):
  """Welch's two-sided t-test of a above b at p < 0.05 (SciPy); two constant cells differ
  for certain when their means differ (SciPy's statistic is undefined there)."""
  if len(a) < 2 or len(b) < 2:
    return False
  if statistics.variance(a) == 0 and statistics.variance(b) == 0:
    return statistics.mean(a) > statistics.mean(b)
  res = stats.ttest_ind(a, b, equal_var=False)
  return res.pvalue < 0.05 and statistics.mean(a) > statistics.mean(b)


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_cell_and_every_bold_mark_from_the_results_file(folder, rule):
  sweep, docs = read_docs(folder)
  text = open(os.path.join(ROOT, "experiments", folder, "tables.md"), encoding="utf-8").read()
  table = parse_table(text, f"model selection: {RULES[rule]}")
  scores, asked = expected_cells(sweep, docs, rule)
  assert set(asked) <= set(table)
  columns = sorted({c for _, c in table})
  checked = 0
  for (label, col), cell in table.items():
    plain = cell.strip("*").rstrip("†")
    if (label, col) not in asked:
      assert plain == "-", (label, col, cell)
      continue
    v = [s for _, s in sorted(scores.get((label, col), {}).items())]
    if not v:
      assert plain == "X", (label, col, cell)
      continue
    n = f"n={len(v)}" if len(v) == len(asked[(label, col)]) else f"n={len(v)}/{len(asked[(label, col)])}"
    se = f" ± {statistics.stdev(v) / math.sqrt(len(v)):.3f}" if len(v) > 1 else ""
    assert plain == f"{statistics.mean(v):.3f}{se} ({n})", (folder, rule, label, col)
    checked += 1
  assert checked >= len(asked) // 2
  rows = list(dict.fromkeys(label for label, _ in table))
  for col in columns:
    ranked = sorted(((statistics.mean(scores[(lab, col)].values()), -i, lab) for i, lab in enumerate(rows)
                     if scores.get((lab, col))), reverse=True)
    bold = {lab for lab in rows if table[(lab, col)].startswith("**")}
    if len(ranked) < 2 or ranked[0][0] == ranked[1][0]:
      assert not bold, (folder, rule, col)
      continue
    a, b = (list(scores[(ranked[k][2], col)].values()) for k in (0, 1))
    assert bold == ({ranked[0][2]} if welch_significant(a, b) else set()), (folder, rule, col)


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_table_runs_at_the_search_trial_with_the_best_heldout_validation_score(folder):
  """Where the table grid takes its trials from a search grid (seed 001 App. D.4), each
  cell's seeds ran at the trial whose mean held-out validation score (at each run's own
  held-out selection) is the highest of its search cell."""
  sweep, docs = read_docs(folder)
  grid = sweep["grids"][sweep["table"]["grid"]]
  source = grid.get("select_from")
  if not source:
    pytest.skip(f"{folder}: its table runs no search")
  val = {}
  for d in docs:
    for e in d["entries"]:
      if e["grid"] == source and d["state"] == "done":
        ax = e["axes"]
        val.setdefault((ax["method"], column_of(ax)), {}).setdefault(ax["trial"], []).append(
            d["summary"]["selection"]["heldout_domain"]["val"]["accuracy"])
  cells = 0
  for d in docs:
    for e in d["entries"]:
      if e["grid"] != sweep["table"]["grid"]:
        continue
      trials = val[(e["axes"]["method"], column_of(e["axes"]))]
      best = max(statistics.mean(v) for v in trials.values())
      assert statistics.mean(trials[e["axes"]["trial"]]) == best, (e["axes"], trials)
      cells += 1
  assert cells


def test_the_parser_reads_what_it_is_given():
  text = ("### Test accuracy, model selection: held-out-domain validation (x)\n\n"
          "| group | method | C=1 (centralised) | C=4, λ=1 |\n|---|---|---:|---:|\n"
          "| B | FedAvg-ERM | **0.500 ± 0.010 (n=3)** | - |\n\nCells: ...\n")
  assert parse_table(text, "model selection: held-out-domain validation") == {
      ("FedAvg-ERM", "C=1 (centralised)"): "**0.500 ± 0.010 (n=3)**", ("FedAvg-ERM", "C=4, λ=1"): "-"}
  assert re.fullmatch(r"C=4, λ=0\.1", column_of({"num_clients": 4, "lam": 0.1}))
