"""Figures (matplotlib, Agg), each written as a PNG next to the CSV it is drawn from.

  fig2_clients      seed 001 Fig. 2: held-out-domain-selected test metric vs the number of
                    clients C, one line per method, one panel per lambda (C = 1: the
                    method's centralised counterpart, drawn in every panel)
  fig3_rounds       seed 001 Fig. 3: the same vs communication rounds at fixed total local
                    computation (rounds x local epochs constant), one panel per (C, lambda)
  fig4_curves_C<c>  seed 001 Fig. 4 style: held-out validation and test metric vs round, one
                    line per method (mean over seeds of each seed's selected trial), one
                    column per lambda
  run_curves        one run's metrics.jsonl: every split's metric vs round
Points are means over trial seeds with the standard deviation as error bars (`ddof` as
in collect).
"""
from __future__ import annotations

import csv
import os

import numpy as np

from fedjax_dg.bench import collect, sweep as sweep_lib

SPLIT_LABELS = {"heldout_val": "held-out validation domain", "in_val": "in-domain validation",
                "in_test": "in-domain test", "test": "test domain"}


def _plt():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def write_rows(rows: list[dict], path: str) -> None:
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  fields = list(dict.fromkeys(k for r in rows for k in r))
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)


def read_rows(path: str) -> list[dict]:
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


# ---------------------------------------------------------------------------- data

def point_rows(entries, results, keys: tuple, rule: str, metric: str, ddof: int) -> list[dict]:
  """One row per distinct value of the axes `keys`: mean, std and count over seeds."""
  groups = {}
  for e in entries:
    groups.setdefault(tuple(e.axes[k] for k in keys), []).append(e)
  rows = []
  for k, es in groups.items():
    c = collect.cell(es, results, rule, metric, ddof)
    if c.mean is not None:
      rows.append({**dict(zip(keys, k)), "mean": c.mean, "std": c.std if c.std is not None else "",
                   "n": len(c.values)})
  return rows


def clients_rows(sweep, exp, results, grid: str, rule: str, metric: str, ddof: int) -> list[dict]:
  """Fig. 2's points: (lam, method, num_clients); C = 1 points repeated in every lambda panel."""
  entries = sweep_lib.grid_entries(exp, grid)
  base = point_rows(entries, results, ("method", "lam", "num_clients"), rule, metric, ddof)
  lams = [float(l) for l in sweep.grids[grid].lams]
  rows = []
  for lam in lams:
    rows += [{**r, "lam": lam} for r in base if r["lam"] is None or r["lam"] == lam]
  return sorted(rows, key=lambda r: (lams.index(r["lam"]), r["method"], r["num_clients"]))


def rounds_rows(exp, results, grid: str, rule: str, metric: str, ddof: int) -> list[dict]:
  """Fig. 3's points: (num_clients, lam, method, num_rounds, local_epochs)."""
  rows = point_rows(sweep_lib.grid_entries(exp, grid), results,
                    ("num_clients", "lam", "method", "num_rounds", "local_epochs"), rule, metric, ddof)
  return sorted(rows, key=lambda r: (r["num_clients"], -1 if r["lam"] is None else r["lam"], r["method"],
                                     r["num_rounds"]))


def curve_rows(exp, results, grid: str, num_clients: int, rule: str, metric: str) -> list[dict]:
  """Fig. 4's lines for clients `num_clients`: per (lam, method, split, round) the mean over
  (seed, fold) of each seed's selected trial."""
  entries = [e for e in sweep_lib.grid_entries(exp, grid) if e.axes["num_clients"] == num_clients]
  groups = {}
  for e in entries:
    groups.setdefault((e.axes["lam"], e.axes["method"]), []).append(e)
  rows = []
  for (lam, method), es in groups.items():
    runs = [results[e.key] for e in collect.chosen_entries(es, results, rule, metric).values()]
    for split in ("heldout_val", "test"):
      per_round = {}
      for run in runs:
        for r in run["records"]:
          v = collect._metric(r["splits"].get(split), metric)
          if v is not None:
            per_round.setdefault(r["round"], []).append(v)
      rows += [{"lam": lam, "method": method, "split": split, "round": t, "mean": float(np.mean(v)), "n": len(v)}
               for t, v in sorted(per_round.items())]
  return rows


# ---------------------------------------------------------------------------- drawing

def _integer_locator():
  from matplotlib.ticker import MaxNLocator
  return MaxNLocator(integer=True)


def _panels(plt, n: int, height: float = 3.2):
  fig, axes = plt.subplots(1, n, figsize=(3.6 * n + 0.8, height), squeeze=False, sharey=True)
  return fig, axes[0]


def _errorbar(ax, xs, ys, es, label):
  es = [0.0 if e in ("", None) else float(e) for e in es]
  ax.errorbar(xs, ys, yerr=es, marker="o", ms=4, capsize=3, label=label)


def plot_clients(rows: list[dict], path: str, metric: str) -> None:
  plt = _plt()
  lams = list(dict.fromkeys(r["lam"] for r in rows))
  fig, axes = _panels(plt, len(lams))
  for ax, lam in zip(axes, lams):
    for m in dict.fromkeys(r["method"] for r in rows):
      pts = sorted((r for r in rows if r["lam"] == lam and r["method"] == m), key=lambda r: r["num_clients"])
      _errorbar(ax, [r["num_clients"] for r in pts], [r["mean"] for r in pts], [r["std"] for r in pts], m)
    cs = sorted({r["num_clients"] for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(cs, [str(c) for c in cs])
    ax.minorticks_off()
    ax.set_title(f"λ = {lam:g}")
    ax.set_xlabel("number of clients C")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel(f"test {metric} (held-out-domain selection)")
  axes[-1].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_rounds(rows: list[dict], path: str, metric: str) -> None:
  plt = _plt()
  panels = list(dict.fromkeys((r["num_clients"], r["lam"]) for r in rows))
  fig, axes = _panels(plt, len(panels))
  for ax, (C, lam) in zip(axes, panels):
    for m in dict.fromkeys(r["method"] for r in rows):
      pts = sorted((r for r in rows if (r["num_clients"], r["lam"]) == (C, lam) and r["method"] == m),
                   key=lambda r: r["num_rounds"])
      _errorbar(ax, [r["num_rounds"] for r in pts], [r["mean"] for r in pts], [r["std"] for r in pts], m)
      for r in pts:
        ax.annotate(f"E={r['local_epochs']}", (r["num_rounds"], r["mean"]), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize=7)
    rs = sorted({r["num_rounds"] for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(rs, [str(x) for x in rs])
    ax.minorticks_off()
    ax.set_title(f"C = {C}" + ("" if lam is None else f", λ = {lam:g}"))
    ax.set_xlabel("rounds R (R x local epochs E fixed)")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel(f"test {metric} (held-out-domain selection)")
  axes[-1].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _style(k: int) -> dict:
  """A distinct colour and line style for the k-th of up to 40 lines (tab20, then dashed)."""
  import matplotlib
  return {"color": matplotlib.colormaps["tab20"](k % 20), "linestyle": ("-", "--")[(k // 20) % 2]}


def plot_curves(rows: list[dict], path: str, metric: str, num_clients: int) -> None:
  plt = _plt()
  lams = list(dict.fromkeys(r["lam"] for r in rows))
  fig, axes = plt.subplots(2, len(lams), figsize=(3.8 * len(lams) + 1.5, 6), squeeze=False, sharey="row")
  methods = list(dict.fromkeys(r["method"] for r in rows))
  for j, lam in enumerate(lams):
    for i, split in enumerate(("heldout_val", "test")):
      ax = axes[i][j]
      for k, m in enumerate(methods):
        pts = [r for r in rows if r["lam"] == lam and r["method"] == m and r["split"] == split]
        ax.plot([r["round"] for r in pts], [r["mean"] for r in pts], label=m, lw=1.2, **_style(k))
      ax.set_title(f"C = {num_clients}, λ = {lam:g}: {SPLIT_LABELS[split]}", fontsize=9)
      ax.xaxis.set_major_locator(_integer_locator())
      ax.grid(alpha=0.3)
      ax.set_xlabel("round")
    axes[0][0].set_ylabel(metric)
    axes[1][0].set_ylabel(metric)
  axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.0))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def run_curve_rows(workdir: str, metric: str = "accuracy") -> list[dict]:
  return [{"round": r["round"], "split": k, metric: v[metric]}
          for r in collect.read_records(workdir) for k, v in r["splits"].items() if metric in v]


def plot_run(workdir: str, out_png: str, metric: str = "accuracy", title: str = "") -> list[dict]:
  """Every split's `metric` vs round from one run's metrics.jsonl; writes the PNG and its CSV."""
  rows = run_curve_rows(workdir, metric)
  if not rows:
    raise FileNotFoundError(f"{workdir}/metrics.jsonl: no evaluations to plot")
  plt = _plt()
  fig, ax = plt.subplots(figsize=(5.2, 3.4))
  for split in dict.fromkeys(r["split"] for r in rows):
    pts = [r for r in rows if r["split"] == split]
    ax.plot([r["round"] for r in pts], [r[metric] for r in pts], marker=".", label=SPLIT_LABELS.get(split, split))
  ax.set_xlabel("round")
  ax.xaxis.set_major_locator(_integer_locator())
  ax.set_ylabel(metric)
  ax.set_title(title or os.path.basename(os.path.normpath(workdir)), fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(out_png) or ".", exist_ok=True)
  fig.savefig(out_png, dpi=110)
  plt.close(fig)
  write_rows(rows, os.path.splitext(out_png)[0] + ".csv")
  return rows


# ---------------------------------------------------------------------------- the command

def make_figures(sweep, out_dir: str, exp=None, results=None) -> list[str]:
  """Every figure the sweep's `figures` block names; returns the PNG paths."""
  exp = exp or sweep_lib.expand(sweep)
  results = results if results is not None else collect.load_results(exp)
  st = collect.report_settings(sweep)
  f = sweep.get("figures", {})
  metric, ddof, rule = st["metric"], st["ddof"], "heldout_domain"
  os.makedirs(out_dir, exist_ok=True)
  made = []

  def emit(rows, stem, plot, *args):
    if rows:
      write_rows(rows, os.path.join(out_dir, stem + ".csv"))
      plot(rows, os.path.join(out_dir, stem + ".png"), *args)
      made.append(os.path.join(out_dir, stem + ".png"))

  if f.get("clients_grid", "") in sweep.grids:
    emit(clients_rows(sweep, exp, results, f.clients_grid, rule, metric, ddof), "fig2_clients", plot_clients, metric)
  if f.get("rounds_grid", "") in sweep.grids:
    emit(rounds_rows(exp, results, f.rounds_grid, rule, metric, ddof), "fig3_rounds", plot_rounds, metric)
  if f.get("curves_grid", "") in sweep.grids:
    for C in [int(c) for c in sweep.grids[f.curves_grid].client_counts if int(c) > 1]:
      emit(curve_rows(exp, results, f.curves_grid, C, rule, metric), f"fig4_curves_C{C}", plot_curves, metric, C)
  for key in _per_run_keys(sweep, exp, results):
    made.append(os.path.join(out_dir, "runs", key + ".png"))
    e = next(e for e in exp.entries if e.key == key)
    plot_run(exp.jobs[key].workdir, made[-1], metric, sweep_lib.describe(e.axes))
  return made


def _per_run_keys(sweep, exp, results) -> list[str]:
  """Finished runs of `figures.per_run_grid` whose method is in `figures.per_run_methods`
  (all when empty) and whose seed is in `figures.per_run_seeds` (all when empty)."""
  f = sweep.get("figures", {})
  grid = f.get("per_run_grid", "")
  if not grid:
    return []
  methods, seeds = set(f.get("per_run_methods", ())), set(f.get("per_run_seeds", ()))
  keys = [e.key for e in sweep_lib.grid_entries(exp, grid)
          if e.key in results and (not methods or e.axes["method"] in methods) and (not seeds or e.axes["seed"] in seeds)]
  return list(dict.fromkeys(keys))
