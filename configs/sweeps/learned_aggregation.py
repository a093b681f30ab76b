"""Learned aggregation (`learned_agg`: per-domain weights learned online on the held-out
validation domain) against FedAvg and FedGA, on the report's data and model (rotated digits,
or rotated Fashion-MNIST with `:fashion`), 20 clients, lambda in {1, 0.1, 0}, 3 seeds,
held-out-domain selection.

  python -m fedjax_dg.bench run --sweep configs/sweeps/learned_aggregation.py
  python -m fedjax_dg.bench run --sweep configs/sweeps/learned_aggregation.py:fashion
"""
import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

METHODS = ("fedavg", "fedga", "learned_agg")


def get_config(variant: str = "digits"):
  s = report.get_config(variant)
  root = "experiments/learned_aggregation" + ("" if variant == "digits" else "_fashion")
  s.name = f"Learned aggregation on rotated {variant}"
  s.root = root + "/runs"
  s.grids = ml_collections.ConfigDict({
      "table": {"methods": METHODS, "client_counts": (report.CLIENTS,), "lams": report.LAMS,
                "seeds": report.SEEDS, "num_trials": 0},
  })
  s.table.groups = (("federated DG", METHODS),)
  s.table.display = {**dict(s.table.display), "learned_agg": "Learned aggregation"}
  s.figures.clients_grid = s.figures.rounds_grid = ""
  s.figures.curves_grid, s.figures.per_run_grid, s.figures.per_run_methods = "table", "", ()
  s.report.out = root
  s.report.sweep_file = "configs/sweeps/learned_aggregation.py" + ("" if variant == "digits" else ":fashion")
  s.report.title = s.name
  s.report.reading = root + "/READING.md"
  return s
