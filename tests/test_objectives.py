"""The DG penalties against float64 NumPy implementations of their formulas."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dg.objectives import MMD_GAMMAS, coral_penalty, irm_penalty, mmd_penalty, vrex_penalty


def np_softmax(z):
  e = np.exp(z - z.max(1, keepdims=True))
  return e / e.sum(1, keepdims=True)


def np_dce_ds(z, y):
  """d/ds mean CE(s z, y) at s = 1 = mean_i (softmax(z_i) - e_{y_i}) . z_i."""
  if len(y) == 0:
    return 0.0
  return float(np.mean(np.sum((np_softmax(z) - np.eye(z.shape[1])[y]) * z, 1)))


def np_irm(z, y):
  return np_dce_ds(z[0::2], y[0::2]) * np_dce_ds(z[1::2], y[1::2])


def np_coral(a, b):
  mean = np.mean((a.mean(0) - b.mean(0)) ** 2)
  if len(a) < 2 or len(b) < 2:
    return mean
  return mean + np.mean((np.cov(a, rowvar=False) - np.cov(b, rowvar=False)) ** 2)


def np_mmd(a, b):
  k = lambda x, y: sum(np.exp(-g * ((x[:, None] - y[None]) ** 2).sum(-1)) for g in MMD_GAMMAS)
  return k(a, a).mean() + k(b, b).mean() - 2 * k(a, b).mean()


SHAPES = [(1, 3), (2, 4), (7, 5), (16, 3)]


@pytest.mark.parametrize("n,k", SHAPES)
def test_irm_matches_numpy(n, k):
  rng = np.random.default_rng(n * 10 + k)
  z, y = rng.normal(size=(n, k)) * 2, rng.integers(0, k, n)
  with jax.enable_x64(True):
    np.testing.assert_allclose(float(irm_penalty(jnp.asarray(z), jnp.asarray(y))), np_irm(z, y), rtol=1e-10, atol=1e-14)
    # Masked rows are ignored and the even/odd split runs over the real rows only.
    zp = np.concatenate([z, rng.normal(size=(3, k))])
    yp = np.concatenate([y, rng.integers(0, k, 3)])
    mask = np.r_[np.ones(n), np.zeros(3)]
    perm = rng.permutation(n + 3)
    got = irm_penalty(jnp.asarray(zp[perm]), jnp.asarray(yp[perm]), jnp.asarray(mask[perm]))
    real = perm[mask[perm] > 0]
    np.testing.assert_allclose(float(got), np_irm(zp[real], yp[real]), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("d", [1, 2, 5])
def test_vrex_matches_numpy(d):
  r = np.random.default_rng(d).random(d + 2)
  present = np.r_[np.ones(d), np.zeros(2)]
  with jax.enable_x64(True):
    np.testing.assert_allclose(float(vrex_penalty(jnp.asarray(r), jnp.asarray(present))), np.var(r[:d]), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("na,nb,dim", [(1, 1, 3), (1, 4, 2), (5, 3, 4), (12, 9, 6)])
def test_coral_and_mmd_match_numpy(na, nb, dim):
  rng = np.random.default_rng(na * 100 + nb)
  a, b = rng.normal(size=(na, dim)), rng.normal(size=(nb, dim)) * 0.5 + 0.3
  with jax.enable_x64(True):
    np.testing.assert_allclose(float(coral_penalty(jnp.asarray(a), jnp.asarray(b))), np_coral(a, b), rtol=1e-10)
    np.testing.assert_allclose(float(mmd_penalty(jnp.asarray(a), jnp.asarray(b))), np_mmd(a, b), rtol=1e-9, atol=1e-12)
    # Padding rows change nothing.
    pad = lambda x: np.concatenate([x, 9 * np.ones((2, dim))])
    ma, mb = np.r_[np.ones(na), 0, 0], np.r_[np.ones(nb), 0, 0]
    np.testing.assert_allclose(float(coral_penalty(jnp.asarray(pad(a)), jnp.asarray(pad(b)), jnp.asarray(ma), jnp.asarray(mb))),
                               np_coral(a, b), rtol=1e-10)
    np.testing.assert_allclose(float(mmd_penalty(jnp.asarray(pad(a)), jnp.asarray(pad(b)), jnp.asarray(ma), jnp.asarray(mb))),
                               np_mmd(a, b), rtol=1e-9, atol=1e-12)


def test_two_domains_with_different_features_give_positive_penalties_and_gradients():
  """The bug in the public benchmark code: these penalties were always zero there."""
  rng = np.random.default_rng(0)
  x_a, x_b = jnp.asarray(rng.normal(size=(16, 4))), jnp.asarray(rng.normal(size=(16, 4)) * 2 + 1)
  y_a, y_b = jnp.asarray(rng.integers(0, 3, 16)), jnp.asarray(rng.integers(0, 3, 16))
  W = jnp.asarray(rng.normal(size=(4, 3)))
  feats = lambda W, x: jnp.tanh(x @ W)

  def losses(W):
    za, zb = feats(W, x_a), feats(W, x_b)
    ce = lambda z, y: jnp.mean(-jax.nn.log_softmax(z)[jnp.arange(len(y)), y])
    return jnp.stack([ce(za, y_a), ce(zb, y_b)]), za, zb

  pens = {
      "vrex": lambda W: vrex_penalty(losses(W)[0]),
      "coral": lambda W: coral_penalty(*losses(W)[1:]),
      "mmd": lambda W: mmd_penalty(*losses(W)[1:]),
      "irm": lambda W: irm_penalty(losses(W)[1], y_a) + irm_penalty(losses(W)[2], y_b),
  }
  for name, f in pens.items():
    if name != "irm":
      assert float(f(W)) > 1e-6, name
    assert float(jnp.abs(jax.grad(f)(W)).max()) > 1e-6, name
