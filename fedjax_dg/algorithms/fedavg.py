"""FedAvg (McMahan et al. 2017) with a server optimizer (FedOpt, Reddi et al. 2021).

Client: `K` local steps of the local optimizer on the local objective (ERM, or any
objective factory, e.g. FedProx's), sending `Delta_c = theta_c - theta`.
Server: the weighted mean `sum_c p_c Delta_c` is negated into a pseudo-gradient for an
optax optimizer: `sgd(eta_g)` gives `theta <- theta + eta_g sum_c p_c Delta_c` (plain
FedAvg at `eta_g = 1`), `sgd(eta_g, momentum)` FedAvgM, `adam` FedAdam, `yogi` FedYogi.
These four are server rules (`fedavg`, `avgm`, `adam`, `yogi`) that any client side pairs
with (`fedprox+adam`). Centralised ERM is FedAvg's client alone with all training data, and
mini-batch SGD sends one minibatch gradient that the server steps with the local optimizer.

FedAdam and FedYogi are optax's `adam` and `yogi` on the pseudo-gradient, not Reddi,
Charles, Zaheer, Garrett, Rush, Konecny, Kumar and McMahan, "Adaptive Federated
Optimization" (ICLR 2021), Algorithm 2 as printed. With `Delta_t = sum_c p_c Delta_c`:

  Reddi et al.  m_t = b1 m_{t-1} + (1 - b1) Delta_t, from m_{-1} = 0
                v_t = b2 v_{t-1} + (1 - b2) Delta_t^2                       (FedAdam)
                v_t = v_{t-1} - (1 - b2) Delta_t^2 sign(v_{t-1} - Delta_t^2)  (FedYogi)
                from v_{-1} = tau^2, and theta_{t+1} = theta_t + eta_g m_t / (sqrt(v_t) + tau)
  optax         the same moments from m = v = 0 (adam) or m = v = 1e-6 (yogi), each divided
                by its bias correction `1 - b^t` before the step, with `tau = server.eps`

The two differ most in the first rounds. FedAdam's first step is `eta_g (1 - b1) Delta_1 /
(sqrt(b2 tau^2 + (1 - b2) Delta_1^2) + tau)` in Algorithm 2 and `eta_g Delta_1 / (|Delta_1|
+ tau)` in optax: where `|Delta_1| >> tau` Algorithm 2's is `(1 - b1) / sqrt(1 - b2)` times
optax's (about 3.2 at b1 = 0.9, b2 = 0.999), where `|Delta_1| << tau` it is smaller. As `t`
grows the corrections go to 1 and the two forms differ only by the moments' start.
We use optax's form because it is the server optimizer every other rule's `server.*`
fields already describe (one `make_optimizer` for client and server, its step size a
run-time value that batches vary and hypergradients differentiate); runs compared with
FedOpt's published numbers should read `server.lr` and `server.eps` with this in mind.
"""
from __future__ import annotations

from typing import Callable

import jax
import ml_collections
import optax

from fedjax_dg.algorithms.base import (Batch, ClientOutput, LocalSchedule, ServerRule, batch_indices, erm_objective,
                                       local_train_from, make_optimizer, recorded_train)
from fedjax_dg.algorithms.spec import ClientSide, MethodSpec, RuleSpec, send


def erm(model) -> Callable:
  """Objective factory for plain local ERM: `global_params -> objective`."""
  objective = erm_objective(model)
  return lambda global_params: objective


def optax_rule(server_opt: optax.GradientTransformation, name: str = "fedavg") -> ServerRule:
  """FedAvg/FedOpt: `server_opt` applied to the pseudo-gradient `-mean_delta`."""
  def apply(opt_state, params, mean_delta):
    pseudo_grad = jax.tree.map(lambda d: -d, mean_delta)
    updates, opt_state = server_opt.update(pseudo_grad, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
  return ServerRule(server_opt.init, apply, "mean", name=name)


def server_optimizer(kind: str, server_config, values=None) -> optax.GradientTransformation:
  """`server.*` as the optax optimizer of rule `kind`: sgd (momentum 0), momentum, adam, yogi.
  `values`: the run-time numbers (`server.lr`, ...; the round state's hyperparameters), read
  when the rule runs, so readable, changeable and differentiable; without them the step
  size sits in the optimizer state (`inject_hyperparams`)."""
  c = ml_collections.ConfigDict(server_config.to_dict(), type_safe=False)  # run-time fields may be views
  if kind == "momentum":
    c.optimizer = "sgd"
  elif kind == "sgd":
    c.optimizer, c.momentum = "sgd", 0.0
  else:
    c.optimizer = kind
  c.weight_decay = 0.0
  if values is not None:
    values = {k: v for k, v in values.items() if k != "weight_decay"}
    if kind == "sgd":
      values = {k: v for k, v in values.items() if k != "momentum"}
    return make_optimizer(c, values=values)
  return make_optimizer(c, inject=True)


def objective_client(make_objective: Callable, client_opt: optax.GradientTransformation, sched: LocalSchedule,
                     keep_optimizer: bool = False, record: bool = False, **fields) -> ClientSide:
  """The FedAvg client on the objective `make_objective(global_params, extra)`: local
  training from the broadcast model, sends `Delta_c = theta_c - theta`.

  This is where a method hands the library its client objective: the result carries
  `make_objective` (`ClientSide.objective`), and building the method checks once that the
  objective's loss ignores a batch's padded rows (`base.check_padding`).

  Args:
    make_objective: `(global_params, extra) -> objective(params, batch, rng) -> (loss,
      aux)`; `extra` is what `broadcast` sends (FedIIR's `g~`, AFL's `beta`), else `()`.
      The loss must weight each row by `batch.mask`.
    client_opt: the local optax optimizer (`ctx.client_opt`).
    sched: the local schedule (`ctx.sched`).
    keep_optimizer: the local optimizer's state (momentum, Adam's moments and step count)
      is the client's persistent state and carries over from round to round, instead of
      restarting with each round as FedAvg's does. With one client holding every training
      domain (and the server rule `theta <- theta + Delta`), rounds are then epochs of one
      centralised run: that is centralised ERM (`keeps_optimizer(ctx)`).
    record: the objective's aux holds its weighted penalty `penalty_term` (and optionally
      `at_target`), and the client adds the activity records of `base.recording_step`
      (`activity/penalty_loss_share`, ...) to its metrics.
    **fields: the rest of the `ClientSide` (a broadcast `extra` and the server state it
      comes from: FedIIR's `g~`, AFL's `beta`).

  Returns:
    The `ClientSide`.

  Raises:
    ValueError: `keep_optimizer` with an `init` in `fields` (the client state holds the
      optimizer state).
  """
  def train(global_params, extra, opt_state, data, rng):
    objective = make_objective(global_params, extra)
    if record:
      return recorded_train(global_params, opt_state, objective, client_opt, data, rng, sched)
    return (*local_train_from(global_params, opt_state, objective, client_opt, data, rng, sched), {})

  if not keep_optimizer:
    def update(global_params, extra, client_state, data, rng):
      params, _, loss, activity = train(global_params, extra, client_opt.init(global_params), data, rng)
      return send(params, global_params, client_state, {"train_loss": loss, **activity})
    return ClientSide(update, objective=make_objective, **fields)
  if "init" in fields:
    raise ValueError("objective_client: keep_optimizer uses the client state for the optimizer state")

  def update_keep(global_params, extra, opt_state, data, rng):
    params, opt_state, loss, activity = train(global_params, extra, opt_state, data, rng)
    return send(params, global_params, opt_state, {"train_loss": loss, **activity})
  return ClientSide(update_keep, init=client_opt.init, objective=make_objective, **fields)


def keeps_optimizer(ctx) -> bool:
  """Whether a client side keeps its local optimizer state across rounds: when the run has
  one client, the centralised runs of Bai et al. 2024's C = 1 column (ERM and the DG methods on
  the pooled training data), whose rounds must be the epochs of one training run."""
  return ctx.num_clients == 1


def local_update(make_objective: Callable, client_opt: optax.GradientTransformation, sched: LocalSchedule):
  """`client_update(global_params, client_state, data, rng)` of the FedAvg client whose
  objective is `make_objective(global_params)`."""
  side = objective_client(lambda g, extra: make_objective(g), client_opt, sched)
  return lambda g, state, data, rng: side.update(g, (), state, data, rng)


def minibatch_client(model, batch_size: int) -> ClientSide:
  """One minibatch gradient at the global model, sent as `Delta_c = -g` (so any rule's
  pseudo-gradient `-mean Delta` is the averaged gradient)."""
  objective = erm_objective(model)
  sched = LocalSchedule(num_steps=1, batch_size=batch_size, epochs=0, passes=1, unroll=1)

  def update(global_params, extra, client_state, data, rng):
    idx, mask = batch_indices(rng, data.count, data.y.shape[0], sched)
    batch = Batch(data.x[idx[0]], data.y[idx[0]], data.domain[idx[0]], mask[0])
    (loss, _), grad = jax.value_and_grad(objective, has_aux=True)(global_params, batch, rng)
    return ClientOutput(message=jax.tree.map(lambda g: -g, grad), state=client_state, metrics={"train_loss": loss})
  return ClientSide(update)


# --- specs -------------------------------------------------------------------------------------

def erm_client(ctx, hp) -> ClientSide:
  objective = erm_objective(ctx.model)
  return objective_client(lambda g, extra: objective, ctx.client_opt, ctx.sched, keep_optimizer=keeps_optimizer(ctx))


def _optax_rule_spec(name: str, kind: str, doc: str) -> RuleSpec:
  return RuleSpec(name, lambda ctx, hp: optax_rule(server_optimizer(kind, ctx.config.server, (ctx.values or {}).get("server")),
                                                   name), doc=doc, activity=("rule_deviation",))


RULES = (
    _optax_rule_spec("fedavg", "sgd", "`theta + eta_g sum_c p_c Delta_c` (`server.lr`)"),
    _optax_rule_spec("avgm", "momentum", "server SGD with momentum `server.momentum` on `-mean Delta`"),
    _optax_rule_spec("adam", "adam", "Adam (`server.b1`, `b2`, `eps`) on `-mean Delta`"),
    _optax_rule_spec("yogi", "yogi", "Yogi (`server.b1`, `b2`, `eps`) on `-mean Delta`"),
    RuleSpec("local_opt", lambda ctx, hp: optax_rule(make_optimizer(ctx.config.client, values=(ctx.values or {}).get("client")),
                                                     "local_opt"),
             doc="the configured client optimizer, stepped at the server on the mean gradient", activity=("rule_deviation",)),
)

SPECS = (
    MethodSpec("erm", "centralised ERM (Bai et al. C = 1 column)", erm_client, centralised=True, group="baseline"),
    MethodSpec("minibatch_sgd", "mini-batch SGD", lambda ctx, hp: minibatch_client(ctx.model, ctx.config.client.batch_size),
               rule="local_opt", sends=("gradient (instead of an update)",), group="baseline"),
    MethodSpec("fedavg", "McMahan et al. 2017", erm_client),
    MethodSpec("fedavgm", "Hsu et al. 2019", erm_client, rule="avgm"),
    MethodSpec("fedadam", "Reddi et al. 2021", erm_client, rule="adam"),
    MethodSpec("fedyogi", "Reddi et al. 2021", erm_client, rule="yogi"),
)
