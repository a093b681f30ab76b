"""The committed reports recomputed from their results files with gzip, json, the
statistics module and SciPy only (none of fedjax_dg's reading code): every held-out-domain and
in-domain cell, which cells are bold, where the table ran seeds at a search's winners that
each cell's trial is the search trial with the best held-out validation score, and the
reading's p-values and verdicts for remark 4.1 and the seed papers' claims."""
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


VAL_SPLIT = {"heldout_domain": "heldout_val", "in_domain": "in_val"}


def score_at(doc, rule):
  """Test accuracy at the evaluation round with the highest validation accuracy under `rule`
  (the first such round on a tie), recomputed from the run's records; the round must be the
  one the run's own summary names."""
  best = None
  for rec in doc["records"]:
    if "splits" not in rec:
      continue
    v = rec["splits"][VAL_SPLIT[rule]]["accuracy"]
    if best is None or v > best[0]:
      best = (v, rec["round"], rec["splits"]["test"]["accuracy"])
  assert best[1] == doc["summary"]["selection"][rule]["round"], (doc["key"], rule, best)
  return best[2]


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


# ---------------------------------------------------------------------------- the reading

CELL = r"\d\.\d{3}(?: ± \d\.\d{3})? \(n=[\d/]+\)†?"
P = r"p = \d\.\d{3}|p < 0\.001"


def welch_p(a, b):
  """Welch's two-sided p (SciPy); two constant cells: 1 if their means are equal, else 0."""
  if statistics.variance(a) == 0 and statistics.variance(b) == 0:
    return 1.0 if statistics.mean(a) == statistics.mean(b) else 0.0
  return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def p_text(p):
  return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def holm_by_hand(ps: dict) -> dict:
  """Holm (1979): the k-th smallest of m p-values times (m - k + 1), then a running maximum."""
  out, running = {}, 0.0
  for k, key in enumerate(sorted(ps, key=ps.get)):
    running = max(running, min(1.0, (len(ps) - k) * ps[key]))
    out[key] = running
  return out


def reading_sections(folder):
  text = open(os.path.join(ROOT, "experiments", folder, "REPORT.md"), encoding="utf-8").read()
  reading = text.split("## Reading", 1)[1]
  return re.findall(r"^\*\*(.+): (.+?)\.\*\*\n\n((?:- .*\n?)+)", reading, flags=re.M)


def verdict_words(outcomes):
  """The verdict of an "every testable comparison" claim, from seed 001's wording as the
  report states it: holds / does not hold / holds in part / no difference / cannot tell."""
  testable = [o for o in outcomes if o != "cannot tell"]
  k = sum(o == "higher" for o in testable)
  if not testable:
    return "cannot tell"
  if all(o == "no difference" for o in testable):
    return "no difference"
  return "holds" if k == len(testable) else "does not hold" if k == 0 else "holds in part"


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_readings_p_values_and_verdicts_from_the_results_file(folder):
  """Remark 4.1 (each listed method's Welch p and its Holm-adjusted p over the column's
  testable methods, which methods are significantly above or below, how many show no
  difference) and each seed paper's claim against FedAvg-ERM (each column's p and word, the
  verdict), recomputed from the results file with SciPy and Holm by hand."""
  sweep, docs = read_docs(folder)
  scores, _ = expected_cells(sweep, docs, "heldout_domain")
  values = {k: [s for _, s in sorted(v.items())] for k, v in scores.items()}
  baseline = sweep["table"]["display"].get("fedavg", "fedavg")
  sections = reading_sections(folder)
  checked, claims = 0, 0
  for title, verdict, body in sections:
    if title.startswith("Remark 4.1"):
      for line in body.splitlines():
        col = line[2:].split(": ", 1)[0]
        base = values[(baseline, col)]
        others = {lab: v for (lab, c), v in values.items() if c == col and lab != baseline}
        testable = {lab: welch_p(v, base) for lab, v in others.items() if len(v) > 1 and len(base) > 1}
        adj = holm_by_hand(testable)
        sig = {lab for lab in testable if adj[lab] < 0.05}
        above = {lab for lab in sig if statistics.mean(others[lab]) > statistics.mean(base)}
        listed = {m.group(1): (m.group(2), m.group(3)) for m in
                  re.finditer(rf"([\w+\-]+) {CELL} \(({P}), Holm ({P})\)", line)}
        assert set(listed) == sig, (folder, line)
        for lab, (p, h) in listed.items():
          assert (p, h) == (p_text(testable[lab]), p_text(adj[lab])), (folder, lab, col)
        assert ("significantly above it: " in line) == bool(above)
        same = len(testable) - len(sig)
        assert (f"no difference: {same}" in line) == bool(same), (folder, line)
        checked += 1
    elif " beats " in title:
      method = title.split(" (", 1)[0]
      outcomes = []
      for line in body.splitlines():
        if line == "- (no finished runs for this)":  # e.g. a method whose cells are all X
          assert not any(values.get((method, c)) for _, c in values), (folder, title)
          continue
        m = re.fullmatch(rf"- (C=\d+, λ=[\d.]+): (.+?) {CELL} vs (.+?) {CELL}: (.+) \(({P}|untestable)\)", line)
        assert m and m.group(2) == method and m.group(3) == baseline, (folder, line)
        a, b = values[(method, m.group(1))], values[(baseline, m.group(1))]
        if len(a) < 2 or len(b) < 2:
          o, text = "cannot tell", "untestable"
        else:
          p = welch_p(a, b)
          o = "no difference" if p >= 0.05 else "higher" if statistics.mean(a) > statistics.mean(b) else "lower"
          text = p_text(p)
        assert (m.group(4), m.group(5)) == ({"higher": "holds", "lower": "does not hold (below the baseline)",
                                             "no difference": "no difference", "cannot tell": "cannot tell"}[o],
                                            text), (folder, line)
        outcomes.append(o)
        checked += 1
      assert verdict.split(" (", 1)[0] == verdict_words(outcomes), (folder, title, verdict)
      claims += 1
  assert checked and claims == sum(" beats " in t for t, _, _ in sections) > 0
