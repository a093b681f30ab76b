"""The committed reports recomputed from their results files with gzip, json, the
statistics module and SciPy only (none of fedjax_dg's reading code): every held-out-domain and
in-domain cell (mean ± sample standard deviation, n), which cells are bold (the paired t-test
where the two cells ran the same seeds, else Welch's), where the table ran seeds at a
search's winners that each cell's trial is the search trial with the best held-out
validation score, and the reading's tests and verdicts: remark 4.1 and the method papers'
claims (paired by seed, Holm within the family, two one-sided tests at the margin, the
detectable difference from the noncentral t), remarks 4.2, 4.7 and 4.8 (Welch, with their
detectable differences)."""
import functools
import gzip
import json
import math
import os
import re
import statistics

import numpy as np
import pytest
from scipy import optimize, stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = sorted(d for d in os.listdir(os.path.join(ROOT, "experiments"))
                 if os.path.exists(os.path.join(ROOT, "experiments", d, "results.jsonl.gz"))
                 and os.path.exists(os.path.join(ROOT, "experiments", d, "tables.md")))
RULES = {"heldout_domain": "held-out-domain validation", "in_domain": "in-domain validation"}


SUMMARY_READ = ("stages", "selection", "preflight", "activity")  # what these tests read of a summary


def slim(doc):
  """A job's document with only what these tests read: each pytest-xdist worker holds a
  whole results file (the second Fashion-MNIST edition's 1,853 jobs: 81 MB slim, 181 MB whole)."""
  out = {k: doc[k] for k in ("key", "state", "entries") if k in doc}
  if "summary" in doc:
    out["summary"] = {k: doc["summary"][k] for k in SUMMARY_READ if k in doc["summary"]}
  if "records" in doc:
    out["records"] = [{"round": r["round"], **({"splits": {name: {k: v for k, v in m.items() if k == "accuracy"}
                                                           for name, m in r["splits"].items()}}
                                                if "splits" in r else {})} for r in doc["records"]]
  return out


@functools.lru_cache(maxsize=2)  # read once a worker: the tests only read what it returns
def read_docs(folder):
  with gzip.open(os.path.join(ROOT, "experiments", folder, "results.jsonl.gz"), "rt") as f:
    header = json.loads(f.readline())
    docs = [slim(json.loads(line)) for line in f]
  assert header["kind"] == "header"
  return header["sweep"], docs


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


def run_mark_by_hand(doc):
  """"ᵃ" when a preflight finding of the run says it computes the baseline's update exactly,
  "ᵇ" when one says its method's term does not act or its activity record says the scheduled
  weight was never at its target, "" otherwise."""
  sm = doc["summary"]
  findings = sm.get("preflight") or []
  if any(f.get("equals_baseline") for f in findings):
    return "ᵃ"
  if any(f.get("inactive") for f in findings) or (sm.get("activity") or {}).get("weight_at_target") == 0:
    return "ᵇ"
  return ""


def expected_cells(sweep, docs, rule, with_marks=False):
  """(display name, column) -> {seed: score} from the finished runs of the grid the rule's
  table is built from (the in-domain grid for in-domain selection where the sweep names one),
  and (display name, column) -> number of seeds the grid asked for; a cell any of whose runs
  is marked (`run_mark_by_hand`: "ᵃ" before "ᵇ") is left out of the scores and, with
  `with_marks`, returned in a third dict {(name, column): mark}."""
  grid = sweep["table"]["grid"]
  if rule == "in_domain" and sweep["table"].get("in_domain_grid"):
    grid = sweep["table"]["in_domain_grid"]
  return grid_cells(sweep, docs, grid, rule, with_marks)


def grid_cells(sweep, docs, grid, rule, with_marks=False):
  """`expected_cells` of any seeds grid."""
  display = sweep["table"]["display"]
  scores, asked, marks = {}, {}, {}
  for d in docs:
    for e in d["entries"]:
      if e["grid"] != grid:
        continue
      k = (display.get(e["axes"]["method"], e["axes"]["method"]), column_of(e["axes"]))
      asked.setdefault(k, set()).add(e["axes"]["seed"])
      if d["state"] == "done":
        scores.setdefault(k, {})[e["axes"]["seed"]] = score_at(d, rule)
        mark = run_mark_by_hand(d)
        if mark and marks.get(k) != "ᵃ":
          marks[k] = mark
  for k in marks:
    scores.pop(k, None)
  return (scores, asked, marks) if with_marks else (scores, asked)


def control_cells(sweep, docs):
  """(display name, column) -> {seed: score} of the held-out table's cells marked "ᵃ" (a run
  computes the baseline's update by construction): the reading's negative controls."""
  grid, display = sweep["table"]["grid"], sweep["table"]["display"]
  scores, marks = {}, {}
  for d in docs:
    for e in d["entries"]:
      if e["grid"] != grid or d["state"] != "done":
        continue
      k = (display.get(e["axes"]["method"], e["axes"]["method"]), column_of(e["axes"]))
      scores.setdefault(k, {})[e["axes"]["seed"]] = score_at(d, "heldout_domain")
      if run_mark_by_hand(d) == "ᵃ":
        marks[k] = "ᵃ"
  return {k: v for k, v in scores.items() if k in marks}


CONTROL_WORDS = {"better": "above", "worse": "below", "equivalent": "equivalent", "inconclusive": "inconclusive"}


def check_negative_controls(col, parts, base, controls, res, text, folder):
  """A remark 4.1 column's negative controls (its -ᵃ cells against the baseline, paired, Holm
  over them by hand) as its line cites them, and the paragraph that reads them: how far the
  controls moved the baseline and which of the column's decided methods (`res`, by hand) lie
  within that distance."""
  ctrl = {lab: v for (lab, c), v in controls.items() if c == col}
  prefix = "negative controls, the -ᵃ cells: the baseline's update at their own search's winner (paired, Holm over them): "
  got = next((p[len(prefix):] for p in parts if p.startswith(prefix)), None)
  if not ctrl:
    assert got is None, (folder, col)
    return
  labs = list(ctrl)
  fam = dict(zip(labs, family_by_hand([(ctrl[lab], base) for lab in labs])))
  want = {}
  for lab, (o, t, _, _) in fam.items():
    if o == "cannot tell":
      want[lab] = "untestable"
      continue
    m = re.search(r" diff ([+-]\d\.\d{3}) \(SE [\d.]+\), p [<=] [\d.]+, Holm (p [<=] [\d.]+)", t)
    want[lab] = f"{m.group(1)} {CONTROL_WORDS[o]} (Holm {m.group(2)})"
  cited = {m.group(1): m.group(2) for m in re.finditer(r"([\w+\-]+) ((?:[+-]\d\.\d{3} \w+ \(Holm p [<=] [\d.]+\))|untestable)", got)}
  assert cited == want, (folder, col, cited, want)
  for side, word in (("better", "above"), ("worse", "below")):
    hit = [lab for lab, r in fam.items() if r[0] == side]
    para = next((l for l in text.splitlines() if l.startswith(f"Negative controls, {col}: ")
                 and f" significantly {word} " in l), None)
    assert (para is not None) == bool(hit), (folder, col, side)
    if hit:
      far = max(abs(float(re.search(r" diff ([+-][\d.]+)", fam[lab][1]).group(1))) for lab in hit)
      decided = {lab: float(re.search(r" diff ([+-][\d.]+)", r[1]).group(1)) for lab, r in res.items() if r[0] == side}
      within = [f"{lab} {d:+.3f}" for lab, d in decided.items() if abs(d) <= far]
      if within:
        assert f"in this column, {', '.join(within)} li" in para, (folder, col, para)
      else:
        assert " lies within that distance" not in para and " lie within that distance" not in para, (folder, para)


def check_pooled_baseline(col, base, controls, others, text, folder):
  """A remark 4.1 column's pooled baseline (the per-seed mean of the baseline's cell and its
  -ᵃ cells, on the seeds all of them hold), by hand, and every method of the column against
  it (paired by seed, Holm over the column's methods): its paragraph's mean ± sd, who is
  significantly above or below it (difference and Holm p) and who is inconclusive."""
  ctrl = {lab: v for (lab, c), v in controls.items() if c == col}
  para = next((l for l in text.splitlines() if l.startswith(f"Pooled baseline, {col}: ")), None)
  seeds = sorted(set(base).intersection(*(set(v) for v in ctrl.values()))) if ctrl else []
  if not ctrl or len(seeds) < 2 or not others:
    assert para is None, (folder, col)
    return
  assert para is not None, (folder, col)
  pooled = {k: float(np.mean([base[k]] + [v[k] for v in ctrl.values()])) for k in seeds}
  named = re.search(r" negative controls? \(([^;]+); (\d+) replicates", para)
  assert set(named.group(1).split(", ")) == set(ctrl) and int(named.group(2)) == len(ctrl) + 1, (folder, para)
  vals = list(pooled.values())
  assert f"), {np.mean(vals):.3f} ± {np.std(vals, ddof=1):.3f} (n={len(vals)})," in para, (folder, para)
  labs = list(others)
  res = dict(zip(labs, family_by_hand([(others[lab], pooled) for lab in labs])))
  body = para.split("; each method's cell still rests on one search of its own): ", 1)[1].rstrip(".")
  parts = body.split("; ")
  for side, prefix in (("better", "significantly above it: "), ("worse", "significantly below it: ")):
    got = next((p[len(prefix):] for p in parts if p.startswith(prefix)), "")
    cited = {m.group(1): (m.group(2), m.group(3), bool(m.group(4)))
             for m in re.finditer(r"([\w+\-]+) ([+-]\d\.\d{3}) \(Holm (p [<=] [\d.]+)(, Wilcoxon disagrees)?\)", got)}
    want = {}
    for lab, r in res.items():
      if r[0] == side:
        m = re.search(r" diff ([+-]\d\.\d{3}) \(SE [\d.]+\), p [<=] [\d.]+, Holm (p [<=] [\d.]+)", r[1])
        want[lab] = (*m.groups(), ", disagrees)" in r[1])
    assert cited == want, (folder, col, side, cited, want)
  for side, prefix in (("equivalent", f"equivalent within ±{MARGIN:g}: "), ("inconclusive", "inconclusive: ")):
    got = next((p[len(prefix):].split(", ") for p in parts if p.startswith(prefix)), [])
    assert set(got) == {lab for lab, r in res.items() if r[0] == side}, (folder, col, side)
  mdds = [r[2] for r in res.values() if r[2] is not None]
  assert f"detectable (80% power at Holm's first level 0.05/{len(mdds)}): median {np.median(mdds):.3f}" in para


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


def lead_significant(a: dict, b: dict):
  """{seed: score} a above b at p < 0.05: SciPy's paired t-test where both cells ran the same
  seeds (the runs share their random numbers), paired on the seeds both hold where they
  share two or more, else Welch's."""
  seeds = sorted(set(a) & set(b))
  if len(seeds) < 2:
    return welch_significant(list(a.values()), list(b.values()))
  d = [a[k] - b[k] for k in seeds]
  if len(d) < 2:
    return False
  if statistics.variance(d) == 0:
    return statistics.mean(d) > 0
  return stats.ttest_rel([a[k] for k in seeds], [b[k] for k in seeds]).pvalue < 0.05 and statistics.mean(d) > 0


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
  scores, asked, marks = expected_cells(sweep, docs, rule, with_marks=True)
  assert set(asked) <= set(table)
  columns = sorted({c for _, c in table})
  checked = 0
  for (label, col), cell in table.items():
    plain = cell.strip("*").rstrip("†")
    if (label, col) not in asked:
      assert plain == "-", (label, col, cell)
      continue
    if (label, col) in marks:
      assert plain == "-" + marks[(label, col)], (folder, rule, label, col, cell)
      continue
    v = [s for _, s in sorted(scores.get((label, col), {}).items())]
    if not v:
      assert plain == "X", (label, col, cell)
      continue
    n = f"n={len(v)}" if len(v) == len(asked[(label, col)]) else f"n={len(v)}/{len(asked[(label, col)])}"
    sd = f" ± {statistics.stdev(v):.3f}" if len(v) > 1 else ""
    assert plain == f"{statistics.mean(v):.3f}{sd} ({n})", (folder, rule, label, col)
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
    a, b = (scores[(ranked[k][2], col)] for k in (0, 1))
    assert bold == ({ranked[0][2]} if lead_significant(a, b) else set()), (folder, rule, col)


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_table_runs_at_the_search_trial_with_the_best_heldout_validation_score(folder):
  """Where the table grid takes its trials from a search grid (Bai et al. App. D.4), each
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
PD = rf"(?:{P}), detectable \d\.\d{{3}}"  # a Welch comparison with its detectable difference
MARGIN = 0.02


def mdd_by_hand(se, df, alpha, power=0.8):
  """The difference a two-sided t-test at level alpha detects with probability `power`: the
  noncentrality at which SciPy's noncentral t passes the critical value that often, times
  the standard error (the far tail's NaN, where SciPy underflows, counted as 0)."""
  if se == 0:
    return 0.0
  crit = stats.t.ppf(1 - alpha / 2, df)
  pw = lambda x: stats.nct.sf(crit, df, x) + np.nan_to_num(stats.nct.cdf(-crit, df, x))  # noqa: E731
  hi = crit + 1.0
  while pw(hi) < power:
    hi *= 2
  return optimize.brentq(lambda x: pw(x) - power, crit, hi) * se


def welch_se_df(a, b):
  va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
  if va + vb == 0:
    return 0.0, float("nan")
  return math.sqrt(va + vb), (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))


def baseline_test(a: dict, b: dict, margin=MARGIN):
  """{seed: score} a against the baseline b: (kind, diff, se, df, p, wilcoxon p or None,
  TOST p, nonzero paired differences or None), paired (SciPy's ttest_rel, wilcoxon, one-sided one-sample tests of the shifted
  differences) on the seeds both hold where there are two or more ("paired on n common seeds,
  (k unpaired left out)" where the seeds differ), else Welch (ttest_ind, and one-sided Welch
  tests of the shifted cell)."""
  seeds = sorted(set(a) & set(b))
  if len(seeds) >= 2:
    unpaired = len(set(a) ^ set(b))
    kind = "paired" + (f" on {len(seeds)} common seeds ({unpaired} unpaired left out)" if unpaired else "")
    x, y = [a[k] for k in seeds], [b[k] for k in seeds]
    d = np.subtract(x, y)
    diff = float(np.mean(d))
    wp = 1.0 if not np.any(d != 0) else float(stats.wilcoxon(d).pvalue)
    if statistics.variance(list(d)) == 0 or np.std(d, ddof=1) == 0:
      return (kind, diff, 0.0, len(d) - 1, 1.0 if diff == 0 else 0.0, wp,
              0.0 if abs(diff) < margin else 1.0, int(np.count_nonzero(d)))
    p = float(stats.ttest_rel(x, y).pvalue)
    tost = max(stats.ttest_1samp(d + margin, 0.0, alternative="greater").pvalue,
               stats.ttest_1samp(d - margin, 0.0, alternative="less").pvalue)
    return (kind, diff, float(np.std(d, ddof=1) / math.sqrt(len(d))), len(d) - 1, p, wp, float(tost),
            int(np.count_nonzero(d)))
  x, y = list(a.values()), list(b.values())
  se, df = welch_se_df(x, y)
  diff = statistics.mean(x) - statistics.mean(y)
  if se == 0:
    return "welch", diff, 0.0, df, 1.0 if diff == 0 else 0.0, None, 0.0 if abs(diff) < margin else 1.0, None
  p = float(stats.ttest_ind(x, y, equal_var=False).pvalue)
  tost = max(stats.ttest_ind(np.add(x, margin), y, equal_var=False, alternative="greater").pvalue,
             stats.ttest_ind(np.subtract(x, margin), y, equal_var=False, alternative="less").pvalue)
  return "welch", diff, se, df, p, None, float(tost), None


def family_by_hand(pairs, margin=MARGIN, alpha=0.05):
  """[(outcome, text, detectable, zero-difference equivalence bound)] for a family of
  comparisons against the baseline: Holm by hand over the p-values and over the TOST
  p-values, the detectable difference at alpha / m, and the smallest margin at which both
  one-sided tests reject at alpha / m (found by bisection on SciPy's one-sided t-tests)."""
  tests = {i: baseline_test(a, b, margin) for i, (a, b) in enumerate(pairs) if len(a) > 1 and len(b) > 1}
  adj = holm_by_hand({i: t[4] for i, t in tests.items()})
  adj_eq = holm_by_hand({i: t[6] for i, t in tests.items()})
  # The signed-rank check over the same m comparisons, a Welch one counted with p = 1.
  adj_w = holm_by_hand({i: t[5] if t[0].startswith("paired") else 1.0 for i, t in tests.items()})
  out = []
  for i in range(len(pairs)):
    if i not in tests:
      out.append(("cannot tell", "untestable", None, None))
      continue
    kind, diff, se, df, p, wp, _, nonzero = tests[i]
    o = ("better" if diff > 0 else "worse") if adj[i] < alpha else "equivalent" if adj_eq[i] < alpha else "inconclusive"
    mdd = mdd_by_hand(se, df, alpha / len(tests))
    text = f"{kind} diff {diff:+.3f} (SE {se:.3f}), {p_text(p)}, Holm {p_text(adj[i])}"
    if kind.startswith("paired"):
      unreachable = 2.0 / 2 ** nonzero >= alpha / len(tests)  # its smallest exact p above the first level
      text += (f", Wilcoxon {p_text(wp)} (Holm {p_text(adj_w[i])}"
               + (f", cannot reach the level with {df + 1} seeds)" if unreachable
                  else ", disagrees)" if (adj[i] < alpha) != (adj_w[i] < alpha) else ")"))
    bound = equivalence_bound_by_hand(diff, se, df, alpha / len(tests))
    # A decided comparison (better or worse) prints no equivalence test.
    text += (f", detectable {mdd:.3f}" if o in ("better", "worse") else
             f", TOST Holm {p_text(adj_eq[i])}, detectable {mdd:.3f}, equivalence bound {bound:.3f}")
    out.append((o, text, mdd, bound - abs(diff)))
  return out


def non_superiority_by_hand(a, b, margin=MARGIN):
  """(p of the one-sided test of H0: diff >= margin, t_0.95 SE) of cell a against baseline b,
  on `baseline_test`'s difference, SE and degrees of freedom (SciPy's t distribution)."""
  _, diff, se, df, *_ = baseline_test(a, b, margin)
  if se == 0:
    return (0.0 if diff < margin else 1.0), 0.0
  return float(stats.t.cdf((diff - margin) / se, df)), float(stats.t.ppf(0.95, df) * se)


def beyond_margin_by_hand(a, b, margin=MARGIN):
  """p of the one-sided test of H0: diff <= margin of cell a against baseline b (SciPy's t
  distribution), on `baseline_test`'s difference, SE and degrees of freedom."""
  _, diff, se, df, *_ = baseline_test(a, b, margin)
  if se == 0:
    return 0.0 if diff > margin else 1.0
  return float(stats.t.sf((diff - margin) / se, df))


def equivalence_bound_by_hand(diff, se, df, alpha):
  """The margin m at which max(P(T > (diff + m) / se), P(T < (diff - m) / se)) = alpha, by
  bisection (|diff| where se is 0)."""
  if se == 0:
    return abs(diff)
  pmax = lambda m: max(stats.t.sf((diff + m) / se, df), stats.t.cdf((diff - m) / se, df))  # noqa: E731
  lo, hi = 0.0, abs(diff) + 100 * se
  for _ in range(200):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if pmax(mid) > alpha else (lo, mid)
  return hi


def verdict_powered(outcomes, supports="better", labels=None, refuted_by=None):
  """The claim's verdict and counts, as the report's reading words them (`refuted_by`: an
  outcome that alone refutes a claim about every comparison)."""
  testable = [o for o in outcomes if o != "cannot tell"]
  untestable = len(outcomes) - len(testable)
  if not testable:
    return "cannot tell" + (f" ({untestable} comparison{'s' * (untestable > 1)}, none testable)" if untestable else "")
  k = sum(o == supports for o in testable)
  opposite = {"better": "worse", "worse": "better"}.get(supports)  # support and the opposite direction: mixed
  word = ("does not hold" if refuted_by in testable else "holds" if k == len(testable) else
          "mixed" if k and opposite in testable else "holds in part" if k else
          "inconclusive" if all(o == "inconclusive" for o in testable) else
          "not supported" if "inconclusive" in testable else "does not hold")
  labels = labels or {"better": "better", "worse": "worse", "equivalent": f"equivalent within ±{MARGIN:g}",
                      "inconclusive": "inconclusive"}
  counts = ", ".join(f"{testable.count(w)} {lab if isinstance(lab, str) else lab[testable.count(w) != 1]}"
                     for w, lab in labels.items() if w in testable)
  return f"{word} ({counts} of {len(testable)} testable" + (f"; {untestable} cannot tell)" if untestable else ")")


def welch_p(a, b):
  """Welch's two-sided p (SciPy); two constant cells: 1 if their means are equal, else 0."""
  if statistics.variance(a) == 0 and statistics.variance(b) == 0:
    return 1.0 if statistics.mean(a) == statistics.mean(b) else 0.0
  return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def p_text(p):
  """Three decimals, four where three would round onto the level 0.05."""
  return "p < 0.001" if p < 0.001 else f"p = {p:.4f}" if f"{p:.3f}" == "0.050" else f"p = {p:.3f}"


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
  """Welch's outcome and its text, "p = 0.012, detectable 0.045" (the difference the test
  at level alpha detects with 80% power)."""
  if len(a) < 2 or len(b) < 2:
    return "cannot tell", "untestable"
  p = welch_p(a, b)
  o = "no difference" if p >= alpha else "higher" if statistics.mean(a) > statistics.mean(b) else "lower"
  se, df = welch_se_df(a, b)
  return o, f"{p_text(p)}, detectable {mdd_by_hand(se, df, alpha):.3f}"


def verdict_words(outcomes):
  """The verdict of an "every testable comparison" claim, from Bai et al.'s wording as the
  report states it: holds / does not hold / holds in part / no difference / cannot tell."""
  testable = [o for o in outcomes if o != "cannot tell"]
  k = sum(o == "higher" for o in testable)
  if not testable:
    return "cannot tell"
  if all(o == "no difference" for o in testable):
    return "no difference"
  return "holds" if k == len(testable) else "does not hold" if k == 0 else "holds in part"


COLUMN_LABELS = {"supports": ("column with no method the margin or more above it",
                              "columns with no method the margin or more above it"),
                 "against": ("column with a method more than the margin above it",
                             "columns with a method more than the margin above it"),
                 "inconclusive": ("column with none shown more than the margin above it but some possibly that far above",
                                  "columns with none shown more than the margin above it but some possibly that far "
                                  "above")}


OTHER = "'Selection variance'), both on seeds "  # the reading's lines at the other search seed's winners


def seed_range(seeds):
  """"1-10" for three or more consecutive seeds, else "1, 3"."""
  seeds = sorted(seeds)
  if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
    return f"{seeds[0]}-{seeds[-1]}"
  return ", ".join(map(str, seeds))


def winner_source(sweep, grid):
  """Whose winners a seeds grid ran at, read from the sweep config: one search seed's (its
  `select_seeds`, or a search grid of one seed), else the mean over the search's seeds."""
  g = sweep["grids"][grid]
  seeds = sorted(int(s) for s in (g.get("select_seeds") or sweep["grids"][g["select_from"]]["seeds"]))
  return (f"search seed {seeds[0]}'s winners" if len(seeds) == 1
          else f"the winners by the mean over search seeds {', '.join(map(str, seeds))}")


def row_labels(sweep):
  """The table's method labels in its row order (the sweep's groups, then the rest)."""
  display = sweep["table"]["display"]
  methods = list(sweep["grids"][sweep["table"]["grid"]]["methods"])
  order = [m for _, ms in sweep["table"].get("groups", ()) for m in ms if m in methods]
  return [display.get(m, m) for m in dict.fromkeys(order + methods)]


def other_winner_setup(sweep, docs, scores):
  """The grid at the other search seed's winners (`report.selection_table_grid`) as the
  reading compares it, or None: (grid, seeds, head of a line per column, and per column whose
  baseline has scores under both sets of winners: (methods of the grid there but the
  baseline, those with scores under both, and for each of these its (method, baseline)
  {seed: score} pairs under the table's and the other winners on the seeds where all four
  runs finished))."""
  alt = sweep.get("report", {}).get("selection_table_grid", "")
  if not alt or alt not in sweep["grids"]:
    return None
  alt_scores, asked = grid_cells(sweep, docs, alt, "heldout_domain")
  seeds = sorted(int(x) for x in sweep["grids"][alt]["seeds"])
  baseline = sweep["table"]["display"].get("fedavg", "fedavg")
  head = lambda col: (f"- {col}: {winner_source(sweep, sweep['table']['grid'])} against {winner_source(sweep, alt)} "  # noqa: E731
                      f"(grid `{alt}`, {OTHER}{seed_range(seeds)} (each comparison on the seeds where its runs "
                      "finished under both)")
  cols = {}
  for col in sorted({c for _, c in asked}):
    if not (scores.get((baseline, col)) and alt_scores.get((baseline, col))):
      continue
    rest = sorted((lab for lab, c in asked if c == col and lab != baseline), key=row_labels(sweep).index)
    ok = [lab for lab in rest if scores.get((lab, col)) and alt_scores.get((lab, col))]
    pairs = {"table": [], "other": []}
    for lab in ok:
      common = set(seeds)
      for sc in (scores, alt_scores):
        common &= set(sc[(lab, col)]) & set(sc[(baseline, col)])
      for key, sc in (("table", scores), ("other", alt_scores)):
        pairs[key].append(({k: sc[(lab, col)][k] for k in common}, {k: sc[(baseline, col)][k] for k in common}))
    cols[col] = (rest, ok, pairs)
  return alt, seeds, head, cols


def check_remark_4_1_other_winners(sweep, docs, scores, lines, folder):
  """Remark 4.1's lines at the other search seed's winners: per column of that grid with the
  baseline's cell under both sets of winners, the column's verdict under each on the same
  seeds (the beyond-margin tests one Holm family over every column of the remark, this
  column's comparisons in place of the table's) and the methods whose outcome changes among
  those testable under both."""
  setup = other_winner_setup(sweep, docs, scores)
  if setup is None:
    assert not lines, folder
    return
  _, _, head, cols = setup
  baseline = sweep["table"]["display"].get("fedavg", "fedavg")
  assert sorted(l[2:].split(":", 1)[0] for l in lines) == sorted(cols), (folder, lines)
  # The remark's own families: every column with a baseline cell, its other methods' cells.
  remark = {}
  for c in {c for lab, c in scores if lab == baseline and scores[(lab, c)]}:
    remark[c] = [(v, scores[(baseline, c)]) for (lab, c2), v in scores.items() if c2 == c and lab != baseline and v]
  words = {"supports": "supports the remark", "against": "against the remark", "inconclusive": "inconclusive",
           "cannot tell": "cannot tell"}
  for line in lines:
    col = line[2:].split(":", 1)[0]
    rest, ok, pairs = cols[col]
    verdict, outs = {}, {}
    for key in ("table", "other"):
      fams = {**remark, col: pairs[key]}
      res = {c: family_by_hand(p) for c, p in fams.items()}
      beyond = holm_by_hand({(c, i): beyond_margin_by_hand(*fams[c][i]) for c in fams for i, r in enumerate(res[c])
                             if r[0] != "cannot tell"})
      mine = res[col]
      if any(p < 0.05 for (c, _), p in beyond.items() if c == col):
        verdict[key] = "against"
      elif not mine or any(r[0] == "cannot tell" for r in mine):
        verdict[key] = "cannot tell"
      else:
        verdict[key] = ("supports" if all(non_superiority_by_hand(*p)[0] < 0.05 for p in pairs[key])
                        else "inconclusive")
      outs[key] = [r[0] for r in mine]
    both = [(lab, a, b) for lab, a, b in zip(ok, outs["table"], outs["other"]) if "cannot tell" not in (a, b)]
    flips = [f"{lab} {a} → {b}" for lab, a, b in both if a != b]
    short = [lab for lab in rest if lab not in {x[0] for x in both}]
    want = (head(col) + f": the column's verdict {words[verdict['table']]} → {words[verdict['other']]} (the "
            "beyond-margin tests Holm over the remark's columns, this one's on those seeds); "
            f"{len(flips)} of {len(both)} outcomes against {baseline} change"
            + (": " + ", ".join(flips) if flips else "")
            + (f" ({', '.join(short)} left out: untestable under at least one set of winners)" if short else ""))
    assert line == want, (folder, line, want)


def check_claim_other_winners(sweep, docs, scores, method, cols, lines, words, folder):
  """A method paper's claim at the other search seed's winners: in each column of that grid
  where the method and the baseline have cells under both sets of winners, the method
  against the baseline on the same seeds inside the claim's family (its other columns as in
  the table), under the table's winners and the other's, and the claim's verdict either way."""
  setup = other_winner_setup(sweep, docs, scores)
  if setup is None:
    assert not lines, folder
    return
  alt, _, head, alt_cols = setup
  baseline = sweep["table"]["display"].get("fedavg", "fedavg")
  src_t, src_o = winner_source(sweep, sweep["table"]["grid"]), winner_source(sweep, alt)
  want = []
  for col in cols:
    if col not in alt_cols or method not in alt_cols[col][1]:
      continue
    i = alt_cols[col][1].index(method)
    out = {}
    for key in ("table", "other"):
      res = family_by_hand([alt_cols[col][2][key][i] if c == col else (scores[(method, c)], scores[(baseline, c)])
                            for c in cols])
      out[key] = (res[cols.index(col)], verdict_powered([r[0] for r in res]))
    want.append(head(col) + ", this column on those seeds only (its line above: every seed the table ran), "
                f"the claim's other columns as above: {words[out['table'][0][0]]} at {src_t} "
                f"({out['table'][0][1]}), {words[out['other'][0][0]]} at {src_o} ({out['other'][0][1]}); the claim "
                f"with this column on those seeds: {out['table'][1]} at {src_t}, {out['other'][1]} at {src_o}")
  assert lines == want, (folder, method, lines, want)


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_readings_p_values_and_verdicts_from_the_results_file(folder):
  """Remark 4.1 (per column: every method against FedAvg-ERM paired by seed, Holm over the
  column's testable methods; which methods are significantly above or below it, with each
  test's text; which are equivalent within the margin and which inconclusive; the column's
  detectable differences; the verdict) and each method paper's claim against FedAvg-ERM
  (each column's word and test text, Holm over the claim's columns; the verdict), recomputed
  from the results file with SciPy and Holm by hand."""
  sweep, docs = read_docs(folder)
  scores, _ = expected_cells(sweep, docs, "heldout_domain")
  baseline = sweep["table"]["display"].get("fedavg", "fedavg")
  sections = reading_sections(folder)
  controls = control_cells(sweep, docs)
  report_text = open(os.path.join(ROOT, "experiments", folder, "REPORT.md"), encoding="utf-8").read()
  checked, claims, medians, spread = 0, 0, {}, {}
  for title, verdict, body in sections:
    if title.startswith("Remark 4.1"):
      columns, pending = [], []
      check_remark_4_1_other_winners(sweep, docs, scores, [l for l in body.splitlines() if OTHER in l], folder)
      for line in body.splitlines():
        if OTHER in line:
          continue
        col, rest = line[2:].split(": ", 1)
        base = scores[(baseline, col)]
        others = {lab: v for (lab, c), v in scores.items() if c == col and lab != baseline and v}
        labs = list(others)
        res = dict(zip(labs, family_by_hand([(others[lab], base) for lab in labs])))
        parts = rest.split("; ")
        by = {k: {lab for lab in labs if res[lab][0] == k} for k in ("better", "worse", "equivalent", "inconclusive")}
        # Each method above or below: its paired difference and Holm p, as the by-hand text has them.
        listed = {m.group(1): (m.group(2), m.group(3), bool(m.group(4)))
                  for m in re.finditer(r"([\w+\-]+) ([+-]\d\.\d{3}) \(Holm (p [<=] [\d.]+)(, Wilcoxon disagrees)?\)",
                                       line)}
        assert set(listed) == by["better"] | by["worse"], (folder, line)
        for lab, got in listed.items():
          want = re.search(r" diff ([+-]\d\.\d{3}) \(SE [\d.]+\), p [<=] [\d.]+, Holm (p [<=] [\d.]+)", res[lab][1])
          assert got == (*want.groups(), ", disagrees)" in res[lab][1]), (folder, col, lab)
        check_negative_controls(col, parts, base, controls, res, report_text, folder)
        check_pooled_baseline(col, base, controls, others, report_text, folder)
        assert any(p.startswith("significantly above it: ") for p in parts) == bool(by["better"]), (folder, line)
        for key, prefix in (("equivalent", f"equivalent within ±{MARGIN:g}: "), ("inconclusive", "inconclusive: ")):
          got = next((p[len(prefix):].split(", ") for p in parts if p.startswith(prefix)), [])
          assert set(got) == by[key], (folder, col, key)
        mdds = sorted(r[2] for r in res.values() if r[2] is not None)
        # The column's paired spread: the root mean square over its methods of the sd of their
        # per-seed differences from the baseline (on the seeds both ran, two or more).
        diffs = [[others[lab][k] - base[k] for k in sorted(set(others[lab]) & set(base))] for lab in labs]
        sds = [float(np.std(d, ddof=1)) for d in diffs if len(d) >= 2]
        if sds:
          spread[col] = math.sqrt(float(np.mean(np.square(sds))))
        # Non-superiority, one-sided at 0.05 each (the intersection-union test of the column).
        ns = {lab: non_superiority_by_hand(others[lab], base) for lab in labs if res[lab][0] != "cannot tell"}
        if mdds:
          medians[col] = mdds
          assert parts[-3] == (f"detectable (80% power at Holm's first level 0.05/{len(mdds)}): {mdds[0]:.3f} to "
                               f"{mdds[-1]:.3f}, median {float(np.median(mdds)):.3f}"), (folder, line)
          floors = sorted(r[3] for r in res.values() if r[3] is not None)
          assert parts[-2] == (f"equivalence provable at best within ±{floors[0]:.3f} to ±{floors[-1]:.3f}, median "
                               f"±{float(np.median(floors)):.3f} (t SE at the same level, the bound at a zero "
                               f"difference: {sum(f < MARGIN for f in floors)} of {len(floors)} below "
                               f"±{MARGIN:g})"), (folder, line)
          zero = sorted(z for _, z in ns.values())
          assert parts[-1] == (f"not {MARGIN:g} or more above it (one-sided, 0.05 each): "
                               f"{sum(p < 0.05 for p, _ in ns.values())} of {len(ns)}, provable at best within "
                               f"+{zero[0]:.3f} to +{zero[-1]:.3f}, median +{float(np.median(zero)):.3f} (t SE at "
                               "0.05, the bound at a zero difference)"), (folder, line)
        untested = any(res[lab][0] == "cannot tell" for lab in labs)
        # Against the remark: a method shown more than the margin above, one-sided, one Holm
        # family over every column's comparisons (decided after the loop).
        pending.append((col, parts, line, bool(by["better"]), untested, ns,
                        {(col, lab): beyond_margin_by_hand(others[lab], base) for lab in labs if lab in ns}))
        checked += 1
      beyond_adj = holm_by_hand({k: p for *_, ps in pending for k, p in ps.items()})
      for col, parts, line, better, untested, ns, ps in pending:
        beyond = [lab for (_, lab) in ps if beyond_adj[(col, lab)] < 0.05]
        if beyond:
          assert (f"shown more than {MARGIN:g} above it (one-sided, Holm over the remark's columns): "
                  f"{', '.join(beyond)}") in parts, (folder, line)
        elif better:
          assert f"none shown more than {MARGIN:g} above it" in parts, (folder, line)
        columns.append("against" if beyond else "cannot tell" if untested or not ns
                       else "supports" if all(p < 0.05 for p, _ in ns.values()) else "inconclusive")
      assert verdict == verdict_powered(columns, "supports", COLUMN_LABELS, refuted_by="against"), (folder, verdict)
    elif " beats " in title:
      method = title.split(" (", 1)[0]
      rows = []
      for line in body.splitlines():
        if line == "- (no finished runs for this)":  # e.g. a method whose cells are all X
          assert not any(scores.get((method, c)) for _, c in scores), (folder, title)
          continue
        if re.fullmatch(r"- C=\d+, λ=[\d.]+: not tested; left out, marked in the table: .+", line):
          continue  # a marked cell (-ᵃ / -ᵇ), not one of the claim's comparisons
        if OTHER in line:
          continue  # checked below, after the claim's own columns
        m = re.fullmatch(rf"- (C=\d+, λ=[\d.]+): (.+?) {CELL} vs (.+?) {CELL}: (.+?) \(((?:paired|welch) .+|untestable)\)", line)
        assert m and m.group(2) == method and m.group(3) == baseline, (folder, line)
        rows.append((m.group(1), m.group(4), m.group(5)))
      cols = [c for (lab, c), v in scores.items() if lab == method and c != "C=1 (centralised)" and v
              and scores.get((baseline, c))]
      assert [c for c, _, _ in rows] == sorted(cols, key=[c for c, _, _ in rows].index), (folder, title)
      assert {c for c, _, _ in rows} == set(cols), (folder, title)
      res = family_by_hand([(scores[(method, c)], scores[(baseline, c)]) for c, _, _ in rows])
      words = {"better": "holds", "worse": "does not hold (below the baseline)", "inconclusive": "inconclusive",
               "cannot tell": "cannot tell", "equivalent": f"equivalent within ±{MARGIN:g}"}
      for (c, word, text), (o, want, _, _) in zip(rows, res):
        assert (word, text) == (words[o], want), (folder, method, c)
        checked += 1
      assert verdict == verdict_powered([o for o, _, _, _ in res]), (folder, title, verdict)
      # The note on the columns where the claim is decided within the column's negative controls.
      hits, pooled_parts = [], []
      for (c, _, _), (o, t, _, _) in zip(rows, res):
        ctrl = {lab: v for (lab, c2), v in controls.items() if c2 == c}
        fam = family_by_hand([(v, scores[(baseline, c)]) for v in ctrl.values()]) if ctrl else []
        far = [float(re.search(r" diff ([+-][\d.]+)", r[1]).group(1)) for r in fam if r[0] == o]
        d = float(re.search(r" diff ([+-][\d.]+)", t).group(1)) if o in ("better", "worse") else None
        if d is not None and far and abs(d) <= max(abs(x) for x in far):
          hits.append(f"{c} ({d:+.3f}, controls up to {max(far, key=abs):+.3f})")
          # The method against the column's pooled baseline (the per-seed mean of the baseline
          # and its controls), in the family of the column's methods, by hand.
          base = scores[(baseline, c)]
          seeds = sorted(set(base).intersection(*(set(v) for v in ctrl.values())))
          pooled_c = {k: float(np.mean([base[k]] + [v[k] for v in ctrl.values()])) for k in seeds}
          col_others = {lab: v for (lab, c2), v in scores.items() if c2 == c and lab != baseline and v}
          fam_p = dict(zip(col_others, family_by_hand([(v, pooled_c) for v in col_others.values()])))
          po, pt = fam_p[method][:2]
          mp = re.search(r" diff ([+-]\d\.\d{3}) \(SE [\d.]+\), p [<=] [\d.]+, Holm (p [<=] [\d.]+)", pt)
          word = {"better": "above it", "worse": "below it", "equivalent": f"equivalent within ±{MARGIN:g}"}.get(po, po)
          pooled_parts.append(f"{c} {word} ({mp.group(1)}, Holm {mp.group(2)})")
      after = report_text.split(f"**{title}: {verdict}.**", 1)[1].split("\n\n", 2)[2]
      assert after.startswith(f"Negative controls: in {'; '.join(hits)}, {method}'s difference") if hits \
          else not after.startswith("Negative controls"), (folder, title, after[:200])
      if pooled_parts:
        note = after.split("\n\n", 1)[0]
        assert note.endswith(f"Holm over the column's methods; remark 4.1): {'; '.join(pooled_parts)}."), (folder, note)
      check_claim_other_winners(sweep, docs, scores, method, [c for c, _, _ in rows],
                                [l for l in body.splitlines() if OTHER in l], words, folder)
      claims += 1
  assert checked and claims == sum(" beats " in t for t, _, _ in sections) > 0
  # The Deviations line naming the columns whose median detectable difference misses 0.03.
  short = [(c, d) for c, d in medians.items() if d[-1] > 0.03]
  text = open(os.path.join(ROOT, "experiments", folder, "REPORT.md"), encoding="utf-8").read()
  line = next((l for l in text.splitlines() if l.startswith("- the benchmark's target for the tests")), None)
  def seeds_by_hand(sd, m):
    """The smallest n with a detectable difference at most 0.03 at 0.05 / m (SciPy's noncentral t)."""
    for n in range(2, 1001):
      if mdd_by_hand(sd / math.sqrt(n), n - 1, 0.05 / m) <= 0.03:
        return str(n)
    return "over 1000"

  head = ("- the benchmark's target for the tests against the baseline is a detectable difference of 0.03 (80% power "
          "at Holm's first level); ")
  want = head + ("not met at these seeds: comparisons whose detectable difference is above it in "
                 f"{len(short)} of {len(medians)} columns: " + ", ".join(
      f"{c} {sum(x > 0.03 for x in d)} of {len(d)} (median {float(np.median(d)):.3f}, largest {d[-1]:.3f})"
      for c, d in short) if short else f"every comparison reaches it in all {len(medians)} columns")
  need = [f"{c} {seeds_by_hand(spread[c], len(d))} (sd {spread[c]:.3f}, {len(d)} comparison{'s' * (len(d) != 1)})"
          for c, d in medians.items() if c in spread]
  if need:
    want += ("; seeds a typical comparison would need for it at this report's measured paired spread (the root mean "
             "square over the column's methods of the standard deviation of their per-seed differences from the "
             "baseline; a comparison with a larger spread needs more): " + ", ".join(need))
  assert line == want, (folder, line)


def verdict_most(outcomes):
  """A "most comparisons" claim (remarks 4.2 and 4.7): holds when more than half of the
  testable comparisons support it; "no difference" when every testable one is."""
  testable = [o for o in outcomes if o != "cannot tell"]
  if not testable:
    return "cannot tell"
  if all(o == "no difference" for o in testable):
    return "no difference"
  return "holds" if 2 * sum(o == "higher" for o in testable) > len(testable) else "does not hold"


def verdict_most_powered(outcomes):
  """Remark 4.2's verdict from four-outcome comparisons ("better" = degrades): holds when more
  than half of the testable ones degrade, does not hold when more than half improve or are
  equivalent, else inconclusive."""
  testable = [o for o in outcomes if o != "cannot tell"]
  if not testable:
    return "cannot tell"
  if 2 * sum(o == "better" for o in testable) > len(testable):
    return "holds"
  return "does not hold" if 2 * sum(o in ("worse", "equivalent") for o in testable) > len(testable) else "inconclusive"


def grid_points(sweep, docs, grid, fields, by_seed=False):
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
  return pts if by_seed else {k: [s for _, s in sorted(v.items())] for k, v in pts.items()}


def point_text(v):
  sd = f" ± {statistics.stdev(v):.3f}" if len(v) > 1 else ""
  return f"{statistics.mean(v):.3f}{sd} (n={len(v)})"


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

  words = {"better": "degrades", "worse": "improves", "inconclusive": "inconclusive", "cannot tell": "cannot tell",
           "equivalent": f"equivalent within ±{MARGIN:g}"}

  def check_family(cited, family):
    """Each cited (word, text) against the family recomputed by hand; the outcomes."""
    res = family_by_hand(family)
    for (word, text), (o, want, _, _) in zip(cited, res):
      assert (word, text) == (words[o], want), (folder, word, text)
    return [o for o, _, _, _ in res]

  verdict, body = section_of(folder, "Remark 4.2, DG methods degrade in FL")
  if verdict is not None:
    fam, fam_base = ([], []), ([], [])
    for line in body.splitlines():  # one comparison a line
      who, rest = line[2:].split(": C=1 ", 1)
      m = who.removesuffix(" (the baseline, for comparison)")
      cen, *parts = rest.split(" vs ")
      assert cen == point_text(values[(m, "C=1 (centralised)")]) and len(parts) == 1, (folder, line)
      for part in parts:
        g = re.fullmatch(rf"(C=\d+, λ=[\d.]+) ({CELL}): (.+?) \(((?:paired|welch) .+|untestable)\)", part)
        assert g and g.group(2) == point_text(values[(m, g.group(1))]), (folder, part)
        into = fam if m == who else fam_base
        into[0].append((g.group(3), g.group(4)))
        into[1].append((scores[(m, "C=1 (centralised)")], scores[(m, g.group(1))]))
        checked += 1
    outcomes = check_family(*fam)
    check_family(*fam_base)
    assert {line[2:].split(":", 1)[0] for line in body.splitlines()} >= set(dg)
    assert verdict.split(" (", 1)[0] == verdict_most_powered(outcomes), (folder, verdict)

  verdict, body = section_of(folder, "Remark 4.2, DG methods degrade from")
  if verdict is not None:
    fam = ([], [])
    for line in body.splitlines():
      if line == "- (no finished runs for this)":  # no DG method with both columns (e.g. every such cell marked)
        continue
      g = re.fullmatch(rf"- (.+) at C=(\d+): λ=1 ({CELL}) vs λ=0\.1 ({CELL}): (.+?) \(((?:paired|welch) .+|untestable)\)",
                       line)
      assert g, (folder, line)
      a, b = (f"C={g.group(2)}, λ=1", f"C={g.group(2)}, λ=0.1")
      assert (g.group(3), g.group(4)) == (point_text(values[(g.group(1), a)]), point_text(values[(g.group(1), b)]))
      fam[0].append((g.group(5), g.group(6)))
      fam[1].append((scores[(g.group(1), a)], scores[(g.group(1), b)]))
      checked += 1
    outcomes = check_family(*fam)
    assert verdict.split(" (", 1)[0] == verdict_most_powered(outcomes), (folder, verdict)

  for key, what in (("clients_grid", "at a fixed number of local epochs"), ("clients_steps_grid", "at a fixed number of local steps")):
    grid = sweep["figures"].get(key, "")
    verdict, body = section_of(folder, f"Remark 4.7, accuracy falls with the number of clients, {what}")
    if not grid or grid not in sweep["grids"]:
      assert verdict is None, (folder, key)
      continue
    pts = grid_points(sweep, docs, grid, ("lam", "method", "num_clients"), by_seed=True)
    panels = {(lam, m) for lam, m, _ in pts}
    lines = body.splitlines()
    assert len(lines) == sum(len({c for l2, m2, c in pts if (l2, m2) == pm}) > 1 for pm in panels), (folder, key)
    words47 = {"better": "falls", "worse": "rises", "inconclusive": "inconclusive", "cannot tell": "cannot tell",
               "equivalent": f"equivalent within ±{MARGIN:g}"}
    cited, family = [], []
    for line in lines:
      g = re.fullmatch(rf"- λ=([\d.]+) (.+?): (.+); C=(\d+) vs C=(\d+): (.+?) \(((?:paired|welch) .+|untestable)\)",
                       line)
      assert g, (folder, line)
      m = next(m for lam, m in panels if name(m) == g.group(2) and lam == float(g.group(1)))
      cs = sorted(c for lam, m2, c in pts if lam == float(g.group(1)) and m2 == m)
      run = lambda c: pts[(float(g.group(1)), m, c)]  # noqa: E731
      assert g.group(3) == ", ".join(f"C={c} {point_text([v for _, v in sorted(run(c).items())])}" for c in cs), \
          (folder, line)
      assert (int(g.group(4)), int(g.group(5))) == (cs[0], cs[-1])
      cited.append((g.group(6), g.group(7)))
      family.append((run(cs[0]), run(cs[-1])))
      checked += 1
    res = family_by_hand(family)
    for (word, text), (o, want, _, _) in zip(cited, res):
      assert (word, text) == (words47[o], want), (folder, word, text)
    outcomes = [o for o, _, _, _ in res]
    assert verdict.split(" (", 1)[0] == verdict_most_powered(outcomes), (folder, verdict)

  grid = sweep["figures"].get("rounds_grid", "")
  verdict, body = section_of(folder, "Remark 4.8")
  if grid and grid in sweep["grids"]:
    pts = grid_points(sweep, docs, grid, ("num_clients", "lam", "method", "num_rounds"), by_seed=True)
    words48 = {"better": "above", "worse": "below", "inconclusive": "inconclusive", "cannot tell": "cannot tell",
               "equivalent": f"equivalent within ±{MARGIN:g}"}
    outcomes, mdds, seeds = [], [], []
    lines = body.splitlines()
    design = lines.pop() if lines and lines[-1].startswith("- what this design can see: ") else None
    for line in lines:
      g = re.fullmatch(rf"- C=(\d+) λ=([\d.]+) (.+?): (.+); best interior R=(\d+) \(of (\d+), its two tests at "
                       rf"([\d.]+), Holm\) vs R=(\d+): (.+?) \(((?:paired|welch) .+?|untestable)\), vs R=(\d+): (.+?) "
                       rf"\(((?:paired|welch) .+|untestable)\)", line)
      assert g, (folder, line)
      C, lam = int(g.group(1)), float(g.group(2))
      m = next(m for c, l2, m, _ in pts if (c, l2) == (C, lam) and name(m) == g.group(3))
      rs = sorted(r for c, l2, m2, r in pts if (c, l2, m2) == (C, lam, m))
      run = lambda r: pts[(C, lam, m, r)]  # noqa: E731
      assert g.group(4) == ", ".join(f"R={r} {point_text([v for _, v in sorted(run(r).items())])}" for r in rs), \
          (folder, line)
      mid = max(rs[1:-1], key=lambda r: statistics.mean(run(r).values()))
      alpha = 0.05 / (len(rs) - 2)
      assert (int(g.group(5)), int(g.group(6)), g.group(7)) == (mid, len(rs) - 2, f"{alpha:.3g}"), (folder, line)
      res = family_by_hand([(run(mid), run(end)) for end in (rs[0], rs[-1])], alpha=alpha)
      assert (int(g.group(8)), g.group(9), g.group(10), int(g.group(11)), g.group(12), g.group(13)) == (
          rs[0], words48[res[0][0]], res[0][1], rs[-1], words48[res[1][0]], res[1][1]), (folder, line)
      os_ = [o for o, _, _, _ in res]
      outcomes.append("cannot tell" if "cannot tell" in os_ else "supports" if os_ == ["better", "better"]
                      else "against" if any(o in ("worse", "equivalent") for o in os_) else "inconclusive")
      mdds += [d for _, _, d, _ in res if d is not None]
      seeds += [len(run(r)) for r in rs]
      checked += 1
    # The design line: seeds a point and the range of the detectable differences, by hand.
    if mdds:
      assert design == (f"- what this design can see: {min(seeds)}" + (f"-{max(seeds)}" if max(seeds) != min(seeds)
                                                                       else "")
                        + f" seeds a point; the comparisons' detectable differences are {min(mdds):.3f} to "
                        f"{max(mdds):.3f} (median {float(np.median(mdds)):.3f}): a smaller true difference between "
                        "schedules is found with less than 80% power"
                        + ("; more seeds, not these data, would decide the undecided series"
                           if "inconclusive" in outcomes else "")), \
          (folder, design)
    series = {"supports": ("series with its best interior schedule above both ends",
                           "series with the best interior schedule above both ends"),
              "against": ("series with an end at or above it", "series with an end at or above it"),
              "inconclusive": ("undecided series", "undecided series")}
    assert verdict == verdict_powered(outcomes, "supports", series), (folder, verdict)
  assert checked


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_unfilled_placeholder_in_a_report(folder):
  """A string the reader meant as an f-string and wrote as a plain one prints its
  placeholder ("Holm p < {stats.ALPHA:g}"): no `{name}` or `{name:spec}` in REPORT.md."""
  text = open(os.path.join(ROOT, "experiments", folder, "REPORT.md"), encoding="utf-8").read()
  assert not re.findall(r"\{[A-Za-z_][\w.]*(?::[^}]*)?\}", text)


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_comparison_in_comparisons_csv_from_the_results_file(folder):
  """comparisons.csv: one row per comparison remark 4.1 rests on, each recomputed from the
  results file with SciPy (the difference, p, the column family's Holm outcome, the
  detectable difference and the one-sided test of 'the margin or more above')."""
  import csv
  path = os.path.join(ROOT, "experiments", folder, "comparisons.csv")
  rows = list(csv.DictReader(open(path, encoding="utf-8")))
  sweep, docs = read_docs(folder)
  scores, _ = expected_cells(sweep, docs, "heldout_domain")
  baseline = sweep["table"]["display"].get("fedavg", "fedavg")
  by_col = {}
  for r in rows:
    by_col.setdefault(r["column"], []).append(r)
  assert by_col
  num = lambda v: pytest.approx(float(v), rel=1e-5, abs=1e-12)  # noqa: E731  (6 significant digits)
  for col, rs in by_col.items():
    base = scores[(baseline, col)]
    labs = [lab for (lab, c), v in scores.items() if c == col and lab != baseline and v]
    assert sorted(r["method"] for r in rs) == sorted(labs), (folder, col)
    res = family_by_hand([(scores[(lab, col)], base) for lab in labs])
    row = {r["method"]: r for r in rs}
    for lab, (o, _, mdd, _) in zip(labs, res):
      r = row[lab]
      assert r["outcome"] == o, (folder, col, lab)
      if o == "cannot tell":
        assert r["diff"] == r["p"] == "", (folder, col, lab)
        continue
      kind, diff, se, df, p, *_ = baseline_test(scores[(lab, col)], base)
      assert kind.startswith(r["test"]) and float(r["diff"]) == num(diff) and float(r["p"]) == num(p), (folder, lab)
      assert float(r["detectable"]) == num(mdd), (folder, col, lab)
      ns, _ = non_superiority_by_hand(scores[(lab, col)], base)
      assert float(r["non_superiority_p"]) == num(ns), (folder, col, lab)


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_glance_tables_differences_outcomes_and_controls_from_the_results_file(folder):
  """The at-a-glance table against FedAvg-ERM: each method's paired difference and outcome in
  its column's family (Holm over the column's methods, by hand), ʷ where the signed-rank check
  decides otherwise, and each -ᵃ cell's bracketed difference and outcome as a negative control
  (Holm over the column's controls)."""
  sweep, docs = read_docs(folder)
  scores, _ = expected_cells(sweep, docs, "heldout_domain")
  controls = control_cells(sweep, docs)
  baseline = sweep["table"]["display"].get("fedavg", "fedavg")
  text = open(os.path.join(ROOT, "experiments", folder, "REPORT.md"), encoding="utf-8").read()
  title = f"## Against {baseline}, at a glance (held-out-domain selection, paired by seed)"
  if title not in text:
    pytest.skip(f"{folder}: no at-a-glance table")
  cells = parse_table(text, title)
  symbols = {"better": "▲", "worse": "▼", "equivalent": "≈", "inconclusive": "?"}
  diff_of = lambda t: float(re.search(r" diff ([+-][\d.]+)", t).group(1))  # noqa: E731
  checked = 0
  for col in {c for (lab, c) in scores if lab == baseline and scores[(lab, c)]}:
    base = scores[(baseline, col)]
    for fam_cells, bracket in ((scores, False), (controls, True)):
      labs = [lab for (lab, c), v in fam_cells.items() if c == col and lab != baseline and v]
      for lab, (o, t, _, _) in zip(labs, family_by_hand([(fam_cells[(lab, col)], base) for lab in labs])):
        if o == "cannot tell":
          continue
        want = f"{diff_of(t):+.3f} {symbols[o]}"
        if bracket:
          want = f"-ᵃ ({want})"
        elif ", disagrees)" in t:
          want += "ʷ"
        assert cells[(lab, col)] == want, (folder, lab, col, cells[(lab, col)], want)
        checked += 1
  assert checked
