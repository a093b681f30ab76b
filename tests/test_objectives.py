"""The DG penalties against float64 NumPy implementations of their formulas."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dg.objectives import (MMD_GAMMAS, coral_penalty, domain_slots, irm_penalties, irm_penalty,
                                  mean_pairwise_coral, mean_pairwise_mmd, mmd_penalty, vrex_penalty)


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
    np.testing.assert_allclose(float(jax.jit(irm_penalty)(jnp.asarray(z), jnp.asarray(y))), np_irm(z, y),
                               rtol=1e-10, atol=1e-14)
    # Masked rows are ignored and the even/odd split runs over the real rows only.
    zp = np.concatenate([z, rng.normal(size=(3, k))])
    yp = np.concatenate([y, rng.integers(0, k, 3)])
    mask = np.r_[np.ones(n), np.zeros(3)]
    perm = rng.permutation(n + 3)
    got = jax.jit(irm_penalty)(jnp.asarray(zp[perm]), jnp.asarray(yp[perm]), jnp.asarray(mask[perm]))
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
  coral, mmd = jax.jit(coral_penalty), jax.jit(mmd_penalty)  # one program per call, not one per primitive
  with jax.enable_x64(True):
    np.testing.assert_allclose(float(coral(jnp.asarray(a), jnp.asarray(b))), np_coral(a, b), rtol=1e-10)
    np.testing.assert_allclose(float(mmd(jnp.asarray(a), jnp.asarray(b))), np_mmd(a, b), rtol=1e-9, atol=1e-12)
    # Padding rows change nothing.
    pad = lambda x: np.concatenate([x, 9 * np.ones((2, dim))])
    ma, mb = np.r_[np.ones(na), 0, 0], np.r_[np.ones(nb), 0, 0]
    np.testing.assert_allclose(float(coral(jnp.asarray(pad(a)), jnp.asarray(pad(b)), jnp.asarray(ma), jnp.asarray(mb))),
                               np_coral(a, b), rtol=1e-10)
    np.testing.assert_allclose(float(mmd(jnp.asarray(pad(a)), jnp.asarray(pad(b)), jnp.asarray(ma), jnp.asarray(mb))),
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
    value, grad = jax.jit(jax.value_and_grad(f))(W)
    if name != "irm":
      assert float(value) > 1e-6, name
    assert float(jnp.abs(grad).max()) > 1e-6, name


# ----------------------------------------------------------------- over a batch's domains (slots)

def np_domain_rows(d, m, num_domains):
  """`{e: real rows of domain e}` for the domains with one, by a loop over all domains."""
  rows = {}
  for k in range(len(d)):
    if m[k]:
      rows.setdefault(int(d[k]), []).append(k)
  return {e: np.asarray(rows[e]) for e in range(num_domains) if e in rows}


def np_slot_penalties(z, logits, y, rows):
  """Float64 loops over the domains (the reference for the slot-based forms): the mean IRM
  penalty over the present domains, and the mean CORAL and MMD over the pairs of present
  domains (`rows` from `np_domain_rows`)."""
  present = sorted(rows)
  irm = np.mean([np_irm(logits[rows[e]], y[rows[e]]) for e in present])
  pairs = list(itertools.combinations(present, 2))
  coral = np.mean([np_coral(z[rows[a]], z[rows[b]]) for a, b in pairs]) if pairs else 0.0
  mmd = np.mean([np_mmd(z[rows[a]], z[rows[b]]) for a, b in pairs]) if pairs else 0.0
  return np.array([irm, coral, mmd])


@pytest.mark.parametrize("num_domains,domains", [(4, (0, 1, 3)), (5000, (4999, 17, 2500, 3)), (5000, (42,))])
def test_slot_penalties_match_a_numpy_loop_over_domains(num_domains, domains):
  """`irm_penalties` (mean over present slots), `mean_pairwise_coral` and `mean_pairwise_mmd`
  over `domain_slots` equal the loop over every domain / pair of domains, with padding rows
  (whose ids are real domains) and one single-row domain (no CORAL covariance term); and
  their gradients equal central finite differences of the NumPy reference (IRM's is now
  taken through `softmax(z) . z - z_y` instead of an inner `jax.grad`). CORAL both ways:
  from the slots' covariances and from the rows' Gram matrix."""
  rng = np.random.default_rng(num_domains + len(domains))
  n, k, dim = 15, 3, 4
  d = np.r_[np.asarray(domains)[rng.integers(0, len(domains), n - 3)], domains[0], domains[-1], domains[0]]
  if len(domains) > 1:
    d[0] = 2 if num_domains == 4 else 4321  # a single-row domain
  m = np.r_[np.ones(n - 2), 0, 0] > 0
  z, logits = rng.normal(size=(n, dim)), rng.normal(size=(n, k)) * 2
  y = rng.integers(0, k, n)
  with jax.enable_x64(True):
    slot, ids = domain_slots(jnp.asarray(d), jnp.asarray(m, jnp.float64), num_domains)
    size, mask = ids.shape[0], jnp.asarray(m, jnp.float64)
    present = np.isin(np.arange(size), np.asarray(slot)[m])

    def irm(lg):
      return jnp.sum(irm_penalties(lg, jnp.asarray(y), slot, mask, size) * present) / present.sum()
    f = [(0, irm), (1, lambda zz: mean_pairwise_coral(zz, slot, mask, size, covariance="moments")),
         (1, lambda zz: mean_pairwise_coral(zz, slot, mask, size, covariance="gram")),
         (2, lambda zz: mean_pairwise_mmd(zz, slot, mask, size))]
    rows = np_domain_rows(d, m, num_domains)
    want = np_slot_penalties(z, logits, y, rows)
    for i, fn in f:
      arg = logits if i == 0 else z
      value, grad = jax.jit(jax.value_and_grad(fn))(jnp.asarray(arg))
      np.testing.assert_allclose(float(value), want[i], rtol=1e-9, atol=1e-13, err_msg=str(i))
      fd = np.zeros_like(arg)
      for idx in np.ndindex(*arg.shape):
        e = np.zeros_like(arg)
        e[idx] = 1e-6
        ref = lambda a: np_slot_penalties(a if i else z, a if i == 0 else logits, y, rows)[i]
        fd[idx] = (ref(arg + e) - ref(arg - e)) / 2e-6
      np.testing.assert_allclose(np.asarray(grad), fd, rtol=1e-5, atol=1e-8, err_msg=str(i))
  if len(domains) > 1:
    assert np.all(np.abs(want) > 1e-6)  # none trivially zero
