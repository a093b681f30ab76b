"""Client DG objectives: composition of the public penalties over the domains present."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dg.algorithms.base import Batch
from fedjax_dg.algorithms.dg import dg_objective
from fedjax_dg.objectives import coral_penalty, irm_penalty, mmd_penalty, vrex_penalty
import helpers
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
    pen = np.mean([float(jax.jit(irm_penalty)(logits, batch.y, masks[e])) for e in doms])
  elif kind == "vrex":
    pen = float(jax.jit(vrex_penalty)(jnp.asarray([risks[e] for e in doms])))
  else:
    fn = coral_penalty if kind == "coral" else mmd_penalty
    pen = float(jax.jit(fn)(z, z, masks[0], masks[2]))
  lam = 7.0
  make = dg_objective(model, kind, lam, D, anneal_steps=10, steps_per_round=4)
  # One program per round, not one per primitive.
  loss = lambda round_: jax.jit(lambda p, b: make(round_)(p, b, None)[0])  # noqa: E731
  early = float(loss(1)(params, batch._replace(step=3)))      # update step 7 < 10
  late = float(loss(2)(params, batch._replace(step=3)))       # update step 11
  weight_early = 1.0 if kind in ("irm", "vrex") else lam             # only IRM and VREx anneal
  np.testing.assert_allclose(early, erm + weight_early * pen, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(late, erm + lam * pen, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["irm", "vrex", "coral", "mmd"])
def test_single_domain_client_is_erm(kind):
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(1))
  batch = _batch([1] * 8)
  _, logits, _, _, risks = _parts(model, params, batch)
  got = float(jax.jit(lambda p, b: dg_objective(model, kind, 5.0, D)(3)(p, b, None)[0])(params, batch))
  np.testing.assert_allclose(got, risks[1], rtol=1e-6)


# ----------------------------------------------------------------- thousands of domains (Py150, IWildCam, FEMNIST)

BIG = 5000


def _np_objective(kind, z, logits, y, d, m, lam):
  """Float64 NumPy: mean risk over the present domains plus `lam` times the penalty, by a
  loop over all BIG domains (pairs of present domains for CORAL and MMD)."""
  from test_objectives import np_coral, np_irm, np_mmd
  ce = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1) - logits[np.arange(len(y)), y]
  rows = {e: np.flatnonzero((d == e) & m) for e in range(BIG)}
  present = [e for e in range(BIG) if len(rows[e])]
  risks = np.array([ce[rows[e]].mean() for e in present])
  if kind == "irm":
    pen = np.mean([np_irm(logits[rows[e]], y[rows[e]]) for e in present]) if len(present) > 1 else 0.0
  elif kind == "vrex":
    pen = np.var(risks)
  else:
    fn = np_coral if kind == "coral" else np_mmd
    pen = np.mean([fn(z[rows[a]], z[rows[b]]) for a in present for b in present if a < b])
  return risks.mean() + lam * pen, pen


def _max_shape(jaxpr):
  """The largest dimension of any value in a jaxpr, its sub-jaxprs included."""
  out = 0
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      out = max([out, *getattr(v.aval, "shape", ())])
    for p in eqn.params.values():
      for sub in (p if isinstance(p, (tuple, list)) else (p,)):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          out = max(out, _max_shape(sub))
  return out


@pytest.mark.parametrize("kind", ["irm", "vrex", "coral", "mmd"])
def test_objective_over_5000_domains_matches_a_numpy_loop_and_never_builds_a_domain_axis(kind):
  """With 5000 domains in the dataset and four in the batch (one with a single row; padding
  rows carry real domain ids) the objective and its penalty equal a float64 loop over all
  5000 domains; no value in the traced loss-and-gradient has a dimension of the size of the
  number of domains (before: `[B, D]` one-hots, D masks, D^2 / 2 pairs), and it compiles
  and runs in seconds."""
  import time
  model = tiny_mlp()
  doms = [4999, 17, 17, 2500, 4999, 17, 1234, 2500, 4999, 17, 2500, 4999, 3, 3]  # 1234 once; last two padding
  with jax.enable_x64(True):
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), model.init(jax.random.PRNGKey(3)))
    batch = _batch(doms, seed=1)
    batch = batch._replace(x=jnp.asarray(batch.x, jnp.float64), mask=jnp.asarray(batch.mask, jnp.float64))
    lam = 3.0
    obj = dg_objective(model, kind, lam, BIG)(0)
    # Compiled at XLA's default optimisation level, as a user's run is (the suite compiles at
    # level 0, conftest.py): the features reach ~6e3 here, and MMD's expanded squared
    # distances |a|^2 + |b|^2 - 2 a.b cancel; compiled at level 0 the MMD penalty differs
    # from the NumPy loop by 1e-7 relative (it rounds differently), at the default level by
    # less than this test's 1e-9.
    fn = jax.jit(jax.value_and_grad(lambda p, b: obj(p, b, None), has_aux=True),
                 compiler_options=helpers.XLA_DEFAULT_OPT)
    t0 = time.perf_counter()
    (loss, aux), _ = fn(params, batch)
    elapsed = time.perf_counter() - t0
    z = np.asarray(model.features(params, batch.x))
    logits = np.asarray(model.head(params["classifier"], jnp.asarray(z)))
    want, pen = _np_objective(kind, z, logits, np.asarray(batch.y), np.asarray(batch.domain),
                              np.asarray(batch.mask) > 0, lam)
    np.testing.assert_allclose(float(aux["penalty"]), pen, rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(float(loss), want, rtol=1e-9)
    assert abs(pen) > 1e-8
    jaxpr = jax.make_jaxpr(lambda p, b: jax.value_and_grad(lambda q: obj(q, b, None)[0])(p))(params, batch)
  assert _max_shape(jaxpr.jaxpr) < len(doms) + 64, _max_shape(jaxpr.jaxpr)  # O(B), not O(D)
  assert elapsed < 60, elapsed


# ----------------------------------------------------------------- annealing relative to the run


def test_default_annealing_is_a_share_of_the_run():
  """By default IRM's weight is 1 for `anneal_fraction` (0.1) of the run's local steps, here
  0.1 * 10 rounds * 2 steps = 2 steps: round 0 runs at weight 1 and round 1 at `lam`, each
  equal to local training on the objective with the weight fixed there. (A fixed 500-step
  default never reaches `lam` in these 20 steps.)"""
  from fedjax_dg.algorithms.base import ClientData, LocalSchedule, local_train
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=8, epochs=0, passes=2, unroll=1)
  lam, lr = 50.0, 0.05
  alg = helpers.method({"algorithm.name": "irm", "algorithm.irm.lam": lam, "num_rounds": 10,
                        **helpers.sgd_config(lr)}, model, sched, 2, num_domains=D)
  rng = np.random.default_rng(0)
  n = 8
  dom = np.array([0, 2] * 4)
  data = ClientData(jnp.asarray(rng.normal(size=(n, 6)) + dom[:, None], jnp.float32),
                    jnp.asarray(rng.integers(0, 3, n)), jnp.asarray(dom), jnp.asarray(n))
  key = jax.random.PRNGKey(4)
  fixed = lambda round_, a: jax.jit(lambda p: local_train(  # noqa: E731  (one program, not one per primitive)
      p, dg_objective(model, "irm", lam, D, anneal_steps=a, steps_per_round=2)(round_), optax.sgd(lr), data, key,
      sched)[0])(params)
  update = jax.jit(alg.client_update)
  for round_, want in ((0, fixed(0, 10 ** 9)), (1, fixed(1, 0))):
    delta = update((params, jnp.asarray(round_)), (), data, key).message
    got = jax.tree.map(jnp.add, params, delta)
    assert helpers.tree_max_diff(got, want) < 1e-6, round_
  assert helpers.tree_max_diff(fixed(1, 10 ** 9), fixed(1, 0)) > 1e-3  # the weight matters here


def test_anneal_steps_overrides_the_share_and_counts_the_round_clock():
  from fedjax_dg.algorithms.dg import anneal_length
  assert anneal_length(-1, 0.25, 400) == 100.0
  assert anneal_length(0, 0.25, 400) == 0 and anneal_length(500, 0.25, 400) == 500


def test_every_searched_anneal_share_switches_the_penalty_on_within_the_run():
  from fedjax_dg.algorithms import dg
  for cls in (dg.IRMHParams, dg.VRExHParams):
    f = {x.name: x for x in dataclasses.fields(cls)}["anneal_fraction"]
    assert max(f.metadata["search"].values) <= 0.5 and f.metadata["lt"] == 1
    assert "search" not in {k for k, v in {x.name: x.metadata for x in dataclasses.fields(cls)}["anneal_steps"].items()
                            if v is not None}
