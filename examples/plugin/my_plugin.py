"""A plugin: a method, a server rule and a dataset of your own, registered when imported.

Name it in a config (`config.imports = ("my_plugin",)`) and the command line, the sweeps and
`python -m fedjax_dg.evaluate` import it before they check the config (fedjax_dg/plugins.py).
Nothing in the package is edited.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import fedjax_dg
from fedjax_dg.algorithms import register_rule
from fedjax_dg.algorithms.base import ServerRule, erm_objective
from fedjax_dg.algorithms.fedavg import objective_client
from fedjax_dg.algorithms.spec import LogUniform, RuleSpec, Uniform, hparam


# ---- a method: FedAvg whose clients add shrink * ||theta||^2 to their (masked) loss

@dataclasses.dataclass(frozen=True)
class ShrinkHParams:
  shrink: float = hparam(1e-3, "weight of ||theta||^2 in the client loss", ge=0, search=LogUniform(1e-5, 1e-1))


def shrink_client(ctx, hp):
  base = erm_objective(ctx.model)  # the mean cross-entropy over the batch's real rows (batch.mask)

  def objective(params, batch, rng):
    loss, aux = base(params, batch, rng)
    return loss + hp.shrink * sum((p ** 2).sum() for p in jax.tree.leaves(params)), aux
  return objective_client(lambda global_params, extra: objective, ctx.client_opt, ctx.sched)


fedjax_dg.register_method(fedjax_dg.MethodSpec("shrinkavg", "an example plugin", shrink_client, ShrinkHParams))


# ---- a server rule: a damped step towards the weighted mean update

@dataclasses.dataclass(frozen=True)
class DampHParams:
  damping: float = hparam(0.5, "share of the mean update the server applies", gt=0, le=1, search=Uniform(0.1, 1.0))


def damped_rule(ctx, hp) -> ServerRule:
  def apply(rule_state, params, mean_delta):
    return jax.tree.map(lambda p, d: p + hp.damping * d, params, mean_delta), rule_state
  return ServerRule(lambda params: (), apply, "mean", name="damped")


register_rule(RuleSpec("damped", damped_rule, DampHParams, doc="theta + damping * sum_c p_c Delta_c"))


# ---- a dataset: four domains of 2-D Gaussian blobs, domain d shifted by d * 0.5

def shifted_blobs(data_config):
  rng = np.random.default_rng(data_config.seed)
  centres = np.array([[0, 0], [3, 0], [0, 3], [3, 3]], np.float32)
  xs, ys = [], []
  for d in range(4):
    y = rng.integers(0, 4, 160).astype(np.int32)
    xs.append((centres[y] + 0.5 * d + rng.normal(0, 0.7, (160, 2))).astype(np.float32))
    ys.append(y)
  return fedjax_dg.DomainDataset("shifted_blobs", ("d0", "d1", "d2", "d3"), tuple(xs), tuple(ys), 4)


fedjax_dg.register_dataset("shifted_blobs", shifted_blobs)
