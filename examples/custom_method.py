"""A method of your own: one spec, one registration line, then every tool of the library.

  python examples/custom_method.py --workdir /tmp/custom_method [--rounds 4]

`shrinkavg` is FedAvg whose clients add `shrink * ||theta||^2` to their loss. The spec
declares the hyperparameter (default, accepted range, random-search distribution), so the
config gets `algorithm.shrinkavg.shrink`, validation checks it, sweeps can search it, and
the method composes with every server rule that can read its updates (`shrinkavg+omg`).
"""
import argparse
import dataclasses
import json
import os

import jax

import fedjax_dg
from fedjax_dg.algorithms.base import erm_objective
from fedjax_dg.algorithms.fedavg import objective_client
from fedjax_dg.algorithms.spec import LogUniform, hparam


@dataclasses.dataclass(frozen=True)
class HParams:
  shrink: float = hparam(1e-3, "weight of ||theta||^2 in the client loss", ge=0, search=LogUniform(1e-5, 1e-1))


def shrink_client(ctx, hp):
  """The client side: local training (the configured optimizer and schedule) on
  `R_c(theta) + shrink * ||theta||^2`."""
  base = erm_objective(ctx.model)

  def objective(params, batch, rng):
    loss, aux = base(params, batch, rng)
    return loss + hp.shrink * sum((p ** 2).sum() for p in jax.tree.leaves(params)), aux

  return objective_client(lambda global_params, extra: objective, ctx.client_opt, ctx.sched)


SPEC = fedjax_dg.MethodSpec("shrinkavg", "an example", shrink_client, HParams, rule="fedavg", group="FL")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--rounds", type=int, default=4)
  args = p.parse_args(argv)
  fedjax_dg.register_method(SPEC)
  out = {}
  for name in ("shrinkavg", "shrinkavg+omg"):
    config = fedjax_dg.default_config()
    config.algorithm.name = name
    config.algorithm.shrinkavg = {"shrink": 1e-3}
    config.model.name, config.model.hidden, config.data.image_size = "mlp", (32,), 8
    config.num_clients, config.num_rounds, config.eval_every = 8, args.rounds, 2
    config.checkpoint_every, config.quiet, config.client.momentum = 0, True, 0.0
    summary = fedjax_dg.train_and_evaluate(config, os.path.join(args.workdir, name.replace("+", "_")))
    out[name] = summary["selection"]["heldout_domain"]["test"]["accuracy"]
  print(json.dumps(out))


if __name__ == "__main__":
  main()
