"""Reports show activity: cells whose runs equal the baseline by construction or whose
method could not act print "-ᵃ" / "-ᵇ" with a footnote, are left out of the reading's tests,
and hyperparameters.md marks their values as having had no effect; and the in-domain table
takes its trial from in-domain validation. On synthetic runs that carry the runner's
`preflight` and `activity` summary fields."""
import json
import os
import sys

import ml_collections
import numpy as np
import pytest
from scipy import stats as scipy_stats

from fedjax_dg.bench import collect, report, results as results_lib, stats, sweep as sweep_lib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_report2 import TEST, fill, sweep_config, write_run  # noqa: E402


def _amend(workdir, **fields):
  path = os.path.join(workdir, "summary.json")
  summary = json.load(open(path))
  summary.update(fields)
  json.dump(summary, open(path, "w"))


def _mark_runs(exp, method, lam, **fields):
  for e in exp.entries:
    a = e.axes
    if a["method"] == method and a["num_clients"] == 4 and a["lam"] is not None and float(a["lam"]) == lam:
      _amend(exp.jobs[e.key].workdir, **fields)


EQUAL = {"level": "warning", "field": "algorithm.irm.penalty_weight", "equals_baseline": True,
         "message": "every client holds one domain: the penalty is 0 and IRM computes FedAvg's update"}
NEVER = {"level": "warning", "field": "algorithm.irm.anneal_steps", "equals_baseline": False, "inactive": True,
         "message": "the weight never reaches its target within the run's 2 local steps"}


def test_run_and_cell_marks_from_preflight_and_activity():
  run = lambda **sm: {"summary": sm}  # noqa: E731
  assert collect.run_mark(run()) == ("", "")
  assert collect.run_mark(run(preflight=[EQUAL]))[0] == collect.EQUALS_BASELINE
  assert collect.run_mark(run(preflight=[NEVER])) == (collect.INACTIVE, f"`{NEVER['field']}`: {NEVER['message']}")
  # A message that names its field already (as the preflight's own findings do) says it once.
  named = dict(NEVER, message=f"{NEVER['field']}: {NEVER['message']}")
  assert collect.run_mark(run(preflight=[named])) == (collect.INACTIVE, f"`{NEVER['field']}`: {NEVER['message']}")
  assert collect.run_mark(run(preflight=[], activity={"weight_at_target": 0.0}))[0] == collect.INACTIVE
  assert collect.run_mark(run(preflight=[], activity={"weight_at_target": 0.25}))[0] == ""
  # Equal to the baseline outranks inactive; the reason counts the runs.
  mark, reason = collect.cell_mark([run(preflight=[NEVER]), run(preflight=[EQUAL]), run()])
  assert mark == collect.EQUALS_BASELINE and reason.startswith("1 of 3 runs: `algorithm.irm.penalty_weight`")
  assert collect.cell_mark([run(), run()]) == ("", "")


def test_marked_cells_print_a_dash_with_a_footnote_and_leave_the_tests(tmp_path):
  s = sweep_config(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  fill(exp)
  # IRM at lambda = 0 (one domain a client) equals FedAvg by construction; at lambda = 1 its
  # schedule never reached the target. In the unmarked fixture IRM is significantly below
  # FedAvg-ERM at lambda = 1 (paired) and inconclusive at lambda = 0.
  _mark_runs(exp, "irm", 0.0, preflight=[EQUAL])
  _mark_runs(exp, "irm", 1.0, preflight=[NEVER], activity={"weight_at_target": 0.0})
  data = results_lib.from_runs(s, exp)
  t = collect.tables(data, "heldout_domain")
  md = collect.to_markdown(t)
  row = next(l for l in md.splitlines() if l.startswith("|  | IRM |") or l.startswith("| DG adapted | IRM |"))
  cells = [c.strip() for c in row.split("|")[1:-1]]
  assert cells[2:] == ["0.720 ± 0.020 (n=3)", "-ᵇ", "0.410 ± 0.010 (n=3)", "-ᵃ"]
  assert ("-ᵃ: the cell's runs compute the baseline's update by construction" in md
          and "IRM (C=4, λ=0) 3 of 3 runs: `algorithm.irm.penalty_weight`: every client holds one domain" in md)
  assert "-ᵇ: the cell's runs ran a method whose own term could not act" in md and "IRM (C=4, λ=1) 3 of 3 runs" in md
  tex = collect.to_latex(t, caption="x")
  assert "-$^a$" in tex and "-$^b$" in tex and "ᵃ" not in tex
  # Remark 4.1: IRM is not among a marked column's comparisons, only named as left out;
  # FedIIR alone is tested there.
  _, lines = report.remark_4_1(t, "fedavg", collect.display_names(s))
  line1 = next(l for l in lines if l.startswith("C=4, λ=1:"))
  left1 = "; left out, marked in the table: IRM (-ᵇ, its own term did not act); "
  assert left1 in line1 and "IRM" not in line1.replace(left1, "") and "significantly above it: FedIIR" in line1
  assert "level 0.05/1" in line1  # a family of one: the marked cell is not counted
  line0 = next(l for l in lines if l.startswith("C=4, λ=0:"))
  left0 = "; left out, marked in the table: IRM (-ᵃ, its runs compute the baseline's update by construction); "
  # IRM at lambda = 0 is a negative control there: tested against the baseline alone (a family
  # of one, so Holm p = p), apart from the column's methods; SciPy's paired t-test by hand.
  irm, base = t.cells[("irm", (4, 0.0))], t.cells[("fedavg", (4, 0.0))]
  seeds = sorted(set(irm.by_seed) & set(base.by_seed))
  a, b = [irm.by_seed[k] for k in seeds], [base.by_seed[k] for k in seeds]
  p = scipy_stats.ttest_rel(a, b).pvalue
  word = "above" if p < 0.05 and np.mean(a) > np.mean(b) else "below" if p < 0.05 else None
  control = ("; negative controls, the -ᵃ cells: the baseline's update at their own search's winner (paired, Holm "
             f"over them): IRM {np.mean(np.subtract(a, b)):+.3f} {word} (Holm p = {p:.3f})")
  assert word is not None and control in line0
  assert left0 in line0 and "IRM" not in line0.replace(left0, "").replace(control, "")
  assert "equivalent within ±0.02: FedIIR" in line0
  # The controls' paragraph names how far the baseline's selection moved its cell.
  paras = report.negative_control_lines(t, "fedavg", collect.display_names(s))
  assert len(paras) == 1 and paras[0].startswith(f"Negative controls, C=4, λ=0: IRM {np.mean(np.subtract(a, b)):+.3f} "
                                                 f"(1 of 1 cells that compute FedAvg-ERM's update by construction")
  # The pooled baseline: the per-seed mean of FedAvg-ERM and IRM (its control) at lambda = 0,
  # and FedIIR, the column's one method, against it: SciPy's paired t-test (a family of one).
  pooled = {k: (irm.by_seed[k] + base.by_seed[k]) / 2 for k in seeds}
  fediir = t.cells[("fediir", (4, 0.0))].by_seed
  common = sorted(set(fediir) & set(pooled))
  d = [fediir[k] - pooled[k] for k in common]
  p_pool = scipy_stats.ttest_rel([fediir[k] for k in common], [pooled[k] for k in common]).pvalue
  pooled_paras = report.pooled_baseline_lines(t, "fedavg", collect.display_names(s))
  assert len(pooled_paras) == 1 and pooled_paras[0].startswith(
      "Pooled baseline, C=4, λ=0: the per-seed mean of FedAvg-ERM's cell and its 1 negative control (IRM; 2 "
      f"replicates of FedAvg-ERM's protocol, each at its own search's winner), {np.mean(list(pooled.values())):.3f} ± "
      f"{np.std(list(pooled.values()), ddof=1):.3f} (n={len(pooled)})")
  word = ("significantly above it" if np.mean(d) > 0 else "significantly below it") if p_pool < 0.05 else None
  assert word is not None and f"{word}: FedIIR {np.mean(d):+.3f} (Holm p = {p_pool:.3f})" in pooled_paras[0]
  assert report.pooled_baseline(t, "fedavg", (4, 1.0)) is None  # no control at lambda = 1
  # The paired test FedIIR would have had in a family of two is now alone (Holm p = p).
  res = stats.against_baseline([(t.cells[("fediir", (4, 1.0))].by_seed, t.cells[("fedavg", (4, 1.0))].by_seed)])
  assert f"Holm p = {res[0]['test']['p']:.3f}" in line1
  # Remark 4.2 (lambda 1 vs 0.1) had IRM's one comparison; now none is testable.
  v, lines = report.remark_4_2_lambda(t, ["irm"], collect.display_names(s))
  assert v == "cannot tell" and lines == []
  # Bold never goes to a marked cell: at lambda = 0, IRM (0.47) led FedAvg (0.42) before.
  assert collect.leaders(t)[(4, 0.0)][0] != "irm"
  # A marked cell is not "equal seed for seed" with the baseline in the notes either.
  assert not any("IRM" in labels for labels, _ in collect.identical_cells(t))


def test_hyperparameters_mark_values_without_effect(tmp_path):
  s = sweep_config(tmp_path / "runs", methods=("fedavg", "irm"), client_counts=(4,), lams=(0.0,), seeds=(0,),
                   num_trials=2)
  s.search.distributions = {"client": {"lr": ("log_uniform", 1e-3, 1e-1)}}
  s.grids.seeds = {"methods": ("fedavg", "irm"), "client_counts": (4,), "lams": (0.0,), "seeds": (1, 2),
                   "select_from": "table"}
  s.table.grid = "seeds"
  exp = sweep_lib.expand(s)
  for e in exp.entries:
    write_run(exp.jobs[e.key].workdir, {1: {"heldout_val": (0.5, 0.7)[e.axes["trial"]], "in_val": 0.3,
                                            "in_test": 0.9, "test": 0.4}})
  exp2 = sweep_lib.expand(s)
  fill(exp2, {("fedavg", 4, 0.0): (0.5, 0.6, 0.7), ("irm", 4, 0.0): (0.5, 0.6, 0.7)},
       keys={e.key for e in exp2.entries if e.grid == "seeds"})
  for e in exp2.entries:
    if e.grid == "seeds" and e.axes["method"] == "irm":
      _amend(exp2.jobs[e.key].workdir, preflight=[EQUAL])
  hp = report.selected_hyperparameters(results_lib.from_runs(s, exp2), "seeds", collect.display_names(s))
  fedavg, irm = hp.splitlines()[2:4]
  assert "no effect" not in fedavg
  assert irm.startswith("| IRM | C=4, λ=0 | 1 | `client.lr` ")
  assert irm.endswith("— no effectᵃ: the runs compute the baseline's update by construction (2 of 2 runs: "
                      "`algorithm.irm.penalty_weight`: every client holds one domain: the penalty is 0 and IRM "
                      "computes FedAvg's update) |")


def test_the_in_domain_table_takes_its_trial_from_in_domain_validation(tmp_path):
  """A search of three trials where the held-out domain prefers trial 1 and in-domain
  validation trial 2: the held-out table's seeds run at trial 1, the in-domain table's (grid
  `table_in`) at trial 2, and its cell is the mean of those runs' test scores."""
  s = sweep_config(tmp_path / "runs", methods=("fedavg",), client_counts=(4,), lams=(1.0,), seeds=(0,),
                   num_trials=3)
  s.search.distributions = {"client": {"lr": ("log_uniform", 1e-3, 1e-1)}}
  s.grids.search = s.grids.table.to_dict()
  s.grids.table = {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.0,), "seeds": (1, 2),
                   "select_from": "search", "select_rule": "heldout_domain"}
  s.grids.table_in = {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.0,), "seeds": (1, 2),
                      "select_from": "search", "select_rule": "in_domain"}
  s.table = ml_collections.ConfigDict({**s.table.to_dict(), "in_domain_grid": "table_in"})
  exp = sweep_lib.expand(s)
  for e in sweep_lib.grid_entries(exp, "search"):
    t = e.axes["trial"]
    write_run(exp.jobs[e.key].workdir, {1: {"heldout_val": (0.5, 0.7, 0.6)[t], "in_val": (0.3, 0.4, 0.9)[t],
                                            "in_test": 0.9, "test": 0.1}})
  exp2 = sweep_lib.expand(s)
  trials = {g: {e.axes["trial"] for e in sweep_lib.grid_entries(exp2, g)} for g in ("table", "table_in")}
  assert trials == {"table": {1}, "table_in": {2}}
  for g in ("table", "table_in"):
    for e in sweep_lib.grid_entries(exp2, g):
      v = {1: 0.40, 2: 0.80}[e.axes["trial"]] + 0.01 * e.axes["seed"]
      write_run(exp2.jobs[e.key].workdir, {1: {"heldout_val": 0.5, "in_val": 0.5, "in_test": 0.9, "test": v}})
  data = results_lib.from_runs(s, exp2)
  held, ind = (collect.tables(data, rule).cells[("fedavg", (4, 1.0))] for rule in ("heldout_domain", "in_domain"))
  assert held.values == pytest.approx((0.41, 0.42)) and ind.values == pytest.approx((0.81, 0.82))
  assert np.isclose(ind.mean, 0.815)
  st = collect.report_settings(s)
  assert any("in-domain validation chose (grid `table_in`, 2 seeds per cell; no remark reads it)" in l
             for l in report.deviations(data, st))
  # Each table's winners are listed: every in-domain cell ran at trial 2, every held-out one at 1.
  n_cells = len({(e.axes["method"], e.axes["num_clients"], e.axes["lam"]) for e in sweep_lib.grid_entries(exp2, "table")})
  assert report.other_winners(data, "table", "table_in") == (n_cells, n_cells)
  rows = report.selected_hyperparameters(data, "table_in", {}).splitlines()[2:]
  assert len(rows) == n_cells and all(r.split(" | ")[2] == "2" for r in rows)


def test_fig4_draws_no_line_for_a_marked_cell(tmp_path):
  """IRM at lambda = 0 equals FedAvg by construction: Fig. 4's rows at C = 4 keep IRM's
  lambda = 1 line and FedIIR's lines and drop IRM's lambda = 0 line (its runs are FedAvg's
  training under IRM's name)."""
  from fedjax_dg.bench import figures
  s = sweep_config(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  fill(exp)
  before = {(r["lam"], r["method"]) for r in figures.curve_rows(exp, results_lib.from_runs(s, exp).results, "table",
                                                               4, "heldout_domain", "accuracy")}
  assert ("0", "irm") in {(f"{lam:g}", m) for lam, m in before}
  _mark_runs(exp, "irm", 0.0, preflight=[EQUAL])
  after = {(r["lam"], r["method"]) for r in figures.curve_rows(exp, results_lib.from_runs(s, exp).results, "table",
                                                              4, "heldout_domain", "accuracy")}
  assert before - after == {(0.0, "irm")} and (1.0, "irm") in after and (0.0, "fediir") in after


def test_fig4_draws_a_staged_method_at_its_final_stage_by_local_steps(tmp_path, monkeypatch):
  """A method selected within its final stage (FedLOE) is drawn at that stage's evaluations
  only, placed at the local steps taken in rounds of K steps: its first stage (3 rounds of
  5 steps) is not drawn, its 4 final-stage rounds share the rest of the 10 x K budget
  equally, so the last sits at round 10."""
  import math

  from fedjax_dg import plan
  from fedjax_dg.bench import figures
  s = sweep_config(tmp_path / "runs", methods=("fedavg", "fediir"), client_counts=(4,), lams=(1.0,), seeds=(0, 1))
  s.base.num_rounds = 10
  exp = sweep_lib.expand(s)
  sizes = [37, 50, 12, 50]
  for e in exp.entries:
    staged = e.axes["method"] == "fediir"
    rounds = range(1, 8) if staged else range(1, 11)
    acc = {t: {"heldout_val": 0.1 * t / 10 + 0.01 * e.axes["seed"], "in_val": 0.5, "in_test": 0.5,
               "test": 0.2 + 0.05 * t + 0.01 * e.axes["seed"]} for t in rounds}
    write_run(exp.jobs[e.key].workdir, acc)
    if staged:
      _amend(exp.jobs[e.key].workdir, selection_scope="rounds of the final stage (stage 2)", local_steps=5,
             client_sizes=sizes, stages=[{"name": "stage 1", "rounds": [1, 3]}, {"name": "stage 2", "rounds": [4, 7]}])
  results = results_lib.from_runs(s, exp).results
  rows = [r for r in figures.curve_rows(exp, results, "table", 4, "heldout_domain", "accuracy") if r["split"] == "test"]
  K = plan.local_steps(exp.jobs[exp.entries[0].key].config.client, max(sizes))
  assert K == math.ceil(float(s.base.client.local_epochs) * 50 / int(s.base.client.batch_size))
  per = (10 * K - 15) / 4
  staged = [r for r in rows if r["method"] == "fediir"]
  assert [r["round"] for r in staged] == pytest.approx([(15 + j * per) / K for j in (1, 2, 3, 4)])
  assert staged[-1]["round"] == pytest.approx(10.0) and all(r["staged"] for r in staged)
  # stage 2's rounds 4-7: test 0.4 .. 0.55, mean over seeds 0 and 1 (+0.005)
  assert [r["mean"] for r in staged] == pytest.approx([0.405, 0.455, 0.505, 0.555])
  # The spread over the two seeds (0.01 apart) with the report's std_ddof: 0.00707 at
  # ddof 1 (the default, Bai et al.'s), 0.005 at ddof 0.
  assert [r["std"] for r in staged] == pytest.approx([0.01 / math.sqrt(2)] * 4)
  pop = [r for r in figures.curve_rows(exp, results, "table", 4, "heldout_domain", "accuracy", ddof=0)
         if r["split"] == "test" and r["method"] == "fediir"]
  assert [r["std"] for r in pop] == pytest.approx([0.005] * 4)
  plain = [r for r in rows if r["method"] == "fedavg"]
  assert [r["round"] for r in plain] == list(range(1, 11)) and not any(r["staged"] for r in plain)
  drawn = []  # what each line is drawn with: its label, x values and marker
  real_line = figures._line  # pylint: disable=protected-access

  def line(ax, xs, ys, sds, label, st, band=True):
    drawn.append((label, list(xs), st["marker"]))
    real_line(ax, xs, ys, sds, label, st, band)
  monkeypatch.setattr(figures, "_line", line)
  figures.plot_curves(rows, str(tmp_path / "fig4.png"), "accuracy", 4, "test", [("all", ["fedavg", "fediir"])],
                      {"fediir": "FedIIR"}, {}, "fedavg")
  assert (tmp_path / "fig4.png").stat().st_size > 0
  by_label = {label: (xs, marker) for label, xs, marker in drawn}
  assert by_label["FedIIR (final stage)"][0] == pytest.approx([(15 + j * per) / K for j in (1, 2, 3, 4)])
  assert by_label["FedIIR (final stage)"][1] is not None and by_label["fedavg"][1] is None
  cap = report.figure_caption("fig4_curves_C4.png", s, "accuracy", ("FedIIR",))
  assert "FedIIR trains in stages: drawn at the final stage's evaluations only" in cap
  assert "in stages" not in report.figure_caption("fig4_curves_C4.png", s, "accuracy")
  assert report.staged_methods(results_lib.from_runs(s, exp), "table") == ["fediir"]


def test_a_final_stage_past_the_budget_follows_the_last_round():
  """A first stage that kept the run's whole schedule (60 rounds of K = 5 steps) leaves its
  final stage's 4 rounds past the budget: they sit at rounds 61-64, not piled on round 60."""
  from fedjax_dg.bench import figures
  config = ml_collections.ConfigDict({"num_rounds": 60, "client": {"local_steps": 0, "local_epochs": 1,
                                                                   "batch_size": 64}})
  run = {"summary": {"selection_scope": "rounds of the final stage (stage 2)", "local_steps": 5,
                     "client_sizes": [288, 100], "stages": [{"name": "stage 1", "rounds": [1, 60]},
                                                           {"name": "stage 2", "rounds": [61, 64]}]}}
  assert figures.final_stage_positions(run, config) == {61: 61.0, 62: 62.0, 63: 63.0, 64: 64.0}
  run["summary"]["stages"][0]["rounds"] = [1, 8]  # 8 rounds of 5 steps: 260 of the 300 left, 65 a round
  run["summary"]["stages"][1]["rounds"] = [9, 12]
  assert figures.final_stage_positions(run, config) == pytest.approx({9: 21.0, 10: 34.0, 11: 47.0, 12: 60.0})
  run["summary"]["selection_scope"] = "all rounds"
  assert figures.final_stage_positions(run, config) is None


def test_a_method_papers_claim_names_its_marked_columns_as_not_tested(tmp_path):
  """FedIIR's claim ("beats FedAvg-ERM") is tested in its unmarked federated columns only; a
  column where its cell is marked reads "not tested" with the mark and its reason, and is
  not counted in the verdict."""
  s = sweep_config(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  fill(exp)
  _mark_runs(exp, "fediir", 0.0, preflight=[{**NEVER, "field": "algorithm.fediir.gamma"}])
  t = collect.tables(results_lib.from_runs(s, exp), "heldout_domain")
  claims = {m: (v, lines) for m, _, v, lines in report.seed_paper_claims(t, "fedavg", collect.display_names(s))}
  v, lines = claims["fediir"]
  assert lines[-1] == "C=4, λ=0: not tested; left out, marked in the table: FedIIR (-ᵇ, its own term did not act)"
  tested = [l for l in lines if "not tested" not in l]
  assert [l.split(":", 1)[0] for l in tested] == ["C=4, λ=1", "C=4, λ=0.1"]
  assert v.endswith("of 2 testable)")


def test_fig4_legend_names_the_lines_drawn_in_its_row(tmp_path, monkeypatch):
  """A group's legend lists each method drawn in any of its row's panels once, and no method
  drawn in none (a cell marked or not run has no line): here FedIIR only at λ = 1, FedProx
  nowhere."""
  from fedjax_dg.bench import figures
  rows = [{"split": "test", "lam": lam, "method": m, "round": r, "mean": 0.5, "std": 0.01, "staged": False}
          for lam in (1.0, 0.0) for m in ("fedavg", "fediir") for r in (1, 2)
          if not (m == "fediir" and lam == 0.0)]
  figs = []
  monkeypatch.setattr(figures, "save", lambda fig, path, dpi=120: figs.append(fig))
  plt = figures._plt()  # pylint: disable=protected-access
  monkeypatch.setattr(plt, "close", lambda fig: None)
  figures.plot_curves(rows, str(tmp_path / "fig4.png"), "accuracy", 4, "test",
                      [("all", ["fedavg", "fediir", "fedprox"])], {"fediir": "FedIIR", "fedprox": "FedProx"}, {},
                      "fedavg")
  last = figs[0].axes[1]  # the row's last panel (λ = 0), where FedIIR has no line
  assert [t.get_text() for t in last.get_legend().get_texts()] == ["fedavg", "FedIIR"]
  assert [l.get_label() for l in last.get_lines()] == ["fedavg"]
