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
  one the run's own summary names. A method of several stages (FedLOE) is selected among its
  final stage's rounds (`summary["stages"]`): the method is the whole procedure."""
  first, last = (doc["summary"].get("stages") or [{"rounds": [0, math.inf]}])[-1]["rounds"]
  best = None
  for rec in doc["records"]:
    if "splits" not in rec or not first <= rec["round"] <= last:
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


def outcome(a, b, alpha=0.05):
  if len(a) < 2 or len(b) < 2:
    return "cannot tell", "untestable"
  p = welch_p(a, b)
  o = "no difference" if p >= alpha else "higher" if statistics.mean(a) > statistics.mean(b) else "lower"
  return o, p_text(p)


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
        o, text = outcome(values[(method, m.group(1))], values[(baseline, m.group(1))])
        assert (m.group(4), m.group(5)) == ({"higher": "holds", "lower": "does not hold (below the baseline)",
                                             "no difference": "no difference", "cannot tell": "cannot tell"}[o],
                                            text), (folder, line)
        outcomes.append(o)
        checked += 1
      assert verdict.split(" (", 1)[0] == verdict_words(outcomes), (folder, title, verdict)
      claims += 1
  assert checked and claims == sum(" beats " in t for t, _, _ in sections) > 0


def verdict_most(outcomes):
  """A "most comparisons" claim (remarks 4.2 and 4.7): holds when more than half of the
  testable comparisons support it; "no difference" when every testable one is."""
  testable = [o for o in outcomes if o != "cannot tell"]
  if not testable:
    return "cannot tell"
  if all(o == "no difference" for o in testable):
    return "no difference"
  return "holds" if 2 * sum(o == "higher" for o in testable) > len(testable) else "does not hold"


def grid_points(sweep, docs, grid, fields):
  """{tuple of the entry's `fields`: [score by seed]} of one grid's finished runs at the
  held-out selection; a centralised entry (lam None) stands in every lambda of its grid."""
  lams = sweep["grids"][grid].get("lams", [None])
  pts = {}
  for d in docs:
    for e in d["entries"]:
      if e["grid"] != grid or d["state"] != "done":
        continue
      for lam in (lams if e["axes"]["lam"] is None else [e["axes"]["lam"]]):
        ax = {**e["axes"], "lam": lam}
        pts.setdefault(tuple(ax[f] for f in fields), {})[ax["seed"]] = score_at(d, "heldout_domain")
  return {k: [s for _, s in sorted(v.items())] for k, v in pts.items()}


def point_text(v):
  se = f" ± {statistics.stdev(v) / math.sqrt(len(v)):.3f}" if len(v) > 1 else ""
  return f"{statistics.mean(v):.3f}{se} (n={len(v)})"


def section_of(folder, prefix):
  found = [(v, body) for t, v, body in reading_sections(folder) if t.startswith(prefix)]
  assert len(found) <= 1, (folder, prefix)
  return found[0] if found else (None, "")


@pytest.mark.parametrize("folder", FOLDERS)
def test_remarks_4_2_4_7_and_4_8_from_the_results_file(folder):
  """Remark 4.2 (each DG method's centralised cell against every federated column, and
  lambda = 1 against 0.1 per C), remark 4.7 (per Fig. 2 panel and method, the smallest C
  against the largest, at fixed epochs and at fixed steps) and remark 4.8 (per Fig. 3 panel,
  the interior schedule with the best mean against both ends at alpha / interior schedules):
  every cited cell, word, p-value and verdict recomputed from the results file with SciPy."""
  sweep, docs = read_docs(folder)
  names = sweep["table"]["display"]
  name = lambda m: names.get(m, m)  # noqa: E731
  scores, _ = expected_cells(sweep, docs, "heldout_domain")
  values = {k: [s for _, s in sorted(v.items())] for k, v in scores.items()}
  dg = [name(m) for g, ms in sweep["table"]["groups"] if g == "DG adapted" for m in ms]
  dg = [m for m in dg if any(lab == m for lab, _ in values)]
  checked = 0

  verdict, body = section_of(folder, "Remark 4.2, DG methods degrade in FL")
  if verdict is not None:
    outcomes = []
    for line in body.splitlines():
      who, rest = line[2:].split(": C=1 ", 1)
      m = who.removesuffix(" (the baseline, for comparison)")
      cen, *parts = rest.split("; ")
      assert cen == point_text(values[(m, "C=1 (centralised)")]), (folder, line)
      for part in parts:
        g = re.fullmatch(rf"(C=\d+, λ=[\d.]+) ({CELL}): (\w[\w ]*) \(({P}|untestable)\)", part)
        assert g and g.group(2) == point_text(values[(m, g.group(1))]), (folder, part)
        o, p = outcome(values[(m, "C=1 (centralised)")], values[(m, g.group(1))])
        word = {"higher": "degrades", "lower": "improves"}.get(o, o)
        assert (g.group(3), g.group(4)) == (word, p), (folder, m, part)
        if m != who:
          continue
        outcomes.append(o)
        checked += 1
    assert {line[2:].split(":", 1)[0] for line in body.splitlines()} >= set(dg)
    assert verdict.split(" (", 1)[0] == verdict_most(outcomes), (folder, verdict)

  verdict, body = section_of(folder, "Remark 4.2, DG methods degrade from")
  if verdict is not None:
    outcomes = []
    for line in body.splitlines():
      g = re.fullmatch(rf"- (.+) at C=(\d+): λ=1 ({CELL}) vs λ=0\.1 ({CELL}): (\w[\w ]*) \(({P}|untestable)\)", line)
      assert g, (folder, line)
      a, b = values[(g.group(1), f"C={g.group(2)}, λ=1")], values[(g.group(1), f"C={g.group(2)}, λ=0.1")]
      o, p = outcome(a, b)
      assert (g.group(3), g.group(4), g.group(5), g.group(6)) == (
          point_text(a), point_text(b), {"higher": "degrades", "lower": "improves"}.get(o, o), p), (folder, line)
      outcomes.append(o)
      checked += 1
    assert verdict.split(" (", 1)[0] == verdict_most(outcomes), (folder, verdict)

  for key, what in (("clients_grid", "at a fixed number of local epochs"), ("clients_steps_grid", "at a fixed number of local steps")):
    grid = sweep["figures"].get(key, "")
    verdict, body = section_of(folder, f"Remark 4.7, accuracy falls with the number of clients, {what}")
    if not grid or grid not in sweep["grids"]:
      assert verdict is None, (folder, key)
      continue
    pts = grid_points(sweep, docs, grid, ("lam", "method", "num_clients"))
    panels = {(lam, m) for lam, m, _ in pts}
    lines = body.splitlines()
    assert len(lines) == sum(len({c for l2, m2, c in pts if (l2, m2) == pm}) > 1 for pm in panels), (folder, key)
    outcomes = []
    for line in lines:
      g = re.fullmatch(rf"- λ=([\d.]+) (.+?): (.+); C=(\d+) vs C=(\d+): (\w[\w ]*) \(({P}|untestable)\)", line)
      assert g, (folder, line)
      m = next(m for lam, m in panels if name(m) == g.group(2) and lam == float(g.group(1)))
      cs = sorted(c for lam, m2, c in pts if lam == float(g.group(1)) and m2 == m)
      run = lambda c: pts[(float(g.group(1)), m, c)]  # noqa: E731
      assert g.group(3) == ", ".join(f"C={c} {point_text(run(c))}" for c in cs), (folder, line)
      assert (int(g.group(4)), int(g.group(5))) == (cs[0], cs[-1])
      o, p = outcome(run(cs[0]), run(cs[-1]))
      assert (g.group(6), g.group(7)) == ({"higher": "falls", "lower": "rises"}.get(o, o), p), (folder, line)
      outcomes.append(o)
      checked += 1
    assert verdict.split(" (", 1)[0] == verdict_most(outcomes), (folder, verdict)

  grid = sweep["figures"].get("rounds_grid", "")
  verdict, body = section_of(folder, "Remark 4.8")
  if grid and grid in sweep["grids"]:
    pts = grid_points(sweep, docs, grid, ("num_clients", "lam", "method", "num_rounds"))
    outcomes = []
    for line in body.splitlines():
      g = re.fullmatch(rf"- C=(\d+) λ=([\d.]+) (.+?): (.+); best interior R=(\d+) \(of (\d+), Bonferroni p < ([\d.]+)\) "
                       rf"vs R=(\d+): ([\w ]+?), Welch ({P}|untestable), vs R=(\d+): ([\w ]+?), Welch ({P}|untestable)", line)
      assert g, (folder, line)
      C, lam = int(g.group(1)), float(g.group(2))
      m = next(m for c, l2, m, _ in pts if (c, l2) == (C, lam) and name(m) == g.group(3))
      rs = sorted(r for c, l2, m2, r in pts if (c, l2, m2) == (C, lam, m))
      run = lambda r: pts[(C, lam, m, r)]  # noqa: E731
      assert g.group(4) == ", ".join(f"R={r} {point_text(run(r))}" for r in rs), (folder, line)
      mid = max(rs[1:-1], key=lambda r: statistics.mean(run(r)))
      alpha = 0.05 / (len(rs) - 2)
      assert (int(g.group(5)), int(g.group(6)), g.group(7)) == (mid, len(rs) - 2, f"{alpha:.3g}"), (folder, line)
      ends = [outcome(run(mid), run(end), alpha) for end in (rs[0], rs[-1])]
      assert (int(g.group(8)), g.group(9), g.group(10), int(g.group(11)), g.group(12), g.group(13)) == (
          rs[0], ends[0][0], ends[0][1], rs[-1], ends[1][0], ends[1][1]), (folder, line)
      os_ = [o for o, _ in ends]
      outcomes.append("cannot tell" if "cannot tell" in os_ else "higher" if os_ == ["higher", "higher"]
                      else "lower" if "lower" in os_ else "no difference")
      checked += 1
    assert verdict.split(" (", 1)[0] == verdict_words(outcomes), (folder, verdict)
  assert checked
