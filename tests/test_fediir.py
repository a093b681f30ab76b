"""FedIIR: second-order penalty gradient, the pre-round statistic and its EMA."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from fedjax_dg.algorithms.base import Batch, LocalSchedule
from fedjax_dg.algorithms.base import in_chunks
from fedjax_dg.algorithms.fediir import iir_objective, iir_penalty
from fedjax_dg.engine import init_round_state, make_round
from fedjax_dg.models import build_model
from helpers import client_arrays, method, ragged_store, run_from, sgd_config, tiny_mlp, tree_max_diff


def _f64(tree):
  return jax.tree.map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def test_penalty_gradient_matches_central_differences_float64():
  with jax.enable_x64(True):
    model = build_model(ml_collections.ConfigDict({"name": "mlp", "hidden": (5,), "head_hidden": (4,)}), (6,), 3)
    params = _f64(model.init(jax.random.PRNGKey(0)))
    # A generic point: Flax's zero biases put examples with all-zero features exactly on a
    # ReLU kink of the head, where grad_psi (so the penalty) is discontinuous.
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    params = unravel(flat + 0.1 * jax.random.normal(jax.random.PRNGKey(5), flat.shape, jnp.float64))
    st = ragged_store()
    x, y = client_arrays(st, 2)
    batch = Batch(x.astype(jnp.float64), y, jnp.zeros_like(y), jnp.ones(len(y), jnp.float64))
    g_tilde = jax.tree.map(lambda a: 0.1 * jnp.ones_like(a), params["classifier"])
    pen = lambda p: iir_penalty(model, p, batch, g_tilde)[0]
    grad = jax.jit(jax.grad(pen))(params)  # one program (op by op, each operation compiles alone)
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    g_flat = jax.flatten_util.ravel_pytree(grad)[0]
    eps = 1e-6
    pen_at = jax.jit(lambda v: pen(unravel(v)))  # one program for the 2 x P evaluations
    steps = eps * np.eye(flat.size)
    fd = np.array([(pen_at(flat + steps[i]) - pen_at(flat - steps[i])) / (2 * eps) for i in range(flat.size)])
    np.testing.assert_allclose(np.asarray(g_flat), fd, rtol=1e-4, atol=1e-8)
    # The featurizer really receives the second-order term.
    assert float(jnp.abs(jax.flatten_util.ravel_pytree(grad["featurizer"])[0]).max()) > 1e-6
    # And the objective adds gamma times it to the mean cross-entropy.
    gamma = 0.37
    obj = iir_objective(model, gamma, g_tilde)
    v = obj(params, batch, None)[0]
    ce = optax.softmax_cross_entropy_with_integer_labels(model.apply(params, batch.x), batch.y).mean()
    np.testing.assert_allclose(float(v), float(ce + gamma * pen(params)), rtol=1e-12)


def fediir_config(gamma, ema=0.9):
  return {"algorithm.name": "fediir", "algorithm.fediir.gamma": gamma, "algorithm.fediir.ema": ema,
          **sgd_config(0.1), "server.lr": 1.0}


def _setup(gamma):
  st = ragged_store()
  C = len(st.counts)
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=4, epochs=1, passes=1, unroll=1)
  return st, C, model, params, sched, method(fediir_config(gamma), model, sched, C)


def test_full_passes_in_chunks_equal_one_pass():
  """The pre-round statistics' full passes (`in_chunks`): chunks of 5 over 12 rows (the last
  one padded by repeating the last row) give the one-pass rows, to float32 rounding (the
  chunked products may sum in another order)."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=(12, 6)), jnp.float32)
  fn = lambda xb: jnp.tanh(xb @ jnp.arange(18.0).reshape(6, 3) / 10)
  np.testing.assert_allclose(np.asarray(in_chunks(fn, x, 5)), np.asarray(fn(x)), rtol=1e-5, atol=1e-7)  # float32


def test_pre_round_statistic_and_ema():
  st, C, model, params, sched, alg = _setup(0.05)
  store = jax.tree.map(jnp.asarray, st)
  # g~_1 = 0.9 * 0 + 0.1 * mean_c grad_psi R_c(theta_0), each on the client's full data (the
  # same for every strategy; one compiled program per client size, not op by op).
  head_grad = jax.jit(jax.grad(lambda psi, x, y: optax.softmax_cross_entropy_with_integer_labels(
      model.apply({**params, "classifier": psi}, x), y).mean()))
  grads = [head_grad(params["classifier"], *client_arrays(st, c)) for c in range(C)]
  expect = jax.tree.map(lambda *g: 0.1 * sum(g) / C, *grads)
  for strategy in ("vmap", "chunked", "host_loop"):
    state = init_round_state(alg, None, params, C)
    rf = make_round(alg, C, C, strategy, chunk_size=4)
    state, _ = rf(state, store, jax.random.PRNGKey(0))
    assert tree_max_diff(state.server.g_tilde, expect) < 1e-6, strategy


def test_gamma_zero_is_uniform_fedavg():
  st, C, model, params, sched, alg = _setup(0.0)
  ref = method({**fediir_config(0.0), "algorithm.name": "fedavg"}, model, sched, C)._replace(weighting="uniform")
  out = [run_from(a, params, st, C, 4, 3).server.params for a in (alg, ref)]
  assert tree_max_diff(out[0], out[1]) < 1e-6


def _np_head_grad(W, b, x, y, K):
  """float64 NumPy: grad of the mean cross-entropy of `x W + b` in `(W, b)`, flattened."""
  z = x @ W + b
  p = np.exp(z - z.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  e = (p - np.eye(K)[y]) / len(y)
  return np.concatenate([(x.T @ e).ravel(), e.sum(0)])


def test_alg1_full_pass_head_gradient_against_the_authors_pooled_minibatches():
  """The pre-round statistic is Alg. 1's `(1/|S|) sum_c grad_psi R_c(theta)` (full pass per
  client, clients weighted equally). The authors' `domainbed/algorithms.py: FedIIR.mean_grad`
  pools minibatch gradients instead, `(1/#batches) sum_c sum_b grad_psi R_c(theta; b)`:
  clients weighted by their batch counts, a last partial batch's rows weighted up. This
  prints the relative difference of the two on this small case (batch 4, six clients of 3
  to 12 rows; the figure quoted in fediir.py)."""
  st = ragged_store()
  C, K, B = len(st.counts), 3, 4
  model = tiny_mlp(hidden=())
  params = model.init(jax.random.PRNGKey(0))
  alg = method(fediir_config(0.0, ema=0.0), model, LocalSchedule(num_steps=1, batch_size=B, epochs=1, passes=1, unroll=1),
               C)
  state, _ = make_round(alg, C, C, "vmap")(init_round_state(alg, None, params, C), jax.tree.map(jnp.asarray, st),
                                           jax.random.PRNGKey(0))
  got = state.server.g_tilde["Dense_0"]
  got = np.concatenate([np.asarray(got["kernel"], np.float64).ravel(), np.asarray(got["bias"], np.float64)])
  W, b = (np.asarray(params["classifier"]["Dense_0"][k], np.float64) for k in ("kernel", "bias"))
  clients = [(st.x[c, :int(st.counts[c])].astype(np.float64), st.y[c, :int(st.counts[c])]) for c in range(C)]
  alg1 = np.mean([_np_head_grad(W, b, x, y, K) for x, y in clients], 0)
  pooled = [_np_head_grad(W, b, x[i:i + B], y[i:i + B], K) for x, y in clients for i in range(0, len(y), B)]
  pooled = np.mean(pooled, 0)
  np.testing.assert_allclose(got, alg1, rtol=1e-5, atol=1e-6)
  rel = np.linalg.norm(pooled - alg1) / np.linalg.norm(alg1)
  cos = pooled @ alg1 / np.linalg.norm(pooled) / np.linalg.norm(alg1)
  print(f"pooled minibatches vs Alg. 1: relative difference {rel:.3f}, cosine {cos:.3f}")
  assert rel > 1e-3    # the two estimates differ: the statistic is not the pooled one


def _np_ce(W, b, x, y):
  """float64 NumPy: mean cross-entropy of the linear head `x W + b`."""
  z = x @ W + b
  z = z - z.max(1, keepdims=True)
  return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]))


def _np_fediir_loss(theta, shape, x, y, K, gamma, g_tilde):
  """float64 NumPy transcription of FedIIR's local loss (Alg. 1, `gamma` on the squared
  norm): `R(theta) + gamma ||grad_psi R(theta) - g~||^2` for a linear model on `x`
  (`theta` = the flattened `(W, b)`, which is all of `psi`)."""
  W, b = theta[:shape[0] * shape[1]].reshape(shape), theta[shape[0] * shape[1]:]
  g = _np_head_grad(W, b, x, y, K)
  return _np_ce(W, b, x, y) + gamma * float(np.sum((g - g_tilde) ** 2))


def _np_grad(f, theta, eps=1e-6):
  return np.array([(f(theta + eps * e) - f(theta - eps * e)) / (2 * eps) for e in np.eye(theta.size)])


def test_one_round_against_a_float64_transcription_with_a_nonzero_g_tilde():
  """FedIIR where its term matters: the server's `g~` is far from zero (as large as the head
  gradients themselves), so the penalty `||grad_psi R - g~||^2` pulls every client towards
  `g~`. One round of the engine (pre-round statistic, EMA, one full-batch SGD step per
  client, uniform mean) against float64 NumPy with the gradient of the transcribed loss by
  central differences. A sign error on `g~` inside the norm (`g + g~`) moves the result by
  far more than the tolerance, which the last assertion checks."""
  st = ragged_store()
  C, K, D, lr, gamma, ema = len(st.counts), 3, 6, 0.5, 1.0, 0.5
  n_max = int(max(st.counts))
  model = tiny_mlp(hidden=())
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=1, batch_size=n_max, epochs=1, passes=1, unroll=1)
  cfg = {**fediir_config(gamma, ema=ema), **sgd_config(lr)}
  alg = method(cfg, model, sched, C)
  W0, b0 = (np.asarray(params["classifier"]["Dense_0"][k], np.float64) for k in ("kernel", "bias"))
  g0 = np.random.default_rng(3).normal(size=D * K + K) * 0.3  # the server's g~ before the round
  g0_tree = {"Dense_0": {"kernel": jnp.asarray(g0[:D * K].reshape(D, K), jnp.float32),
                         "bias": jnp.asarray(g0[D * K:], jnp.float32)}}
  state = init_round_state(alg, None, params, C)
  state = state._replace(server=state.server._replace(side=state.server.side._replace(g_tilde=g0_tree)))
  state, _ = make_round(alg, C, C, "vmap")(state, jax.tree.map(jnp.asarray, st), jax.random.PRNGKey(0))
  got = state.server.params["classifier"]["Dense_0"]
  got = np.concatenate([np.asarray(got["kernel"], np.float64).ravel(), np.asarray(got["bias"], np.float64)])

  clients = [(st.x[c, :int(st.counts[c])].astype(np.float64), st.y[c, :int(st.counts[c])]) for c in range(C)]
  theta0 = np.concatenate([W0.ravel(), b0])
  # The pre-round exchange: g~ = v g~_0 + (1 - v) (1/C) sum_c grad_psi R_c(theta_0).
  g_tilde = ema * g0 + (1 - ema) * np.mean([_np_head_grad(W0, b0, x, y, K) for x, y in clients], 0)
  assert np.linalg.norm(g_tilde) > np.linalg.norm(_np_head_grad(W0, b0, *clients[0], K))  # far from zero

  def one_round(g_t):
    steps = [-lr * _np_grad(lambda t: _np_fediir_loss(t, (D, K), x, y, K, gamma, g_t), theta0) for x, y in clients]
    return theta0 + np.mean(steps, 0)  # uniform mean, server lr 1
  want = one_round(g_tilde)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  flipped = one_round(-g_tilde)  # the planted mutation `||g + g~||^2`
  assert np.abs(flipped - want).max() > 100 * 1e-4, np.abs(flipped - want).max()
