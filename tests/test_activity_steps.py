"""Activity records of the methods that change the local step itself (Fish's meta-step,
SAM's sharpness-aware gradient) against replays, and the switch that turns every client
record off without changing the training."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import helpers
from helpers import tiny_mlp


def _data(domains=(0, 2), n=8, seed=0):
  from fedjax_dg.algorithms.base import ClientData
  rng = np.random.default_rng(seed)
  dom = np.array(list(domains) * (n // len(domains)))
  return ClientData(jnp.asarray(rng.normal(size=(n, 6)) + dom[:, None], jnp.float32),
                    jnp.asarray(rng.integers(0, 3, n)), jnp.asarray(dom), jnp.asarray(n))


def _flat(tree):
  return np.concatenate([np.asarray(a, np.float64).ravel() for a in jax.tree.leaves(tree)])


def _batches(data, sched, rng):
  """The full batches `local_loop` reads at each step (its row order)."""
  from fedjax_dg.algorithms.base import Batch, batch_indices
  idx, _ = batch_indices(jax.random.split(rng)[0], data.count, data.y.shape[0], sched)
  return [Batch(data.x[idx[s]], data.y[idx[s]], data.domain[idx[s]], jnp.ones(idx.shape[1]), s)
          for s in range(sched.num_steps)]


def _sched(K, B=8, activity=True):
  from fedjax_dg.algorithms.base import LocalSchedule
  return LocalSchedule(num_steps=K, batch_size=B, epochs=0, passes=K, unroll=1, activity=activity)


def _ctx(model, sched, opt):
  return type("Ctx", (), {"model": model, "client_opt": opt, "sched": sched})()


def test_sam_step_deviation_against_a_replay():
  """`activity/step_deviation` of FedSAM = mean over the local steps of ||g_sam - g|| / ||g||,
  g the plain gradient and g_sam the gradient at theta + rho g / ||g||, replayed in float64
  on the step's own parameters (SGD)."""
  from fedjax_dg.algorithms.base import erm_objective
  from fedjax_dg.algorithms.fedsam import HParams, sam_client
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  K, lr, rho = 3, 0.3, 0.4
  sched, data, rng = _sched(K), _data(), jax.random.PRNGKey(3)
  out = jax.jit(sam_client(_ctx(model, sched, optax.sgd(lr)), HParams(rho=rho)).update)(params, (), (), data, rng)
  erm = erm_objective(model)
  grad = jax.jit(jax.grad(lambda q, b: erm(q, b, None)[0]))  # one program, not one per primitive
  p, devs, first_norm_ratio = params, [], None
  for batch in _batches(data, sched, rng):
    g = grad(p, batch)
    gf = _flat(g)
    e = jax.tree.map(lambda a: rho * a / np.linalg.norm(gf), g)
    g_sam = grad(jax.tree.map(jnp.add, p, e), batch)
    devs.append(np.linalg.norm(_flat(g_sam) - gf) / np.linalg.norm(gf))
    if first_norm_ratio is None:  # a wrong normalisation: by the SAM gradient's norm
      first_norm_ratio = np.linalg.norm(_flat(g_sam) - gf) / np.linalg.norm(_flat(g_sam))
    p = jax.tree.map(lambda a, b: a - lr * b, p, g_sam)
  got = float(out.metrics["activity/step_deviation"])
  np.testing.assert_allclose(got, np.mean(devs), rtol=1e-4)
  assert helpers.tree_max_diff(jax.tree.map(jnp.add, params, out.message), p) < 1e-5  # the same trajectory
  # The record tells the right formula from plausible wrong ones, and SAM acts here.
  assert np.mean(devs) > 0.05
  for wrong in (devs[0], first_norm_ratio, np.mean(devs) * (1 + 1.0 / K)):
    assert abs(got - wrong) > 1e-2 * got


def test_sam_at_rho_zero_records_no_deviation():
  from fedjax_dg.algorithms.fedsam import HParams, sam_client
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  out = sam_client(_ctx(model, _sched(2), optax.sgd(0.1)), HParams(rho=0.0)).update(
      params, (), (), _data(), jax.random.PRNGKey(0))
  assert float(out.metrics["activity/step_deviation"]) == 0.0


def _domain_loss(model, p, batch, e):
  ce = optax.softmax_cross_entropy_with_integer_labels(model.apply(p, batch.x), batch.y)
  m = batch.mask * (batch.domain == e)
  return jnp.sum(ce * m) / jnp.sum(m)


def test_fish_step_deviation_against_a_replay():
  """`activity/step_deviation` of Fish = ||d_fish - d_plain|| / ||d_plain|| at the round's
  first step: d_fish = meta_lr (theta~ - theta) with theta~ from one SGD step per present
  domain in ascending order, d_plain = -meta_lr lr S g_bar with g_bar the mean of the
  domains' gradients at theta; replayed here domain by domain, in float64 for the norms."""
  from fedjax_dg.algorithms.fish import fish_client
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(1))
  K, lr, meta_lr = 2, 0.8, 0.5
  sched, data, rng = _sched(K), _data(), jax.random.PRNGKey(4)
  out = fish_client(model, sched, optax.sgd(lr), meta_lr, 3, "ascending").update(params, (), (), data, rng)
  batch = _batches(data, sched, rng)[0]
  grads_at_theta = [_flat(jax.grad(lambda q: _domain_loss(model, q, batch, e))(params)) for e in (0, 2)]
  inner = params
  for e in (0, 2):
    g = jax.grad(lambda q: _domain_loss(model, q, batch, e))(inner)
    inner = jax.tree.map(lambda a, b: a - lr * b, inner, g)
  d_fish = meta_lr * (_flat(inner) - _flat(params))
  g_bar = np.mean(grads_at_theta, 0)
  d_plain = -meta_lr * lr * 2 * g_bar
  want = np.linalg.norm(d_fish - d_plain) / np.linalg.norm(d_plain)
  got = float(out.metrics["activity/step_deviation"])
  np.testing.assert_allclose(got, want, rtol=1e-4)
  assert want > 0.01  # the inner loop's gradient matching moves the step here
  # plausible wrong records: the plain step without S, or without the meta step on one side
  for d_wrong in (-meta_lr * lr * g_bar, -lr * 2 * g_bar):
    wrong = np.linalg.norm(d_fish - d_wrong) / np.linalg.norm(d_wrong)
    assert abs(got - wrong) > 1e-2 * want


@pytest.mark.parametrize("opt", [optax.sgd(0.5), optax.adam(0.05)])
def test_fish_on_a_single_domain_client_deviates_from_the_plain_step_by_nothing(opt):
  """One present domain: Fish's step is one inner step scaled by meta_lr, which is the plain
  step by definition (the record measures only what the inner loop's sequence adds)."""
  from fedjax_dg.algorithms.fish import fish_client
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(1))
  out = fish_client(model, _sched(2), opt, 0.5, 3, "random").update(params, (), (), _data(domains=(1,)),
                                                                        jax.random.PRNGKey(0))
  assert float(out.metrics["activity/step_deviation"]) < 1e-5


def _clients(model):
  from fedjax_dg.algorithms.dg import dg_client
  from fedjax_dg.algorithms.fedsam import HParams, sam_client
  from fedjax_dg.algorithms.fish import fish_client
  return {"irm": lambda s: dg_client(model, s, optax.sgd(0.1), "irm", 30.0, 3, 2),
          "fedsam": lambda s: sam_client(_ctx(model, s, optax.sgd(0.1)), HParams(rho=0.3)),
          "fish": lambda s: fish_client(model, s, optax.adam(0.05), 0.5, 3, "random")}


@pytest.mark.parametrize("name", ["irm", "fedsam", "fish"])
def test_activity_off_records_nothing_and_trains_bit_identically(name):
  """`LocalSchedule.activity = False` (`make_schedule(..., activity=False)`) drops every
  client record and leaves the update bitwise unchanged; the logged training loss agrees
  to rounding (the recording loop takes the round's first step outside its scan, where
  XLA may fuse the loss's last operations differently)."""
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  data, rng = _data(), jax.random.PRNGKey(5)
  make = _clients(model)[name]
  extra = jnp.asarray(1) if name == "irm" else ()
  outs = [jax.jit(lambda p, s=s: make(s).update(p, extra, (), data, rng))(params)
          for s in (_sched(3), _sched(3, activity=False))]
  assert any(k.startswith("activity/") for k in outs[0].metrics)
  assert not any(k.startswith("activity/") for k in outs[1].metrics)
  for a, b in zip(jax.tree.leaves(outs[0].message), jax.tree.leaves(outs[1].message)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  np.testing.assert_allclose(float(outs[0].metrics["train_loss"]), float(outs[1].metrics["train_loss"]), rtol=1e-6)


def test_make_schedule_carries_the_switch():
  from fedjax_dg.algorithms.base import make_schedule
  assert make_schedule(4, 3, 0, 10, 8).activity and not make_schedule(4, 0, 1, 10, 8, activity=False).activity
