"""REPORT.md from a sweep's finished runs or from its results file: setup, the deviations
from Bai et al.'s protocol, tables, Table 6, figures, timing, and the reading: the remarks
4.1, 4.2 (centralised vs federated; lambda = 1 vs 0.1, as Bai et al. compare it), 4.7 and
4.8 of Bai, Bagchi and Inouye, "Benchmarking Algorithms for Federated Domain
Generalization" (ICLR 2024), and each method paper's headline claim against FedAvg (FedIIR,
FedOMG, FedDIM, FedLOE, FedGA), every sentence generated from the numbers by a template and
citing the cells it rests on (`fedjax_dg.bench.stats`). Comparisons against the baseline
within a column are paired by seed (the runs share their random numbers), Holm-adjusted
within their family, with four outcomes (better / worse / equivalent within the margin /
inconclusive) and the difference the family could have detected; comparisons across
columns are Welch's, each with its detectable difference. Cells marked as equal to the
baseline by construction, or as runs whose method could not act (`collect.cell_mark`), are
left out of every test.

  python -m fedjax_dg.bench report --sweep configs/sweeps/quick.py      # from the runs
  python -m fedjax_dg.bench report --results experiments/report_quick/results.jsonl.gz
"""
from __future__ import annotations

import collections
import math
import os
import re

import numpy as np

from fedjax_dg import algorithms
from fedjax_dg.bench import collect, figures, reference, stats, sweep as sweep_lib

def _fmt(v, digits=3):
  return "X" if v is None else f"{v:.{digits}f}"


def _point(r: dict) -> str:
  """A figure point as the tables print a cell: mean ± standard deviation (n=seeds)."""
  sd = "" if r.get("std") is None else f" ± {r['std']:.3f}"
  return f"{_fmt(r['mean'])}{sd} (n={r['n']})"


def _duration(seconds: float) -> str:
  return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def timing(exp, results) -> dict:
  """Summed wall time (s) of the finished runs per grid (a job shared by grids counts in
  the first) and in total; the backend they ran on. A run of a batch program counts its
  share of the program's time (`collect.wall_shares`), so a program is counted once."""
  per, seen, backends = collections.Counter(), set(), set()
  shares = collect.wall_shares(results)
  for e in exp.entries:
    if e.key in results and e.key not in seen:
      seen.add(e.key)
      sm = results[e.key]["summary"]
      per[e.grid] += shares[e.key]
      backends.add(f"{sm.get('backend', '?')} x{sm.get('devices', '?')}")
  return {"per_grid": dict(per), "total": sum(per.values()), "backends": sorted(backends)}


def _baseline() -> str:
  from fedjax_dg.algorithms import BASELINE
  return BASELINE


# ---------------------------------------------------------------------------- citations

def cite_cell(names: dict, m: str, where: str, c) -> str:
  """"FedLOE (C=20, λ=1) 0.608 ± 0.036 (n=3)": a method's cell, mean ± standard deviation."""
  return f"{names.get(m, m)} ({where}) {collect.format_cell(c, 3)}"


def _usable(c) -> bool:
  return c is not None and c.usable


MARK_WORDS = {collect.EQUALS_BASELINE: "its runs compute the baseline's update by construction",
              collect.INACTIVE: "its own term did not act"}


def _left_out(cells, names: dict) -> str:
  """"; left out, marked in the table: IRM (-ᵃ, ...), Fish (-ᵇ, ...)" for the marked cells among
  `cells` ([(method, cell)]), "" when none is marked."""
  marked = [(m, c) for m, c in cells if c is not None and c.mark]
  return ("; left out, marked in the table: " + ", ".join(
      f"{names.get(m, m)} (-{collect.MARKS.get(c.mark, '')}, {MARK_WORDS.get(c.mark, c.mark)})" for m, c in marked)
      if marked else "")


def _headline(title: str, v: str) -> str:
  return f"**{title}: {v}.**"


def _bullets(lines):
  return "\n".join(f"- {l}" for l in lines) if lines else "- (no finished runs for this)"


# ---------------------------------------------------------------------------- remarks

COLUMN_LABELS = {"supports": ("column with no method the margin or more above it",
                              "columns with no method the margin or more above it"),
                 "against": ("column with a method more than the margin above it",
                             "columns with a method more than the margin above it"),
                 "inconclusive": ("column with none shown more than the margin above it but some possibly that far above",
                                  "columns with none shown more than the margin above it but some possibly that far "
                                  "above")}


def detectable_by_column(table: collect.Table, baseline: str, margin: float = stats.MARGIN) -> dict:
  """{column: sorted detectable differences} of each column's family against the baseline,
  as remark 4.1 tests it (`stats.against_baseline`, the testable comparisons only).

  Args:
    table: the held-out-domain table.
    baseline: the baseline method.
    margin: the equivalence margin (the detectable difference does not depend on it).

  Returns:
    The detectable difference of each of the column's testable comparisons, ascending, for
    columns with at least one.
  """
  out = {}
  for col in table.columns:
    base = table.cells.get((baseline, col))
    if not _usable(base):
      continue
    others = [c for _, m, _ in table.rows for c in [table.cells.get((m, col))] if m != baseline and _usable(c)]
    mdds = [r["mdd"] for r in stats.against_baseline([(c.by_seed, base.by_seed) for c in others], margin=margin)
            if r["mdd"] is not None]
    if mdds:
      out[col] = sorted(float(d) for d in mdds)
  return out


def _column_family(table: collect.Table, baseline: str, col, margin: float):
  """Remark 4.1's family in one column: (baseline cell, [(method, cell)] of the other usable
  cells, `stats.against_baseline`'s results), or None where the baseline's cell is unusable."""
  base = table.cells.get((baseline, col))
  if not _usable(base):
    return None
  others = [(m, c) for _, m, _ in table.rows for c in [table.cells.get((m, col))] if m != baseline and _usable(c)]
  return base, others, stats.against_baseline([(c.by_seed, base.by_seed) for _, c in others], margin=margin)


def negative_controls(table: collect.Table, baseline: str, col, margin: float = stats.MARGIN) -> list[tuple]:
  """A column's negative controls: its cells marked -ᵃ (`collect.EQUALS_BASELINE`), whose runs
  compute the baseline's update by construction (e.g. a domain penalty on clients that each
  hold one domain) at the hyperparameters their own search selected. Each is a replicate of
  the baseline's whole protocol (a search of its own draws, the selection, the seeds) with no
  method term acting, so its difference from the baseline's cell is what the choice of the
  baseline's hyperparameters alone moves. Compared as remark 4.1 compares a method
  (`stats.against_baseline`: paired by seed, one Holm family over the column's controls).

  Args:
    table: the held-out-domain table.
    baseline: the baseline method.
    col: the column.
    margin: the equivalence margin.

  Returns:
    [(method, cell, result)] in the table's row order; [] where the column has no control
    with scores or its baseline cell is unusable.
  """
  base = table.cells.get((baseline, col))
  if not _usable(base):
    return []
  ctrl = [(m, c) for _, m, _ in table.rows for c in [table.cells.get((m, col))]
          if m != baseline and c is not None and c.mark == collect.EQUALS_BASELINE and c.mean is not None]
  res = stats.against_baseline([(c.by_seed, base.by_seed) for _, c in ctrl], margin=margin)
  return [(m, c, r) for (m, c), r in zip(ctrl, res)]


CONTROL_WORDS = {"better": "above", "worse": "below", "equivalent": "equivalent", "inconclusive": "inconclusive"}


def _cite(names: dict, m: str, r: dict) -> str:
  """"FedGA +0.046 (Holm p = 0.003)": a method's paired difference and Holm p, with ", Wilcoxon
  disagrees" where the signed-rank check decides otherwise; its other statistics are in
  comparisons.csv."""
  return (f"{names.get(m, m)} {r['test']['diff']:+.3f} (Holm {stats.fmt_p({'p': r['holm_p']})}"
          + (", Wilcoxon disagrees" if r.get("check_disagrees") else "") + ")")


def _controls_part(controls, names: dict) -> str:
  """"negative controls (...): IRM +0.059 above (Holm p = 0.001), MMD +0.022 inconclusive
  (Holm p = 0.41)" for remark 4.1's column line, "" without controls."""
  if not controls:
    return ""
  cited = [f"{names.get(m, m)} " + (f"{r['test']['diff']:+.3f} {CONTROL_WORDS[r['outcome']]} "
                                    f"(Holm {stats.fmt_p({'p': r['holm_p']})})" if r["test"] else "untestable")
           for m, _, r in controls]
  return ("negative controls, the -ᵃ cells: the baseline's update at their own search's winner (paired, Holm over "
          "them): " + ", ".join(cited))


def negative_control_lines(table: collect.Table, baseline: str, names: dict, margin: float = stats.MARGIN
                           ) -> list[str]:
  """Remark 4.1's negative controls read: per column where a control is significantly above
  or below the baseline (`negative_controls`), how far the baseline's selection alone moved
  it, and which methods decided in the same direction lie within that distance (a
  description of sizes, not a test: such a method's difference is not shown to be its
  term's rather than the baseline's selection's).

  Args:
    table: the held-out-domain table.
    baseline: the baseline method.
    names: display names.
    margin: the equivalence margin.

  Returns:
    One paragraph per such column; [] where no control is decided.
  """
  out, b = [], names.get(baseline, baseline)
  fams = {col: fam for col in table.columns for fam in [_column_family(table, baseline, col, margin)] if fam}
  for col, (base, others, res) in fams.items():
    ctrl = negative_controls(table, baseline, col, margin)
    for side, word in (("better", "above"), ("worse", "below")):
      hit = [(m, r) for m, _, r in ctrl if r["outcome"] == side]
      if not hit:
        continue
      far = max(abs(r["test"]["diff"]) for _, r in hit)
      decided = [(m, r["test"]["diff"]) for (m, _), r in zip(others, res) if r["outcome"] == side]
      within = [f"{names.get(m, m)} {d:+.3f}" for m, d in decided if abs(d) <= far]
      beyond = [f"{names.get(m, m)} {d:+.3f}" for m, d in decided if abs(d) > far]
      cited = ", ".join(f"{names.get(m, m)} {r['test']['diff']:+.3f}" for m, r in hit)
      text = (f"Negative controls, {collect.column_label(col)}: {cited} "
              f"({len(hit)} of {len(ctrl)} cells that compute {b}'s update by construction, each at its own "
              f"search's winner) {'is' if len(hit) == 1 else 'are'} significantly {word} {b}'s cell: with no method "
              f"term acting, another search's choice of hyperparameters alone moves the same update's cell by up to "
              f"{max((r['test']['diff'] for _, r in hit), key=abs):+.3f} here. ")
      if within:
        text += (f"Of the methods significantly {word} it in this column, {', '.join(within)} "
                 f"{'lies' if len(within) == 1 else 'lie'} within that distance, so the column does not show "
                 f"{'its' if len(within) == 1 else 'their'} difference to be the method's rather than the "
                 "baseline's selection's")
        text += (f"; {', '.join(beyond)} {'lies' if len(beyond) == 1 else 'lie'} beyond it" if beyond else "")
        text += " (sizes compared, not a test)."
      elif beyond:
        text += (f"The methods significantly {word} it in this column lie beyond that distance: {', '.join(beyond)} "
                 "(sizes compared, not a test).")
      else:
        text += f"No method is significantly {word} it in this column."
      out.append(text)
  return out


def pooled_baseline(table: collect.Table, baseline: str, col) -> tuple[list, dict] | None:
  """The column's pooled baseline: on each seed, the mean of the baseline's score and its
  negative controls' (`negative_controls`: cells that compute the baseline's update by
  construction, each at the winner of its own search). Each member replicates the
  baseline's protocol with an independent search, so their mean is less exposed to one
  search's choice of hyperparameters than the baseline's cell alone.

  Args:
    table: the held-out-domain table.
    baseline: the baseline method.
    col: the column.

  Returns:
    ([the members: the baseline, then the controls in row order], {seed: pooled score}) over
    the seeds every member holds; None where the column has no control or fewer than two
    such seeds.
  """
  base = table.cells.get((baseline, col))
  if not _usable(base):
    return None
  members = [(baseline, base)] + [(m, c) for m, c, _ in negative_controls(table, baseline, col)]
  if len(members) < 2:
    return None
  seeds = sorted(set.intersection(*(set(c.by_seed) for _, c in members)))
  if len(seeds) < 2:
    return None
  return [m for m, _ in members], {k: float(np.mean([c.by_seed[k] for _, c in members])) for k in seeds}


def _against_pooled(table: collect.Table, baseline: str, col, margin: float):
  """(members, {seed: pooled score}, [(method, cell)], `stats.against_baseline`'s results) of
  a column's methods (remark 4.1's family) against its pooled baseline; None where it has no
  pooled baseline or no method to test."""
  fam = _column_family(table, baseline, col, margin)
  pooled = pooled_baseline(table, baseline, col)
  if fam is None or pooled is None or not fam[1]:
    return None
  others = fam[1]
  return (*pooled, others, stats.against_baseline([(c.by_seed, pooled[1]) for _, c in others], margin=margin))


def pooled_baseline_lines(table: collect.Table, baseline: str, names: dict, margin: float = stats.MARGIN
                          ) -> list[str]:
  """Remark 4.1's methods tested against the pooled baseline (`pooled_baseline`) in each
  column that has negative controls: paired by seed, one Holm family over the column's
  methods, the outcomes of `stats.against_baseline`. Where the controls show that the
  baseline's own selection moved its cell, this tests what `negative_control_lines` only
  compares by size. A method's cell still rests on one search of its own, so its own
  selection's luck is not averaged out.

  Args:
    table: the held-out-domain table.
    baseline: the baseline method.
    names: display names.
    margin: the equivalence margin.

  Returns:
    One paragraph per such column; [] where no column has a pooled baseline.
  """
  out, b = [], names.get(baseline, baseline)
  for col in table.columns:
    tested = _against_pooled(table, baseline, col, margin)
    if tested is None:
      continue
    members, by_seed, others, res = tested
    vals = list(by_seed.values())
    parts = []
    for side, word in (("better", "significantly above it"), ("worse", "significantly below it")):
      hit = [_cite(names, m, r) for (m, _), r in zip(others, res) if r["outcome"] == side]
      parts += [f"{word}: {', '.join(hit)}"] if hit else []
    for side, word in (("equivalent", f"equivalent within ±{margin:g}"), ("inconclusive", "inconclusive"),
                       ("cannot tell", "untestable")):
      hit = [names.get(m, m) for (m, _), r in zip(others, res) if r["outcome"] == side]
      parts += [f"{word}: {', '.join(hit)}"] if hit else []
    mdds = sorted(r["mdd"] for r in res if r["mdd"] is not None)
    if mdds:
      parts.append(f"detectable (80% power at Holm's first level {stats.ALPHA:g}/{len(mdds)}): median "
                   f"{float(np.median(mdds)):.3f}")
    out.append(f"Pooled baseline, {collect.column_label(col)}: the per-seed mean of {b}'s cell and its "
               f"{len(members) - 1} negative control{'s' if len(members) > 2 else ''} "
               f"({', '.join(names.get(m, m) for m in members[1:])}; {len(members)} replicates of {b}'s protocol, "
               f"each at its own search's winner), {float(np.mean(vals)):.3f} ± {float(np.std(vals, ddof=1)):.3f} "
               f"(n={len(vals)}), is less exposed to one search's choice than {b}'s cell alone. Against it (paired "
               f"by seed, Holm over the column's methods; each method's cell still rests on one search of its own): "
               + "; ".join(parts) + ".")
  return out


def _beyond_margin(fams: dict, margin: float) -> dict:
  """{column: [is the method shown more than `margin` above the baseline?, one per comparison
  of `fams[column]`]}: one-sided tests of H0: diff <= margin (`stats.superiority_by_margin`),
  one Holm family over every column's testable comparisons, since one column refutes remark
  4.1 (`fams`: {column: `_column_family`})."""
  keys = [(col, i) for col, fam in fams.items() for i, r in enumerate(fam[2]) if r["test"] is not None]
  adj = stats.holm([stats.superiority_by_margin(fams[col][2][i]["test"], margin) for col, i in keys])
  flags = {col: [False] * len(fam[2]) for col, fam in fams.items()}
  for (col, i), p in zip(keys, adj):
    flags[col][i] = p < stats.ALPHA
  return flags


def _column_verdict(res, beyond, margin: float) -> str:
  """Remark 4.1 in one column ("no method is `margin` or more above the baseline"), from the
  column's comparisons `res` and their `_beyond_margin` flags: "against" (a method shown
  more than the margin above it), "cannot tell" (a method it cannot test, fewer than two
  seeds, or nothing testable), "supports" (every method's one-sided test of `margin` or more
  above it rejects: the intersection-union test), else "inconclusive". A method
  significantly above the baseline by less than the margin refutes nothing at this margin."""
  if any(beyond):
    return "against"
  if not res or any(r["test"] is None for r in res):
    return "cannot tell"
  return "supports" if all(stats.non_superiority(r["test"], margin) < stats.ALPHA for r in res) else "inconclusive"


GLANCE_SYMBOLS = {"better": "▲", "worse": "▼", "equivalent": "≈", "inconclusive": "?", "cannot tell": "·"}
GLANCE_VERDICTS = {"supports": "none above", "against": "some above", "inconclusive": "inconclusive",
                   "cannot tell": "cannot tell"}


def against_baseline_table(table: collect.Table, baseline: str, names: dict, margin: float = stats.MARGIN) -> str:
  """Remark 4.1's comparisons at a glance: per method and column, the paired difference from
  the baseline's cell (mean over the seeds both ran) and its outcome in the column's family
  (Holm over the column's methods; `stats.against_baseline`), then each column's detectable
  differences and its verdict (`remark_4_1`).

  Args:
    table: the held-out-domain table.
    baseline: the baseline method.
    names: display names.
    margin: the equivalence margin.

  Returns:
    A markdown table with its legend, or "" where no column has a usable baseline cell.
  """
  fams = {col: _column_family(table, baseline, col, margin) for col in table.columns}
  if not any(fams.values()):
    return ""
  beyond = _beyond_margin({col: fam for col, fam in fams.items() if fam is not None}, margin)
  out, ctrl = {}, {}
  for col, fam in fams.items():
    if fam is not None:
      out.update({(m, col): r for (m, _), r in zip(fam[1], fam[2])})
      ctrl.update({(m, col): r for m, _, r in negative_controls(table, baseline, col, margin)})
  rows = ["| group | method | " + " | ".join(collect.column_label(c) for c in table.columns) + " |",
          "|---|---|" + "---:|" * len(table.columns)]
  last = None
  for group, m, name in table.rows:
    cells = []
    for col in table.columns:
      c, r = table.cells.get((m, col)), out.get((m, col))
      if m == baseline:
        cells.append(f"{c.mean:.3f}" if _usable(c) else collect.format_cell(c, 3))
      elif (k := ctrl.get((m, col))) is not None and k["test"] is not None:  # a negative control
        cells.append(f"{collect.format_cell(c, 3)} ({k['test']['diff']:+.3f} {GLANCE_SYMBOLS[k['outcome']]})")
      elif r is None:  # not applicable, marked, no finished run, or the column's baseline unusable
        cells.append(collect.format_cell(c, 3) if c is None or c.mark or not _usable(c) else "-")
      elif r["test"] is None:
        cells.append(GLANCE_SYMBOLS["cannot tell"])
      else:
        cells.append(f"{r['test']['diff']:+.3f} {GLANCE_SYMBOLS[r['outcome']]}" + ("ʷ" * bool(r.get("check_disagrees"))))
    rows.append(f"| {group if group != last else ''} | {name} | " + " | ".join(cells) + " |")
    last = group
  mdd, verdict = [], []
  for col in table.columns:
    fam = fams[col]
    d = sorted(r["mdd"] for r in (fam[2] if fam else ()) if r["mdd"] is not None)
    mdd.append(f"{float(np.median(d)):.3f}" if d else "-")
    verdict.append(GLANCE_VERDICTS[_column_verdict(fam[2], beyond[col], margin)] if fam else "-")
  rows.append("|  | detectable (median) | " + " | ".join(mdd) + " |")
  rows.append("|  | remark 4.1 | " + " | ".join(verdict) + " |")
  b = names.get(baseline, baseline)
  legend = (f"{b}'s row: its mean. Other rows: the method's mean minus {b}'s over the seeds both cells ran "
            f"(paired by seed), and the outcome in the column's family (Holm over the column's methods at "
            f"{stats.ALPHA:g}): ▲ better, ▼ worse, ≈ equivalent within ±{margin:g} (two one-sided tests), ? "
            "inconclusive (the data allow a difference larger than the margin), · untestable (fewer than two "
            "seeds); ʷ: Wilcoxon's signed-rank check, Holm-adjusted the same way, decides otherwise (the outcome "
            "rests on a few seeds or on outliers); -ᵃ / -ᵇ cells are marked in the table and left out of the "
            "column's family; a -ᵃ cell (the baseline's update by construction) gives in brackets its own paired "
            "difference and outcome as a negative control (Holm over the column's controls: what the baseline's "
            "selected hyperparameters alone move, Reading, remark 4.1); '-' where the method does not apply or "
            "the column's baseline cell cannot be tested. 'detectable (median)': the median over "
            f"the column's comparisons of the true difference found with {stats.POWER:.0%} power at Holm's first "
            "level. 'remark 4.1': the column's verdict in the Reading: 'none above' (every method shown less than "
            "the margin above the baseline, the intersection-union test), 'some above' (a method shown more than "
            "the margin above it: one-sided tests, one Holm family over the remark's columns), 'cannot tell' (a "
            "method it cannot test) or 'inconclusive' (neither shown). A method paper's claim tests "
            "the same differences in a smaller family (the method's own columns), so a '?' here can be decided "
            "there.")
  return "\n".join(rows) + "\n\n" + legend


COMPARISON_FIELDS = ("column", "method", "test", "seeds", "diff", "se", "df", "p", "holm_p", "wilcoxon_p",
                     "wilcoxon_holm_p", "tost_holm_p", "detectable", "equivalence_bound", "outcome",
                     "non_superiority_p", "beyond_margin_holm")


def comparison_rows(table: collect.Table, baseline: str, names: dict, margin: float = stats.MARGIN) -> list[dict]:
  """Every comparison remark 4.1 rests on, one row each (`COMPARISON_FIELDS`): the column,
  the method, the test ("paired" or "welch") and its seeds, the difference from the
  baseline with its SE, degrees of freedom and p, the Holm-adjusted p in the column's family,
  the signed-rank check, the two one-sided tests' Holm p, the detectable difference and the
  equivalence bound at the family's first Holm level, the outcome, the one-sided p of "the
  margin or more above" (`stats.non_superiority`) and whether the method is shown more than
  the margin above (`_beyond_margin`, Holm over the remark's columns). "" where a value does
  not apply (an untestable comparison; the signed-rank test of a Welch one).

  Args:
    table: the held-out-domain table.
    baseline: the baseline method.
    names: display names.
    margin: the equivalence margin.

  Returns:
    The rows, column by column in the table's order, methods in its row order.
  """
  fams = {col: fam for col in table.columns for fam in [_column_family(table, baseline, col, margin)] if fam}
  flags = _beyond_margin(fams, margin)
  num = lambda v: "" if v is None else f"{float(v):.6g}"  # noqa: E731
  rows = []
  for col, (base, others, res) in fams.items():
    for (m, c), r, beyond in zip(others, res, flags[col]):
      t = r["test"] or {}
      rows.append({"column": collect.column_label(col), "method": names.get(m, m), "test": t.get("kind", ""),
                   "seeds": t.get("n", "") if t else "", "diff": num(t.get("diff")), "se": num(t.get("se")),
                   "df": num(t.get("df")), "p": num(t.get("p")), "holm_p": num(r["holm_p"]),
                   "wilcoxon_p": num(t.get("wilcoxon_p")) if t.get("kind") == "paired" else "",
                   "wilcoxon_holm_p": num(r["wilcoxon_holm_p"]), "tost_holm_p": num(r["tost_p"]),
                   "detectable": num(r["mdd"]), "equivalence_bound": num(r.get("eq_bound")),
                   "outcome": r["outcome"],
                   "non_superiority_p": num(stats.non_superiority(t, margin)) if t else "",
                   "beyond_margin_holm": ("yes" if beyond else "no") if t else ""})
  return rows


def write_comparisons(path: str, rows: list[dict]) -> None:
  """`comparison_rows` as CSV."""
  import csv
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=COMPARISON_FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)


def remark_4_1(table: collect.Table, baseline: str, names: dict, margin: float = stats.MARGIN
               ) -> tuple[str, list[str]]:
  """FedAvg-ERM is a strong baseline: in each column, does any method beat it? A column's
  comparisons of every method with the baseline are one family (`stats.against_baseline`:
  paired by seed, Holm-adjusted, equivalence at +-margin), which names each method better,
  worse, equivalent or inconclusive. The column's verdict is the intersection-union test of
  "no method is `margin` or more above the baseline" (`stats.non_superiority` rejected at
  alpha for every method, Berger 1982: no multiplicity correction): it supports the remark
  when that holds; it is against it when a method is shown more than the margin above it
  (`stats.superiority_by_margin`, one Holm family over every column's comparisons, since one
  column refutes the remark; a method significantly above by less is named, and refutes
  nothing at this margin); "cannot tell" when a method it cannot test (fewer than two seeds)
  is in the column, or nothing is testable; "inconclusive" otherwise (the data allow a
  method above the baseline by the margin or more). Each line gives the column's detectable differences and the
  smallest margin the design could have shown non-superiority within."""
  lines, outcomes = [], []
  fams = {col: fam for col in table.columns for fam in [_column_family(table, baseline, col, margin)] if fam}
  flags = _beyond_margin(fams, margin)
  for col, (base, others, res) in fams.items():
    by = {k: [] for k in ("better", "worse", "equivalent", "inconclusive", "cannot tell")}
    for (m, c), r in zip(others, res):
      by[r["outcome"]].append((m, c, r))
    tested = [r for r in res if r["test"] is not None]
    below = [stats.non_superiority(r["test"], margin) < stats.ALPHA for r in tested]
    beyond = [names.get(m, m) for (m, _), b in zip(others, flags[col]) if b]
    outcomes.append(_column_verdict(res, flags[col], margin))
    cite = lambda m, c, r: _cite(names, m, r)  # noqa: E731
    text = f"{collect.column_label(col)}: {names.get(baseline, baseline)} {collect.format_cell(base, 3)}"
    text += _left_out([(m, table.cells.get((m, col))) for _, m, _ in table.rows if m != baseline], names) + "; "
    text += (f"significantly above it: {', '.join(cite(*x) for x in by['better'])}" if by["better"]
             else "no method significantly above it")
    text += (f"; shown more than {margin:g} above it (one-sided, Holm over the remark's columns): "
             f"{', '.join(beyond)}" if beyond
             else f"; none shown more than {margin:g} above it" if by["better"] else "")
    text += f"; significantly below it: {', '.join(cite(*x) for x in by['worse'])}" if by["worse"] else ""
    text += (f"; equivalent within ±{margin:g}: {', '.join(names.get(m, m) for m, _, _ in by['equivalent'])}"
             if by["equivalent"] else "")
    text += (f"; inconclusive: {', '.join(names.get(m, m) for m, _, _ in by['inconclusive'])}"
             if by["inconclusive"] else "")
    text += (f"; untestable: {', '.join(f'{names.get(m, m)} {collect.format_cell(c, 3)}' for m, c, _ in by['cannot tell'])}"
             if by["cannot tell"] else "")
    controls = _controls_part(negative_controls(table, baseline, col, margin), names)
    text += f"; {controls}" if controls else ""
    mdds = sorted(r["mdd"] for _, _, r in sum(by.values(), []) if r["mdd"] is not None)
    if mdds:
      text += (f"; detectable (80% power at Holm's first level {stats.ALPHA:g}/{len(mdds)}): "
               f"{mdds[0]:.3f} to {mdds[-1]:.3f}, median {float(np.median(mdds)):.3f}")
    floors = sorted(r["eq_bound"] - abs(r["test"]["diff"]) for _, _, r in sum(by.values(), [])
                    if r.get("eq_bound") is not None)
    if floors:
      text += (f"; equivalence provable at best within ±{floors[0]:.3f} to ±{floors[-1]:.3f}, median "
               f"±{float(np.median(floors)):.3f} (t SE at the same level, the bound at a zero difference: "
               f"{sum(f < margin for f in floors)} of {len(floors)} below ±{margin:g})")
    if tested:
      ns = sorted(b - r["test"]["diff"] for r in tested for b in [stats.non_superiority_bound(r["test"])]
                  if b is not None)
      text += (f"; not {margin:g} or more above it (one-sided, {stats.ALPHA:g} each): {sum(below)} of {len(below)}"
               + (f", provable at best within +{ns[0]:.3f} to +{ns[-1]:.3f}, median +{float(np.median(ns)):.3f} "
                  f"(t SE at {stats.ALPHA:g}, the bound at a zero difference)" if ns else ""))
    lines.append(text)
  return stats.verdict_powered(outcomes, "supports", margin, COLUMN_LABELS, refuted_by="against"), lines


REMARK_4_2_WORDS = {"better": "degrades", "worse": "improves", "inconclusive": "inconclusive",
                    "cannot tell": "cannot tell"}


def _remark_4_2_labels(margin: float) -> dict:
  return {"better": "degrades", "worse": "improves", "equivalent": f"equivalent within ±{margin:g}",
          "inconclusive": "inconclusive"}


def remark_4_2_federated(table: collect.Table, methods, baseline: str, names: dict, margin: float = stats.MARGIN
                         ) -> tuple[str, list[str]]:
  """DG methods degrade in FL: each method's centralised cell (C = 1) against each federated
  column, paired by seed (the runs of a seed share the split and the initial model), the
  remark's comparisons one family (`stats.against_baseline` with the centralised cell in the
  place of the cell and the federated one in the baseline's: Holm over the family,
  equivalence at +-margin). "degrades" where the centralised cell is significantly higher;
  the remark holds when more than half of its testable comparisons degrade
  (`stats.verdict_most_powered`). FedAvg-ERM's own drop is listed for comparison, a family of
  its own, not counted."""
  fl_cols = [c for c in table.columns if c[1] is not None]
  shown = [m for m in methods if any(r[1] == m for r in table.rows)] + [baseline]
  comps = {m: [(col, table.cells.get((m, (1, None))), table.cells.get((m, col))) for col in fl_cols]
           for m in shown if _usable(table.cells.get((m, (1, None))))}
  comps = {m: [(col, cen, c) for col, cen, c in v if _usable(c)] for m, v in comps.items()}
  family = [(m, col, cen, c) for m, v in comps.items() if m != baseline for col, cen, c in v]
  res = dict(zip([(m, col) for m, col, _, _ in family],
                 stats.against_baseline([(cen.by_seed, c.by_seed) for _, _, cen, c in family], margin=margin)))
  if baseline in comps:
    res.update(zip([(baseline, col) for col, _, _ in comps[baseline]],
                   stats.against_baseline([(cen.by_seed, c.by_seed) for _, cen, c in comps[baseline]], margin=margin)))
  lines = []  # one comparison a line
  for m, v in comps.items():
    ref = " (the baseline, for comparison)" if m == baseline else ""
    for col, cen, c in v:
      r = res[(m, col)]
      word = REMARK_4_2_WORDS.get(r["outcome"], f"equivalent within ±{margin:g}")
      lines.append(f"{names.get(m, m)}{ref}: C=1 {collect.format_cell(cen, 3)} vs {collect.column_label(col)} "
                   f"{collect.format_cell(c, 3)}: {word} ({stats.fmt_powered(r)})")
  outcomes = [res[(m, col)]["outcome"] for m, col, _, _ in family]
  return stats.verdict_most_powered(outcomes, "better", margin, _remark_4_2_labels(margin)), lines


def remark_4_2_lambda(table: collect.Table, methods, names: dict, hi: float = 1.0, lo: float = 0.1,
                      margin: float = stats.MARGIN) -> tuple[str, list[str]]:
  """...and degrade from homogeneous (lambda = 1) to heterogeneous (lambda = 0.1) clients,
  the two columns Bai et al. compares: per C and method, lambda = 1 against 0.1, paired by
  seed, the remark's comparisons one family (Holm, equivalence at +-margin); "degrades"
  where lambda = 1 is significantly higher; holds when more than half of the testable
  comparisons degrade."""
  family = []
  for C in sorted({c[0] for c in table.columns if c[1] is not None}):
    for m in methods:
      a, b = table.cells.get((m, (C, hi))), table.cells.get((m, (C, lo)))
      if _usable(a) and _usable(b):
        family.append((m, C, a, b))
  res = stats.against_baseline([(a.by_seed, b.by_seed) for _, _, a, b in family], margin=margin)
  lines = []
  for (m, C, a, b), r in zip(family, res):
    word = REMARK_4_2_WORDS.get(r["outcome"], f"equivalent within ±{margin:g}")
    lines.append(f"{names.get(m, m)} at C={C}: λ={hi:g} {collect.format_cell(a, 3)} vs λ={lo:g} "
                 f"{collect.format_cell(b, 3)}: {word} ({stats.fmt_powered(r)})")
  return stats.verdict_most_powered([r["outcome"] for r in res], "better", margin, _remark_4_2_labels(margin)), lines


def remark_4_7(rows: list[dict], names: dict, margin: float = stats.MARGIN) -> tuple[str, list[str]]:
  """Accuracy falls with the number of clients: per (lambda, method), the smallest C against
  the largest, paired by seed (the runs of a seed share the split and the initial model), the
  remark's comparisons one family (`stats.against_baseline`: Holm, equivalence at +-margin);
  "falls" where the smallest C is significantly higher; holds when more than half of the
  testable comparisons fall (`stats.verdict_most_powered`)."""
  rows = [r for r in rows if not r.get("_mark")]
  series = []
  for lam, m in dict.fromkeys((r["lam"], r["method"]) for r in rows):
    pts = sorted((r for r in rows if r["lam"] == lam and r["method"] == m), key=lambda r: r["num_clients"])
    if len(pts) >= 2:
      series.append((lam, m, pts))
  res = stats.against_baseline([(pts[0]["_by_seed"], pts[-1]["_by_seed"]) for _, _, pts in series], margin=margin)
  words = {"better": "falls", "worse": "rises", "inconclusive": "inconclusive", "cannot tell": "cannot tell"}
  lines = []
  for (lam, m, pts), r in zip(series, res):
    word = words.get(r["outcome"], f"equivalent within ±{margin:g}")
    lines.append(f"λ={lam:g} {names.get(m, m)}: " + ", ".join(f"C={p['num_clients']} {_point(p)}" for p in pts)
                 + f"; C={pts[0]['num_clients']} vs C={pts[-1]['num_clients']}: {word} ({stats.fmt_powered(r)})")
  labels = {"better": "falls", "worse": "rises", "equivalent": f"equivalent within ±{margin:g}",
            "inconclusive": "inconclusive"}
  return stats.verdict_most_powered([r["outcome"] for r in res], "better", margin, labels), lines


SERIES_LABELS = {"supports": ("series with its best interior schedule above both ends",
                              "series with the best interior schedule above both ends"),
                 "against": ("series with an end at or above it", "series with an end at or above it"),
                 "inconclusive": ("undecided series", "undecided series")}
REMARK_4_8_WORDS = {"better": "above", "worse": "below", "inconclusive": "inconclusive", "cannot tell": "cannot tell"}


def remark_4_8(rows: list[dict], names: dict, margin: float = stats.MARGIN) -> tuple[str, list[str]]:
  """Accuracy is not monotone in communication rounds at fixed computation: per (C, lambda,
  method), the best interior schedule against both ends, paired by seed (the runs of a seed
  share the split, the partition and the initial model), the two comparisons one family
  (`stats.against_baseline`: Holm, equivalence at +-margin) at alpha divided by the number of
  interior schedules the best was picked from (Bonferroni for the pick). A series supports
  the remark where its interior schedule is above both ends; it is against it where an end
  is above it or within the margin of it; undecided otherwise."""
  lines, outcomes, mdds, seeds = [], [], [], []
  rows = [r for r in rows if not r.get("_mark")]
  for C, lam, m in dict.fromkeys((r["num_clients"], r["lam"], r["method"]) for r in rows):
    pts = sorted((r for r in rows if (r["num_clients"], r["lam"], r["method"]) == (C, lam, m)),
                 key=lambda r: r["num_rounds"])
    if len(pts) < 3:
      continue
    mid = max(pts[1:-1], key=lambda r: r["mean"])
    alpha = stats.ALPHA / (len(pts) - 2)
    res = stats.against_baseline([(mid["_by_seed"], end["_by_seed"]) for end in (pts[0], pts[-1])], alpha=alpha,
                                 margin=margin)
    os_ = [r["outcome"] for r in res]
    outcomes.append("cannot tell" if "cannot tell" in os_ else "supports" if os_ == ["better", "better"]
                    else "against" if any(o in ("worse", "equivalent") for o in os_) else "inconclusive")
    word = lambda r: REMARK_4_8_WORDS.get(r["outcome"], f"equivalent within ±{margin:g}")  # noqa: E731
    where = f"C={C}" + ("" if lam is None else f" λ={lam:g}")
    lines.append(f"{where} {names.get(m, m)}: " + ", ".join(f"R={r['num_rounds']} {_point(r)}" for r in pts)
                 + f"; best interior R={mid['num_rounds']} (of {len(pts) - 2}, its two tests at {alpha:.3g}, Holm) vs "
                 f"R={pts[0]['num_rounds']}: {word(res[0])} ({stats.fmt_powered(res[0])}), vs "
                 f"R={pts[-1]['num_rounds']}: {word(res[1])} ({stats.fmt_powered(res[1])})")
    mdds += [r["mdd"] for r in res if r["mdd"] is not None]
    seeds += [len(r["_by_seed"]) for r in pts]
  if mdds:
    lines.append(f"what this design can see: {min(seeds)}" + (f"-{max(seeds)}" if max(seeds) != min(seeds) else "")
                 + f" seeds a point; the comparisons' detectable differences are {min(mdds):.3f} to {max(mdds):.3f} "
                 f"(median {float(np.median(mdds)):.3f}): a smaller true difference between schedules is found with "
                 "less than 80% power" + ("; more seeds, not these data, would decide the undecided series"
                                          if "inconclusive" in outcomes else ""))
  return stats.verdict_powered(outcomes, "supports", margin, SERIES_LABELS), lines


CLAIM_WORDS = {"better": "holds", "worse": "does not hold (below the baseline)", "inconclusive": "inconclusive",
               "cannot tell": "cannot tell"}


def _claim_family(table: collect.Table, baseline: str, m: str, margin: float) -> tuple[list, list]:
  """A method paper's claim's family: (its federated columns where both cells are usable,
  `stats.against_baseline` over them, Holm over the columns)."""
  cols = [c for c in table.columns if c[1] is not None
          and _usable(table.cells.get((m, c))) and _usable(table.cells.get((baseline, c)))]
  return cols, stats.against_baseline([(table.cells[(m, c)].by_seed, table.cells[(baseline, c)].by_seed)
                                       for c in cols], margin=margin)


def claim_control_note(table: collect.Table, baseline: str, names: dict, m: str, margin: float = stats.MARGIN) -> str:
  """The columns where a method paper's claim is decided (better or worse) by no more than
  the column's negative controls moved the baseline's cell in the same direction
  (`negative_controls`): there the column does not separate the method's term from the
  baseline's selection (sizes compared, not a test). For each such column the note adds the
  method's outcome against the column's pooled baseline (`pooled_baseline_lines`), the test
  of what the sizes compare.

  Args:
    table: the held-out-domain table.
    baseline: the baseline method.
    names: display names.
    m: the method whose paper makes the claim.
    margin: the equivalence margin.

  Returns:
    One paragraph naming those columns, or "" where there is none.
  """
  cols, res = _claim_family(table, baseline, m, margin)
  hits, pooled = [], []
  for col, r in zip(cols, res):
    if r["outcome"] not in ("better", "worse"):
      continue
    far = [k["test"]["diff"] for _, _, k in negative_controls(table, baseline, col, margin) if k["outcome"] == r["outcome"]]
    if far and abs(r["test"]["diff"]) <= max(abs(d) for d in far):
      top = max(far, key=abs)
      hits.append(f"{collect.column_label(col)} ({r['test']['diff']:+.3f}, controls up to {top:+.3f})")
      tested = _against_pooled(table, baseline, col, margin)
      k = next((k for (o, _), k in zip(tested[2], tested[3]) if o == m), None) if tested else None
      if k is not None and k["test"] is not None:
        word = {"better": "above it", "worse": "below it", "equivalent": f"equivalent within ±{margin:g}"}.get(
            k["outcome"], k["outcome"])
        pooled.append(f"{collect.column_label(col)} {word} ({k['test']['diff']:+.3f}, Holm "
                      f"{stats.fmt_p({'p': k['holm_p']})})")
  if not hits:
    return ""
  n, b = names.get(m, m), names.get(baseline, baseline)
  text = (f"Negative controls: in {'; '.join(hits)}, {n}'s difference from {b} is within what the choice of {b}'s "
          f"hyperparameters alone moves {b}'s cell there (cells that compute its update by construction, each at "
          f"its own search's winner; remark 4.1): {'that column does' if len(hits) == 1 else 'those columns do'} "
          f"not separate {n}'s term from the baseline's selection.")
  if pooled:
    text += (f" Against the pooled baseline there (the per-seed mean of {b}'s cell and its controls, Holm over the "
             f"column's methods; remark 4.1): {'; '.join(pooled)}.")
  return text


def seed_paper_claims(table: collect.Table, baseline: str, names: dict, margin: float = stats.MARGIN
                      ) -> list[tuple[str, str, str, list[str]]]:
  """Each method paper's headline claim, "our method beats FedAvg", in every federated
  column: [(method, claim, verdict, lines)] for the methods the table holds. A claim's comparisons
  (one per column) are one family (`stats.against_baseline`: paired by seed, Holm over the
  columns, equivalence at +-margin, the detectable difference at alpha / columns)."""
  from fedjax_dg import algorithms
  out = []
  for m, spec in algorithms.METHODS.items():  # the methods whose paper claims they beat FedAvg
    if not spec.claim:
      continue
    who = f"{names.get(m, m)} ({reference.claim_paper(spec.claim)})"
    if not any(r[1] == m for r in table.rows):
      continue
    cols, res = _claim_family(table, baseline, m, margin)
    lines = []
    for col, r in zip(cols, res):
      a, b = table.cells[(m, col)], table.cells[(baseline, col)]
      word = CLAIM_WORDS.get(r["outcome"], f"equivalent within ±{margin:g}")
      lines.append(f"{collect.column_label(col)}: {names.get(m, m)} {collect.format_cell(a, 3)} vs "
                   f"{names.get(baseline, baseline)} {collect.format_cell(b, 3)}: {word} ({stats.fmt_powered(r)})")
    for col in table.columns:
      if col[1] is not None and (cell := table.cells.get((m, col))) is not None and cell.mark:
        lines.append(f"{collect.column_label(col)}: not tested{_left_out([(m, cell)], names)}")
    out.append((m, f"{who}: {names.get(m, m)} beats {names.get(baseline, baseline)}",
                stats.verdict_powered([r["outcome"] for r in res], "better", margin), lines))
  return out


# ---------------------------------------------------------------------------- setup facts

def late_selection(data, grid: str, rule: str, metric: str, last: float = 0.1) -> dict:
  """{column (C, lam): (k, n)}: of the n runs a column's cells rest on (each seed's selected
  trial), k selected a round in the last `last` fraction of their rounds (the model still
  improving when training stopped), counted to the run's last evaluated round. A run whose
  selection looks only at its final stage (`summary.selection_scope`, e.g. FedLOE's stage 2)
  selects late by construction and is left out (`late_selection_line` counts them)."""
  entries = sweep_lib.grid_entries(data.exp, grid)
  cells = {}
  for e in entries:
    cells.setdefault((e.axes["method"], e.axes["num_clients"], e.axes["lam"]), []).append(e)
  out = {}
  for (_, C, lam), es in cells.items():
    col = (C, None if lam is None else float(lam))
    for e in collect.chosen_entries(es, data.results, rule, metric).values():
      run = data.results[e.key]
      if run["summary"].get("selection_scope", "all rounds") != "all rounds":
        out[("staged",)] = out.get(("staged",), 0) + 1
        continue
      s = collect.rule_scores(run, rule, metric)
      rounds = max([int(r["round"]) for r in run["records"]] or [int(data.exp.jobs[e.key].config.num_rounds)])
      k, n = out.get(col, (0, 0))
      out[col] = (k + (s["round"] > (1.0 - last) * rounds), n + 1)
  return out


def _column_key(col) -> tuple:
  """The tables' column order: C ascending, then lambda 1, 0.1, 0 (C = 1 has no lambda)."""
  return col[0], -(col[1] if col[1] is not None else 2.0)


def late_selection_line(per_column: dict) -> str:
  per_column = dict(per_column)
  staged = per_column.pop(("staged",), 0)
  k, n = sum(v[0] for v in per_column.values()), sum(v[1] for v in per_column.values())
  cols = sorted(per_column, key=_column_key)
  return (f"selected rounds: {k} of {n} runs behind the table's cells ({(k / n if n else 0):.0%}) selected a round "
          "in the last 10% of training (training may have stopped before the runs converged; a flat, noisy end "
          "also selects there at times); per column: "
          + ", ".join(f"{collect.column_label(c)} {per_column[c][0]}/{per_column[c][1]}" for c in cols)
          + (f"; {staged} runs that select within their final stage only (FedLOE's stage 2) are not counted"
             if staged else ""))


_VECTOR_WIDTHS = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"))


def machine_label(provenance: dict) -> str:
  """A run's machine as the report names it: the CPU model its record gives, the widest vector
  extension the CPU offers, and the cores the run could use (`provenance.determinism`).

  Args:
    provenance: a run summary's `provenance` record.

  Returns:
    e.g. "AMD EPYC, AVX-512, 2 cores"; "not recorded" for a run recorded before machines were.
  """
  d = provenance.get("determinism") or {}
  cpu = d.get("cpu") or {}
  if not cpu:
    return "not recorded"
  simd = set(cpu.get("simd") or ())
  width = next((name for flag, name in _VECTOR_WIDTHS if flag in simd), "no vector extension recorded")
  cores = d.get("usable_cores")
  return f"{cpu.get('model') or 'unknown CPU'}, {width}" + (f", {cores} cores" if cores else "")


def provenance_lines(data) -> list[str]:
  commits, dirty, fps = collections.Counter(), collections.Counter(), collections.Counter()
  machines = collections.Counter()
  for run in data.results.values():
    p = run["summary"].get("provenance") or {}
    g = p.get("git") or {}
    commits[(g.get("commit") or "")[:12] or "unknown"] += 1
    dirty["unknown" if g.get("dirty") is None else "uncommitted changes" if g.get("dirty") else "clean tree"] += 1
    fps[((p.get("source") or {}).get("sha256") or "")[:12] or "none recorded"] += 1
    machines[machine_label(p)] += 1
  n = len(data.results)
  fmt = lambda c: ", ".join(f"{k} ({v})" for k, v in sorted(c.items()))
  lines = [f"runs: {n} finished; git commits: {fmt(commits) or '-'}; trees: {fmt(dirty) or '-'}",
           f"source fingerprints (sha256 of the parsed code each run can execute, `fedjax_dg.provenance`): {fmt(fps) or '-'}; stale runs: {len(data.stale)}",
           f"machines (CPU model, widest vector extension, usable cores): {fmt(machines) or '-'}"]
  if len(machines) > 1:
    lines[-1] += ("; a run's rounding follows its machine's vector code, and a long run at a large learning rate "
                  "carries a last-bit difference into visibly different accuracies (docs/reproducibility.md): the "
                  "runs of one seed share its split, partition, cohorts and initial model wherever they ran, not "
                  "their rounding, which the seeds' spread includes")
  return lines


def setup_lines(data, st) -> list[str]:
  sweep, b = data.sweep, data.sweep.base
  c = b.client
  label = sweep.get("report", {}).get("dataset", "")
  lines = [f"data: " + (f"{label} (`{b.data.name}`)" if label else f"`{b.data.name}`")
           + (f" from `{b.data.get('fallback_path', '') or b.data.get('path', '')}`"
                                        if b.data.get("path", "") else "")
           + (f", at most {b.data.max_per_domain} images per domain" if b.data.get("max_per_domain", 0) else "")
           + f"; test domains {tuple(b.data.test_domains)}, held-out validation domains {tuple(b.data.val_domains)}",
           f"model `{b.model.name}`; {b.num_rounds} rounds, evaluated every {b.eval_every}; client "
           f"{c.optimizer} lr {c.lr:g}, batch {c.batch_size}, "
           + (f"{c.local_steps} local steps" if c.local_steps else f"{c.local_epochs} local epoch(s)")
           + f" per round; server lr {b.server.lr:g}",
           f"metric: test {st['metric']}; model selection on the held-out domain (Bai et al. Sec. 4.3) unless a "
           "table says otherwise"]
  search = sweep.get("search", {})
  trial_grids = {n: int(g.get("num_trials", 0)) for n, g in sweep.grids.items() if int(g.get("num_trials", 0)) > 1}
  if trial_grids:
    dist = sweep_lib.flatten_distributions(search.get("distributions", {}))
    table_cols = set(collect.table_columns(sweep.grids[st["table_grid"]])) if st["table_grid"] in sweep.grids else None

    def trials_text(n, t):
      g = sweep.grids[n]
      seeds = tuple(g.get("seeds", (0,)))
      text = f"grid `{n}` {t} trials at seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}"
      cols = set(collect.table_columns(g))
      return text + (f" in {_columns_text(g)} only" if table_cols and cols != table_cols else "")
    lines.append("random search: " + ", ".join(trials_text(n, t) for n, t in trial_grids.items())
                 + " (trial 0 the defaults)" + ("; the methods' declared ranges" if search.get("method_ranges") else "")
                 + ("; " + ", ".join(f"`{k}` {tuple(v)}" for k, v in sorted(dist.items())) if dist else ""))
  for n, g in sweep.grids.items():
    if g.get("select_from", ""):
      src_seeds = set(sweep.grids[g.select_from].get("seeds", ()))
      fresh = "fresh seeds" if not src_seeds & set(g.seeds) else "seeds, the search's own run among them"
      only = tuple(g.get("select_seeds", ()) or ())
      lines.append(f"grid `{n}`: {len(g.seeds)} {fresh} ({', '.join(map(str, g.seeds))}) at the trial that grid "
                   f"`{g.select_from}` selects per cell ({g.get('select_rule', 'heldout_domain')} validation, "
                   + (f"at search seed{'s' * (len(only) > 1)} {', '.join(map(str, only))} alone)" if only
                      else "mean over the search's seeds)"))
  for m, over in sorted(sweep.get("method_overrides", {}).items()):
    if any(m in g.get("methods", ()) or m in sweep.get("centralized", {}).values() for g in sweep.grids.values()):
      flat = sweep_lib.flatten(over) if hasattr(over, "items") else {}
      lines.append(f"{m}: " + ", ".join(f"`{k}={v}`" for k, v in sorted(flat.items())))
  return lines


def _value(v) -> str:
  return f"{v:.3g}" if isinstance(v, float) else str(v)


def _winners(data, grid: str) -> tuple[dict, dict]:
  """({(method, C, lam, test domains): (trial, overrides)}, {same key: [runs]}) of a grid
  whose seeds run at the trial its search selected (winners are chosen per fold)."""
  cells, runs = {}, collections.defaultdict(list)
  for e in sweep_lib.grid_entries(data.exp, grid):
    a = e.axes
    lam = None if a["lam"] is None else float(a["lam"])
    k = (a["method"], a["num_clients"], lam, tuple(a["test_domains"]))
    cells.setdefault(k, (a["trial"], a["overrides"]))
    if e.key in data.results:
      runs[k].append(data.results[e.key])
  return cells, runs


def other_winners(data, grid: str, other: str) -> tuple[int, int]:
  """(k, n): of the n cells both grids hold, k run at another trial in `other` (the in-domain
  table's winners against the held-out-domain table's)."""
  a, b = _winners(data, grid)[0], _winners(data, other)[0]
  both = set(a) & set(b)
  return sum(a[k][0] != b[k][0] for k in both), len(both)


def selected_hyperparameters(data, grid: str, names: dict) -> str:
  """Bai et al.'s Table 7 counterpart: for each cell of a `select_from` grid, the search
  trial its seeds ran at and that trial's values (the method's defaults for trial 0),
  marked "no effect" where the cell's runs equal the baseline by construction or their
  method's term could not act (`collect.cell_mark`); "" when the grid has no search behind
  it."""
  sweep, exp = data.sweep, data.exp
  if not sweep.grids.get(grid, {}).get("select_from", ""):
    return ""
  cells, runs = _winners(data, grid)
  folds = len({k[3] for k in cells}) > 1
  # The table's row order (its groups), then any other method: not the order the runs were read in.
  listed = [m for _, m, _ in collect.table_rows(sweep, sweep.grids[grid])]
  order = {m: i for i, m in enumerate(dict.fromkeys([*listed, *sorted(k[0] for k in cells)]))}
  rows = ["| method | column |" + (" test domains |" if folds else "") + " trial | values |",
          "|---|---|" + ("---|" if folds else "") + "---:|---|"]
  for (m, C, lam, test), (trial, over) in sorted(
      cells.items(), key=lambda kv: (order[kv[0][0]], *_column_key(kv[0][1:3]), kv[0][3])):
    vals = ", ".join(f"`{k}` {_value(v)}" for k, v in sorted(over.items())) or "the defaults"
    mark, reason = collect.cell_mark(runs[(m, C, lam, test)])
    if mark:  # the method's own values did nothing in these runs
      vals += f" — no effect{collect.MARKS[mark]}: the runs {collect.MARK_NOTES[mark]} ({reason})"
    rows.append(f"| {names.get(m, m)} | {collect.column_label((C, lam))} |"
                + (f" {','.join(map(str, test))} |" if folds else "") + f" {trial} | {vals} |")
  return "\n".join(rows)


def round_times(data, grid: str) -> str:
  """Bai et al. 2024 Table 13's counterpart: seconds of training per communication round, per
  method and number of clients, from the jobs behind the table (the grid and the search it
  selects from): each job's median non-compiling round (`timing.median_round_s`) divided
  by the runs that shared its compiled program, then the mean over jobs and lambdas. A
  method that trains in stages on its own schedule (FedLOE: its first stage's rounds hold
  several of the other methods' rounds of local work) counts its mean timed round times its
  own rounds, over the run's `num_rounds` (the other methods' schedule), and is named below
  the table. Evaluation, checkpoints and compilation are left out, as in Bai et al.
  "" when no job recorded its round times."""
  sweep, exp, results = data.sweep, data.exp, data.results
  g = sweep.grids.get(grid, {})
  grids = {grid, g.get("select_from", "")} - {""}
  runs = collect.program_runs(results)
  per, seen, staged, widths = collections.defaultdict(list), set(), set(), []
  for e in exp.entries:
    if e.grid not in grids or e.key not in results or e.key in seen:
      continue
    seen.add(e.key)
    sm = results[e.key]["summary"]
    timing = sm.get("timing") or {}
    t = timing.get("median_round_s")
    if sm.get("stages") and sm.get("selection_scope", "all rounds") != "all rounds" and timing.get("rounds_timed"):
      # Its mean timed round times its own rounds (every stage's), over the schedule's rounds.
      own = sum(int(st["rounds"][1]) - int(st["rounds"][0]) + 1 for st in sm["stages"])
      schedule = int((sm.get("config") or {}).get("num_rounds") or e.axes["num_rounds"])
      t = timing["train_s"] / int(timing["rounds_timed"]) * own / max(schedule, 1)
      staged.add(e.axes["method"])
    if t is not None:
      per[(e.axes["method"], int(e.axes["num_clients"]))].append(t / runs[e.key])
      widths.append(runs[e.key])
  if not per:
    return ""
  counts = sorted({int(C) for C in g.client_counts})
  rows = ["| group | method | " + " | ".join(f"C={C}" for C in counts) + " |",
          "|---|---|" + "---:|" * len(counts)]
  last = None
  for group, m, name in collect.table_rows(sweep, g):
    cells = [f"{sum(per[(m, C)]) / len(per[(m, C)]):.3f} ({len(per[(m, C)])})" if per.get((m, C)) else "-"
             for C in counts]
    rows.append(f"| {group if group != last else ''} | {name} | " + " | ".join(cells) + " |")
    last = group
  names = collect.display_names(sweep)
  for m in sorted(staged):
    rows.append("")
    rows.append(f"{names.get(m, m)}: its training time (its mean timed round times its own rounds) over the rounds "
                "of the other methods' schedule: it trains in stages that synchronise on their own schedule, so its "
                "own rounds are not theirs.")
  if widths and max(widths) > 1:
    rows += ["", f"Runs per compiled program in these jobs: {min(widths)} to {max(widths)} (median "
             f"{float(np.median(widths)):g}). A batched program's time grows less than in proportion to its runs, "
             "so a method whose jobs ran in wider batches looks cheaper per run; the other jobs sharing the machine "
             "at the same time (the launcher's workers) are not recorded."]
  return "\n".join(rows)


def _at_defaults(sweep, grid: str) -> str:
  g = sweep.grids.get(grid, {})
  if g.get("select_from", ""):
    return (" Each point's seeds ran at the trial the search grid "
            f"`{g.select_from}` selected for its cell ({g.get('select_rule', 'heldout_domain')} validation).")
  if int(g.get("num_trials", 0)) > 1:
    return f" Each point's seeds chose among {int(g.num_trials)} search trials by held-out validation."
  return " Each method at its default hyperparameters (no search)."


def _own_columns(sweep, grid: str) -> str:
  """" C=100, λ=0.1 is run for this figure only (no table column)." for a figure grid's
  (C, lambda) panels that the held-out-domain table does not have."""
  g, t = sweep.grids.get(grid, {}), sweep.grids.get(collect.report_settings(sweep)["table_grid"], {})
  if not g or not t or "client_counts" not in g or "client_counts" not in t:
    return ""
  extra = [c for c in collect.table_columns(g) if c not in set(collect.table_columns(t))]
  return (f" {'; '.join(map(collect.column_label, extra))} {'is' if len(extra) == 1 else 'are'} run for this figure "
          f"only (no table column)." if extra else "")


def _seeds(sweep, grid: str) -> str:
  g = sweep.grids.get(grid, {})
  seeds = tuple(g.get("seeds", ()))
  return f" n = {len(seeds)} seeds per point" + (" (fewer where a run did not finish)." if seeds else ".")


def figure_caption(name: str, sweep, metric: str, staged: tuple = ()) -> str:
  """What a report figure shows and what it depends on: the selection behind each point,
  defaults or searched hyperparameters, the seeds, and that the bands are standard
  deviations over seeds (not standard errors). `staged`: the display names of Fig. 4's
  methods that train in stages and are selected within the final one (`staged_methods`)."""
  f = sweep.get("figures", {})
  band = "mean ± 1 standard deviation over seeds (bands; not standard errors)"
  if name.startswith("fig2_clients"):
    return (f"Fig. 2: test {metric} at each run's held-out-selected round against the number of clients C, {band}; "
            "top row one local epoch per round, bottom row (where drawn) a fixed number of local steps per round."
            + _at_defaults(sweep, f.get("clients_grid", "")) + _seeds(sweep, f.get("clients_grid", "")))
  if name.startswith("fig3_rounds"):
    return (f"Fig. 3: test {metric} at each run's held-out-selected round against the number of rounds R at a fixed "
            f"total of local epochs (R x E; E annotated), {band}." + _at_defaults(sweep, f.get("rounds_grid", ""))
            + _own_columns(sweep, f.get("rounds_grid", "")) + _seeds(sweep, f.get("rounds_grid", "")))
  m = re.match(r"fig4_(curves|heldout_val)_C(\d+)", name)
  if m:
    split = "test-domain" if m.group(1) == "curves" else "held-out validation domain"
    return (f"Fig. 4: {split} {metric} at every evaluated round (no round selected) at C = {m.group(2)}, {band} of "
            "each seed's run at its cell's selected trial; at most three methods a panel, the baseline grey and "
            "dashed in every panel; cells the tables mark (-ᵃ, -ᵇ) draw no line."
            + (f" {', '.join(staged)} train{'s' if len(staged) == 1 else ''} in stages: drawn at the final stage's "
               "evaluations only, the models the selection chooses among (labelled \"final stage\", with markers), "
               "placed at the local steps taken, in rounds of the other methods' steps per round (its rounds "
               "share equally what the first stage left of the budget, or follow round R where the first stage "
               "took it all); the first stage is not drawn: its models are not among those the selection "
               "chooses." if staged else "")
            + _at_defaults(sweep, f.get("curves_grid", ""))
            + _seeds(sweep, f.get("curves_grid", "")))
  return name


BAI_FIG2 = algorithms.BAI_FIG2


# Bai et al.'s datasets (their Tables 8-11), as data names are written without "_" and "-".
BAI_DATASETS = frozenset({"pacs", "iwildcam", "celeba", "camelyon17", "civilcomments", "py150", "femnist"})


def deviations(data, st: dict, table: collect.Table | None = None) -> list[str]:
  """Where this report's protocol departs from Bai et al.'s (ICLR 2024), from the sweep
  config and the runs themselves, then the sweep's own `report.deviations` lines: the model,
  the seeds per cell, the search's seeds, whether the split varies with the seed, the local
  steps a client takes per round at each number of clients, the methods of Fig. 2, how the
  in-domain table chooses its trial, and each method's overrides. `table`: the held-out-domain
  table where the caller has built it (else it is built here)."""
  sweep, b = data.sweep, data.sweep.base
  out = []
  if str(b.data.name).lower().replace("_", "").replace("-", "") not in BAI_DATASETS:
    label = sweep.get("report", {}).get("dataset", "") or f"`{b.data.name}`"
    out.append(f"data: {label}, not one of Bai et al.'s seven datasets: their cells, quoted beside each remark, are "
               "from other data, so only the direction of an effect, not its size, can agree")
  if not str(b.model.name).startswith("resnet"):
    out.append(f"model `{b.model.name}`" + (f" (hidden {tuple(b.model.hidden)})" if b.model.get("hidden", ()) else "")
               + " where Bai et al. train a ResNet-50 on image data (their App. D.1): absolute accuracies are not "
               "comparable with theirs, only orderings and the direction of effects")
  g = sweep.grids.get(st["table_grid"], {})
  if g:
    n = len(tuple(g.get("seeds", ())))
    out.append(f"{n} seeds per cell of the held-out-domain table (Bai et al.: 3); cells print mean ± standard "
               "deviation as theirs do, the tests use the standard error of the per-seed differences (paired by "
               "seed, within a column and across columns; Welch's where two cells share fewer than two seeds), "
               "named SE")
    src = sweep.grids.get(g.get("select_from", ""), {})
    if src:
      k = len(tuple(src.get("seeds", ())))
      sel = sweep.get("report", {}).get("selection_grid", "")
      alt = sweep.get("report", {}).get("selection_table_grid", "")
      out.append(f"the search ran {k} seed{'s' * (k > 1)} per trial" + (
          f"; grid `{sel}` repeats its trials at a second seed in {_columns_text(sweep.grids[sel])} to measure the "
          "variance of choosing the winner ('Selection variance'); no cell's spread includes that variance (each "
          "cell's seeds run at the winner of the search's own seeds)" + (
              f"; grid `{alt}` runs the table's seeds {_seed_range(sweep.grids[alt].seeds)} at the other search "
              "seed's winners there, to measure what the cells would read under them" if alt in sweep.grids else "")
          if sel in sweep.grids else
          ": the variance of choosing the winner is not in the cells' spread" if k == 1 else ""))
  if "data.seed" not in tuple(sweep.get("seed_fields", ("seed",))):
    out.append("the image subsample and the splits (`data.seed`) are the same in every run: the split's variance is "
               "not in the spread (the partition over clients does vary with the seed)")
  else:
    out.append("the image subsample and the splits vary with the seed (`data.seed` tied to it): the spread includes "
               "the split's variance")
  steps = local_steps_per_round(data, st["table_grid"])
  if steps:
    out.append("local work per round: " + ", ".join(
        f"C={C}: about {rows:.0f} training rows a client, {k} local step{'s' * (k != 1)} a round, {k * R} in all"
        for C, (rows, k, R) in sorted(steps.items())) + " (one local epoch per round; the step budget falls with C)")
  fig2 = sweep.grids.get(sweep.get("figures", {}).get("clients_grid", ""), {})
  if fig2:
    drawn = tuple(fig2.get("methods", ()))
    extra, missing = [m for m in drawn if m not in BAI_FIG2], [m for m in BAI_FIG2 if m not in drawn]
    if extra or missing:
      names = collect.display_names(sweep)
      out.append("Fig. 2 draws " + ", ".join(names.get(m, m) for m in drawn) + " where Bai et al. draw "
                 + ", ".join(names.get(m, m) for m in BAI_FIG2))
  if st["in_domain_grid"] and st["in_domain_grid"] in sweep.grids:
    k_in = len(tuple(sweep.grids[st["in_domain_grid"]].get("seeds", ())))
    out.append(f"the in-domain table's seeds ran at the trial the in-domain validation chose (grid "
               f"`{st['in_domain_grid']}`, {k_in} seed{'s' * (k_in != 1)} per cell; no remark reads it), as in "
               "Bai et al.'s App. F")
  elif g:
    out.append("the in-domain table reuses the trial the held-out domain chose; only its round is chosen by in-domain "
               "validation (Bai et al. choose the trial in-domain too)")
  if sweep.grids.get(st["table_grid"], {}).get("select_from", ""):
    out.append("the oracle table chooses the round on the test domain among the table's runs, at the trial the "
               "held-out validation selected: Bai et al.'s oracle (DomainBed's) chooses the hyperparameters on the "
               "test domain too, so this upper bound sits below theirs")
  if g and st["table_grid"] in sweep.grids:
    held = table if table is not None else collect.tables(data, "heldout_domain")
    base_m = sweep.get("report", {}).get("baseline", "") or _baseline()
    det = detectable_by_column(held, base_m, st["margin"])
    if det:
      out.append(target_line(held, base_m, det))
  out += staged_lines(data, st["table_grid"])
  names = collect.display_names(sweep)
  for m, order in sorted(_domain_orders(data, st["table_grid"]).items()):
    if order != "ascending":
      out.append(f"{names.get(m, m)} takes its inner domain steps in a {order} order at every step (`domain_order`, "
                 "Shi et al.'s code) where Bai et al.'s federated Fish and DomainBed loop over the domains in "
                 "ascending order: with Adam restarted at every local step the first domain of a fixed order gets "
                 "the largest step, and Bai et al.'s Fish cells carry that order")
  for m, over in sorted(sweep.get("method_overrides", {}).items()):
    flat = sweep_lib.flatten(over) if hasattr(over, "items") else {}
    out.append(f"`{m}` runs with " + ", ".join(f"`{k}={v}`" for k, v in sorted(flat.items()))
               + " (the sweep's docstring gives why)")
  out += [str(x) for x in sweep.get("report", {}).get("deviations", ())]
  return out


def seeds_for_target(sd: float, m: int, most: int = 1000) -> str:
  """The seeds a column's comparisons would need for a detectable difference of
  `stats.TARGET_MDD` at Holm's first level 0.05 / m and paired spread `sd`, in words."""
  try:
    return str(stats.seeds_needed(sd, stats.TARGET_MDD, stats.ALPHA / m, most=most))
  except ValueError:
    return f"over {most}"


def target_line(table: collect.Table, baseline: str, det: dict) -> str:
  """The Deviations line on the seeds: the benchmark's target (a detectable difference of
  `stats.TARGET_MDD` against the baseline, 80% power at Holm's first level), the columns
  whose comparisons miss it, and per column the seeds that would reach it at the column's
  measured paired spread (`noise_scale`'s sigma_d) for its number of comparisons.

  Args:
    table: the held-out-domain table.
    baseline: the baseline method.
    det: `detectable_by_column`.

  Returns:
    The line.
  """
  short = [(c, d) for c, d in det.items() if d[-1] > stats.TARGET_MDD]
  text = (f"the benchmark's target for the tests against the baseline is a detectable difference of "
          f"{stats.TARGET_MDD:g} (80% power at Holm's first level); "
          + (f"not met at these seeds: comparisons whose detectable difference is above it in {len(short)} of "
             f"{len(det)} columns: "
             + ", ".join(f"{collect.column_label(c)} {sum(x > stats.TARGET_MDD for x in d)} of {len(d)} "
                         f"(median {float(np.median(d)):.3f}, largest {d[-1]:.3f})" for c, d in short)
             if short else f"every comparison reaches it in all {len(det)} columns"))
  need = []
  for c, d in det.items():
    ns = noise_scale(table, c, 2, baseline)
    if ns is not None:
      need.append(f"{collect.column_label(c)} {seeds_for_target(ns[0], len(d))} (sd {ns[0]:.3f}, {len(d)} comparison{'s' * (len(d) != 1)})")
  return text + ("; seeds a typical comparison would need for it at this report's measured paired spread (the root "
                 "mean square over the column's methods of the standard deviation of their per-seed differences "
                 "from the baseline; a comparison with a larger spread needs more): " + ", ".join(need) if need else "")


def _seed_range(seeds) -> str:
  """"1-10" for consecutive seeds, else "1, 3, 7"."""
  seeds = sorted(int(x) for x in seeds)
  if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
    return f"{seeds[0]}-{seeds[-1]}"
  return ", ".join(map(str, seeds))


def _job_counts(data, grid: str) -> str:
  """"N `<grid>` jobs, M `<search>` jobs": the distinct finished jobs of a table grid and of the
  search it selects from (a job both name counted once, with the table): the jobs
  `round_times` can average (a pending, running or failed job has no result)."""
  src = data.sweep.grids.get(grid, {}).get("select_from", "")
  seen, parts = set(), []
  for name in (grid, src):
    if name in data.sweep.grids:
      keys = {e.key for e in sweep_lib.grid_entries(data.exp, name) if e.key in data.results} - seen
      seen |= keys
      parts.append(f"{len(keys)} `{name}` jobs")
  return ", ".join(parts)


def _columns_text(g) -> str:
  """A grid's (C, lambda) columns as text: "C=20, λ=1" or "C=20, λ=1 and C=100, λ=0"."""
  cols = [collect.column_label(c) for c in collect.table_columns(g)]
  return (", ".join(cols[:-1]) + " and " + cols[-1]) if len(cols) > 1 else "".join(cols) or "no column"


def staged_methods(data, grid: str, num_clients: int | None = None) -> list[str]:
  """The methods of `grid` (at `num_clients`, None: any) that Fig. 4 draws at their final
  stage's evaluations: runs in two stages selected within the second
  (`figures.final_stage_positions`; FedLOE)."""
  out = []
  for e in sweep_lib.grid_entries(data.exp, grid) if grid in data.sweep.grids else ():
    if num_clients is not None and int(e.axes["num_clients"]) != num_clients:
      continue
    run = data.results.get(e.key)
    if (run and e.axes["method"] not in out
        and figures.final_stage_positions(run, data.exp.jobs[e.key].config) is not None):
      out.append(e.axes["method"])
  return out


def staged_lines(data, grid: str) -> list[str]:
  """One line per method whose runs in `grid` train in stages and select within the last one
  (`summary.stages`, `summary.selection_scope`; FedLOE): its stages' rounds (the range over
  its runs) and that its model is chosen among the final stage's evaluations only."""
  per = collections.defaultdict(lambda: collections.defaultdict(list))  # method -> stage -> [rounds]
  names = collect.display_names(data.sweep)
  for e in sweep_lib.grid_entries(data.exp, grid) if grid in data.sweep.grids else ():
    run = data.results.get(e.key)
    sm = run["summary"] if run else {}
    if not run or sm.get("selection_scope", "all rounds") == "all rounds" or not sm.get("stages"):
      continue
    for st in sm["stages"]:
      lo, hi = st["rounds"]
      per[e.axes["method"]][st["name"]].append(int(hi) - int(lo) + 1)
  out = []
  for m, stages in sorted(per.items()):
    span = lambda v: f"{min(v)}" if min(v) == max(v) else f"{min(v)}-{max(v)}"  # noqa: E731
    parts = ", ".join(f"{name}: {span(v)} rounds" for name, v in stages.items())
    out.append(f"{names.get(m, m)} trains in stages ({parts}) and is selected among its final stage's evaluations "
               "only, the other methods among all of theirs; its rounds are not the other methods' rounds (Table "
               "13 gives its training time over the other methods' rounds)")
  return out


def _domain_orders(data, grid: str) -> dict:
  """{method: its order} for the grid's methods whose hyperparameters hold a `domain_order`
  (Fish): the order of its runs, "mixed" when they differ; a run whose config predates the
  field leaves its method out."""
  orders = {}
  for e in sweep_lib.grid_entries(data.exp, grid) if grid in data.sweep.grids else ():
    hp = data.exp.jobs[e.key].config.algorithm.get(e.axes["algorithm"])
    if hp is not None and hasattr(hp, "get"):
      orders.setdefault(e.axes["method"], set()).add(str(hp.get("domain_order", "")))
  return {m: (o.pop() if len(o) == 1 else "mixed") for m, o in orders.items() if "" not in o}


OWN_WORDS = {"better": "above", "worse": "below", "inconclusive": "inconclusive", "cannot tell": "untestable"}


def ordered_methods_line(table: collect.Table, baseline: str, names: dict, orders: dict,
                         margin: float = stats.MARGIN) -> str:
  """Our runs of the methods that take inner domain steps in an order (`_domain_orders`: Fish),
  beside Bai et al.'s Fish: per federated column, the paired difference from the baseline and
  its outcome in the column's family (remark 4.1's, Holm within the column), and the method's
  centralised cell.

  Args:
    table: the held-out-domain table.
    baseline: the baseline method.
    names: display names.
    orders: {method: its domain order}.
    margin: the equivalence margin.

  Returns:
    The sentence, "" where no such method has a cell.
  """
  fams = {col: _column_family(table, baseline, col, margin) for col in table.columns if col[0] != 1}
  parts = []
  for m, order in sorted(orders.items()):
    cells = []
    for col, fam in fams.items():
      c = table.cells.get((m, col))
      if c is not None and c.mark:
        cells.append(f"{collect.column_label(col)} -{collect.MARKS.get(c.mark, '')}")
        continue
      r = next((r for (mm, _), r in zip(fam[1], fam[2]) if mm == m), None) if fam else None
      if r is not None:
        word = OWN_WORDS.get(r["outcome"], f"equivalent within ±{margin:g}")
        cells.append(f"{collect.column_label(col)} " + (f"{r['test']['diff']:+.3f} ({word})" if r["test"] else word))
    if cells:
      cen = next((c for (mm, col), c in table.cells.items() if mm == m and col[0] == 1 and _usable(c)), None)
      parts.append(f"{names.get(m, m)} ({order} domain order)" + (f", C=1 {collect.format_cell(cen, 3)}" if cen else "")
                   + "; against " + names.get(baseline, baseline) + " (paired, Holm within each column): "
                   + ", ".join(cells))
  return ("Ours: " + "; ".join(parts) + ".") if parts else ""


def local_steps_per_round(data, grid: str) -> dict:
  """{C: (mean training rows a client, local steps a round, rounds)} from the grid's finished
  runs (their recorded client sizes), for runs at one local epoch a round and no fixed
  step count; {} when none recorded its sizes."""
  out = {}
  for e in sweep_lib.grid_entries(data.exp, grid) if grid in data.sweep.grids else ():
    C = int(e.axes["num_clients"])
    run = data.results.get(e.key)
    config = data.exp.jobs[e.key].config
    if C in out or run is None or not run["summary"].get("client_sizes") or int(config.client.local_steps):
      continue
    rows = float(np.mean(run["summary"]["client_sizes"]))
    per_epoch = math.ceil(rows / int(config.client.batch_size))
    out[C] = (rows, per_epoch * int(config.client.local_epochs), int(config.num_rounds))
  return out


def noise_scale(table, col, runs: int, baseline: str | None = None) -> tuple[float, float] | None:
  """`(sigma_d, d)`: the paired spread of the column, the root mean square over its usable
  cells of the standard deviation of their per-seed differences from the baseline's cell
  (the spread of a difference of two configurations run on the same seeds), and `d =
  sigma_d / sqrt(runs) * sqrt(2 / pi)`, the expected absolute difference of two trials'
  means over the same `runs` search seeds when the trials do not differ (the two winners'
  means come from the same seeds, so their difference is a paired one). An estimate: the
  table's methods stand in for the search's trials. None without a usable baseline cell
  and another usable cell sharing two or more of its seeds."""
  baseline = baseline or _baseline()
  base = table.cells.get((baseline, col))
  if base is None or not base.usable:
    return None
  sds = []
  for (m, c_col), c in table.cells.items():
    if c_col != col or m == baseline or c is None or not c.usable:
      continue
    common = sorted(set(c.by_seed) & set(base.by_seed))
    if len(common) >= 2:
      sds.append(float(np.std([c.by_seed[k] - base.by_seed[k] for k in common], ddof=1)))
  if not sds:
    return None
  sigma = math.sqrt(float(np.mean(np.square(sds))))
  return sigma, sigma / math.sqrt(runs) * math.sqrt(2.0 / math.pi)


def _search_winners(data, src: str, rule: str, metric: str) -> list[tuple]:
  """Per cell of the search grid `src` with two or more search seeds: `(cell, seeds,
  winners, test, runs)`, where `cell` is (method, C, lambda), `winners` maps each seed to the
  trial it alone selects (the best `rule` validation score among the trials that seed
  finished: a trial whose run did not finish at a seed, e.g. diverged, cannot win there, as in
  `sweep.select_winners`), and `test` and `runs` map each winning trial to the search runs'
  mean test score over the seeds that finished it and their number."""
  cells = collections.defaultdict(lambda: collections.defaultdict(dict))  # cell -> trial -> seed -> (val, test)
  for e in sweep_lib.grid_entries(data.exp, src):
    run = data.results.get(e.key)
    sc = collect.rule_scores(run, rule, metric) if run else None
    if sc is None or sc["val"] is None or sc["test"] is None:
      continue
    a = e.axes
    cells[(a["method"], a["num_clients"], None if a["lam"] is None else float(a["lam"]))][a["trial"]][a["seed"]] = (
        sc["val"], sc["test"])
  out = []
  for cell, trials in sorted(cells.items(), key=lambda kv: str(kv[0])):
    seeds = sorted({s for t in trials.values() for s in t})
    if len(seeds) < 2:
      continue
    winners = {s: max(sorted(t for t in trials if s in trials[t]), key=lambda t: trials[t][s][0]) for s in seeds}
    test = {w: float(np.mean([v[1] for v in trials[w].values()])) for w in set(winners.values())}
    out.append((cell, seeds, winners, test, {w: len(trials[w]) for w in test}))
  return out


def _has_two_seeds(data, src: str) -> bool:
  return src in data.sweep.grids and len(tuple(data.sweep.grids[src].get("seeds", ()))) >= 2


def selection_variance(data, src: str, rule: str, metric: str, names: dict | None = None, table=None,
                       baseline: str | None = None) -> list[str]:
  """Where the search grid `src` ran two or more seeds per trial, one line per column: how
  often the winner a search seed alone selects (`_search_winners`) differs between seeds,
  and by how much the search runs' own test score differs between the winners (each winner's
  mean over the seeds that finished it); the cells themselves are in `winner_changes_table`.
  With `table` (the held-out table), each column also gives the difference run noise alone
  would make (`noise_scale`, paired, from `baseline`'s differences): the winners' test means
  are over a few search runs, so part of their difference is those runs' own spread; how many
  of the differences exceed 1.96 times the standard deviation run noise gives a difference of
  two means over the fewer of the two winners' runs (5% would under noise); and whether the
  baseline's own winner changed (every comparison with it in that column then rests on the
  search seed's choice).

  Args:
    data: the results bundle.
    src: the search grid.
    rule: the selection rule (validation score) the winners are chosen by.
    metric: the metric.
    names: display names.
    table: the held-out-domain table, for the noise yardstick.
    baseline: the baseline method.

  Returns:
    One line per column; [] when `src` ran one seed (or is not a grid).
  """
  names = names or {}
  baseline = baseline or _baseline()
  if not _has_two_seeds(data, src):
    return []
  per_col = collections.defaultdict(lambda: [0, 0, [], False])
  for (m, C, lam), _, winners, test, runs in _search_winners(data, src, rule, metric):
    col = per_col[(C, lam)]
    col[1] += 1
    if len(set(winners.values())) > 1:
      col[0] += 1
      col[3] = col[3] or m == baseline
      col[2].append((max(test.values()) - min(test.values()), min(runs.values())))
  runs = len(tuple(data.sweep.grids[src].seeds))
  lines = []
  for col in sorted(per_col, key=_column_key):
    k, n, pairs, base_changed = per_col[col]
    gaps = [g for g, _ in pairs]
    noise = (noise_scale(table, col, runs, baseline) if table is not None and col in table.columns and gaps
             else None)
    lines.append(f"{collect.column_label(col)}: the winner changes between search seeds in {k} of {n} cells"
                 + (f"; the search runs' test {metric} at the two winners differs by {float(np.median(gaps)):.3f} "
                    f"(median; largest {max(gaps):.3f})" if gaps else "")
                 + (f"; by run noise alone, two trials' means over the same {runs} seeds would differ by about "
                    f"{noise[1]:.3f} (an estimate: the column's paired spread in the held-out table, {noise[0]:.3f}, "
                    "the root mean square of the standard deviations of its methods' per-seed differences from the "
                    f"baseline); {sum(g > 1.96 * noise[0] / math.sqrt(r) for g, r in pairs)} of {len(pairs)} "
                    "differences exceed 1.96 times the standard deviation run noise gives a difference of means "
                    "over their runs (sd / sqrt(runs); about 5% would by noise alone)" if noise else "")
                 + (f"; {names.get(baseline, baseline)}'s own winner changes, so every comparison with it in this "
                    "column rests on which search seed chose" if base_changed else ""))
  return lines


def winner_changes_table(data, src: str, rule: str, metric: str, names: dict | None = None) -> str:
  """The cells whose winner differs between the search seeds of grid `src`
  (`_search_winners`), one row each: per search seed, the trial it alone selects and the
  search runs' mean test score at that trial over the seeds that finished it.

  Args:
    data: the results bundle.
    src: the search grid.
    rule: the selection rule (validation score) the winners are chosen by.
    metric: the metric.
    names: display names.

  Returns:
    A markdown table with its legend; "" when `src` ran one seed or no winner changed.
  """
  names = names or {}
  if not _has_two_seeds(data, src):
    return ""
  grid_seeds = sorted(int(s) for s in data.sweep.grids[src].seeds)
  order = {m: i for i, (_, m, _) in enumerate(collect.table_rows(data.sweep, data.sweep.grids[src]))}
  rows = []
  for (m, C, lam), _, winners, test, runs in sorted(_search_winners(data, src, rule, metric),
                                                     key=lambda w: (_column_key((w[0][1], w[0][2])), order[w[0][0]])):
    if len(set(winners.values())) < 2:
      continue
    picks = [f"trial {winners[s]}: {test[winners[s]]:.3f} ({runs[winners[s]]})" if s in winners else "-"
             for s in grid_seeds]
    rows.append(f"| {collect.column_label((C, lam))} | {names.get(m, m)} | " + " | ".join(picks) + " |")
  if not rows:
    return ""
  head = ["| column | method | " + " | ".join(f"search seed {s} picks" for s in grid_seeds) + " |",
          "|---|---|" + "---|" * len(grid_seeds)]
  return "\n".join(head + rows) + (
      f"\n\nThe cells whose winner changes: per search seed, the trial it alone selects, the search runs' mean "
      f"test {metric} at that trial over the search seeds that finished it, and their number in brackets; '-' "
      "where that seed finished none of the cell's trials.")


def _trials(exp, grid: str) -> dict:
  """{(method, (C, lam)): the trial a seeds grid ran its cell at}."""
  out = {}
  for e in sweep_lib.grid_entries(exp, grid):
    lam = None if e.axes["lam"] is None else float(e.axes["lam"])
    out[(e.axes["method"], (int(e.axes["num_clients"]), lam))] = e.axes["trial"]
  return out


def _other_winners(data, table: collect.Table, alt: str, st: dict) -> list[tuple]:
  """Per column of grid `alt` (seeds at the trials one search seed alone chose, where the table
  runs them at the trials its search chose): `(col, methods, changed, other, t_main, t_alt)`
  where `changed` lists `(method, alt_cell, table_cell, result)` for the cells that ran at
  another trial, each pair compared on the seeds both hold (`stats.against_baseline`: paired,
  Holm over the column's changed cells; "cannot tell" where either has fewer than two usable
  seeds), and `other` is the table `alt` makes."""
  sweep, exp = data.sweep, data.exp
  if alt not in sweep.grids or not sweep_lib.grid_entries(exp, alt):
    return []
  other = collect.build_table(sweep, exp, data.results, alt, "heldout_domain", st["metric"], st["ddof"], data.stale)
  t_main, t_alt = _trials(exp, st["table_grid"]), _trials(exp, alt)
  out = []
  for col in other.columns:
    methods = [m for _, m, _ in other.rows if (m, col) in t_alt]
    if not methods:
      continue
    ms = [m for m in methods if t_alt.get((m, col)) != t_main.get((m, col))]
    pairs = [(other.cells.get((m, col)), table.cells.get((m, col))) for m in ms]
    res = stats.against_baseline([(a.by_seed if _usable(a) else {}, b.by_seed if _usable(b) else {})
                                  for a, b in pairs], margin=st["margin"])
    out.append((col, methods, [(m, a, b, r) for m, (a, b), r in zip(ms, pairs, res)], other, t_main, t_alt))
  return out


def _winner_source(sweep, grid: str) -> str:
  """Whose winners a seeds grid runs at, in words: "search seed 100's winners" where one
  search seed chose them (the grid's `select_seeds`, or a search grid of one seed), else
  "the winners by the mean over search seeds 0, 100"."""
  g = sweep.grids[grid]
  src = g.get("select_from", "")
  seeds = tuple(g.get("select_seeds", ()) or (sweep.grids[src].get("seeds", ()) if src in sweep.grids else ()))
  seeds = sorted(int(s) for s in seeds)
  if len(seeds) == 1:
    return f"search seed {seeds[0]}'s winners"
  return f"the winners by the mean over search seeds {', '.join(map(str, seeds))}"


def _on_seeds(c, seeds) -> dict:
  """A cell's {seed: score} on `seeds` only."""
  return {k: v for k, v in c.by_seed.items() if k in seeds}


def _other_winner_families(data, table: collect.Table, alt: str, st: dict, baseline: str,
                           winners: list | None = None) -> list[dict]:
  """Remark 4.1's comparisons in each column of grid `alt` under both sets of winners, on the
  same runs' seeds: per column whose baseline cell is usable under both, a dict with `col`,
  `other` (the table `alt` makes), `rest` (the column's other methods `alt` ran, in the
  table's order), `ok` (those usable under both), `pairs` and `res` ({"table", "other"}: per
  method of `ok`, its ({seed: score}, baseline's {seed: score}) on the seeds of `alt` where
  all four runs finished, the method's and the baseline's under both sets of winners, so a
  change is the search seed's choice and not fewer seeds; and `stats.against_baseline` over
  them, Holm over the column), `flips` ((method, table outcome, other outcome) where both are
  testable and differ), `tested` (their number) and `short` (the methods of `rest` left out:
  untestable under at least one set of winners). `winners`: `_other_winners`' result, where
  the caller has it already."""
  out = []
  seeds = {int(x) for x in data.sweep.grids[alt].seeds} if alt in data.sweep.grids else set()
  for col, methods, _, other, _, _ in (_other_winners(data, table, alt, st) if winners is None else winners):
    if not (_usable(table.cells.get((baseline, col))) and _usable(other.cells.get((baseline, col)))):
      continue
    rest = [m for _, m, _ in table.rows if m != baseline and m in methods]
    ok = [m for m in rest if _usable(table.cells.get((m, col))) and _usable(other.cells.get((m, col)))]
    pairs = {"table": [], "other": []}
    for m in ok:
      common = set(seeds)
      for tab in (table, other):
        common &= set(tab.cells[(m, col)].by_seed) & set(tab.cells[(baseline, col)].by_seed)
      for key, tab in (("table", table), ("other", other)):
        pairs[key].append((_on_seeds(tab.cells[(m, col)], common), _on_seeds(tab.cells[(baseline, col)], common)))
    res = {key: stats.against_baseline(pairs[key], margin=st["margin"]) for key in pairs}
    both = [(m, a["outcome"], b["outcome"]) for m, a, b in zip(ok, res["table"], res["other"])
            if "cannot tell" not in (a["outcome"], b["outcome"])]
    out.append({"col": col, "other": other, "rest": rest, "ok": ok, "pairs": pairs, "res": res,
                "flips": [x for x in both if x[1] != x[2]], "tested": len(both),
                "short": [m for m in rest if m not in {x[0] for x in both}]})
  return out


def _flips_text(f: dict, names: dict, baseline: str) -> str:
  """"k of n outcomes against FedAvg-ERM change: IRM better → worse (Fish left out: ...)"."""
  return (f"{len(f['flips'])} of {f['tested']} outcomes against {names.get(baseline, baseline)} change"
          + (": " + ", ".join(f"{names.get(m, m)} {a} → {b}" for m, a, b in f["flips"]) if f["flips"] else "")
          + (f" ({', '.join(names.get(m, m) for m in f['short'])} left out: untestable under at least one set of "
             "winners)" if f["short"] else ""))


def other_winner_lines(data, table: collect.Table, alt: str, st: dict, names: dict, baseline: str) -> list[str]:
  """What the cells read under another search seed's winners, one line per column of grid
  `alt`, which runs seeds at the trials one search seed alone chose (`select_seeds`) where the
  table runs them at the trials its search chose: how many cells ran at another trial (each
  against the table's cell in `other_winner_table`), and each method against the baseline
  under either set of winners on the same seeds (`_other_winner_families`: the seeds of `alt`
  where the method's and the baseline's runs finished under both; paired, Holm over the
  column, as remark 4.1), naming the outcomes that change and the methods left out.

  Args:
    data: the results bundle.
    table: the held-out-domain table.
    alt: the grid of seeds at the other winners.
    st: `collect.report_settings`.
    names: display names.
    baseline: the baseline method.

  Returns:
    One line per column of `alt`; [] where it has no finished run.
  """
  winners = _other_winners(data, table, alt, st)
  fams = {f["col"]: f for f in _other_winner_families(data, table, alt, st, baseline, winners)}
  lines = []
  for col, methods, changed, _, _, _ in winners:
    seeds = sorted(int(x) for x in data.sweep.grids[alt].seeds)
    text = (f"{collect.column_label(col)}: grid `{alt}` runs seeds {_seed_range(seeds)} at "
            f"{_winner_source(data.sweep, alt)}; {len(changed)} of {len(methods)} cells ran at another trial than "
            "the table's")
    if col in fams:
      text += (f"; on the seeds both sets of winners ran (paired, Holm over the column, as remark 4.1), "
               + _flips_text(fams[col], names, baseline))
    lines.append(text)
  return lines


COLUMN_VERDICT_WORDS = {"supports": "supports the remark", "against": "against the remark",
                        "inconclusive": "inconclusive", "cannot tell": "cannot tell"}


def _other_winner_head(data, col, alt: str, st: dict) -> str:
  """"C=20, λ=1: search seed 0's winners against search seed 100's winners (grid `table_alt`,
  'Selection variance'), both on seeds 1-10 (each comparison on the seeds where its runs
  finished under both)"."""
  seeds = sorted(int(x) for x in data.sweep.grids[alt].seeds)
  return (f"{collect.column_label(col)}: {_winner_source(data.sweep, st['table_grid'])} against "
          f"{_winner_source(data.sweep, alt)} (grid `{alt}`, 'Selection variance'), both on seeds "
          f"{_seed_range(seeds)} (each comparison on the seeds where its runs finished under both)")


def remark_4_1_other_winners(data, table: collect.Table, alt: str, st: dict, names: dict, baseline: str,
                             families: list | None = None) -> list[str]:
  """Remark 4.1 in each column of grid `alt` under both sets of winners, on the same seeds
  (`_other_winner_families`, so a change is the search seed's choice and not fewer seeds): the
  column's verdict under each, by `remark_4_1`'s rule (`_column_verdict`; the beyond-margin
  tests one Holm family over the remark's columns, as there, with this column's comparisons
  in place of the table's), and the methods whose outcome against the baseline changes.

  Args:
    data: the results bundle.
    table: the held-out-domain table.
    alt: the grid of seeds at the other search seed's winners.
    st: `collect.report_settings`.
    names: display names.
    baseline: the baseline method.
    families: `_other_winner_families`' result, where the caller has it already.

  Returns:
    One line per column of `alt` with a usable baseline cell under both sets of winners.
  """
  margin, lines = st["margin"], []
  fams = {col: fam for col in table.columns for fam in [_column_family(table, baseline, col, margin)] if fam}
  for f in (_other_winner_families(data, table, alt, st, baseline) if families is None else families):
    verdict = {}
    for key in ("table", "other"):
      swapped = {**fams, f["col"]: (None, None, f["res"][key])}
      verdict[key] = _column_verdict(f["res"][key], _beyond_margin(swapped, margin)[f["col"]], margin)
    lines.append(_other_winner_head(data, f["col"], alt, st)
                 + f": the column's verdict {COLUMN_VERDICT_WORDS[verdict['table']]} → "
                 f"{COLUMN_VERDICT_WORDS[verdict['other']]} (the beyond-margin tests Holm over the remark's "
                 "columns, this one's on those seeds); " + _flips_text(f, names, baseline))
  return lines


def claim_other_winners(data, table: collect.Table, alt: str, st: dict, names: dict, baseline: str, m: str,
                        families: list | None = None) -> list[str]:
  """A method paper's claim (`seed_paper_claims`) with one column of grid `alt` taken under
  both sets of winners, on the same seeds (`_other_winner_families`): the method against the
  baseline there under each, inside the claim's family (its other columns as in the table,
  Holm over them all), and the claim's verdict either way.

  Args:
    data: the results bundle.
    table: the held-out-domain table.
    alt: the grid of seeds at the other search seed's winners.
    st: `collect.report_settings`.
    names: display names.
    baseline: the baseline method.
    m: the claim's method.
    families: `_other_winner_families`' result, where the caller has it already.

  Returns:
    One line per column of `alt` where the method and the baseline are usable under both sets
    of winners.
  """
  margin, lines = st["margin"], []
  cols = [c for c in table.columns if c[1] is not None
          and _usable(table.cells.get((m, c))) and _usable(table.cells.get((baseline, c)))]
  src_t, src_o = _winner_source(data.sweep, st["table_grid"]), _winner_source(data.sweep, alt)
  for f in (_other_winner_families(data, table, alt, st, baseline) if families is None else families):
    col = f["col"]
    if col not in cols or m not in f["ok"]:
      continue
    out = {}
    for key in ("table", "other"):
      pairs = [f["pairs"][key][f["ok"].index(m)] if c == col
               else (table.cells[(m, c)].by_seed, table.cells[(baseline, c)].by_seed) for c in cols]
      res = stats.against_baseline(pairs, margin=margin)
      out[key] = (res[cols.index(col)], stats.verdict_powered([r["outcome"] for r in res], "better", margin))
    word = lambda r: CLAIM_WORDS.get(r["outcome"], f"equivalent within ±{margin:g}")  # noqa: E731
    lines.append(_other_winner_head(data, col, alt, st) + ", this column on those seeds only (its line above: every seed "
                 "the table ran), the claim's other columns as above: "
                 f"{word(out['table'][0])} at {src_t} ({stats.fmt_powered(out['table'][0])}), "
                 f"{word(out['other'][0])} at {src_o} ({stats.fmt_powered(out['other'][0])}); the claim with this "
                 f"column on those seeds: {out['table'][1]} at {src_t}, {out['other'][1]} at {src_o}")
  return lines


OTHER_WINNER_WORDS = {"better": "above", "worse": "below", "inconclusive": "inconclusive",
                      "cannot tell": "untestable"}


def other_winner_table(data, table: collect.Table, alt: str, st: dict, names: dict) -> str:
  """Each cell grid `alt` ran at another trial than the table's, against the table's cell on
  the seeds both hold (`_other_winners`): the trials, both means over those seeds and their
  number, the paired difference (other winner minus table), its p and Holm p over the
  column's changed cells, Wilcoxon's Holm p as a check, the outcome in the four words of the
  reading, and the detectable difference. Where the two cells share fewer than two seeds
  (the table's runs failed there) the test is Welch's over all their seeds, and the row says
  so and gives the cells' own means.

  Args:
    data: the results bundle.
    table: the held-out-domain table.
    alt: the grid of seeds at the other winners.
    st: `collect.report_settings`.
    names: display names.

  Returns:
    A markdown table with its legend; "" where no cell ran at another trial.
  """
  words = dict(OTHER_WINNER_WORDS, equivalent=f"equivalent within ±{st['margin']:g}")
  rows = []
  for col, _, changed, _, t_main, t_alt in _other_winners(data, table, alt, st):
    for m, a, b, r in changed:
      head = f"| {collect.column_label(col)} | {names.get(m, m)} | {t_main.get((m, col))} → {t_alt.get((m, col))} | "
      t = r["test"]
      if t is None:
        rows.append(head + f"{collect.format_cell(b, 3)} | {collect.format_cell(a, 3)} | - | - | - | - | - | "
                    f"{words['cannot tell']} | - |")
        continue
      if t["kind"] == "paired":
        common = sorted(set(a.by_seed) & set(b.by_seed))
        means = (f"{float(np.mean([b.by_seed[k] for k in common])):.3f} | "
                 f"{float(np.mean([a.by_seed[k] for k in common])):.3f} | {len(common)}")
      else:  # fewer than two seeds in common: Welch's test over each cell's own seeds
        means = f"{b.mean:.3f} | {a.mean:.3f} | Welch, {len(b.values)} and {len(a.values)}"
      check = "-" if r.get("wilcoxon_holm_p") is None else (
          stats.p_text(r["wilcoxon_holm_p"])
          + (" (cannot reach the level)" if r.get("check_unreachable") else " (disagrees)" if r.get("check_disagrees")
             else ""))
      rows.append(head + f"{means} | {t['diff']:+.3f} ({t['se']:.3f}) | {stats.p_text(t['p'])} | "
                  f"{stats.p_text(r['holm_p'])} | {check} | {words[r['outcome']]} | "
                  + (f"{r['mdd']:.3f}" if r["mdd"] is not None else "-") + " |")
  if not rows:
    return ""
  head = ["| column | method | trial: table → other | table | other winner | seeds | diff (SE) | p | Holm p | "
          "Wilcoxon Holm p | outcome | detectable |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
  return "\n".join(head + rows) + (
      "\n\nEach cell that ran at another trial: the table's cell and the cell at the other search seed's winner, "
      "their means over the seeds both hold (their number); the difference (other winner minus table) paired by "
      "seed with its standard error; the paired t-test's p and its Holm adjustment over the column's changed "
      "cells, Wilcoxon's signed-rank test as a check; the outcome by the reading's rules ('above': the other "
      "winner's cell is higher); the difference the test finds with 80% power at the family's first Holm level. "
      "'Welch': the cells share fewer than two seeds, so the test is Welch's over each cell's own seeds (their "
      "means and numbers shown). 'untestable': a cell with fewer than two usable seeds (X: no finished run; "
      "marked: its runs equal the baseline or its term did not act), shown as the tables show it.")


# ---------------------------------------------------------------------------- the report

def failed_jobs_section(data) -> list[str]:
  """REPORT.md's "Failed jobs": the search trials that diverged (the runner stopped them at a
  non-finite loss, `sweep.DIVERGED`; such a trial never wins its cell, as
  `sweep.select_winners` has it, so no cell is missing a run), counted per method, then every
  other failed job, whose cell reads X or counts fewer seeds. [] when none failed."""
  exp = data.exp
  failed = [k for k in exp.jobs if data.states.get(k) == "failed"]
  if not failed:
    return []
  searches = {n for n, g in data.sweep.grids.items() if int(g.get("num_trials", 0)) > 1}
  grids = collections.defaultdict(set)
  for e in exp.entries:
    grids[e.key].add(e.grid)
  label = {e.key: sweep_lib.describe(e.axes) for e in reversed(exp.entries)}
  method = {e.key: e.axes["method"] for e in exp.entries}
  diverged = [k for k in failed if grids[k] <= searches and sweep_lib.DIVERGED.match(data.errors.get(k, ""))]
  others = [k for k in failed if k not in diverged]
  md = ["## Failed jobs", ""]
  if diverged:
    per = collections.Counter(method[k] for k in diverged)
    names = collect.display_names(data.sweep)
    md += [f"{len(diverged)} search trial{'s' * (len(diverged) != 1)} diverged (a non-finite training loss: the "
           "runner stopped the run; a diverged trial never wins its cell, so no cell lacks a run): "
           + ", ".join(f"{names.get(m, m)} {n}" for m, n in sorted(per.items(), key=lambda kv: (-kv[1], kv[0])))
           + ".", ""]
    md += [f"- {label[k]}: {data.errors.get(k, '')}" for k in diverged] + [""]
  if others:
    md += ["Their cells read X (or count fewer seeds):" if diverged else "Their cells read X (or count fewer seeds).",
           ""]
    md += [f"- {label[k]}: {data.errors.get(k, '')}" for k in others] + [""]
  return md


def write_report(sweep, out_dir: str, exp=None, data=None, allow_stale: bool = False, sweep_arg: str = "") -> str:
  """Writes REPORT.md (with tables, figures and the generated reading) into `out_dir`; from
  `data` (a results file's bundle) when given, else from the sweep's runs, whose results file
  it writes too."""
  from fedjax_dg.bench import results as results_lib
  if data is None:
    data = results_lib.from_runs(sweep, exp, sweep_arg=sweep_arg)
    from_file = False
  else:
    from_file = True
  texts = collect.collect(data.sweep, out_dir, data=data, allow_stale=allow_stale, results_file=False)
  if not from_file:
    results_lib.write(data, os.path.join(out_dir, collect.RESULTS_FILE))
  sweep, exp, results = data.sweep, data.exp, data.results
  st = collect.report_settings(sweep)
  fig_dir = os.path.join(out_dir, "figures")
  pngs = figures.make_figures(sweep, fig_dir, data=data)
  counts = collections.Counter(data.states.get(k, "pending") for k in exp.jobs)
  tm = timing(exp, results)
  r = sweep.get("report", {})
  names = collect.display_names(sweep)
  baseline = r.get("baseline", "") or _baseline()
  cmd = f"python -m fedjax_dg.bench report --results {collect.RESULTS_FILE}" + (" --allow_stale" if data.stale else "")
  md = [f"# {r.get('title', sweep.get('name', 'sweep'))}", "",
        f"Generated from {collect.RESULTS_FILE} in this folder (every job's metrics at every evaluation round, with "
        f"its config and provenance) by `{cmd}` run here, or from the runs by "
        f"`python -m fedjax_dg.bench report --sweep {data.sweep_arg or r.get('sweep_file', '<sweep config>')}`"
        f" (the `--sweep` argument this report was made with). Nothing below is written by hand"
        + (", but for the sweep config's own notes among the Deviations, quoted from it"
           if r.get("deviations") else "") + "."
        + (f" {len(data.stale)} of the runs are stale (†: run under other code than the code that collected them)."
           if data.stale else ""), "",
        "## Setup", ""]
  md += [f"- {l}" for l in setup_lines(data, st)]
  md += [f"- jobs: {len(exp.jobs)} ({', '.join(f'{counts[s]} {s}' for s in sorted(counts))})",
         f"- run time (sum of the runs' wall times, a batch's shared by its runs): {_duration(tm['total'])} on {', '.join(tm['backends']) or '-'}; "
         "per grid: " + ", ".join(f"{g} {_duration(t)}" for g, t in tm["per_grid"].items())]
  md += [f"- {l}" for l in provenance_lines(data)]
  table = collect.tables(data, "heldout_domain") if st["table_grid"] in sweep.grids else None
  if table is not None:
    md.append("- " + late_selection_line(late_selection(data, st["table_grid"], "heldout_domain", st["metric"])))
  md += ["", "## Deviations from Bai et al. 2024", "",
         "Where this report's protocol departs from Bai, Bagchi and Inouye, \"Benchmarking Algorithms for Federated "
         "Domain Generalization\" (ICLR 2024), read from the sweep config and the runs:", ""]
  md += [f"- {l}" for l in deviations(data, st, table)] + [""]
  for rule in collect.RULES:
    if f"table_{rule}" in texts:
      md += [f"## Test {st['metric']}, selection: {collect.RULE_TITLES[rule]}", "", texts[f"table_{rule}"], ""]
    glance = against_baseline_table(table, baseline, names, st["margin"]) if rule == "heldout_domain" and table is not None else ""
    if glance:
      write_comparisons(os.path.join(out_dir, "comparisons.csv"), comparison_rows(table, baseline, names, st["margin"]))
      md += [f"## Against {names.get(baseline, baseline)}, at a glance (held-out-domain selection, paired by seed)",
             "", glance + " Every comparison's statistics: [comparisons.csv](comparisons.csv).", ""]
  if "difficulty" in texts:
    md += ["## Dataset difficulty (Bai et al. Table 6)", "", texts["difficulty"], ""]
  sel_grid = r.get("selection_grid", "") or sweep.grids.get(st["table_grid"], {}).get("select_from", "")
  sv = (selection_variance(data, sel_grid, "heldout_domain", st["metric"], names, table, baseline)
        if table is not None else [])
  if sv:
    md += ["## Selection variance", "", f"Grid `{sel_grid}` runs the search's trials at "
           f"{len(tuple(sweep.grids[sel_grid].seeds))} seeds in {_columns_text(sweep.grids[sel_grid])} (the other "
           "columns' winners come from one search seed); each seed alone would select the trial with its best "
           "held-out validation score among the trials it finished. Where the winners differ, the cell would read "
           "differently under the other winner by about the difference given (the search runs' own test scores, "
           "each winner's mean over the seeds that finished it, so part of it is those few runs' own spread: the "
           "difference that spread alone makes is given beside it); the table below names the cells.", ""]
    md += [f"- {l}" for l in sv] + [""]
    wt = winner_changes_table(data, sel_grid, "heldout_domain", st["metric"], names)
    md += [wt, ""] if wt else []
    alt = r.get("selection_table_grid", "")
    ow = other_winner_lines(data, table, alt, st, names, baseline) if alt else []
    if ow:
      md += [f"Under the other search seed's winners, run at the table's seeds (grid `{alt}`): what the cells "
             "read there, measured rather than estimated from the search runs above, and which verdicts against "
             f"{names.get(baseline, baseline)} rest on the choice of search seed.", ""]
      md += [f"- {l}" for l in ow] + [""]
      ot = other_winner_table(data, table, alt, st, names)
      md += [ot, ""] if ot else []
  hp = selected_hyperparameters(data, st["table_grid"], names) if st["table_grid"] in sweep.grids else ""
  if hp:
    with open(os.path.join(out_dir, "hyperparameters.md"), "w") as fh:
      fh.write(hp + "\n")
    md += ["## Selected hyperparameters (Bai et al. Table 7)", "",
           f"Each cell's seeds ran at the search trial with the best held-out validation score; its values are in "
           f"[hyperparameters.md](hyperparameters.md) ({hp.count(chr(10)) - 1} cells; trial 0 is the method's "
           "defaults; \"no effect\" marks values whose runs equal the baseline by construction or whose method's "
           "term could not act).", ""]
    ind = st["in_domain_grid"]
    hp_in = selected_hyperparameters(data, ind, names) if ind and ind in sweep.grids else ""
    if hp_in:
      with open(os.path.join(out_dir, "hyperparameters_in_domain.md"), "w") as fh:
        fh.write(hp_in + "\n")
      k, n = other_winners(data, st["table_grid"], ind)
      md[-2] += (f" The in-domain table's cells ran at the trial with the best in-domain validation score: "
                 f"[hyperparameters_in_domain.md](hyperparameters_in_domain.md) ({k} of {n} cells at another trial "
                 "than the held-out-domain table's).")
  rt = round_times(data, st["table_grid"]) if st["table_grid"] in sweep.grids else ""
  if rt:
    backends = ", ".join(tm["backends"]) or "-"
    md += ["## Training time per round (Bai et al. Table 13)", "", rt, "",
           f"Seconds per communication round per run on {backends}: the mean over the jobs of the table grid "
           f"and of the search it selects from ({_job_counts(data, st['table_grid'])}), all lambdas, their number in "
           "brackets; "
           "each job's median round without compilation, evaluation or checkpoints, divided by the runs that "
           "shared its compiled program. The machine's load is not controlled: compare methods within one report, "
           "not across machines.", ""]
  if pngs:
    curves = sweep.get("figures", {}).get("curves_grid", "")
    md += ["## Figures", ""]
    for p in pngs:
      if os.sep + "runs" + os.sep not in p:
        c = re.match(r"fig4_\w+?_C(\d+)\.png$", os.path.basename(p))
        staged = tuple(names.get(m, m) for m in staged_methods(data, curves, int(c.group(1)))) if c and curves else ()
        md += [f"![{os.path.basename(p)}](figures/{os.path.relpath(p, fig_dir)})", "",
               f"*{figure_caption(os.path.basename(p), sweep, st['metric'], staged)}*", ""]
  md += failed_jobs_section(data)
  md += reading(data, table, st, names, baseline, with_figures=bool(pngs))
  md += ["## References", ""] + [f"- {w}" for w in reference.references()] + [""]
  path = os.path.join(out_dir, "REPORT.md")
  with open(path, "w") as fh:
    fh.write("\n".join(md))
  return path


def margin_words(table: collect.Table | None, margin: float, baseline: str) -> str:
  """Why the equivalence margin, from the report's own numbers: the spread of the method means
  in each column (largest minus smallest usable mean) and the columns' median detectable
  differences (`detectable_by_column`), against which the margin is small.

  Args:
    table: the held-out-domain table (None: the words without numbers).
    margin: the margin.
    baseline: the baseline method.

  Returns:
    The clause for the reading's introduction.
  """
  text = (f"the margin is a judgement, not a measurement: a difference of {margin:g} in accuracy is small against "
          "what separates methods in a column")
  if table is None:
    return text
  spreads = []
  for col in table.columns:
    means = [c.mean for (_, c_col), c in table.cells.items() if c_col == col and _usable(c)]
    if len(means) > 1:
      spreads.append(max(means) - min(means))
  det = detectable_by_column(table, baseline, margin)
  if spreads:
    text += (f": the method means of a column here span {min(spreads):.3f} to {max(spreads):.3f} (largest minus "
             "smallest)")
  if det:
    med = [float(np.median(d)) for d in det.values()]
    text += (f"; the columns' median detectable differences are {min(med):.3f} to {max(med):.3f}: where they "
             "exceed the margin, a comparison can rarely be shown equivalent within it and reads 'inconclusive' "
             "instead")
  return text


def reading(data, table, st, names: dict, baseline: str, with_figures: bool = True) -> list[str]:
  """The reading: one generated verdict per remark and per method paper's claim, with the
  comparisons (cells cited, p-values) it rests on; `with_figures`: whether the report drew
  figures its verdicts may cite."""
  sweep, exp, results = data.sweep, data.exp, data.results
  r, f = sweep.get("report", {}), sweep.get("figures", {})
  dg = [m for g, ms in sweep.get("table", {}).get("groups", ()) if g == r.get("dg_group", "DG adapted") for m in ms]
  dg_in = [m for m in dg if table is not None and any(row[1] == m for row in table.rows)]
  margin = st["margin"]
  bai = reference.bai_cells()
  has = lambda key: f.get(key, "") in sweep.grids and bool(sweep_lib.grid_entries(exp, f[key]))  # noqa: E731
  across = ["4.2"] + (["4.7"] if has("clients_grid") or has("clients_steps_grid") else []) + (
      ["4.8"] if has("rounds_grid") else [])
  method = [
      "Cells: mean ± standard deviation over seeds (n).",
      "Pairing. A method against the baseline in one column (remark 4.1, the method papers' claims) is compared "
      "seed by seed: runs with the same seed share the split, the partition over clients and the cohorts, and those "
      "of every method on the plain classifier also the initial model (FedSR and FedADG initialise another "
      "parameter tree from the same key; FedLOE's first stage synchronises on its own schedule), so the paired "
      "t-test on the per-seed differences is used (diff, its standard error SE, p), with Wilcoxon's signed-rank p "
      "as a check, Holm-adjusted in the same family ('disagrees' where it decides otherwise than the t-test; "
      "'cannot reach the level' where its smallest possible p, 2 / 2^n for n seeds, is above the family's first "
      "Holm level); a cell missing seeds (a run that failed) is paired on the seeds it shares, and with fewer than "
      "two in common Welch's test is used.",
      f"Families. The comparisons a claim rests on are one family, Holm-adjusted at {stats.ALPHA:g}: for remark 4.1 "
      "a column's methods, for a method paper's claim that method's columns, so one comparison can be decided in a "
      "claim (few comparisons) and not in its column (many).",
      f"Outcomes. Each comparison is 'better' or 'worse' (Holm p < {stats.ALPHA:g}), 'equivalent' within "
      f"±{margin:g} (two one-sided tests, Holm-adjusted; {margin_words(table, margin, baseline)}), or "
      "'inconclusive' (the data allow a difference larger than the margin); an inconclusive comparison excludes "
      "neither a larger difference nor equivalence. 'cannot tell' (or 'untestable'): a cell has fewer than two "
      "seeds. Cells marked -ᵃ or -ᵇ in the tables are left out of every test.",
      f"Power. 'detectable' is the true difference the test finds with {stats.POWER:.0%} power at the family's "
      "strictest Holm level and the measured variance (a true difference that large is found with that "
      "probability). The 'equivalence bound' is the smallest margin the two one-sided tests accept at that level, "
      "|diff| + t SE (Holm's later steps accept a little more); where t SE alone is above the margin, no "
      "difference the data could show would have made the comparison 'equivalent': more seeds, not the data, "
      "decide it. A comparison decided better or worse prints no TOST p and no equivalence bound.",
      "Verdicts. A claim holds where every testable comparison supports it, holds in part where some do and none "
      "shows the opposite direction, is mixed where some support it and some show the opposite direction, does not "
      "hold where every one decides against it (for remark 4.1, where any column has a method shown more than the "
      "margin above the baseline), is not supported where none supports it, some decide against it and the rest "
      "are inconclusive, and is inconclusive where all are.",
      "Remark 4.1's lines give each method significantly above or below the baseline as its paired difference "
      "and Holm p; every statistic of every comparison is in comparisons.csv beside this report. "
      f"Its column verdict is the intersection-union test of 'no method is {margin:g} or more above the "
      f"baseline': every method's one-sided paired test of that rejected at {stats.ALPHA:g}, which needs no "
      "correction for the column's many methods (Berger 1982); a column is against it where a method is shown "
      f"more than {margin:g} above the baseline (one-sided paired tests, one Holm family over the remark's "
      "columns, since one column refutes it), and a method "
      "significantly above it by less refutes nothing at this margin; a column with a method it cannot test "
      "reads 'cannot tell'. A 'Wilcoxon disagrees' beside a method's Holm p: the signed-rank check decides "
      "otherwise. Negative controls: a column's -ᵃ cells compute the baseline's update by construction, each at "
      "the winner of its own search, so they replicate the baseline's protocol with no method term acting; each is "
      "compared with the baseline's cell as a method is (paired, Holm over the column's controls). A control "
      "significantly away from the baseline measures how far the choice of the baseline's hyperparameters alone "
      "moves its cell, and a method decided in the same direction by no more than that is named as not separated "
      "from it (sizes compared, not a test); a method paper's claim in that column says so too. The pooled "
      "baseline of a column with controls is the per-seed mean of the baseline's cell and its controls, a baseline "
      "less exposed to one search's choice; every method of the column is tested against it as against the "
      "baseline (paired, Holm over the column's methods), which tests what the sizes above only compare; it does "
      "not enter the remark's verdict.",
      "Remark 4.2 compares a method's cells across columns (C = 1 against a federated column, λ = 1 against 0.1): "
      "runs with the same seed share the split and the initial model there, not the partition or the cohorts, and "
      "are paired by seed the same way, the remark's comparisons one Holm family with the same four outcomes "
      "('degrades' where the first cell is higher); it holds where more than half of its testable comparisons "
      "degrade, does not hold where more than half decide against it, and is inconclusive otherwise."]
  alt = r.get("selection_table_grid", "") if table is not None else ""
  alt = alt if alt in sweep.grids else ""
  claims = seed_paper_claims(table, baseline, names, margin) if table is not None else []
  families = _other_winner_families(data, table, alt, st, baseline) if alt else []
  alt_41 = remark_4_1_other_winners(data, table, alt, st, names, baseline, families) if alt else []
  alt_claims = ({m: claim_other_winners(data, table, alt, st, names, baseline, m, families)
                 for m, _, _, _ in claims} if alt else {})
  if alt_41 or any(alt_claims.values()):
    method.append(f"Search seed. Grid `{alt}` ran the table's seeds {_seed_range(sweep.grids[alt].seeds)} at "
                  f"{_winner_source(sweep, alt)} where the table ran them at "
                  f"{_winner_source(sweep, st['table_grid'])} ('Selection variance'): remark 4.1 and each method "
                  "paper's claim are read again in its columns under both, on the same seeds (each comparison on "
                  "the seeds where its runs finished under both sets of winners, the table's other seeds left out, "
                  "so that a change is the search's choice and not fewer seeds); a verdict that changes rests on "
                  "the seed of the search that chose the hyperparameters.")
  if "4.8" in across:
    method.append("Remark 4.8 pairs each series' best interior schedule with both ends by seed, the two "
                  "comparisons one Holm family at 0.05 divided by the interior schedules the best was picked from, "
                  "with the same four outcomes; a series supports it where the interior schedule is above both ends "
                  "and is against it where an end is above it or within the margin.")
  if "4.7" in across:
    method.append("Remark 4.7 compares each series' smallest C with its largest, paired by seed, one Holm family "
                  "over the remark with the same four outcomes and remark 4.2's 'most comparisons' verdict.")
  md = ["## Reading", "",
        f"Each verdict is generated from the held-out-domain table{' and figures' if with_figures else ''} above, "
        "by these rules:", "", _bullets(method), "", reference.intro(bai), ""]

  def section(title, res, theirs: str = ""):
    v, lines = res
    return [_headline(title, v), "", _bullets(lines), ""] + ([theirs, ""] if theirs else [])

  if table is not None:
    v41, lines41 = remark_4_1(table, baseline, names, margin)
    lines41 = lines41 + alt_41
    md += section("Remark 4.1, FedAvg-ERM is a strong baseline (in each column, no method above it by the "
                  "margin or more: one-sided paired tests, the intersection-union test; refuted by a method shown "
                  "more than the margin above it)",
                  (v41, lines41), reference.remark_4_1(bai, COLUMN_LABELS, margin))
    controls = negative_control_lines(table, baseline, names, margin) + pooled_baseline_lines(table, baseline, names,
                                                                                               margin)
    md += sum(([c, ""] for c in controls), [])
    if any(c[0] == 1 for c in table.columns):
      steps = local_steps_per_round(data, st["table_grid"])
      fewer = sorted(C for C in steps if C > 1 and 1 in steps and steps[C][1] < steps[1][1])
      md += section("Remark 4.2, DG methods degrade in FL (C = 1 above C > 1 in most comparisons; paired by seed, Holm over "
                    "the remark" + (f"; a client at C = {', '.join(map(str, fewer))} takes fewer local steps a round "
                                    "than the centralised run (Deviations: local work per round), so a drop is "
                                    "federation and the smaller step budget together" if fewer else "") + ")",
                    remark_4_2_federated(table, dg_in, baseline, names, margin),
                    " ".join(filter(None, (reference.remark_4_2_federated(bai), reference.fish_in_federated_columns(bai),
                                           ordered_methods_line(table, baseline, names,
                                                                _domain_orders(data, st["table_grid"]), margin)))))
    both = sorted({c[0] for c in table.columns if c[1] == 1.0} & {c[0] for c in table.columns if c[1] == 0.1})
    where = f"at C = {', '.join(map(str, both))}, where both columns were run" if both else "no C has both columns"
    md += section(f"Remark 4.2, DG methods degrade from λ = 1 to λ = 0.1 (in most comparisons, paired by seed, Holm "
                  f"over the remark; {where})",
                  remark_4_2_lambda(table, dg_in, names, margin=margin), reference.remark_4_2_lambda(bai))
  rule, metric, ddof = "heldout_domain", st["metric"], st["ddof"]
  for key, what in (("clients_grid", "at a fixed number of local epochs per round"),
                    ("clients_steps_grid", "at a fixed number of local steps per round (steps x rounds equal at "
                                           "every C: the clients' effect alone)")):
    if f.get(key, "") in sweep.grids and sweep_lib.grid_entries(exp, f[key]):
      rows = figures.clients_rows(sweep, exp, results, f[key], rule, metric, ddof, data.stale)
      md += section(f"Remark 4.7, accuracy falls with the number of clients, {what} (Fig. 2; smallest vs largest C, "
                    "paired by seed, Holm over the remark)",
                    remark_4_7(rows, names, margin), reference.figure_only("Fig. 2"))
  if f.get("rounds_grid", "") in sweep.grids and sweep_lib.grid_entries(exp, f.rounds_grid):
    rows = figures.rounds_rows(exp, results, f.rounds_grid, rule, metric, ddof, data.stale)
    md += section("Remark 4.8, accuracy is not monotone in rounds at fixed computation (Fig. 3; the best interior "
                  "schedule significantly above both ends, paired by seed: its two tests one Holm family at 0.05 "
                  "divided by the interior schedules it was picked from)",
                  remark_4_8(rows, names, margin), reference.figure_only("Fig. 3"))
  if table is not None:
    for m, claim, v, lines in claims:
      lines = lines + alt_claims.get(m, [])
      note = claim_control_note(table, baseline, names, m, margin)
      md += [_headline(claim, v), "", _bullets(lines), ""] + ([note, ""] if note else []) + [
          reference.claim(bai, names.get(m, m)), ""]
  return md
