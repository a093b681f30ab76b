"""Bai et al.'s own cells, and what the report's remarks say on them.

Bai, Bagchi and Inouye, "Benchmarking Algorithms for Federated Domain Generalization"
(ICLR 2024) print, in their Tables 8-11, the held-out-domain-selected test accuracy of their
14 methods on seven datasets (PACS, IWildCam, CelebA, Camelyon17, CivilComments, Py150,
FEMNIST) at C = 1 and at lambda = 1, 0.1, 0 in the federated columns: the mean and the
standard deviation among 3 runs, rounded to three decimals. `bai_2024_cells.json` holds
them as printed ("-" where a method does not apply is null).

The report reads each of its remarks on these cells with the rule it applies to its own
(`fedjax_dg.bench.report`), so a reader sees where the two agree. Bai et al. give only
summary statistics and no tests, so each comparison here is Welch's t-test from the printed
mean and standard deviation with n = 3 per cell (`scipy.stats.ttest_ind_from_stats`);
whether their standard deviation divides by n or n - 1 is not said, and the rounding to three
decimals makes a cell printed with standard deviation 0.000 look exact. These are therefore
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
    "the FedLOE paper": '"FedLOE: Federated Domain Generalization via Locally Overfit Ensemble" (anonymous submission '
                        'under review)',
}


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


def welch_p(a, b, n: int = RUNS) -> float:
  """Two-sided Welch p-value of cell `a` against cell `b`, each `[mean, std]` of n runs.

  Args:
    a: `[mean, std]` of the first cell.
    b: `[mean, std]` of the second cell.
    n: runs per cell.

  Returns:
    The p-value; 1.0 where both cells print the same mean with standard deviation 0, 0.0
    where they print different means with standard deviation 0 (the rounding hides the
    spread).
  """
  if a[1] == 0 and b[1] == 0:
    return 1.0 if a[0] == b[0] else 0.0
  return float(sps.ttest_ind_from_stats(a[0], a[1], n, b[0], b[1], n, equal_var=False).pvalue)


def compare(a, b, alpha: float = stats.ALPHA) -> str:
  """"higher" / "lower" / "no difference" for cell `a` against cell `b` (`welch_p`)."""
  p = welch_p(a, b)
  return "no difference" if p >= alpha or math.isnan(p) else "higher" if a[0] > b[0] else "lower"


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
          "printed), significant at p < 0.05 (remark 4.1: Holm within each column, as the report's rule; a method "
          "paper's claim and remark 4.2: each comparison at its own level, the verdict by the 'most' rule); no "
          "equivalence is tested on their cells (three runs a cell cannot show one at a useful margin).")


def remark_4_1(cells: dict, alpha: float = stats.ALPHA) -> str:
  """Remark 4.1 on Bai et al.'s cells: in each column (dataset x C=1, lambda = 1, 0.1, 0), the
  methods significantly above FedAvg-ERM (Holm within the column), and the columns where
  FedAvg-ERM's mean is the highest.

  Args:
    cells: `bai_cells()`.

  Returns:
    The sentence for the report's reading.
  """
  above, top, n = {}, 0, 0
  for ds, d in cells["datasets"].items():
    for col in cells["columns"]:
      base = _cell(cells, ds, BASELINE, col)
      others = [(m, c) for m in d["methods"] if m != BASELINE for c in [_cell(cells, ds, m, col)] if c is not None]
      if base is None or not others:
        continue
      n += 1
      top += all(c[0] <= base[0] for _, c in others)
      adjusted = stats.holm([welch_p(c, base) for _, c in others])
      won = [m for (m, c), p in zip(others, adjusted) if p < alpha and c[0] > base[0]]
      if won:
        above.setdefault(ds, []).append(f"{_label(col)}: {', '.join(won)}")
  k = sum(len(v) for v in above.values())
  return (f"On Bai et al.'s cells: FedAvg-ERM has the highest mean in {top} of {n} columns, and a method is "
          f"significantly above it (Holm within the column) in {k} of {n}"
          + (": " + "; ".join(f"{ds} [{'; '.join(v)}]" for ds, v in above.items()) + "." if above else "."))


def _drops(cells: dict, pairs) -> tuple[list, dict]:
  """Each DG method's cell at `first` against its cell at `second`, for each (first, second)
  column pair on every dataset: (the outcomes, {dataset: (supporting, testable)}), an
  outcome supporting where `first` is significantly higher."""
  outcomes, per = [], {}
  for ds in cells["datasets"]:
    for m in DG_METHODS:
      for first, second in pairs:
        a, b = _cell(cells, ds, m, first), _cell(cells, ds, m, second)
        if a is None or b is None:
          continue
        o = compare(a, b)
        outcomes.append(o)
        k, t = per.get(ds, (0, 0))
        per[ds] = (k + (o == "higher"), t + 1)
  return outcomes, per


def remark_4_2_federated(cells: dict) -> str:
  """Remark 4.2 (DG methods degrade in FL) on Bai et al.'s cells: each DG method's C = 1 cell
  against its federated cells, supporting where C = 1 is significantly higher (Welch's test
  on their printed means and standard deviations: their runs cannot be paired); "holds" when
  most testable comparisons support it.

  Args:
    cells: `bai_cells()`.

  Returns:
    The sentence for the report's reading.
  """
  outcomes, per = _drops(cells, [("C=1", col) for col in FEDERATED])
  return (f"On Bai et al.'s cells (printed means and standard deviations, so unpaired Welch tests, uncorrected): "
          f"{stats.verdict(outcomes, 'higher', 'most')}; per dataset, comparisons where C=1 is significantly higher: "
          + ", ".join(f"{ds} {k}/{t}" for ds, (k, t) in per.items()) + ".")


def remark_4_2_lambda(cells: dict) -> str:
  """Remark 4.2's second half (DG methods degrade from lambda = 1 to 0.1) on Bai et al.'s cells.

  Args:
    cells: `bai_cells()`.

  Returns:
    The sentence for the report's reading.
  """
  outcomes, per = _drops(cells, [("lam=1", "lam=0.1")])
  return (f"On Bai et al.'s cells (printed means and standard deviations, so unpaired Welch tests, uncorrected): "
          f"{stats.verdict(outcomes, 'higher', 'most')}; per dataset, comparisons where λ=1 is significantly higher: "
          + ", ".join(f"{ds} {k}/{t}" for ds, (k, t) in per.items())
          + " (their federated columns are at C = 100; Bai et al. name PACS and CelebA for this half of the "
          "remark).")


def fish_in_federated_columns(cells: dict) -> str:
  """Bai et al.'s Fish in the federated columns against its centralised cell and FedAvg-ERM's
  federated cell, per dataset: where their Fish falls at C = 100 too.

  Args:
    cells: `bai_cells()`.

  Returns:
    The sentence for the report's reading.
  """
  parts = []
  for ds in cells["datasets"]:
    cen = _cell(cells, ds, "Fish", "C=1")
    fl = [(col, _cell(cells, ds, "Fish", col), _cell(cells, ds, BASELINE, col)) for col in FEDERATED]
    fl = [(col, c, b) for col, c, b in fl if c is not None and b is not None]
    if cen is None or not fl:
      continue
    parts.append(f"{ds} C=1 {_fmt(cen)}, " + ", ".join(
        f"{_label(col)} {_fmt(c)} (FedAvg-ERM {_fmt(b)}: {compare(c, b).replace('higher', 'above').replace('lower', 'below')})"
        for col, c, b in fl))
  return "Bai et al.'s Fish: " + "; ".join(parts) + "."


def claim(cells: dict, method_name: str) -> str:
  """A method paper's claim "beats FedAvg-ERM" on Bai et al.'s federated cells, or the line
  saying they did not run the method.

  Args:
    cells: `bai_cells()`.

  Returns:
    The sentence for the report's reading.
  """
  outcomes = [compare(c, b) for ds in cells["datasets"] for col in FEDERATED
              for c, b in [(_cell(cells, ds, method_name, col), _cell(cells, ds, BASELINE, col))]
              if c is not None and b is not None]
  if not outcomes:
    return f"Bai et al. did not run {method_name}: their tables have no cell to compare with."
  return f"On Bai et al.'s cells: {stats.verdict(outcomes, 'higher', 'most')}."


def figure_only(figure: str) -> str:
  """The line for a remark Bai et al. show only in a figure.

  Args:
    figure: the figure's name in their paper ("Fig. 2").

  Returns:
    The sentence for the report's reading.
  """
  return (f"Bai et al. show this remark in their {figure} only, whose values their text does not print: there are no "
          "cells to compare with.")
