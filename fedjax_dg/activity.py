"""Whether a run's method can act, known before training (`preflight`).

A method's distinctive term can be switched off by the run around it: a penalty weight
annealed over more local steps than the run takes, a penalty between domains on clients
that each hold one domain, a proximal term with one local step. `preflight` reads the
config and three numbers of the run and returns one `Finding` per such case, each a
one-line message naming the config field. The runner raises the "error" findings as a
one-line config error before anything compiles and stores the "warning" findings in the
run's summary (docs/activity.md says which is which, and why).

During training the methods report how much their term acted (`activity/<name>` round
metrics; `MethodSpec.activity` lists a method's names). Those are computed where the
method runs (`fedjax_dg.algorithms`); this module needs nothing of the engine.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

# DG penalties between domains, as `{method: its weight field}`: on a client whose data
# holds one domain each is exactly zero, so the client trains plain ERM.
DOMAIN_PENALTIES = {"irm": "lam", "vrex": "lam", "mmd": "gamma", "coral": "gamma"}
# Penalty weights that, at 0, leave the plain FedAvg client (examples-weighted).
ZERO_IS_FEDAVG = {**DOMAIN_PENALTIES, "fedprox": "mu"}


class Finding(NamedTuple):
  """One thing a run's config switches off.

  level            "error" (the runner refuses the run) or "warning" (printed and stored)
  field            the config field to change, e.g. "algorithm.irm.anneal_steps"
  message          one line: what does not act, and why
  equals_baseline  the run computes FedAvg's update exactly (reports print "-")
  inactive         the method's own term does not act at all in this run, though the run
                   is not FedAvg's (another server rule acts, or the method reduces to
                   something else): reports print "-" for it too. A finding with neither
                   flag (a term acting on some clients only, a stage shortened) is told to
                   the reader and the run still measures the method.
  """
  level: str
  field: str
  message: str
  equals_baseline: bool = False
  inactive: bool = False


def preflight(config, *, local_steps: int, rounds: int, client_domains: Sequence[int]) -> list[Finding]:
  """The findings of one run, before training.

  Args:
    config: the experiment config (`algorithm.name` and `algorithm.<method>.*` are read).
    local_steps: the local steps a client takes per round (the local schedule's steps).
    rounds: the run's total number of rounds.
    client_domains: for each client, the number of distinct training domains it holds.

  Returns:
    A list of `Finding`s, errors first; empty when nothing is switched off.

  Raises:
    ValueError: one line naming the field, for an unknown method or a field out of range
      (as `algorithms.validate`).
  """
  from fedjax_dg import algorithms  # the registry; imported here so this module stays light
  spec, rule = algorithms.resolve(config.algorithm.name)
  hp = algorithms.hparams_of(config, spec)
  key = spec.key
  plain_rule = rule.name == "fedavg"
  found = []
  found += anneal_findings(key, hp, local_steps * rounds)
  found += single_domain_findings(key, hp, client_domains, plain_rule)
  found += zero_weight_findings(key, hp, plain_rule)
  found += proximal_findings(key, hp, local_steps, plain_rule)
  found += fish_findings(key, client_domains)
  found += groupdro_findings(key, client_domains, plain_rule)
  found += mixup_findings(key, client_domains)
  found += fedloe_findings(key, hp, rounds, plain_rule)
  return sorted(found, key=lambda f: f.level != "error")


def anneal_findings(key: str, hp, total_steps: int) -> list[Finding]:
  """IRM/VREx: the weight never leaves 1 when `T_a >= total_steps` (and `lam != 1`).

  Args:
    key: the method's config key ("irm", "vrex"; others have no annealing).
    hp: its hyperparameter record.
    total_steps: the run's local steps, `rounds * local_steps`.

  Returns:
    One "error" finding, or none.
  """
  if not hasattr(hp, "anneal_steps"):
    return []
  from fedjax_dg.algorithms.dg import anneal_length
  t_a = anneal_length(hp.anneal_steps, hp.anneal_fraction, total_steps)
  if hp.lam == 1.0 or t_a < total_steps:
    return []
  field = f"algorithm.{key}.anneal_steps" if hp.anneal_steps >= 0 else f"algorithm.{key}.anneal_fraction"
  return [Finding("error", field,
                  f"{field}: the penalty weight stays 1 for all {total_steps} local steps of the run "
                  f"(annealing lasts {t_a:g}), so algorithm.{key}.lam={hp.lam:g} never applies; set "
                  f"anneal_steps below {total_steps} or -1 for anneal_fraction of the run")]


def single_domain_findings(key: str, hp, client_domains: Sequence[int], plain_rule: bool) -> list[Finding]:
  """A penalty between domains on clients that hold one domain is zero there.

  Args:
    key: the method's config key.
    hp: its hyperparameter record.
    client_domains: distinct training domains per client.
    plain_rule: the server rule is FedAvg's (then every client single-domain is FedAvg exactly).

  Returns:
    One "warning" finding, or none.
  """
  if key not in DOMAIN_PENALTIES or not len(client_domains):
    return []
  single = sum(1 for n in client_domains if n <= 1)
  if single == 0:
    return []
  field = f"algorithm.{key}.{DOMAIN_PENALTIES[key]}"
  if single < len(client_domains):
    return [Finding("warning", field, f"{field}: {single} of {len(client_domains)} clients hold one domain, where "
                    f"the {key} penalty is zero; it acts on the other {len(client_domains) - single} only")]
  same = "FedAvg's update exactly" if plain_rule else "its server rule on plain ERM clients"
  return [Finding("warning", field, f"{field}: every client holds one domain, where the {key} penalty is zero: "
                  f"the run computes {same}", equals_baseline=plain_rule, inactive=not plain_rule)]


def zero_weight_findings(key: str, hp, plain_rule: bool) -> list[Finding]:
  """A penalty weight of 0 leaves the plain FedAvg client.

  Args:
    key: the method's config key.
    hp: its hyperparameter record.
    plain_rule: the server rule is FedAvg's.

  Returns:
    One "warning" finding, or none.
  """
  if key not in ZERO_IS_FEDAVG or getattr(hp, ZERO_IS_FEDAVG[key]) != 0:
    return []
  field = f"algorithm.{key}.{ZERO_IS_FEDAVG[key]}"
  return [Finding("warning", field, f"{field}=0: the {key} term is switched off, the clients train plain ERM",
                  equals_baseline=plain_rule, inactive=not plain_rule)]


def proximal_findings(key: str, hp, local_steps: int, plain_rule: bool) -> list[Finding]:
  """FedProx with one local step: the proximal gradient `mu (theta_c - theta)` is zero at
  the one step, taken at `theta_c = theta`.

  Args:
    key: the method's config key.
    hp: its hyperparameter record.
    local_steps: local steps per round.
    plain_rule: the server rule is FedAvg's.

  Returns:
    One "warning" finding, or none.
  """
  if key != "fedprox" or local_steps != 1 or hp.mu == 0:
    return []
  return [Finding("warning", "algorithm.fedprox.mu",
                  "algorithm.fedprox.mu: with one local step a round the proximal term's gradient is zero at "
                  "the only step (taken at the global model): the run computes FedAvg's update exactly",
                  equals_baseline=plain_rule, inactive=not plain_rule)]


def fish_findings(key: str, client_domains: Sequence[int]) -> list[Finding]:
  """Fish on clients that all hold one domain: each step is one inner step scaled by
  `meta_lr`, i.e. local ERM at a smaller step (not FedAvg's update at the same step).

  Args:
    key: the method's config key.
    client_domains: distinct training domains per client.

  Returns:
    One "warning" finding, or none.
  """
  if key != "fish" or not len(client_domains) or any(n > 1 for n in client_domains):
    return []
  return [Finding("warning", "algorithm.fish.meta_lr",
                  "algorithm.fish.meta_lr: every client holds one domain, so Fish's inner loop has one step and "
                  "its update is local ERM with the step scaled by meta_lr (no gradient matching)", inactive=True)]


def groupdro_findings(key: str, client_domains: Sequence[int], plain_rule: bool) -> list[Finding]:
  """GroupDRO on single-domain clients: the group weights renormalised over the present
  domains weigh one domain, so the loss is that domain's mean loss, the ERM loss.

  Args:
    key: the method's config key.
    client_domains: distinct training domains per client.
    plain_rule: the server rule is FedAvg's.

  Returns:
    One "warning" finding, or none.
  """
  if key != "groupdro" or not len(client_domains):
    return []
  single = sum(1 for n in client_domains if n <= 1)
  if single == 0:
    return []
  if single < len(client_domains):
    return [Finding("warning", "algorithm.groupdro.eta",
                    f"algorithm.groupdro.eta: {single} of {len(client_domains)} clients hold one domain, where the "
                    f"group weights weigh one group and the loss is ERM's; they act on the other "
                    f"{len(client_domains) - single} only")]
  same = "FedAvg's update" if plain_rule else "its server rule on plain ERM clients"
  return [Finding("warning", "algorithm.groupdro.eta",
                  "algorithm.groupdro.eta: every client holds one domain, so the group weights weigh one group "
                  f"and each local loss is ERM's: the run computes {same} (to rounding)", equals_baseline=plain_rule,
                  inactive=not plain_rule)]


def mixup_findings(key: str, client_domains: Sequence[int]) -> list[Finding]:
  """Mixup on single-domain clients: with one domain present the pairing has no other
  domain to mix with, so the client mixes examples within its domain (Zhang et al.'s
  Mixup, `objectives.mixup_partners`); DomainBed's pairing would pair the lone domain's
  minibatch with itself, which is ERM.

  Args:
    key: the method's config key.
    client_domains: distinct training domains per client.

  Returns:
    One "warning" finding, or none.
  """
  if key != "mixup" or not len(client_domains):
    return []
  single = sum(1 for n in client_domains if n <= 1)
  if single == 0:
    return []
  who = "every client holds" if single == len(client_domains) else f"{single} of {len(client_domains)} clients hold"
  return [Finding("warning", "algorithm.mixup.alpha",
                  f"algorithm.mixup.alpha: {who} one domain, where Mixup mixes examples within the domain "
                  "(plain Mixup, not inter-domain Mixup; DomainBed's pairing would mix the minibatch with itself, "
                  "i.e. ERM)")]


def fedloe_findings(key: str, hp, rounds: int, plain_rule: bool) -> list[Finding]:
  """FedLOE: stage 1 at fewer synchronisations than asked, or a stage 2 that does nothing.

  Args:
    key: the method's config key.
    hp: its hyperparameter record.
    rounds: stage 1's rounds (its synchronisations, after `stage1_schedule`).
    plain_rule: the server rule is FedAvg's.

  Returns:
    "warning" findings: `stage1_syncs` above what the budget of local steps allows (one
    step per synchronisation), no stage 2 (`stage2_rounds = 0`: the run is its stage 1,
    and with `stage1_syncs = 0` FedAvg exactly), a manager that keeps the uniform
    combination (`solver_steps = 0`: stage 2 averages the heads) or one without its
    penalty (`lam = 0` with the IRM or REx manager).
  """
  if key != "fedloe":
    return []
  found = []
  if hp.stage1_syncs > rounds:
    found.append(Finding("warning", "algorithm.fedloe.stage1_syncs",
                         f"algorithm.fedloe.stage1_syncs={hp.stage1_syncs}: the run's budget of local steps allows "
                         f"{rounds} synchronisations of at least one step, so stage 1 runs {rounds}"))
  if hp.stage2_rounds == 0:
    what = ("FedAvg's run exactly" if hp.stage1_syncs == 0 and plain_rule
            else "its stage 1 alone (FedAvg at stage1_syncs synchronisations)")
    found.append(Finding("warning", "algorithm.fedloe.stage2_rounds",
                         f"algorithm.fedloe.stage2_rounds=0: no head is trained or combined, the run is {what}",
                         equals_baseline=hp.stage1_syncs == 0 and plain_rule,
                         inactive=not (hp.stage1_syncs == 0 and plain_rule)))
    return found
  if hp.solver_steps == 0:
    found.append(Finding("warning", "algorithm.fedloe.solver_steps",
                         "algorithm.fedloe.solver_steps=0: the manager keeps the uniform combination, so stage 2 "
                         f"averages the heads and its {hp.penalty} penalty never acts", inactive=True))
  elif hp.penalty in ("irm", "rex") and hp.lam == 0:
    found.append(Finding("warning", "algorithm.fedloe.lam",
                         f"algorithm.fedloe.lam=0: the manager minimises the clients' loss without its {hp.penalty} "
                         "penalty"))
  return found
