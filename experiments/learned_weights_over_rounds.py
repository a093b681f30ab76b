"""The per-domain weights `exp(a_d)` that `learned_agg` holds after each round of one
committed run (its job.json config), recomputed by running the rounds again (the runner's
keys, so the same trajectory as the run).

    python experiments/learned_weights_over_rounds.py \
        experiments/learned_aggregation/runs/db00fda46cad28ad \
        --out experiments/learned_aggregation/weights_db00fda46cad28ad.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fedjax_dg import experiment                      # noqa: E402
from fedjax_dg.data import datasets, splits           # noqa: E402
from fedjax_dg.engine import init_round_state         # noqa: E402


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("run")
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)
  config = ml_collections.ConfigDict(json.load(open(os.path.join(args.run, "job.json")))["config"])
  if config.algorithm.name != "learned_agg":
    raise SystemExit(f"{args.run}: algorithm.name is {config.algorithm.name!r}, not 'learned_agg'")
  fold = splits.fold_from_config(datasets.load_dataset(config.data), config.data)
  s = experiment.setup(config, fold)
  stage = s["stages"][0]
  k_init, k_server, k_rounds = jax.random.split(jax.random.PRNGKey(config.seed), 3)
  state = init_round_state(stage.builder, k_server, s["model"].init(k_init), s["num_clients"])
  store = jax.tree.map(jnp.asarray, s["packed"])
  rows = []
  for t in range(config.num_rounds):
    state, _ = stage.round_fn(state, store, jax.random.fold_in(k_rounds, t))
    rows.append(np.exp(np.asarray(state.server.opt_state.logits)).round(4).tolist())
  names = list(fold.domain_names)
  res = {"run": args.run, "data": os.path.basename(str(config.data.get("fallback_path", "")) or config.data.name),
         "lam": float(config.partition.lam), "seed": int(config.seed), "unroll": int(config.algorithm.learned.get("unroll", 1)),
         "num_clients": int(config.num_clients), "domains": names, "train_domains": [names[d] for d in fold.train_domains],
         "val_domains": [names[d] for d in fold.val_domains], "test_domains": [names[d] for d in fold.test_domains],
         "weights_after_round": rows}
  print(json.dumps({"domains": names, "after_last_round": rows[-1]}))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(res, f, indent=1)


if __name__ == "__main__":
  main()
