"""The tests' sweep: FedAvg and FedProx x lambda {1, 0} x seeds {0, 1} on the embedded rotated
digits, MLP, 4 clients, 3 rounds (seconds per job). Its accuracies are near chance (0.1) by
design: it is sized to run every stage of a sweep in seconds, not to learn the digits.

  python -m fedjax_dg.bench run --sweep configs/sweeps/tiny.py --sweep.root=/tmp/tiny
  python -m fedjax_dg.bench report --sweep configs/sweeps/tiny.py --sweep.root=/tmp/tiny --out=/tmp/tiny/report \\
      --sweep.figures.curves_grid=table --sweep.figures.per_run_grid=table

The report draws no figures without the `--sweep.figures.*` flags (this sweep names no
figure grid of its own).
"""

import ml_collections

from fedjax_dg.bench import sweep_helpers


def get_config():
  s = sweep_helpers.skeleton("tiny", "runs/sweeps/tiny")
  b = s.base
  b.model.name = "mlp"
  b.model.hidden = (32,)
  b.data.image_size = 8
  b.num_clients = 4
  b.num_rounds = 3
  b.eval_every = 1
  b.checkpoint_every = 1
  b.client.momentum = 0.0
  b.client.batch_size = 64
  b.engine.unroll = 1
  s.grids = ml_collections.ConfigDict({
      "table": {"methods": ("fedavg", "fedprox"), "client_counts": (4,), "lams": (1.0, 0.0), "seeds": (0, 1),
                "num_trials": 0},
  })
  s.report.sweep_file = "configs/sweeps/tiny.py"
  return s
