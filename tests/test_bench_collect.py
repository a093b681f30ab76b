"""Collect, difficulty metrics and figures on fixture runs whose summaries the test writes."""
import csv
import json
import os
import statistics
import sys

import ml_collections
import pytest

from fedjax_dg import provenance
from fedjax_dg.bench import collect, difficulty, figures, stats, sweep as sweep_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from fedjax_dg.bench import sweep_helpers as sweep_common  # noqa: E402


def write_run(workdir, rounds: dict, wall=1.0, bytes_per_round=100):
  """A finished run: `rounds[t] = {split: accuracy}`; the summary's selections are the
  best heldout_val / in_val rounds (earliest on ties), as the runner writes them."""
  os.makedirs(workdir, exist_ok=True)
  recs = [{"round": t, "train_loss": 0.0, "splits": {k: {"accuracy": v, "n": 10} for k, v in sp.items()}}
          for t, sp in sorted(rounds.items())]
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in recs)
  sel = {}
  for rule, split in (("heldout_domain", "heldout_val"), ("in_domain", "in_val")):
    best = max(recs, key=lambda r: (r["splits"][split]["accuracy"], -r["round"]))
    sel[rule] = {"round": best["round"], "val": best["splits"][split], "test": best["splits"]["test"]}
  summary = {"selection": sel, "wall_time_s": wall, "final": recs[-1], "client_sizes": [30, 30],
             "provenance": {"source": provenance.source_fingerprint()},  # run under the current code
             "domains": {"names": ["a", "b", "c", "d"]},
             "communication": {"bytes_per_round": bytes_per_round, "setup_bytes": 0}}
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f)


def sweep_config(root, **grid):
  s = sweep_common.skeleton("fixture", str(root))
  s.base.num_rounds = 2
  g = {"methods": ("fedavg", "irm", "fedprox"), "client_counts": (1, 4), "lams": (1.0, 0.0), "seeds": (0, 1, 2),
       "num_trials": 0}
  g.update(grid)
  s.grids = ml_collections.ConfigDict({"table": g})
  return s


# Held-out-selected test accuracy per (method, C, lam) and seed; rows: three seeds.
TEST = {("fedavg", 1, None): (0.90, 0.80, 0.85), ("irm", 1, None): (0.70, 0.72, 0.74),
        ("fedavg", 4, 1.0): (0.60, 0.70, 0.65), ("irm", 4, 1.0): (0.50, 0.52, 0.60),
        ("fedprox", 4, 1.0): (0.61, 0.69, 0.68),
        ("fedavg", 4, 0.0): (0.40, 0.44, 0.42), ("irm", 4, 0.0): (0.45, 0.47, 0.49),
        ("fedprox", 4, 0.0): (0.45, 0.47, 0.49)}


def fill(exp, test=TEST):
  """Round 1: held-out val 0.5, test = the table value; round 2: val 0.4, test = value + 0.1
  (the oracle picks round 2); in_val prefers round 2."""
  for e in exp.entries:
    a = e.axes
    v = test[(a["method"], a["num_clients"], a["lam"])][a["seed"]]
    write_run(exp.jobs[e.key].workdir, {1: {"heldout_val": 0.5, "in_val": 0.3, "in_test": 0.9, "test": v},
                                        2: {"heldout_val": 0.4, "in_val": 0.6, "in_test": 0.8, "test": v + 0.1}})


def test_table_mean_std_bold_italics_by_hand(tmp_path):
  s = sweep_config(tmp_path)
  exp = sweep_lib.expand(s)
  fill(exp)
  results = collect.load_results(exp)
  t = collect.build_table(s, exp, results, "table", "heldout_domain", "accuracy", ddof=1)
  assert t.columns == ((1, None), (4, 1.0), (4, 0.0))
  assert [r[1] for r in t.rows] == ["fedavg", "irm", "fedprox"]  # B, DG adapted, FL
  for (m, C, lam), vals in TEST.items():
    c = t.cells[(m, (C, lam))]
    assert c.mean == pytest.approx(sum(vals) / 3, abs=1e-12)
    assert c.std == pytest.approx(statistics.stdev(vals), abs=1e-12)  # sample std, ddof = 1
  assert t.cells[("fedprox", (1, None))] is None  # no centralised FedProx: "-"
  # Bold only where the column's best beats the runner-up by the paired t-test over seeds
  # (the cells share their seeds; p < 0.05): at C = 1 ERM 0.85 vs IRM 0.72 has per-seed
  # differences 0.20, 0.08, 0.11 (paired p = 0.07; Welch's p would be 0.03): not bold; at
  # (4, 1) FedProx 0.66 vs FedAvg 0.65 (no); at (4, 0) IRM and FedProx tie at 0.47 (no).
  # Cells: mean ± sample standard deviation (n).
  from scipy import stats as sp
  assert sp.ttest_rel(TEST[("fedavg", 1, None)], TEST[("irm", 1, None)]).pvalue > 0.05
  lead = collect.leaders(t)
  assert lead[(1, None)][:2] == ("fedavg", "irm") and not lead[(1, None)][3]
  assert lead[(4, 1.0)][:2] == ("fedprox", "fedavg") and not lead[(4, 1.0)][3]
  assert lead[(4, 0.0)][:2] == ("irm", "fedprox") and not lead[(4, 0.0)][3]
  md = collect.to_markdown(t, digits=3).splitlines()
  sd = lambda k: f"{statistics.stdev(TEST[k]):.3f}"  # noqa: E731
  assert md[2] == (f"| B | FedAvg-ERM | 0.850 ± {sd(('fedavg', 1, None))} (n=3) | 0.650 ± {sd(('fedavg', 4, 1.0))} "
                   f"(n=3) | 0.420 ± {sd(('fedavg', 4, 0.0))} (n=3) |")
  assert md[3] == "| DG adapted | IRM | 0.720 ± 0.020 (n=3) | 0.540 ± 0.053 (n=3) | 0.470 ± 0.020 (n=3) |"
  assert md[4] == "| FL | FedProx | - | 0.660 ± 0.044 (n=3) | 0.470 ± 0.020 (n=3) |"
  tex = collect.to_latex(t, digits=2)
  assert "0.85 $\\pm$ 0.05 (n=3)" in tex and "\\textbf" not in tex and "\\textit" not in tex
  # ddof = 0 (numpy's default) is the population std.
  t0 = collect.build_table(s, exp, results, "table", "heldout_domain", "accuracy", ddof=0)
  assert t0.cells[("irm", (4, 1.0))].std == pytest.approx(statistics.pstdev(TEST[("irm", 4, 1.0)]), abs=1e-12)


def test_selection_rules_oracle_and_missing_seeds(tmp_path):
  s = sweep_config(tmp_path)
  exp = sweep_lib.expand(s)
  fill(exp)
  # Remove one seed of fedavg at (4, 1): the cell keeps the two others and says so.
  gone = next(e for e in exp.entries if (e.axes["method"], e.axes["num_clients"], e.axes["lam"], e.axes["seed"])
              == ("fedavg", 4, 1.0, 2))
  os.remove(os.path.join(exp.jobs[gone.key].workdir, "summary.json"))
  results = collect.load_results(exp)
  ind = collect.build_table(s, exp, results, "table", "in_domain", "accuracy", ddof=1)
  orc = collect.build_table(s, exp, results, "table", "oracle", "accuracy", ddof=1)
  vals = TEST[("irm", 4, 0.0)]
  # in-domain validation picks round 2 (test + 0.1); so does the oracle (the best test round).
  assert ind.cells[("irm", (4, 0.0))].mean == pytest.approx(sum(vals) / 3 + 0.1)
  assert orc.cells[("irm", (4, 0.0))].mean == pytest.approx(sum(vals) / 3 + 0.1)
  c = collect.build_table(s, exp, results, "table", "heldout_domain", "accuracy", ddof=1).cells[("fedavg", (4, 1.0))]
  assert c.values == (0.60, 0.70) and c.expected == 3
  assert collect.format_cell(c, 2) == "0.65 ± 0.07 (n=2/3)"  # the sample standard deviation, 0.0707
  assert collect.format_cell(collect.Cell(None, None, (), 3), 2) == "X"


def test_random_search_picks_the_best_validation_trial(tmp_path):
  s = sweep_config(tmp_path, methods=("fedavg",), client_counts=(4,), lams=(1.0,), seeds=(0, 1), num_trials=3)
  s.search.distributions = {"client": {"lr": ("log_uniform", 1e-3, 1e-1)}}
  exp = sweep_lib.expand(s)
  # (seed, trial) -> (held-out val, test); the selected trial is 2 for seed 0, 0 for seed 1 (a tie with
  # trial 1 goes to the lower index); the oracle picks the best test: trial 1 for seed 0, 1 for seed 1.
  table = {(0, 0): (0.5, 0.30), (0, 1): (0.6, 0.90), (0, 2): (0.7, 0.40),
           (1, 0): (0.8, 0.20), (1, 1): (0.8, 0.60), (1, 2): (0.1, 0.50)}
  for e in exp.entries:
    val, test = table[(e.axes["seed"], e.axes["trial"])]
    write_run(exp.jobs[e.key].workdir, {1: {"heldout_val": val, "in_val": val, "in_test": 0.5, "test": test}})
  results = collect.load_results(exp)
  c = collect.build_table(s, exp, results, "table", "heldout_domain", "accuracy", 1).cells[("fedavg", (4, 1.0))]
  assert c.values == (0.40, 0.20)
  o = collect.build_table(s, exp, results, "table", "oracle", "accuracy", 1).cells[("fedavg", (4, 1.0))]
  assert o.values == (0.90, 0.60)


def test_csv_has_one_row_per_job_with_rounds_and_bytes(tmp_path):
  s = sweep_config(tmp_path)
  exp = sweep_lib.expand(s)
  fill(exp)
  collect.collect(s, str(tmp_path / "out"), exp)
  rows = list(csv.DictReader(open(tmp_path / "out" / "jobs.csv")))
  assert len(rows) == len(exp.jobs) == 3 * 2 * 3 + 2 * 3  # 3 methods x 2 lambdas x 3 seeds + 2 centralised x 3
  r = next(r for r in rows if r["method"] == "irm" and r["num_clients"] == "4" and r["lam"] == "0.0"
           and r["seed"] == "1")
  assert r["state"] == "done" and r["heldout_domain_round"] == "1" and r["in_domain_round"] == "2"
  assert float(r["heldout_domain_test"]) == 0.47 and float(r["oracle_test"]) == pytest.approx(0.57)
  assert r["bytes_per_round"] == "100" and r["bytes_total"] == "200"  # 2 rounds
  md = open(tmp_path / "out" / "tables.md").read()
  assert "UPPER BOUND" in md and md.count("| group | method |") == 3


def difficulty_sweep(root):
  s = sweep_common.skeleton("difficulty", str(root))
  s.grids = ml_collections.ConfigDict({"difficulty": {"kind": "difficulty", "centralised": "erm", "federated": "fedavg",
                                                      "num_clients": 4, "lams": (1.0, 0.0), "seeds": (0, 1),
                                                      "fraction": 0.2}})
  return s


def test_r_dg_and_r_fl_equal_their_definitions(tmp_path):
  s = difficulty_sweep(tmp_path)
  exp = sweep_lib.expand(s)
  # role -> per seed (test, in_test) at the held-out-selected round (round 1; round 2 is worse on val).
  vals = {("dg_without", None): [(0.60, 0.9), (0.50, 0.9)], ("dg_with", None): [(0.80, 0.9), (0.75, 0.9)],
          ("fl_erm", None): [(0.55, 0.90), (0.52, 0.80)], ("fl_fedavg", 1.0): [(0.40, 0.81), (0.42, 0.76)],
          ("fl_fedavg", 0.0): [(0.30, 0.45), (0.33, 0.56)]}
  for e in exp.entries:
    test, in_test = vals[(e.axes["role"], e.axes["lam"])][e.axes["seed"]]
    write_run(exp.jobs[e.key].workdir, {1: {"heldout_val": 0.7, "in_val": 0.5, "in_test": in_test, "test": test},
                                        2: {"heldout_val": 0.1, "in_val": 0.9, "in_test": 0.0, "test": 0.0}})
  d = difficulty.compute(sweep_lib.grid_entries(exp, "difficulty"), collect.load_results(exp), ddof=1)
  # R_DG = ERM_Perf(train, S') / ERM_Perf(train + S'', S'), performances = means over seeds.
  assert d["R_DG"]["value"] == pytest.approx(((0.60 + 0.50) / 2) / ((0.80 + 0.75) / 2), abs=1e-12)
  assert d["R_DG"]["std"] == pytest.approx(statistics.stdev([0.60 / 0.80, 0.50 / 0.75]), abs=1e-12)
  # R_FL(lam) = FedAvg in-domain test / centralised ERM in-domain test.
  assert d["R_FL"]["1"]["value"] == pytest.approx(((0.81 + 0.76) / 2) / ((0.90 + 0.80) / 2), abs=1e-12)
  assert d["R_FL"]["0"]["value"] == pytest.approx(((0.45 + 0.56) / 2) / ((0.90 + 0.80) / 2), abs=1e-12)
  assert d["C"] == 4 and d["D"] == 4 and d["n"] == 60 + 4 * 10
  md = difficulty.to_markdown(d, "rotated_digits", 3)
  assert f"| {d['R_DG']['value']:.3f} ± {d['R_DG']['std']:.3f} |" in md and "R_FL(λ=0)" in md
  assert "FedAvg at C = 4 and centralised ERM at their default hyperparameters, 2 (seed, fold) pairs a ratio" in md
  # Ratios resting on different numbers of pairs (a run that did not finish) print the range.
  d["R_FL"]["0"]["n"] = 1
  assert "1-2 (seed, fold) pairs a ratio" in difficulty.to_markdown(d, "rotated_digits", 3)


def test_figure_csvs_hold_the_plotted_numbers(tmp_path):
  s = sweep_config(tmp_path)
  s.grids.rounds = {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.0,), "seeds": (0, 1, 2),
                    "schedules": ((4, 1), (2, 2))}
  s.figures.clients_grid, s.figures.rounds_grid, s.figures.curves_grid = "table", "rounds", "table"
  s.figures.per_run_grid, s.figures.per_run_methods, s.figures.per_run_seeds = "table", ("irm",), (0,)
  exp = sweep_lib.expand(s)
  fill(exp)
  pngs = figures.make_figures(s, str(tmp_path / "fig"), exp)
  names = sorted(os.path.relpath(p, tmp_path / "fig") for p in pngs)
  assert names == sorted(["fig2_clients.png", "fig3_rounds.png", "fig4_curves_C4.png", "fig4_heldout_val_C4.png"]
                         + [os.path.join("runs", figures.run_name(e.axes, e.key) + ".png") for e in exp.entries
                            if e.grid == "table" and e.axes["method"] == "irm" and e.axes["seed"] == 0])
  for p in pngs:
    assert os.path.getsize(p) > 5000
  rows = figures.read_rows(tmp_path / "fig" / "fig2_clients.csv")
  got = {(r["lam"], r["method"], r["num_clients"]): float(r["mean"]) for r in rows}
  assert got[("1.0", "irm", "4")] == pytest.approx(sum(TEST[("irm", 4, 1.0)]) / 3)
  assert got[("0.0", "fedavg", "1")] == got[("1.0", "fedavg", "1")] == pytest.approx(0.85)  # C = 1 in both panels
  assert ("1.0", "fedprox", "1") not in got
  curves = figures.read_rows(tmp_path / "fig" / "fig4_curves_C4.csv")
  r = next(r for r in curves if (r["lam"], r["method"], r["split"], r["round"]) == ("0.0", "irm", "test", "2"))
  assert float(r["mean"]) == pytest.approx(sum(TEST[("irm", 4, 0.0)]) / 3 + 0.1)


def test_report_generates_the_reading_from_the_numbers(tmp_path):
  """REPORT.md is generated whole, the reading too: remark 4.1's verdict per column comes
  from the paired t-test against FedAvg-ERM (FedProx 0.66 vs FedAvg 0.65 at C=4, lambda=1
  is inconclusive; at lambda=0 IRM and FedProx, 0.47, are above FedAvg's 0.42 with paired
  p ~ 0.049 each, which the column's Holm adjustment over its two comparisons doubles past
  0.05): no method is significantly above it anywhere. A column supports the remark when
  every method's one-sided paired test of "0.02 or more above the baseline" rejects at 0.05:
  at C = 1 IRM's does (0.72 against 0.85); at lambda = 1 FedProx's and at lambda = 0 both do
  not: the remark holds in part."""
  from fedjax_dg.bench import report
  s = sweep_config(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  fill(exp)
  out = tmp_path / "out"
  md = open(report.write_report(s, str(out), exp)).read()
  reading = md.split("## Reading", 1)[1]
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from test_report2 import non_superior_by_hand
  cols = {(1, None): ("irm",), (4, 1.0): ("irm", "fedprox"), (4, 0.0): ("irm", "fedprox")}
  assert {c: all(non_superior_by_hand(TEST[(m, *c)], TEST[("fedavg", *c)]) for m in ms) for c, ms in cols.items()} \
      == {(1, None): True, (4, 1.0): False, (4, 0.0): False}
  assert "strong baseline (in each column, no method above it by the margin or more: one-sided paired tests, the " \
         "intersection-union test; refuted by a method shown more than the margin above it): holds in part (1 column " \
         "with no method the margin or more above it, 2 columns with none shown more than the margin above it but " \
         "some possibly that far above of 3 testable)" in reading
  assert "C=4, λ=1: FedAvg-ERM 0.650 ± 0.050 (n=3); no method significantly above it; inconclusive: IRM, " \
         "FedProx; detectable" in reading
  from scipy import stats as sp
  p = sp.ttest_rel(TEST[("irm", 4, 0.0)], TEST[("fedavg", 4, 0.0)]).pvalue
  assert 0.025 < p < 0.05
  assert "C=4, λ=0: FedAvg-ERM 0.420 ± 0.020 (n=3); no method significantly above it; inconclusive: IRM, " \
         "FedProx; detectable" in reading
  assert "jobs: 24 (24 done)" in md  # 3 methods x (C=4 at two lambdas) x 3 seeds + 2 centralised x 3


def test_rows_equal_seed_for_seed_are_named_under_the_table():
  """IRM equals FedAvg-ERM at every seed in two columns (one domain per client: its penalty
  is off) and FedProx equals nobody: the note names exactly that pair and those columns; a
  cell of one seed or a mere equal mean is not called equal."""
  cols = ((1, None), (4, 1.0), (4, 0.0), (8, 0.0))
  rows = (("B", "fedavg", "FedAvg-ERM"), ("DG adapted", "irm", "IRM"), ("FL", "fedprox", "FedProx"))
  cell = lambda v: collect.Cell(sum(v) / len(v), 0.0, tuple(v), 3)  # noqa: E731
  cells = {("fedavg", (1, None)): cell([0.5, 0.6, 0.7]), ("irm", (1, None)): cell([0.7, 0.6, 0.5]),
           ("fedprox", (1, None)): None,
           ("fedavg", (4, 1.0)): cell([0.4]), ("irm", (4, 1.0)): cell([0.4]), ("fedprox", (4, 1.0)): cell([0.3]),
           ("fedavg", (4, 0.0)): cell([0.3, 0.35]), ("irm", (4, 0.0)): cell([0.3, 0.35]),
           ("fedprox", (4, 0.0)): cell([0.3, 0.36]),
           ("fedavg", (8, 0.0)): cell([0.2, 0.25, 0.3]), ("irm", (8, 0.0)): cell([0.2, 0.25, 0.3]),
           ("fedprox", (8, 0.0)): cell([0.25, 0.25, 0.25])}
  t = collect.Table(rows, cols, cells, "heldout_domain", "accuracy")
  assert collect.identical_cells(t) == [(("FedAvg-ERM", "IRM"), [(4, 0.0), (8, 0.0)])]
  assert collect.to_markdown(t).splitlines()[-1].endswith(": FedAvg-ERM = IRM in (C=4, λ=0), (C=8, λ=0).")
  del cells[("irm", (8, 0.0))], cells[("irm", (4, 0.0))]
  cells[("irm", (4, 0.0))] = cell([0.35, 0.3])
  cells[("irm", (8, 0.0))] = None
  assert collect.identical_cells(collect.Table(rows, cols, cells, "heldout_domain", "accuracy")) == []


def test_fig4_small_multiples_split_groups_and_drop_the_baseline_alone():
  from fedjax_dg.bench import figures
  groups = [("B", ["b"]), ("DG", ["b", "m1", "m2", "m3", "m4"]), ("FL", ["b", "f1"])]
  assert figures.small_multiples(groups, "b", per_panel=3) == [
      ("DG 1/2", ["b", "m1", "m2", "m3"]), ("DG 2/2", ["b", "m4"]), ("FL", ["b", "f1"])]
  assert figures.small_multiples([("B", ["b"])], "b") == [("B", ["b"])]  # the baseline alone: its own row
