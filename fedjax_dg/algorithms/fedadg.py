"""FedADG (Zhang et al. 2021, arXiv 2111.10487): federated adversarial domain generalisation.

Every client aligns the class-conditional distribution of its features `F(x)` to one
reference distribution `G(z, y~)`, produced by a distribution generator that all clients
share, so all source domains align to the same (adaptively generated) reference. A
client has four networks: the featurizer `F` and classifier `C` (the model,
`params["featurizer"]`, `params["classifier"]`), the generator `G` (noise `z ~ U[0, 1)^nz`
and label code `y~ = 0.6 onehot(y)` to a reference feature of the featurizer's size) and
a discriminator `D(y~, f) in (0, 1)` (a sigmoid). With least-squares adversarial losses
(the paper's, as in the authors' code), means over the real rows of a minibatch:

  L_err  = CE(C(F(x)), y)
  L_advd = E[(1 - D(y~, G(z, y~)))^2] + E[D(y~, F(x))^2]    D: reference = 1, features = 0
  L_advf = E[(1 - D(y~, F(x)))^2]                            F: features look like the reference
  L_advg = E[D(y~, G(z, y~))^2]                              G: the reference moves to the features

(the paper's total is `L_advd + L_advg + lambda_0 L_advf + lambda_1 L_err`,
`lambda_1 = 1 - lambda_0`). Client, every round, from the broadcast `(F, C, G)` and its
own `D`:
  E0 epochs: one client-optimizer step on `L_err` for `(F, C)` per minibatch;
  E1 epochs (the configured local schedule), per minibatch, in the authors' order:
    D <- D - step of `disc_opt` on L_advd       (F(x), G(z, y~) held fixed)
    (F, C) <- step of `client_opt` on lambda_0 L_advf + (1 - lambda_0) L_err   (new D, fixed)
    G <- G - step of `gen_opt` on L_advg        (new D, fixed)
The client sends `(Delta_model, Delta_G)`; `D` never leaves the client (persistent client
state). The server applies the optax rule (FedAvg's, `theta <- theta + eta_g mean Delta`)
to the model and the generator alike. Evaluation uses the model `C(F(x))`.

Networks (the authors' `GeneDistrNet` and `Discriminator`, widths scaled by `hidden`,
1024 in their code): G = Dense(4 hidden) -> leaky ReLU -> Dense(feature_dim) -> ReLU
(xavier-uniform kernels with gain 0.5); D = Dense(hidden, no bias) random projection of
the feature, concatenated with `y~`, -> Dense(hidden) -> leaky ReLU -> Dense(1) -> sigmoid
(He-uniform kernels). Biases start at zero. Noise size `noise_dim`: 2048 in the authors'
code, 1024 in Bai et al.'s (our default).

Sources and where they disagree (the paper's equations are followed):
  * The authors' PACS code (wzml/FedADG, `pacs-ours/localTrain.py`) implements the losses
    above. Their VLCS script (`src/localTrain.py`), Bai et al.'s benchmark
    (FedDG_Benchmark `FedADGClient.second_step`) and FedCCRL's port negate L_advd (so D
    maximises its error) and detach `G`'s output in the generator step (so G never
    trains); they also take the F/C step before the D step. We follow the paper.
  * The paper, the authors and Bai et al. keep `D` local; FedCCRL's port also averages it.
  * Weights: `lambda0` multiplies L_advf (the paper's notation, lambda_0 L_advf +
    lambda_1 L_err, lambda_1 = 1 - lambda_0); default 0.55 as FedCCRL's `--lambda_0`. The
    authors' code hard-codes an L_advf weight of 0.15 (CE weight 0.85); Bai et al.'s
    Table 7 "alpha" is the CE weight, i.e. lambda0 = 1 - alpha.
Deviations: no label smoothing in L_err (authors 0.01 to 0.2); no warm-up or plateau
learning-rate schedules and no per-epoch best-on-local-validation selection of the
returned weights (authors); the G and D optimizers restart every round (the benchmark's;
the authors keep D's momentum); every client's `D` starts from the same initialisation
(`client_init` has no key); the authors' Frobenius normalisation of D's projection is
overwritten by their own re-initialisation, so we use He-uniform there too. With a
fixed-step schedule (`local_steps > 0`) the E0 phase is `e0_epochs * local_steps` steps.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple


import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import (LocalSchedule, erm_objective, gradient_step, local_loop, make_optimizer,
                                       masked_cross_entropy)
from fedjax_dg.algorithms.spec import ClientSide, MethodSpec, Uniform, hparam, send

LABEL_VALUE = 0.6  # y~ = 0.6 onehot(y) (authors' VLCS code and Bai et al.; 0.7 in the PACS code)


class Generator(nn.Module):
  """`G(z, y~)`: a reference feature vector of size `feature_dim`."""
  feature_dim: int
  hidden: int = 4096
  relu_output: bool = True  # the authors' features (AlexNet fc7) are non-negative

  @nn.compact
  def __call__(self, z, y_code):
    init = nn.initializers.variance_scaling(0.25, "fan_avg", "uniform")  # xavier_uniform, gain 0.5
    h = nn.leaky_relu(nn.Dense(self.hidden, kernel_init=init)(jnp.concatenate([z, y_code], -1)))
    out = nn.Dense(self.feature_dim, kernel_init=init)(h)
    return nn.relu(out) if self.relu_output else out


class Discriminator(nn.Module):
  """`D(y~, f) in (0, 1)`: 1 for the reference distribution, 0 for the client's features."""
  hidden: int = 1024
  rp_size: int = 1024

  @nn.compact
  def __call__(self, y_code, f):
    init = nn.initializers.he_uniform()
    h = nn.Dense(self.rp_size, use_bias=False, kernel_init=init, name="projection")(f.reshape((f.shape[0], -1)))
    h = nn.leaky_relu(nn.Dense(self.hidden, kernel_init=init)(jnp.concatenate([h, y_code], -1)))
    return nn.sigmoid(nn.Dense(1, kernel_init=init)(h))[:, 0]


def masked_mean(v, mask):
  return jnp.sum(v * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def label_code(y, num_classes: int, value: float = LABEL_VALUE):
  return value * jax.nn.one_hot(y, num_classes)


def reference_noise(rng, n: int, noise_dim: int):
  return jax.random.uniform(rng, (n, noise_dim))


def disc_loss(disc: nn.Module, d_params, y_code, feats, refs, mask):
  """L_advd = E[(1 - D(y~, G(z, y~)))^2] + E[D(y~, F(x))^2]."""
  d = lambda f: disc.apply({"params": d_params}, y_code, f)
  return masked_mean((1.0 - d(refs)) ** 2 + d(feats) ** 2, mask)


def feature_adv_loss(disc: nn.Module, d_params, y_code, feats, mask):
  """L_advf = E[(1 - D(y~, F(x)))^2]."""
  return masked_mean((1.0 - disc.apply({"params": d_params}, y_code, feats)) ** 2, mask)


def gen_loss(disc: nn.Module, d_params, y_code, refs, mask):
  """L_advg = E[D(y~, G(z, y~))^2]."""
  return masked_mean(disc.apply({"params": d_params}, y_code, refs) ** 2, mask)


def task_loss(model, disc: nn.Module, params, d_params, batch, y_code, lambda0: float):
  """`(lambda_0 L_advf + (1 - lambda_0) L_err, (L_err, L_advf))` for the F/C step."""
  f = model.features(params, batch.x)
  ce = masked_cross_entropy(model.head(params["classifier"], f), batch.y, batch.mask)
  adv = feature_adv_loss(disc, d_params, y_code, f, batch.mask)
  return lambda0 * adv + (1.0 - lambda0) * ce, (ce, adv)


class AdgCarry(NamedTuple):
  params: Any
  opt_state: Any
  gen: Any
  gen_opt_state: Any
  disc: Any
  disc_opt_state: Any
  sums: jax.Array  # example-weighted sums of (L_advf, L_advd, L_advg) and the examples seen


def adg_step(model, gen: nn.Module, disc: nn.Module, client_opt, gen_opt, disc_opt, num_classes: int,
             noise_dim: int, lambda0: float):
  """`step_fn(AdgCarry, batch, rng) -> (AdgCarry, L_err)` for `local_loop`: D, then (F, C), then G."""
  def step_fn(c: AdgCarry, batch, rng):
    y_code = label_code(batch.y, num_classes)
    z = reference_noise(rng, batch.y.shape[0], noise_dim)
    g_apply = lambda g: gen.apply({"params": g}, z, y_code)
    feats = jax.lax.stop_gradient(model.features(c.params, batch.x))
    refs = jax.lax.stop_gradient(g_apply(c.gen))

    l_d, g_d = jax.value_and_grad(lambda d: disc_loss(disc, d, y_code, feats, refs, batch.mask))(c.disc)
    upd, disc_opt_state = disc_opt.update(g_d, c.disc_opt_state, c.disc)
    d_new = optax.apply_updates(c.disc, upd)

    (_, (ce, adv)), g_p = jax.value_and_grad(
        lambda p: task_loss(model, disc, p, d_new, batch, y_code, lambda0), has_aux=True)(c.params)
    upd, opt_state = client_opt.update(g_p, c.opt_state, c.params)
    params = optax.apply_updates(c.params, upd)

    l_g, g_g = jax.value_and_grad(lambda g: gen_loss(disc, d_new, y_code, g_apply(g), batch.mask))(c.gen)
    upd, gen_opt_state = gen_opt.update(g_g, c.gen_opt_state, c.gen)
    g_new = optax.apply_updates(c.gen, upd)

    sums = c.sums + jnp.sum(batch.mask) * jnp.stack([adv, l_d, l_g, 1.0])
    return AdgCarry(params, opt_state, g_new, gen_opt_state, d_new, disc_opt_state, sums), ce
  return step_fn


def erm_phase(sched: LocalSchedule, e0_epochs: int) -> LocalSchedule:
  """The E0 phase: `e0_epochs` passes shaped like the configured local schedule."""
  if sched.epochs > 0:
    per_epoch = sched.num_steps // sched.epochs
    return sched._replace(num_steps=e0_epochs * per_epoch, epochs=e0_epochs, passes=e0_epochs)
  return sched._replace(num_steps=e0_epochs * sched.num_steps, passes=e0_epochs * sched.passes)


def fedadg_client(model, sched: LocalSchedule, client_opt: optax.GradientTransformation, feature_dim: int,
                  num_classes: int, noise_dim: int = 1024, lambda0: float = 0.55,
                  gen_opt: optax.GradientTransformation | None = None,
                  disc_opt: optax.GradientTransformation | None = None, hidden: int = 1024, e0_epochs: int = 1,
                  gen_relu: bool = True) -> ClientSide:
  """FedADG's clients: the rule trains `{"model", "gen"}`; `D` stays on each client.
  `gen_opt` / `disc_opt` default to `client_opt`."""
  gen = Generator(feature_dim, 4 * hidden, gen_relu)
  disc = Discriminator(hidden, hidden)
  gen_opt, disc_opt = gen_opt or client_opt, disc_opt or client_opt
  step_fn = adg_step(model, gen, disc, client_opt, gen_opt, disc_opt, num_classes, noise_dim, lambda0)
  sched0 = erm_phase(sched, e0_epochs) if e0_epochs > 0 else None
  erm_step = gradient_step(erm_objective(model), client_opt)

  def nets_init(rng, params):
    rng = jax.random.PRNGKey(0) if rng is None else rng
    return {"model": params, "gen": gen.init(rng, jnp.zeros((1, noise_dim)), jnp.zeros((1, num_classes)))["params"]}

  def init(params):
    del params
    return disc.init(jax.random.PRNGKey(0), jnp.zeros((1, num_classes)), jnp.zeros((1, feature_dim)))["params"]

  def update(nets, extra, d_params, data, rng):
    params, opt_state = nets["model"], client_opt.init(nets["model"])
    metrics = {}
    if sched0 is not None:
      (params, opt_state), metrics["erm_loss"] = local_loop((params, opt_state), erm_step, data,
                                                           jax.random.fold_in(rng, 1), sched0)
    carry = AdgCarry(params, opt_state, nets["gen"], gen_opt.init(nets["gen"]), d_params,
                     disc_opt.init(d_params), jnp.zeros(4))
    carry, ce = local_loop(carry, step_fn, data, rng, sched)
    adv, l_d, l_g = carry.sums[:3] / jnp.maximum(carry.sums[3], 1.0)
    metrics.update(train_loss=ce, adv_feature_loss=adv, disc_loss=l_d, gen_loss=l_g)
    return send({"model": carry.params, "gen": carry.gen}, nets, carry.disc, metrics)

  return ClientSide(update, init=init, nets_init=nets_init, params_of=lambda nets: nets["model"])


@dataclasses.dataclass(frozen=True)
class HParams:
  lambda0: float = hparam(0.55, "weight of L_advf; 1 - lambda0 on CE (FedCCRL's; authors' code 0.15)", ge=0, le=1,
                          search=Uniform(0.0, 1.0))
  e0_epochs: int = hparam(1, "E0: ERM epochs before the adversarial epochs (Bai et al.: 1)", ge=0, integer=True)
  gen_lr: float = hparam(7e-4, "generator step (Bai et al. 2024 Table 7)", ge=0)
  disc_lr: float = hparam(7e-4, "discriminator step (Bai et al. 2024 Table 7)", ge=0)
  noise_dim: int = hparam(1024, "generator noise size (Bai et al.; authors 2048)", ge=1, integer=True)
  hidden: int = hparam(1024, "D width and projection size; G's hidden layer is 4x", ge=1, integer=True)


def _client(ctx, hp):
  with_lr = lambda lr: make_optimizer(ctx.config.client, values={**(ctx.values or {}).get("client", {}), "lr": lr})
  return fedadg_client(ctx.model, ctx.sched, ctx.client_opt, ctx.feature_dim(), ctx.num_classes,
                       noise_dim=hp.noise_dim, lambda0=hp.lambda0, gen_opt=with_lr(hp.gen_lr),
                       disc_opt=with_lr(hp.disc_lr), hidden=hp.hidden, e0_epochs=hp.e0_epochs,
                       gen_relu=ctx.config.model.name != "cnn")  # the CNN's features end in GroupNorm: any sign


SPEC = MethodSpec("fedadg", "Zhang et al. 2021 (paper's equations, authors' PACS code)", _client, HParams,
                  not_for_text="FedADG is designed for images in Bai et al. 2024 (Table 5: not applicable to CivilComments "
                               "and Py150)",
                  sends=("distribution-generator update",), receives=("distribution generator",), group="FDG")
