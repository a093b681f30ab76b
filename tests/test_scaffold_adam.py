"""SCAFFOLD against a float64 NumPy loop. Plain SGD: option II's control
`c_i+ = c_i - c + (theta - theta_c) / (K eta_l)`, which equals the round's mean raw minibatch
gradient. Adam (Bai et al.'s benchmark): Adam reads the corrected gradient `g - c_i + c` and
the control is the round's mean raw minibatch gradient, so `c - c_i` stays in gradient units
(option II's quotient would be in Adam-step units)."""
import jax
import numpy as np
import optax
import pytest

from fedjax_dg.algorithms.base import LocalSchedule
from fedjax_dg.algorithms.fedavg import optax_rule
from fedjax_dg.algorithms.scaffold import scaffold_client
from fedjax_dg.algorithms.spec import compose
from helpers import adam_config, method, ragged_store, run_from, sgd_config, tiny_mlp

LR, STEPS, B1, B2, EPS, SERVER_LR = 0.05, 3, 0.9, 0.999, 1e-8, 0.8


def _grad(W, b, x, y, K):
  """Mean softmax cross-entropy gradient of `x W + b`, written out."""
  z = x @ W + b
  p = np.exp(z - z.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  e = (p - np.eye(K)[y]) / len(y)
  return x.T @ e, e.sum(0)


def _client(st, k):
  n = int(st.counts[k])
  return st.x[k, :n].astype(np.float64), st.y[k, :n]


def _reference(st, W, b, rounds, K, opt, rule):
  """`rounds` SCAFFOLD rounds, full-batch local steps; `opt` "sgd" or "adam"; `rule`
  "option2" or "gradient". Returns the model, `c` and every `c_i`."""
  C = len(st.counts)
  ci = [(np.zeros_like(W), np.zeros_like(b)) for _ in range(C)]
  c = (np.zeros_like(W), np.zeros_like(b))
  for _ in range(rounds):
    deltas, dcs = [], []
    for k in range(C):
      x, y = _client(st, k)
      p = [W.copy(), b.copy()]
      m = [np.zeros_like(W), np.zeros_like(b)]
      v = [np.zeros_like(W), np.zeros_like(b)]
      g_sum = [np.zeros_like(W), np.zeros_like(b)]
      for t in range(1, STEPS + 1):
        g = _grad(p[0], p[1], x, y, K)
        for j in range(2):
          g_sum[j] += g[j]
          gj = g[j] - ci[k][j] + c[j]
          if opt == "sgd":
            p[j] = p[j] - LR * gj
          else:
            m[j] = B1 * m[j] + (1 - B1) * gj
            v[j] = B2 * v[j] + (1 - B2) * gj ** 2
            p[j] = p[j] - LR * (m[j] / (1 - B1 ** t)) / (np.sqrt(v[j] / (1 - B2 ** t)) + EPS)
      if rule == "option2":
        new_ci = tuple(ci[k][j] - c[j] + ((W, b)[j] - p[j]) / (STEPS * LR) for j in range(2))
      else:
        new_ci = tuple(g_sum[j] / STEPS for j in range(2))
      deltas.append((p[0] - W, p[1] - b))
      dcs.append(tuple(new_ci[j] - ci[k][j] for j in range(2)))
      ci[k] = new_ci
    W = W + SERVER_LR * np.mean([d[0] for d in deltas], 0)
    b = b + SERVER_LR * np.mean([d[1] for d in deltas], 0)
    c = tuple(c[j] + np.mean([d[j] for d in dcs], 0) for j in range(2))  # |S| / C = 1
  return W, b, c, ci


def _setup():
  st = ragged_store()
  model = tiny_mlp(hidden=())
  params = model.init(jax.random.PRNGKey(0))
  n_max = st.x.shape[1]
  sched = LocalSchedule(num_steps=STEPS, batch_size=n_max, epochs=STEPS, passes=STEPS, unroll=1)  # full batches
  dense = params["classifier"]["Dense_0"]
  return st, model, params, sched, np.asarray(dense["kernel"], np.float64), np.asarray(dense["bias"], np.float64)


def _configured(model, sched, C, optimizer):
  """SCAFFOLD as `algorithm.name = "scaffold"` builds it for `client.optimizer`."""
  client = adam_config(LR, B1, B2, EPS) if optimizer == "adam" else sgd_config(LR)
  return method({"algorithm.name": "scaffold", **client, "server.lr": SERVER_LR}, model, sched, C)


def _controls(state):
  d = state.server.control["classifier"]["Dense_0"]
  return np.asarray(d["kernel"], np.float64), np.asarray(state.clients["classifier"]["Dense_0"]["kernel"], np.float64)


def test_scaffold_with_adam_matches_a_numpy_loop_with_the_mean_gradient_control():
  st, model, params, sched, W, b = _setup()
  C, K = len(st.counts), 3
  state = run_from(_configured(model, sched, C, "adam"), params, st, C, C, 2)
  W, b, c, ci = _reference(st, W, b, 2, K, "adam", "gradient")
  got = state.server.params["classifier"]["Dense_0"]
  np.testing.assert_allclose(np.asarray(got["kernel"]), W, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got["bias"]), b, rtol=1e-4, atol=1e-5)
  c_got, ci_got = _controls(state)
  np.testing.assert_allclose(c_got, c[0], rtol=1e-4, atol=1e-5)      # float32 gradients of size ~0.3
  np.testing.assert_allclose(ci_got, np.stack([x[0] for x in ci]), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("control", ["option2", "gradient"])
def test_under_plain_sgd_option_ii_is_the_mean_gradient(control):
  """Option II's quotient and the mean raw gradient are the same control under SGD: both
  implementations match one float64 loop, whose two rules agree to rounding."""
  st, model, params, sched, W0, b0 = _setup()
  C, K = len(st.counts), 3
  ref2 = _reference(st, W0, b0, 2, K, "sgd", "option2")
  refg = _reference(st, W0, b0, 2, K, "sgd", "gradient")
  np.testing.assert_allclose(ref2[2][0], refg[2][0], rtol=1e-9, atol=1e-12)
  np.testing.assert_allclose(ref2[0], refg[0], rtol=1e-9, atol=1e-12)
  if control == "option2":   # what the config builds under SGD
    alg = _configured(model, sched, C, "sgd")
  else:                      # the mean-gradient control (the config's under Adam), here under SGD
    alg = compose("scaffold", scaffold_client(model, sched, LR, C, C, optax.sgd(LR), control),
                  optax_rule(optax.sgd(SERVER_LR)))
  state = run_from(alg, params, st, C, C, 2)
  got = state.server.params["classifier"]["Dense_0"]
  np.testing.assert_allclose(np.asarray(got["kernel"]), ref2[0], rtol=1e-4, atol=1e-5)
  c_got, ci_got = _controls(state)
  np.testing.assert_allclose(c_got, ref2[2][0], rtol=1e-3, atol=1e-6)
  np.testing.assert_allclose(ci_got, np.stack([x[0] for x in ref2[3]]), rtol=1e-3, atol=1e-6)


def _scale(st, W, b, c, ci, K):
  """`mean_i ||c - c_i|| / mean_i ||grad R_i(theta)||` (kernel and bias) at the model `theta`
  the next round's local steps start from."""
  num = np.mean([np.sqrt(sum(np.sum((c[j] - x[j]) ** 2) for j in range(2))) for x in ci])
  den = np.mean([np.sqrt(sum(np.sum(g ** 2) for g in _grad(W, b, *_client(st, k), K))) for k in range(len(ci))])
  return num / den


def test_control_correction_stays_at_the_gradients_scale_under_adam():
  """After one round the correction `c - c_i` Adam adds to the raw gradient is of the
  gradient's size, as under SGD; option II's quotient under Adam would make it several
  times larger (Adam-step units), and the local steps would follow the correction."""
  st, model, params, sched, W0, b0 = _setup()
  C, K = len(st.counts), 3
  state = run_from(_configured(model, sched, C, "adam"), params, st, C, C, 1)
  got = state.server.params["classifier"]["Dense_0"]
  W, b = np.asarray(got["kernel"], np.float64), np.asarray(got["bias"], np.float64)
  c_k = np.asarray(state.server.control["classifier"]["Dense_0"]["bias"], np.float64)
  c = (_controls(state)[0], c_k)
  ci = list(zip(_controls(state)[1], np.asarray(state.clients["classifier"]["Dense_0"]["bias"], np.float64)))
  adam_new = _scale(st, W, b, c, ci, K)
  sgd = _scale(st, *_reference(st, W0, b0, 1, K, "sgd", "option2"), K)
  old = _scale(st, *_reference(st, W0, b0, 1, K, "adam", "option2"), K)
  print(f"||c - c_i|| / ||grad R||: adam, mean gradient {adam_new:.2f}; sgd {sgd:.2f}; adam, option II {old:.2f}")
  assert adam_new < 2.0 * sgd   # measured 0.80 against SGD's 0.74
  assert old > 2.0 * sgd        # measured 2.34: the scale the mean-gradient control avoids
