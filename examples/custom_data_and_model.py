"""A dataset and a model of your own, trained with the library.

  python examples/custom_data_and_model.py --workdir /tmp/custom [--rounds 4]

Part 1 registers a dataset (three "domains" of Gaussian blobs whose means shift), trains
FedAvg on it with `fedjax_dg.train_and_evaluate`, and re-scores the selected model the way
`python -m fedjax_dg.evaluate --workdir <workdir>/registered` does (the run's config.json
records the loader, so that command works on it too). Part 2 trains a Flax model of your
own on the same clients with the round engine directly.
"""
import argparse
import json
import os

import flax.linen as nn
import jax
import numpy as np

import fedjax_dg


def shifted_blobs(data_config) -> fedjax_dg.DomainDataset:
  """Four classes of 2-D Gaussian blobs per domain; domain d moves every mean by d * 0.5."""
  rng = np.random.default_rng(data_config.seed)
  centres = np.array([[0, 0], [3, 0], [0, 3], [3, 3]], np.float32)
  xs, ys = [], []
  for d in range(4):
    y = rng.integers(0, 4, 200).astype(np.int32)
    xs.append((centres[y] + 0.5 * d + rng.normal(0, 0.7, (200, 2))).astype(np.float32))
    ys.append(y)
  return fedjax_dg.DomainDataset("shifted_blobs", ("d0", "d1", "d2", "d3"), tuple(xs), tuple(ys), 4)


class TinyFeaturizer(nn.Module):
  """One hidden layer; the classifier is `fedjax_dg.Classifier` (a linear head)."""

  @nn.compact
  def __call__(self, x):
    return nn.tanh(nn.Dense(16)(x))


def config_for(rounds: int):
  config = fedjax_dg.default_config()
  config.data.name = "shifted_blobs"
  config.data.test_domains, config.data.val_domains = (3,), (0,)
  config.model.name, config.model.hidden = "mlp", (16,)
  config.num_clients, config.num_rounds, config.eval_every = 6, rounds, 2
  config.client.batch_size, config.client.momentum = 20, 0.0
  config.checkpoint_every, config.quiet = 0, True
  return config


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--rounds", type=int, default=4)
  args = p.parse_args(argv)

  # Part 1: a registered dataset, the whole runner, and a re-scoring of its selected model.
  fedjax_dg.register_dataset("shifted_blobs", shifted_blobs)
  config = config_for(args.rounds)
  run_dir = os.path.join(args.workdir, "registered")
  summary = fedjax_dg.train_and_evaluate(config, run_dir)
  from fedjax_dg import evaluate
  rescored = evaluate.rescore(run_dir, "heldout_domain")
  print("registered:", json.dumps({"test_accuracy": summary["selection"]["heldout_domain"]["test"]["accuracy"],
                                   "rescored": rescored["splits"]["test"]["accuracy"]}))

  # Part 2: your own Flax model, one round function, a plain Python loop.
  fold = fedjax_dg.load_fold(config)
  store = fedjax_dg.pack(config, fold)
  model = fedjax_dg.Model(fedjax_dg.SplitModel(TinyFeaturizer(), fedjax_dg.Classifier(fold.num_classes)),
                          input_shape=fold.train.x.shape[1:])
  algorithm = fedjax_dg.build_method(config, model, store, fold)
  num_clients = int(store.counts.shape[0])
  round_fn = fedjax_dg.make_round(algorithm, num_clients, fedjax_dg.cohort_size(config, num_clients), "vmap")
  key = jax.random.PRNGKey(0)
  state = fedjax_dg.init_round_state(algorithm, key, model.init(key), num_clients)
  store = jax.tree.map(jax.numpy.asarray, store)
  for t in range(args.rounds):
    state, metrics = round_fn(state, store, jax.random.fold_in(key, t))
  params = algorithm.params_of(state.server)
  test = fold.test
  accuracy = float((np.asarray(model.apply(params, test.x)).argmax(-1) == test.y).mean())
  print("custom model:", json.dumps({"train_loss": float(metrics["train_loss"]), "test_accuracy": accuracy}))


if __name__ == "__main__":
  main()
