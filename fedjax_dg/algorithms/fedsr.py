"""FedSR (Nguyen et al. 2022): a probabilistic representation with L2 and CMI regularisers.

The featurizer ends in a linear layer to `2 z_dim` numbers, the mean `mu(x)` and raw scale
`s(x)` of `z ~ N(mu, diag(sigma^2))`, `sigma = softplus(s)`; the head reads `z`. Training
uses one reparameterised sample `z = mu + sigma * eps` and the loss (docs/ALGORITHMS.md)

  CE(h(z), y) + a_L2 mean_i ||z_i||^2 + a_CMI mean_i KL(N(mu_i, sigma_i^2) || N(r_mu[y_i], r_sigma[y_i]^2))

with a per-class reference `r = (r_mu, r_s)`, `r_sigma = softplus(r_s)`, trained with the
model by the client optimizer and kept by the client (client state, never aggregated;
initialised as the authors' code: `r_mu = 0`, `r_s = 1`). The model update goes to the
server rule (FedAvg's, or FedOMG's for FedSR+OMG). Evaluation uses the mean `mu`, or, with
`eval_samples > 0`, the log of the softmax averaged over that many samples (fixed noise,
so evaluation stays a deterministic function of the parameters).

Where the loss departs from the authors' code (github.com/atuannguyen/FedSR,
`src/methods/FedSR.py`, `Model.train_client`), both as the paper writes the regularisers
(Nguyen, Torr and Lim, "FedSR: A Simple and Effective Domain Generalization Method for
Federated Learning", NeurIPS 2022):

- L2R: the code penalises the norm `mean_i ||z_i||` (`z.norm(dim=1).mean()`); here it is
  its square, `mean_i ||z_i||^2`, the paper's `E ||z||_2^2`. The two weigh large
  representations differently (the square's gradient grows with `||z||`), so `a_L2`
  values do not carry over between them.
- CMI: the code scales the representation's distribution by a learnable scalar `C`
  (initialised at 1, trained with the reference by the client optimizer) before the KL
  term, `KL(N(C mu, (C sigma)^2) || N(r_mu, r_sigma^2))`; here there is no `C` (it is 1),
  as in the paper's KL between `p(z|x)` and the reference `r(z|y)`.

The rest follows the code: `sigma` and `r_sigma` through softplus, `r_mu = 0`, `r_s = 1`
at the start, the reference kept by each client and never aggregated.
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fedjax_dg.algorithms.base import PENALTY_ACTIVITY, LocalSchedule, recorded_train
from fedjax_dg.algorithms.spec import ClientSide, LogUniform, MethodSpec, hparam, send
from fedjax_dg.models import Model, SplitModel


class ProbabilisticFeaturizer(nn.Module):
  """`x -> [mu(x), s(x)]` of size `2 z_dim`: a base featurizer, then a linear layer."""
  base: nn.Module
  z_dim: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(2 * self.z_dim, name="to_z")(self.base(x))


class ProbabilisticSplitModel(SplitModel):
  """`__call__` gives the evaluation logits: `h(mu)`, or the sample-averaged predictive."""
  eval_samples: int = 0

  def __call__(self, x):
    mu, s = jnp.split(self.featurizer(x), 2, axis=-1)
    if self.eval_samples == 0:
      return self.classifier(mu)
    eps = jax.random.normal(jax.random.PRNGKey(0), (self.eval_samples,) + mu.shape, mu.dtype)
    z = (mu + jax.nn.softplus(s) * eps).reshape((-1, mu.shape[-1]))
    logp = jax.nn.log_softmax(self.classifier(z)).reshape((self.eval_samples, mu.shape[0], -1))
    return jax.scipy.special.logsumexp(logp, axis=0) - jnp.log(self.eval_samples)


def probabilistic_model(model: Model, z_dim: int, eval_samples: int = 0) -> Model:
  """FedSR's version of `model`: same base featurizer and head, `z` of size `z_dim`."""
  m = model.module
  return dataclasses.replace(model, module=ProbabilisticSplitModel(
      featurizer=ProbabilisticFeaturizer(m.featurizer, z_dim), classifier=m.classifier, eval_samples=eval_samples))


def gaussian_kl(mu, sigma, r_mu, r_sigma):
  """`KL(N(mu, sigma^2) || N(r_mu, r_sigma^2))` summed over the last axis."""
  return jnp.sum(jnp.log(r_sigma / sigma) + (sigma ** 2 + (mu - r_mu) ** 2) / (2 * r_sigma ** 2) - 0.5, -1)


def fedsr_loss(model: Model, params, ref, batch, rng, a_l2: float, a_cmi: float):
  """`(loss, aux)` of one minibatch; `ref = {"mu": [K, z], "s": [K, z]}`."""
  mu, s = jnp.split(model.features(params, batch.x), 2, axis=-1)
  sigma = jax.nn.softplus(s)
  z = mu + sigma * jax.random.normal(rng, mu.shape, mu.dtype)
  ce = optax.softmax_cross_entropy_with_integer_labels(model.head(params["classifier"], z), batch.y)
  l2 = jnp.sum(z ** 2, -1)
  cmi = gaussian_kl(mu, sigma, ref["mu"][batch.y], jax.nn.softplus(ref["s"][batch.y]))
  mean = lambda v: jnp.sum(v * batch.mask) / jnp.maximum(jnp.sum(batch.mask), 1.0)
  term = a_l2 * mean(l2) + a_cmi * mean(cmi)
  return mean(ce) + term, {"l2": mean(l2), "cmi": mean(cmi), "penalty_term": term}


def fedsr_client(model: Model, sched: LocalSchedule, client_opt: optax.GradientTransformation, z_dim: int,
                 a_l2: float = 0.01, a_cmi: float = 0.001) -> ClientSide:
  """FedSR clients (on `probabilistic_model(...)`): the reference `r` is client state."""
  num_classes = model.module.classifier.num_classes

  def objective(pr, batch, rng):
    return fedsr_loss(model, pr["params"], pr["ref"], batch, rng, a_l2, a_cmi)

  def update(global_params, extra, ref, data, rng):
    start = {"params": global_params, "ref": ref}
    pr, _, loss, activity = recorded_train(start, client_opt.init(start), objective, client_opt, data, rng, sched)
    return send(pr["params"], global_params, pr["ref"], {"train_loss": loss, **activity})

  def init(params):
    return {"mu": jnp.zeros((num_classes, z_dim)), "s": jnp.ones((num_classes, z_dim))}
  return ClientSide(update, init=init)


@dataclasses.dataclass(frozen=True)
class HParams:
  z_dim: int = hparam(64, "representation size (ours)", ge=1, integer=True)
  l2: float = hparam(0.01, "a_L2 (Bai et al. 2024 App. D)", ge=0, search=LogUniform(1e-3, 1e-1))
  cmi: float = hparam(0.001, "a_CMI (Bai et al. 2024 App. D)", ge=0, search=LogUniform(1e-4, 1e-2))
  eval_samples: int = hparam(0, "evaluation: 0 = the mean of z, else samples averaged", ge=0, integer=True)


def _pretrained(params, load):
  """A pretrained backbone is the base of the probabilistic featurizer."""
  feat = params["featurizer"]
  base = load({"featurizer": feat["base"]})["featurizer"]
  return {**params, "featurizer": {**feat, "base": base}}


SPEC = MethodSpec(
    "fedsr", "Nguyen et al. 2022",
    lambda ctx, hp: fedsr_client(ctx.model, ctx.sched, ctx.client_opt, hp.z_dim, hp.l2, hp.cmi), HParams,
    model=lambda model, hp: probabilistic_model(model, hp.z_dim, hp.eval_samples), group="FDG", activity=PENALTY_ACTIVITY,
    not_for_models=(("gpt2", "FedSR's probabilistic featurizer wraps a featurizer of the inputs alone, and GPT-2's "
                             "reads its input embedding from the tied head; its per-class reference would hold one "
                             "row per token"),),
    pretrained=_pretrained)
