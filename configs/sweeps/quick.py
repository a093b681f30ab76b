"""The quick report: a first sweep that rises well above chance and draws every figure, on the
embedded rotated digits (no download). 66 jobs of about 10 s of CPU each: a few minutes on
an idle 2-core machine; measured 16 min of wall time with 2 workers on a 2-core x86-64 CPU
under a load average near 20 from other processes, and 40 s for the report.

  python -m fedjax_dg.bench run    --sweep configs/sweeps/quick.py --workers=2
  python -m fedjax_dg.bench report --sweep configs/sweeps/quick.py   # experiments/report_quick/
  python -m fedjax_dg.bench report --results experiments/report_quick/results.jsonl.gz  # the same bytes

FedAvg-ERM, Fish (a DG method with a centralised form) and FedIIR (Guo et al.'s method, ICML 2023) on
the embedded 16 x 16 rotated digits (0 degrees validates, 75 tests, 15-60 train; 10 classes,
chance 0.1), an MLP with one hidden layer of 128, every client on Adam (lr 3e-3, batch 32,
one local epoch per round; Bai et al. (ICLR 2024) trains every method with Adam), 20 rounds, 3 seeds, at
the methods' default hyperparameters (no search: configs/sweeps/report_fmnist.py runs
Bai et al.'s protocol in full). Its numbers are a smoke test of the pipeline, not a result:
958 training rows, and most selected rounds fall in the last 10% (the report says how many).

Grids: the table (C = 1 and C = 10 at lambda 1, 0.1, 0), Fig. 2 at a fixed number of local
epochs and at a fixed number of local steps per round (C = 1, 10, 40), Fig. 3 (20 local
epochs in total as 20 x 1, 10 x 2, 5 x 4) and Table 6.
"""

import ml_collections

from fedjax_dg.bench import sweep_helpers

LAMS = (1.0, 0.1, 0.0)
SEEDS = (0, 1, 2)
CLIENTS = 10
ROUNDS = 20
# Fig. 2 at fixed steps: 3 local steps a round at every C (one epoch of a client at C = 10 at
# lambda = 1 holds about 77 rows, 3 batches of 32), so each client takes 60 steps in all.
LOCAL_STEPS = 3


def get_config():
  s = sweep_helpers.skeleton("Quick FedDG report on the embedded rotated digits", "runs/sweeps/quick")
  b = s.base
  b.model.name = "mlp"
  b.model.hidden = (128,)
  b.num_clients = CLIENTS
  b.num_rounds = ROUNDS
  b.eval_every = 2
  b.checkpoint_every = 10
  b.client.optimizer = "adam"
  b.client.lr = 3e-3
  b.client.batch_size = 32
  b.client.local_epochs = 1
  s.method_overrides = {}  # Adam for every client: no per-method optimizer
  s.grids = ml_collections.ConfigDict({
      "table": {"methods": ("fedavg", "fish", "fediir"), "client_counts": (1, CLIENTS), "lams": LAMS,
                "seeds": SEEDS, "num_trials": 0},
      "clients": {"methods": ("fedavg",), "client_counts": (1, CLIENTS, 40), "lams": (1.0, 0.0), "seeds": SEEDS},
      "clients_steps": {"methods": ("fedavg",), "client_counts": (1, CLIENTS, 40), "lams": (1.0, 0.0),
                        "seeds": SEEDS, "local_steps": LOCAL_STEPS},
      "rounds": {"methods": ("fedavg",), "client_counts": (CLIENTS,), "lams": (1.0,), "seeds": SEEDS,
                 "schedules": ((ROUNDS, 1), (10, 2), (5, 4))},
      "difficulty": {"kind": "difficulty", "centralised": "erm", "federated": "fedavg", "num_clients": CLIENTS,
                     "lams": (1.0, 0.0), "seeds": SEEDS, "fraction": 0.2, "rule": "heldout_domain"},
  })
  s.figures.clients_grid, s.figures.clients_steps_grid = "clients", "clients_steps"
  s.figures.rounds_grid, s.figures.curves_grid = "rounds", "table"
  s.figures.per_run_grid, s.figures.per_run_methods, s.figures.per_run_seeds = "table", ("fedavg",), (0,)
  s.report.out = "experiments/report_quick"
  s.report.sweep_file = "configs/sweeps/quick.py"
  s.launch.workers = 2
  return s
