"""Hypergradients through rounds (fedjax_dg.meta) against central finite differences in float64."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import fedjax_dg
from fedjax_dg import algorithms, meta
from fedjax_dg.algorithms.base import make_schedule
from fedjax_dg.engine import init_round_state
from helpers import ragged_store, tiny_mlp

C, COHORT, D = 6, 5, 3  # ragged_store: 6 clients, client c in domain c % 3


def tiny(strategy="vmap", chunk=2, name="fedprox"):
  """(problem, state, model) in float64: FedProx on the tiny MLP, 5 of 6 clients a round."""
  config = fedjax_dg.default_config()
  config.algorithm.name = name
  config.algorithm.fedprox.mu = 0.3
  config.client.lr, config.client.momentum = 0.2, 0.5
  store = ragged_store()
  store = store._replace(x=store.x.astype(np.float64))
  model = tiny_mlp()
  sched = make_schedule(4, 3, 1, int(store.counts.max()), int(store.counts.min()))
  builder = algorithms.Builder(algorithms.context(config, model, sched, C, COHORT, num_domains=D, store=store))
  xv = jax.random.normal(jax.random.PRNGKey(9), (40, 6), jnp.float64)
  yv = jax.random.randint(jax.random.PRNGKey(8), (40,), 0, 3)
  p = meta.problem(builder, store, C, COHORT, strategy, chunk_size=chunk, splits={"heldout_val": (xv, yv)},
                   num_domains=D)
  params = jax.tree.map(lambda a: a.astype(jnp.float64), model.init(jax.random.PRNGKey(0)))
  return p, init_round_state(builder, None, params, C), model


def start(p):
  """Outer variables away from the defaults, so every coordinate matters."""
  m = meta.init_meta(p, ("client.lr", "method.mu", "server.lr"))
  r = np.random.default_rng(0)
  w = m.weights._replace(client=jnp.asarray(r.normal(size=C) * 0.5), domain=jnp.asarray(r.normal(size=D) * 0.5),
                         shrink=jnp.asarray(0.9))
  return m._replace(weights=w)


def central_fd(f, x, eps=1e-6):
  return np.array([(f(x.at[i].add(eps)) - f(x.at[i].add(-eps))) / (2 * eps) for i in range(x.shape[0])])


# "chunked" composes the other two (a scan over vmapped chunks): in the slow suite.
@pytest.mark.parametrize("strategy", ["vmap", pytest.param("chunked", marks=pytest.mark.slow), "sequential"])
def test_exact_hypergradient_matches_finite_differences(strategy):
  with jax.enable_x64(True):
    p, state, model = tiny(strategy)
    obj = meta.validation_loss(model)
    m0 = start(p)
    key, T = jax.random.PRNGKey(3), 3
    value, grad, _ = meta.hypergradient(p, obj, T)(m0, state, key)
    x0, unravel = ravel_pytree(m0)
    f = jax.jit(lambda x: meta._value(p, obj, meta.rounds(p, unravel(x), state, key, 0, T)))
    np.testing.assert_allclose(float(value), float(f(x0)), rtol=1e-12)
    g = ravel_pytree(grad)[0]
    fd = central_fd(f, x0)
    np.testing.assert_allclose(np.asarray(g), fd, rtol=1e-5, atol=1e-9)
    # every kind of outer variable moves the objective: lr, mu, server lr, client, domain, shrink
    assert np.all(np.abs([grad.hparams[k] for k in ("client.lr", "method.mu", "server.lr")]) > 1e-6)
    assert np.abs(np.asarray(grad.weights.client)).max() > 1e-6 and np.abs(np.asarray(grad.weights.domain)).max() > 1e-6
    assert abs(float(grad.weights.shrink)) > 1e-6


def test_rematerialisation_gives_the_same_gradient():
  with jax.enable_x64(True):
    p, state, model = tiny("vmap")
    grads = [ravel_pytree(meta.hypergradient(p, meta.validation_loss(model), 2, remat=remat)(
        start(p), state, jax.random.PRNGKey(1))[1])[0] for remat in (True, False)]
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-10, atol=1e-13)


def test_truncated_and_one_step_match_finite_differences_of_the_last_rounds():
  with jax.enable_x64(True):
    p, state, model = tiny("vmap")
    obj = meta.validation_loss(model)
    m0, key = start(p), jax.random.PRNGKey(5)
    x0, unravel = ravel_pytree(m0)
    mid = meta.rounds(p, m0, state, key, 0, 2)  # the first 2 of 4 rounds at the start values, held fixed
    f = jax.jit(lambda x: meta._value(p, obj, meta.rounds(p, unravel(x), mid, key, 2, 2)))
    value, grad, _ = meta.hypergradient(p, obj, 4, truncate=2)(m0, state, key)
    np.testing.assert_allclose(float(value), float(f(x0)), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(ravel_pytree(grad)[0]), central_fd(f, x0), rtol=1e-5, atol=1e-9)
    # one step from round 2's state: the objective after round 2 alone
    f1 = jax.jit(lambda x: meta._value(p, obj, meta.rounds(p, unravel(x), mid, key, 2, 1)))
    v1, g1, nxt = meta.one_step(p, obj)(m0, mid, key, 2)
    np.testing.assert_allclose(float(v1), float(f1(x0)), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(ravel_pytree(g1)[0]), central_fd(f1, x0), rtol=1e-5, atol=1e-9)
    assert int(nxt.server.round) == int(mid.server.round) + 1


def test_domain_weights_reach_clients_through_their_domain():
  """Equal domain log-multipliers change nothing (a common factor); a domain's multiplier
  scales exactly its clients."""
  with jax.enable_x64(True):
    p, _, _ = tiny()
    w = meta.init_meta(p).weights
    base = np.asarray(meta.client_weights(p, w))
    np.testing.assert_allclose(base, np.asarray(ragged_store().counts, np.float64))
    scaled = np.asarray(meta.client_weights(p, w._replace(domain=jnp.asarray([0.0, np.log(2.0), 0.0]))))
    in_d1 = np.arange(C) % 3 == 1
    np.testing.assert_allclose(scaled[in_d1], 2 * base[in_d1])
    np.testing.assert_allclose(scaled[~in_d1], base[~in_d1])


def test_bad_input_is_one_line_before_compiling():
  p, state, model = tiny()
  obj = meta.validation_loss(model)
  cases = [
      (lambda: meta.problem(None, ragged_store(), C, C, "host_loop"), "engine.strategy: 'host_loop' cannot be"),
      (lambda: meta.hypergradient(p, obj, 3, truncate=4), "truncate: K=4 must lie in [1, rounds=3]"),
      (lambda: meta.hypergradient(p, meta.validation_loss(model, "test"), 2), "objective.split: 'test' is a test split"),
      (lambda: meta.hypergradient(p, meta.Objective(obj.fn, "in_test"), 2), "objective.split: 'in_test' is a test split"),
      (lambda: meta.problem(None, ragged_store(), C, C, splits={"test": (1, 2)}), "splits['test']: 'test' is a test"),
      (lambda: meta.init_meta(p, ("method.mux",)), "meta.hparams: unknown hyperparameter 'method.mux'"),
      (lambda: meta.hypergradient(p, obj, 2)(meta.init_meta(p)._replace(hparams={"client.lrr": 1.0}), state,
                                              jax.random.PRNGKey(0)), "meta.hparams: unknown hyperparameter"),
  ]
  for call, message in cases:
    with pytest.raises(ValueError) as e:
      call()
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.slow
def test_learning_a_domain_weight_lowers_the_validation_loss():
  """Gradient descent on the outer variables lowers the objective (a property, not a number)."""
  with jax.enable_x64(True):
    p, state, model = tiny()
    h = meta.hypergradient(p, meta.validation_loss(model), 2)
    m = meta.init_meta(p, ("client.lr",))
    key = jax.random.PRNGKey(2)
    v0, g, _ = h(m, state, key)
    m1 = jax.tree.map(lambda a, b: a - 0.05 * b, m, g)
    v1 = h(m1, state, key)[0]
    assert float(v1) < float(v0)
