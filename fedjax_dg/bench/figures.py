"""Figures (matplotlib, Agg), each written as a PNG next to the CSV it is drawn from.

  fig2_clients      Bai et al. Fig. 2: held-out-domain-selected test metric vs the number of
                    clients C, one line per method, one column per lambda (C = 1: the
                    method's centralised counterpart, drawn in every panel); top row at a
                    fixed number of local epochs per round (`figures.clients_grid`), bottom
                    row at a fixed number of local steps per round
                    (`figures.clients_steps_grid`: steps x rounds the same at every C, so
                    the curve is about clients, not the step budget)
  fig3_rounds       Bai et al. Fig. 3: the same vs communication rounds at fixed total local
                    computation (rounds x local epochs constant), one panel per (C, lambda)
  fig4_curves_C<c>  Bai et al. Fig. 4 style: test metric vs round (fig4_heldout_val_C<c>: the
                    held-out validation domain's), small multiples: one row per method group
                    split into panels of at most `PER_PANEL` methods (the baseline, grey and
                    dashed, in each; no row of the baseline alone), one column per lambda
                    (mean over seeds at each cell's selected trial); at C = 100 a group's 5-7
                    overlapping bands in one panel could not be read. A method selected
                    within its final stage (FedLOE) is drawn at that stage's evaluations,
                    placed by the local steps taken (`final_stage_positions`)
  runs/<method>_C<c>_lam<l>_seed<s>_trial<t>_<key>  one run: every split's metric vs round
Points and lines are means over trial seeds with ±1 standard deviation (`ddof` as in
collect) as bands. Lambda runs 1, 0.1, 0 (Bai et al.'s order) in every figure. Colours are
the Okabe-Ito colour-blind-safe palette, cycled with line styles and markers; legends
show the methods' display names (`sweep.table.display`). PNGs carry no software or date
metadata, so the same numbers give the same bytes.
"""
from __future__ import annotations

import csv
import math
import os

import numpy as np

from fedjax_dg.bench import collect, sweep as sweep_lib

SPLIT_LABELS = {"heldout_val": "held-out validation domain", "in_val": "in-domain validation",
                "in_test": "in-domain test", "test": "test domain"}
# Okabe & Ito (2008), "Color universal design": distinguishable under the common colour-vision deficiencies.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
BASELINE_COLOUR = "#7F7F7F"
FIGURE_KEYS = ("clients_grid", "clients_steps_grid", "rounds_grid", "curves_grid", "per_run_grid")
PER_PANEL = 3  # methods a Fig. 4 panel draws beside the baseline


def _plt():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def save(fig, path: str, dpi: int = 120) -> None:
  """PNG without metadata (no matplotlib version, no date): equal inputs, equal bytes."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fig.savefig(path, dpi=dpi, metadata={"Software": None}, bbox_inches="tight")


def style(k: int) -> dict:
  """Line k's colour, line style and marker. Colour and marker change with every line and the
  line style with every line too (4 styles), so two lines that coincide (a method that
  collapses to FedAvg-ERM on single-domain clients) still show as two: dashes over a solid
  line. 8 colours x 4 styles before a colour and style repeat together."""
  return {"color": OKABE_ITO[k % 8], "linestyle": LINESTYLES[(k + k // 8) % 4], "marker": MARKERS[(k + k // 8) % 8]}


def fmt_num(v) -> str:
  """Floats in the CSVs as Python's shortest round-trip repr ("" for None)."""
  if v is None or v == "":
    return ""
  return repr(float(v)) if isinstance(v, (float, np.floating)) else str(v)


def write_rows(rows: list[dict], path: str) -> None:
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fields = list(dict.fromkeys(k for r in rows for k in r if not k.startswith("_")))  # "_values": not written
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows({k: fmt_num(v) for k, v in r.items() if not k.startswith("_")} for r in rows)


def read_rows(path: str) -> list[dict]:
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


# ---------------------------------------------------------------------------- data

def _lam(v):
  return None if v is None else float(v)


def point_rows(entries, results, keys: tuple, rule: str, metric: str, ddof: int, stale=frozenset()) -> list[dict]:
  """One row per distinct value of the axes `keys`: mean, std, standard error, n over seeds
  (and, not written to the CSV, the per-seed values, {seed: value}, and the cell's mark,
  `collect.cell_mark`)."""
  groups = {}
  for e in entries:
    groups.setdefault(tuple(_lam(e.axes[k]) if k == "lam" else e.axes[k] for k in keys), []).append(e)
  rows = []
  for k, es in groups.items():
    c = collect.cell(es, results, rule, metric, ddof, stale)
    if c.mean is not None:
      rows.append({**dict(zip(keys, k)), "mean": c.mean, "std": c.std, "se": c.se, "n": len(c.values),
                   "stale": c.stale, "_values": c.values, "_by_seed": c.by_seed, "_mark": c.mark})
  return rows


def clients_rows(sweep, exp, results, grid: str, rule: str, metric: str, ddof: int, stale=frozenset()) -> list[dict]:
  """Fig. 2's points: (lam, method, num_clients); C = 1 points repeated in every lambda panel."""
  entries = sweep_lib.grid_entries(exp, grid)
  base = point_rows(entries, results, ("method", "lam", "num_clients"), rule, metric, ddof, stale)
  lams = collect.lam_order(sweep.grids[grid].lams)
  rows = []
  for lam in lams:
    rows += [{**r, "lam": lam} for r in base if r["lam"] is None or r["lam"] == lam]
  return sorted(rows, key=lambda r: (lams.index(r["lam"]), r["method"], r["num_clients"]))


def rounds_rows(exp, results, grid: str, rule: str, metric: str, ddof: int, stale=frozenset()) -> list[dict]:
  """Fig. 3's points: (num_clients, lam, method, num_rounds, local_epochs)."""
  rows = point_rows(sweep_lib.grid_entries(exp, grid), results,
                    ("num_clients", "lam", "method", "num_rounds", "local_epochs"), rule, metric, ddof, stale)
  return sorted(rows, key=lambda r: (r["num_clients"], 1 if r["lam"] is None else -r["lam"], r["method"],
                                     r["num_rounds"]))


def steps_per_round(client_config, client_sizes) -> int:
  """K, the local steps per round of a run's largest client: the runner's rule
  (`fedjax_dg.plan.local_steps`, not imported here: it brings in the engine)."""
  c, n_max = client_config, max(int(n) for n in client_sizes)
  return int(c.local_steps) if c.local_steps > 0 else math.ceil(c.local_epochs * n_max / c.batch_size)


def final_stage_positions(run, config) -> dict | None:
  """{round: x} for a run that trains in two stages and is selected within the second
  (`summary.selection_scope`; FedLOE), else None: its final stage's evaluations placed at
  the local steps taken, in rounds of K steps (the other methods' rounds). Its first stage
  takes `local_steps` steps a round for its rounds (`summary.stages`); the final stage's
  rounds share what the run's budget of `num_rounds * K` steps has left, equally (the
  first stage's rounding remainder, fewer steps than one of its rounds, is counted in the
  final stage), so its last evaluation sits at `num_rounds`. A first stage that took the
  whole budget (a run configured to keep its first stage's schedule, `stage1_syncs = 0`)
  leaves the final stage past it: its rounds then count one round each after `num_rounds`
  (their steps are the method's own, not read here)."""
  sm = run["summary"]
  stages = sm.get("stages") or []
  if (sm.get("selection_scope", "all rounds") == "all rounds" or len(stages) != 2 or not sm.get("client_sizes")
      or not sm.get("local_steps")):
    return None  # not two stages, or a summary without what the placement reads
  K = steps_per_round(config.client, sm["client_sizes"])
  R = int(config.num_rounds)
  (lo, hi), (first_lo, first_hi) = stages[-1]["rounds"], stages[0]["rounds"]
  before = (int(first_hi) - int(first_lo) + 1) * int(sm["local_steps"])  # steps before the final stage
  n = int(hi) - int(lo) + 1
  if before >= R * K:
    return {t: float(R + t - int(lo) + 1) for t in range(int(lo), int(hi) + 1)}
  per = (R * K - before) / n
  return {t: (before + (t - int(lo) + 1) * per) / K for t in range(int(lo), int(hi) + 1)}


def curve_rows(exp, results, grid: str, num_clients: int, rule: str, metric: str, ddof: int = 1) -> list[dict]:
  """Fig. 4's lines for clients `num_clients`: per (lam, method, split, round) the mean and
  std over (seed, fold) of the runs at the cell's selected trial. A cell the tables mark (`collect.cell_mark`:
  equal to the baseline by construction, or its method's term did not act) draws no line: it
  would repeat the baseline's training under the method's name. A method that trains in
  stages and is selected within its final stage (FedLOE) draws that stage's evaluations
  only, the models its selection chooses among, at the local steps taken in rounds of the
  other methods' K steps (`final_stage_positions`; `round` the mean position over seeds,
  `staged` True): its first stage is another method's training ("Our FedAvg") on a schedule
  of its own, whose round index is not the other methods' round."""
  entries = [e for e in sweep_lib.grid_entries(exp, grid) if e.axes["num_clients"] == num_clients]
  groups = {}
  for e in entries:
    groups.setdefault((_lam(e.axes["lam"]), e.axes["method"]), []).append(e)
  rows = []
  for (lam, method), es in sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
    chosen = collect.chosen_entries(es, results, rule, metric)
    keys = [chosen[k].key for k in sorted(chosen)]
    runs = [results[k] for k in keys]
    if collect.cell_mark(runs)[0]:
      continue
    places = [final_stage_positions(run, exp.jobs[k].config) for k, run in zip(keys, runs)]
    staged = any(p is not None for p in places)
    for split in ("heldout_val", "test"):
      per_round, xs = {}, {}
      for run, place in zip(runs, places):
        if staged and place is None:
          continue  # not the stages the cell's other runs trained in (not a case the runner makes)
        recs = [r for r in run["records"] if place is None or r["round"] in place]
        for i, r in enumerate(recs):
          v = collect.metric_of(r["splits"].get(split), metric)
          if v is not None:
            t = i if place is not None else r["round"]  # a staged run: its final stage's i-th evaluation
            per_round.setdefault(t, []).append(v)
            xs.setdefault(t, []).append(place[r["round"]] if place is not None else r["round"])
      rows += [{"lam": lam, "method": method, "split": split,
                "round": float(np.mean(xs[t])) if staged else t, "mean": float(np.mean(v)),
                "std": float(np.std(v, ddof=ddof)) if len(v) > 1 else 0.0, "n": len(v), "staged": staged}
               for t, v in sorted(per_round.items())]
  return rows


# ---------------------------------------------------------------------------- drawing

def _integer_locator():
  from matplotlib.ticker import MaxNLocator
  return MaxNLocator(integer=True)


def _line(ax, xs, ys, sds, label, st: dict, band: bool = True):
  xs, ys = np.asarray(xs, float), np.asarray(ys, float)
  sds = np.asarray([0.0 if e in ("", None) else float(e) for e in sds])
  ax.plot(xs, ys, label=label, lw=1.4, ms=4, **st)
  if band and len(xs) > 1:
    ax.fill_between(xs, ys - sds, ys + sds, color=st["color"], alpha=0.15, lw=0)
  elif band:
    ax.errorbar(xs, ys, yerr=sds, color=st["color"], capsize=3, lw=1)


def _legend(fig, axes, ncol: int = 1):
  handles, labels = {}, []
  for ax in np.ravel(axes):
    for h, l in zip(*ax.get_legend_handles_labels()):
      if l not in handles:
        handles[l] = h
        labels.append(l)
  fig.legend([handles[l] for l in labels], labels, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5),
             ncol=ncol, frameon=False)


def _order(methods, order: dict) -> list:
  return sorted(dict.fromkeys(methods), key=lambda m: (order.get(m, len(order)), m))


def plot_clients(panels: list, path: str, metric: str, names: dict, order: dict) -> None:
  """`panels`: [(row title, rows)], one figure row each (fixed epochs, fixed steps)."""
  plt = _plt()
  lams = list(dict.fromkeys(r["lam"] for _, rows in panels for r in rows))
  fig, axes = plt.subplots(len(panels), len(lams), figsize=(3.6 * len(lams) + 0.6, 3.2 * len(panels)),
                           squeeze=False, sharey=True)
  methods = _order((r["method"] for _, rows in panels for r in rows), order)
  for i, (title, rows) in enumerate(panels):
    cs = sorted({r["num_clients"] for r in rows})
    for j, lam in enumerate(lams):
      ax = axes[i][j]
      for k, m in enumerate(methods):
        pts = sorted((r for r in rows if r["lam"] == lam and r["method"] == m), key=lambda r: r["num_clients"])
        _line(ax, [r["num_clients"] for r in pts], [r["mean"] for r in pts], [r["std"] for r in pts],
              names.get(m, m), style(k))
      ax.set_xscale("log")
      ax.set_xticks(cs, [str(c) for c in cs])
      ax.minorticks_off()
      ax.set_title(f"{title}, λ = {lam:g}", fontsize=9)
      ax.set_xlabel("number of clients C")
      ax.grid(alpha=0.3)
    axes[i][0].set_ylabel(f"test {metric}")
  _legend(fig, axes)
  fig.tight_layout()
  save(fig, path)
  plt.close(fig)


def plot_rounds(rows: list[dict], path: str, metric: str, names: dict, order: dict) -> None:
  plt = _plt()
  panels = list(dict.fromkeys((r["num_clients"], r["lam"]) for r in rows))
  fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 0.6, 3.2), squeeze=False, sharey=True)
  axes = axes[0]
  for ax, (C, lam) in zip(axes, panels):
    for k, m in enumerate(_order((r["method"] for r in rows), order)):
      pts = sorted((r for r in rows if (r["num_clients"], r["lam"]) == (C, lam) and r["method"] == m),
                   key=lambda r: r["num_rounds"])
      _line(ax, [r["num_rounds"] for r in pts], [r["mean"] for r in pts], [r["std"] for r in pts],
            names.get(m, m), style(k))
      for r in pts:
        ax.annotate(f"E={r['local_epochs']}", (r["num_rounds"], r["mean"]), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize=7)
    rs = sorted({r["num_rounds"] for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(rs, [str(x) for x in rs])
    ax.minorticks_off()
    ax.set_title(f"C = {C}" + ("" if lam is None else f", λ = {lam:g}"), fontsize=9)
    ax.set_xlabel("rounds R (R x local epochs E fixed)")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel(f"test {metric} (held-out-domain selection)")
  _legend(fig, axes)
  fig.tight_layout()
  save(fig, path)
  plt.close(fig)


def plot_curves(rows: list[dict], path: str, metric: str, num_clients: int, split: str, groups: list, names: dict,
                order: dict, baseline: str) -> None:
  """One row per method group (`groups`: [(group, methods)]), one column per lambda; the
  baseline drawn grey and dashed in every row for reference, the group's other methods in
  distinct colours (at most 8 a group before a colour repeats with another line style)."""
  plt = _plt()
  rows = [r for r in rows if r["split"] == split]
  lams = list(dict.fromkeys(r["lam"] for r in rows))
  fig, axes = plt.subplots(len(groups), len(lams), figsize=(3.6 * len(lams) + 2.4, 2.6 * len(groups)),
                           squeeze=False, sharey=True, sharex=True)
  for i, (group, members) in enumerate(groups):
    for j, lam in enumerate(lams):
      ax = axes[i][j]
      others = [x for x in members if x != baseline]
      for m in members:
        pts = [r for r in rows if r["lam"] == lam and r["method"] == m]
        if not pts:  # not run here (or marked): no line, and no legend entry from this panel
          continue
        st = {"color": BASELINE_COLOUR, "linestyle": "--"} if m == baseline else style(others.index(m))
        staged = any(r.get("staged") for r in pts)  # its final stage's evaluations: marked
        _line(ax, [float(r["round"]) for r in pts], [r["mean"] for r in pts], [r["std"] for r in pts],
              names.get(m, m) + (" (final stage)" if staged else ""), {**st, "marker": st.get("marker") if staged else None})
      ax.set_title(f"{group}: C = {num_clients}, λ = {lam:g}", fontsize=8)
      ax.xaxis.set_major_locator(_integer_locator())
      ax.grid(alpha=0.3)
      if i == len(groups) - 1:
        ax.set_xlabel("round")
    axes[i][0].set_ylabel(f"{metric}")
    drawn = {}  # the row's lines, from every panel, in drawing order: one legend per group
    for ax in axes[i]:
      for h, label in zip(*ax.get_legend_handles_labels()):
        drawn.setdefault(label, h)
    axes[i][-1].legend(list(drawn.values()), list(drawn), fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5),
                       frameon=False)
  fig.suptitle(f"{SPLIT_LABELS[split]} {metric} vs round (mean ± std over seeds at each cell's selected trial)",
               fontsize=9)
  fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))  # the title above the first row's titles
  save(fig, path, dpi=110)
  plt.close(fig)


def run_curve_rows(records: list[dict], metric: str = "accuracy") -> list[dict]:
  return [{"round": r["round"], "split": k, metric: v[metric]}
          for r in records for k, v in sorted(r["splits"].items()) if metric in v]


def plot_run(records: list[dict], out_png: str, metric: str = "accuracy", title: str = "") -> list[dict]:
  """Every split's `metric` vs round from one run's evaluations; writes the PNG and its CSV."""
  rows = run_curve_rows(records, metric)
  if not rows:
    raise FileNotFoundError(f"{out_png}: the run has no evaluations to plot")
  plt = _plt()
  fig, ax = plt.subplots(figsize=(6.8, 3.4))
  for k, split in enumerate(dict.fromkeys(r["split"] for r in rows)):
    pts = [r for r in rows if r["split"] == split]
    ax.plot([r["round"] for r in pts], [r[metric] for r in pts], label=SPLIT_LABELS.get(split, split), **style(k))
  ax.set_xlabel("round")
  ax.xaxis.set_major_locator(_integer_locator())
  ax.set_ylabel(metric)
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)  # beside, never over a curve
  fig.tight_layout()
  save(fig, out_png, dpi=110)
  plt.close(fig)
  write_rows(rows, os.path.splitext(out_png)[0] + ".csv")
  return rows


def run_name(axes: dict, key: str) -> str:
  """A run's figure name from what it is: method, C, lambda, seed, trial, and the job key."""
  lam = "" if axes.get("lam") is None else f"_lam{float(axes['lam']):g}"
  return (f"{axes['method'].replace('+', '-')}_C{axes['num_clients']}{lam}_seed{axes['seed']}"
          f"_trial{axes.get('trial', 0)}_{key[:8]}")


# ---------------------------------------------------------------------------- the command

def no_figures(sweep) -> str | None:
  """One line when the sweep names no figure grid (None when it names one)."""
  f = sweep.get("figures", {})
  if any(f.get(k, "") in sweep.grids for k in FIGURE_KEYS):
    return None
  return ("no figures: the sweep names no grid of its own in sweep.figures (" + ", ".join(FIGURE_KEYS)
          + "); set e.g. --sweep.figures.curves_grid=table")


def method_order(sweep) -> tuple[dict, dict, list]:
  """(display names, method -> index in the table's row order, [(group, methods)])."""
  names = collect.display_names(sweep)
  methods = []
  for g in sweep.grids.values():
    methods += [m for m in g.get("methods", ()) if m not in methods]
  grid = sweep_lib_grid_for_rows(sweep)
  rows = collect.table_rows(sweep, grid)
  order = {m: i for i, (_, m, _) in enumerate(rows)}
  for m in methods:
    order.setdefault(m, len(order))
  groups = {}
  for group, m, _ in rows:
    groups.setdefault(group, []).append(m)
  return names, order, list(groups.items())


def sweep_lib_grid_for_rows(sweep):
  """A grid-like record holding every method of every grid (for the row order)."""
  import ml_collections
  methods = []
  for g in sweep.grids.values():
    methods += [m for m in g.get("methods", ()) if m not in methods]
  return ml_collections.ConfigDict({"methods": methods})


def make_figures(sweep, out_dir: str, exp=None, results=None, data=None, allow_stale: bool = False) -> list[str]:
  """Every figure the sweep's `figures` block names; returns the PNG paths."""
  from fedjax_dg.bench import results as results_lib
  if data is None:
    if results is not None:
      data = results_lib.Data(sweep, exp, results, {}, frozenset())
    else:
      data = results_lib.from_runs(sweep, exp)
      collect.ready(data, allow_stale)
  sweep, exp, results, stale = data.sweep, data.exp, data.results, data.stale
  st = collect.report_settings(sweep)
  f = sweep.get("figures", {})
  metric, ddof, rule = st["metric"], st["ddof"], "heldout_domain"
  names, order, groups = method_order(sweep)
  from fedjax_dg.algorithms import BASELINE
  baseline = sweep.get("report", {}).get("baseline", "") or BASELINE
  os.makedirs(out_dir, exist_ok=True)
  made = []

  def has(key):
    return f.get(key, "") in sweep.grids and sweep_lib.grid_entries(exp, f[key])

  def emit(rows, stem, plot, *args):
    if rows:
      write_rows(rows, os.path.join(out_dir, stem + ".csv"))
      plot(rows, os.path.join(out_dir, stem + ".png"), *args)
      made.append(os.path.join(out_dir, stem + ".png"))

  panels = []
  if has("clients_grid"):
    rows = clients_rows(sweep, exp, results, f.clients_grid, rule, metric, ddof, stale)
    panels.append(("fixed local epochs", [{**r, "budget": "epochs"} for r in rows]))
  if has("clients_steps_grid"):
    rows = clients_rows(sweep, exp, results, f.clients_steps_grid, rule, metric, ddof, stale)
    panels.append(("fixed local steps", [{**r, "budget": "steps"} for r in rows]))
  panels = [(t, rows) for t, rows in panels if rows]
  if panels:
    write_rows([r for _, rows in panels for r in rows], os.path.join(out_dir, "fig2_clients.csv"))
    plot_clients(panels, os.path.join(out_dir, "fig2_clients.png"), metric, names, order)
    made.append(os.path.join(out_dir, "fig2_clients.png"))
  if has("rounds_grid"):
    emit(rounds_rows(exp, results, f.rounds_grid, rule, metric, ddof, stale), "fig3_rounds", plot_rounds, metric,
         names, order)
  if has("curves_grid"):
    g = sweep.grids[f.curves_grid]
    grid_groups = [(gr, [m for m in ms if m in g.methods]) for gr, ms in groups]
    grid_groups = [(gr, ([baseline] if baseline in g.methods and baseline not in ms else []) + ms)
                   for gr, ms in grid_groups if ms]
    grid_groups = small_multiples(grid_groups, baseline)
    for C in [int(c) for c in g.client_counts if int(c) > 1]:
      rows = curve_rows(exp, results, f.curves_grid, C, rule, metric, ddof)
      if rows:
        write_rows(rows, os.path.join(out_dir, f"fig4_curves_C{C}.csv"))
        for split in ("test", "heldout_val"):  # fig4_curves_C<c>.png: the test domain
          path = os.path.join(out_dir, f"fig4_{'curves' if split == 'test' else split}_C{C}.png")
          plot_curves(rows, path, metric, C, split, grid_groups, names, order, baseline)
          made.append(path)
  for key, axes in _per_run(sweep, exp, results):
    made.append(os.path.join(out_dir, "runs", run_name(axes, key) + ".png"))
    plot_run(results[key]["records"], made[-1], metric, run_title(axes, names))
  return made


def small_multiples(groups: list, baseline: str, per_panel: int = PER_PANEL) -> list:
  """[(group, methods)] split so that each row draws at most `per_panel` methods besides the
  baseline, which every row keeps first: ("DG adapted", [b, m1..m6]) -> ("DG adapted 1/2",
  [b, m1, m2, m3]), ("DG adapted 2/2", [b, m4, m5, m6]). A group of the baseline alone
  gets no row where another group has one (every row draws the baseline already)."""
  if any(m != baseline for _, ms in groups for m in ms):
    groups = [(g, ms) for g, ms in groups if any(m != baseline for m in ms)]
  out = []
  for group, members in groups:
    others = [m for m in members if m != baseline]
    lead = [baseline] if baseline in members else []
    chunks = [others[i:i + per_panel] for i in range(0, len(others), per_panel)] or [[]]
    for k, chunk in enumerate(chunks):
      out.append((group if len(chunks) == 1 else f"{group} {k + 1}/{len(chunks)}", lead + chunk))
  return out


def run_title(axes: dict, names: dict) -> str:
  """A per-run figure's title in display names: "FedAvg-ERM, C = 20, λ = 1, seed 0, trial 3"."""
  parts = [names.get(axes["method"], axes["method"]), f"C = {axes['num_clients']}"]
  parts += [] if axes.get("lam") is None else [f"λ = {float(axes['lam']):g}"]
  parts += [f"seed {axes['seed']}"] + ([f"trial {axes['trial']}"] if axes.get("trial") else [])
  return ", ".join(parts)


def _per_run(sweep, exp, results) -> list[tuple]:
  """(key, axes) of the finished runs of `figures.per_run_grid` whose method is in
  `figures.per_run_methods` (all when empty) and whose seed is in `figures.per_run_seeds`
  (all when empty)."""
  f = sweep.get("figures", {})
  grid = f.get("per_run_grid", "")
  if not grid:
    return []
  methods, seeds = set(f.get("per_run_methods", ())), set(f.get("per_run_seeds", ()))
  out = {}
  for e in sweep_lib.grid_entries(exp, grid):
    if e.key in results and (not methods or e.axes["method"] in methods) and (not seeds or e.axes["seed"] in seeds):
      out.setdefault(e.key, e.axes)
  return list(out.items())
