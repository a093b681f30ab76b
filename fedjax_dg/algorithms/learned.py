"""Learned aggregation: per-domain aggregation weights (and optionally the server step and a
global shrink factor) learned online, at the server, on the held-out validation domain.

The server keeps log-multipliers `a_d` of each training domain's weight. Each round
every sampled client trains locally (FedAvg's client) and sends its update `Delta_c` with
the share `s_cd` of its examples from each domain. With `p_c` the clients' data fractions,

    lambda_c(a) = p_c sum_d s_cd exp(a_d) / sum_c' p_c' sum_d s_c'd exp(a_d)        (1)
    theta(a, b, g) = exp(g) (theta + eta_g exp(b) sum_c lambda_c(a) Delta_c)        (2)

(`eta_g` = `server.lr`; `exp(g)` is FedLAW's global shrink factor, Li et al. ICML 2023,
and `exp(b)` a learned multiplier of the server step). Every `every` rounds, before
aggregating, the server takes one step of Adam (`outer_lr`) on `(a, b, g)` along the
gradient of the cross-entropy of `theta(a, b, g)` on the held-out validation domain
(`val_examples` of its examples, drawn once): the one-step (online) hypergradient of
`fedjax_dg.meta`, with the clients' updates of this round held fixed. Then it aggregates
with the new values. `b` and `g` stay 0 unless `learn_server_lr` / `learn_shrink`.

K rounds (`unroll = K > 1`): the outer gradient flows through the server's last K
aggregations (this round's and the K - 1 before it): starting from the global model
`theta_{t-K+1}` the server held K - 1 rounds ago, eq. (2) is applied K times with the
current `(a, b, g)`, each round's updates as its clients sent them, and the validation loss
of the result is differentiated with respect to `(a, b, g)`. The replay runs in a `lax.scan`
whose every step is a `jax.checkpoint` (`fedjax_dg.algorithms.base.unrolled`), so its backward pass
holds K models rather than K aggregations' intermediates. Eq. (1) is linear in the
updates once `exp(a)` is fixed,

    sum_c lambda_c Delta_c = sum_d exp(a_d) U_d / sum_d exp(a_d) m_d,
    U_d = sum_c p_c s_cd Delta_c,   m_d = sum_c p_c s_cd                            (3)

so the server keeps, for each of the last K rounds, the model it started from and the
per-domain sums `U` ([D] models) and `m` ([D]), not the cohort's updates: K (D + 1) models
of state, whatever the cohort size. Until K rounds have passed it replays those it has.
K = 1 is the one-step rule (its replay is eq. (2) on this round's updates).

Deviations: FedLAW learns per-client weights and the shrink factor on a proxy data set at
the server by many gradient steps per round; here the weights are per domain (clients map
to them through their domain shares, so a client's weight is its domain's, and weights of
clients never seen still exist), one Adam step per `every` rounds, and the proxy data is
the benchmark's held-out validation domain, never the test domain. The server holds those
validation examples (as FedLAW's server holds its proxy data). The K-round variant holds
each replayed round's client updates fixed at what the clients sent: the path through the
clients' local training (their updates depend on the model they started from, hence on
earlier weights) is dropped, since the server cannot rerun the clients (it has not their
data). `fedjax_dg.meta.hypergradient(..., truncate=K)` includes that path, offline.

What it sends: each client its domain shares (a vector of `D` numbers) with its update.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dg.algorithms.base import ServerRule, erm_objective, local_train, tree_where, unrolled
from fedjax_dg.algorithms.spec import ClientSide, MethodSpec, RuleSpec, hparam, send
from fedjax_dg.data.augment import to_float

DOMAIN_SHARES = "domain shares (its examples' share of each domain)"


class LearnedState(NamedTuple):
  logits: jax.Array      # [D] a_d
  log_lr: jax.Array      # [] b
  log_shrink: jax.Array  # [] g
  opt_state: Any         # Adam's state on (a, b, g)
  round: jax.Array       # rounds aggregated
  window: Any = ()       # `Window` of the last K rounds (unroll K > 1), else ()


class Window(NamedTuple):
  """The last K rounds, oldest first (eq. (3)): the model each started from, and its
  per-domain update sums and masses."""
  params: Any      # [K, ...] theta_t
  updates: Any     # [K, D, ...] U_d
  mass: jax.Array  # [K, D] m_d


def aggregate(outer, params, deltas, weights, shares, server_lr):
  """Eq. (1)-(2): the new global model for the outer variables `outer = (a, b, g)`."""
  a, b, g = outer
  lam = weights * (shares @ jnp.exp(a))
  lam = lam / jnp.maximum(jnp.sum(lam), 1e-12)
  step = server_lr * jnp.exp(b)
  return jax.tree.map(lambda p, d: (jnp.exp(g) * (p + step * jnp.tensordot(lam, d, axes=1))).astype(p.dtype),
                      params, deltas)


def push(window: Window, params, deltas, weights, shares) -> Window:
  """`window` with its oldest round dropped and this one appended (eq. (3))."""
  pw = weights[:, None] * shares                                       # [M, D] p_c s_cd
  updates = jax.tree.map(lambda d: jnp.tensordot(pw.T.astype(d.dtype), d, axes=1), deltas)
  shift = lambda buf, new: jnp.concatenate([buf[1:], new[None].astype(buf.dtype)])
  return Window(jax.tree.map(shift, window.params, params), jax.tree.map(shift, window.updates, updates),
                shift(window.mass, jnp.sum(pw, 0)))


def replay(outer, window: Window, filled, server_lr, remat: bool = True):
  """The global model after the window's last `filled` rounds (of K), each aggregated by
  eq. (2)-(3) with the outer variables `outer = (a, b, g)`, starting from the model the
  oldest of them started from; per-round `jax.checkpoint` (`fedjax_dg.algorithms.base.unrolled`)."""
  a, b, g = outer
  K = window.mass.shape[0]
  first = K - filled

  def one(theta, round_k):
    k, start, updates, mass = round_k
    theta = tree_where(k == first, start, theta)
    e = jnp.exp(a)
    step = server_lr * jnp.exp(b) / jnp.maximum(mass @ e, 1e-12)
    new = jax.tree.map(lambda p, u: (jnp.exp(g) * (p + step * jnp.tensordot(e.astype(u.dtype), u, axes=1)))
                       .astype(p.dtype), theta, updates)
    return tree_where(k >= first, new, theta), None
  oldest = jax.tree.map(lambda p: p[0], window.params)
  return unrolled(one, oldest, (jnp.arange(K), window.params, window.updates, window.mass), remat)


def learned_rule(model, val_x, val_y, num_domains: int, server_lr, outer_lr, every: int = 1,
                 learn_server_lr: bool = False, learn_shrink: bool = False, unroll: int = 1) -> ServerRule:
  """Server rule on `Stacked(deltas, weights, shares)` (module docstring); `unroll` = K."""
  outer_opt = optax.adam(outer_lr)
  learn = jnp.asarray([True, learn_server_lr, learn_shrink])
  K = int(unroll)

  def init(params):
    z = (jnp.zeros(num_domains, jnp.result_type(float)), jnp.zeros(()), jnp.zeros(()))
    window = ()
    if K > 1:
      stack = lambda n: (lambda p: jnp.zeros((K,) + n + p.shape, p.dtype))
      window = Window(jax.tree.map(stack(()), params), jax.tree.map(stack((num_domains,)), params),
                      jnp.zeros((K, num_domains), z[0].dtype))
    return LearnedState(*z, outer_opt.init(z), jnp.zeros((), jnp.int32), window)

  def apply(state: LearnedState, params, stacked):
    outer = (state.logits, state.log_lr, state.log_shrink)
    new = lambda o: aggregate(o, params, stacked.messages, stacked.weights, stacked.extras, server_lr)
    ce = lambda p: optax.softmax_cross_entropy_with_integer_labels(model.apply(p, val_x), val_y).mean()
    window = state.window
    if K > 1:
      window = push(window, params, stacked.messages, stacked.weights, stacked.extras)
      filled = jnp.minimum(state.round + 1, K)
      val_loss = lambda o: ce(replay(o, window, filled, server_lr))
    else:
      val_loss = lambda o: ce(new(o))

    def step(operand):
      o, opt_state = operand
      grad = jax.grad(val_loss)(o)
      grad = tuple(jnp.where(on, gr, 0.0) for on, gr in zip(learn, grad))
      updates, opt_state = outer_opt.update(grad, opt_state, o)
      return optax.apply_updates(o, updates), opt_state
    outer, opt_state = jax.lax.cond(state.round % every == 0, step, lambda x: x, (outer, state.opt_state))
    return new(outer), LearnedState(*outer, opt_state, state.round + 1, window)
  return ServerRule(init, apply, "stack", name="learned", needs=(DOMAIN_SHARES,), weighting="examples")


def shares_client(ctx, hp=None) -> ClientSide:
  """FedAvg's client, sending its domain shares `s_c` ([D]) with `Delta_c`."""
  objective = erm_objective(ctx.model)
  D = ctx.num_domains

  def update(global_params, extra, client_state, data, rng):
    params, loss = local_train(global_params, objective, ctx.client_opt, data, rng, ctx.sched)
    counts = jnp.sum(jax.nn.one_hot(data.domain, D) * data.mask[:, None], 0)
    return send(params, global_params, client_state, {"train_loss": loss},
                side=counts / jnp.maximum(jnp.sum(counts), 1.0))
  return ClientSide(update, provides=(DOMAIN_SHARES,))


@dataclasses.dataclass(frozen=True)
class HParams:
  outer_lr: float = hparam(0.1, "Adam step on the outer variables", gt=0)
  every: int = hparam(1, "rounds between outer steps", ge=1, integer=True)
  learn_server_lr: bool = hparam(False, "also learn a multiplier of server.lr")
  learn_shrink: bool = hparam(False, "also learn a global shrink factor (FedLAW's gamma)")
  val_examples: int = hparam(1024, "held-out validation examples the server holds (0: all)", ge=0, integer=True)
  unroll: int = hparam(1, "K: rounds the outer gradient flows through (1: one-step)", ge=1, integer=True,
                       static=True)


def validation_subset(val, n: int, seed: int):
  """`n` examples of the held-out validation split `(x, y)`, drawn once (all if n = 0 or more)."""
  x, y = val
  if 0 < n < len(y):
    idx = np.sort(np.random.default_rng(seed).choice(len(y), n, replace=False))
    x, y = x[idx], y[idx]
  return jnp.asarray(x), jnp.asarray(y)


def validation_data(ctx, hp: HParams):
  """The rule's validation examples, drawn once per run from the held-out validation domain
  with the run's own seed (the rule's `prepare`)."""
  if ctx.heldout_val is None or len(ctx.heldout_val[1]) == 0:
    raise ValueError(f"algorithm.name={ctx.config.algorithm.name!r}: the learned rule needs a held-out "
                     "validation domain (data.val_domains); it never reads the test domain")
  return validation_subset(ctx.heldout_val, hp.val_examples, int(ctx.config.seed))


def build_rule(ctx, hp: HParams) -> ServerRule:
  rounds = int(ctx.config.num_rounds)
  if hp.unroll > rounds:
    raise ValueError(f"algorithm.learned.unroll: K={hp.unroll} is larger than the run (num_rounds={rounds}); "
                     "the outer gradient flows through at most the run's rounds")
  x, y = ctx.prepared
  if x.dtype == jnp.uint8:  # images stored as bytes: the scale the local loop sees
    x = to_float(x)
  return learned_rule(ctx.model, x, y, ctx.num_domains, ctx.server_value("lr"), hp.outer_lr, hp.every,
                      hp.learn_server_lr, hp.learn_shrink, hp.unroll)


RULE = RuleSpec("learned", build_rule, HParams, prepare=validation_data,
                doc="per-domain aggregation weights (optionally server step, shrink) learned online by Adam on "
                    "the held-out validation domain's loss of the aggregate (or of the last K aggregations)",
                activity=("rule_deviation",))
SPEC = MethodSpec("learned_agg", "learned aggregation (one-step or K-round hypergradient; after FedLAW, Li et al. 2023)",
                  shares_client, rule="learned", sends=("its domain shares",), group="FDG")
