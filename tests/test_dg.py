"""Client DG objectives: composition of the public penalties over the domains present."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dg.algorithms.base import Batch
from fedjax_dg.algorithms.dg import dg_objective
from fedjax_dg.objectives import coral_penalty, irm_penalty, mmd_penalty, vrex_penalty
from helpers import tiny_mlp

D = 3  # domains in the dataset


def _batch(domains, seed=0):
  rng = np.random.default_rng(seed)
  n = len(domains)
  x = rng.normal(size=(n, 6)) + np.asarray(domains)[:, None]
  return Batch(jnp.asarray(x, jnp.float32), jnp.asarray(rng.integers(0, 3, n)), jnp.asarray(domains),
               jnp.asarray(np.r_[np.ones(n - 2), 0, 0], jnp.float32))


def _parts(model, params, batch):
  z = model.features(params, batch.x)
  logits = model.head(params["classifier"], z)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch.y)
  doms = sorted(set(np.asarray(batch.domain)[np.asarray(batch.mask) > 0].tolist()))
  masks = {e: batch.mask * (batch.domain == e) for e in doms}
  risks = {e: float(jnp.sum(ce * m) / jnp.sum(m)) for e, m in masks.items()}
  return z, logits, doms, masks, risks


@pytest.mark.parametrize("kind", ["irm", "vrex", "coral", "mmd"])
def test_objective_is_mean_risk_plus_weighted_penalty(kind):
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  batch = _batch([0, 2, 0, 2, 2, 0, 0, 2, 1, 1])  # domains 0 and 2 present; the last two rows are padding
  z, logits, doms, masks, risks = _parts(model, params, batch)
  assert doms == [0, 2]
  erm = np.mean([risks[e] for e in doms])
  if kind == "irm":
    pen = np.mean([float(irm_penalty(logits, batch.y, masks[e])) for e in doms])
  elif kind == "vrex":
    pen = float(vrex_penalty(jnp.asarray([risks[e] for e in doms])))
  else:
    fn = coral_penalty if kind == "coral" else mmd_penalty
    pen = float(fn(z, z, masks[0], masks[2]))
  lam = 7.0
  make = dg_objective(model, kind, lam, D, anneal_steps=10, steps_per_round=4)
  early = float(make(1)(params, batch._replace(step=3), None)[0])      # update step 7 < 10
  late = float(make(2)(params, batch._replace(step=3), None)[0])       # update step 11
  weight_early = 1.0 if kind in ("irm", "vrex") else lam             # only IRM and VREx anneal
  np.testing.assert_allclose(early, erm + weight_early * pen, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(late, erm + lam * pen, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["irm", "vrex", "coral", "mmd"])
def test_single_domain_client_is_erm(kind):
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(1))
  batch = _batch([1] * 8)
  _, logits, _, _, risks = _parts(model, params, batch)
  got = float(dg_objective(model, kind, 5.0, D)(3)(params, batch, None)[0])
  np.testing.assert_allclose(got, risks[1], rtol=1e-6)
