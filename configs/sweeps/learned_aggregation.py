"""Learned aggregation (`learned_agg`: per-domain weights learned online on the held-out
validation domain) against FedAvg and FedGA, on the report's data and model (rotated digits,
or rotated Fashion-MNIST with `:fashion`), 20 clients, lambda in {1, 0.1, 0}, 3 seeds,
held-out-domain selection.

  python -m fedjax_dg.bench run --sweep configs/sweeps/learned_aggregation.py
  python -m fedjax_dg.bench run --sweep configs/sweeps/learned_aggregation.py:fashion

The K-round variant (`algorithm.learned.unroll = 4`: the outer gradient through the last 4
aggregations) runs as its own sweep beside them, `learned_agg` only, into
`experiments/learned_aggregation[_fashion]_k4/`:

  python -m fedjax_dg.bench run --sweep configs/sweeps/learned_aggregation.py:fashion_k4
  python -m fedjax_dg.bench run --sweep configs/sweeps/learned_aggregation.py:digits_k4
"""
import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

METHODS = ("fedavg", "fedga", "learned_agg")
UNROLL = 4  # K of the `_k4` variants


def get_config(variant: str = "digits"):
  data, _, k = variant.partition("_")
  if k not in ("", f"k{UNROLL}"):
    raise ValueError(f"configs/sweeps/learned_aggregation.py: variant must be digits, fashion, digits_k{UNROLL} "
                     f"or fashion_k{UNROLL}, got {variant!r}")
  s = report.get_config(data)
  methods = ("learned_agg",) if k else METHODS
  root = "experiments/learned_aggregation" + ("" if data == "digits" else "_fashion") + (f"_{k}" if k else "")
  s.name = f"Learned aggregation on rotated {data}" + (f" (K = {UNROLL} rounds)" if k else "")
  s.root = root + "/runs"
  if k:
    s.method_overrides["learned_agg"] = {"algorithm": {"learned": {"unroll": UNROLL}}}
  s.grids = ml_collections.ConfigDict({
      "table": {"methods": methods, "client_counts": (report.CLIENTS,), "lams": report.LAMS,
                "seeds": report.SEEDS, "num_trials": 0},
  })
  s.table.groups = (("federated DG", methods),)
  s.table.display = {**dict(s.table.display),
                     "learned_agg": f"Learned aggregation, K = {UNROLL}" if k else "Learned aggregation"}
  s.figures.clients_grid = s.figures.rounds_grid = ""
  s.figures.curves_grid, s.figures.per_run_grid, s.figures.per_run_methods = "table", "", ()
  s.report.out = root
  s.report.sweep_file = "configs/sweeps/learned_aggregation.py" + ("" if variant == "digits" else f":{variant}")
  s.report.title = s.name
  s.report.reading = root + "/READING.md"
  return s
