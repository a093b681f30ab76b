"""Algorithm registry: one line per method. Each method lives in its own file."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from fedjax_dg.algorithms.base import Algorithm, ClientOutput, Stacked, make_optimizer, make_schedule
from fedjax_dg.algorithms.afl import afl
from fedjax_dg.algorithms.dg import dg_fedavg
from fedjax_dg.algorithms.fedadg import fedadg
from fedjax_dg.algorithms.fedavg import erm, fedavg, minibatch_sgd, optax_rule
from fedjax_dg.algorithms.feddg import amplitude_bank, feddg
from fedjax_dg.algorithms.feddim import feddim
from fedjax_dg.algorithms.fedga import fedga
from fedjax_dg.algorithms.fedgma import fedgma
from fedjax_dg.algorithms.fediir import fediir
from fedjax_dg.algorithms.fedomg import fedomg, omg_direction, omg_rule
from fedjax_dg.algorithms.fedprox import fedprox, proximal_objective
from fedjax_dg.algorithms.fedsam import fedsam, sam
from fedjax_dg.algorithms.fedsr import fedsr, probabilistic_model
from fedjax_dg.algorithms.fish import fish
from fedjax_dg.algorithms.groupdro import groupdro
from fedjax_dg.algorithms.scaffold import scaffold

# name -> server optimizer used by the FedAvg family (None: see build_algorithm).
# fedloe: its stage 1 is FedAvg with infrequent communication; stage 2 runs in experiment.py.
_FEDOPT = {"fedavg": "sgd", "erm": "sgd", "fedavgm": "momentum", "fedadam": "adam", "fedyogi": "yogi",
           "fedloe": "sgd"}
# Client objectives that pair with any server rule consuming Delta_c; "<objective>+omg"
# swaps FedAvg's server rule for FedOMG's (seed 002 Table 2), "fedomg" is "fedavg+omg".
_OBJECTIVES = ("fedavg", "fedprox", "fedsam")
ALGORITHMS = ("erm", "minibatch_sgd", "fedavg", "fedavgm", "fedadam", "fedyogi", "fedprox", "scaffold",
              "fedsam", "fedomg", "fedprox+omg", "fedsam+omg", "fediir", "fediir+omg", "feddim", "fedga", "fedloe",
              "irm", "vrex", "coral", "mmd", "mixup", "fish", "groupdro", "afl", "fedsr", "fedsr+omg", "feddg",
              "fedadg", "fedgma")


def objective_factory(name: str, config, model):
  """The local objective of `name` (one of _OBJECTIVES) as `global_params -> objective`."""
  if name == "fedavg":
    return erm(model)
  if name == "fedprox":
    return proximal_objective(model, config.algorithm.prox_mu)
  if name == "fedsam":
    return sam(erm(model), config.algorithm.sam_rho)
  raise ValueError(f"algorithm.name: {name!r} has no local objective to pair with a server rule")


def server_optimizer(kind: str, server_config):
  c = ml_collections.ConfigDict(server_config.to_dict())
  if kind == "momentum":
    c.optimizer = "sgd"
  elif kind == "sgd":
    c.optimizer, c.momentum = "sgd", 0.0
  else:
    c.optimizer = kind
  return make_optimizer(c, inject=True)  # eta_g in the state: readable, differentiable


def model_for(config, model):
  """The model an algorithm trains: FedSR's probabilistic version, otherwise `model`."""
  if config.algorithm.name in ("fedsr", "fedsr+omg"):
    return probabilistic_model(model, config.algorithm.sr_z_dim, config.algorithm.sr_eval_samples)
  return model


def build_algorithm(config, model, sched, num_clients: int, cohort_size: int, num_domains: int = 1,
                    train_domains=None, store=None) -> Algorithm:
  """The algorithm `config.algorithm.name` names, built from the config's fields (FedSR expects
  `model_for(config, model)`; FedDG the training `store`, for its amplitude bank)."""
  alg = _build(config, model, sched, num_clients, cohort_size, num_domains, train_domains, store)
  return alg._replace(**COMMUNICATION.get(alg.name, {}))


# What each method sends and receives besides the model and the model update.
COMMUNICATION = {
    "minibatch_sgd": {"sends": ("gradient (instead of an update)",)},
    "scaffold": {"sends": ("control-variate update",), "receives": ("server control variate",)},
    "fediir": {"sends": ("head gradient at the global model (pre-round)",), "receives": ("EMA head gradient",)},
    "fediir+omg": {"sends": ("head gradient at the global model (pre-round)",), "receives": ("EMA head gradient",)},
    "feddim": {"sends": ("per-class mean insight matrices",), "receives": ("global insight matrices",)},
    "fedga": {"sends": ("generalisation gap (a scalar)",)},
    "afl": {"sends": ("per-domain loss sums and example counts (pre-round)",), "receives": ("domain weights beta",)},
    "fedadg": {"sends": ("distribution-generator update",), "receives": ("distribution generator",)},
    "feddg": {"sends": ("amplitude spectra of its images (once)",),
              "receives": ("other clients' amplitude spectra (once)",), "leaks_data": True},
    "fedloe": {"sends": ("stage 2: its linear head", "stage 2: logits and labels of its tuning split"),
               "receives": ("stage 2: every client's head, the combined head",), "leaks_data": True},
}


def communication_table() -> str:
  """The README's table: what every method sends and receives beyond the model and its
  update, and whether it sends anything computed per example (seed 001 Table 12's
  "free of leakage" is the opposite of the last column)."""
  rows = ["| method | sends beyond the model update | receives beyond the model | per-example data leaves the client |",
          "| --- | --- | --- | --- |"]
  for name in ALGORITHMS:
    c = COMMUNICATION.get(name, {})
    fmt = lambda items: "; ".join(items) if items else "-"
    rows.append(f"| `{name}` | {fmt(c.get('sends', ()))} | {fmt(c.get('receives', ()))} | "
                f"{'yes' if c.get('leaks_data') else 'no'} |")
  return "\n".join(rows)


def _build(config, model, sched, num_clients, cohort_size, num_domains, train_domains, store) -> Algorithm:
  name = config.algorithm.name
  client_opt = make_optimizer(config.client)
  a = config.algorithm
  fedavg_rule = lambda: optax_rule(server_optimizer("sgd", config.server))
  if name in ("irm", "vrex", "coral", "mmd", "mixup"):
    lam = {"irm": a.irm_lambda, "vrex": a.vrex_lambda, "coral": a.coral_gamma, "mmd": a.mmd_gamma,
           "mixup": a.mixup_alpha}[name]
    return dg_fedavg(model, sched, client_opt, fedavg_rule(), name, lam, num_domains, a.dg_anneal_steps)
  if name == "fish":
    return fish(model, sched, client_opt, fedavg_rule(), a.fish_meta_lr, num_domains)
  if name == "groupdro":
    return groupdro(model, sched, client_opt, fedavg_rule(), a.groupdro_eta, num_domains)
  if name == "afl":
    return afl(model, sched, client_opt, fedavg_rule(), a.afl_step, num_domains, train_domains)
  if name in ("fedsr", "fedsr+omg"):
    omg = name.endswith("+omg")
    rule = omg_rule(config.server.lr, a.omg_kappa, a.omg_lr, a.omg_momentum, a.omg_steps) if omg else fedavg_rule()
    return fedsr(model, sched, client_opt, rule, a.sr_z_dim, a.sr_l2, a.sr_cmi, name=name)
  if name == "fedadg":
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    z = jax.eval_shape(model.features, params, jnp.zeros((1,) + model.input_shape))
    with_lr = lambda lr: make_optimizer(ml_collections.ConfigDict({**config.client.to_dict(), "lr": lr}))
    return fedadg(model, sched, client_opt, fedavg_rule(), z.shape[-1], model.module.classifier.num_classes,
                  noise_dim=a.adg_noise_dim, lambda0=a.adg_lambda0, gen_opt=with_lr(a.adg_gen_lr),
                  disc_opt=with_lr(a.adg_disc_lr), hidden=a.adg_hidden, e0_epochs=a.adg_e0_epochs,
                  gen_relu=config.model.name != "cnn")  # the CNN's features end in GroupNorm: any sign
  if name == "feddg":
    if store is None:
      raise ValueError("algorithm.name='feddg' needs the training client store for its amplitude bank")
    if store.x.ndim != 5:
      raise ValueError(f"algorithm.name='feddg' needs image inputs [H, W, C]; got inputs of shape {store.x.shape[2:]}")
    bank = amplitude_bank(store, a.fdg_bank_size, config.seed)
    return feddg(model, sched, client_opt, fedavg_rule(), bank, a.fdg_window)._replace(
        setup_bytes=(1 + num_clients) * bank.nbytes)  # every client uploads its part, downloads the bank
  if name in _FEDOPT:
    return fedavg(model, sched, client_opt, server_optimizer(_FEDOPT[name], config.server), name=name)
  if name == "fedprox":
    return fedprox(model, sched, client_opt, server_optimizer("sgd", config.server), config.algorithm.prox_mu)
  if name == "fedsam":
    return fedsam(model, sched, client_opt, server_optimizer("sgd", config.server), config.algorithm.sam_rho)
  if name == "feddim":
    params = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    z = jax.eval_shape(model.features, params, jnp.zeros((1,) + model.input_shape))
    return feddim(model, sched, client_opt, optax_rule(server_optimizer("sgd", config.server)),
                  config.algorithm.dim_lambda, config.algorithm.dim_momentum,
                  model.module.classifier.num_classes, z.shape[-1])
  if name == "fedgma":
    return fedgma(model, sched, client_opt, config.server.lr, config.algorithm.gma_tau)
  if name == "fedga":
    return fedga(model, sched, client_opt, num_clients, config.num_rounds, config.algorithm.ga_step)
  if name in ("fediir", "fediir+omg"):
    a = config.algorithm
    rule = (omg_rule(config.server.lr, a.omg_kappa, a.omg_lr, a.omg_momentum, a.omg_steps) if name.endswith("+omg")
            else optax_rule(server_optimizer("sgd", config.server)))
    return fediir(model, sched, client_opt, rule, a.iir_gamma, a.iir_ema, name=name,
                  weighting="examples" if name.endswith("+omg") else "uniform")
  if name == "fedomg" or name.endswith("+omg"):
    base = "fedavg" if name == "fedomg" else name[:-len("+omg")]
    a = config.algorithm
    return fedomg(model, sched, client_opt, config.server.lr, a.omg_kappa, a.omg_lr, a.omg_momentum,
                  a.omg_steps, objective_factory(base, config, model), name=name)
  if name == "scaffold":
    return scaffold(model, sched, config.client.lr, config.server.lr, cohort_size, num_clients)
  if name == "minibatch_sgd":
    return minibatch_sgd(model, config.client.batch_size, client_opt)
  raise ValueError(f"algorithm.name: unknown algorithm {name!r}; choose one of {list(ALGORITHMS)}")
