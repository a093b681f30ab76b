"""Fish against a float64 NumPy transcription of DomainBed's `Fish.update`
(`domainbed/algorithms.py`): the inner Adam's state (`optimizer_inner_state`) runs on from
one local step to the next while the inner parameters restart from the meta parameters."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dg.algorithms.base import ClientData, LocalSchedule
from fedjax_dg.algorithms.fish import fish_client
from helpers import tiny_mlp

LR, META, B1, B2, EPS, STEPS = 0.05, 0.3, 0.9, 0.999, 1e-8, 5


def _grad(W, b, x, y, K):
  z = x @ W + b
  p = np.exp(z - z.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  e = (p - np.eye(K)[y]) / len(y)
  return [x.T @ e, e.sum(0)]


def _domainbed_fish(W, b, x, y, d, K, steps):
  """`Fish.update` `steps` times on the same full batch, split by environment in
  ascending order; `create_clone` reloads the inner Adam's state saved by the last update."""
  meta = [W.copy(), b.copy()]
  m = [np.zeros_like(W), np.zeros_like(b)]
  v = [np.zeros_like(W), np.zeros_like(b)]
  t = 0                                                   # Adam's step count, in the saved state
  for _ in range(steps):
    inner = [meta[0].copy(), meta[1].copy()]              # create_clone: weights of self.network
    for e in np.unique(d):                                # for x, y in minibatches
      t += 1
      g = _grad(inner[0], inner[1], x[d == e], y[d == e], K)
      for j in range(2):
        m[j] = B1 * m[j] + (1 - B1) * g[j]
        v[j] = B2 * v[j] + (1 - B2) * g[j] ** 2
        inner[j] = inner[j] - LR * (m[j] / (1 - B1 ** t)) / (np.sqrt(v[j] / (1 - B2 ** t)) + EPS)
    meta = [meta[j] + META * (inner[j] - meta[j]) for j in range(2)]   # self.fish(...)
  return meta


def test_fish_with_adam_matches_domainbed_update_over_several_steps():
  rng = np.random.default_rng(3)
  n, dim, K = 18, 6, 3
  x = rng.normal(size=(n, dim)).astype(np.float32)
  y = rng.integers(0, K, n).astype(np.int32)
  d = np.repeat(np.array([0, 2, 1]), n // 3).astype(np.int32)
  model = tiny_mlp(dim=dim, classes=K, hidden=())
  params = model.init(jax.random.PRNGKey(1))
  sched = LocalSchedule(num_steps=STEPS, batch_size=n, epochs=STEPS, passes=STEPS, unroll=1)  # full batches
  client = fish_client(model, sched, optax.adam(LR, B1, B2, EPS), META, 3)
  data = ClientData(jnp.asarray(x), jnp.asarray(y), jnp.asarray(d), jnp.asarray(n))
  out = jax.jit(lambda p: client.update(p, None, (), data, jax.random.PRNGKey(0)))(params)
  dense = params["classifier"]["Dense_0"]
  W, b = np.asarray(dense["kernel"], np.float64), np.asarray(dense["bias"], np.float64)
  ref = _domainbed_fish(W, b, x.astype(np.float64), y, d, K, STEPS)
  got = out.message["classifier"]["Dense_0"]
  np.testing.assert_allclose(np.asarray(got["kernel"], np.float64), ref[0] - W, rtol=1e-4, atol=2e-6)
  np.testing.assert_allclose(np.asarray(got["bias"], np.float64), ref[1] - b, rtol=1e-4, atol=2e-6)
