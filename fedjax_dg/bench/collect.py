"""Collect: a sweep's workdirs -> Bai et al.'s Table 3/4/5 layout, a CSV of every job.

Per job and selection rule the score is the test metric at the round the rule selects
(`summary["selection"][rule]`; the test domain never selects):
  heldout_domain  best held-out-validation-domain round (Bai et al.'s main tables, Sec. 4.3)
  in_domain       best in-domain-validation round (Bai et al. App. F)
  oracle          best test-domain round, from metrics.jsonl: an upper bound only, never a result
With a random search, each (method, cell, fold, seed) keeps the trial whose rule
validation score is best (the oracle keeps the best test score), as DomainBed does
(Bai et al. App. D.4). A seed's value is the mean over folds; a cell is the mean and the
standard deviation over trial seeds (`ddof`, default 1: the sample standard deviation;
Bai et al. report "the standard deviation among 3 runs" without saying which, and
DomainBed's tables print a standard error, `np.std(x) / sqrt(n)` with ddof 0). Tables print
mean ± standard deviation and n, the number of seeds, as Bai et al. do; the tests of
`fedjax_dg.bench.stats` use the standard error of a difference (paired where the cells
share their seeds), which the reading names as SE. A column's best mean is in bold only
where the test over seeds (paired on the seeds both cells ran, else Welch) puts it above the
runner-up at p < 0.05; "-" = not applicable (no centralised counterpart at C = 1); "-ᵃ" =
the cell's runs compute the baseline's update by construction, "-ᵇ" = the method's
own term could not act (both from the runs' preflight findings and activity records,
`cell_mark`; footnoted, and left out of the reading's tests); "X" = no finished run;
"n=k/m" = k of m seeds finished; "†" = a seed's run ran under other code than the current
one (a stale job, used only with --allow-stale).

The in-domain table takes its cells from `sweep.table.in_domain_grid` where the sweep names
one (seeds run at the search trial with the best in-domain validation score), else from the
table grid (whose trial the held-out domain chose; only the round is chosen in-domain).
"""
from __future__ import annotations

import collections
import csv
import dataclasses
import json
import math
import os
import statistics

import numpy as np

from fedjax_dg.bench import difficulty, results as results_lib, stats, sweep as sweep_lib
from fedjax_dg.bench.results import load_results  # noqa: F401  (the runs of a sweep, read here before)
from fedjax_dg.bench.runs import metric_of, load_run, read_records, rule_scores, selectable  # noqa: F401

RULES = ("heldout_domain", "in_domain", "oracle")
RULE_TITLES = {"heldout_domain": "held-out-domain validation (Bai et al.'s protocol)",
               "in_domain": "in-domain validation (Bai et al. App. F)",
               "oracle": "oracle: the round (and the trial, where the grid holds several) chosen on the test "
                         "domain, an UPPER BOUND only, not a result"}


# ---------------------------------------------------------------------------- cells

@dataclasses.dataclass(frozen=True)
class Cell:
  mean: float | None
  std: float | None
  values: tuple          # one per finished seed, in seed order
  expected: int          # seeds the sweep asked for
  stale: int = 0         # of the chosen runs behind `values`, how many are stale
  seeds: tuple = ()      # the seeds behind `values`, in the same order
  mark: str = ""         # "" | EQUALS_BASELINE | INACTIVE (`cell_mark`)
  reason: str = ""       # why, in one line (the runs' own words)

  @property
  def se(self) -> float | None:
    """The standard error of the mean, std / sqrt(n)."""
    return None if self.std is None else self.std / math.sqrt(len(self.values))

  @property
  def by_seed(self) -> dict:
    """{seed: score} (what a paired test pairs on)."""
    return dict(zip(self.seeds, self.values))

  @property
  def usable(self) -> bool:
    """Has scores and is not marked: the reading tests it."""
    return self.mean is not None and not self.mark


EQUALS_BASELINE, INACTIVE = "equals_baseline", "inactive"
MARKS = {EQUALS_BASELINE: "ᵃ", INACTIVE: "ᵇ"}
LATEX_MARKS = {EQUALS_BASELINE: "a", INACTIVE: "b"}
MARK_NOTES = {EQUALS_BASELINE: "compute the baseline's update by construction",
              INACTIVE: "ran a method whose own term could not act"}


def run_mark(run: dict) -> tuple[str, str]:
  """(mark, reason) of one finished run from its summary: EQUALS_BASELINE where a preflight
  finding says the run computes the baseline's update exactly (`equals_baseline`: e.g. a
  domain penalty on clients that each hold one domain, a proximal term with one local
  step), INACTIVE where a finding says the method's own term does not act at all
  (`inactive`: e.g. Fish on single-domain clients, a penalty weight of 0 under another
  server rule) or where the run's activity record says a scheduled weight was never at its
  target (`activity.weight_at_target` = 0); ("", "") otherwise: a finding with neither flag
  (a term acting on some clients only, Mixup mixing within a domain, a shortened stage) still
  measures the method, and runs that record neither are not marked."""
  sm = run["summary"]
  findings = sm.get("preflight") or []
  for kind in (EQUALS_BASELINE, INACTIVE):
    hit = [f for f in findings if f.get(kind)]
    if hit:
      field, message = hit[0].get("field", ""), hit[0].get("message", "")
      if message.startswith(f"{field}: "):  # the message names its field already
        message = message[len(field) + 2:]
      return kind, f"`{field}`: {message}"
  at_target = (sm.get("activity") or {}).get("weight_at_target")
  if at_target is not None and at_target == 0:
    return INACTIVE, "the scheduled penalty weight was never at its target value (`activity.weight_at_target` 0)"
  return "", ""


def cell_mark(runs) -> tuple[str, str]:
  """(mark, reason) of a cell from its chosen runs: EQUALS_BASELINE when any run equals the
  baseline by construction, else INACTIVE when any run's term could not act (a cell mixing
  such runs with others is not the method's measurement either); the reason says how many
  of the runs."""
  marks = [run_mark(r) for r in runs]
  for kind in (EQUALS_BASELINE, INACTIVE):
    hit = [reason for m, reason in marks if m == kind]
    if hit:
      return kind, f"{len(hit)} of {len(marks)} runs: {hit[0]}"
  return "", ""


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


def summarize(values, expected: int, ddof: int, stale: int = 0, seeds=(), mark: str = "", reason: str = "") -> Cell:
  values = tuple(values)
  if not values:
    return Cell(None, None, values, expected, stale, tuple(seeds), mark, reason)
  std = float(np.std(values, ddof=ddof)) if len(values) > ddof else None
  # The correctly rounded mean (`statistics.mean` sums exactly): accuracies on a test split
  # of n images are multiples of 1/n, so a mean of seeds often sits on a printed rounding
  # boundary, where a floating-point sum's last bit would decide the third decimal.
  return Cell(float(statistics.mean(values)), std, values, expected, stale, tuple(seeds), mark, reason)


def cell(entries, results, rule: str, metric: str, ddof: int, stale=frozenset()) -> Cell:
  chosen = chosen_entries(entries, results, rule, metric)
  seeds = per_seed(entries, {k: rule_scores(results[e.key], rule, metric)["test"] for k, e in chosen.items()})
  n_stale = sum(e.key in stale for e in chosen.values())
  mark, reason = cell_mark([results[e.key] for e in chosen.values()])
  return summarize([seeds[s] for s in sorted(seeds)], len({e.axes["seed"] for e in entries}), ddof, n_stale,
                   sorted(seeds), mark, reason)


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


def lam_order(lams) -> list[float]:
  """Lambdas from homogeneous to heterogeneous, 1, 0.1, 0 (Bai et al.'s order), everywhere."""
  return sorted(dict.fromkeys(float(l) for l in lams), reverse=True)


def table_columns(grid) -> tuple:
  """The table's (num_clients, lam) columns in the grid's order of client counts, lambdas
  from homogeneous to heterogeneous, without the grid's `exclude_cells`; (1, None) is the
  centralised column."""
  skip = sweep_lib.excluded_cells(grid)
  cols = []
  for C in grid.client_counts:
    cols += [(1, None)] if int(C) == 1 else [(int(C), l) for l in lam_order(grid.lams) if (int(C), l) not in skip]
  return tuple(cols)


def display_names(sweep) -> dict:
  return dict(sweep.get("table", {}).get("display", {}))


def table_rows(sweep, grid) -> tuple:
  """Bai et al. 2024's row groups (`sweep.table.groups`: (group, (methods, ...)) pairs), keeping the
  grid's methods; methods no group names go last under "other"."""
  display = display_names(sweep)
  methods = list(grid.methods)
  rows, seen = [], set()
  for group, members in sweep.get("table", {}).get("groups", ()):
    for m in members:
      if m in methods and m not in seen:
        rows.append((group, m, display.get(m, m)))
        seen.add(m)
  rows += [("other", m, display.get(m, m)) for m in methods if m not in seen]
  return tuple(rows)


def build_table(sweep, exp, results, grid_name: str, rule: str, metric: str, ddof: int, stale=frozenset()) -> Table:
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
      sel = [e for e in entries if e.axes["method"] == m and e.axes["num_clients"] == C
             and (e.axes["lam"] if e.axes["lam"] is None else float(e.axes["lam"])) == lam]
      cells[(m, (C, lam))] = cell(sel, results, rule, metric, ddof, stale)
  return Table(rows, cols, cells, rule, metric)


def leaders(table: Table, alpha: float = stats.ALPHA) -> dict:
  """column -> (best method, runner-up method, the test of best vs runner-up, bold?): the
  best mean is bold only where its lead over the runner-up is significant (`stats.pair_test`:
  paired on the seeds both cells hold, Welch's where they share fewer than two). Marked cells
  do not compete.
  Ties: the first row wins the tie and the lead is 0, so nothing is bold."""
  out = {}
  for col in table.columns:
    ranked = sorted(((c.mean, -i, m) for i, (_, m, _) in enumerate(table.rows)
                     for c in [table.cells[(m, col)]] if c is not None and c.usable), reverse=True)
    if len(ranked) < 2:
      continue
    best, second = ranked[0][2], ranked[1][2]
    w = stats.pair_test(table.cells[(best, col)].by_seed, table.cells[(second, col)].by_seed)
    out[col] = (best, second, w, w is not None and w["p"] < alpha and w["diff"] > 0)
  return out


def format_cell(c: Cell | None, digits: int, latex: bool = False) -> str:
  """"mean ± std (n=k)" (std over seeds, as Bai et al. print), "-" not applicable, "-ᵃ" /
  "-ᵇ" marked (`cell_mark`), "X" no finished run."""
  if c is None:
    return "-"
  if c.mark:
    return "-" + (f"$^{LATEX_MARKS[c.mark]}$" if latex else MARKS[c.mark])
  if c.mean is None:
    return "X"
  pm = " $\\pm$ " if latex else " ± "
  s = f"{c.mean:.{digits}f}" + (f"{pm}{c.std:.{digits}f}" if c.std is not None else "")
  s += f" (n={len(c.values)})" if len(c.values) >= c.expected else f" (n={len(c.values)}/{c.expected})"
  if c.stale:
    s += "$^\\dagger$" if latex else "†"
  return s


def _column_label(col, latex: bool) -> str:
  C, lam = col
  if latex:
    return "$C=1$ (centralised)" if lam is None else f"$C={C}$, $\\lambda={lam:g}$"
  return "C=1 (centralised)" if lam is None else f"C={C}, λ={lam:g}"


def column_label(col) -> str:
  return _column_label(col, False)


def table_notes(table: Table) -> list[str]:
  """The lines under a table: what a cell is, what bold means, the stale mark."""
  read = table.rule == "heldout_domain"
  notes = ["Cells: mean ± standard deviation over seeds, as Bai et al. print them (n seeds; n=k/m: k of m finished)"
           + ("; the reading's tests use the standard error of a difference (SE)" if read else
              "; no verdict of the reading rests on this table") + ". Bold, a description and not a test of a claim: "
           "the column's best mean, only where the test over seeds (paired on the seeds both cells ran, Welch's "
           f"where they share fewer than two) puts it above the runner-up at p < {stats.ALPHA} (two-sided, with no "
           "correction for choosing the best and the runner-up after seeing the means)."]
  for kind in (EQUALS_BASELINE, INACTIVE):
    hit = [(m, col, c) for (m, col), c in table.cells.items() if c is not None and c.mark == kind]
    if hit:
      label = {m: lab for _, m, lab in table.rows}
      notes.append(f"-{MARKS[kind]}: the cell's runs {MARK_NOTES[kind]}; shown as '-' and left out of the reading's "
                   "tests: " + "; ".join(f"{label[m]} ({column_label(col)}) {c.reason}" for m, col, c in hit) + ".")
  if any(c is not None and c.stale for c in table.cells.values()):
    notes.append("†: at least one of the cell's runs ran under other code than the current fedjax_dg (a stale job, "
                 "included with --allow-stale); rerun before citing it.")
  same = identical_cells(table)
  if same:
    notes.append("Equal seed for seed (the same score at every seed: the methods computed the same thing there, so "
                 "neither a tie nor a lead between them says anything): "
                 + "; ".join(" = ".join(labels) + " in " + ", ".join(f"({column_label(c)})" for c in cols)
                             for labels, cols in same) + ".")
  return notes


def identical_cells(table: Table) -> list[tuple[tuple, list]]:
  """[(row labels, columns)]: rows whose cells hold the same per-seed scores (two or more
  seeds), grouped by the set of rows, in table order; e.g. IRM and FedAvg-ERM where every
  client holds one domain and IRM's penalty is off."""
  label = {m: lab for _, m, lab in table.rows}
  groups = {}
  for col in table.columns:
    by_values = {}
    for _, m, _ in table.rows:
      c = table.cells.get((m, col))
      if c is not None and c.usable and len(c.values) > 1:
        by_values.setdefault(tuple(c.values), []).append(label[m])
    for labels in by_values.values():
      if len(labels) > 1:
        groups.setdefault(tuple(labels), []).append(col)
  return list(groups.items())


def to_markdown(table: Table, digits: int = 3) -> str:
  lead = leaders(table)
  lines = ["| group | method | " + " | ".join(_column_label(c, False) for c in table.columns) + " |",
           "|---|---|" + "---:|" * len(table.columns)]
  last = None
  for group, m, label in table.rows:
    cells = [("**{}**" if lead.get(col, (None,) * 4)[0] == m and lead[col][3] else "{}").format(
        format_cell(table.cells[(m, col)], digits)) for col in table.columns]
    lines.append(f"| {group if group != last else ''} | {label} | " + " | ".join(cells) + " |")
    last = group
  return "\n".join(lines + [""] + table_notes(table))


def _tex(s: str) -> str:
  return s.replace("_", "\\_").replace("&", "\\&").replace("%", "\\%").replace("#", "\\#")


def to_latex(table: Table, digits: int = 3, caption: str = "") -> str:
  lead = leaders(table)
  out = ["\\begin{table}[t]", "\\centering"]
  if caption:
    notes = _tex(" ".join(table_notes(table))).replace("±", "$\\pm$").replace("†", "$^\\dagger$")
    for kind, sup in MARKS.items():
      notes = notes.replace(sup, f"$^{LATEX_MARKS[kind]}$")
    out.append("\\caption{" + _tex(caption) + " " + notes + "}")
  out += ["\\begin{tabular}{ll" + "c" * len(table.columns) + "}", "\\toprule",
          " & Method & " + " & ".join(_column_label(c, True) for c in table.columns) + " \\\\", "\\midrule"]
  last = None
  for group, m, label in table.rows:
    if last is not None and group != last:
      out.append("\\midrule")
    cells = [("\\textbf{{{}}}" if lead.get(col, (None,) * 4)[0] == m and lead[col][3] else "{}").format(
        format_cell(table.cells[(m, col)], digits, latex=True)) for col in table.columns]
    out.append(f"{_tex(group) if group != last else ''} & {_tex(label)} & " + " & ".join(cells) + " \\\\")
    last = group
  out += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
  return "\n".join(out)


# ---------------------------------------------------------------------------- CSV

CSV_AXES = ("method", "algorithm", "num_clients", "lam", "seed", "test_domains", "val_domains", "num_rounds",
            "local_epochs", "trial", "role")


def wall_shares(results: dict) -> dict:
  """key -> the run's share of the wall time it recorded. The runs of one compiled batch
  program record that program's time (`summary.timing` and `wall_time_s`, the same for all
  of them): each counts 1 / (its program's runs), so the program's time is counted once.
  A program's runs are those of equal batch size and equal timing record; a run looped
  alone inside a batch (`"vectorized": false`) or run alone records its own time."""
  runs = program_runs(results)
  return {key: run["summary"].get("wall_time_s", 0.0) / runs[key] for key, run in results.items()}


def program_runs(results: dict) -> dict:
  """key -> how many runs shared the compiled program that recorded the run's timing (1 for
  a run alone or looped alone inside a batch): those of equal batch size and equal timing."""
  program = {}
  for key, run in results.items():
    sm = run["summary"]
    b = sm.get("batch") or {}
    if int(b.get("size", 1)) > 1 and b.get("vectorized", True) and sm.get("timing"):
      program[key] = (int(b["size"]), json.dumps(sm["timing"], sort_keys=True))
  runs = collections.Counter(program.values())
  return {key: runs[program[key]] if key in program else 1 for key in results}


def job_rows(data, metric: str) -> list[dict]:
  """One row per job: its axes (the first grid entry's; every grid and method naming it),
  state, whether it is stale, the selected rounds and scores under each rule, the final
  round's test score, wall time (as recorded: a batched run records its batch program's;
  `wall_time_share_s`, its share of that, `wall_shares`), bytes communicated and the git
  commit it ran from."""
  exp = data.exp
  shares = wall_shares(data.results)
  by_key = {}
  for e in exp.entries:
    by_key.setdefault(e.key, []).append(e)
  rows = []
  for key, job in exp.jobs.items():
    es = by_key[key]
    ax = es[0].axes
    row = {"key": key, "workdir": job.workdir, "state": data.states.get(key, "pending"),
           "stale": int(key in data.stale),
           "grids": ";".join(dict.fromkeys(e.grid for e in es)),
           "methods": ";".join(dict.fromkeys(e.axes["method"] for e in es))}
    for a in CSV_AXES:
      v = ax.get(a, "")
      row[a] = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else ("" if v is None else v)
    row["overrides"] = json.dumps(ax.get("overrides", {}), sort_keys=True)
    row["metric"] = metric
    run = data.results.get(key)
    for rule in RULES:
      sc = rule_scores(run, rule, metric) if run else None
      for f in ("round", "val", "test", "in_test"):
        row[f"{rule}_{f}"] = "" if sc is None or sc[f] is None else repr(sc[f]) if isinstance(sc[f], float) else sc[f]
    if run:
      sm = run["summary"]
      final = sm.get("final") or {}
      comm = sm.get("communication", {})
      ft = metric_of(final.get("splits", {}).get("test"), metric)
      row.update(final_round=final.get("round", 0) or 0, final_test="" if ft is None else repr(ft),
                 wall_time_s=f"{sm.get('wall_time_s', 0.0):.2f}",
                 wall_time_share_s=f"{shares[key]:.2f}", bytes_per_round=comm.get("bytes_per_round", ""),
                 bytes_total=(comm.get("bytes_per_round", 0) * int(job.config.num_rounds) + (comm.get("setup_bytes") or 0))
                 if comm else "")
      row["git_commit"] = ((sm.get("provenance") or {}).get("git") or {}).get("commit") or ""
    else:
      row.update(final_round="", final_test="", wall_time_s="", wall_time_share_s="", bytes_per_round="",
                 bytes_total="", git_commit="")
    row["error"] = data.errors.get(key, "")
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
          "table_grid": sweep.get("table", {}).get("grid", "table"),
          "in_domain_grid": sweep.get("table", {}).get("in_domain_grid", ""),
          "margin": float(r.get("margin", stats.MARGIN))}


def grid_for(st: dict, rule: str) -> str:
  """The grid a rule's table is built from: the in-domain grid for in-domain selection where
  the sweep names one, else the table grid."""
  return st["in_domain_grid"] if rule == "in_domain" and st["in_domain_grid"] else st["table_grid"]


def ready(data, allow_stale: bool = False) -> None:
  """Refuses, in one line, a sweep whose seeds phase still waits for its search, or stale jobs
  unless `allow_stale`."""
  if data.exp.waiting:
    raise sweep_lib.SweepError(next(iter(data.exp.waiting.values())))
  results_lib.check_stale(data, allow_stale)


def tables(data, rule: str):
  st = report_settings(data.sweep)
  return build_table(data.sweep, data.exp, data.results, grid_for(st, rule), rule, st["metric"], st["ddof"],
                     data.stale)


def collect(sweep, out_dir: str, exp: sweep_lib.Expansion | None = None, data=None, allow_stale: bool = False,
            results_file: bool = True) -> dict:
  """Writes tables.md, tables.tex, difficulty.md / .tex / .json (when the sweep has a
  difficulty grid), jobs.csv and (from run directories, with `results_file`) the results
  file results.jsonl.gz into `out_dir`; returns the markdown texts by name. `data` (a
  `fedjax_dg.bench.results.Data`) replaces reading the runs; stale jobs and a waiting
  seeds phase are refused first (`ready`)."""
  from_runs = data is None
  data = data or results_lib.from_runs(sweep, exp)
  ready(data, allow_stale)
  sweep, exp, results = data.sweep, data.exp, data.results
  st = report_settings(sweep)
  os.makedirs(out_dir, exist_ok=True)
  texts = {}
  if st["table_grid"] in sweep.grids:
    md, tex = [], []
    for rule in RULES:
      t = tables(data, rule)
      title = f"Test {st['metric']}, model selection: {RULE_TITLES[rule]}"
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
      _write(os.path.join(out_dir, "difficulty.json"), json.dumps(d, indent=1, sort_keys=True) + "\n")
  write_csv(job_rows(data, st["metric"]), os.path.join(out_dir, "jobs.csv"))
  if from_runs and results_file:
    results_lib.write(data, os.path.join(out_dir, RESULTS_FILE))
  return texts


def search_progress(sweep, exp: sweep_lib.Expansion) -> str:
  """While a seeds phase waits for its search (`bench status --search`): per cell of each
  search grid, how many trials have finished, how many failed, and the trial with the best
  mean validation score so far under the seeds phase's rule. Test scores are not shown:
  watching a search should not steer it."""
  from fedjax_dg import rundir
  metric = report_settings(sweep)["metric"]
  lines = []
  for name, g in sweep.grids.items():
    src = g.get("select_from", "")
    if not src or src not in sweep.grids:
      continue
    rule = g.get("select_rule", "heldout_domain")
    cells = {}
    for e in sweep_lib.grid_entries(exp, src):
      a = e.axes
      key = (a["method"], a["num_clients"], a["lam"], tuple(a["test_domains"]), tuple(a["val_domains"]))
      c = cells.setdefault(key, {"trials": set(), "scores": {}, "failed": 0})
      c["trials"].add(a["trial"])
      run = load_run(exp.jobs[e.key].workdir)
      s = rule_scores(run, rule, metric) if run is not None else None
      if s is not None and s["val"] is not None:
        c["scores"].setdefault(a["trial"], []).append(s["val"])
      elif run is None:
        events = [ev.get("event") for ev in rundir.read_events(exp.jobs[e.key].workdir)
                  if ev.get("event") in ("start", "done", "failed")]
        c["failed"] += bool(events) and events[-1] == "failed"
    lines.append(f"search grid {src!r} for grid {name!r} ({rule} validation {metric}, mean over the search's seeds; "
                 "test scores not shown):")
    folds = len({(k[3], k[4]) for k in cells}) > 1
    for (m, C, lam, test, val), c in cells.items():
      done = len(c["scores"])
      text = f"  {m} C={C}" + (f" lam={float(lam):g}" if lam is not None else "")
      if folds:
        text += f" test={','.join(map(str, test))} val={','.join(map(str, val))}"
      text += f": {done}/{len(c['trials'])} trials" + (f", {c['failed']} failed" if c["failed"] else "")
      if done:
        best = max(sorted(c["scores"]), key=lambda t: float(np.mean(c["scores"][t])))
        text += f"; best{' so far' if done < len(c['trials']) else ''} trial {best} " \
                f"({float(np.mean(c['scores'][best])):.3f})"
      lines.append(text)
  return "\n".join(lines) if lines else "no grid of this sweep runs seeds at a search's winners"


def _work_key(config) -> tuple:
  """What a round costs depends on: the algorithm, the number of clients and the local work
  per round (epochs, or steps where set)."""
  return (config.algorithm.name, int(config.num_clients), int(config.client.local_epochs),
          int(config.client.local_steps))


def _rounds_done(workdir: str) -> int:
  records = [r for r in read_records(workdir) if "round" in r] if os.path.exists(
      os.path.join(workdir, "metrics.jsonl")) else []
  return max((int(r["round"]) for r in records), default=0)


def per_round_costs(done: dict, exp: sweep_lib.Expansion, pilot=None) -> dict:
  """What a round costs, measured: `_work_key` (algorithm, number of clients, local work per
  round) -> the mean over finished runs of their share of their program's wall time
  (`wall_shares`) per round.

  Args:
    done: key -> {"summary"} of the sweep's finished runs.
    exp: the sweep's expansion (the runs' configs).
    pilot: a results file's `fedjax_dg.bench.results.Data` whose runs count too, or None.

  Returns:
    {work key: seconds per round}; a work key no finished run has is absent.
  """
  per_round = collections.defaultdict(list)
  sources = [(wall_shares(done), exp)] + ([(wall_shares(pilot.results), pilot.exp)] if pilot is not None else [])
  for shares, e in sources:
    for key, share in shares.items():
      if share > 0:
        config = e.jobs[key].config
        per_round[_work_key(config)].append(share / max(int(config.num_rounds), 1))
  return {k: float(np.mean(v)) for k, v in per_round.items()}


def job_seconds(exp: sweep_lib.Expansion) -> dict:
  """job key -> its estimated run time: its rounds times the measured cost of a round of the
  sweep's finished runs with the same algorithm, number of clients and local work per round
  (`per_round_costs`). What the local launcher orders its units by (`launch.longest_first`).

  Args:
    exp: the sweep's expansion.

  Returns:
    The estimate of every job of `exp` whose work a finished run measured (finished jobs
    included); the others are absent.
  """
  from fedjax_dg import rundir
  done = {}
  for key, job in exp.jobs.items():
    if not os.path.exists(os.path.join(job.workdir, "summary.json")):
      continue
    try:
      summary = rundir.read_summary(job.workdir)
    except rundir.RunDirError:
      continue
    if summary is not None:
      done[key] = {"summary": summary}
  per_round = per_round_costs(done, exp)
  out = {}
  for key, job in exp.jobs.items():
    cost = per_round.get(_work_key(job.config))
    if cost is not None:
      out[key] = int(job.config.num_rounds) * cost
  return out


def time_left(sweep, exp: sweep_lib.Expansion, workers: int, pilot=None) -> str:
  """`bench status`: an estimate of the run time the sweep still needs. A finished job's cost
  is its share of its program's wall time (`wall_shares`: a batch program's time split over
  its runs) per round; a job still to run costs its rounds left (all of them unless it is
  running, then those after its last evaluated round) times the mean per-round cost of the
  finished jobs with its algorithm, number of clients and local work per round. A seeds phase
  waiting for its search (`select_from`) counts its seeds in every cell of the search, each at
  the cost of the cell's own config. Jobs with no finished counterpart are named, not
  guessed. Wall time assumes `workers` equally busy workers. `pilot` (a results file's
  `fedjax_dg.bench.results.Data`, e.g. an earlier edition's) adds its finished runs to the
  per-round costs, so a sweep that has run nothing yet gets an estimate before it starts."""
  from fedjax_dg import rundir
  from fedjax_dg.bench import launch
  done, left = {}, []  # left: (what, job config, fraction of its rounds left)
  counts = collections.Counter()
  for key, job in exp.jobs.items():
    state = launch.job_state(job.workdir)
    if state == "done":
      done[key] = {"summary": rundir.read_summary(job.workdir)}
      continue
    if state == "broken":
      continue
    what = "running" if state == "running" else "to run"
    frac = 1.0 - _rounds_done(job.workdir) / max(int(job.config.num_rounds), 1) if state == "running" else 1.0
    left.append((what, job.config, max(frac, 0.0)))
    counts[what] += 1
  for name, g in sweep.grids.items():
    src = g.get("select_from", "")
    if name not in exp.waiting or src not in sweep.grids:
      continue
    cells = {}
    for e in sweep_lib.grid_entries(exp, src):
      a = e.axes
      cells.setdefault((a["method"], a["num_clients"], a["lam"], tuple(a["test_domains"]), tuple(a["val_domains"])),
                       exp.jobs[e.key].config)
    what = f"grid {name!r} after its search"
    for config in cells.values():
      left += [(what, config, 1.0)] * len(g.get("seeds", (0,)))
    counts[what] += len(cells) * len(g.get("seeds", (0,)))
  if not left:
    return "time left: none (every job has finished)"
  per_round = per_round_costs(done, exp, pilot)
  seconds, missing, unknown = collections.Counter(), collections.Counter(), collections.Counter()
  for what, config, frac in left:
    cost = per_round.get(_work_key(config))
    if cost is not None:
      seconds[what] += frac * int(config.num_rounds) * cost
    else:
      missing[f"{config.algorithm.name} C={int(config.num_clients)}"] += 1
      unknown[what] += 1
  total = sum(seconds.values())
  order = ["running", "to run"] + sorted(w for w in counts if w not in ("running", "to run"))
  parts = [f"{counts[w]} {w} {_hours(seconds[w])}" + (f" ({unknown[w]} of them not estimated)" if unknown[w] else "")
           for w in order if counts[w]]
  text = (f"time left (estimate): {_hours(total)} of run time, {_hours(total / max(workers, 1))} of wall time at "
          f"{workers} worker(s): " + ", ".join(parts) + ". From the measured time per round of the finished jobs "
          "with the same algorithm, number of clients and local work per round (a batch program's time shared by "
          "its runs); a running job counts the rounds after its last evaluation.")
  if missing:
    text += (f" Not counted, no finished job like them yet: {sum(missing.values())} jobs ("
             + ", ".join(f"{k}: {v}" for k, v in sorted(missing.items())) + ").")
  return text


def _hours(seconds: float) -> str:
  return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


RESULTS_FILE = "results.jsonl.gz"


def _dataset_name(sweep) -> str:
  """`sweep.report.dataset` where the sweep names its data (the loader's name can be shared:
  rotated Fashion-MNIST loads through `rotated_mnist`), else the loader's name."""
  label = sweep.get("report", {}).get("dataset", "")
  d = sweep.base.data
  return label or d.name + (f"/{d.dataset}" if d.get("dataset", "") else "")


def _write(path: str, text: str) -> None:
  with open(path, "w") as f:
    f.write(text)
