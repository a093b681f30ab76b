"""Learns FedAvg's aggregation weights by differentiating through rounds.

Data: the synthetic spurious-feature task. Four training domains, one client each
(Heterogeneous Partitioning, lambda = 0), whose spurious feature agrees with the label
with probability 0.95, 0.9, 0.8 and 0.55; a held-out validation domain (0.2) and a test
domain (0.1) where the spurious feature mostly lies. Outer problem: choose client weights
`softmax(a)` so that the model after `--inner-rounds` FedAvg rounds from a fixed start has a low
cross-entropy on the validation domain; `jax.grad` runs through every local step and
server update. Then FedAvg with the learned weights and with the usual example weights is
trained for `--rounds` rounds and evaluated on the test domain.

    python experiments/learn_aggregation_weights.py --out runs/learned_weights.json
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
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fedjax_dg import algorithms, default_config                          # noqa: E402
from fedjax_dg.algorithms.base import make_schedule                       # noqa: E402
from fedjax_dg.data import datasets, partition, splits, store as store_lib  # noqa: E402
from fedjax_dg.engine import init_round_state, make_round                 # noqa: E402
from fedjax_dg.engine.differentiable import run_rounds                    # noqa: E402
from fedjax_dg.models import build_model                                  # noqa: E402


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--inner-rounds", type=int, default=4)
  p.add_argument("--outer-steps", type=int, default=40)
  p.add_argument("--outer-lr", type=float, default=0.1)
  p.add_argument("--rounds", type=int, default=30)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)

  ds = datasets.spurious_classification(correlations=(0.95, 0.9, 0.8, 0.55, 0.2, 0.1), n_per_domain=500, seed=args.seed)
  fold = splits.make_fold(ds, test_domains=[5], val_domains=[4], seed=args.seed)
  parts = partition.heterogeneous_partition(fold.train.domain, 4, 0.0, seed=args.seed)
  st = jax.tree.map(jnp.asarray, store_lib.pack_clients(fold.train, parts))
  C = 4
  model = build_model(ml_collections.ConfigDict({"name": "mlp", "hidden": (32,)}), ds.input_shape, 2)
  params = model.init(jax.random.PRNGKey(args.seed))
  sched = make_schedule(32, 0, 1, int(st.counts.max()), int(st.counts.min()))
  config = default_config()  # FedAvg: local SGD at 0.05 with momentum 0.9, server step 1
  config.client.lr, config.client.momentum = 0.05, 0.9
  alg = algorithms.build_algorithm(config, model, sched, C, C)
  rf = make_round(alg, C, C, "vmap")
  state0 = init_round_state(alg, None, params, C)
  xv, yv = jnp.asarray(fold.heldout_val.x), jnp.asarray(fold.heldout_val.y)
  xt, yt = jnp.asarray(fold.test.x), jnp.asarray(fold.test.y)
  key = jax.random.PRNGKey(args.seed + 1)
  inner_keys = [jax.random.fold_in(key, t) for t in range(args.inner_rounds)]

  def val_loss(a):
    out = run_rounds(rf, state0, st, inner_keys, jax.nn.softmax(a))
    return optax.softmax_cross_entropy_with_integer_labels(model.apply(out.server.params, xv), yv).mean()

  loss_and_grad = jax.jit(jax.value_and_grad(val_loss))
  a = jnp.zeros(C)
  opt = optax.adam(args.outer_lr)
  opt_state = opt.init(a)
  for step in range(args.outer_steps):
    loss, g = loss_and_grad(a)
    upd, opt_state = opt.update(g, opt_state)
    a = optax.apply_updates(a, upd)
    if step % 10 == 0 or step == args.outer_steps - 1:
      print(f"outer step {step:3d}  val loss {float(loss):.4f}  weights {np.round(np.asarray(jax.nn.softmax(a)), 3)}")

  def accuracy_after(weights):
    keys = [jax.random.fold_in(key, 1000 + t) for t in range(args.rounds)]
    out = run_rounds(rf, state0, st, keys, weights)
    acc = lambda x, y: float(jnp.mean(jnp.argmax(model.apply(out.server.params, x), -1) == y))
    return acc(xv, yv), acc(xt, yt)

  learned = jax.nn.softmax(a)
  examples = st.counts / st.counts.sum()
  res = {"domains": [ds.names[d] for d in fold.train_domains], "learned_weights": np.asarray(learned).tolist(),
         "example_weights": np.asarray(examples).tolist()}
  for name, w in (("example_weights", examples), ("learned_weights", learned)):
    val_acc, test_acc = accuracy_after(w)
    res[f"{name}_val_accuracy"], res[f"{name}_test_accuracy"] = val_acc, test_acc
    print(f"FedAvg {args.rounds} rounds with {name:16s}: val-domain accuracy {val_acc:.3f}, test-domain accuracy {test_acc:.3f}")
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(res, f, indent=2)
  return res


if __name__ == "__main__":
  main()
