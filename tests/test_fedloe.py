"""FedLOE stage 2: the invariant manager's penalties in float64 NumPy, and head averaging."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dg.algorithms.base import LocalSchedule
from fedjax_dg.algorithms.fedloe import (init_stage2, invariance_penalty, make_stage2, manager_objective,
                                         per_client_losses, solve_manager)
from fedjax_dg.data.store import ClientStore
from helpers import ragged_store, tiny_mlp, tree_max_diff

Cp, N, C, K = 3, 6, 4, 3   # clients with tuning data, rows, heads, classes


def _problem(seed=0):
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(Cp, N, C, K))
  y = rng.integers(0, K, (Cp, N))
  mask = np.ones((Cp, N))
  mask[1, 4:] = 0
  phi = rng.normal(size=C) * 0.5 + 1.0 / C
  return logits, y, mask, phi


def _np_parts(logits, y, mask, phi):
  """Per-client losses, d/dw at w = 1 and grad_phi, written out by hand."""
  R, dw, gphi = [], [], []
  for m in range(Cp):
    rows = mask[m] > 0
    z = np.einsum("c,nck->nk", phi, logits[m])[rows]
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    onehot = np.eye(K)[y[m][rows]]
    R.append(np.mean(-np.log(p[onehot > 0])))
    resid = p - onehot                                   # dCE/dz
    dw.append(np.mean(np.sum(resid * z, 1)))             # d/dw CE(w z) at w = 1
    gphi.append(np.einsum("nk,nck->c", resid, logits[m][rows]) / rows.sum())
  return np.array(R), np.array(dw), np.array(gphi)


def test_penalties_match_numpy():
  logits, y, mask, phi = _problem()
  R, dw, gphi = _np_parts(logits, y, mask, phi)
  with jax.enable_x64(True):
    args = (jnp.asarray(phi), jnp.asarray(logits), jnp.asarray(y), jnp.asarray(mask))
    np.testing.assert_allclose(per_client_losses(*args), R, rtol=1e-10)
    np.testing.assert_allclose(invariance_penalty("irm", *args), np.sum(dw ** 2), rtol=1e-9)
    np.testing.assert_allclose(invariance_penalty("rex", *args), np.sum((R - R.mean()) ** 2), rtol=1e-9)
    gram = gphi @ gphi.T
    np.testing.assert_allclose(invariance_penalty("fish", *args), -(gram.sum() - np.trace(gram)), rtol=1e-9)
    w = np.array([3.0, 1.0, 2.0])
    lam = 0.7
    expect = np.sum(w / w.sum() * R) + lam * np.sum(dw ** 2)
    np.testing.assert_allclose(manager_objective(*args, jnp.asarray(w), "irm", lam), expect, rtol=1e-9)


@pytest.mark.parametrize("kind", ["irm", "rex", "fish", "none"])
def test_solver_lowers_the_objective(kind):
  logits, y, mask, _ = _problem(1)
  args = (jnp.asarray(logits, jnp.float32), jnp.asarray(y), jnp.asarray(mask, jnp.float32))
  w = jnp.ones(Cp)
  phi = solve_manager(*args, w, kind, 1.0, steps=100, lr=0.05)
  start = manager_objective(jnp.full(C, 1.0 / C), *args, w, kind, 1.0)
  assert float(manager_objective(phi, *args, w, kind, 1.0)) < float(start)


def test_stage2_with_lambda_zero_and_no_solver_is_head_averaging():
  st = ragged_store(sizes=(8, 6, 9))
  tune = ragged_store(sizes=(3, 2, 3), seed=1)
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=3, batch_size=4, epochs=1, passes=1, unroll=1)
  stage2 = make_stage2(model, sched, lr=0.1, kind="irm", lam=0.0, solver_steps=0)
  state = init_stage2(params["classifier"], 3)
  to_dev = lambda s: jax.tree.map(jnp.asarray, s)
  out = stage2(state, params["featurizer"], to_dev(st), to_dev(tune), jax.random.PRNGKey(0))
  mean_head = jax.tree.map(lambda h: h.mean(0), out.heads)
  assert tree_max_diff(out.head, mean_head) < 1e-6
  assert tree_max_diff(out.heads, state.heads) > 1e-4           # every client trained its own head
  assert tree_max_diff(jax.tree.map(lambda h: h[0], out.heads), jax.tree.map(lambda h: h[1], out.heads)) > 1e-4
