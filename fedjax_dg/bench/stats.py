"""Significance over trial seeds, with power: paired and Welch t-tests, what a test could
have detected, equivalence within a margin, and how many seeds a cell needs.

Which runs pair. Runs with the same `seed` share the random numbers that do not depend on
the method: `experiment.py` splits `PRNGKey(seed)` into (init, server, rounds) keys, round t
draws its cohort from `fold_in(rounds key, t)` (the cohort's choice of clients, and each
member's key `fold_in(k_clients, client id)`, never depend on the method), and the partition
of the training data over clients is drawn from `seed` alone (`partition.*_partition(...,
seed)`), as is the image subsample and the split into train / in-domain validation / test
when a sweep ties `data.seed` to the seed (`seed_fields = ("seed", "data.seed")`). So within
one column (one C and lambda) of a table whose methods run the same seeds:
  - every method shares the partition, the cohorts and each client's batch order (a client
    draws its batches from the first half of its key, `base.local_loop`) with FedAvg;
  - methods whose model has FedAvg's parameter tree (every method on the plain classifier:
    IRM, VREx, MMD, CORAL, GroupDRO, Mixup, Fish, FedProx, SCAFFOLD, AFL, FedDG, FedGMA,
    FedIIR, FedDIM, FedOMG, FedGA, FedLOE) also share the initial model; FedSR (a
    probabilistic featurizer) and FedADG (a generator and a discriminator beside the
    classifier) initialise a different tree from the same key, so they share the partition
    and the cohorts but not the initial weights;
  - a multi-stage method (FedLOE) shares the cohort of round t with FedAvg's round t.
The differences of such runs, seed by seed, have the variance of the method effect plus
what the shared randomness does not cancel, so they are tested by the paired t-test
(`paired`), with Wilcoxon's signed-rank test as a check that does not assume normal
differences. Cells of different columns (C = 1 against C = 20, lambda = 1 against 0.1) do
not share a partition or a cohort, but runs with the same seed still share the split and
the initial model, so remark 4.2 pairs them by seed too (a paired test stays valid whatever
the pairs share; what they share only adds power), and so does remark 4.8 along Fig. 3's
schedules and remark 4.7 along Fig. 2's numbers of clients; Welch's unequal-variance
t-test (`welch`) is used for a pair of cells with fewer than two seeds in common
(`pair_test`). Two cells
of one column that share most of their seeds (a run that diverged or failed) are paired on the
seeds they share, and the record counts the seeds left out.

Outcomes. A comparison of a cell against the baseline is one of
  "better" / "worse"   the (Holm-adjusted, within its family) two-sided p < alpha
  "equivalent"         not better or worse, and the two one-sided tests (Schuirmann 1987)
                       put the difference inside +-margin at the same level
  "inconclusive"       neither: the data allow a difference larger than the margin
  "cannot tell"        a cell has fewer than two seeds
and each states the minimum detectable difference (`mdd`): the true difference the test
would find with 80% power at the family's corrected level, given the measured variance.
and its equivalence bound (`equivalence_bound`): the smallest margin the two one-sided tests
accept at that level, |diff| + t SE. Its part t SE, the bound at a zero difference, says
what the design could confirm: where it exceeds the margin, no data at these seeds would
have made the comparison "equivalent".
The default margin, 0.02 in accuracy, is a judgement, not a measurement: a difference
that size is small against the spread of the method means in a column of this benchmark's
second edition on rotated Fashion-MNIST (0.09 to 0.34 in its six federated columns, 0.06 at
C = 1), and a reader who needs another passes `report.margin`; a caller with another metric
passes its own.

Remark 4.1 ("no method is above the baseline") is a claim about every method of a column:
it is decided by the intersection-union test (Berger 1982), each method's one-sided test of
"at least `margin` above the baseline" (`non_superiority`) rejected at alpha, with no
multiplicity correction, while the per-method words above stay Holm-adjusted.

Families. The comparisons a claim rests on (every method against the baseline in one
column) are one family: p-values are Holm-adjusted (Holm 1979), and the equivalence tests'
p-values too; the detectable difference is computed at alpha / m, Holm's first and
strictest step, so it is the difference each comparison of the family could surely see.

The older three words ("higher", "lower", "no difference", "cannot tell": `compare`,
`verdict`) remain for callers of Welch's test; the report's remarks use the four outcomes.
"""
from __future__ import annotations

import math

import numpy as np

ALPHA = 0.05
POWER = 0.8
MARGIN = 0.02  # equivalence margin in accuracy; see the module docstring for why
TARGET_MDD = 0.03  # the detectable difference a planned cell should reach


# ---------------------------------------------------------------------------- tests

def welch(a, b) -> dict | None:
  """Welch's t-test of mean(a) - mean(b).

  Args:
    a: the first cell's per-seed scores.
    b: the second cell's.

  Returns:
    {"kind": "welch", "diff", "se", "t", "df", "p" (two-sided)}, None where a cell has
    fewer than two values. Two constant cells: p = 1 if their means are equal, else 0
    (identical runs are "no difference"; two different constants differ for certain).
  """
  a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
  if len(a) < 2 or len(b) < 2:
    return None
  diff = float(a.mean() - b.mean())
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
  if va + vb == 0.0:
    return {"kind": "welch", "diff": diff, "se": 0.0, "t": 0.0 if diff == 0.0 else math.copysign(math.inf, diff),
            "df": float("nan"), "p": 1.0 if diff == 0.0 else 0.0}
  from scipy import stats
  res = stats.ttest_ind(a, b, equal_var=False)
  df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))  # Welch-Satterthwaite
  return {"kind": "welch", "diff": diff, "se": math.sqrt(va + vb), "t": float(res.statistic), "df": float(df),
          "p": float(res.pvalue)}


def paired(a, b) -> dict | None:
  """The paired t-test of the per-seed differences a[i] - b[i], with Wilcoxon's signed-rank
  test of the same differences as a nonparametric check.

  Args:
    a: the first cell's scores, one per seed.
    b: the second cell's, for the same seeds in the same order.

  Returns:
    {"kind": "paired", "diff" (mean difference), "sd" (of the differences), "se" (sd /
    sqrt(n), the standard error the test uses), "t", "df" (n - 1), "p" (two-sided),
    "wilcoxon_p" (two-sided, exact where SciPy can be), "wilcoxon_floor" (the smallest
    two-sided p the signed-rank test can give with these nonzero differences, 2 / 2^k), "n"};
    None with fewer than two pairs. Constant differences: p = 1 if they are all 0, else 0.

  Raises:
    ValueError: when a and b differ in length.
  """
  a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
  if len(a) != len(b):
    raise ValueError(f"paired: {len(a)} and {len(b)} values; a paired test needs one of each per seed")
  if len(a) < 2:
    return None
  d = a - b
  n, diff, sd = len(d), float(d.mean()), float(d.std(ddof=1))
  from scipy import stats
  wp = 1.0 if not np.any(d != 0) else float(stats.wilcoxon(d).pvalue)
  floor = min(1.0, 2.0 / 2.0 ** int(np.count_nonzero(d)))
  if sd == 0.0:
    return {"kind": "paired", "diff": diff, "sd": 0.0, "se": 0.0,
            "t": 0.0 if diff == 0.0 else math.copysign(math.inf, diff), "df": float(n - 1),
            "p": 1.0 if diff == 0.0 else 0.0, "wilcoxon_p": wp, "wilcoxon_floor": floor, "n": n}
  se = sd / math.sqrt(n)
  t = diff / se
  return {"kind": "paired", "diff": diff, "sd": sd, "se": se, "t": t, "df": float(n - 1),
          "p": float(2.0 * stats.t.sf(abs(t), n - 1)), "wilcoxon_p": wp, "wilcoxon_floor": floor, "n": n}


def pair_test(a_by_seed: dict, b_by_seed: dict) -> dict | None:
  """`paired` on the seeds both cells hold (the runs share their random numbers, module
  docstring) where there are at least two, else `welch` on all of each cell's seeds.

  Args:
    a_by_seed: {seed: score} of the first cell.
    b_by_seed: {seed: score} of the second.

  Returns:
    The test's record (None where it cannot be computed); a paired record holds "unpaired",
    the seeds of either cell left out for lack of a partner (0 when the seeds match).
  """
  common = sorted(set(a_by_seed) & set(b_by_seed))
  if len(common) >= 2:
    t = paired([a_by_seed[s] for s in common], [b_by_seed[s] for s in common])
    if t is not None:
      t["unpaired"] = len(set(a_by_seed) ^ set(b_by_seed))
    return t
  return welch([a_by_seed[s] for s in sorted(a_by_seed)], [b_by_seed[s] for s in sorted(b_by_seed)])


# ---------------------------------------------------------------------------- power

def power_of(delta: float, se: float, df: float, alpha: float) -> float:
  """The two-sided t-test's power at a true difference `delta`.

  Args:
    delta: the true difference.
    se: the test's standard error.
    df: its degrees of freedom.
    alpha: its level.

  Returns:
    P(|T| > t_{1 - alpha/2, df}) for T noncentral t with df degrees of freedom and
    noncentrality delta / se.
  """
  from scipy import stats
  crit = stats.t.ppf(1.0 - alpha / 2.0, df)
  nc = abs(delta) / se
  # The far tail (|T| beyond the critical value on the other side) is below 1e-12 wherever
  # SciPy's series returns NaN for it (large noncentrality): counted as 0 there.
  far = float(stats.nct.cdf(-crit, df, nc))
  return float(stats.nct.sf(crit, df, nc)) + (0.0 if math.isnan(far) else far)


def mdd(se: float, df: float, alpha: float = ALPHA, power: float = POWER) -> float | None:
  """The minimum detectable difference: the smallest true difference the two-sided t-test
  at level `alpha` finds with probability `power`, at standard error `se`.

  Args:
    se: the test's standard error (paired: sd of the differences / sqrt(n)).
    df: its degrees of freedom.
    alpha: the level (a family's corrected level, e.g. alpha / m).
    power: the probability of finding the difference.

  Returns:
    The difference (0 where se is 0: any difference is certain), None where df is not a
    finite positive number.
  """
  if se == 0.0:
    return 0.0
  if not (df > 0 and math.isfinite(df)):
    return None
  from scipy import optimize, stats
  lo = stats.t.ppf(1.0 - alpha / 2.0, df)  # power at nc = crit is about 1/2 < `power`
  hi = lo + 2.0 * stats.norm.ppf(power) + 1.0
  while power_of(hi, 1.0, df, alpha) < power:
    hi *= 2.0
  nc = optimize.brentq(lambda x: power_of(x, 1.0, df, alpha) - power, 0.0, hi, xtol=1e-12)
  return float(nc * se)


def seeds_needed(sd: float, target: float = TARGET_MDD, alpha: float = ALPHA, power: float = POWER,
                 most: int = 1000) -> int:
  """How many seeds a paired comparison needs for its detectable difference to be at most
  `target`, given a pilot's standard deviation of the per-seed differences.

  Args:
    sd: the pilot's standard deviation of paired differences.
    target: the detectable difference to reach.
    alpha: the level (a family's corrected level).
    power: the power.
    most: the search's upper end.

  Returns:
    The smallest n >= 2 with mdd(sd / sqrt(n), n - 1, alpha, power) <= target.

  Raises:
    ValueError: when `most` seeds do not reach the target.
  """
  for n in range(2, most + 1):
    if mdd(sd / math.sqrt(n), n - 1, alpha, power) <= target:
      return n
  raise ValueError(f"seeds_needed: {most} seeds do not bring the detectable difference to {target} at sd {sd}")


# ---------------------------------------------------------------------------- equivalence

def tost(t: dict, margin: float = MARGIN) -> float:
  """Schuirmann's two one-sided tests of |difference| < margin.

  Args:
    t: a test record (`paired` or `welch`).
    margin: the equivalence margin.

  Returns:
    The larger of the two one-sided p-values (H0: diff <= -margin; H0: diff >= margin);
    below alpha, the difference lies within +-margin at level alpha. With se 0 the
    difference is known: 0 inside the margin, else 1.
  """
  if t["se"] == 0.0:
    return 0.0 if abs(t["diff"]) < margin else 1.0
  from scipy import stats
  if not (t["df"] > 0 and math.isfinite(t["df"])):
    return 1.0
  p_low = stats.t.sf((t["diff"] + margin) / t["se"], t["df"])
  p_high = stats.t.cdf((t["diff"] - margin) / t["se"], t["df"])
  return float(max(p_low, p_high))


def equivalence_bound(t: dict, alpha: float = ALPHA) -> float | None:
  """The smallest margin the two one-sided tests accept at level `alpha`: |diff| + t_(1-alpha)
  SE (`tost` < alpha exactly when the margin exceeds it). Where t_(1-alpha) SE alone is above
  a report's margin, "equivalent" was out of reach at these seeds whatever the difference.

  Args:
    t: a test record (`paired` or `welch`).
    alpha: the level of each one-sided test (a family's corrected level, e.g. alpha / m).

  Returns:
    The bound (|diff| where se is 0), None where df is not a finite positive number.
  """
  if t["se"] == 0.0:
    return abs(t["diff"])
  if not (t["df"] > 0 and math.isfinite(t["df"])):
    return None
  from scipy import stats
  return float(abs(t["diff"]) + stats.t.ppf(1.0 - alpha, t["df"]) * t["se"])


def non_superiority(t: dict, margin: float = MARGIN) -> float:
  """The one-sided test that a cell is not above its baseline by `margin` or more.

  Args:
    t: a test record (`paired` or `welch`) of cell minus baseline.
    margin: the margin.

  Returns:
    The p-value of H0: diff >= margin; below alpha, the cell is less than `margin` above the
    baseline at level alpha. With se 0 the difference is known: 0 below the margin, else 1.
    A claim that no method of a column is above the baseline (remark 4.1) holds at level
    alpha when each such test rejects at alpha, with no multiplicity correction: a claim about
    every comparison is an intersection-union test (Berger 1982).
  """
  if t["se"] == 0.0:
    return 0.0 if t["diff"] < margin else 1.0
  if not (t["df"] > 0 and math.isfinite(t["df"])):
    return 1.0
  from scipy import stats
  return float(stats.t.cdf((t["diff"] - margin) / t["se"], t["df"]))


def superiority_by_margin(t: dict, margin: float = MARGIN) -> float:
  """The one-sided test that a cell is above its baseline by more than `margin`.

  Args:
    t: a test record (`paired` or `welch`) of cell minus baseline.
    margin: the margin.

  Returns:
    The p-value of H0: diff <= margin; below the level, the cell is shown more than
    `margin` above the baseline (what refutes "no method is the margin or more above it",
    remark 4.1). With se 0 the difference is known: 0 above the margin, else 1.
  """
  if t["se"] == 0.0:
    return 0.0 if t["diff"] > margin else 1.0
  if not (t["df"] > 0 and math.isfinite(t["df"])):
    return 1.0
  from scipy import stats
  return float(stats.t.sf((t["diff"] - margin) / t["se"], t["df"]))


def non_superiority_bound(t: dict, alpha: float = ALPHA) -> float | None:
  """The smallest margin `non_superiority` accepts at level `alpha`: diff + t_(1-alpha) SE.

  Args:
    t: a test record (`paired` or `welch`).
    alpha: the level of the one-sided test.

  Returns:
    The bound (diff where se is 0), None where df is not a finite positive number.
  """
  if t["se"] == 0.0:
    return t["diff"]
  if not (t["df"] > 0 and math.isfinite(t["df"])):
    return None
  from scipy import stats
  return float(t["diff"] + stats.t.ppf(1.0 - alpha, t["df"]) * t["se"])


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


def against_baseline(pairs, alpha: float = ALPHA, margin: float = MARGIN, power: float = POWER) -> list[dict]:
  """One family of comparisons against a baseline, each paired on the seeds both cells hold.

  Args:
    pairs: [(cell {seed: score}, baseline {seed: score})].
    alpha: the family-wise level.
    margin: the equivalence margin.
    power: the power the detectable difference is stated at.

  Returns:
    One dict per pair: {"outcome" ("better" | "worse" | "equivalent" | "inconclusive" |
    "cannot tell"), "test" (the record, or None), "holm_p", "tost_p" (Holm-adjusted over
    the family's testable comparisons), "wilcoxon_holm_p" (the signed-rank p, Holm-adjusted
    over the same m comparisons, a Welch one counted with p = 1; None for a Welch one),
    "check_unreachable" (the signed-rank test cannot reach the family's first level alpha /
    m with this many nonzero differences: 2 / 2^k >= alpha / m, e.g. 3 seeds), "check_disagrees"
    (it could and decides otherwise than the t-test at the family's level: a difference
    resting on a few seeds or on outliers), "mdd" (at
    alpha / m, m the testable comparisons), "eq_bound" (`equivalence_bound` at alpha / m,
    the same strictest level), "margin"}.
  """
  tests = [pair_test(a, b) for a, b in pairs]
  idx = [i for i, t in enumerate(tests) if t is not None]
  m = len(idx)
  adj = dict(zip(idx, holm([tests[i]["p"] for i in idx])))
  adj_eq = dict(zip(idx, holm([tost(tests[i], margin) for i in idx])))
  paired = {i for i in idx if tests[i]["kind"] == "paired"}
  adj_w = dict(zip(idx, holm([tests[i]["wilcoxon_p"] if i in paired else 1.0 for i in idx])))
  out = []
  for i, t in enumerate(tests):
    if t is None:
      out.append({"outcome": "cannot tell", "test": None, "holm_p": None, "tost_p": None, "wilcoxon_holm_p": None,
                  "check_unreachable": False, "check_disagrees": False, "mdd": None, "eq_bound": None,
                  "margin": margin})
      continue
    if adj[i] < alpha:
      o = "better" if t["diff"] > 0 else "worse"
    elif adj_eq[i] < alpha:
      o = "equivalent"
    else:
      o = "inconclusive"
    w = adj_w[i] if i in paired else None
    unreachable = w is not None and t["wilcoxon_floor"] >= alpha / m
    out.append({"outcome": o, "test": t, "holm_p": adj[i], "tost_p": adj_eq[i], "wilcoxon_holm_p": w,
                "check_unreachable": unreachable,
                "check_disagrees": w is not None and not unreachable and (adj[i] < alpha) != (w < alpha),
                "mdd": mdd(t["se"], t["df"], alpha / m, power), "eq_bound": equivalence_bound(t, alpha / m),
                "margin": margin})
  return out


# ---------------------------------------------------------------------------- Welch words

def compare(a, b, alpha: float = ALPHA) -> tuple[str, dict | None]:
  """("higher" | "lower" | "no difference" | "cannot tell", the Welch test) for cell a
  against cell b (unpaired cells: different columns)."""
  w = welch(a, b)
  if w is None:
    return "cannot tell", None
  if w["p"] >= alpha:
    return "no difference", w
  return ("higher" if w["diff"] > 0 else "lower"), w


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


def _counts(testable, untestable: int, labels: dict | None, margin: float) -> str:
  """" (1 better, 5 inconclusive of 6 testable; 2 cannot tell)": each outcome's count named by
  `labels` (outcome -> words, or (singular, plural) words)."""
  labels = labels or {"better": "better", "worse": "worse", "equivalent": f"equivalent within ±{margin:g}",
                      "inconclusive": "inconclusive"}
  n = {w: sum(o == w for o in testable) for w in labels}
  counts = ", ".join(f"{n[w]} {label if isinstance(label, str) else label[n[w] != 1]}" for w, label in labels.items()
                     if n[w])
  return f" ({counts} of {len(testable)} testable" + (f"; {untestable} cannot tell)" if untestable else ")")


OPPOSITE = {"better": "worse", "worse": "better"}


def verdict_powered(outcomes, supports: str = "better", margin: float = MARGIN, labels: dict | None = None,
                    refuted_by: str | None = None) -> str:
  """Verdict on a claim from `against_baseline` outcomes; `supports` names the outcome the
  claim predicts. "holds" when every testable comparison supports it, "holds in part" when
  some do and none shows the opposite direction, "mixed" when some support it and some show
  the opposite direction (a method above the baseline in one column and below it in
  another), "does not hold" when every testable comparison decides against it (the other
  direction, or equivalence within the margin), "not supported" when none supports it, some
  decide against it and the rest are inconclusive, "inconclusive" when every testable
  comparison is inconclusive (the data allow the claim and its negation), "cannot tell"
  when none is testable. The counts of each outcome follow in brackets, each named by
  `labels` (outcome -> words, or (singular, plural) words; default: better, worse,
  equivalent within +-margin, inconclusive). `refuted_by`: an outcome that alone refutes a
  claim about every comparison (remark 4.1's "against": a column with a method above the
  baseline): "does not hold" wherever it occurs."""
  testable = [o for o in outcomes if o != "cannot tell"]
  untestable = len(outcomes) - len(testable)
  if not testable:
    return "cannot tell" + (f" ({untestable} comparison{'s' * (untestable > 1)}, none testable)" if untestable else "")
  k = sum(o == supports for o in testable)
  if refuted_by is not None and refuted_by in testable:
    word = "does not hold"
  elif k == len(testable):
    word = "holds"
  elif k and OPPOSITE.get(supports) in testable:
    word = "mixed"
  elif k:
    word = "holds in part"
  elif all(o == "inconclusive" for o in testable):
    word = "inconclusive"
  elif "inconclusive" in testable:
    word = "not supported"
  else:
    word = "does not hold"
  return word + _counts(testable, untestable, labels, margin)


def verdict_most_powered(outcomes, supports: str = "better", margin: float = MARGIN,
                         labels: dict | None = None) -> str:
  """Verdict on a claim about most comparisons (remark 4.2) from `against_baseline` outcomes:
  "holds" when more than half of the testable comparisons support it (`supports`), "does not
  hold" when more than half decide against it (the other direction, or equivalent within
  the margin), "inconclusive" otherwise, "cannot tell" when none is testable; the counts of
  each outcome follow as in `verdict_powered`.

  Args:
    outcomes: the comparisons' outcomes.
    supports: the outcome the claim predicts ("better" or "worse").
    margin: the equivalence margin (for the default labels).
    labels: outcome -> words, or (singular, plural) words.

  Returns:
    The verdict with its counts.
  """
  testable = [o for o in outcomes if o != "cannot tell"]
  untestable = len(outcomes) - len(testable)
  if not testable:
    return "cannot tell" + (f" ({untestable} comparison{'s' * (untestable > 1)}, none testable)" if untestable else "")
  k = sum(o == supports for o in testable)
  against = sum(o not in (supports, "inconclusive") for o in testable)
  word = "holds" if 2 * k > len(testable) else "does not hold" if 2 * against > len(testable) else "inconclusive"
  return word + _counts(testable, untestable, labels, margin)


# ---------------------------------------------------------------------------- text

def p_text(p: float) -> str:
  """A p-value as a table cell prints it: "< 0.001", "0.012"; four decimals where three
  would round onto the level (0.04954 reads "0.0495", not "0.050" beside a significant
  verdict)."""
  if p < 0.001:
    return "< 0.001"
  return f"{p:.4f}" if f"{p:.3f}" == f"{ALPHA:.3f}" else f"{p:.3f}"


def _p(p: float) -> str:
  """"p < 0.001", "p = 0.012" (`p_text`)."""
  text = p_text(p)
  return f"p {text}" if text.startswith("<") else f"p = {text}"


def fmt_p(w: dict | None, holm_p: float | None = None) -> str:
  """"p = 0.012", or with a family's Holm-adjusted p beside it, "p = 0.012, Holm p = 0.210"."""
  if w is None:
    return "untestable"
  text = _p(w["p"])
  if holm_p is not None:
    text += f", Holm {_p(holm_p)}"
  return text


def fmt_powered(c: dict) -> str:
  """A comparison against the baseline in words: "paired diff +0.012 (SE 0.004), p = 0.020,
  Holm p = 0.210, Wilcoxon p = 0.031 (Holm p = 0.250), TOST Holm p = 0.400, detectable
  0.025, equivalence bound 0.024" (no TOST and no bound where the comparison is decided better
  or worse: equivalence is then beside the point), or "untestable"; "(Holm p = ..., disagrees)" where the
  signed-rank test decides otherwise than the t-test at the family's level, "(Holm p = ...,
  cannot reach the level with n seeds)" where its smallest p is above that level."""
  t = c["test"]
  if t is None:
    return "untestable"
  kind = t["kind"] + (f" on {t['n']} common seeds ({t['unpaired']} unpaired left out)" if t.get("unpaired") else "")
  text = f"{kind} diff {t['diff']:+.3f} (SE {t['se']:.3f}), {_p(t['p'])}, Holm {_p(c['holm_p'])}"
  if t["kind"] == "paired":
    text += f", Wilcoxon {_p(t['wilcoxon_p'])}"
    if c.get("wilcoxon_holm_p") is not None:
      text += f" (Holm {_p(c['wilcoxon_holm_p'])}" + (
          f", cannot reach the level with {t['n']} seeds)" if c.get("check_unreachable")
          else ", disagrees)" if c.get("check_disagrees") else ")")
  decided = c.get("outcome") in ("better", "worse")
  text += "" if decided else f", TOST Holm {_p(c['tost_p'])}"
  text += f", detectable {c['mdd']:.3f}" if c["mdd"] is not None else ", detectable -"
  if "eq_bound" in c and not decided:
    text += f", equivalence bound {c['eq_bound']:.3f}" if c["eq_bound"] is not None else ", equivalence bound -"
  return text


def fmt_mdd(w: dict | None, alpha: float = ALPHA, power: float = POWER) -> str:
  """", detectable 0.045" for a Welch comparison at level alpha ("" when untestable)."""
  if w is None:
    return ""
  d = mdd(w["se"], w["df"], alpha, power)
  return ", detectable -" if d is None else f", detectable {d:.3f}"
