"""Paired tests, detectable differences, equivalence and the seed planner of
`fedjax_dg.bench.stats`, each against SciPy called another way, a closed form, or a
simulation with a fixed seed."""
import math

import numpy as np
import pytest
from scipy import stats as sp

from fedjax_dg.bench import stats


def test_paired_t_and_wilcoxon_against_scipy_and_by_hand():
  a = [0.61, 0.65, 0.70, 0.58, 0.66, 0.63]
  b = list(np.subtract(a, [0.01, 0.02, 0.03, 0.04, 0.05, -0.005]))
  t = stats.paired(a, b)
  ref = sp.ttest_rel(a, b)
  d = np.subtract(a, b)
  assert t["t"] == pytest.approx(ref.statistic, rel=1e-12) and t["p"] == pytest.approx(ref.pvalue, rel=1e-10)
  assert t["se"] == pytest.approx(d.std(ddof=1) / math.sqrt(6), rel=1e-12) and t["df"] == 5
  # Wilcoxon, exact, by hand: the differences' absolute ranks are all distinct here; the
  # negative one (-0.01) has rank 1, so W- = 1 of 2^6 sign patterns: P(W- <= 1) = 2 / 64,
  # two-sided 4 / 64.
  assert len(set(np.round(np.abs(d), 9))) == 6
  assert t["wilcoxon_p"] == pytest.approx(4 / 64, rel=1e-12)
  # Constant differences: certain; none: no difference.
  c = stats.paired([0.5, 0.6, 0.7], [0.4, 0.5, 0.6])
  assert c["p"] == 0.0 and c["se"] == 0.0 and c["diff"] == pytest.approx(0.1)
  assert stats.paired([0.5, 0.6], [0.5, 0.6])["p"] == 1.0
  assert stats.paired([0.5], [0.4]) is None
  with pytest.raises(ValueError, match="paired"):
    stats.paired([0.1, 0.2], [0.1])


def test_pair_test_pairs_on_the_common_seeds_and_needs_two_of_them():
  a, b = {1: 0.5, 2: 0.6, 3: 0.55}, {1: 0.45, 2: 0.58, 3: 0.5}
  assert stats.pair_test(a, b)["kind"] == "paired"
  t = stats.pair_test(a, {1: 0.45, 2: 0.58, 4: 0.5})
  assert (t["kind"], t["n"], t["unpaired"]) == ("paired", 2, 2)
  assert t["p"] == pytest.approx(sp.ttest_rel([0.5, 0.6], [0.45, 0.58]).pvalue, rel=1e-10)
  w = stats.pair_test(a, {1: 0.45, 5: 0.58, 4: 0.5})
  assert w["kind"] == "welch"
  assert w["p"] == pytest.approx(sp.ttest_ind(list(a.values()), [0.45, 0.5, 0.58], equal_var=False).pvalue)


def test_power_of_against_the_normal_limit_and_a_simulation():
  # Large df: the t-test is the z-test, power Phi(d - z) + Phi(-d - z).
  z = sp.norm.ppf(0.975)
  for d in (0.5, 2.0, 3.1):
    assert stats.power_of(d, 1.0, 1e7, 0.05) == pytest.approx(sp.norm.cdf(d - z) + sp.norm.cdf(-d - z), abs=1e-5)
  # Small n: the paired t-test's rejection rate over simulated normal differences.
  rng = np.random.default_rng(12345)
  n, sd, delta = 5, 0.02, 0.03
  d = rng.normal(delta, sd, size=(200_000, n))
  tt = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
  rate = np.mean(np.abs(tt) > sp.t.ppf(0.975, n - 1))
  assert stats.power_of(delta, sd / math.sqrt(n), n - 1, 0.05) == pytest.approx(rate, abs=4 * math.sqrt(0.25 / 2e5))


@pytest.mark.parametrize("n,alpha", [(3, 0.05), (10, 0.05 / 19), (20, 0.05 / 6)])
def test_mdd_has_the_stated_power_by_monte_carlo(n, alpha):
  """At the detectable difference, the paired t-test at level alpha rejects in 80% of
  simulated experiments (normal differences, the variance the MDD was computed at)."""
  sd = 0.025
  m = stats.mdd(sd / math.sqrt(n), n - 1, alpha)
  rng = np.random.default_rng(7)
  reps = 100_000
  d = rng.normal(m, sd, size=(reps, n))
  p = 2 * sp.t.sf(np.abs(d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))), n - 1)
  rate = np.mean(p < alpha)
  assert rate == pytest.approx(0.8, abs=4 * math.sqrt(0.16 / reps))
  # Smaller differences are detected less often: the MDD is the smallest with 80%.
  assert stats.power_of(0.98 * m, sd / math.sqrt(n), n - 1, alpha) < 0.8


def test_mdd_closed_form_limit_and_edge_cases():
  # Large df: (z_{1-alpha/2} + z_{power}) se, ignoring the far tail (<1e-6 here).
  se = 0.01
  assert stats.mdd(se, 1e7, 0.05, 0.8) == pytest.approx((sp.norm.ppf(0.975) + sp.norm.ppf(0.8)) * se, rel=1e-4)
  assert stats.mdd(0.0, 4) == 0.0
  assert stats.mdd(0.01, float("nan")) is None
  # Three seeds against three, Holm over 19 (the second edition's design) need far larger
  # differences than one column's spread: the 0.13 to 0.67 at SEs 0.01 to 0.05.
  assert stats.mdd(0.02, 2, 0.05 / 19) > 0.2


def test_seeds_needed_is_the_smallest_count_reaching_the_target():
  sd = 0.03
  for alpha in (0.05, 0.05 / 19):
    n = stats.seeds_needed(sd, 0.03, alpha)
    assert stats.mdd(sd / math.sqrt(n), n - 1, alpha) <= 0.03 < stats.mdd(sd / math.sqrt(n - 1), n - 2, alpha)
  # Guenther's (1981) closed-form approximation for the one-sample t-test,
  # n ~ ((z_{1-a/2} + z_b) sd / target)^2 + z_{1-a/2}^2 / 2, within one seed.
  for sd, alpha in ((0.03, 0.05 / 19), (0.05, 0.05 / 6), (0.02, 0.05)):
    n = stats.seeds_needed(sd, 0.03, alpha)
    z = sp.norm.ppf(1 - alpha / 2)
    assert abs(n - (((z + sp.norm.ppf(0.8)) * sd / 0.03) ** 2 + z * z / 2)) <= 1, (sd, alpha, n)
  with pytest.raises(ValueError, match="seeds_needed"):
    stats.seeds_needed(10.0, 0.001, most=20)


def test_tost_against_one_sided_scipy_tests_and_its_size_by_simulation():
  a = np.array([0.61, 0.62, 0.60, 0.63, 0.61, 0.62, 0.615, 0.605])
  b = a - np.array([0.004, -0.003, 0.002, 0.001, -0.002, 0.003, 0.0, 0.001])
  t = stats.paired(a, b)
  d = a - b
  lo = sp.ttest_1samp(d + 0.02, 0.0, alternative="greater").pvalue
  hi = sp.ttest_1samp(d - 0.02, 0.0, alternative="less").pvalue
  assert stats.tost(t, 0.02) == pytest.approx(max(lo, hi), rel=1e-10)
  assert stats.tost(t, 0.02) < 0.05  # well inside the margin
  # Size: at a true difference on the margin, equivalence is declared in at most alpha of
  # experiments (exactly alpha in the limit of large n).
  rng = np.random.default_rng(3)
  n, reps = 30, 40_000
  x = rng.normal(0.02, 0.03, size=(reps, n))
  se = x.std(1, ddof=1) / math.sqrt(n)
  p = np.maximum(sp.t.sf((x.mean(1) + 0.02) / se, n - 1), sp.t.cdf((x.mean(1) - 0.02) / se, n - 1))
  rate = np.mean(p < 0.05)
  assert rate <= 0.05 + 4 * math.sqrt(0.05 * 0.95 / reps)
  assert rate == pytest.approx(0.05, abs=0.01)
  assert stats.tost({"diff": 0.01, "se": 0.0, "df": 2}, 0.02) == 0.0
  assert stats.tost({"diff": 0.03, "se": 0.0, "df": 2}, 0.02) == 1.0


def _holm_by_hand(ps) -> dict:
  """Holm (1979): the k-th smallest of m p-values times (m - k), a running maximum, at most 1."""
  running, out = 0.0, {}
  for k, i in enumerate(np.argsort(ps)):
    running = max(running, min(1.0, (len(ps) - k) * ps[i]))
    out[int(i)] = running
  return out


def test_against_baseline_four_outcomes_holm_within_the_family():
  base = {s: 0.60 + 0.01 * s for s in range(8)}
  noise = [0.003, -0.002, 0.001, -0.001, 0.002, -0.003, 0.0, 0.001]
  better = {s: base[s] + 0.05 + noise[s] for s in base}
  worse = {s: base[s] - 0.05 + noise[s] for s in base}
  same = {s: base[s] + noise[s] for s in base}
  vague = {s: base[s] + (0.1 if s % 2 else -0.1) + noise[s] for s in base}
  short = {0: 0.9}
  res = stats.against_baseline([(better, base), (worse, base), (same, base), (vague, base), (short, base)])
  assert [r["outcome"] for r in res] == ["better", "worse", "equivalent", "inconclusive", "cannot tell"]
  ps = [sp.ttest_rel([c[s] for s in range(8)], [base[s] for s in range(8)]).pvalue
        for c in (better, worse, same, vague)]
  holm = _holm_by_hand(ps)
  for i in range(4):
    assert res[i]["holm_p"] == pytest.approx(holm[i], rel=1e-9)
    sd = np.std([list(c.values()) for c in (better, worse, same, vague)][i] - np.array(list(base.values())), ddof=1)
    assert res[i]["mdd"] == pytest.approx(stats.mdd(sd / math.sqrt(8), 7, 0.05 / 4), rel=1e-9)
  assert res[4]["mdd"] is None and res[4]["test"] is None
  # The signed-rank check, Holm-adjusted over the same family (scipy's exact Wilcoxon by hand):
  # 8 seeds with every difference of one sign give p = 2 / 2^8, Holm's 4 x that still below
  # 0.05, so "better" and "worse" agree; "vague" (signs alternate) is not significant by either.
  wps = [sp.wilcoxon(np.subtract([list(c.values()) for c in (better, worse, same, vague)][i],
                                 list(base.values()))).pvalue for i in range(4)]
  wholm = _holm_by_hand(wps)
  for i in range(4):
    assert res[i]["wilcoxon_holm_p"] == pytest.approx(wholm[i], rel=1e-9)
    assert res[i]["check_disagrees"] == ((holm[i] < 0.05) != (wholm[i] < 0.05))
  assert not res[0]["check_disagrees"] and not res[3]["check_disagrees"] and res[4]["wilcoxon_holm_p"] is None
  # With 3 seeds the signed-rank test cannot go below 2 / 2^3 = 0.25: it cannot reach 0.05,
  # which is said instead of a disagreement.
  three = stats.against_baseline([({0: 0.7, 1: 0.71, 2: 0.72}, {0: 0.6, 1: 0.62, 2: 0.61})])[0]
  assert three["outcome"] == "better" and three["wilcoxon_holm_p"] == pytest.approx(0.25)
  assert three["test"]["wilcoxon_floor"] == 0.25 and three["check_unreachable"] and not three["check_disagrees"]
  assert "Wilcoxon p = 0.250 (Holm p = 0.250, cannot reach the level with 3 seeds)" in stats.fmt_powered(three)
  # 6 seeds (floor 2 / 64 = 0.031 < 0.05, so the check can reach the level): five differences
  # near +0.05 and one of -0.001. The t-test finds the lead (p < 0.01); the exact signed-rank
  # p is 2 x 2 / 64 = 0.0625 (the one negative difference holds rank 1): they disagree.
  d = [0.05, 0.051, 0.052, 0.053, 0.054, -0.001]
  lead = stats.against_baseline([({s: 0.5 + d[s] for s in range(6)}, {s: 0.5 for s in range(6)})])[0]
  assert lead["holm_p"] == pytest.approx(sp.ttest_1samp(d, 0.0).pvalue, rel=1e-6) and lead["holm_p"] < 0.01
  assert lead["wilcoxon_holm_p"] == pytest.approx(4 / 64, rel=1e-9)
  assert not lead["check_unreachable"] and lead["check_disagrees"]
  assert "(Holm p = 0.062, disagrees)" in stats.fmt_powered(lead)

  # The equivalence bound at the family's first level: the margin at which the one-sided tests'
  # larger p-value (scipy's, on the per-seed differences) reaches alpha / 4.
  for i in range(4):
    d = np.subtract([list(c.values()) for c in (better, worse, same, vague)][i], list(base.values()))
    b = res[i]["eq_bound"]
    pmax = lambda m: max(sp.ttest_1samp(d + m, 0.0, alternative="greater").pvalue,  # noqa: E731
                         sp.ttest_1samp(d - m, 0.0, alternative="less").pvalue)
    assert pmax(b) == pytest.approx(0.05 / 4, rel=1e-6)
    assert pmax(b * 1.01) < 0.05 / 4 < pmax(b * 0.99)
  assert res[2]["eq_bound"] < 0.02 < res[3]["eq_bound"] and res[4]["eq_bound"] is None
  assert stats.equivalence_bound({"diff": -0.01, "se": 0.0, "df": 3}) == 0.01
  text = stats.fmt_powered(res[0])
  assert text.startswith("paired diff +0.050 (SE 0.001), p < 0.001, Holm p < 0.001, Wilcoxon p = 0.008")



def test_the_signed_rank_family_counts_welch_comparisons():
  """A family of a paired comparison and a Welch one (no common seeds): the signed-rank p is
  Holm-adjusted over both (m = 2, the Welch one counted with p = 1), as the t-test's is."""
  base = {s: 0.5 + 0.01 * s for s in range(8)}
  paired = {s: base[s] + 0.05 + 0.001 * (s % 3) for s in range(8)}
  welch = {s + 100: 0.4 + 0.01 * s for s in range(8)}
  res = stats.against_baseline([(paired, base), (welch, base)])
  assert res[0]["test"]["kind"] == "paired" and res[1]["test"]["kind"] == "welch"
  w = sp.wilcoxon(np.subtract(list(paired.values()), list(base.values()))).pvalue
  assert res[0]["wilcoxon_holm_p"] == pytest.approx(min(1.0, 2 * w), rel=1e-9)
  assert res[1]["wilcoxon_holm_p"] is None and not res[1]["check_disagrees"]


def test_verdict_powered_words():
  assert stats.verdict_powered(["better", "better", "cannot tell"]) == "holds (2 better of 2 testable; 1 cannot tell)"
  assert stats.verdict_powered(["better", "equivalent", "inconclusive"]) == \
      "holds in part (1 better, 1 equivalent within ±0.02, 1 inconclusive of 3 testable)"
  assert stats.verdict_powered(["inconclusive", "inconclusive"]) == "inconclusive (2 inconclusive of 2 testable)"
  assert stats.verdict_powered(["equivalent", "inconclusive"]) == \
      "not supported (1 equivalent within ±0.02, 1 inconclusive of 2 testable)"
  assert stats.verdict_powered(["worse"]) == "does not hold (1 worse of 1 testable)"
  assert stats.verdict_powered(["worse", "equivalent"]) == \
      "does not hold (1 worse, 1 equivalent within ±0.02 of 2 testable)"
  # A claim about every comparison is refuted by one against it, whatever the others say.
  assert stats.verdict_powered(["better", "worse", "inconclusive"], refuted_by="worse") == \
      "does not hold (1 better, 1 worse, 1 inconclusive of 3 testable)"
  assert stats.verdict_powered(["better", "inconclusive"], refuted_by="worse").startswith("holds in part")
  # Support in one comparison and the opposite direction in another: mixed, not "in part".
  assert stats.verdict_powered(["better", "worse", "inconclusive"]) == \
      "mixed (1 better, 1 worse, 1 inconclusive of 3 testable)"
  assert stats.verdict_powered(["worse", "better"], supports="worse").startswith("mixed")
  assert stats.verdict_powered(["better", "equivalent"]).startswith("holds in part")  # equivalence is no opposite
  assert stats.verdict_powered(["cannot tell"]) == "cannot tell (1 comparison, none testable)"


def test_cells_missing_a_seed_are_paired_on_the_seeds_they_share():
  """A run that diverged leaves its cell one seed short: the comparison stays paired, on the
  common seeds (SciPy's ttest_rel on them), and says how many seeds had no partner; cells
  with fewer than two seeds in common fall back to Welch on all their seeds."""
  base = {s: 0.60 + 0.01 * s for s in range(6)}
  cell = {s: base[s] + 0.02 + 0.002 * (-1) ** s for s in range(6) if s != 3}
  t = stats.pair_test(cell, base)
  common = sorted(cell)
  ref = sp.ttest_rel([cell[s] for s in common], [base[s] for s in common])
  assert t["kind"] == "paired" and t["n"] == 5 and t["unpaired"] == 1
  assert t["p"] == pytest.approx(ref.pvalue, rel=1e-10)
  assert stats.pair_test(dict(base), base)["unpaired"] == 0
  w = stats.pair_test({0: 0.5, 1: 0.6, 2: 0.55}, {2: 0.5, 3: 0.52, 4: 0.49})
  assert w["kind"] == "welch"
  assert w["p"] == pytest.approx(sp.ttest_ind([0.5, 0.6, 0.55], [0.5, 0.52, 0.49], equal_var=False).pvalue, rel=1e-10)
  res = stats.against_baseline([(cell, base)])
  assert stats.fmt_powered(res[0]).startswith("paired on 5 common seeds (1 unpaired left out) diff +0.020")


def test_non_superiority_is_the_one_sided_shifted_t_test_and_its_bound_inverts_it():
  """`non_superiority`: SciPy's one-sided one-sample t-test of the paired differences shifted
  by the margin (H1: mean < margin); `non_superiority_bound` is the margin at which that p is
  alpha; a known difference (SE 0) is decided outright; three decimals that would round onto
  the level get a fourth."""
  from scipy import stats as sp
  a, b = [0.50, 0.53, 0.49, 0.52], [0.49, 0.50, 0.50, 0.49]
  t = stats.paired(a, b)
  d = [x - y for x, y in zip(a, b)]
  want = sp.ttest_1samp([x - 0.02 for x in d], 0.0, alternative="less").pvalue
  assert abs(stats.non_superiority(t, 0.02) - want) < 1e-12
  bound = stats.non_superiority_bound(t, 0.05)
  assert abs(sp.ttest_1samp([x - bound for x in d], 0.0, alternative="less").pvalue - 0.05) < 1e-9
  assert stats.non_superiority({"diff": 0.01, "se": 0.0, "df": 3}, 0.02) == 0.0
  assert stats.non_superiority({"diff": 0.03, "se": 0.0, "df": 3}, 0.02) == 1.0
  assert stats.fmt_p({"p": 0.04954}) == "p = 0.0495" and stats.fmt_p({"p": 0.0504}) == "p = 0.0504" and stats.fmt_p({"p": 0.0512}) == "p = 0.051"
  assert stats.p_text(0.04954) == "0.0495" and stats.p_text(0.0009) == "< 0.001" and stats.p_text(0.2) == "0.200"
  assert stats.fmt_p({"p": 0.0449}) == "p = 0.045" and stats.fmt_p({"p": 0.2}, 0.04954) == "p = 0.200, Holm p = 0.0495"


def test_superiority_by_margin_is_the_one_sided_shifted_t_test():
  """`superiority_by_margin`: SciPy's one-sided one-sample t-test of the paired differences
  shifted by the margin (H1: mean > margin); the mirror of `non_superiority`; a known
  difference (SE 0) is decided outright."""
  from scipy import stats as sp
  a, b = [0.55, 0.58, 0.54, 0.57], [0.49, 0.50, 0.50, 0.49]
  t = stats.paired(a, b)
  d = [x - y for x, y in zip(a, b)]
  want = sp.ttest_1samp([x - 0.02 for x in d], 0.0, alternative="greater").pvalue
  assert abs(stats.superiority_by_margin(t, 0.02) - want) < 1e-12 and want < 0.01
  assert abs(stats.superiority_by_margin(t, 0.02) + stats.non_superiority(t, 0.02) - 1.0) < 1e-12
  assert stats.superiority_by_margin({"diff": 0.03, "se": 0.0, "df": 3}, 0.02) == 0.0
  assert stats.superiority_by_margin({"diff": 0.02, "se": 0.0, "df": 3}, 0.02) == 1.0


def test_verdict_most_powered_by_hand():
  """More than half of the testable comparisons: "holds" when they support it, "does not
  hold" when they decide against it (the other way or equivalent), else "inconclusive"."""
  labels = {"better": "degrades", "worse": "improves", "equivalent": "equivalent within ±0.02",
            "inconclusive": "inconclusive"}
  v = stats.verdict_most_powered
  assert v(["better", "better", "inconclusive", "cannot tell"], "better", 0.02, labels) == \
      "holds (2 degrades, 1 inconclusive of 3 testable; 1 cannot tell)"
  assert v(["better", "worse", "equivalent"], "better", 0.02, labels).startswith("does not hold (1 degrades, 1 improves")
  assert v(["better", "worse", "inconclusive", "inconclusive"], "better", 0.02, labels).startswith("inconclusive (")
  assert v(["better", "inconclusive"], "better").startswith("inconclusive (1 better, 1 inconclusive of 2")
  assert v(["cannot tell"] * 2, "better") == "cannot tell (2 comparisons, none testable)"
