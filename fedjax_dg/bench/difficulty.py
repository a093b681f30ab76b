"""Bai et al. 2024's dataset difficulty metrics (Sec. 4.1, Table 6), from a sweep's difficulty grid.

  R_DG       = ERM_Perf(S_DG-train, S'_DG-test) / ERM_Perf(S_DG-train + S''_DG-test, S'_DG-test)
  R_FL(lam)  = FedAvg_Perf(S_DG-train, S_IN-test; lam) / ERM_Perf(S_DG-train, S_IN-test)

S''_DG-test is a random `fraction` of each test domain moved into training and S'_DG-test
the rest, which both R_DG runs are tested on (`data.test_domain_train_fraction`, with
`data.test_domain_train_include` False for the numerator: that run trains exactly as the
plain one). Bai et al. 2024's sentence ("S', S'' are 20%, 80% partition respectively") moves
80% in and tests on the other 20%, as `configs/sweeps/report_fmnist.py` does; the fraction
is a field of the grid (the digits sweeps move 20% in, keeping more test rows of their
small test domain). S_IN-test is the in-domain test split (`in_test`). Every performance
is the metric at the round the run's selection rule picks (held-out-domain validation by
default), and a performance is the mean over trial seeds (and folds), so each ratio is
a ratio of means; the spread reported is the standard deviation of the per-seed ratios.
Smaller is harder (Bai et al.: R_DG = 1 means no domain shift).
"""
from __future__ import annotations

import numpy as np

from fedjax_dg.bench.runs import rule_scores


def _scores(entries, results, role: str, rule: str, metric: str, field: str, lam=None) -> dict:
  """(seed, fold) -> score of the run with `role` (and `lam`)."""
  out = {}
  for e in entries:
    if e.axes["role"] != role or (lam is not None and e.axes["lam"] != lam):
      continue
    run = results.get(e.key)
    s = rule_scores(run, rule, metric) if run else None
    if s is not None and s[field] is not None:
      out[(e.axes["seed"], tuple(e.axes["test_domains"]))] = s[field]
  return out


def ratio(num: dict, den: dict, ddof: int) -> dict:
  """mean(num) / mean(den) over the (seed, fold) pairs both hold, and the std of the
  per-pair ratios."""
  pairs = sorted(set(num) & set(den))
  if not pairs:
    return {"value": None, "std": None, "n": 0, "num": None, "den": None}
  a = np.array([num[p] for p in pairs])
  b = np.array([den[p] for p in pairs])
  per = a / b
  return {"value": float(a.mean() / b.mean()), "std": float(np.std(per, ddof=ddof)) if len(per) > ddof else None,
          "n": len(pairs), "num": float(a.mean()), "den": float(b.mean()), "per_seed": per.tolist()}


def _dataset_stats(entries, results) -> dict:
  """n (examples in every split of a centralised ERM run), D (training domains, as Bai et al.'s
  Table 6 counts them: PACS D = 2), C (FedAvg's clients)."""
  out = {"n": None, "D": None, "C": None}
  for e in entries:
    run = results.get(e.key)
    if run is None:
      continue
    if e.axes["role"] == "fl_fedavg":
      out["C"] = e.axes["num_clients"]
    if e.axes["role"] == "fl_erm" and out["n"] is None and run["records"]:
      sm = run["summary"]
      out["n"] = int(sum(sm["client_sizes"]) + sum(s["n"] for s in run["records"][0]["splits"].values()))
      out["D"] = len(sm["domains"].get("train", sm["domains"]["names"]))
  return out


def compute(entries, results, rule: str = "heldout_domain", metric: str = "accuracy", ddof: int = 1) -> dict:
  """{"R_DG": ratio, "R_FL": {lam: ratio}, "n", "D", "C", "fraction", "rule", "metric"}."""
  lams = list(dict.fromkeys(e.axes["lam"] for e in entries if e.axes["role"] == "fl_fedavg"))
  r_dg = ratio(_scores(entries, results, "dg_without", rule, metric, "test"),
               _scores(entries, results, "dg_with", rule, metric, "test"), ddof)
  erm_in = _scores(entries, results, "fl_erm", rule, metric, "in_test")
  r_fl = {f"{lam:g}": ratio(_scores(entries, results, "fl_fedavg", rule, metric, "in_test", lam), erm_in, ddof)
          for lam in lams}
  fraction = next((e.axes["fraction"] for e in entries), None)
  return {"R_DG": r_dg, "R_FL": r_fl, **_dataset_stats(entries, results), "fraction": fraction, "rule": rule,
          "metric": metric}


def _fmt(r: dict, digits: int, pm: str) -> str:
  if r["value"] is None:
    return "X"
  return f"{r['value']:.{digits}f}" + (f"{pm}{r['std']:.{digits}f}" if r["std"] is not None else "")


def _pairs(d: dict) -> str:
  """"3 (seed, fold) pairs", or "2-3 ..." where the ratios rest on different numbers."""
  ns = [d["R_DG"]["n"]] + [r["n"] for r in d["R_FL"].values()]
  lo, hi = min(ns), max(ns)
  return f"{lo if lo == hi else f'{lo}-{hi}'} (seed, fold) pair{'s' * (hi != 1)}"


def to_markdown(d: dict, dataset: str, digits: int = 3) -> str:
  lams = list(d["R_FL"])
  head = "| dataset | n | D | C | R_DG | " + " | ".join(f"R_FL(λ={l})" for l in lams) + " |"
  row = (f"| {dataset} | {d['n'] or '-'} | {d['D'] or '-'} | {d['C'] or '-'} | {_fmt(d['R_DG'], digits, ' ± ')} | "
         + " | ".join(_fmt(d["R_FL"][l], digits, " ± ") for l in lams) + " |")
  note = (f"\n\nRatios of mean {d['metric']} over trial seeds at the {d['rule']}-selected round (± the std of "
          f"per-seed ratios); R_DG moves {d['fraction']:.0%} of the test domain into training and tests both runs "
          "on the rest; R_FL on the in-domain test split. Its own runs, not the tables' cells: FedAvg at "
          f"C = {d['C'] or '-'} and centralised ERM at their default hyperparameters, {_pairs(d)} a ratio "
          "(every λ here is run for this table, whatever columns the tables keep).") if d["fraction"] is not None else ""
  return head + "\n|---|---:|---:|---:|---:|" + "---:|" * len(lams) + "\n" + row + note


def to_latex(d: dict, dataset: str, digits: int = 3) -> str:
  lams = list(d["R_FL"])
  pm = " $\\pm$ "
  return "\n".join([
      "\\begin{tabular}{lrrrc" + "c" * len(lams) + "}", "\\toprule",
      "Dataset & $n$ & $D$ & $C$ & $R_{\\rm DG}$ & " + " & ".join(f"$R_{{\\rm FL}}(\\lambda={l})$" for l in lams)
      + " \\\\", "\\midrule",
      f"{dataset.replace('_', chr(92) + '_')} & {d['n'] or '-'} & {d['D'] or '-'} & {d['C'] or '-'} & "
      f"{_fmt(d['R_DG'], digits, pm)} & " + " & ".join(_fmt(d["R_FL"][l], digits, pm) for l in lams) + " \\\\",
      "\\bottomrule", "\\end{tabular}"])
