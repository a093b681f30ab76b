"""The local loop unrolled in full against `lax.scan`, for one model family on this backend.

`engine.unroll = -1` takes the choice from `engine.measured.ENGINE_DEFAULTS`: local loops of
at most `unroll_upto` steps are unrolled in full. This script measures what that choice
costs: for each number of local steps S it runs the same job twice through the runner
(`experiment.train_and_evaluate`, in this process), once with the loop unrolled in full
(`engine.unroll = S`) and once as a scan (`engine.unroll = 1`), and records the first
compilation (`timing.compile_s`), the median round after it and the selected test accuracy.

    python benchmarks/unroll_speed.py --out benchmarks/results/unroll_speed_cpu.json

Default job: the report grid's MLP (one hidden layer of 128) on the embedded rotated digits,
SGD with momentum, batch 32, fixed local steps, 20 rounds, at C = 1 and C = 20.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def _args(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", default="mlp", help="model.name (default mlp)")
  p.add_argument("--hidden", default="128", help="the MLP's hidden widths, comma separated")
  p.add_argument("--steps", default="1,2,4,8,16,32,64", help="local steps S, comma separated")
  p.add_argument("--clients", default="1,20", help="client counts C, comma separated")
  p.add_argument("--rounds", type=int, default=20)
  p.add_argument("--out", default="", help="write the JSON here")
  return p.parse_args(argv)


def config(args, clients: int, steps: int, unroll: int):
  import fedjax_dg
  c = fedjax_dg.default_config()
  c.model.name = args.model
  if args.model == "mlp":
    c.model.hidden = tuple(int(h) for h in args.hidden.split(","))
  c.num_clients, c.num_rounds, c.eval_every, c.checkpoint_every = clients, args.rounds, args.rounds, 0
  c.client.batch_size, c.client.lr, c.client.momentum = 32, 0.1, 0.9
  c.client.local_steps, c.client.local_epochs = steps, 0
  c.engine.unroll = unroll
  c.quiet = True
  return c


def main(argv=None):
  args = _args(argv)
  import jax
  from fedjax_dg import experiment
  from sweep_speed import machine
  records = []
  with tempfile.TemporaryDirectory() as tmp:
    for clients in (int(c) for c in args.clients.split(",")):
      for steps in (int(s) for s in args.steps.split(",")):
        row = {"clients": clients, "local_steps": steps}
        for name, unroll in (("unrolled", steps), ("scan", 1)):
          workdir = os.path.join(tmp, f"C{clients}_S{steps}_{name}")
          out = experiment.train_and_evaluate(config(args, clients, steps, unroll), workdir)
          with open(os.path.join(workdir, "summary.json")) as f:
            s = json.load(f)
          row[name] = {"compile_s": s["timing"]["compile_s"], "median_round_s": s["timing"]["median_round_s"],
                       "test_accuracy": out["selection"]["heldout_domain"]["test"]["accuracy"]}
        row["compile_ratio_unrolled_over_scan"] = row["unrolled"]["compile_s"] / row["scan"]["compile_s"]
        row["round_ratio_unrolled_over_scan"] = row["unrolled"]["median_round_s"] / row["scan"]["median_round_s"]
        records.append(row)
        print(f"C={clients:3d} S={steps:3d}  compile unrolled/scan {row['compile_ratio_unrolled_over_scan']:5.2f}x "
              f"({row['unrolled']['compile_s']:.2f} / {row['scan']['compile_s']:.2f} s)  round "
              f"{row['round_ratio_unrolled_over_scan']:5.2f}x ({row['unrolled']['median_round_s'] * 1e3:.2f} / "
              f"{row['scan']['median_round_s'] * 1e3:.2f} ms)  accuracy {row['unrolled']['test_accuracy']:.4f} / "
              f"{row['scan']['test_accuracy']:.4f}", flush=True)
  result = {"command": [sys.executable, *sys.argv], "machine": {**machine(), "backend": jax.default_backend()},
            "load_average_after": os.getloadavg(), "model": args.model, "hidden": args.hidden,
            "rounds": args.rounds, "records": records}
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
  return result


if __name__ == "__main__":
  main()
