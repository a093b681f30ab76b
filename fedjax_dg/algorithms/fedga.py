"""FedGA (Zhang et al., CVPR 2023, "Federated Domain Generalization with Generalization
Adjustment", Alg. 1), following the authors' public code (FedDG-GA,
`algorithms/fedavg/train_pacs_GA.py: main` and `utils/weight_adjust.py:
refine_weight_dict_by_GA`) where it differs from the paper's text.

The server keeps one aggregation weight `a_c` per client (uniform at the start) and
aggregates `theta <- theta + sum_c a_c Delta_c / sum_c a_c` over the cohort. Each round:
  1. every sampled client trains locally (FedAvg's client) and evaluates its trained local
     model `theta_c` on its gap split ("before_fed");
  2. the server aggregates with the current weights;
  3. every sampled client evaluates the new global model `theta^{t+1}` on the same split
     and reports the gap (post-round exchange), in loss or in accuracy (`fair`):
        loss: `G_c = L_c(theta^{t+1}) - L_c(theta_c)`
        acc:  `G_c = -(A_c(theta^{t+1}) - A_c(theta_c))`  (the code's `signal = -1`)
  4. `a_c <- clip(a_c + (d_i / C) G_c / max_c' |G_c'|, 0, 1)` for the reporting clients,
     then `a <- a / sum a`; the new weights aggregate from the next round on.
`d_i = d - (i - 1) d / T` for the round `i = 0, 1, ...` just finished (the authors' call
`refine_weight_dict_by_GA(..., args.step_size - (i-1)*step_size_decay, ...)` with
`step_size_decay = d / T`, so the first round's step is `d (1 + 1/T)`); `d = 0.2`.
The reference code does not centre the gaps (the paper writes `G_c - mean G`) and scales
the step by one over the number of clients (`1/3` for its three training domains,
`1/len(weight_dict)` in Bai et al.'s port): we follow the code. Where every gap is 0 (an
accuracy gap on a small split can be) the reference divides by zero; the weights then
stay as they are.

`fair`: the authors' released command (`--fair`, default `acc` in `train_pacs_GA.py`)
measures the gap in accuracy; `loss` is the code's other choice. Default: `acc`.

The gap split (`gap_fraction`): the authors evaluate both models on each site's
validation split (`dataloader_dict[site]['val']`, held out from local training), and so
does FedOMG's port (`FedOMG-DG/algorithms/FedGA/train_pacs_GA.py`), which produced Nguyen
et al. 2025's FedGA rows. With `gap_fraction > 0` each client holds out that share of its rows
(the tuning split FedLOE also uses, `ctx.tune_store`), trains on the rest and measures the
gaps there (default 0.1, PACS's validation share). `gap_fraction = 0` measures them on the
client's training data, which mostly measures local overfitting.

As a composition: FedGA's client side sends its weight `a_c` with its update (the rule
`ga` reads it as a per-client signal and is refused with clients that do not send one).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import LocalSchedule, ServerRule, erm_objective, local_train, tokens_as_examples
from fedjax_dg.algorithms.spec import ClientSide, MethodSpec, RuleSpec, hparam, send

WEIGHT = "aggregation weight (generalisation adjustment)"
FAIR = ("acc", "loss")


class Side(NamedTuple):
  weights: jax.Array  # [C] aggregation weights a_c


def ga_weights(a, ids, gaps, valid, step):
  """`refine_weight_dict_by_GA` on signed gaps (`signal * (after - before)`): the weights
  `a` ([C]) after the cohort's gaps (`valid` marks real members); `step` is `d_i / C`."""
  v = valid.astype(a.dtype)
  scale = jnp.max(jnp.abs(gaps * v))
  change = jnp.where(scale > 0, step * gaps * v / jnp.where(scale > 0, scale, 1.0), 0.0)
  a = a.at[jnp.where(valid, ids, a.shape[0])].add(change, mode="drop")
  a = jnp.clip(a, 0.0, 1.0)
  return a / jnp.maximum(jnp.sum(a), 1e-12)


def step_at(step_size: float, num_rounds: int, rounds_done):
  """The authors' decayed step `d - (i - 1) d / T` after round `i = rounds_done - 1`."""
  return step_size - (rounds_done - 2) * step_size / num_rounds


def split_metric(model, params, x, y, mask, fair: str, chunk: int = 256):
  """Mean cross-entropy (`loss`) or accuracy (`acc`) over the real rows of one client's
  split (labelled tokens, for per-token labels), one chunk of logits at a time."""
  n = y.shape[0]
  c = min(chunk, n)
  rows = jnp.arange(-(-n // c) * c).reshape(-1, c)

  def sums(r):
    keep = (r < n).astype(jnp.float32)
    r = jnp.minimum(r, n - 1)
    yy, m, (logits,), _ = tokens_as_examples(y[r], mask[r] * keep, model.apply(params, x[r]))
    if fair == "loss":
      value = optax.softmax_cross_entropy_with_integer_labels(logits, yy)
    else:
      value = (jnp.argmax(logits, -1) == yy).astype(jnp.float32)
    return jnp.sum(value * m), jnp.sum(m)

  total, count = jax.lax.map(sums, rows)
  return jnp.sum(total) / jnp.maximum(jnp.sum(count), 1.0)


def ga_rule() -> ServerRule:
  """`theta + sum_c a_c Delta_c / sum_c a_c` with the weights the clients send."""
  def apply(rule_state, params, stacked):
    a = jnp.where(stacked.weights > 0, stacked.extras, 0.0)
    w = a / jnp.maximum(jnp.sum(a), 1e-12)
    return jax.tree.map(lambda p, d: p + jnp.tensordot(w, d, axes=1), params, stacked.messages), rule_state
  return ServerRule(lambda params: (), apply, "stack", name="ga", needs=(WEIGHT,), weighting="uniform")


def fedga_client(model, sched: LocalSchedule, client_opt: optax.GradientTransformation, num_clients: int,
                 num_rounds: int, step_size: float = 0.2, chunk: int = 256, fair: str = "acc",
                 gap_store=None) -> ClientSide:
  """`gap_store`: each client's held-out rows (a `ClientStore`) to measure the gaps on;
  None: the client's training data."""
  if fair not in FAIR:
    raise ValueError(f"algorithm.fedga.fair: unknown {fair!r}; choose one of {FAIR}")
  objective = erm_objective(model)
  signal = -1.0 if fair == "acc" else 1.0
  held = None if gap_store is None else jax.tree.map(jnp.asarray, gap_store)

  def metric(params, data):
    if held is None:
      return split_metric(model, params, data.x, data.y, data.mask, fair, chunk)
    c = data.client_id
    mask = (jnp.arange(held.y.shape[1]) < held.counts[c]).astype(jnp.float32)
    return split_metric(model, params, held.x[c], held.y[c], mask, fair, chunk)

  def update(global_params, a, client_state, data, rng):
    params, loss = local_train(global_params, objective, client_opt, data, rng, sched)
    before = metric(params, data)                                 # 1.
    return send(params, global_params, before, {"train_loss": loss}, side=a[data.client_id])

  def report(new_global, a, before, data, rng):                   # 3.
    return signal * (metric(new_global, data) - before), data.client_id

  def finish(side: Side, stacked, round_) -> Side:               # 4. (`round_` rounds done)
    gaps, ids = stacked.messages
    d_i = step_at(step_size, num_rounds, round_)
    return Side(ga_weights(side.weights, ids, gaps, stacked.weights > 0, d_i / num_clients))

  return ClientSide(update, init=lambda params: jnp.zeros(()),
                    side_init=lambda rng, params: Side(jnp.full(num_clients, 1.0 / num_clients)),
                    broadcast=lambda side, round_: side.weights, report=report, finish=finish,
                    report_aggregation="stack", weighting="uniform", provides=(WEIGHT,))


@dataclasses.dataclass(frozen=True)
class HParams:
  step: float = hparam(0.2, "step size d (authors' code), decays linearly to 0", ge=0, le=1)
  fair: str = hparam("acc", "the gap's metric (authors' command: --fair acc)", choices=FAIR)
  gap_fraction: float = hparam(0.1, "each client's held-out share the gaps are measured on (authors: a validation "
                               "split); 0: the training data", ge=0, lt=1, static=True)


RULE = RuleSpec("ga", lambda ctx, hp: ga_rule(), doc="aggregation by the clients' generalisation-adjusted weights",
                activity=("rule_deviation",))
SPEC = MethodSpec(
    "fedga", "Zhang et al. 2023 (Alg. 1; authors' code)",
    lambda ctx, hp: fedga_client(ctx.model, ctx.sched, ctx.client_opt, ctx.num_clients, ctx.config.num_rounds,
                                 hp.step, fair=hp.fair, gap_store=ctx.prepared),
    HParams, rule="ga", sends=("its aggregation weight; generalisation gap (post-round)",),
    receives=("aggregation weights",), group="FDG", tune_fraction=lambda hp: hp.gap_fraction,
    prepare=lambda ctx, hp: ctx.tune_store if hp.gap_fraction > 0 else None,  # each client's gap split
    claim="Zhang et al. 2023")
