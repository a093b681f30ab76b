"""Runs methods x Heterogeneous-Partitioning lambdas from one config; writes JSON and a table.

  python experiments/sweep.py --config configs/default.py --lams 0,0.1,1 \
      --methods all --out results/sweep.json --config.num_rounds=10

Each (method, lambda) is one `train_and_evaluate` in its own workdir under `--workdir`;
the JSON records the test accuracy under held-out-domain and in-domain model selection,
bytes per round, what the method sends beyond parameters, and the wall time, with the
machine (JAX backend, device count, CPU) it ran on. Existing entries of `--out` are kept
and a finished (method, lambda) is not run again.
"""
from __future__ import annotations

import json
import os
import platform
import time

from absl import app, flags
from ml_collections import config_flags

from fedjax_dg.algorithms import ALGORITHMS

_CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "Base experiment config.")
_METHODS = flags.DEFINE_string("methods", "all", "Comma-separated algorithm names, or 'all'.")
_LAMS = flags.DEFINE_string("lams", "0,0.1,1", "Comma-separated partition lambdas.")
_OUT = flags.DEFINE_string("out", "results/sweep.json", "JSON file (read, extended, written).")
_WORKDIR = flags.DEFINE_string("workdir", "runs/sweep", "Root of the per-run workdirs.")

# Per-method settings that the methods need on top of the shared config (same as the tests').
ADJUST = {
    "fedadam": {"server.lr": 0.01}, "fedyogi": {"server.lr": 0.01},
    "scaffold": {"client.momentum": 0.0},
    "fedloe": {"client.optimizer": "adam", "client.lr": 0.01},
}


def _machine() -> dict:
  import jax
  return {"backend": jax.default_backend(), "devices": jax.device_count(),
          "device_kind": jax.devices()[0].device_kind, "cpu": platform.processor() or platform.machine(),
          "cpu_count": os.cpu_count()}


def run_one(base, method: str, lam: float, workdir: str) -> dict:
  from fedjax_dg.experiment import train_and_evaluate
  config = base.copy_and_resolve_references()
  config.algorithm.name = method
  config.partition.lam = lam
  config.quiet = True
  for key, value in ADJUST.get(method, {}).items():
    section, field = key.split(".")
    config[section][field] = value
  t0 = time.time()
  summary = train_and_evaluate(config, workdir)
  sel = summary["selection"]
  test_acc = lambda rule: sel[rule]["test"]["accuracy"] if sel.get(rule) else None
  comm = summary.get("communication", {})
  return {"method": method, "lam": lam, "heldout_selected_test_accuracy": test_acc("heldout_domain"),
          "in_domain_selected_test_accuracy": test_acc("in_domain"),
          "final_test_accuracy": summary["final"]["splits"]["test"]["accuracy"],
          "bytes_per_round": comm.get("bytes_per_round"), "sends_beyond_parameters": comm.get("sends_beyond_parameters"),
          "wall_s": round(time.time() - t0, 1)}


def main(argv):
  del argv
  methods = list(ALGORITHMS) if _METHODS.value == "all" else _METHODS.value.split(",")
  lams = [float(v) for v in _LAMS.value.split(",")]
  results = {"machine": _machine(), "runs": []}
  if os.path.exists(_OUT.value):
    with open(_OUT.value) as f:
      results["runs"] = json.load(f)["runs"]
  done = {(r["method"], r["lam"]) for r in results["runs"]}
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  for method in methods:
    for lam in lams:
      if (method, lam) in done:
        continue
      rec = run_one(_CONFIG.value, method, lam, os.path.join(_WORKDIR.value, f"{method}_lam{lam:g}"))
      results["runs"].append(rec)
      print(json.dumps(rec), flush=True)
      with open(_OUT.value, "w") as f:
        json.dump(results, f, indent=1)
  print(table(results["runs"], lams))


def table(runs, lams) -> str:
  """Markdown: one row per method, held-out-selected test accuracy per lambda."""
  by = {(r["method"], r["lam"]): r for r in runs}
  methods = list(dict.fromkeys(r["method"] for r in runs))
  fmt = lambda v: "-" if v is None else f"{v:.3f}"
  lines = ["| method | " + " | ".join(f"lambda={l:g}" for l in lams) + " |",
           "|---|" + "---:|" * len(lams)]
  for m in methods:
    lines.append(f"| {m} | " + " | ".join(fmt(by[(m, l)]["heldout_selected_test_accuracy"]) if (m, l) in by else "-"
                                          for l in lams) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  app.run(main)
