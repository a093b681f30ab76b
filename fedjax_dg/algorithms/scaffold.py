"""SCAFFOLD (Karimireddy et al. 2020), option II; a non-SGD local optimizer takes the mean
raw minibatch gradient as its control.

Server control `c`, client controls `c_i` (persistent client state, zero-initialised).
Local step: `theta_c <- theta_c - eta_l (grad R_c - c_i + c)`.
After the client's `K_c` local steps (the steps that touched data, so a smaller client in
epoch mode uses its own K): `c_i+ = c_i - c + (theta - theta_c) / (K_c eta_l)` (option II,
the paper's eq. (4) and Alg. 1). Server: `theta <- theta + eta_g mean_c Delta_c` (FedAvg's
rule, or any other), and `c <- c + (|S| / C) mean_c (c_i+ - c_i)`, means uniform over the
cohort, as in the paper's Alg. 1. With `client.optimizer = "sgd"` the local optimizer is
`sgd(eta_l)` without momentum, exactly the paper's.

With another local optimizer (`client.optimizer = "adam"`: Bai et al. 2024's App. D makes Adam
every method's local optimizer, and its Table 7 gives SCAFFOLD an Adam learning rate), Adam
reads the corrected gradient `grad R_c - c_i + c` at each step, and the control becomes the
mean raw minibatch gradient of the round,
  `c_i+ = (1 / K_c) sum_k grad R_c(theta_c^k; zeta_k)`
(the gradients before correction, at the local iterates). Under plain SGD this is option II
exactly (`theta - theta_c = eta_l sum_k (g_k - c_i + c)`, so option II's quotient is
`mean_k g_k - c_i + c`); under Adam option II's quotient would measure the mean *Adam step*
(of order one per coordinate, whatever the gradient's scale) and add it to raw gradients,
so the correction `c - c_i` would swamp the data's gradient (after one round
`||c - c_i|| / ||grad R_c||` is several times the SGD value: tests/test_scaffold_adam.py).
The mean gradient keeps `c` and `c_i` in gradient units, the quantity SCAFFOLD's drift
correction subtracts. This deviates from Bai et al. 2024's code (FedDG_Benchmark,
`src/client.py: ScaffoldClient.fit`), which keeps option II's quotient under Adam (and
divides by `local_epochs * lr`, not by the number of steps). Adam's moments restart every round (as every method's local
optimizer here). `client.momentum > 0` stays refused. (Option I, a full-pass gradient at the
global model, would cost one more pass over the data.)
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import LocalSchedule, erm_objective, local_loop, local_train, real_steps
from fedjax_dg.algorithms.spec import ClientSide, MethodSpec, send


class Side(NamedTuple):
  control: object  # c


CONTROLS = ("option2", "gradient")


def corrected_step(objective, optimizer, correction):
  """`step_fn` for `local_loop` on carry `(params, opt_state, gradient_sum)`: the optimizer
  reads `correction(g)`, the sum collects the raw minibatch gradients `g`."""
  grad_fn = jax.value_and_grad(objective, has_aux=True)

  def step_fn(carry, batch, rng):
    p, opt_state, g_sum = carry
    (loss, _), g = grad_fn(p, batch, rng)
    updates, opt_state = optimizer.update(correction(g), opt_state, p)
    return (optax.apply_updates(p, updates), opt_state, jax.tree.map(jnp.add, g_sum, g)), loss
  return step_fn


def scaffold_client(model, sched: LocalSchedule, local_lr: float, cohort_size: int, num_clients: int,
                    client_opt: optax.GradientTransformation | None = None, control: str = "option2") -> ClientSide:
  """`client_opt`: the local optimizer (default `sgd(local_lr)`); `local_lr` is its step size.
  `control`: `"option2"` (`c_i - c + (theta - theta_c) / (K_c eta_l)`, plain SGD) or
  `"gradient"` (the round's mean raw minibatch gradient, for Adam)."""
  if control not in CONTROLS:
    raise ValueError(f"scaffold control: unknown {control!r}; choose one of {CONTROLS}")
  objective = erm_objective(model)
  client_opt = client_opt if client_opt is not None else optax.sgd(local_lr)
  zeros = lambda p: jax.tree.map(jnp.zeros_like, p)

  def update(params0, c, c_i, data, rng):
    correction = lambda g: jax.tree.map(lambda gi, ci, cc: gi - ci + cc, g, c_i, c)
    k = jnp.maximum(real_steps(data.count, sched, data.work), 1).astype(jnp.float32)
    if control == "option2":
      params, loss = local_train(params0, objective, client_opt, data, rng, sched, grad_correction=correction)
      c_new = jax.tree.map(lambda ci, cc, p0, p: ci - cc + (p0 - p) / (k * local_lr), c_i, c, params0, params)
    else:
      carry = (params0, client_opt.init(params0), zeros(params0))
      (params, _, g_sum), loss = local_loop(carry, corrected_step(objective, client_opt, correction), data, rng,
                                            sched)
      c_new = jax.tree.map(lambda g: g / k, g_sum)
    dc = jax.tree.map(lambda a, b: a - b, c_new, c_i)
    return send(params, params0, c_new, {"train_loss": loss}, side=dc)

  def side_update(side: Side, mean_dc, round_):
    return Side(jax.tree.map(lambda c, d: c + (cohort_size / num_clients) * d, side.control, mean_dc))

  return ClientSide(update, init=zeros, side_init=lambda rng, p: Side(zeros(p)), side_update=side_update,
                    broadcast=lambda side, round_: side.control, weighting="uniform")


def _check(config, hp):
  if config.client.optimizer not in ("sgd", "adam"):
    return (f"client.optimizer: SCAFFOLD runs with plain SGD (option II) or Adam (Bai et al. 2024's benchmark), "
            f"got {config.client.optimizer!r}")
  if config.client.optimizer == "sgd" and config.client.momentum != 0.0:
    return "client.momentum: SCAFFOLD option II needs plain SGD (client.momentum=0)"
  return None


SPEC = MethodSpec(
    "scaffold", "Karimireddy et al. 2020 (option II; mean gradient with Adam)",
    lambda ctx, hp: scaffold_client(ctx.model, ctx.sched, ctx.client_value("lr"), ctx.cohort_size, ctx.num_clients,
                                    ctx.client_opt,
                                    "option2" if ctx.config.client.optimizer == "sgd" else "gradient"),
    sends=("control-variate update",), receives=("server control variate",), check=_check)
