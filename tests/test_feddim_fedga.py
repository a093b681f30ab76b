"""FedDIM's regulariser and server update, and FedGA's weights, against NumPy versions."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dg.algorithms.base import LocalSchedule
from fedjax_dg.algorithms.fedavg import fedavg, optax_rule
from fedjax_dg.algorithms.feddim import (class_mean_insights, dim_regularizer, feddim, momentum_update)
from fedjax_dg.algorithms.fedga import fedga, ga_weights
from helpers import ragged_store, run_from, tiny_mlp, tree_max_diff

RNG = np.random.default_rng(0)


def test_dim_regularizer_matches_numpy():
  d, K, B = 4, 3, 7
  W, z = RNG.normal(size=(d, K)), RNG.normal(size=(B, d))
  y = np.array([0, 1, 2, 1, 0, 2, 1])
  mask = np.array([1, 1, 1, 1, 1, 0, 0], float)
  i_bar = RNG.normal(size=(K, d, K))
  init = np.array([True, True, False])
  expect = 0.0
  for i in range(B):
    if mask[i] and init[y[i]]:
      I = W * z[i][:, None]                       # I_jk = W_jk z_j
      expect += np.sum((I - i_bar[y[i]]) ** 2)
  expect /= mask.sum()
  got = dim_regularizer(jnp.asarray(W), jnp.asarray(z), jnp.asarray(y), jnp.asarray(mask), jnp.asarray(i_bar), jnp.asarray(init))
  np.testing.assert_allclose(float(got), expect, rtol=1e-5)


def test_class_means_and_momentum_update_match_numpy():
  d, K = 3, 4
  W = RNG.normal(size=(d, K))
  # Two clients; client 0 has classes {0, 1}, client 1 has {1}; nobody has classes 2, 3.
  data = [(RNG.normal(size=(5, d)), np.array([0, 1, 1, 0, 0]), np.array([1, 1, 1, 1, 0.])),
          (RNG.normal(size=(3, d)), np.array([1, 1, 1]), np.array([1, 1, 1.]))]
  weighted, has = [], []
  for z, y, m in data:
    means, h = class_mean_insights(jnp.asarray(W), jnp.asarray(z), jnp.asarray(y), jnp.asarray(m), K)
    np_means = np.zeros((K, d, K))
    for k in range(K):
      rows = [W * z[i][:, None] for i in range(len(y)) if y[i] == k and m[i]]
      if rows:
        np_means[k] = np.mean(rows, axis=0)
    np.testing.assert_allclose(np.asarray(means) * np.asarray(h)[:, None, None], np_means, rtol=1e-5, atol=1e-6)
    weighted.append(np.asarray(means) * np.asarray(h)[:, None, None])
    has.append(np.asarray(h))
  mean_w, mean_h = np.mean(weighted, 0), np.mean(has, 0)  # the engine's uniform mean
  i_bar = RNG.normal(size=(K, d, K))
  init = np.array([True, False, True, False])
  m = 0.3
  new, new_init = momentum_update(jnp.asarray(i_bar), jnp.asarray(init), jnp.asarray(mean_w), jnp.asarray(mean_h), m)
  i_g0 = weighted[0][0]                                   # class 0: only client 0
  i_g1 = (weighted[0][1] + weighted[1][1]) / 2            # class 1: both clients
  np.testing.assert_allclose(new[0], (1 - m) * i_bar[0] + m * i_g0, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new[1], i_g1, rtol=1e-5, atol=1e-6)          # first sight: initialised
  np.testing.assert_allclose(new[2], i_bar[2])                             # unseen: unchanged
  np.testing.assert_allclose(new[3], i_bar[3])
  assert list(np.asarray(new_init)) == [True, True, True, False]


def test_feddim_lambda_zero_is_uniform_fedavg_and_insights_start_at_first_round():
  st = ragged_store()
  C = len(st.counts)
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=4, epochs=1, passes=1, unroll=1)
  alg = feddim(model, sched, optax.sgd(0.1), optax_rule(optax.sgd(1.0)), 0.0, 0.5, 3, 8)
  ref = fedavg(model, sched, optax.sgd(0.1), optax.sgd(1.0))._replace(weighting="uniform")
  out = [run_from(a, params, st, C, C, 2) for a in (alg, ref)]
  assert tree_max_diff(out[0].server.params, out[1].server.params) < 1e-6
  assert bool(out[0].server.initialized.all()) and float(jnp.abs(out[0].server.i_bar).max()) > 0


def test_ga_weights_match_numpy():
  a = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
  ids = np.array([4, 0, 2, 1])
  gaps = np.array([0.5, -0.1, 0.2, 9.0])
  valid = np.array([True, True, True, False])
  step = 0.2
  g = gaps[valid]
  dev = g - g.mean()
  expect = a.copy()
  expect[ids[valid]] += step * dev / np.abs(dev).max()
  expect = np.maximum(expect, 0)
  expect /= expect.sum()
  got = ga_weights(jnp.asarray(a), jnp.asarray(ids), jnp.asarray(gaps), jnp.asarray(valid), step)
  np.testing.assert_allclose(np.asarray(got), expect, rtol=1e-6)


def test_fedga_zero_step_is_uniform_fedavg():
  st = ragged_store()
  C = len(st.counts)
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=4, epochs=1, passes=1, unroll=1)
  out = [run_from(a, params, st, C, 4, 3).server.params
         for a in (fedga(model, sched, optax.sgd(0.1), C, 10, step_size=0.0),
                   fedavg(model, sched, optax.sgd(0.1), optax.sgd(1.0))._replace(weighting="uniform"))]
  assert tree_max_diff(out[0], out[1]) < 1e-6
