"""FedLOE (the FedLOE paper): Federated DG via Locally Overfit Ensembles.

Stage 1 is FedAvg with infrequent communication: `T1` local Adam steps in total, averaged
at `|T1_sync|` synchronisation points, i.e. FedAvg with `local_steps = T1 / |T1_sync|`
for `|T1_sync|` rounds ("Our FedAvg" of Tables 2-4 is this stage alone). Sec. 4.1:
`T_1` "is tuned experimentally and generally is a much smaller set than all possible time
points" (Fig. 1a: 4 of 256 epochs best; Table 5: 8 syncs of 256 iterations on PACS and
OfficeHome, 80 of 5,120 on IWildCam). Here `stage1_syncs` is `|T1_sync|` (searched in
{2, 4, 8, 16}) and `T1` is the run's budget, `num_rounds * K` local steps (K the run's
steps per round), less stage 2's `stage2_rounds * head_steps` head steps, so FedLOE takes
the same number of local steps as every other method (`stage1_schedule`;
`MethodSpec.first_stage`, which the runner applies). `stage1_syncs = 0` keeps the
config's own rounds and local schedule for stage 1.

Stage 2 (App. C, Alg. 1, eq. 12), with the featurizer `g_theta` frozen, one engine round per
synchronisation, `|T2_sync|` rounds (Table 5: 4 syncs of 8 iterations in all, i.e. 2 local
iterations per sync, SGD lr 0.05, weight decay 5e-4):
  2.1 (update phase) every client trains its linear head `psi_c` for `head_steps` SGD
      iterations on its training split, starting from the broadcast head (the stage-1
      head in the first round, the combined head `psi` of the last synchronisation after
      that: eq. (12), `psi_c^t = sum_c' phi_c'^t psi_c'^{t-1}` at every `t in T_2`, and
      Alg. 1's `Server -> Client: psi^t`), and sends it;
  2.2 (post-round report) every client `c'` computes the logits of every head on its tuning
      split (10% of its data), `yhat_{c', c} = g(x_{c'}^tune) psi_c`, and sends them with
      labels; the server solves eq. (11)
          phi* = argmin_phi sum_c' p_c' E_c'[CE(sum_c phi_c yhat_{c', c}, y)] + lambda r(phi)
      over unconstrained `phi in R^C` (clients as domains, `R_c'` the client's mean CE) with
          irm:  sum_c' (d/dw R_c'(w * logits) at w = 1)^2          (App. C.1)
          rex:  Var_c'[R_c']  (the variance across clients, as eq. (3) defines r_REx)
      by `solver_steps` of Adam from uniform `phi = 1/C` (App. C.1 gives the objective, not
      the solver); and the new head is `psi = sum_c phi*_c psi_c` (exact: the heads are
      linear, so the combined logits are the logits of the combined head).
  Fish: Table 5 gives FedLOE-Fish a meta learning rate (0.05), i.e. Fish's first-order
      update (Shi et al. 2022), not App. C.1's penalty `-sum <grad R_c, grad R_c'>`, which is
      unbounded below on unconstrained `phi` (the optimum runs off and inverts the head).
      Per solver step: `phi~ <- phi`, one SGD step of `phi~` on `R_c'` for every reporting
      client in turn (step `solver_lr`), then `phi <- phi + meta_lr (phi~ - phi)`.
With `lambda = 0` and no solver steps, stage 2 is plain head averaging.
Both stages run through the engine (strategies, host store, checkpoints).

Model selection considers stage 2's evaluations only, one per synchronisation: a
selection among `stage2_rounds` models (4 by default) where a method evaluated every
round of a 60-round run chooses among 30. This is kept on purpose. FedLOE's model is the
combined head of a stage-2 synchronisation; a stage-1 model is "Our FedAvg" (FedAvg with
infrequent communication), so letting the selection pick one would report another
method under FedLOE's name. Fewer candidates make FedLOE's selected score, if anything,
less optimistic than the others' (the maximum of fewer noisy validation scores); a user
who wants as many choices raises `stage2_rounds` (each adds `head_steps` local steps to
stage 2, taken from stage 1's budget).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax
import numpy as np

from fedjax_dg.algorithms.base import (Algorithm, ClientOutput, LocalSchedule, in_chunks, local_train,
                                       make_optimizer, make_schedule, masked_cross_entropy)
from fedjax_dg.algorithms.fedavg import erm_client
from fedjax_dg.algorithms.spec import Choice, LogUniform, MethodSpec, Stage, hparam
from fedjax_dg.objectives import vrex_penalty

PENALTIES = ("none", "irm", "fish", "rex")


class Stage2State(NamedTuple):
  params: dict     # the model: the frozen featurizer and the combined head psi
  heads: dict      # every client's last head psi_c, stacked [C, ...]
  phi: jax.Array   # [C] the last combination weights
  round: jax.Array


def client_logits(model, params, heads, x, chunk: int = 256):
  """`yhat[i, c] = h_{psi_c}(g(x_i))`: logits of every head on one client's rows, `[N, C, K]`
  (features through `model.features`, i.e. the model's input preprocessing)."""
  z = in_chunks(lambda xb: model.features(params, xb), x, chunk)
  return jax.vmap(lambda psi: model.head(psi, z), out_axes=1)(heads)


def per_client_losses(phi, logits, y, mask):
  """`R_c'(phi)` for every client: the mean CE of the combined logits on its tuning rows."""
  combined = jnp.einsum("c,mnck->mnk", phi, logits)
  return jax.vmap(masked_cross_entropy)(combined, y, mask)


def invariance_penalty(kind: str, phi, logits, y, mask):
  """`r(phi)` of App. C.1 (`fish`: the penalty as written there; the solver uses Fish's update)."""
  if kind == "none":
    return jnp.asarray(0.0)
  if kind == "irm":
    def scaled(w):
      return per_client_losses(w * phi, logits, y, mask)
    g = jax.jacfwd(scaled)(jnp.asarray(1.0))           # [C'] d/dw R_c' at w = 1
    return jnp.sum(g ** 2)
  if kind == "rex":
    return vrex_penalty(per_client_losses(phi, logits, y, mask))     # Var_c' R_c' (eq. 3)
  if kind == "fish":
    grads = jax.jacrev(lambda f: per_client_losses(f, logits, y, mask))(phi)   # [C', C]
    gram = grads @ grads.T
    return -(jnp.sum(gram) - jnp.trace(gram))
  raise ValueError(f"algorithm.loe_penalty: unknown {kind!r}; choose one of {PENALTIES}")


def manager_objective(phi, logits, y, mask, weights, kind: str, lam: float):
  """Eq. (11): the weighted mean of the clients' losses plus `lam * r`."""
  r = per_client_losses(phi, logits, y, mask)
  p = weights / jnp.sum(weights)
  return jnp.sum(p * r) + lam * invariance_penalty(kind, phi, logits, y, mask)


def fish_manager(logits, y, mask, weights, steps: int, lr: float, meta_lr: float):
  """FedLOE-Fish's `phi`: Fish's first-order update over the reporting clients (rows with
  `weights > 0`), from the uniform combination."""
  C = logits.shape[2]
  risk = lambda phi, m: per_client_losses(phi, logits[m][None], y[m][None], mask[m][None])[0]

  def inner(phi_t, m):
    step = phi_t - lr * jax.grad(risk)(phi_t, m)
    return jnp.where(weights[m] > 0, step, phi_t), None

  def meta(phi, _):
    phi_t, _ = jax.lax.scan(inner, phi, jnp.arange(logits.shape[0]))
    return phi + meta_lr * (phi_t - phi), None

  phi, _ = jax.lax.scan(meta, jnp.full((C,), 1.0 / C), None, length=steps)
  return phi


def solve_manager(logits, y, mask, weights, kind: str, lam: float, steps: int, lr: float, meta_lr: float = 0.05):
  """`phi*` of eq. (11) by Adam from the uniform combination (`fish`: `fish_manager`)."""
  if kind == "fish":
    return fish_manager(logits, y, mask, weights, steps, lr, meta_lr)
  C = logits.shape[2]
  opt = optax.adam(lr)
  phi = jnp.full((C,), 1.0 / C)
  grad = jax.grad(manager_objective)

  def step(carry, _):
    phi, st = carry
    upd, st = opt.update(grad(phi, logits, y, mask, weights, kind, lam), st)
    return (optax.apply_updates(phi, upd), st), None

  (phi, _), _ = jax.lax.scan(step, (phi, opt.init(phi)), None, length=steps)
  return phi


def combine_heads(phi, heads):
  return jax.tree.map(lambda h: jnp.tensordot(phi, h, axes=1), heads)


def stage2(model, sched: LocalSchedule, head_opt: optax.GradientTransformation, tune_store, kind: str, lam: float,
           num_clients: int, solver_steps: int = 200, solver_lr: float = 0.05, meta_lr: float = 0.05) -> Algorithm:
  """Stage 2 as an engine algorithm: heads trained in the update phase from the broadcast
  combined head, the invariant manager fed by the post-round report of tuning-split logits."""
  if kind not in PENALTIES:
    raise ValueError(f"algorithm.fedloe.penalty: unknown {kind!r}; choose one of {PENALTIES}")
  tune = jax.tree.map(jnp.asarray, tune_store)
  n_tune = tune.y.shape[1]

  def head_objective(params):
    def objective(psi, batch, rng):
      z = jax.lax.stop_gradient(model.features(params, batch.x))
      return masked_cross_entropy(model.head(psi, z), batch.y, batch.mask), {}
    return objective

  def server_init(rng, params):
    heads = jax.tree.map(lambda h: jnp.broadcast_to(h, (num_clients,) + h.shape).copy(), params["classifier"])
    return Stage2State(params, heads, jnp.full((num_clients,), 1.0 / num_clients), jnp.asarray(0, jnp.int32))

  def client_update(b, client_state, data, rng):                                 # 2.1, from psi: eq. (12)
    params, _ = b
    psi, loss = local_train(params["classifier"], head_objective(params), head_opt, data, rng, sched)
    return ClientOutput((psi, data.client_id), client_state,
                        {"train_loss": loss, "activity/stage": jnp.full((), 2.0, jnp.float32)})

  def server_update(s: Stage2State, stacked) -> Stage2State:
    new, ids = stacked.messages
    ids = jnp.where(stacked.weights > 0, ids, num_clients)
    heads = jax.tree.map(lambda H, h: H.at[ids].set(h, mode="drop"), s.heads, new)
    return s._replace(heads=heads, round=s.round + 1)

  def client_report(b, client_state, data, rng):                                 # 2.2, clients
    params, heads = b
    c = data.client_id
    logits = client_logits(model, params, heads, tune.x[c])
    return logits, tune.y[c], (jnp.arange(n_tune) < tune.counts[c]).astype(jnp.float32)

  def server_finish(s: Stage2State, stacked) -> Stage2State:                     # 2.2, server
    logits, y, mask = stacked.messages
    weights = jnp.sum(mask, 1) * (stacked.weights > 0)
    phi = solve_manager(logits, y, mask, weights, kind, lam, solver_steps, solver_lr, meta_lr)
    return s._replace(params={**s.params, "classifier": combine_heads(phi, s.heads)}, phi=phi)

  return Algorithm(
      name="fedloe_stage2", server_init=server_init, client_init=lambda params: (),
      broadcast=lambda s: (s.params, s.heads), client_update=client_update, server_update=server_update,
      params_of=lambda s: s.params, aggregation="stack", weighting="uniform", client_report=client_report,
      server_finish=server_finish, report_aggregation="stack")


@dataclasses.dataclass(frozen=True)
class HParams:
  tune_fraction: float = hparam(0.1, "each client's tuning split (the FedLOE paper D.2: 10%)", gt=0, lt=1, static=True)
  stage2_rounds: int = hparam(4, "|T2_sync| (Table 5: 4 on PACS and OfficeHome)", ge=0, integer=True)
  head_steps: int = hparam(2, "stage-2 local SGD iterations per sync (Table 5: 8 iterations / 4 syncs)", ge=1,
                           integer=True)
  head_lr: float = hparam(0.05, "stage-2 SGD step (Table 5)", gt=0)
  head_weight_decay: float = hparam(5e-4, "stage-2 weight decay (Table 5)", ge=0, static=True)
  penalty: str = hparam("irm", "the invariant manager's DG method", choices=PENALTIES)
  lam: float = hparam(100.0, "IRM / REx lambda (Table 5)", ge=0, search=LogUniform(1.0, 1e3))
  meta_lr: float = hparam(0.05, "Fish meta step (Table 5: 0.05 PACS/OfficeHome, 0.01 IWildCam)", gt=0, le=1,
                          search=Choice((0.01, 0.05, 0.1)))
  solver_steps: int = hparam(200, "manager solver steps (ours)", ge=0, integer=True)
  solver_lr: float = hparam(0.05, "manager solver step (ours)", gt=0)
  stage1_syncs: int = hparam(8, "|T1_sync|, stage 1's synchronisations in the run's budget of local steps (Table 5: 8 "
                             "on PACS and OfficeHome; Fig. 1a: 4); 0: the config's rounds", ge=0, integer=True,
                             search=Choice((2, 4, 8, 16)))


def stage1_schedule(num_rounds: int, steps_per_round: int, syncs: int, stage2_steps: int = 0) -> tuple[int, int]:
  """Stage 1's `(rounds, local_steps)`: `syncs` rounds sharing the run's budget.

  Args:
    num_rounds: the run's rounds (every other method's).
    steps_per_round: the run's local steps per round, K.
    syncs: `|T1_sync|`; 0 keeps `(num_rounds, steps_per_round)`.
    stage2_steps: the local steps stage 2 takes (`stage2_rounds * head_steps`), taken
      from the same budget.

  Returns:
    `(rounds, local_steps)` with `rounds * local_steps <= num_rounds * K - stage2_steps`,
    `rounds = min(syncs, budget)` and every round at least one step.

  Raises:
    ValueError: one line naming `algorithm.fedloe.stage2_rounds` when stage 2 alone takes
      the whole budget.
  """
  if syncs == 0:
    return num_rounds, steps_per_round
  budget = num_rounds * steps_per_round - stage2_steps
  if budget < 1:
    raise ValueError(f"algorithm.fedloe.stage2_rounds: stage 2's {stage2_steps} local steps take the run's whole "
                     f"budget of {num_rounds * steps_per_round}; lower stage2_rounds or head_steps")
  rounds = min(syncs, budget)
  return rounds, budget // rounds


def stage1_client(ctx, hp):
  """Stage 1: FedAvg's client, reporting `activity/stage` 1 (stage 2's clients report 2)."""
  side = erm_client(ctx, hp)

  def update(*args):
    out = side.update(*args)
    return out._replace(metrics={**out.metrics, "activity/stage": jnp.ones((), jnp.float32)})
  return side._replace(update=update)


def _stage2_data(ctx, hp: HParams) -> dict:
  """What stage 2 reads of the run's data: the clients' sizes (its loop's schedule) and
  their tuning splits."""
  counts = ctx.store.counts
  return {"n_max": int(counts.max()), "n_min": int(counts.min()), "tune": ctx.tune_store}


def _stage2(ctx, hp: HParams) -> Algorithm:
  data = ctx.prepared
  sched = make_schedule(ctx.config.client.batch_size, hp.head_steps, 0, data["n_max"], data["n_min"], ctx.sched.unroll,
                        activity=ctx.sched.activity)
  head_opt = make_optimizer(ml_collections.ConfigDict(
      {"optimizer": "sgd", "lr": 1.0, "momentum": 0.0, "weight_decay": hp.head_weight_decay}), values={"lr": hp.head_lr})
  return stage2(ctx.model, sched, head_opt, data["tune"], hp.penalty, hp.lam, ctx.num_clients, hp.solver_steps,
                hp.solver_lr, hp.meta_lr)


def _check(config, hp):
  if tuple(config.model.head_hidden) != ():
    return "model.head_hidden: FedLOE combines linear heads, set it to ()"
  return None


SPEC = MethodSpec(
    "fedloe", "the FedLOE paper (App. C, Alg. 1)", stage1_client, HParams,
    sends=("stage 2: its linear head", "stage 2: logits and labels of its tuning split"),
    receives=("stage 2: every client's head, the combined head",), leaks_data=True, group="FDG papers", check=_check,
    claim="the FedLOE paper",
    tune_fraction=lambda hp: hp.tune_fraction,
    # Stage 2 is evaluated at every synchronisation: its selection chooses among all of them.
    stages=lambda hp: (Stage("stage 2", _stage2, lambda config, hp: hp.stage2_rounds, prepare=_stage2_data,
                             eval_every=lambda config, hp: 1),),
    first_stage=lambda config, hp, steps_per_round: stage1_schedule(
        int(config.num_rounds), steps_per_round, hp.stage1_syncs, hp.stage2_rounds * hp.head_steps),
    activity=("stage",),
    not_for_models=(("gpt2", "FedLOE's stage 2 trains the clients' heads on frozen features, but GPT-2's head is "
                             "tied to its input embedding, so training it moves the features; each head is also V x d"),),
    record=lambda server: {"phi": np.asarray(server.phi).tolist()} if hasattr(server, "phi") else {})
