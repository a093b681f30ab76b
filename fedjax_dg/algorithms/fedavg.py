"""FedAvg (McMahan et al. 2017) with a server optimizer (FedOpt, Reddi et al. 2021).

Client: `K` local steps of the local optimizer on the local objective (ERM, or any
objective factory, e.g. FedProx's), sending `Delta_c = theta_c - theta`.
Server: the weighted mean `sum_c p_c Delta_c` is negated into a pseudo-gradient for an
optax optimizer: `sgd(eta_g)` gives `theta <- theta + eta_g sum_c p_c Delta_c` (plain
FedAvg at `eta_g = 1`), `sgd(eta_g, momentum)` FedAvgM, `adam` FedAdam, `yogi` FedYogi.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import optax

from fedjax_dg.algorithms.base import (Algorithm, Batch, ClientOutput, LocalSchedule, ServerRule,
                                       batch_indices, erm_objective, local_train)


class ServerState(NamedTuple):
  params: Any
  opt_state: Any  # the server rule's state (an optax state for FedAvg/FedOpt)


def erm(model) -> Callable:
  """Objective factory for plain local ERM: `global_params -> objective`."""
  objective = erm_objective(model)
  return lambda global_params: objective


def optax_rule(server_opt: optax.GradientTransformation) -> ServerRule:
  """FedAvg/FedOpt: `server_opt` applied to the pseudo-gradient `-mean_delta`."""
  def apply(opt_state, params, mean_delta):
    pseudo_grad = jax.tree.map(lambda d: -d, mean_delta)
    updates, opt_state = server_opt.update(pseudo_grad, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
  return ServerRule(server_opt.init, apply, "mean")


def local_update(make_objective: Callable, client_opt: optax.GradientTransformation, sched: LocalSchedule):
  """The FedAvg client: local training from the broadcast model; sends `Delta_c`.

  `make_objective(global_params)` builds the local objective (ERM, FedProx, ...), so any
  objective pairs with any server rule that consumes `Delta_c` (FedAvg, FedOMG, ...).
  """
  def client_update(global_params, client_state, data, rng):
    params, loss = local_train(global_params, make_objective(global_params), client_opt, data, rng, sched)
    delta = jax.tree.map(lambda a, b: a - b, params, global_params)
    return ClientOutput(message=delta, state=client_state, metrics={"train_loss": loss})
  return client_update


def local_update_with(make_objective: Callable, client_opt: optax.GradientTransformation, sched: LocalSchedule):
  """`local_update` for a broadcast `(params, extra)` whose objective is `make_objective(extra)`
  (FedIIR's `g~`, the round counter of annealed DG penalties, ...)."""
  def client_update(bcast, client_state, data, rng):
    global_params, extra = bcast
    return local_update(lambda _: make_objective(extra), client_opt, sched)(global_params, client_state, data, rng)
  return client_update


def federated(name: str, client_update: Callable, rule: ServerRule, weighting: str = "examples",
              client_init: Callable = lambda params: ()) -> Algorithm:
  """An algorithm from a client update that sends `Delta_c` and a server rule."""
  def server_update(state: ServerState, aggregate) -> ServerState:
    return ServerState(*rule.apply(state.opt_state, state.params, aggregate))
  return Algorithm(
      name=name, server_init=lambda rng, p: ServerState(p, rule.init(p)), client_init=client_init,
      broadcast=lambda s: s.params, client_update=client_update, server_update=server_update,
      params_of=lambda s: s.params, aggregation=rule.aggregation, weighting=weighting)


def fedavg(model, sched: LocalSchedule, client_opt: optax.GradientTransformation,
           server_opt: optax.GradientTransformation, objective_factory: Callable | None = None,
           name: str = "fedavg") -> Algorithm:
  return federated(name, local_update(objective_factory or erm(model), client_opt, sched), optax_rule(server_opt))


def minibatch_sgd(model, batch_size: int, optimizer: optax.GradientTransformation) -> Algorithm:
  """Mini-batch SGD: every round each sampled client computes one minibatch gradient at the
  global model, the server averages them (weighted by examples) and takes one step of
  `optimizer` (the configured client optimizer, run at the server). A round is one step.
  """
  objective = erm_objective(model)
  sched = LocalSchedule(num_steps=1, batch_size=batch_size, epochs=0, passes=1, unroll=1)

  def client_update(global_params, client_state, data, rng):
    idx, mask = batch_indices(rng, data.count, data.y.shape[0], sched)
    batch = Batch(data.x[idx[0]], data.y[idx[0]], data.domain[idx[0]], mask[0])
    (loss, _), grad = jax.value_and_grad(objective, has_aux=True)(global_params, batch, rng)
    return ClientOutput(message=grad, state=client_state, metrics={"train_loss": loss})

  def server_update(state, mean_grad):
    updates, opt_state = optimizer.update(mean_grad, state.opt_state, state.params)
    return ServerState(optax.apply_updates(state.params, updates), opt_state)

  return Algorithm(
      name="minibatch_sgd", server_init=lambda rng, p: ServerState(p, optimizer.init(p)),
      client_init=lambda params: (), broadcast=lambda s: s.params, client_update=client_update,
      server_update=server_update, params_of=lambda s: s.params)
