"""REPORT.md from a sweep's finished runs: tables, Table 6, figures, timing, and the numbers
behind seed 001's remarks 4.1, 4.2, 4.7 and 4.8 stated as measured facts (which way each
comparison goes and by how much), for the author to read before writing any conclusion.

  python -m fedjax_dg.bench report --sweep configs/sweeps/report.py
"""
from __future__ import annotations

import collections
import os

from fedjax_dg.bench import collect, figures, launch, sweep as sweep_lib


def _fmt(v, digits=3):
  return "X" if v is None else f"{v:.{digits}f}"


def _duration(seconds: float) -> str:
  return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def timing(exp, results) -> dict:
  """Summed wall time (s) of the finished runs per grid (a job shared by grids counts in
  the first) and in total; the backend they ran on."""
  per, seen, backends = collections.Counter(), set(), set()
  for e in exp.entries:
    if e.key in results and e.key not in seen:
      seen.add(e.key)
      sm = results[e.key]["summary"]
      per[e.grid] += sm.get("wall_time_s", 0.0)
      backends.add(f"{sm.get('backend', '?')} x{sm.get('devices', '?')}")
  return {"per_grid": dict(per), "total": sum(per.values()), "backends": sorted(backends)}


def _baseline() -> str:
  from fedjax_dg.algorithms import BASELINE
  return BASELINE


def remark_4_1(table: collect.Table, baseline: str) -> list[str]:
  """FedAvg-ERM a strong baseline: its rank in each column, and each column's best."""
  out = []
  for col in table.columns:
    vals = sorted(((c.mean, m) for (m, k), c in table.cells.items() if k == col and c and c.mean is not None),
                  reverse=True)
    base = table.cells.get((baseline, col))
    if not vals or base is None or base.mean is None:
      continue
    rank = 1 + sum(v > base.mean for v, _ in vals)
    out.append(f"{collect._column_label(col, False)}: {baseline} {_fmt(base.mean)} ranks {rank} of {len(vals)}; "
               f"best {vals[0][1]} {_fmt(vals[0][0])}")
  return out


def remark_4_2(table: collect.Table, methods) -> list[str]:
  """DG methods degrade in FL (C = 1 -> C > 1) and as lambda falls."""
  out = []
  fl_cols = [c for c in table.columns if c[1] is not None]
  for m in methods:
    cen = table.cells.get((m, (1, None)))
    parts = []
    for col in fl_cols:
      c = table.cells.get((m, col))
      if c is None or c.mean is None:
        continue
      d = "" if cen is None or cen.mean is None else f" ({c.mean - cen.mean:+.3f} vs C=1)"
      parts.append(f"{collect._column_label(col, False)} {_fmt(c.mean)}{d}")
    if parts:
      out.append(f"{m}: C=1 {_fmt(cen.mean if cen else None)}; " + "; ".join(parts))
  return out


def _trend(xs, ys) -> str:
  diffs = [b - a for a, b in zip(ys, ys[1:])]
  if all(d <= 0 for d in diffs):
    return "never rises"
  if all(d >= 0 for d in diffs):
    return "never falls"
  return f"is not monotone (best at {xs[max(range(len(ys)), key=ys.__getitem__)]})"


def remark_4_7(rows: list[dict]) -> list[str]:
  """Accuracy vs number of clients, per (lambda, method)."""
  out = []
  for lam, m in dict.fromkeys((r["lam"], r["method"]) for r in rows):
    pts = sorted((r for r in rows if r["lam"] == lam and r["method"] == m), key=lambda r: r["num_clients"])
    if len(pts) > 1:
      xs, ys = [r["num_clients"] for r in pts], [r["mean"] for r in pts]
      out.append(f"λ={lam:g} {m}: " + ", ".join(f"C={x} {_fmt(y)}" for x, y in zip(xs, ys))
                 + f"; as C grows it {_trend(xs, ys)}")
  return out


def remark_4_8(rows: list[dict]) -> list[str]:
  """Accuracy vs rounds at fixed computation, per (C, lambda, method)."""
  out = []
  for C, lam, m in dict.fromkeys((r["num_clients"], r["lam"], r["method"]) for r in rows):
    pts = sorted((r for r in rows if (r["num_clients"], r["lam"], r["method"]) == (C, lam, m)),
                 key=lambda r: r["num_rounds"])
    if len(pts) > 1:
      xs, ys = [r["num_rounds"] for r in pts], [r["mean"] for r in pts]
      out.append(f"C={C} λ={lam:g} {m}: " + ", ".join(f"R={x} {_fmt(y)}" for x, y in zip(xs, ys))
                 + f"; as rounds grow it {_trend(xs, ys)}")
  return out


def _bullets(lines):
  return "\n".join(f"- {l}" for l in lines) if lines else "- (no finished runs for this yet)"


def _reading(path: str) -> str:
  """The hand-written reading of the numbers (`sweep.report.reading`, a markdown file kept
  beside the results), included verbatim so that regenerating the report keeps it."""
  if path and os.path.isfile(path):
    with open(path, encoding="utf-8") as fh:
      return fh.read().strip()
  return f"(not written yet: put it in `{path or 'sweep.report.reading'}`, which is included here verbatim)"


def write_report(sweep, out_dir: str, exp=None) -> str:
  exp = exp or sweep_lib.expand(sweep)
  results = collect.load_results(exp)
  st = collect.report_settings(sweep)
  texts = collect.collect(sweep, out_dir, exp)
  fig_dir = os.path.join(out_dir, "figures")
  pngs = figures.make_figures(sweep, fig_dir, exp, results)
  rows = launch.status(exp)
  counts = collections.Counter(r["state"] for r in rows)
  tm = timing(exp, results)
  r = sweep.get("report", {})
  b = sweep.base
  md = [f"# {r.get('title', sweep.get('name', 'sweep'))}", "",
        "Generated by `python -m fedjax_dg.bench report --sweep " + r.get("sweep_file", "<sweep config>") + "` from the "
        f"runs under `{sweep.root}`; the reading at the end comes from `" + (r.get("reading", "") or "-") + "`, "
        "everything else is regenerated.", "",
        "## Setup", "",
        f"- data: `{b.data.name}`, test domains {tuple(b.data.test_domains)}, held-out validation {tuple(b.data.val_domains)}"
        f"; model `{b.model.name}`; {b.num_rounds} rounds of {b.client.local_epochs} local epoch(s), "
        f"client {b.client.optimizer} lr {b.client.lr}, batch {b.client.batch_size}",
        f"- metric: test {st['metric']}; cells are mean ± std (ddof={st['ddof']}) over trial seeds",
        f"- jobs: {len(rows)} ({', '.join(f'{counts[s]} {s}' for s in launch.STATES if counts[s])})",
        f"- run time (sum of the runs' wall times): {_duration(tm['total'])} on {', '.join(tm['backends']) or '-'}; "
        "per grid: " + ", ".join(f"{g} {_duration(t)}" for g, t in tm["per_grid"].items()), ""]
  for rule in collect.RULES:
    if f"table_{rule}" in texts:
      md += [f"## Test {st['metric']}, selection: {collect.RULE_TITLES[rule]}", "", texts[f"table_{rule}"], ""]
  if "difficulty" in texts:
    md += ["## Dataset difficulty (seed 001 Table 6)", "", texts["difficulty"], ""]
  if pngs:
    md += ["## Figures", ""] + [f"![{os.path.basename(p)}](figures/{os.path.relpath(p, fig_dir)})" for p in pngs
                                if os.sep + "runs" + os.sep not in p] + [""]
  failed = [r for r in rows if r["state"] == "failed"]
  if failed:
    md += ["## Failed jobs", "", "Their cells read X (or count fewer seeds); `error.txt` in each workdir has the "
           "traceback.", ""] + [f"- {r['job']}: {r['error']} (`{r['workdir']}`)" for r in failed] + [""]
  table = (collect.build_table(sweep, exp, results, st["table_grid"], "heldout_domain", st["metric"], st["ddof"])
           if st["table_grid"] in sweep.grids else None)
  f = sweep.get("figures", {})
  fig2 = (figures.clients_rows(sweep, exp, results, f.clients_grid, "heldout_domain", st["metric"], st["ddof"])
          if f.get("clients_grid", "") in sweep.grids else [])
  fig3 = (figures.rounds_rows(exp, results, f.rounds_grid, "heldout_domain", st["metric"], st["ddof"])
          if f.get("rounds_grid", "") in sweep.grids else [])
  dg = [m for g, ms in sweep.get("table", {}).get("groups", ()) if g == r.get("dg_group", "DG adapted") for m in ms]
  md += ["## Seed 001's remarks against these numbers", "",
         "Measured facts only; a difference smaller than the seeds' std is not a difference.", "",
         "**4.1 FedAvg-ERM is a strong baseline** (held-out-domain selection):", "",
         _bullets(remark_4_1(table, r.get("baseline", _baseline())) if table else []), "",
         "**4.2 DG methods degrade in FL, and as lambda falls:**", "",
         _bullets(remark_4_2(table, dg) if table else []), "",
         "**4.7 accuracy falls with the number of clients** (Fig. 2):", "", _bullets(remark_4_7(fig2)), "",
         "**4.8 accuracy is not monotone in communication rounds at fixed computation** (Fig. 3):", "",
         _bullets(remark_4_8(fig3)), "",
         "## Reading", "", _reading(r.get("reading", "")), ""]
  path = os.path.join(out_dir, "REPORT.md")
  with open(path, "w") as fh:
    fh.write("\n".join(md))
  return path
