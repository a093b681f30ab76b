"""The report's at-a-glance table of remark 4.1's comparisons: each cell's paired difference
from the baseline and its outcome, each column's detectable difference and verdict, checked
against SciPy's paired t-test, Holm by hand and the noncentral t distribution."""
import numpy as np
import pytest
from scipy import optimize, stats as sps

from fedjax_dg.bench import collect, report

SEEDS = tuple(range(1, 13))
COLS = ((20, 1.0), (20, 0.0))
NAMES = {"fedavg": "FedAvg-ERM", "up": "Up", "down": "Down", "same": "Same", "noisy": "Noisy",
         "off": "Off", "one": "One"}


def _cell(values, seeds=SEEDS, mark=""):
  v = tuple(float(x) for x in values)
  return collect.Cell(float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else None, v, len(SEEDS),
                      seeds=tuple(seeds), mark=mark)


@pytest.fixture
def scores():
  rng = np.random.default_rng(7)
  base = {col: 0.4 + 0.03 * rng.standard_normal(len(SEEDS)) for col in COLS}
  noise = lambda sd: sd * rng.standard_normal(len(SEEDS))  # noqa: E731
  col1, col2 = COLS
  return {("fedavg", col1): base[col1], ("fedavg", col2): base[col2],
          ("up", col1): base[col1] + 0.05 + noise(0.01),
          ("down", col1): base[col1] - 0.05 + noise(0.01), ("down", col2): base[col2] - 0.05 + noise(0.01),
          ("same", col1): base[col1] + noise(0.002), ("same", col2): base[col2] + noise(0.002),
          ("noisy", col1): base[col1] + noise(0.1),
          ("off", col1): base[col1]}


def _table(scores):
  rows = (("B", "fedavg", "FedAvg-ERM"), ("X", "up", "Up"), ("X", "down", "Down"), ("X", "same", "Same"),
          ("X", "noisy", "Noisy"), ("X", "off", "Off"), ("X", "one", "One"))
  cells = {}
  for (m, col), v in scores.items():
    if m == "off":
      cells[(m, col)] = _cell(v, mark=collect.INACTIVE)
    elif m == "one":
      cells[(m, col)] = _cell(v, seeds=SEEDS[:1])
    else:
      cells[(m, col)] = _cell(v)
  return collect.Table(rows=rows, columns=COLS, cells=cells, rule="heldout_domain", metric="accuracy")


def _parse(md):
  rows = {}
  for line in md.splitlines():
    if line.startswith("| ") and not line.startswith("| group"):
      parts = [p.strip() for p in line.strip("|").split("|")]
      rows[parts[1]] = parts[2:]
  return rows


def _holm(ps):
  order = np.argsort(ps)
  out, run = np.empty(len(ps)), 0.0
  for k, i in enumerate(order):
    run = max(run, min(1.0, (len(ps) - k) * ps[i]))
    out[i] = run
  return out


def _mdd(se, df, level, power=0.8):
  crit = sps.t.ppf(1 - level / 2, df)
  pw = lambda d: sps.nct.sf(crit, df, d / se) + np.nan_to_num(sps.nct.cdf(-crit, df, d / se))  # noqa: E731
  return optimize.brentq(lambda d: pw(d) - power, 1e-9, se * (crit + 4))


def test_cells_are_paired_differences_with_holm_outcomes(scores):
  md = report.against_baseline_table(_table(scores), "fedavg", NAMES, margin=0.02)
  rows = _parse(md)
  col1, col2 = COLS
  assert rows["FedAvg-ERM"] == [f"{np.mean(scores[('fedavg', c)]):.3f}" for c in COLS]
  # Column 1: Up, Down, Same, Noisy are the family (Off marked, One absent there).
  fam = ["up", "down", "same", "noisy"]
  d = {m: scores[(m, col1)] - scores[("fedavg", col1)] for m in fam}
  p = _holm(np.array([sps.ttest_rel(scores[(m, col1)], scores[("fedavg", col1)]).pvalue for m in fam]))
  assert p[0] < 0.05 and p[1] < 0.05 and p[2] > 0.05 and p[3] > 0.05
  assert rows["Up"][0] == f"{np.mean(d['up']):+.3f} ▲" and np.mean(d["up"]) > 0.04
  assert rows["Down"][0] == f"{np.mean(d['down']):+.3f} ▼" and np.mean(d["down"]) < -0.04
  # Same: both one-sided tests at +-0.02 reject far below Holm's levels; Noisy: they do not.
  n = len(SEEDS)
  for m, eq in (("same", True), ("noisy", False)):
    se = np.std(d[m], ddof=1) / np.sqrt(n)
    tost = max(sps.t.sf((np.mean(d[m]) + 0.02) / se, n - 1), sps.t.cdf((np.mean(d[m]) - 0.02) / se, n - 1))
    assert (tost * len(fam) < 0.05) == eq
  assert rows["Same"][0] == f"{np.mean(d['same']):+.3f} ≈"
  assert rows["Noisy"][0] == f"{np.mean(d['noisy']):+.3f} ?"
  assert rows["Off"][0] == "-ᵇ" and rows["Off"][1] == "-"
  assert rows["Up"][1] == "-" and rows["Noisy"][1] == "-"
  assert rows["One"] == ["-", "-"]  # no cell in either column
  # Detectable: the median over the column's comparisons at Holm's first level.
  for col, members, row in ((col1, fam, 0), (col2, ["down", "same"], 1)):
    mdds = [_mdd(np.std(scores[(m, col)] - scores[("fedavg", col)], ddof=1) / np.sqrt(n), n - 1, 0.05 / len(members))
            for m in members]
    assert rows["detectable (median)"][row] == f"{np.median(mdds):.3f}"
  # Column 1 has a method significantly above; column 2's methods are all shown below +0.02.
  assert rows["remark 4.1"] == ["some above", "none above"]


def test_a_flipped_difference_reads_the_other_way(scores):
  flipped = dict(scores)
  flipped[("up", COLS[0])] = 2 * scores[("fedavg", COLS[0])] - scores[("up", COLS[0])]
  rows = _parse(report.against_baseline_table(_table(flipped), "fedavg", NAMES, margin=0.02))
  assert rows["Up"][0].startswith("-") and rows["Up"][0].endswith("▼")
  assert rows["remark 4.1"][0] == "inconclusive"  # Noisy may still be 0.02 above


def test_an_untestable_cell_leaves_the_column_undecided(scores):
  """A one-seed cell, above or below the baseline's mean: the column cannot read 'none above'
  (not every method is shown less than the margin above), nor 'some above' from it."""
  for shift in (0.2, -0.2):
    one = dict(scores)
    one[("one", COLS[1])] = scores[("fedavg", COLS[1])][:1] + shift
    rows = _parse(report.against_baseline_table(_table(one), "fedavg", NAMES, margin=0.02))
    assert rows["One"] == ["-", "·"] and rows["remark 4.1"] == ["some above", "cannot tell"]


def test_a_method_significantly_above_by_less_than_the_margin_refutes_nothing(scores):
  """Up at +0.01 with a small spread: significantly above the baseline (Holm), shown less than
  +0.02 above it, not shown more: the column's verdict is 'none above', not 'some above'."""
  small = {k: v for k, v in scores.items() if k[0] != "noisy"}
  col = COLS[0]
  rng = np.random.default_rng(3)
  small[("up", col)] = scores[("fedavg", col)] + 0.01 + 0.002 * rng.standard_normal(len(SEEDS))
  d = small[("up", col)] - small[("fedavg", col)]
  assert sps.ttest_1samp(d, 0.0).pvalue * 3 < 0.05  # significant at Holm's first level (3 tested)
  assert sps.ttest_1samp(d - 0.02, 0.0, alternative="less").pvalue < 0.05  # shown below +0.02
  assert sps.ttest_1samp(d - 0.02, 0.0, alternative="greater").pvalue > 0.05  # not shown above
  rows = _parse(report.against_baseline_table(_table(small), "fedavg", NAMES, margin=0.02))
  assert rows["Up"][0] == f"{np.mean(d):+.3f} ▲" and rows["remark 4.1"][0] == "none above"
  # At +0.05 it is shown more than the margin above: the column is against the remark.
  small[("up", col)] = scores[("fedavg", col)] + 0.05 + 0.002 * rng.standard_normal(len(SEEDS))
  rows = _parse(report.against_baseline_table(_table(small), "fedavg", NAMES, margin=0.02))
  assert rows["remark 4.1"][0] == "some above"


def test_no_usable_baseline_gives_no_table(scores):
  t = _table({k: v for k, v in scores.items() if k[0] != "fedavg"})
  assert report.against_baseline_table(t, "fedavg", NAMES) == ""


def test_the_margins_words_carry_the_reports_own_spreads_and_detectable_differences(scores):
  """The reading's margin clause: per column, the largest minus the smallest usable mean (the
  marked Off cell left out), and the range of
  the columns' median detectable differences, by hand."""
  t = _table(scores)
  n = len(SEEDS)
  spreads, medians = [], []
  for col, members in ((COLS[0], ["up", "down", "same", "noisy"]), (COLS[1], ["down", "same"])):
    means = [np.mean(scores[(m, col)]) for m in ["fedavg"] + members]
    spreads.append(max(means) - min(means))
    medians.append(np.median([_mdd(np.std(scores[(m, col)] - scores[("fedavg", col)], ddof=1) / np.sqrt(n), n - 1,
                                   0.05 / len(members)) for m in members]))
  words = report.margin_words(t, 0.02, "fedavg")
  assert (f"the method means of a column here span {min(spreads):.3f} to {max(spreads):.3f} (largest minus "
          f"smallest); the columns' median detectable differences are {min(medians):.3f} to {max(medians):.3f}") in words
  assert report.margin_words(None, 0.02, "fedavg").endswith("small against what separates methods in a column")


def test_our_ordered_methods_line_reads_each_federated_column_against_the_baseline(scores):
  """The sentence beside Bai et al.'s Fish: per federated column the paired difference and
  its outcome in the column's family (the glance table's), a marked cell as marked."""
  t = _table(scores)
  line = report.ordered_methods_line(t, "fedavg", NAMES, {"down": "random", "off": "ascending"}, 0.02)
  d = np.mean(scores[("down", COLS[0])] - scores[("fedavg", COLS[0])])
  d2 = np.mean(scores[("down", COLS[1])] - scores[("fedavg", COLS[1])])
  assert line == ("Ours: Down (random domain order); against FedAvg-ERM (paired, Holm within each column): "
                  f"C=20, λ=1 {d:+.3f} (below), C=20, λ=0 {d2:+.3f} (below); Off (ascending domain order); against "
                  "FedAvg-ERM (paired, Holm within each column): C=20, λ=1 -ᵇ.")
  assert report.ordered_methods_line(t, "fedavg", NAMES, {}, 0.02) == ""
