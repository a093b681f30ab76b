"""Centralised DG objectives inside clients (Bai et al. 4.2): IRMv1, VREx, CORAL, MMD, Mixup.

Each client applies the objective over the domains present in its minibatch (domain ids
`batch.domain`), with the penalties of `fedjax_dg.objectives` (DomainBed's formulas):

  irm:   mean_e R_e + lambda_t mean_e irm_penalty_e
  vrex:  mean_e R_e + lambda_t vrex_penalty(R_e)
  coral: mean_e R_e + gamma mean_{i<j} coral_penalty(z_i, z_j)
  mmd:   mean_e R_e + gamma mean_{i<j} mmd_penalty(z_i, z_j)
  mixup: mean_e [lam_e CE(x~, y_i) + (1 - lam_e) CE(x~, y_j)] over cyclic domain pairs
         (`mixup_loss`; `lambda` is Beta's alpha)

means over the present domains and pairs of present domains. On a single-domain client
every objective but Mixup is ERM: VREx, CORAL and MMD vanish by construction, and IRM's
penalty is applied only when two or more domains are present (docs/ALGORITHMS.md: the objectives
collapse to ERM on single-domain clients); Mixup mixes within the domain (docs/ALGORITHMS.md).

Annealing (IRM, VREx). `lambda_t = 1` for the first `T_a` update steps and `lambda` after,
counting update steps on the run's clock `round * K + local step` (K the compiled local
steps per round), so every client switches at the same round whether or not it was
sampled before. `T_a` is set relative to the run by default: `anneal_fraction` of the
run's `num_rounds * K` local steps (0.1: DomainBed's 500 of its 5,000 steps); a
non-negative `anneal_steps` gives `T_a` in steps instead. DomainBed's
`irm_penalty_anneal_iters` counts the optimizer steps of its one training run
(`update_count`, one per `update` call). Bai et al.'s federated code (FedDG_Benchmark,
`src/client.py: IRM.step`) counts each client's own local steps over the rounds it took
part in (the counter lives on the client object) and ramps the weight linearly,
`update_count / penalty_anneal_iters`, before it; the same function then sets the weight
to 0 unconditionally, so their IRM and VREx train without the penalty. Unlike DomainBed
the local optimizer is not reset when the penalty switches on. The server is FedAvg's
(any optax rule).

Cost. A minibatch of B rows holds at most B domains, so every objective first renumbers
the present domains to slots 0..S-1 (`base.slot_view`, S = min(B, D), ascending domain id)
and computes over the slots: O(B) risks, O(S^2) pairs, nothing of size D (Py150's 5,477
repositories, IWildCam's 243 cameras, FEMNIST's writers compile as three domains do). All
five objectives are symmetric in the domains (means over present domains and pairs;
Mixup's pairing follows a uniformly random order), so this is exact, not an approximation.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import PENALTY_ACTIVITY, LocalSchedule, example_view, slot_view
from fedjax_dg.algorithms.fedavg import keeps_optimizer, objective_client
from fedjax_dg.algorithms.spec import Choice, ClientSide, LogUniform, MethodSpec, hparam
from fedjax_dg.objectives import (domain_risks, domain_slots, irm_penalties, mean_pairwise_coral,
                                  mean_pairwise_mmd, mixup_partners, vrex_penalty)

KINDS = ("irm", "vrex", "coral", "mmd", "mixup")


def mixup_pairing(rng, batch, num_domains: int, alpha: float):
  """`(j, lam)`: each row's Mixup partner (`mixup_partners` under a uniformly random order
  of the batch's `S = min(B, num_domains)` domain slots, i.e. of its present domains) and
  its `lam ~ Beta(alpha, alpha)`, one draw per present domain. Drawn over the slots, not
  over every domain of the dataset (same distribution, O(B) at thousands of domains)."""
  slot, ids = domain_slots(batch.domain, batch.mask, num_domains)
  size = ids.shape[0]
  order = jax.random.permutation(jax.random.fold_in(rng, 1), size)
  j = mixup_partners(batch.domain, batch.mask, num_domains, order)
  return j, jax.random.beta(rng, alpha, alpha, (size,))[slot]


def mixup_loss(model, params, batch, rng, alpha: float, num_domains: int):
  """Inter-domain Mixup (DomainBed): the present domains are put in a random order each step
  and each is paired with the next one in that order (`mixup_pairing`, DomainBed's
  `random_pairs_of_minibatches`), `lam_e ~ Beta(alpha, alpha)`, inputs
  `lam x_i + (1 - lam) x_j`, loss `lam CE(y_i) + (1 - lam) CE(y_j)`, mean within each
  domain, then over the present domains. A single-domain client mixes within its domain."""
  j, lam = mixup_pairing(rng, batch, num_domains, alpha)
  bx = lam.reshape((-1,) + (1,) * (batch.x.ndim - 1))
  logits = model.apply(params, bx * batch.x + (1 - bx) * batch.x[j])
  ce = (lam * optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
        + (1 - lam) * optax.softmax_cross_entropy_with_integer_labels(logits, batch.y[j]))
  sv, size = slot_view(batch, num_domains)
  risks, present = domain_risks(ce, sv.domain, sv.mask, size)
  return jnp.sum(risks * present) / jnp.maximum(jnp.sum(present), 1.0)


def anneal_length(anneal_steps: int, anneal_fraction, total_steps: int):
  """`T_a`, the update steps at weight 1 before `lambda`: `anneal_steps` when it is
  non-negative, else `anneal_fraction * total_steps` (the run's local steps,
  `num_rounds * K`); a run-time value when `anneal_fraction` is one.

  Args:
    anneal_steps: steps at weight 1, or -1 for "relative to the run".
    anneal_fraction: share of the run's local steps at weight 1 (read when `anneal_steps < 0`).
    total_steps: the run's local steps on the round clock, `num_rounds * K`.

  Returns:
    The step count `T_a` (a float, compared with the step index).
  """
  return anneal_steps if anneal_steps >= 0 else anneal_fraction * total_steps


def dg_objective(model, kind: str, lam: float, num_domains: int, anneal_steps=0, steps_per_round: int = 1):
  """`(round) -> objective(params, batch, rng)` for one of KINDS; `anneal_steps` is `T_a`
  (`anneal_length`), compared with the update step `round * steps_per_round + batch.step`.
  The aux dict holds the penalty, the weighted term `lambda_t * penalty`
  (`penalty_term`) and, for the annealed IRM and VREx, whether the weight is at its target
  `lambda` (`at_target`)."""
  if kind not in KINDS:
    raise ValueError(f"algorithm.name: unknown DG objective {kind!r}; choose one of {KINDS}")

  def make(round_):
    def objective(params, batch, rng):
      if kind == "mixup":
        return mixup_loss(model, params, batch, rng, lam, num_domains), {}
      z = model.features(params, batch.x)
      logits = model.head(params["classifier"], z)
      batch, size = slot_view(batch, num_domains)  # the present domains as slots 0..S-1, S = min(B, D)
      batch, (z, logits) = example_view(batch, z, logits)  # per-token labels: labelled tokens as examples
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
      risks, present = domain_risks(ce, batch.domain, batch.mask, size)
      n_present = jnp.maximum(jnp.sum(present), 1.0)
      erm = jnp.sum(risks * present) / n_present
      step = round_ * steps_per_round + batch.step
      lam_t = jnp.where(step < anneal_steps, 1.0, lam)
      if kind == "irm":
        pens = irm_penalties(logits, batch.y, batch.domain, batch.mask, size)
        pen = jnp.where(jnp.sum(present) >= 2, jnp.sum(pens * present) / n_present, 0.0)
      elif kind == "vrex":
        pen = vrex_penalty(risks, present)
      else:
        fn = mean_pairwise_coral if kind == "coral" else mean_pairwise_mmd
        pen = fn(z, batch.domain, batch.mask, size)
        return erm + lam * pen, {"penalty": pen, "penalty_term": lam * pen}
      at_target = (jnp.asarray(lam_t) == lam).astype(jnp.float32)  # only IRM and VREx anneal
      return erm + lam_t * pen, {"penalty": pen, "penalty_term": lam_t * pen, "at_target": at_target}
    return objective
  return make


def dg_client(model, sched: LocalSchedule, client_opt: optax.GradientTransformation, kind: str, lam: float,
              num_domains: int, anneal_steps=0, keep_optimizer: bool = False) -> ClientSide:
  """FedAvg's client on the DG objective `kind`; the broadcast carries the round (annealing).
  `anneal_steps` is `T_a` (`anneal_length`). `keep_optimizer`: the local optimizer state
  carries across rounds (the centralised C = 1 runs, where the method is DomainBed's single
  training run)."""
  make = dg_objective(model, kind, lam, num_domains, anneal_steps, sched.num_steps)
  return objective_client(lambda g, round_: make(round_), client_opt, sched, keep_optimizer=keep_optimizer,
                          record=kind != "mixup", broadcast=lambda side, round_: round_)


# Searched as a share of the run, so every trial's penalty acts for at least half the run
# (DomainBed draws 10**U(0, 4) of its 5,000 steps, i.e. up to twice the run: in a short
# federated run most such draws never switch the penalty on).
ANNEAL_FRACTIONS = (0.0, 0.05, 0.1, 0.25, 0.5)
ANNEAL_STEPS_DOC = "update steps at weight 1 before lam; -1: anneal_fraction of the run's local steps"
ANNEAL_FRACTION_DOC = ("share of the run's local steps (num_rounds * K) at weight 1 before lam (DomainBed: "
                       "500 of 5,000 steps)")


@dataclasses.dataclass(frozen=True)
class IRMHParams:
  lam: float = hparam(100.0, "penalty weight after annealing (DomainBed)", ge=0, search=LogUniform(1e-1, 1e5))
  anneal_steps: int = hparam(-1, ANNEAL_STEPS_DOC, ge=-1, integer=True)
  anneal_fraction: float = hparam(0.1, ANNEAL_FRACTION_DOC, ge=0, lt=1, search=Choice(ANNEAL_FRACTIONS))


@dataclasses.dataclass(frozen=True)
class VRExHParams:
  lam: float = hparam(10.0, "penalty weight after annealing (DomainBed)", ge=0, search=LogUniform(1e-1, 1e5))
  anneal_steps: int = hparam(-1, ANNEAL_STEPS_DOC, ge=-1, integer=True)
  anneal_fraction: float = hparam(0.1, ANNEAL_FRACTION_DOC, ge=0, lt=1, search=Choice(ANNEAL_FRACTIONS))


@dataclasses.dataclass(frozen=True)
class CORALHParams:
  gamma: float = hparam(1.0, "penalty weight (DomainBed)", ge=0, search=LogUniform(1e-1, 1e1))


@dataclasses.dataclass(frozen=True)
class MMDHParams:
  gamma: float = hparam(1.0, "penalty weight (DomainBed)", ge=0, search=LogUniform(1e-1, 1e1))


@dataclasses.dataclass(frozen=True)
class MixupHParams:
  alpha: float = hparam(0.2, "Beta(alpha, alpha) (DomainBed; Bai et al. 2024 App. D)", gt=0, search=LogUniform(1e-1, 1e1))


def _anneal(ctx, hp):
  return anneal_length(hp.anneal_steps, hp.anneal_fraction, int(ctx.config.num_rounds) * ctx.sched.num_steps)


def _spec(kind, paper, hparams, weight_field, anneal=False, not_for_text=None):
  build = lambda ctx, hp: dg_client(ctx.model, ctx.sched, ctx.client_opt, kind, getattr(hp, weight_field),
                                    ctx.num_domains, _anneal(ctx, hp) if anneal else 0, keeps_optimizer(ctx))
  activity = () if kind == "mixup" else PENALTY_ACTIVITY + (("weight_at_target",) if anneal else ())
  return MethodSpec(kind, paper, build, hparams, group="DG", not_for_text=not_for_text, activity=activity)


SPECS = (
    _spec("irm", "Arjovsky et al. 2019 (IRMv1, DomainBed)", IRMHParams, "lam", anneal=True),
    _spec("vrex", "Krueger et al. 2021 (DomainBed)", VRExHParams, "lam", anneal=True),
    _spec("coral", "Sun & Saenko 2016 (DomainBed)", CORALHParams, "gamma"),
    _spec("mmd", "Li et al. 2018 (DomainBed)", MMDHParams, "gamma"),
    _spec("mixup", "Zhang et al. 2018, inter-domain (DomainBed)", MixupHParams, "alpha",
          not_for_text="Mixup interpolates inputs; token ids cannot be interpolated (Bai et al. 2024 Table 5 has no "
                       "Mixup row for text)"),
)
