"""The benchmark report's second edition: source fingerprints and stale jobs, the results file
and byte-identical regeneration, significance (Welch) in tables and in the generated reading,
the two-phase search-then-seeds sweep, the fixed-steps Fig. 2 grid and figure naming."""
import gzip
import json
import math
import os
import shutil
import statistics
import sys

import ml_collections
import numpy as np
import pytest

from fedjax_dg import provenance
from fedjax_dg.bench import collect, figures, launch, report, results as results_lib, stats, sweep as sweep_lib
from fedjax_dg.bench import jobs as jobs_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from fedjax_dg.bench import sweep_helpers as sweep_common  # noqa: E402


def write_run(workdir, rounds: dict, fingerprint=None, num_rounds=None):
  """A finished run: `rounds[t] = {split: accuracy}`, selections as the runner writes them,
  recording `fingerprint` (default: the current code's) as its source."""
  os.makedirs(workdir, exist_ok=True)
  recs = [{"round": t, "train_loss": 0.0, "splits": {k: {"accuracy": v, "n": 10} for k, v in sp.items()}}
          for t, sp in sorted(rounds.items())]
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in recs)
  sel = {}
  for rule, split in (("heldout_domain", "heldout_val"), ("in_domain", "in_val")):
    best = max(recs, key=lambda r: (r["splits"][split]["accuracy"], -r["round"]))
    sel[rule] = {"round": best["round"], "val": best["splits"][split], "test": best["splits"]["test"]}
  fp = fingerprint or provenance.source_fingerprint()["sha256"]
  summary = {"selection": sel, "wall_time_s": 1.5, "final": recs[-1], "client_sizes": [30, 30],
             "domains": {"names": ["a", "b", "c", "d"]}, "backend": "cpu", "devices": 1,
             "provenance": {"source": {"sha256": fp, "files": 1}, "git": {"commit": "abc", "dirty": False}},
             "communication": {"bytes_per_round": 100, "setup_bytes": 0}}
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f)


# Held-out-selected test accuracy per (method, C, lam), one value per seed 0, 1, 2.
TEST = {("fedavg", 1, None): (0.90, 0.80, 0.85), ("irm", 1, None): (0.70, 0.72, 0.74),
        ("fedavg", 4, 1.0): (0.60, 0.62, 0.61), ("irm", 4, 1.0): (0.50, 0.52, 0.51),
        ("fediir", 4, 1.0): (0.70, 0.71, 0.72),
        ("fedavg", 4, 0.1): (0.58, 0.63, 0.60), ("irm", 4, 0.1): (0.40, 0.41, 0.42),
        ("fediir", 4, 0.1): (0.59, 0.61, 0.66),
        ("fedavg", 4, 0.0): (0.40, 0.44, 0.42), ("irm", 4, 0.0): (0.45, 0.47, 0.49),
        ("fediir", 4, 0.0): (0.40, 0.44, 0.42)}


def sweep_config(root, **grid):
  s = sweep_common.skeleton("fixture", str(root))
  s.base.num_rounds = 2
  g = {"methods": ("fedavg", "irm", "fediir"), "client_counts": (1, 4), "lams": (0.0, 1.0, 0.1), "seeds": (0, 1, 2),
       "num_trials": 0}
  g.update(grid)
  s.grids = ml_collections.ConfigDict({"table": g})
  s.figures.curves_grid = "table"
  return s


def fill(exp, test=TEST, fingerprint=None, keys=None):
  """Round 1: held-out val 0.5, test = the table value; round 2: val 0.4, test = value + 0.1."""
  for e in exp.entries:
    if keys is not None and e.key not in keys:
      continue
    a = e.axes
    lam = None if a["lam"] is None else float(a["lam"])
    v = test[(a["method"], a["num_clients"], lam)][a["seed"]]
    write_run(exp.jobs[e.key].workdir, {1: {"heldout_val": 0.5, "in_val": 0.3, "in_test": 0.9, "test": v},
                                        2: {"heldout_val": 0.4, "in_val": 0.6, "in_test": 0.8, "test": v + 0.1}},
              fingerprint)


def tree_bytes(folder) -> dict:
  out = {}
  for dirpath, _, files in os.walk(folder):
    for f in files:
      p = os.path.join(dirpath, f)
      out[os.path.relpath(p, folder)] = open(p, "rb").read()
  return out


def mdd_by_hand(se, df, alpha, power=0.8):
  """The difference a two-sided t-test at level alpha detects with probability `power`: the
  noncentrality at which the noncentral t (SciPy) passes the critical value that often,
  times the standard error (the far tail's NaN, where SciPy underflows, counted as 0)."""
  from scipy import optimize, stats as sp
  crit = sp.t.ppf(1 - alpha / 2, df)
  pw = lambda x: sp.nct.sf(crit, df, x) + np.nan_to_num(sp.nct.cdf(-crit, df, x))  # noqa: E731
  hi = crit + 1.0
  while pw(hi) < power:
    hi *= 2
  return optimize.brentq(lambda x: pw(x) - power, crit, hi) * se


# ---------------------------------------------------------------------------- staleness

def test_fingerprint_changes_with_the_code_of_a_numeric_module_only(tmp_path):
  """The fingerprint hashes the parsed code: a comment, a docstring or a line break in the
  engine leaves it unchanged, one statement changes it; the readers, the launcher and the
  preparation tool never enter it; caches and other files neither."""
  pkg = tmp_path / "fedjax_dg"
  shutil.copytree(provenance.package_dir(), pkg, ignore=shutil.ignore_patterns("__pycache__"))
  a = provenance.fingerprint_of(str(pkg))
  assert a == provenance.fingerprint_of(str(pkg))  # deterministic
  assert a["sha256"] == provenance.source_fingerprint()["sha256"]  # the copy is the code this process runs
  (pkg / "__pycache__").mkdir(exist_ok=True)
  (pkg / "__pycache__" / "x.py").write_text("junk\n")
  (pkg / "notes.txt").write_text("not source\n")
  assert provenance.fingerprint_of(str(pkg)) == a
  path = pkg / "engine" / "round.py"
  text = path.read_text()
  assert text.startswith('"""')
  path.write_text('"""A different module docstring."""\n# a comment\n\n' + text.split('"""', 2)[2] + "# one more\n")
  assert provenance.fingerprint_of(str(pkg)) == a
  path.write_text(text + "_ONE_MORE_STATEMENT = 1\n")
  b = provenance.fingerprint_of(str(pkg))
  assert b["sha256"] != a["sha256"] and b["files"] == a["files"]
  outside = ("bench/report.py", "bench/launch.py", "bench/sweep.py", "data/prepare.py")  # not what decides the numbers
  for rel in outside:  # all changed, one fingerprint: it would differ if any of them entered it
    path = pkg / rel
    path.write_text(path.read_text() + "_ONE_MORE_STATEMENT = 1\n")
  assert provenance.fingerprint_of(str(pkg)) == b, [rel for rel in outside if rel not in provenance.NOT_NUMERIC]
  path = pkg / "algorithms" / "fediir.py"
  path.write_text(path.read_text().replace("def ", "def _renamed_helper():\n  return 0\n\n\ndef ", 1))
  assert provenance.fingerprint_of(str(pkg))["sha256"] != b["sha256"]


def test_code_of_drops_docstrings_and_comments_but_not_strings_that_do_work():
  one = 'def f(x):\n  """Doc."""\n  return x + 1  # add\n'
  two = "def f(x):\n\n  return (x +\n          1)\n"
  assert provenance.code_of(one) == provenance.code_of(two)
  assert provenance.code_of(one) != provenance.code_of("def f(x):\n  return x + 2\n")
  assert provenance.code_of('X = "a string value"\n') != provenance.code_of('X = "another"\n')


def test_determinism_records_cpu_features_threads_and_xla_flags():
  info = ("processor\t: 0\nmodel name\t: Some CPU 9000\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f\n\n"
          "processor\t: 1\nmodel name\t: Some CPU 9000\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f\n")
  c = provenance.cpu_features(info)
  assert c["model"] == "Some CPU 9000" and c["simd"] == ["sse4_2", "avx", "avx2", "fma", "avx512f"]
  import hashlib
  assert c["flags_sha256"] == hashlib.sha256(b"avx avx2 avx512f fma fpu sse4_2").hexdigest()
  d = provenance.determinism({"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false", "OMP_NUM_THREADS": "1",
                              "HOME": "/root"})
  assert d["env"] == {"OMP_NUM_THREADS": "1", "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}
  assert d["usable_cores"] >= 1 and d["python"].count(".") == 2
  assert "determinism" in provenance.provenance()


def test_runner_records_fingerprint_and_git_state():
  p = provenance.provenance()
  assert p["source"] == provenance.source_fingerprint() and len(p["source"]["sha256"]) == 64
  assert set(p["git"]) == {"commit", "dirty", "package_clean"}


def test_status_lists_stale_jobs_and_collect_refuses_them(tmp_path, monkeypatch):
  s = sweep_config(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  fill(exp)
  rows = launch.status(exp)
  assert {r["state"] for r in rows} == {"done"}
  # One source line changes: the current fingerprint is no longer the one the runs recorded.
  now = dict(provenance.source_fingerprint(), sha256="0" * 64)
  monkeypatch.setattr(provenance, "source_fingerprint", lambda algorithm=None: now)
  rows = launch.status(exp)
  assert {r["state"] for r in rows} == {"stale"}
  assert launch.status_text(rows).startswith("0 done, 0 running, 0 failed, 0 interrupted, 0 pending, 33 stale")
  with pytest.raises(results_lib.StaleError) as e:
    collect.collect(s, str(tmp_path / "out"))
  assert len(str(e.value).splitlines()) == 1 and "--allow-stale" in str(e.value)
  with pytest.raises(results_lib.StaleError):
    report.write_report(s, str(tmp_path / "out"))
  texts = collect.collect(s, str(tmp_path / "out"), allow_stale=True)
  md = texts["table_heldout_domain"]
  assert md.count("†") == 11 + 1  # every cell, and the footnote
  assert "†: at least one of the cell's runs ran under other code" in md
  tex = open(tmp_path / "out" / "tables.tex").read()
  assert "$^\\dagger$" in tex


def test_old_runs_without_fingerprint_are_stale(tmp_path):
  s = sweep_config(tmp_path / "runs", methods=("fedavg",), client_counts=(4,), lams=(1.0,))
  exp = sweep_lib.expand(s)
  fill(exp)
  key = next(iter(exp.jobs))
  p = os.path.join(exp.jobs[key].workdir, "summary.json")
  sm = json.load(open(p))
  del sm["provenance"]
  json.dump(sm, open(p, "w"))
  states = {r["key"]: r["state"] for r in launch.status(exp)}
  assert states[key] == "stale" and sum(v == "stale" for v in states.values()) == 1


# ---------------------------------------------------------------------------- the results file

def test_report_regenerates_byte_for_byte_from_the_results_file(tmp_path):
  s = sweep_config(tmp_path / "runs", lams=(1.0, 0.0))  # two columns of curves: the report is drawn three times
  s.grids.clients = {"methods": ("fedavg", "irm"), "client_counts": (1, 4), "lams": (1.0, 0.1, 0.0),
                     "seeds": (0, 1, 2)}
  s.figures.clients_grid = "clients"
  s.figures.per_run_grid, s.figures.per_run_methods, s.figures.per_run_seeds = "table", ("fedavg",), (0,)
  exp = sweep_lib.expand(s)
  fill(exp)
  a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
  report.write_report(s, str(a), sweep_arg="fixture.py")
  path = str(a / collect.RESULTS_FILE)
  shutil.rmtree(tmp_path / "runs")  # the file alone
  for out in (b, c):
    report.write_report(None, str(out), data=results_lib.read(path))
  ta, tb, tc = tree_bytes(a), tree_bytes(b), tree_bytes(c)
  assert tb == tc
  del ta[collect.RESULTS_FILE]
  assert ta == tb  # from the runs or from the file: the same report
  assert {"REPORT.md", "tables.md", "tables.tex", "jobs.csv", "figures/fig2_clients.png",
          "figures/fig4_curves_C4.png", "figures/fig4_heldout_val_C4.png",
          "figures/runs/fedavg_C4_lam1_seed0_trial0_" + next(e.key for e in exp.entries if e.grid == "table" and
                                                              e.axes["lam"] == 1.0 and e.axes["method"] == "fedavg"
                                                              and e.axes["seed"] == 0)[:8] + ".png"} <= set(tb)
  assert b"Software" not in tb["figures/fig2_clients.png"]  # no version or date metadata
  assert "--sweep fixture.py" in tb["REPORT.md"].decode()
  with gzip.open(path, "rb") as f:
    assert f.read().count(b"\n") == 1 + len(exp.jobs)
  assert open(path, "rb").read()[4:8] == b"\0\0\0\0"  # gzip header mtime 0


def test_cells_recomputed_independently_from_the_results_file(tmp_path):
  """Every held-out-domain cell of tables.md, from the results file read with gzip and json
  only: each seed's score is the test accuracy at the round its summary's held-out selection
  names, a cell is mean ± stdev over seeds (the sample standard deviation, as Bai et al.)."""
  s = sweep_config(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  fill(exp)
  texts = collect.collect(s, str(tmp_path / "out"))
  with gzip.open(tmp_path / "out" / collect.RESULTS_FILE, "rt") as f:
    docs = [json.loads(l) for l in f]
  assert docs[0]["kind"] == "header" and docs[0]["sweep"]["name"] == "fixture"
  per_cell = {}
  for d in docs[1:]:
    ax = d["entries"][0]["axes"]
    r = d["summary"]["selection"]["heldout_domain"]["round"]
    test = next(rec["splits"]["test"]["accuracy"] for rec in d["records"] if rec["round"] == r)
    per_cell.setdefault((ax["method"], ax["num_clients"], ax["lam"]), {})[ax["seed"]] = test
  lines = texts["table_heldout_domain"].splitlines()
  header = [h.strip() for h in lines[0].split("|")[3:-1]]
  assert header == ["C=1 (centralised)", "C=4, λ=1", "C=4, λ=0.1", "C=4, λ=0"]  # lambda 1, 0.1, 0
  cols = [(1, None), (4, 1.0), (4, 0.1), (4, 0.0)]
  names = {"FedAvg-ERM": "fedavg", "IRM": "irm", "FedIIR": "fediir"}
  checked = 0
  for line in lines[2:5]:
    parts = [p.strip().strip("*") for p in line.split("|")[1:-1]]
    m = names[parts[1]]
    for (C, lam), text in zip(cols, parts[2:]):
      vals = per_cell.get((m, C, lam))
      if vals is None:
        assert text == "-"
        continue
      v = [vals[k] for k in sorted(vals)]
      want = f"{statistics.mean(v):.3f} ± {statistics.stdev(v):.3f} (n={len(v)})"
      assert text == want
      checked += 1
  assert checked == 11


def test_results_file_read_errors_are_one_line(tmp_path):
  p = tmp_path / "x.jsonl.gz"
  p.write_bytes(b"not gzip")
  with pytest.raises(sweep_lib.SweepError) as e:
    results_lib.read(str(p))
  assert "not a results file" in str(e.value) and len(str(e.value).splitlines()) == 1


# ---------------------------------------------------------------------------- significance

def test_welch_against_closed_forms():
  # Two cells of two seeds with equal variances: Welch's df is exactly 2, where Student's t
  # has the closed-form CDF F(t) = 1/2 + t / (2 sqrt(2 + t^2)).
  a, b = [1.0, 3.0], [0.0, 0.0 + 2.0]
  b = [x - 1.5 for x in b]
  w = stats.welch(a, b)
  t = (np.mean(a) - np.mean(b)) / math.sqrt(np.var(a, ddof=1) / 2 + np.var(b, ddof=1) / 2)
  assert w["t"] == pytest.approx(t, rel=1e-12) and w["df"] == pytest.approx(2.0, rel=1e-12)
  assert w["p"] == pytest.approx(2 * (1 - (0.5 + abs(t) / (2 * math.sqrt(2 + t * t)))), rel=1e-9)
  # Unequal sizes and variances: the Welch-Satterthwaite df by hand.
  a, b = [0.61, 0.65, 0.70, 0.58], [0.50, 0.71, 0.40]
  va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 3
  w = stats.welch(a, b)
  assert w["df"] == pytest.approx((va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 2), rel=1e-12)
  # df = 1 (one cell constant, two seeds each): the Cauchy CDF, p = 1 - 2 atan(|t|) / pi.
  a, b = [0.0, 1.0], [0.2, 0.2]
  w = stats.welch(a, b)
  assert w["df"] == pytest.approx(1.0) and w["p"] == pytest.approx(1 - 2 * math.atan(abs(w["t"])) / math.pi)
  assert stats.welch([0.5], [0.1, 0.2]) is None
  assert stats.welch([0.3, 0.3], [0.3, 0.3])["p"] == 1.0  # identical runs: no difference
  assert stats.compare([0.3, 0.3], [0.3, 0.3])[0] == "no difference"
  assert stats.compare([0.9, 0.91, 0.92], [0.1, 0.11, 0.12])[0] == "higher"
  assert stats.compare([0.1, 0.11, 0.12], [0.9, 0.91, 0.92])[0] == "lower"
  assert stats.compare([0.5], [0.4, 0.41])[0] == "cannot tell"


def test_verdict_words():
  """Each verdict carries its counts, so a claim resting on few testable comparisons says so."""
  assert stats.verdict(["higher", "higher", "cannot tell"], "higher") == \
      "holds (2 of 2 testable comparisons support it; 1 cannot tell)"
  assert stats.verdict(["no difference", "lower"], "higher") == \
      "does not hold (0 of 2 testable comparisons support it)"
  assert stats.verdict(["no difference", "no difference", "cannot tell"], "higher") == \
      "no difference (0 of 2 testable comparisons support it; 1 cannot tell)"
  assert stats.verdict(["no difference"], "higher", "most") == "no difference (0 of 1 testable comparisons support it)"
  assert stats.verdict(["higher", "no difference", "lower"], "higher") == \
      "holds in part (1 of 3 testable comparisons support it)"
  assert stats.verdict(["cannot tell"], "higher") == "cannot tell (1 comparison, none testable)"
  assert stats.verdict(["cannot tell"] * 2, "higher") == "cannot tell (2 comparisons, none testable)"
  assert stats.verdict([], "higher") == "cannot tell"
  assert stats.verdict(["higher", "higher", "lower"], "higher", "most") == \
      "holds (2 of 3 testable comparisons support it)"
  assert stats.verdict(["higher", "no difference", "lower"], "higher", "most") == \
      "does not hold (1 of 3 testable comparisons support it)"
  # One testable comparison of six: "holds", with the five it could not test in the words.
  assert stats.verdict(["higher"] + ["cannot tell"] * 5, "higher") == \
      "holds (1 of 1 testable comparisons support it; 5 cannot tell)"


def test_bold_only_where_the_lead_is_significant(tmp_path):
  s = sweep_config(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  fill(exp)
  t = collect.tables(results_lib.from_runs(s, exp), "heldout_domain")
  lead = collect.leaders(t)
  # The cells share their seeds, so the lead is tested on the per-seed differences (SciPy's
  # ttest_rel). C=1: ERM 0.85 vs IRM 0.72, differences 0.20, 0.08, 0.11 (paired p ~ 0.07,
  # though Welch's p ~ 0.03): not bold. C=4, lambda=1: FedIIR 0.71 vs FedAvg 0.61,
  # differences 0.10, 0.09, 0.11: bold. C=4, lambda=0.1: FedIIR 0.62 vs FedAvg 0.603: no.
  # C=4, lambda=0: IRM 0.47 vs 0.42, differences 0.05, 0.03, 0.07 (p ~ 0.049): bold.
  from scipy import stats as sp
  p1 = sp.ttest_rel(TEST[("fedavg", 1, None)], TEST[("irm", 1, None)]).pvalue
  assert 0.05 < p1 and stats.welch(TEST[("fedavg", 1, None)], TEST[("irm", 1, None)])["p"] < 0.05
  assert sp.ttest_rel(TEST[("irm", 4, 0.0)], TEST[("fedavg", 4, 0.0)]).pvalue < 0.05
  assert lead[(1, None)][:2] == ("fedavg", "irm") and not lead[(1, None)][3]
  assert lead[(1, None)][2]["p"] == pytest.approx(p1, rel=1e-9)
  assert lead[(4, 1.0)][:2] == ("fediir", "fedavg") and lead[(4, 1.0)][3]
  assert lead[(4, 0.1)][:2] == ("fediir", "fedavg") and not lead[(4, 0.1)][3]
  assert lead[(4, 0.0)][0] == "irm" and lead[(4, 0.0)][3]
  assert sp.ttest_rel(TEST[("fediir", 4, 0.1)], TEST[("fedavg", 4, 0.1)]).pvalue > 0.05
  md = collect.to_markdown(t)
  assert md.count("**") == 2 * 2
  assert "| FedIIR | - | **0.710 ± 0.010 (n=3)** | 0.620 ± 0.036 (n=3) |" in md


def non_superior_by_hand(cell, base, margin=0.02, alpha=0.05) -> bool:
  """The one-sided paired t-test of H0: mean(cell - base) >= margin rejected at alpha (scipy)."""
  from scipy import stats as sp
  d = np.subtract(cell, base)
  se = d.std(ddof=1) / math.sqrt(len(d))
  if se == 0:
    return d.mean() < margin
  return sp.t.cdf((d.mean() - margin) / se, len(d) - 1) < alpha


def test_reading_is_generated_from_the_numbers(tmp_path):
  s = sweep_config(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  fill(exp)
  md = open(report.write_report(s, str(tmp_path / "out"), exp)).read()
  reading = md.split("## Reading", 1)[1]
  from scipy import stats as sp
  # 4.1, paired by seed: FedIIR is above FedAvg at lambda = 1 (a column against). A column
  # supports the remark when every method's one-sided test of "0.02 or more above" rejects at
  # 0.05 (the intersection-union test, no correction): at C = 1 IRM's does (0.72 against
  # 0.85), at lambda = 0.1 FedIIR's and at lambda = 0 IRM's do not: those are inconclusive.
  iut = {col: all(non_superior_by_hand(TEST[(m, *col)], TEST[("fedavg", *col)]) for m in ms)
         for col, ms in {(1, None): ("irm",), (4, 0.1): ("irm", "fediir"), (4, 0.0): ("irm", "fediir")}.items()}
  assert iut == {(1, None): True, (4, 0.1): False, (4, 0.0): False}
  assert "**Remark 4.1, FedAvg-ERM is a strong baseline (in each column, no method above it by the margin or more: " \
         "one-sided paired tests, the intersection-union test; refuted by a method shown more than the margin above it): " \
         "does not hold (1 column with no method the margin or " \
         "more above it, 1 column with a method more than the margin above it, 2 columns with none shown more than the margin above " \
         "it but some possibly that far above of 4 testable).**" in reading
  # 4.2 (lambda 1 vs 0.1, IRM the only DG method): 0.51 vs 0.41, paired by seed (the runs of
  # a seed share the split and the initial model across columns), a family of one; the text
  # recomputed by tests/test_committed_reports.py's SciPy transcription of the paired family.
  from test_committed_reports import family_by_hand
  a, b = TEST[("irm", 4, 1.0)], TEST[("irm", 4, 0.1)]
  (o, text, _, _), = family_by_hand([(dict(enumerate(a)), dict(enumerate(b)))])
  assert o == "better" and sp.ttest_rel(a, b).pvalue < 0.05
  assert f"IRM at C=4: λ=1 0.510 ± 0.010 (n=3) vs λ=0.1 0.410 ± 0.010 (n=3): degrades ({text})" in reading
  assert ("**Remark 4.2, DG methods degrade from λ = 1 to λ = 0.1 (in most comparisons, paired by seed, Holm over the "
          "remark; at C = 4, where both columns were run): holds (1 degrades of 1 testable).**") in reading
  # FedIIR's claim: better at lambda = 1, inconclusive at 0.1, equivalent at 0 (identical
  # values: every difference 0, inside the margin for certain).
  assert '**FedIIR (Guo, Guo, Cao, Wu and Chang, "Out-of-Distribution Generalization of Federated Learning via ' \
         'Implicit Invariant Relationships", ICML 2023): FedIIR beats FedAvg-ERM' in reading
  assert "FedIIR beats FedAvg-ERM: holds in part (1 better, 1 equivalent within ±0.02, 1 inconclusive of 3 " \
         "testable).**" in reading
  assert "C=4, λ=0: FedIIR 0.420 ± 0.020 (n=3) vs FedAvg-ERM 0.420 ± 0.020 (n=3): equivalent within ±0.02 (paired " \
         "diff +0.000 (SE 0.000), p = 1.000, Holm p = 1.000, Wilcoxon p = 1.000 (Holm p = 1.000, cannot reach the " \
         "level with 3 seeds), TOST Holm p < 0.001, " \
         "detectable " \
         "0.000, equivalence bound 0.000)" in reading
  assert "selected rounds: 0 of 33 runs" in md
  assert "## Deviations from Bai et al. 2024" in md and "the image subsample and the splits (`data.seed`) are the " \
         "same in every run" in md


def test_an_excluded_cell_is_no_column_of_the_report(tmp_path):
  s = sweep_config(tmp_path / "runs", exclude_cells=((4, 0.1),))
  s.figures.curves_grid = ""  # tables and reading only
  exp = sweep_lib.expand(s)
  assert all(e.axes["lam"] != 0.1 for e in exp.entries) and len(exp.entries) == 2 * 3 + 3 * 2 * 3
  fill(exp)
  md = open(report.write_report(s, str(tmp_path / "out"), exp)).read()
  labels = [collect.column_label(c) for c in ((1, None), (4, 1.0), (4, 0.1), (4, 0.0))]
  header = next(line for line in open(tmp_path / "out" / "tables.md").read().splitlines() if line.startswith("| "))
  assert labels[0] in header and labels[1] in header and labels[3] in header and labels[2] not in header
  # Remark 4.2 compares lambda = 1 with 0.1: with no 0.1 column there is nothing to test.
  assert "Remark 4.2" in md and "IRM at C=4: λ=1" not in md
  assert "of 2 testable" in md.split("FedIIR beats FedAvg-ERM", 1)[1].split("\n", 1)[0]  # C = 4, lambda 1 and 0


# ---------------------------------------------------------------------------- sweeps

def test_seeds_phase_waits_for_the_search_then_runs_at_the_winner(tmp_path):
  s = sweep_config(tmp_path / "runs", methods=("fedavg",), client_counts=(4,), lams=(1.0,), seeds=(0,),
                   num_trials=3)
  s.search.distributions = {"client": {"lr": ("log_uniform", 1e-3, 1e-1)}}
  s.grids.seeds = {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.0,), "seeds": (0, 1, 2),
                   "select_from": "table"}
  s.table.grid = "seeds"
  exp = sweep_lib.expand(s)
  assert len(exp.jobs) == 3 and "seeds" in exp.waiting and "3 of 3 search jobs have not finished" in exp.waiting["seeds"]
  with pytest.raises(sweep_lib.SweepError) as e:
    collect.collect(s, str(tmp_path / "out"))
  assert len(str(e.value).splitlines()) == 1
  # Trial 2 has the best held-out validation score.
  for e in exp.entries:
    v = {0: 0.5, 1: 0.6, 2: 0.7}[e.axes["trial"]]
    write_run(exp.jobs[e.key].workdir, {1: {"heldout_val": v, "in_val": 0.3, "in_test": 0.9, "test": 0.4},
                                        2: {"heldout_val": 0.1, "in_val": 0.6, "in_test": 0.8, "test": 0.5}})
  exp2 = sweep_lib.expand(s)
  assert not exp2.waiting
  seeds = sweep_lib.grid_entries(exp2, "seeds")
  win = sweep_lib.trial_overrides(s, "fedavg", 2)
  assert [e.axes["seed"] for e in seeds] == [0, 1, 2] and all(e.axes["trial"] == 2 for e in seeds)
  assert all(e.axes["overrides"] == win for e in seeds) and win["client.lr"] != s.base.client.lr
  assert exp2.jobs[seeds[1].key].config.client.lr == win["client.lr"]
  # Seed 0 at the winner is the search's own run: one job, not two.
  assert seeds[0].key == next(e.key for e in exp.entries if e.axes["trial"] == 2)
  assert len(exp2.jobs) == 5


def test_select_seeds_runs_the_seeds_at_the_winner_one_search_seed_chose(tmp_path):
  """Two search seeds disagree: seed 0 ranks trial 1 first, seed 100 trial 2, and their mean
  picks trial 1. A grid with `select_seeds=(100,)` runs at trial 2; where both seeds agree it
  would share the table's jobs. A seed the search did not run is a one-line error."""
  s = sweep_config(tmp_path / "runs", methods=("fedavg",), client_counts=(4,), lams=(1.0,), seeds=(0, 100),
                   num_trials=3)
  s.search.distributions = {"client": {"lr": ("log_uniform", 1e-3, 1e-1)}}
  grid = {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.0,), "seeds": (1, 2), "select_from": "table"}
  s.grids.seeds = grid
  s.grids.other = dict(grid, select_seeds=(100,))
  exp = sweep_lib.expand(s)
  val = {(0, 0): 0.5, (0, 1): 0.9, (0, 2): 0.6, (100, 0): 0.5, (100, 1): 0.6, (100, 2): 0.7}
  for e in exp.entries:
    write_run(exp.jobs[e.key].workdir, {1: {"heldout_val": val[(e.axes["seed"], e.axes["trial"])], "in_val": 0.3,
                                            "in_test": 0.9, "test": 0.4}})
  assert (0.9 + 0.6) / 2 > (0.6 + 0.7) / 2  # the mean over both seeds picks trial 1
  exp2 = sweep_lib.expand(s)
  assert {e.axes["trial"] for e in sweep_lib.grid_entries(exp2, "seeds")} == {1}
  assert {e.axes["trial"] for e in sweep_lib.grid_entries(exp2, "other")} == {2}
  s.grids.other = dict(grid, select_seeds=(0,))  # seed 0 alone agrees with the mean: the same jobs
  exp3 = sweep_lib.expand(s)
  assert [e.key for e in sweep_lib.grid_entries(exp3, "other")] == [e.key for e in sweep_lib.grid_entries(exp3, "seeds")]
  s.grids.other = dict(grid, select_seeds=(7,))
  with pytest.raises(sweep_lib.SweepError) as e:
    sweep_lib.expand(s)
  assert str(e.value) == ("sweep.grids.other.select_seeds: [7] not among the seeds of its search grid 'table' "
                          "([0, 100])")
  s.grids.other = dict(grid, select_seeds=100)
  with pytest.raises(sweep_lib.SweepError, match=r"^sweep.grids.other.select_seeds: a tuple of search seeds, got 100$"):
    sweep_lib.expand(s)
  s.grids.other = {k: v for k, v in dict(grid, select_seeds=(100,)).items() if k != "select_from"}
  with pytest.raises(sweep_lib.SweepError, match=r"select_seeds chooses among a search's seeds, but the grid has no "
                     "select_from"):
    sweep_lib.expand(s)


def _phased_sweep(root):
  s = sweep_config(root, methods=("fedavg",), client_counts=(4,), lams=(1.0,), seeds=(0,), num_trials=3)
  s.search.distributions = {"client": {"lr": ("log_uniform", 1e-3, 1e-1)}}
  s.grids.seeds = {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.0,), "seeds": (0, 1, 2),
                   "select_from": "table"}
  return s


def _fake_runs(skip=()):
  """`run_once` for `cli.run_phases` that finishes every job not done (trial t scores 0.5 +
  0.1 t on held-out validation) but the entries in `skip`, and records the jobs it was given."""
  calls = []

  def run_once(exp):
    calls.append(sorted(exp.jobs))
    n = 0
    for e in exp.entries:
      wd = exp.jobs[e.key].workdir
      if e.axes["trial"] in skip or os.path.exists(os.path.join(wd, "summary.json")):
        continue
      write_run(wd, {1: {"heldout_val": 0.5 + 0.1 * e.axes["trial"], "in_val": 0.3, "in_test": 0.9, "test": 0.4}})
      n += 1
    return {"done": n, "failed": 0}
  return run_once, calls


def test_one_bench_run_runs_the_search_and_then_the_seeds_at_the_winner(tmp_path):
  from fedjax_dg.bench import cli
  s = _phased_sweep(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  run_once, calls = _fake_runs()
  last, counts = cli.run_phases(s, exp, run_once)
  assert len(calls) == 2 and len(calls[0]) == 3 and len(calls[1]) == 5 and set(calls[0]) < set(calls[1])
  assert counts == {"done": 5, "failed": 0} and not last.waiting
  assert all(e.axes["trial"] == 2 for e in sweep_lib.grid_entries(last, "seeds"))
  # Run again: nothing new, one pass.
  run_once, calls = _fake_runs()
  assert cli.run_phases(s, sweep_lib.expand(s), run_once)[1] == {"done": 0, "failed": 0} and len(calls) == 1


@pytest.mark.parametrize("why", ["a search job failed", "a stop signal"])
def test_the_seeds_phase_does_not_start_after_a_failed_search_job_or_a_stop(tmp_path, monkeypatch, why):
  from fedjax_dg import stopping
  from fedjax_dg.bench import cli
  s = _phased_sweep(tmp_path / "runs")
  if why == "a stop signal":
    monkeypatch.setattr(stopping, "stop_signal", lambda: "SIGTERM")
  run_once, calls = _fake_runs(skip=(1,) if why == "a search job failed" else ())
  last, _ = cli.run_phases(s, sweep_lib.expand(s), run_once)
  assert len(calls) == 1 and "seeds" in last.waiting  # one pass: the search's jobs, no seeds


def test_a_diverged_search_trial_never_wins_and_does_not_hold_the_seeds_phase(tmp_path):
  """A trial whose run diverged fails in the launcher (FloatingPointError with the runner's
  message); the seeds phase treats it as finished and never picks it. Any other failure
  keeps the seeds phase waiting, with a message that says the jobs failed."""
  from fedjax_dg import runbook
  s = sweep_config(tmp_path / "runs", methods=("fedavg",), client_counts=(4,), lams=(1.0,), seeds=(0,),
                   num_trials=3)
  s.search.distributions = {"client": {"lr": ("log_uniform", 1e-3, 1e-1)}}
  s.grids.seeds = {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.0,), "seeds": (0, 1),
                   "select_from": "table"}
  exp = sweep_lib.expand(s)
  by_trial = {e.axes["trial"]: exp.jobs[e.key] for e in sweep_lib.grid_entries(exp, "table")}
  for t in (0, 1):
    write_run(by_trial[t].workdir, {1: {"heldout_val": 0.5 + 0.1 * t, "in_val": 0.3, "in_test": 0.9, "test": 0.4}})
  diverged = runbook.divergence(float("nan"), True, True, 6, by_trial[2].config)
  os.makedirs(by_trial[2].workdir, exist_ok=True)
  jobs_lib.record_failure(by_trial[2].workdir, FloatingPointError(diverged))
  exp2 = sweep_lib.expand(s)
  assert not exp2.waiting
  seeds = sweep_lib.grid_entries(exp2, "seeds")
  assert [e.axes["trial"] for e in seeds] == [1, 1]
  # The same trial failing for another reason (its worker died) holds the phase, saying so;
  # so does a FloatingPointError that is not the runner's divergence (JAX_DEBUG_NANS, batch-wide).
  events = os.path.join(by_trial[2].workdir, "events.jsonl")
  for error in (RuntimeError("worker process died"), FloatingPointError("invalid value (nan) encountered in mul")):
    os.remove(events)
    jobs_lib.record_failure(by_trial[2].workdir, error)
    assert "1 of 3 search jobs failed other than by diverging" in sweep_lib.expand(s).waiting["seeds"]
  # A diverged trial that runs again (its lock held), or whose rerun started and was
  # interrupted, has not finished: the seeds phase waits for it.
  os.remove(events)
  jobs_lib.record_failure(by_trial[2].workdir, FloatingPointError(diverged))
  assert jobs_lib.acquire(by_trial[2].workdir, False)
  assert "1 of 3 search jobs have not finished" in sweep_lib.expand(s).waiting["seeds"]
  os.remove(os.path.join(by_trial[2].workdir, "RUNNING"))
  assert not sweep_lib.expand(s).waiting
  jobs_lib.event(by_trial[2].workdir, "start", resumed=False)
  assert "1 of 3 search jobs have not finished" in sweep_lib.expand(s).waiting["seeds"]


def test_fixed_steps_grid_sets_local_steps(tmp_path):
  s = sweep_config(tmp_path / "runs", methods=("fedavg",), client_counts=(1, 4), lams=(1.0,), seeds=(0,),
                   local_steps=7)
  exp = sweep_lib.expand(s)
  assert all(j.config.client.local_steps == 7 for j in exp.jobs.values())
  assert all(e.axes["local_steps"] == 7 for e in exp.entries)
  with pytest.raises(sweep_lib.SweepError, match="local_steps must be >= 0"):
    sweep_lib.expand(sweep_config(tmp_path / "runs", local_steps=-1))


def test_figures_say_so_when_no_grid_is_named(tmp_path):
  s = sweep_config(tmp_path / "runs")
  s.figures.curves_grid = ""
  assert figures.no_figures(s).startswith("no figures: the sweep names no grid")
  s.figures.curves_grid = "table"
  assert figures.no_figures(s) is None


def test_run_figure_names_say_what_the_run_is():
  assert figures.run_name({"method": "fediir+omg", "num_clients": 20, "lam": 0.1, "seed": 2, "trial": 3},
                          "0123456789abcdef") == "fediir-omg_C20_lam0.1_seed2_trial3_01234567"
  assert figures.run_name({"method": "fedavg", "num_clients": 1, "lam": None, "seed": 0}, "ab" * 8) == \
      "fedavg_C1_seed0_trial0_abababab"


def test_palette_styles_are_distinct_for_32_lines():
  st = [figures.style(k) for k in range(32)]
  assert len({(s["color"], s["linestyle"]) for s in st}) == 32
  assert set(s["color"] for s in st) == set(figures.OKABE_ITO)


def test_quick_sweep_expands():
  q = sweep_lib.expand(sweep_lib.load_config_file(os.path.join(ROOT, "configs", "sweeps", "quick.py")))
  assert len(q.jobs) == 66 and not q.waiting


@pytest.mark.slow
def test_full_report_sweep_expands_and_waits_for_its_search():
  """1,016 search entries (127 cells x 8 trials) and 1,476 jobs before the seeds phase, as
  docs/benchmark_report.md counts them."""
  f = sweep_lib.expand(sweep_lib.load_config_file(os.path.join(ROOT, "configs", "sweeps", "report_fmnist.py")))
  assert sum(e.grid == "search" for e in f.entries) == 127 * 8 and "table" in f.waiting
  assert len(f.jobs) == 1476



COMMITTED_REPORTS = sorted(d for d in os.listdir(os.path.join(ROOT, "experiments"))
                           if os.path.exists(os.path.join(ROOT, "experiments", d, collect.RESULTS_FILE)))


def test_the_committed_reports_are_found():
  assert {"report_quick", "report_fmnist"} <= set(COMMITTED_REPORTS)


def _save_unrendered(fig, path, dpi=120):
  del fig, dpi
  os.makedirs(os.path.dirname(path), exist_ok=True)
  open(path, "wb").close()


# The quick report by default; the larger editions (report_fmnist*) in the slow suite, where
# tests/test_committed_reports.py recomputes their cells, bold marks and readings by default.
# Run `pytest -m slow -k committed_report` after a change to fedjax_dg/bench's readers.
@pytest.mark.parametrize("folder", [f if f == "report_quick" else pytest.param(f, marks=pytest.mark.slow)
                                    for f in COMMITTED_REPORTS])
def test_a_committed_report_is_what_its_results_file_gives_with_this_code(tmp_path, folder, monkeypatch):
  """Every text file of a committed report folder equals, byte for byte, what the current
  reader code writes from the folder's results file (a change to the tables or the reading
  that is not regenerated into the committed reports fails here); each figure is made again.
  PNG bytes are left out: they depend on the installed matplotlib and fonts, so the figures
  are not rendered (`figures.save` writes an empty file: rendering takes most of a report's
  time, and `test_report_regenerates_byte_for_byte_from_the_results_file` renders them)."""
  monkeypatch.setattr(figures, "save", _save_unrendered)
  src = os.path.join(ROOT, "experiments", folder)
  data = results_lib.read(os.path.join(src, collect.RESULTS_FILE))
  report.write_report(data.sweep, str(tmp_path), data=data, allow_stale=True)
  runs = os.path.realpath(os.path.join(ROOT, data.sweep.get("root", ""))) if data.sweep.get("root") else None
  committed = {os.path.relpath(os.path.join(d, f), src) for d, _, fs in os.walk(src) for f in fs
               if runs is None or not (os.path.realpath(d) + os.sep).startswith(runs + os.sep)}  # the sweep's runs beside it
  written = {os.path.relpath(os.path.join(d, f), tmp_path) for d, _, fs in os.walk(tmp_path) for f in fs}
  assert written == committed - {collect.RESULTS_FILE}
  for rel in sorted(written):
    if not rel.endswith(".png"):
      assert open(os.path.join(tmp_path, rel), "rb").read() == open(os.path.join(src, rel), "rb").read(), rel


def _point(R, values):
  return {"num_clients": 20, "lam": 1.0, "method": "fedavg", "num_rounds": R, "local_epochs": 60 // R,
          "mean": statistics.mean(values), "std": statistics.stdev(values),
          "se": statistics.stdev(values) / math.sqrt(len(values)), "n": len(values),
          "_values": tuple(values), "_by_seed": dict(enumerate(values, 1))}


def test_remark_4_8_tests_the_picked_interior_schedule_at_a_bonferroni_level():
  """The interior schedule is the best of three by its mean, so its two paired comparisons
  with the ends are one Holm family at 0.05 / 3. Paired p 0.035 and 0.020 (both below 0.05)
  do not pass: Holm's smallest, 2 x 0.020, is above 0.0167, so the series is undecided.
  A clearer lead (p 0.0091 and 0.0067: 2 x 0.0067 and 0.0091 both below 0.0167) is above both
  ends, and the remark holds."""
  from scipy import stats as sp
  ends = (0.40, 0.41, 0.42), (0.39, 0.40, 0.41)

  def series(mid):
    return [_point(60, ends[0]), _point(30, (0.40, 0.41, 0.42)), _point(15, mid), _point(6, (0.41, 0.42, 0.43)),
            _point(3, ends[1])]
  mid = (0.43, 0.45, 0.44)
  p = sorted(sp.ttest_rel(mid, e).pvalue for e in ends)
  assert p[1] < 0.05 and 2 * p[0] > 0.05 / 3
  v, lines = report.remark_4_8(series(mid), {"fedavg": "FedAvg-ERM"})
  assert v == "inconclusive (1 undecided series of 1 testable)"
  assert "best interior R=15 (of 3, its two tests at 0.0167, Holm) vs R=3: inconclusive (paired diff +0.040" in lines[0]
  assert "R=15 0.440 ± 0.010 (n=3)" in lines[0]
  mid = (0.46, 0.48, 0.47)
  p = sorted(sp.ttest_rel(mid, e).pvalue for e in ends)
  assert 2 * p[0] < 0.05 / 3 and p[1] < 0.05 / 3
  v, lines = report.remark_4_8(series(mid), {"fedavg": "FedAvg-ERM"})
  assert v == "holds (1 series with its best interior schedule above both ends of 1 testable)"
  assert "vs R=3: above (paired diff +0.070" in lines[0] and ", vs R=60: above (paired diff +0.060" in lines[0]


def test_remark_4_1_cannot_tell_a_column_where_an_untestable_method_is_above_the_baseline(tmp_path):
  """A method with one finished seed and a higher mean than FedAvg-ERM makes its column
  "cannot tell" (named with its cell), not a column that supports the remark."""
  s = sweep_config(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  test = dict(TEST)
  test[("fediir", 4, 0.1)] = (0.95, 0.95, 0.95)
  fill(exp, test)
  for e in exp.entries:
    a = e.axes
    if (a["method"], a["num_clients"], a["lam"]) == ("fediir", 4, 0.1) and a["seed"] > 0:
      shutil.rmtree(exp.jobs[e.key].workdir)
  table = collect.tables(results_lib.from_runs(s, exp), "heldout_domain")
  v, lines = report.remark_4_1(table, "fedavg", collect.display_names(s))
  line = next(l for l in lines if l.startswith("C=4, λ=0.1"))
  assert "untestable: FedIIR 0.950 (n=1/3)" in line
  assert "1 cannot tell" in v


def test_late_selection_counts_to_the_last_evaluated_round_and_leaves_staged_selection_out(tmp_path):
  """Runs configured for 10 rounds whose records end at round 2 and select it: late, counted
  to their last evaluation; a run whose selection looks at its final stage only (FedLOE) is
  late by construction and counted apart."""
  s = sweep_config(tmp_path / "runs", methods=("fedavg",), client_counts=(4,), lams=(1.0,), seeds=(0, 1, 2))
  s.base.num_rounds = 10
  exp = sweep_lib.expand(s)
  for e in exp.entries:
    write_run(exp.jobs[e.key].workdir, {1: {"heldout_val": 0.4, "in_val": 0.4, "in_test": 0.5, "test": 0.5},
                                        2: {"heldout_val": 0.5, "in_val": 0.5, "in_test": 0.5, "test": 0.6}})
    if e.axes["seed"] == 2:
      path = os.path.join(exp.jobs[e.key].workdir, "summary.json")
      sm = json.load(open(path))
      sm["selection_scope"] = "rounds of the final stage (stage 2)"
      sm["stages"] = [{"name": "stage 1", "rounds": [1, 1]}, {"name": "stage 2", "rounds": [2, 2]}]
      json.dump(sm, open(path, "w"))
  per = report.late_selection(results_lib.from_runs(s, exp), "table", "heldout_domain", "accuracy")
  assert per == {(4, 1.0): (2, 2), ("staged",): 1}
  assert report.late_selection_line(per).endswith("C=4, λ=1 2/2; 1 runs that select within their final stage only "
                                                  "(FedLOE's stage 2) are not counted")
  assert report.staged_lines(results_lib.from_runs(s, exp), "table") == [
      "FedAvg-ERM trains in stages (stage 1: 1 rounds, stage 2: 1 rounds) and is selected among its final stage's "
      "evaluations only, the other methods among all of theirs; its rounds are not the other methods' rounds "
      "(Table 13 gives its training time over the other methods' rounds)"]


def test_late_selection_is_counted_per_column():
  line = report.late_selection_line({(20, 0.1): (0, 9), (1, None): (1, 6), (20, 1.0): (3, 9), (20, 0.0): (9, 9)})
  assert line.startswith("selected rounds: 13 of 33 runs behind the table's cells (39%) selected a round in the last")
  assert line.endswith("per column: C=1 (centralised) 1/6, C=20, λ=1 3/9, C=20, λ=0.1 0/9, C=20, λ=0 9/9")


def test_table_6_counts_training_domains():
  """Bai et al.'s Table 6 counts the training domains (PACS: D = 2 of its 4)."""
  from fedjax_dg.bench import difficulty
  run = {"summary": {"client_sizes": [5, 5], "domains": {"names": list("abcdef"), "train": [1, 2, 3, 4],
                                                         "val": [0], "test": [5]}},
         "records": [{"splits": {"test": {"n": 3}}}]}

  class E:
    key, axes = "k", {"role": "fl_erm", "num_clients": 1}
  assert difficulty._dataset_stats([E], {"k": run})["D"] == 4


def test_run_time_counts_a_batch_program_once():
  """Each run of a compiled batch program records the program's wall time; the report counts
  each run's share (a program of 3 runs that took 90 s costs 90 s, not 270 s). A batch of 5
  split into two programs (3 + 2 runs, two timing records) counts each program once; runs
  looped one after another inside a batch (`vectorized: false`) record their own times."""
  class E:
    def __init__(self, key, grid):
      self.key, self.grid = key, grid

  def run(wall, size=1, timing=None, vectorized=True, index=0):
    sm = {"wall_time_s": wall, "backend": "cpu", "devices": 1}
    if size > 1:
      sm["batch"] = {"size": size, "index": index, **({} if vectorized else {"vectorized": False})}
    if timing is not None:
      sm["timing"] = timing
    return {"summary": sm}

  t1, t2 = {"compile_s": 1.0, "total_s": 90.0}, {"compile_s": 2.0, "total_s": 40.0}
  results = {**{f"a{i}": run(90.0, 5, t1, index=i) for i in range(3)},        # program 1 of batch a
             **{f"b{i}": run(40.0, 5, t2, index=3 + i) for i in range(2)},    # program 2 of batch a
             **{f"l{i}": run(10.0 + i, 2, {"total_s": 10.0 + i}, vectorized=False, index=i) for i in range(2)},
             "solo": run(30.0)}
  shares = collect.wall_shares(results)
  assert shares["a0"] == 30.0 and shares["b1"] == 20.0 and shares["l1"] == 11.0 and shares["solo"] == 30.0
  exp = type("Exp", (), {"entries": [E(k, "search" if k[0] in "ab" else "table") for k in results]})()
  t = report.timing(exp, results)
  assert t["per_grid"] == {"search": 130.0, "table": 51.0} and t["total"] == 181.0


def test_the_report_lists_each_cells_selected_trial_and_its_values(tmp_path):
  s = sweep_config(tmp_path / "runs", methods=("fedavg",), client_counts=(4,), lams=(1.0,), seeds=(0,),
                   num_trials=3)
  s.search.distributions = {"client": {"lr": ("log_uniform", 1e-3, 1e-1)}}
  s.grids.seeds = {"methods": ("fedavg",), "client_counts": (4,), "lams": (1.0,), "seeds": (1, 2),
                   "select_from": "table"}
  s.table.grid = "seeds"
  exp = sweep_lib.expand(s)
  for e in exp.entries:
    write_run(exp.jobs[e.key].workdir, {1: {"heldout_val": (0.5, 0.7, 0.6)[e.axes["trial"]], "in_val": 0.3,
                                            "in_test": 0.9, "test": 0.4}})
  exp2 = sweep_lib.expand(s)
  fill(exp2, {("fedavg", 4, 1.0): (0.5, 0.6, 0.7)})
  hp = report.selected_hyperparameters(results_lib.from_runs(s, exp2), "seeds", collect.display_names(s))
  lr = sweep_lib.trial_overrides(s, "fedavg", 1)["client.lr"]
  assert hp.splitlines()[2] == f"| FedAvg-ERM | C=4, λ=1 | 1 | `client.lr` {lr:.3g} |"
  assert report.selected_hyperparameters(results_lib.from_runs(s, exp2), "table", {}) == ""  # no search behind it
  lines = report.setup_lines(results_lib.from_runs(s, exp2), collect.report_settings(s))
  assert any(l.startswith("grid `seeds`: 2 fresh seeds (1, 2) at the trial that grid `table` selects") for l in lines)


def test_the_fashion_mnist_sweep_follows_bai_et_als_appendix():
  """Fig. 3 and Table 6 at C = 100, R_DG with 80% of the test domain moved in; the table's
  seeds are fresh (never the search's own seed 0), also in the slice; the per-run figures
  draw a seed the table runs."""
  path = os.path.join(ROOT, "configs", "sweeps", "report_fmnist.py")
  s = sweep_lib.load_config_file(path)
  g = s.grids
  assert tuple(g.rounds.client_counts) == (100,) and g.difficulty.num_clients == 100 and g.difficulty.fraction == 0.8
  assert tuple(g.search.seeds) == (0,) and 0 not in g.table.seeds
  assert set(s.figures.per_run_seeds) <= set(g.table.seeds)
  import importlib.util
  spec = importlib.util.spec_from_file_location("report_fmnist_cfg", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  sl = mod.get_config("slice")
  assert 0 not in sl.grids.table.seeds and tuple(sl.grids.search.seeds) == (0,)


def test_holm_adjusted_p_values_by_hand_and_as_the_step_down_procedure():
  # Holm (1979) by hand: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 -> 0.02, 0.03, 0.06,
  # 0.04 -> running maximum 0.02, 0.03, 0.06, 0.06, returned in the given order.
  assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], abs=1e-15)
  assert stats.holm([0.5, 0.9]) == [1.0, 1.0] and stats.holm([]) == []
  # Rejections at alpha equal the step-down test: walk the sorted p-values, rejecting the k-th
  # smallest while p_(k) < alpha / (m - k + 1), and stop at the first that is not.
  rng = np.random.default_rng(0)
  for _ in range(300):
    p = list(rng.uniform(0, 0.08, size=rng.integers(1, 8)) ** rng.uniform(0.5, 2))
    rejected = set()
    for k, i in enumerate(sorted(range(len(p)), key=lambda i: p[i])):
      if p[i] >= 0.05 / (len(p) - k):
        break
      rejected.add(i)
    assert {i for i, a in enumerate(stats.holm(p)) if a < 0.05} == rejected


def test_remark_4_1_holds_a_column_to_a_family_wise_level(tmp_path):
  """At C=4, lambda=0 IRM is above FedAvg-ERM at paired p ~ 0.049 on its own, but the column
  holds two comparisons (IRM, FedIIR), so its Holm-adjusted p is 2p > 0.05: no method is
  significantly above the baseline; IRM is inconclusive (its difference may exceed the
  margin), FedIIR (the same scores) equivalent. The line gives the detectable range."""
  s = sweep_config(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  fill(exp)
  table = collect.tables(results_lib.from_runs(s, exp), "heldout_domain")
  from scipy import stats as sp
  p = sp.ttest_rel(TEST[("irm", 4, 0.0)], TEST[("fedavg", 4, 0.0)]).pvalue
  assert 0.025 < p < 0.05
  v, lines = report.remark_4_1(table, "fedavg", collect.display_names(s))
  line = next(l for l in lines if l.startswith("C=4, λ=0:"))
  assert "no method significantly above it; equivalent within ±0.02: FedIIR; inconclusive: IRM" in line
  d = np.subtract(TEST[("irm", 4, 0.0)], TEST[("fedavg", 4, 0.0)])
  se = d.std(ddof=1) / math.sqrt(3)
  nc = mdd_by_hand(1.0, 2, 0.05 / 2)
  floor = sp.t.ppf(1 - 0.05 / 2, 2) * se  # t SE at 0.05 / 2, 2 degrees of freedom; FedIIR's SE is 0
  assert (f"detectable (80% power at Holm's first level 0.05/2): 0.000 to {nc * se:.3f}, median "
          f"{nc * se / 2:.3f}; ") in line
  assert (f"; equivalence provable at best within ±0.000 to ±{floor:.3f}, median ±{floor / 2:.3f} "
          "(t SE at the same level, the bound at a zero difference: 1 of 2 below ±0.02)") in line
  # Non-superiority, one-sided at 0.05 each: FedIIR's difference is 0 with SE 0 (shown), IRM's
  # +0.05 is not shown below +0.02; the bound at a zero difference is t_0.95 SE.
  assert non_superior_by_hand(TEST[("fediir", 4, 0.0)], TEST[("fedavg", 4, 0.0)])
  assert not non_superior_by_hand(TEST[("irm", 4, 0.0)], TEST[("fedavg", 4, 0.0)])
  ns = sp.t.ppf(0.95, 2) * se
  assert line.endswith(f"; not 0.02 or more above it (one-sided, 0.05 each): 1 of 2, provable at best within "
                       f"+0.000 to +{ns:.3f}, median +{ns / 2:.3f} (t SE at 0.05, the bound at a zero difference)")
  # A clear lead survives the adjustment: FedIIR at C=4, lambda=1 (paired differences 0.10,
  # 0.09, 0.11); IRM's differences are -0.1 to rounding, so it is the smaller p and FedIIR's
  # Holm p is its own.
  line = next(l for l in lines if l.startswith("C=4, λ=1:"))
  p1 = sp.ttest_rel(TEST[("fediir", 4, 1.0)], TEST[("fedavg", 4, 1.0)]).pvalue
  assert p1 < 0.05
  assert f"significantly above it: FedIIR +0.100 (Holm p = {p1:.3f}); " in line
  # The rest of its statistics are comparisons.csv's (tests/test_committed_reports.py).
  row = next(r for r in report.comparison_rows(table, "fedavg", collect.display_names(s))
             if r["column"] == "C=4, λ=1" and r["method"] == "FedIIR")
  assert float(row["holm_p"]) == pytest.approx(p1, rel=1e-5) and row["wilcoxon_p"] == "0.25"
  assert row["outcome"] == "better" and row["beyond_margin_holm"] == "yes"
  # Shown more than the margin above (one-sided, H0: diff <= 0.02), one Holm family over the
  # remark's 7 testable comparisons (IRM at C=1, IRM and FedIIR in each of the three C=4
  # columns): FedIIR's p times 7 at most is still below 0.05, so the column is against the remark.
  d1 = np.subtract(TEST[("fediir", 4, 1.0)], TEST[("fedavg", 4, 1.0)])
  assert 7 * sp.ttest_1samp(d1 - 0.02, 0.0, alternative="greater").pvalue < 0.05
  assert "; shown more than 0.02 above it (one-sided, Holm over the remark's columns): FedIIR; " in line
  assert v.startswith("does not hold (") and "1 column with a method more than the margin above it" in v


def test_status_search_shows_each_cells_trials_and_best_validation_so_far(tmp_path):
  """`bench status --search`: per search cell, finished / all trials, failed ones, and the
  trial with the best held-out validation score so far (the one the seeds phase would pick),
  never a test score."""
  s = sweep_config(tmp_path / "runs", methods=("fedavg", "irm"), client_counts=(4,), lams=(1.0, 0.1), seeds=(0,),
                   num_trials=3)
  s.search.distributions = {"client": {"lr": ("log_uniform", 1e-3, 1e-1)}}
  s.grids.seeds = {"methods": ("fedavg", "irm"), "client_counts": (4,), "lams": (1.0, 0.1), "seeds": (0, 1),
                   "select_from": "table"}
  exp = sweep_lib.expand(s)
  val = {("fedavg", 1.0): {0: 0.5, 1: 0.7, 2: 0.6}, ("fedavg", 0.1): {0: 0.4, 2: 0.45}, ("irm", 1.0): {}}
  for e in sweep_lib.grid_entries(exp, "table"):
    v = val.get((e.axes["method"], float(e.axes["lam"])), {}).get(e.axes["trial"])
    if v is not None:
      write_run(exp.jobs[e.key].workdir, {1: {"heldout_val": v, "in_val": 0.3, "in_test": 0.9, "test": 0.123},
                                          2: {"heldout_val": v - 0.1, "in_val": 0.6, "in_test": 0.8, "test": 0.987}})
    elif (e.axes["method"], e.axes["trial"]) == ("irm", 1) and e.axes["lam"] == 1.0:
      os.makedirs(exp.jobs[e.key].workdir, exist_ok=True)
      jobs_lib.record_failure(exp.jobs[e.key].workdir, RuntimeError("worker process died"))
  lines = collect.search_progress(s, exp).splitlines()
  assert lines[0].startswith("search grid 'table' for grid 'seeds' (heldout_domain validation accuracy")
  assert lines[1:] == ["  fedavg C=4 lam=1: 3/3 trials; best trial 1 (0.700)",
                       "  fedavg C=4 lam=0.1: 2/3 trials; best so far trial 2 (0.450)",
                       "  irm C=4 lam=1: 0/3 trials, 1 failed",
                       "  irm C=4 lam=0.1: 0/3 trials"]
  assert "0.123" not in "\n".join(lines) and "0.987" not in "\n".join(lines)
  assert collect.search_progress(sweep_config(tmp_path / "other"), exp) == \
      "no grid of this sweep runs seeds at a search's winners"


def test_status_estimates_the_time_left_from_the_finished_jobs_time_per_round(tmp_path):
  """`bench status`'s time estimate, by hand: a job to run costs its rounds times the mean
  per-round wall time of the finished jobs with its algorithm and number of clients (a batch
  program's time split over its runs), a running job only its rounds after its last
  evaluation, a waiting seeds phase its seeds in every search cell; a method with no
  finished job is named, not guessed."""
  s = sweep_config(tmp_path / "runs", methods=("fedavg", "irm", "fediir"), client_counts=(4,), lams=(1.0, 0.1),
                   seeds=(0,), num_trials=2)
  s.search.distributions = {"client": {"lr": ("log_uniform", 1e-3, 1e-1)}}
  s.grids.seeds = {"methods": ("fedavg", "irm", "fediir"), "client_counts": (4,), "lams": (1.0, 0.1),
                   "seeds": (5, 6), "select_from": "table"}
  exp = sweep_lib.expand(s)
  assert "seeds" in exp.waiting
  job = {(e.axes["method"], e.axes["lam"], e.axes["trial"]): exp.jobs[e.key].workdir
         for e in sweep_lib.grid_entries(exp, "table")}
  rounds = {1: {"heldout_val": 0.5, "in_val": 0.3, "in_test": 0.9, "test": 0.5}}

  def finished(workdir, wall, batch=None):
    write_run(workdir, {**rounds, 2: rounds[1]})
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    summary["wall_time_s"] = wall
    if batch:
      summary["batch"], summary["timing"] = {"size": batch, "vectorized": True}, {"total_s": wall}
    json.dump(summary, open(os.path.join(workdir, "summary.json"), "w"))

  finished(job[("fedavg", 1.0, 0)], 600.0)
  finished(job[("fedavg", 1.0, 1)], 1200.0)
  finished(job[("fedavg", 0.1, 0)], 2400.0, batch=2)  # one program of two runs: 1200 s each
  finished(job[("fedavg", 0.1, 1)], 2400.0, batch=2)
  finished(job[("irm", 1.0, 0)], 480.0)
  running = job[("irm", 1.0, 1)]  # evaluated round 1 of 2, locked by a process on another host
  write_run(running, rounds)
  os.remove(os.path.join(running, "summary.json"))
  json.dump({"pid": 1, "host": "another-host"}, open(os.path.join(running, "RUNNING"), "w"))
  assert launch.job_state(running) == "running"

  text = collect.time_left(s, exp, workers=2)
  # fedavg: (600 + 1200 + 1200 + 1200) / 4 = 1050 s a job (525 s a round); irm 480 s a job.
  run_s = 2 * 480.0                           # irm at lambda = 0.1, trials 0 and 1
  running_s = 0.5 * 480.0                     # irm at lambda = 1, trial 1: one round of two left
  seeds_s = 2 * 2 * 1050.0 + 2 * 2 * 480.0    # 2 seeds x 2 lambdas, fedavg and irm
  total = run_s + running_s + seeds_s
  assert text.startswith(f"time left (estimate): {total / 3600:.1f} h of run time, {total / 2 / 3600:.1f} h of wall "
                         f"time at 2 worker(s): 1 running {running_s / 60:.0f} min, 6 to run {run_s / 60:.0f} min "
                         f"(4 of them not estimated), 12 grid 'seeds' after its search {seeds_s / 3600:.1f} h (4 of "
                         "them not estimated)."), text
  assert (total / 3600, total / 2 / 3600) == (7320 / 3600, 3660 / 3600)
  assert text.endswith("Not counted, no finished job like them yet: 8 jobs (fediir C=4: 8).")
  for workdir in job.values():
    if launch.job_state(workdir) != "done":
      if os.path.exists(os.path.join(workdir, "RUNNING")):
        os.remove(os.path.join(workdir, "RUNNING"))
      finished(workdir, 10.0)
  s.grids = ml_collections.ConfigDict({"table": s.grids.table.to_dict()})
  assert collect.time_left(s, sweep_lib.expand(s), workers=2) == "time left: none (every job has finished)"


def test_round_times_table_is_the_mean_per_run_median_round_over_the_tables_jobs(tmp_path):
  """Bai et al.'s Table 13's counterpart, by hand: a job's median round (`timing.median_round_s`)
  counts whole when it ran alone and split over the runs of its compiled program when it ran
  in a batch; a cell is the mean over the method's jobs at that C, all lambdas."""
  s = sweep_config(tmp_path / "runs", methods=("fedavg", "irm"), client_counts=(1, 4), lams=(1.0, 0.1), seeds=(0, 1))
  exp = sweep_lib.expand(s)
  fill(exp)
  keys = {}
  for e in sweep_lib.grid_entries(exp, "table"):
    a = e.axes
    keys[(a["method"], a["num_clients"], a["lam"], a["seed"])] = e.key
  timing = {("fedavg", 1, None, 0): (0.2, None), ("fedavg", 1, None, 1): (0.4, None),
            ("fedavg", 4, 1.0, 0): (0.9, 3), ("fedavg", 4, 1.0, 1): (0.9, 3), ("fedavg", 4, 0.1, 0): (0.9, 3),
            ("fedavg", 4, 0.1, 1): (0.5, None),
            ("irm", 4, 1.0, 0): (1.0, None), ("irm", 4, 1.0, 1): (2.0, None)}
  for k, (median, batch) in timing.items():
    path = os.path.join(exp.jobs[keys[k]].workdir, "summary.json")
    summary = json.load(open(path))
    summary["timing"] = {"total_s": 9.0, "median_round_s": median}
    if batch:
      summary["batch"] = {"size": batch, "vectorized": True}
    json.dump(summary, open(path, "w"))
  data = results_lib.from_runs(s, exp)
  lines = report.round_times(data, "table").splitlines()
  assert lines[:2] == ["| group | method | C=1 | C=4 |", "|---|---|---:|---:|"]
  fedavg_4 = (0.3 + 0.3 + 0.3 + 0.5) / 4  # three runs of one program at 0.9 s a round, one alone
  assert lines[2] == f"| B | FedAvg-ERM | 0.300 (2) | {fedavg_4:.3f} (4) |"
  assert lines[3] == "| DG adapted | IRM | - | 1.500 (2) |"  # IRM at C = 1 recorded no round times
  assert f"{(0.9 * 3 + 0.5) / 4:.3f}" != f"{fedavg_4:.3f}"  # what the cell would read without the split
  # The batch widths behind the cells: 1, 1 (FedAvg at C=1), 3, 3, 3, 1 (C=4), 1, 1 (IRM): median 1.
  assert lines[4:] == ["", "Runs per compiled program in these jobs: 1 to 3 (median 1). A batched program's time "
                       "grows less than in proportion to its runs, so a method whose jobs ran in wider batches looks "
                       "cheaper per run; the other jobs sharing the machine at the same time (the launcher's workers) "
                       "are not recorded."]
  # A method selected within the final stage of its own schedule (FedLOE's kind): 6 timed
  # rounds took 3 s of training (0.5 s each); its stages hold 2 + 6 = 8 rounds of its own, the
  # schedule 2 rounds: 0.5 x 8 / 2 = 2.0 s per round of the schedule, named below the table.
  path = os.path.join(exp.jobs[keys[("irm", 4, 1.0, 1)]].workdir, "summary.json")
  summary = json.load(open(path))
  summary["selection_scope"] = "rounds of the final stage (stage 2)"
  summary["stages"] = [{"name": "stage 1", "rounds": [1, 2]}, {"name": "stage 2", "rounds": [3, 8]}]
  summary["timing"] = {"total_s": 9.0, "median_round_s": 7.0, "train_s": 3.0, "rounds_timed": 6}
  json.dump(summary, open(path, "w"))
  lines = report.round_times(results_lib.from_runs(s, exp), "table").splitlines()
  assert lines[3] == f"| DG adapted | IRM | - | {(1.0 + 0.5 * 8 / 2) / 2:.3f} (2) |"
  assert lines[5].startswith("IRM: its training time (its mean timed round times its own rounds) over the rounds "
                              "of the other methods' schedule")
