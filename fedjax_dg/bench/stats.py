"""Significance over trial seeds: Welch's unequal-variance t-test between two cells, and the
verdict words the report's reading is written in.

A comparison of two cells (each a tuple of per-seed scores) is one of
  "higher"         the first cell's mean is above the second's and Welch's two-sided p < alpha
  "lower"          below, with p < alpha
  "no difference"  p >= alpha
  "cannot tell"    a cell has fewer than two seeds (no variance to test with)
A comparison is uncorrected for multiple comparisons unless its caller adjusts the p-values
of a family of tests (`holm`): the reading makes dozens of comparisons at alpha = 0.05, so
expect about one in twenty uncorrected "higher" / "lower" among truly equal cells.
"""
from __future__ import annotations

import math

import numpy as np

ALPHA = 0.05


def welch(a, b) -> dict | None:
  """Welch's t-test of mean(a) - mean(b): {"diff", "t", "df", "p"} (two-sided), None where a
  cell has fewer than two values. Two constant cells: p = 1 if their means are equal, else 0
  (identical runs are "no difference"; two different constants differ for certain)."""
  a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
  if len(a) < 2 or len(b) < 2:
    return None
  diff = float(a.mean() - b.mean())
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
  if va + vb == 0.0:
    return {"diff": diff, "t": 0.0 if diff == 0.0 else math.copysign(math.inf, diff), "df": float("nan"),
            "p": 1.0 if diff == 0.0 else 0.0}
  from scipy import stats
  res = stats.ttest_ind(a, b, equal_var=False)
  df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))  # Welch-Satterthwaite
  return {"diff": diff, "t": float(res.statistic), "df": float(df), "p": float(res.pvalue)}


def compare(a, b, alpha: float = ALPHA) -> tuple[str, dict | None]:
  """("higher" | "lower" | "no difference" | "cannot tell", the test) for cell a against b."""
  w = welch(a, b)
  if w is None:
    return "cannot tell", None
  if w["p"] >= alpha:
    return "no difference", w
  return ("higher" if w["diff"] > 0 else "lower"), w


def holm(p_values) -> list[float]:
  """Holm's step-down adjusted p-values (Holm 1979), in the order given: the i-th smallest
  of m p-values becomes max over j <= i of min(1, (m - j + 1) p_(j)). Rejecting where the
  adjusted p is below alpha controls the family-wise error rate at alpha."""
  order = sorted(range(len(p_values)), key=lambda i: p_values[i])
  adjusted, running = [0.0] * len(p_values), 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
    adjusted[i] = running
  return adjusted


def compare_family(pairs, alpha: float = ALPHA) -> list[tuple[str, dict | None, float | None]]:
  """`compare` over a family of (a, b) pairs at a family-wise level: (outcome, the test, its
  Holm-adjusted p) for each pair, the adjustment over the pairs that are testable."""
  tests = [welch(a, b) for a, b in pairs]
  testable = [i for i, w in enumerate(tests) if w is not None]
  adjusted = dict(zip(testable, holm([tests[i]["p"] for i in testable])))
  out = []
  for i, w in enumerate(tests):
    if w is None:
      out.append(("cannot tell", None, None))
    elif adjusted[i] >= alpha:
      out.append(("no difference", w, adjusted[i]))
    else:
      out.append(("higher" if w["diff"] > 0 else "lower", w, adjusted[i]))
  return out


def verdict(outcomes, supports: str, need: str = "all") -> str:
  """Verdict on a claim from comparisons, each "higher" / "lower" / "no difference" /
  "cannot tell"; `supports` names the outcome the claim predicts. `need="all"`: the claim
  holds when every testable comparison supports it; `"most"`: when more than half do.
  "no difference" when every testable comparison is "no difference", "does not hold" when
  no testable comparison supports it otherwise (or, for "most", half or fewer do), "holds in
  part" in between for "all", "cannot tell" when none is testable. Every verdict carries its
  counts, "(k of n testable comparisons support it; m cannot tell)" or "(m comparisons, none
  testable)", so a claim resting on one testable comparison out of six says so."""
  testable = [o for o in outcomes if o != "cannot tell"]
  k, untestable = sum(o == supports for o in testable), len(outcomes) - len(testable)
  if not testable:
    return "cannot tell" + (f" ({untestable} comparison{'s' * (untestable > 1)}, none testable)" if untestable else "")
  counts = f" ({k} of {len(testable)} testable comparisons support it" + (
      f"; {untestable} cannot tell)" if untestable else ")")
  if all(o == "no difference" for o in testable):
    word = "no difference"
  elif need == "most":
    word = "holds" if 2 * k > len(testable) else "does not hold"
  else:
    word = "holds" if k == len(testable) else "does not hold" if k == 0 else "holds in part"
  return word + counts


def fmt_p(w: dict | None, holm_p: float | None = None) -> str:
  """"p = 0.012", or with a family's Holm-adjusted p beside it, "p = 0.012, Holm p = 0.210"."""
  if w is None:
    return "untestable"
  text = "p < 0.001" if w["p"] < 0.001 else f"p = {w['p']:.3f}"
  if holm_p is not None:
    text += ", Holm p < 0.001" if holm_p < 0.001 else f", Holm p = {holm_p:.3f}"
  return text
