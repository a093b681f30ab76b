"""SCAFFOLD (Karimireddy et al. 2020), option II.

Server control `c`, client controls `c_i` (persistent client state, zero-initialised).
Local step: `theta_c <- theta_c - eta_l (grad R_c - c_i + c)`.
After the client's `K_c` local steps (the steps that touched data, so a smaller client in
epoch mode uses its own K): `c_i+ = c_i - c + (theta - theta_c) / (K_c eta_l)`.
Server: `theta <- theta + eta_g mean_c Delta_c` (FedAvg's rule, or any other), and
`c <- c + (|S| / C) mean_c (c_i+ - c_i)`, means uniform over the cohort, as in the paper's Alg. 1.
Option II assumes plain SGD locally; with `client.optimizer = "sgd"` the local optimizer is
`sgd(eta_l)` without momentum, exactly the paper's.

Deviation, for seed 001's benchmark (App. D: Adam is every method's local optimizer, and
Table 7 gives SCAFFOLD an Adam learning rate): with `client.optimizer = "adam"` the
corrected gradient `grad R_c - c_i + c` is what Adam reads at each step, and the control
update keeps option II's formula `(theta - theta_c) / (K_c eta_l)`. Under Adam that quotient
is the mean of Adam's normalised steps over the round, not the mean gradient that option II
estimates, so `c_i` tracks the client's mean update direction (unit-free, of order one per
coordinate) instead of its gradient, and SCAFFOLD's drift-correction analysis (which needs
SGD steps) no longer applies. Adam's moments restart every round (as every method's local
optimizer here). `client.momentum > 0` stays refused.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import Algorithm, LocalSchedule, erm_objective, local_train, real_steps
from fedjax_dg.algorithms.fedavg import optax_rule
from fedjax_dg.algorithms.spec import ClientSide, MethodSpec, compose, send


class Side(NamedTuple):
  control: object  # c


def scaffold_client(model, sched: LocalSchedule, local_lr: float, cohort_size: int, num_clients: int,
                    client_opt: optax.GradientTransformation | None = None) -> ClientSide:
  """`client_opt`: the local optimizer (default `sgd(local_lr)`, option II); `local_lr` is its
  step size, used in the control update."""
  objective = erm_objective(model)
  client_opt = client_opt if client_opt is not None else optax.sgd(local_lr)
  zeros = lambda p: jax.tree.map(jnp.zeros_like, p)

  def update(params0, c, c_i, data, rng):
    correction = lambda g: jax.tree.map(lambda gi, ci, cc: gi - ci + cc, g, c_i, c)
    params, loss = local_train(params0, objective, client_opt, data, rng, sched, grad_correction=correction)
    k = jnp.maximum(real_steps(data.count, sched, data.work), 1).astype(jnp.float32)
    c_new = jax.tree.map(lambda ci, cc, p0, p: ci - cc + (p0 - p) / (k * local_lr), c_i, c, params0, params)
    dc = jax.tree.map(lambda a, b: a - b, c_new, c_i)
    return send(params, params0, c_new, {"train_loss": loss}, side=dc)

  def side_update(side: Side, mean_dc, round_):
    return Side(jax.tree.map(lambda c, d: c + (cohort_size / num_clients) * d, side.control, mean_dc))

  return ClientSide(update, init=zeros, side_init=lambda rng, p: Side(zeros(p)), side_update=side_update,
                    broadcast=lambda side, round_: side.control, weighting="uniform")


def scaffold(model, sched: LocalSchedule, local_lr: float, server_lr: float,
             cohort_size: int, num_clients: int, client_opt: optax.GradientTransformation | None = None) -> Algorithm:
  return compose("scaffold", scaffold_client(model, sched, local_lr, cohort_size, num_clients, client_opt),
                 optax_rule(optax.sgd(server_lr)))


def _check(config, hp):
  if config.client.optimizer not in ("sgd", "adam"):
    return (f"client.optimizer: SCAFFOLD runs with plain SGD (option II) or Adam (seed 001's benchmark), "
            f"got {config.client.optimizer!r}")
  if config.client.optimizer == "sgd" and config.client.momentum != 0.0:
    return "client.momentum: SCAFFOLD option II needs plain SGD (client.momentum=0)"
  return None


SPEC = MethodSpec(
    "scaffold", "Karimireddy et al. 2020 (option II)",
    lambda ctx, hp: scaffold_client(ctx.model, ctx.sched, ctx.client_value("lr"), ctx.cohort_size, ctx.num_clients,
                                    ctx.client_opt),
    sends=("control-variate update",), receives=("server control variate",), check=_check)
