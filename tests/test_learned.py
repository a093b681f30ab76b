"""The learned-aggregation rule (algorithms/learned.py): one outer step against a float64
NumPy transcription with finite-difference gradients, and a run through the runner."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dg.algorithms.base import Stacked
from fedjax_dg.algorithms.learned import learned_rule
from helpers import run_config, tiny_mlp


def test_one_outer_step_matches_numpy_and_finite_differences():
  with jax.enable_x64(True):
    model = tiny_mlp()
    rng = np.random.default_rng(0)
    f64 = lambda t: jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), t)
    params = f64(model.init(jax.random.PRNGKey(0)))
    S, D = 4, 3
    deltas = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=(S,) + a.shape) * 0.3), params)
    weights = jnp.asarray([9.0, 5.0, 0.0, 7.0])          # a padding member (weight 0)
    shares = jnp.asarray(rng.dirichlet(np.ones(D), S))
    xv, yv = jnp.asarray(rng.normal(size=(30, 6))), jnp.asarray(rng.integers(0, 3, 30))
    server_lr, outer_lr = 0.8, 0.05
    rule = learned_rule(model, xv, yv, D, server_lr, outer_lr, every=1, learn_server_lr=True, learn_shrink=True)
    state = rule.init(params)
    new_params, new_state = rule.apply(state, params, Stacked(deltas, weights, shares))

    def aggregate_np(o):  # eq. (1)-(2), written again in NumPy
      a, b, g = o[:D], o[D], o[D + 1]
      lam = np.asarray(weights) * (np.asarray(shares) @ np.exp(a))
      lam = lam / lam.sum()
      return jax.tree.map(lambda p, d: np.exp(g) * (np.asarray(p) + server_lr * np.exp(b) * np.tensordot(lam, np.asarray(d), 1)),
                          params, deltas)

    def loss_np(o):
      logits = np.asarray(model.apply(aggregate_np(o), xv))
      logp = logits - logits.max(1, keepdims=True)
      logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
      return -logp[np.arange(len(yv)), np.asarray(yv)].mean()

    o0, eps = np.zeros(D + 2), 1e-6
    grad = np.array([(loss_np(o0 + eps * e) - loss_np(o0 - eps * e)) / (2 * eps) for e in np.eye(D + 2)])
    o1 = o0 - outer_lr * grad / (np.abs(grad) + 1e-8)      # Adam's first step (bias-corrected moments)
    got = np.concatenate([np.asarray(new_state.logits), [float(new_state.log_lr), float(new_state.log_shrink)]])
    np.testing.assert_allclose(got, o1, rtol=1e-6, atol=1e-9)
    assert np.all(np.abs(grad) > 1e-5)                     # every outer variable matters here
    for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(aggregate_np(o1))):
      np.testing.assert_allclose(np.asarray(a), b, rtol=1e-10, atol=1e-12)
    assert int(new_state.round) == 1


def test_every_n_rounds_and_fixed_shrink():
  """With every = 2 the second round aggregates with the weights of the first and takes no
  step; without learn_shrink and learn_server_lr those stay 0."""
  with jax.enable_x64(True):
    model = tiny_mlp()
    params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), model.init(jax.random.PRNGKey(0)))
    rng = np.random.default_rng(1)
    deltas = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=(3,) + a.shape) * 0.3), params)
    st = Stacked(deltas, jnp.ones(3), jnp.eye(3))
    rule = learned_rule(model, jnp.asarray(rng.normal(size=(20, 6))), jnp.asarray(rng.integers(0, 3, 20)), 3,
                        1.0, 0.1, every=2)
    _, s1 = rule.apply(rule.init(params), params, st)
    _, s2 = rule.apply(s1, params, st)
    _, s3 = rule.apply(s2, params, st)
    assert np.abs(np.asarray(s1.logits)).max() > 0
    np.testing.assert_array_equal(np.asarray(s2.logits), np.asarray(s1.logits))
    assert np.abs(np.asarray(s3.logits) - np.asarray(s2.logits)).max() > 0
    assert float(s3.log_lr) == 0.0 and float(s3.log_shrink) == 0.0


def test_runs_in_the_runner_on_the_held_out_domain_only(tiny_config):
  tiny_config.algorithm.name = "learned_agg"
  tiny_config.algorithm.learned.outer_lr = 0.2
  state = run_config(tiny_config, 2)
  logits = np.asarray(state.server.opt_state.logits)
  assert logits.shape == (6,) and np.all(np.isfinite(logits))
  train = [1, 2, 3, 4]  # default config: domain 0 held out for validation, 5 for test
  assert np.abs(logits[train]).max() > 0 and logits[0] == 0 and logits[5] == 0  # no client of 0 or 5


def test_refused_without_a_held_out_validation_domain(tiny_config):
  from fedjax_dg.algorithms import build_algorithm
  from fedjax_dg.algorithms.base import make_schedule
  tiny_config.algorithm.name = "learned_agg"
  with pytest.raises(ValueError, match=r"needs a held-out validation domain \(data.val_domains\)"):
    build_algorithm(tiny_config, tiny_mlp(), make_schedule(4, 2, 1, 10, 5), 8, 8)
  tiny_config.algorithm.name = "fedprox+learned"
  with pytest.raises(ValueError, match="needs the clients' domain shares"):
    build_algorithm(tiny_config, tiny_mlp(), make_schedule(4, 2, 1, 10, 5), 8, 8,
                    heldout_val=(np.zeros((2, 6)), np.zeros(2, int)))
