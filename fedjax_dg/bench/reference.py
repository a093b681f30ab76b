"""Bai et al.'s own cells, and what the report's remarks say on them.

Bai, Bagchi and Inouye, "Benchmarking Algorithms for Federated Domain Generalization"
(ICLR 2024) print, in their Tables 8-11, the held-out-domain-selected test accuracy of their
14 methods on seven datasets (PACS, IWildCam, CelebA, Camelyon17, CivilComments, Py150,
FEMNIST) at C = 1 and at lambda = 1, 0.1, 0 in the federated columns: the mean and the
standard deviation among 3 runs, rounded to three decimals. `bai_2024_cells.json` holds
them as printed ("-" where a method does not apply is null).

The report reads each of its remarks on these cells with the rule it applies to its own
(`fedjax_dg.bench.report`: the same families, Holm adjustments, one-sided tests against the
margin, four outcomes and verdicts), so a reader sees where the two agree. Bai et al. give only
summary statistics and no tests, so each comparison here is Welch's t-test from the printed
mean and standard deviation with n = 3 per cell (`scipy.stats.ttest_ind_from_stats`);
whether their standard deviation divides by n or n - 1 is not said, and the rounding to three
decimals prints a spread below 0.0005 as 0.000, which is taken as 0.0005 (`PRINTED_SD_FLOOR`)
rather than as an exact value. These are therefore
a reading of their tables, not a re-analysis of their runs.
"""
from __future__ import annotations

import json
import math
import os

from scipy import stats as sps

from fedjax_dg import bounded
from fedjax_dg.bench import stats

CELLS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bai_2024_cells.json")
RUNS = 3  # Bai et al.: "the standard deviation among 3 runs"
PRINTED_SD_FLOOR = 0.0005  # a standard deviation printed as 0.000 is below half its last digit, not 0
DG_METHODS = ("IRM", "Fish", "Mixup", "MMD", "DeepCoral", "GroupDRO")
BASELINE = "FedAvg-ERM"
FEDERATED = ("lam=1", "lam=0.1", "lam=0")

# The papers whose claim the report reads ("<method> beats FedAvg-ERM"), as docs/references.md
# cites them (authors, title, venue), keyed by the short form the method specs' `claim` holds.
CLAIM_PAPERS = {
    "Guo et al. 2023": 'Guo, Guo, Cao, Wu and Chang, "Out-of-Distribution Generalization of Federated Learning via '
                       'Implicit Invariant Relationships", ICML 2023',
    "Nguyen et al. 2025": 'Nguyen, Nguyen, Park, Pham and Hwang, "Federated Domain Generalization with Data-free '
                          'On-server Matching Gradient", ICLR 2025',
    "Liao et al. 2025": 'Liao, Xie, Fu, Huang, Deng, Chen and Zheng, "Federated Domain Generalization with Decision '
                        'Insight Matrix", IJCAI 2025',
    "Zhang et al. 2023": 'Zhang, Xu, Yao, Zhang, Tian and Wang, "Federated Domain Generalization with Generalization '
                         'Adjustment", CVPR 2023',
    "the FedLOE paper": '"FedLOE: Federated Domain Generalization via Locally Overfit Ensemble", anonymous submission '
                        'under review',
}


# The other works the generated report names: its tests, and where its Fish and DomainBed come from.
OTHER_WORKS = (
    'Berger, "Multiparameter hypothesis testing and acceptance sampling", Technometrics 24(4), 1982 (the '
    'intersection-union test of remark 4.1)',
    'Gulrajani and Lopez-Paz, "In Search of Lost Domain Generalization", ICLR 2021 (DomainBed)',
    'Holm, "A simple sequentially rejective multiple test procedure", Scandinavian Journal of Statistics 6(2), '
    '1979 (the Holm adjustment)',
    'Schuirmann, "A comparison of the two one-sided tests procedure and the power approach for assessing the '
    'equivalence of average bioavailability", Journal of Pharmacokinetics and Biopharmaceutics 15(6), 1987 (two '
    'one-sided tests, TOST)',
    'Shi, Seely, Torr, Siddharth, Hannun, Usunier and Synnaeve, "Gradient Matching for Domain Generalization", '
    'ICLR 2022 (Fish)',
    'Welch, "The generalization of \'Student\'s\' problem when several different population variances are '
    'involved", Biometrika 34, 1947 (Welch\'s t-test)',
    'Wilcoxon, "Individual comparisons by ranking methods", Biometrics Bulletin 1(6), 1945 (the signed-rank test)',
)


def references() -> list[str]:
  """The report's reference list: Bai et al., the method papers whose claims it reads, and the
  other works it names.

  Returns:
    One line per work, Bai et al. first.
  """
  bai = ('Bai, Bagchi and Inouye, "Benchmarking Algorithms for Federated Domain Generalization", ICLR 2024 (the '
         'protocol, the remarks and the comparison cells)')
  return [bai] + sorted(CLAIM_PAPERS.values()) + list(OTHER_WORKS)


def claim_paper(short: str) -> str:
  """The paper behind a method's claim, by authors, title and venue where `CLAIM_PAPERS` has
  it, else `short` itself.

  Args:
    short: the method spec's `claim` (e.g. "Guo et al. 2023").

  Returns:
    The citation text.
  """
  return CLAIM_PAPERS.get(short, short)


def bai_cells(path: str = CELLS_FILE) -> dict:
  """Bai et al.'s Tables 8-11 as printed.

  Args:
    path: the cells file (the packaged `bai_2024_cells.json` by default).

  Returns:
    `{"source": str, "columns": ["C=1", "lam=1", "lam=0.1", "lam=0"], "datasets":
    {dataset: {"table": int, "methods": {method: [[mean, std] or None per column]}}}}`.
  """
  return json.loads(bounded.read_capped(path, 1 << 20).decode("utf-8"))


def _cell(cells: dict, dataset: str, method: str, column: str):
  row = cells["datasets"][dataset]["methods"].get(method)
  return None if row is None else row[cells["columns"].index(column)]


def _sd(c) -> float:
  """A cell's printed standard deviation, at least `PRINTED_SD_FLOOR`: the three printed
  decimals round a smaller spread to 0.000, which is not a known difference."""
  return max(float(c[1]), PRINTED_SD_FLOOR)


def welch_p(a, b, n: int = RUNS) -> float:
  """Two-sided Welch p-value of cell `a` against cell `b`, each `[mean, std]` of n runs, each
  standard deviation at least `PRINTED_SD_FLOOR`.

  Args:
    a: `[mean, std]` of the first cell.
    b: `[mean, std]` of the second cell.
    n: runs per cell.

  Returns:
    The p-value.
  """
  return float(sps.ttest_ind_from_stats(a[0], _sd(a), n, b[0], _sd(b), n, equal_var=False).pvalue)


def welch_record(a, b, n: int = RUNS) -> dict:
  """Welch's test of cell `a` minus cell `b` from their printed summaries, as a test record
  the one-sided tests of `fedjax_dg.bench.stats` read.

  Args:
    a: `[mean, std]` of the first cell.
    b: `[mean, std]` of the second cell.
    n: runs per cell.

  Returns:
    {"diff", "se" (sqrt(s_a^2 / n + s_b^2 / n), each s at least `PRINTED_SD_FLOOR`), "df"
    (Welch-Satterthwaite), "p" (`welch_p`)}.
  """
  va, vb = _sd(a) ** 2 / n, _sd(b) ** 2 / n
  se = math.sqrt(va + vb)
  df = (va + vb) ** 2 / (va ** 2 / (n - 1) + vb ** 2 / (n - 1))
  return {"diff": a[0] - b[0], "se": se, "df": df, "p": welch_p(a, b, n)}


def _outcome(a, b, p: float, p_eq: float, alpha: float) -> str:
  if p < alpha:
    return "better" if a[0] > b[0] else "worse"
  return "equivalent" if p_eq < alpha else "inconclusive"


def compare(a, b, alpha: float = stats.ALPHA, margin: float = stats.MARGIN) -> str:
  """Cell `a` against cell `b` at `alpha` on its own: "better" / "worse" (Welch's test),
  "equivalent" (two one-sided tests within +-`margin`, `stats.tost`) or "inconclusive"."""
  rec = welch_record(a, b)
  return _outcome(a, b, rec["p"], stats.tost(rec, margin), alpha)


def _family(pairs, alpha: float = stats.ALPHA, margin: float = stats.MARGIN) -> list[str]:
  """`compare` over a family of (a, b) pairs, both tests Holm-adjusted over the family (the
  report's rule for a claim's or a remark's comparisons)."""
  recs = [welch_record(a, b) for a, b in pairs]
  adj = stats.holm([r["p"] for r in recs])
  adj_eq = stats.holm([stats.tost(r, margin) for r in recs])
  return [_outcome(a, b, p, q, alpha) for (a, b), p, q in zip(pairs, adj, adj_eq)]


def _fmt(c) -> str:
  return f"{c[0]:.3f} ± {c[1]:.3f}"


def _label(column: str) -> str:
  return "C=1" if column == "C=1" else "λ=" + column.split("=")[1]


def intro(cells: dict) -> str:
  """The sentence that says where the comparison cells come from and how they are tested.

  Args:
    cells: `bai_cells()`.

  Returns:
    The sentence for the report's reading.
  """
  return (f"Bai et al.'s own cells: {cells['source']}; each comparison is Welch's t-test from the printed mean "
          f"and standard deviation with n = {RUNS} per cell (unpaired: which of their runs shared a seed is not "
          f"printed; a standard deviation printed as 0.000 is taken as {PRINTED_SD_FLOOR:g}, the rounding's "
          "bound), read by the report's own rules: remark 4.1's column verdict with the same one-sided tests "
          "against the margin (Holm over the remark's columns for a method shown more than the margin above), "
          "remark 4.2 and a method paper's claim with Holm over the same family, the same four outcomes and the "
          "same 'most' and 'every' verdicts.")


def remark_4_1(cells: dict, labels: dict | None = None, margin: float = stats.MARGIN,
               alpha: float = stats.ALPHA) -> str:
  """Remark 4.1 on Bai et al.'s cells, by the report's column rule: in each column (dataset x
  C=1, lambda = 1, 0.1, 0), "against" where a method is shown more than `margin` above
  FedAvg-ERM (`stats.superiority_by_margin`, Holm over every column's comparisons), "supports" where every
  method is shown less than `margin` above it (`stats.non_superiority` at `alpha` each, the
  intersection-union test), "inconclusive" otherwise; then the methods significantly above
  FedAvg-ERM (Holm within the column) and the columns where its mean is the highest.

  Args:
    cells: `bai_cells()`.
    labels: the column outcomes' words (`stats.verdict_powered`'s `labels`).
    margin: the margin of remark 4.1.
    alpha: the level.

  Returns:
    The sentence for the report's reading.
  """
  above, columns, top = {}, [], 0
  for ds, d in cells["datasets"].items():
    for col in cells["columns"]:
      base = _cell(cells, ds, BASELINE, col)
      others = [(m, c) for m in d["methods"] if m != BASELINE for c in [_cell(cells, ds, m, col)] if c is not None]
      if base is None or not others:
        continue
      top += all(c[0] <= base[0] for _, c in others)
      recs = [welch_record(c, base) for _, c in others]
      won = [m for (m, c), p in zip(others, stats.holm([r["p"] for r in recs])) if p < alpha and c[0] > base[0]]
      if won:
        above.setdefault(ds, []).append(f"{_label(col)}: {', '.join(won)}")
      columns.append(recs)
  n = len(columns)
  # "More than the margin above": one Holm family over every column's comparisons (one column
  # refutes the remark); "less than the margin above": each at alpha (intersection-union).
  flat = stats.holm([stats.superiority_by_margin(r, margin) for recs in columns for r in recs])
  outcomes, i = [], 0
  for recs in columns:
    beyond = any(p < alpha for p in flat[i:i + len(recs)])
    i += len(recs)
    outcomes.append("against" if beyond else "supports"
                    if all(stats.non_superiority(r, margin) < alpha for r in recs) else "inconclusive")
  k = sum(len(v) for v in above.values())
  labels = labels or {"supports": "supporting", "against": "against", "inconclusive": "inconclusive"}
  return (f"On Bai et al.'s cells, by the same rule: "
          f"{stats.verdict_powered(outcomes, 'supports', margin, labels, refuted_by='against')}; FedAvg-ERM has "
          f"the highest mean in {top} of {n} columns, and a method is significantly above it (Holm within the "
          f"column) in {k} of {n}"
          + (": " + "; ".join(f"{ds} [{'; '.join(v)}]" for ds, v in above.items()) + "." if above else "."))


def _drops(cells: dict, pairs) -> tuple[list, dict]:
  """Each DG method's cell at `first` against its cell at `second`, for each (first, second)
  column pair on every dataset, one Holm family (the report's rule for remark 4.2): (the
  outcomes, {dataset: (supporting, testable)}), an outcome supporting ("better") where
  `first` is significantly higher."""
  where, family = [], []
  for ds in cells["datasets"]:
    for m in DG_METHODS:
      for first, second in pairs:
        a, b = _cell(cells, ds, m, first), _cell(cells, ds, m, second)
        if a is not None and b is not None:
          where.append(ds)
          family.append((a, b))
  outcomes, per = _family(family), {}
  for ds, o in zip(where, outcomes):
    k, t = per.get(ds, (0, 0))
    per[ds] = (k + (o == "better"), t + 1)
  return outcomes, per


DROP_LABELS = {"better": "degrades", "worse": "improves", "equivalent": f"equivalent within ±{stats.MARGIN:g}",
               "inconclusive": "inconclusive"}


def remark_4_2_federated(cells: dict) -> str:
  """Remark 4.2 (DG methods degrade in FL) on Bai et al.'s cells: each DG method's C = 1 cell
  against its federated cells (Welch's test on their printed means and standard deviations:
  their runs cannot be paired), Holm over the remark; "holds" when more than half of the
  testable comparisons degrade, "does not hold" when more than half improve or are
  equivalent within the margin, "inconclusive" otherwise (`stats.verdict_most_powered`, the report's rule).

  Args:
    cells: `bai_cells()`.

  Returns:
    The sentence for the report's reading.
  """
  outcomes, per = _drops(cells, [("C=1", col) for col in FEDERATED])
  return (f"On Bai et al.'s cells (printed means and standard deviations, so unpaired Welch tests, Holm over the "
          f"remark): {stats.verdict_most_powered(outcomes, 'better', labels=DROP_LABELS)}; per dataset, comparisons "
          "where C=1 is significantly higher: " + ", ".join(f"{ds} {k}/{t}" for ds, (k, t) in per.items()) + ".")


def remark_4_2_lambda(cells: dict) -> str:
  """Remark 4.2's second half (DG methods degrade from lambda = 1 to 0.1) on Bai et al.'s
  cells, by the rule of `remark_4_2_federated`.

  Args:
    cells: `bai_cells()`.

  Returns:
    The sentence for the report's reading.
  """
  outcomes, per = _drops(cells, [("lam=1", "lam=0.1")])
  return (f"On Bai et al.'s cells (printed means and standard deviations, so unpaired Welch tests, Holm over the "
          f"remark): {stats.verdict_most_powered(outcomes, 'better', labels=DROP_LABELS)}; per dataset, comparisons "
          "where λ=1 is significantly higher: " + ", ".join(f"{ds} {k}/{t}" for ds, (k, t) in per.items())
          + " (their federated columns are at C = 100; Bai et al. name PACS and CelebA for this half of the "
          "remark).")


def fish_in_federated_columns(cells: dict) -> str:
  """Bai et al.'s Fish in the federated columns against its centralised cell and FedAvg-ERM's
  federated cell, per dataset: where their Fish falls at C = 100 too. Each comparison with
  FedAvg-ERM is Welch's test at 0.05 on its own (a description, not a claim's family).

  Args:
    cells: `bai_cells()`.

  Returns:
    The sentence for the report's reading.
  """
  words = {"better": "above", "worse": "below", "equivalent": f"equivalent within ±{stats.MARGIN:g}",
           "inconclusive": "inconclusive"}
  parts = []
  for ds in cells["datasets"]:
    cen = _cell(cells, ds, "Fish", "C=1")
    fl = [(col, _cell(cells, ds, "Fish", col), _cell(cells, ds, BASELINE, col)) for col in FEDERATED]
    fl = [(col, c, b) for col, c, b in fl if c is not None and b is not None]
    if cen is None or not fl:
      continue
    parts.append(f"{ds} C=1 {_fmt(cen)}, " + ", ".join(
        f"{_label(col)} {_fmt(c)} (FedAvg-ERM {_fmt(b)}: {words[compare(c, b)]})" for col, c, b in fl))
  return "Bai et al.'s Fish (against FedAvg-ERM, Welch and TOST at 0.05 each): " + "; ".join(parts) + "."


def claim(cells: dict, method_name: str) -> str:
  """A method paper's claim "beats FedAvg-ERM" on Bai et al.'s federated cells, by the
  report's rule (Holm over the method's cells, every testable comparison better:
  `stats.verdict_powered`), or the line saying they did not run the method.

  Args:
    cells: `bai_cells()`.

  Returns:
    The sentence for the report's reading.
  """
  pairs = [(c, b) for ds in cells["datasets"] for col in FEDERATED
           for c, b in [(_cell(cells, ds, method_name, col), _cell(cells, ds, BASELINE, col))]
           if c is not None and b is not None]
  if not pairs:
    return f"Bai et al. did not run {method_name}: their tables have no cell to compare with."
  return f"On Bai et al.'s cells (Holm over them): {stats.verdict_powered(_family(pairs), 'better')}."


def figure_only(figure: str) -> str:
  """The line for a remark Bai et al. show only in a figure.

  Args:
    figure: the figure's name in their paper ("Fig. 2").

  Returns:
    The sentence for the report's reading.
  """
  return (f"Bai et al. show this remark in their {figure} only, whose values their text does not print: there are no "
          "cells to compare with.")
