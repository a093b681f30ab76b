"""Collect: a sweep's workdirs -> seed 001's Table 3/4/5 layout, a CSV of every job.

Per job and selection rule the score is the test metric at the round the rule selects
(`summary["selection"][rule]`; the test domain never selects):
  heldout_domain  best held-out-validation-domain round (seed 001's main tables, Sec. 4.3)
  in_domain       best in-domain-validation round (seed 001 App. F)
  oracle          best test-domain round, from metrics.jsonl: an upper bound only, never a result
With a random search, each (method, cell, fold, seed) keeps the trial whose rule
validation score is best (the oracle keeps the best test score), as DomainBed does
(seed 001 App. D.4). A seed's value is the mean over folds; a cell is the mean and the
standard deviation over trial seeds (`ddof`, default 1: the sample standard deviation;
seed 001 reports "the standard deviation among 3 runs" without saying which, and
DomainBed's tables print a standard error, `np.std(x) / sqrt(n)` with ddof 0). Best mean
per column in bold, second in italics (ties share the mark); "-" = not applicable
(no centralised counterpart at C = 1); "X" = no finished run; "(k/n)" = k of n seeds
finished.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os

import warnings

import numpy as np

from fedjax_dg.bench import difficulty, launch, sweep as sweep_lib
from fedjax_dg.bench.runs import _metric, load_run, read_records, rule_scores, selectable  # noqa: F401
from fedjax_dg.rundir import RunDirError

RULES = ("heldout_domain", "in_domain", "oracle")
RULE_TITLES = {"heldout_domain": "held-out-domain validation (seed 001's protocol)",
               "in_domain": "in-domain validation (seed 001 App. F)",
               "oracle": "oracle: test-domain selection, an UPPER BOUND only, not a result"}


# ---------------------------------------------------------------------------- runs

def load_results(exp: sweep_lib.Expansion) -> dict:
  """key -> finished run (jobs not finished, or whose files do not parse, are absent; the
  latter with a one-line warning naming the file)."""
  out = {}
  for key, job in exp.jobs.items():
    run = _load(job.workdir)
    if run is not None:
      out[key] = run
  return out


def _load(workdir: str) -> dict | None:
  try:
    return load_run(workdir)
  except RunDirError as e:
    warnings.warn(f"{e}; leaving the job out")
    return None


# ---------------------------------------------------------------------------- cells

@dataclasses.dataclass(frozen=True)
class Cell:
  mean: float | None
  std: float | None
  values: tuple          # one per finished seed, in seed order
  expected: int          # seeds the sweep asked for


def chosen_entries(entries, results, rule: str, metric: str) -> dict:
  """(seed, fold) -> the entry of the trial whose rule validation score is best (lowest
  trial index on ties; the oracle rule ranks by the test score itself), among finished
  runs with a test score."""
  best = {}
  for e in sorted(entries, key=lambda e: e.axes.get("trial", 0)):
    run = results.get(e.key)
    s = rule_scores(run, rule, metric) if run else None
    if s is None or s["val"] is None or s["test"] is None:
      continue
    k = (e.axes["seed"], tuple(e.axes["test_domains"]))
    if k not in best or s["val"] > best[k][0]:
      best[k] = (s["val"], e)
  return {k: v[1] for k, v in best.items()}


def select_trials(entries, results, rule: str, metric: str) -> dict:
  """(seed, fold) -> test score of the chosen trial (`chosen_entries`)."""
  return {k: rule_scores(results[e.key], rule, metric)["test"]
          for k, e in chosen_entries(entries, results, rule, metric).items()}


def per_seed(entries, chosen: dict) -> dict:
  """seed -> mean over folds, for the seeds with every fold finished."""
  folds = {tuple(e.axes["test_domains"]) for e in entries}
  out = {}
  for seed in sorted({e.axes["seed"] for e in entries}):
    vals = [chosen.get((seed, f)) for f in sorted(folds)]
    if vals and all(v is not None for v in vals):
      out[seed] = float(np.mean(vals))
  return out


def summarize(values, expected: int, ddof: int) -> Cell:
  values = tuple(values)
  if not values:
    return Cell(None, None, values, expected)
  std = float(np.std(values, ddof=ddof)) if len(values) > ddof else None
  return Cell(float(np.mean(values)), std, values, expected)


def cell(entries, results, rule: str, metric: str, ddof: int) -> Cell:
  seeds = per_seed(entries, select_trials(entries, results, rule, metric))
  return summarize([seeds[s] for s in sorted(seeds)], len({e.axes["seed"] for e in entries}), ddof)


# ---------------------------------------------------------------------------- tables

@dataclasses.dataclass(frozen=True)
class Table:
  """Rows (group, method, label), columns (C, lam) (lam None for C = 1) and cells; a cell is
  None where the method does not apply."""
  rows: tuple
  columns: tuple
  cells: dict
  rule: str
  metric: str


def table_columns(grid) -> tuple:
  cols = []
  for C in grid.client_counts:
    cols += [(1, None)] if int(C) == 1 else [(int(C), float(l)) for l in grid.lams]
  return tuple(cols)


def table_rows(sweep, grid) -> tuple:
  """Seed 001's row groups (`sweep.table.groups`: (group, (methods, ...)) pairs), keeping the
  grid's methods; methods no group names go last under "other"."""
  display = sweep.get("table", {}).get("display", {})
  methods = list(grid.methods)
  rows, seen = [], set()
  for group, members in sweep.get("table", {}).get("groups", ()):
    for m in members:
      if m in methods and m not in seen:
        rows.append((group, m, display.get(m, m)))
        seen.add(m)
  rows += [("other", m, display.get(m, m)) for m in methods if m not in seen]
  return tuple(rows)


def build_table(sweep, exp, results, grid_name: str, rule: str, metric: str, ddof: int) -> Table:
  grid = sweep.grids[grid_name]
  if len(grid.get("schedules", ())) > 1:
    raise sweep_lib.SweepError(f"sweep.grids.{grid_name}: a table needs one (rounds, epochs) schedule")
  entries = sweep_lib.grid_entries(exp, grid_name)
  centralized = sweep.get("centralized", {})
  rows, cols = table_rows(sweep, grid), table_columns(grid)
  cells = {}
  for _, m, _ in rows:
    for C, lam in cols:
      if C == 1 and not centralized.get(m, ""):
        cells[(m, (C, lam))] = None
        continue
      sel = [e for e in entries if e.axes["method"] == m and e.axes["num_clients"] == C and e.axes["lam"] == lam]
      cells[(m, (C, lam))] = cell(sel, results, rule, metric, ddof)
  return Table(rows, cols, cells, rule, metric)


def ranks(table: Table) -> dict:
  """(method, column) -> 1 (best mean of the column) or 2 (second); ties share."""
  out = {}
  for col in table.columns:
    means = {m: c.mean for (m, k), c in table.cells.items() if k == col and c is not None and c.mean is not None}
    distinct = sorted(set(means.values()), reverse=True)
    for m, v in means.items():
      if v == distinct[0]:
        out[(m, col)] = 1
      elif len(distinct) > 1 and v == distinct[1]:
        out[(m, col)] = 2
  return out


def format_cell(c: Cell | None, digits: int, latex: bool = False) -> str:
  if c is None:
    return "-"
  if c.mean is None:
    return "X"
  pm = " $\\pm$ " if latex else " ± "
  s = f"{c.mean:.{digits}f}" + (f"{pm}{c.std:.{digits}f}" if c.std is not None else "")
  if len(c.values) < c.expected:
    s += f" ({len(c.values)}/{c.expected})"
  return s


def _column_label(col, latex: bool) -> str:
  C, lam = col
  if latex:
    return "$C=1$ (centralised)" if lam is None else f"$C={C}$, $\\lambda={lam:g}$"
  return "C=1 (centralised)" if lam is None else f"C={C}, λ={lam:g}"


def to_markdown(table: Table, digits: int = 3) -> str:
  rk = ranks(table)
  mark = {1: "**{}**", 2: "*{}*"}
  lines = ["| group | method | " + " | ".join(_column_label(c, False) for c in table.columns) + " |",
           "|---|---|" + "---:|" * len(table.columns)]
  last = None
  for group, m, label in table.rows:
    cells = [mark.get(rk.get((m, col)), "{}").format(format_cell(table.cells[(m, col)], digits)) for col in table.columns]
    lines.append(f"| {group if group != last else ''} | {label} | " + " | ".join(cells) + " |")
    last = group
  return "\n".join(lines)


def _tex(s: str) -> str:
  return s.replace("_", "\\_").replace("&", "\\&").replace("%", "\\%").replace("#", "\\#")


def to_latex(table: Table, digits: int = 3, caption: str = "") -> str:
  rk = ranks(table)
  mark = {1: "\\textbf{{{}}}", 2: "\\textit{{{}}}"}
  out = ["\\begin{table}[t]", "\\centering"]
  if caption:
    out.append(f"\\caption{{{_tex(caption)}}}")
  out += ["\\begin{tabular}{ll" + "c" * len(table.columns) + "}", "\\toprule",
          " & Method & " + " & ".join(_column_label(c, True) for c in table.columns) + " \\\\", "\\midrule"]
  last = None
  for group, m, label in table.rows:
    if last is not None and group != last:
      out.append("\\midrule")
    cells = [mark.get(rk.get((m, col)), "{}").format(format_cell(table.cells[(m, col)], digits, latex=True))
             for col in table.columns]
    out.append(f"{_tex(group) if group != last else ''} & {_tex(label)} & " + " & ".join(cells) + " \\\\")
    last = group
  out += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
  return "\n".join(out)


# ---------------------------------------------------------------------------- CSV

CSV_AXES = ("method", "algorithm", "num_clients", "lam", "seed", "test_domains", "val_domains", "num_rounds",
            "local_epochs", "trial", "role")


def job_rows(exp: sweep_lib.Expansion, metric: str) -> list[dict]:
  """One row per job: its axes (the first grid entry's; every grid and method naming it),
  state, the selected rounds and scores under each rule, the final round's test score,
  wall time and bytes communicated."""
  by_key = {}
  for e in exp.entries:
    by_key.setdefault(e.key, []).append(e)
  rows = []
  for key, job in exp.jobs.items():
    es = by_key[key]
    ax = es[0].axes
    row = {"key": key, "workdir": job.workdir, "state": launch.job_state(job.workdir),
           "grids": ";".join(dict.fromkeys(e.grid for e in es)),
           "methods": ";".join(dict.fromkeys(e.axes["method"] for e in es))}
    for a in CSV_AXES:
      v = ax.get(a, "")
      row[a] = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else ("" if v is None else v)
    row["overrides"] = json.dumps(ax.get("overrides", {}), sort_keys=True)
    row["metric"] = metric
    run = _load(job.workdir) if row["state"] == "done" else None
    for rule in RULES:
      s = rule_scores(run, rule, metric) if run else None
      for f in ("round", "val", "test", "in_test"):
        row[f"{rule}_{f}"] = "" if s is None or s[f] is None else s[f]
    if run:
      sm = run["summary"]
      final = sm.get("final") or {}
      comm = sm.get("communication", {})
      rounds = final.get("round", 0) or 0
      row.update(final_round=rounds, final_test=_metric(final.get("splits", {}).get("test"), metric) or "",
                 wall_time_s=round(sm.get("wall_time_s", 0.0), 2), bytes_per_round=comm.get("bytes_per_round", ""),
                 bytes_total=(comm.get("bytes_per_round", 0) * int(job.config.num_rounds) + (comm.get("setup_bytes") or 0))
                 if comm else "")
      row["git_commit"] = (sm.get("provenance") or {}).get("git", {}).get("commit") or ""
    else:
      row.update(final_round="", final_test="", wall_time_s="", bytes_per_round="", bytes_total="")
    row["error"] = ""
    if row["state"] == "failed":
      ev = [e for e in launch.read_events(job.workdir) if e["event"] == "failed"]
      row["error"] = ev[-1].get("error", "") if ev else ""
    rows.append(row)
  return rows


def write_csv(rows: list[dict], path: str) -> None:
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fields = list(dict.fromkeys(k for r in rows for k in r))
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)


# ---------------------------------------------------------------------------- the command

def report_settings(sweep) -> dict:
  r = sweep.get("report", {})
  metric = r.get("metric", "") or sweep.base.data.get("select_metric", "accuracy")
  return {"metric": metric, "ddof": int(r.get("std_ddof", 1)), "digits": int(r.get("digits", 3)),
          "table_grid": sweep.get("table", {}).get("grid", "table")}


def collect(sweep, out_dir: str, exp: sweep_lib.Expansion | None = None) -> dict:
  """Writes tables.md, tables.tex, difficulty.md / .tex (when the sweep has a difficulty
  grid) and jobs.csv into `out_dir`; returns the markdown texts by name."""
  exp = exp or sweep_lib.expand(sweep)
  results = load_results(exp)
  st = report_settings(sweep)
  os.makedirs(out_dir, exist_ok=True)
  texts = {}
  if st["table_grid"] in sweep.grids:
    md, tex = [], []
    for rule in RULES:
      t = build_table(sweep, exp, results, st["table_grid"], rule, st["metric"], st["ddof"])
      title = f"Test {st['metric']} (mean ± std over trial seeds), model selection: {RULE_TITLES[rule]}"
      texts[f"table_{rule}"] = to_markdown(t, st["digits"])
      md += [f"### {title}", "", texts[f"table_{rule}"], ""]
      tex += [to_latex(t, st["digits"], caption=title), ""]
    _write(os.path.join(out_dir, "tables.md"), "\n".join(md))
    _write(os.path.join(out_dir, "tables.tex"), "\n".join(tex))
  for name, g in sweep.grids.items():
    if g.get("kind", "grid") == "difficulty":
      d = difficulty.compute(sweep_lib.grid_entries(exp, name), results, g.get("rule", "heldout_domain"),
                             st["metric"], st["ddof"])
      texts["difficulty"] = difficulty.to_markdown(d, _dataset_name(sweep), st["digits"])
      _write(os.path.join(out_dir, "difficulty.md"), texts["difficulty"] + "\n")
      _write(os.path.join(out_dir, "difficulty.tex"), difficulty.to_latex(d, _dataset_name(sweep), st["digits"]) + "\n")
      _write(os.path.join(out_dir, "difficulty.json"), json.dumps(d, indent=1) + "\n")
  write_csv(job_rows(exp, st["metric"]), os.path.join(out_dir, "jobs.csv"))
  return texts


def _dataset_name(sweep) -> str:
  d = sweep.base.data
  return d.name + (f"/{d.dataset}" if d.get("dataset", "") else "")


def _write(path: str, text: str) -> None:
  with open(path, "w") as f:
    f.write(text)
