"""SCAFFOLD with Adam locally (seed 001's benchmark; issue 10 item 8) against a float64 NumPy
loop: Adam reads the corrected gradient `g - c_i + c`; the controls follow option II's
formula `c_i+ = c_i - c + (theta - theta_c) / (K eta_l)`."""
import jax
import ml_collections
import numpy as np
import optax

from fedjax_dg.algorithms.base import LocalSchedule
from fedjax_dg.algorithms.scaffold import SPEC, scaffold
from helpers import ragged_store, run_from, tiny_mlp

LR, STEPS, B1, B2, EPS = 0.05, 3, 0.9, 0.999, 1e-8


def _grad(W, b, x, y, K):
  """Mean softmax cross-entropy gradient of `x W + b`, written out."""
  z = x @ W + b
  p = np.exp(z - z.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  e = (p - np.eye(K)[y]) / len(y)
  return x.T @ e, e.sum(0)


def _reference(st, W, b, rounds, server_lr, K):
  C = len(st.counts)
  ci = [(np.zeros_like(W), np.zeros_like(b)) for _ in range(C)]
  c = (np.zeros_like(W), np.zeros_like(b))
  for _ in range(rounds):
    deltas, dcs = [], []
    for k in range(C):
      n = int(st.counts[k])
      x, y = st.x[k, :n].astype(np.float64), st.y[k, :n]
      p = [W.copy(), b.copy()]
      m = [np.zeros_like(W), np.zeros_like(b)]
      v = [np.zeros_like(W), np.zeros_like(b)]
      for t in range(1, STEPS + 1):
        g = _grad(p[0], p[1], x, y, K)
        for j in range(2):
          gj = g[j] - ci[k][j] + c[j]
          m[j] = B1 * m[j] + (1 - B1) * gj
          v[j] = B2 * v[j] + (1 - B2) * gj ** 2
          p[j] = p[j] - LR * (m[j] / (1 - B1 ** t)) / (np.sqrt(v[j] / (1 - B2 ** t)) + EPS)
      new_ci = tuple(ci[k][j] - c[j] + ((W, b)[j] - p[j]) / (STEPS * LR) for j in range(2))
      deltas.append((p[0] - W, p[1] - b))
      dcs.append(tuple(new_ci[j] - ci[k][j] for j in range(2)))
      ci[k] = new_ci
    W = W + server_lr * np.mean([d[0] for d in deltas], 0)
    b = b + server_lr * np.mean([d[1] for d in deltas], 0)
    c = tuple(c[j] + np.mean([d[j] for d in dcs], 0) for j in range(2))  # |S| / C = 1
  return W, b, c


def test_scaffold_with_adam_matches_a_numpy_loop():
  st = ragged_store()
  C, K = len(st.counts), 3
  model = tiny_mlp(hidden=())
  params = model.init(jax.random.PRNGKey(0))
  n_max = st.x.shape[1]
  sched = LocalSchedule(num_steps=STEPS, batch_size=n_max, epochs=STEPS, passes=STEPS, unroll=1)
  alg = scaffold(model, sched, LR, 0.8, C, C, client_opt=optax.adam(LR, B1, B2, EPS))
  state = run_from(alg, params, st, C, C, 2)
  dense = params["classifier"]["Dense_0"]
  W, b, c = _reference(st, np.asarray(dense["kernel"], np.float64), np.asarray(dense["bias"], np.float64), 2, 0.8, K)
  got = state.server.params["classifier"]["Dense_0"]
  np.testing.assert_allclose(np.asarray(got["kernel"]), W, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got["bias"]), b, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(state.server.control["classifier"]["Dense_0"]["kernel"]), c[0],
                             rtol=1e-3, atol=1e-5)


def test_scaffold_accepts_adam_and_refuses_momentum_or_yogi():
  cfg = lambda opt, mom=0.0: ml_collections.ConfigDict({"client": {"optimizer": opt, "momentum": mom}})
  assert SPEC.check(cfg("sgd"), None) is None
  assert SPEC.check(cfg("adam"), None) is None        # seed 001's local optimizer
  assert "momentum" in SPEC.check(cfg("sgd", 0.9), None)
  assert "client.optimizer" in SPEC.check(cfg("yogi"), None)
