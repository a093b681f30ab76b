"""The K-round learned-aggregation rule (`algorithm.learned.unroll = K`): its outer gradient
through the last K aggregations against central finite differences of a float64 NumPy
transcription, its Adam steps against Adam written out, and K = 1 against the one-step rule."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dg.algorithms.base import Stacked
from fedjax_dg.algorithms.learned import Window, aggregate, learned_rule, push, replay
from helpers import run_config, tiny_mlp

D, S = 3, 4
SERVER_LR, OUTER_LR = 0.8, 0.05


def _round_inputs(params, rng):
  deltas = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=(S,) + a.shape) * 0.3), params)
  weights = jnp.asarray(np.r_[rng.uniform(2, 9, S - 1), 0.0])      # the last member is padding
  shares = jnp.asarray(rng.dirichlet(np.ones(D), S))
  return deltas, weights, shares


def _aggregate_np(o, params, deltas, weights, shares):
  """Eq. (1)-(2) in NumPy, on the cohort's updates (not the per-domain sums of eq. (3))."""
  a, b, g = o[:D], o[D], o[D + 1]
  lam = np.asarray(weights) * (np.asarray(shares) @ np.exp(a))
  lam = lam / lam.sum()
  return jax.tree.map(lambda p, d: np.exp(g) * (np.asarray(p) + SERVER_LR * np.exp(b) * np.tensordot(lam, np.asarray(d), 1)),
                      params, deltas)


def _ce_np(model, params, x, y):
  logits = np.asarray(model.apply(params, x))
  logp = logits - logits.max(1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
  return -logp[np.arange(len(y)), np.asarray(y)].mean()


def _fd(f, o, eps=1e-6):
  return np.array([(f(o + eps * e) - f(o - eps * e)) / (2 * eps) for e in np.eye(len(o))])


def _outer(state):
  return np.concatenate([np.asarray(state.logits), [float(state.log_lr), float(state.log_shrink)]])


def _setup():
  model = tiny_mlp()
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), model.init(jax.random.PRNGKey(0)))
  xv, yv = jnp.asarray(rng.normal(size=(30, 6))), jnp.asarray(rng.integers(0, 3, 30))
  return model, rng, params, xv, yv


def test_two_rounds_match_finite_differences_and_adam():
  """K = 2: round 1 takes the one-step gradient (one round in the window), round 2 the
  gradient of the validation loss after replaying rounds 1 and 2 from round 1's starting
  model, both with the current outer variables; each Adam step checked by hand."""
  with jax.enable_x64(True):
    model, rng, theta0, xv, yv = _setup()
    r1, r2 = _round_inputs(theta0, rng), _round_inputs(theta0, rng)
    rule = learned_rule(model, xv, yv, D, SERVER_LR, OUTER_LR, learn_server_lr=True, learn_shrink=True, unroll=2)
    s0 = rule.init(theta0)
    apply = jax.jit(rule.apply)
    theta1, s1 = apply(s0, theta0, Stacked(*r1))
    theta2, s2 = apply(s1, theta1, Stacked(*r2))

    loss1 = lambda o: _ce_np(model, _aggregate_np(o, theta0, *r1), xv, yv)
    loss2 = lambda o: _ce_np(model, _aggregate_np(o, _aggregate_np(o, theta0, *r1), *r2), xv, yv)
    b1, b2, eps = 0.9, 0.999, 1e-8                         # optax.adam's defaults
    g1 = _fd(loss1, np.zeros(D + 2))
    m, v = (1 - b1) * g1, (1 - b2) * g1 ** 2
    o1 = -OUTER_LR * (m / (1 - b1)) / (np.sqrt(v / (1 - b2)) + eps)
    np.testing.assert_allclose(_outer(s1), o1, rtol=1e-6, atol=1e-9)
    g2 = _fd(loss2, o1)
    m, v = b1 * m + (1 - b1) * g2, b2 * v + (1 - b2) * g2 ** 2
    o2 = o1 - OUTER_LR * (m / (1 - b1 ** 2)) / (np.sqrt(v / (1 - b2 ** 2)) + eps)
    np.testing.assert_allclose(_outer(s2), o2, rtol=1e-6, atol=1e-9)
    # the aggregate of round 2 is its own round's eq. (2) at the new outer variables
    for a, b in zip(jax.tree.leaves(theta2), jax.tree.leaves(_aggregate_np(_outer(s2), theta1, *r2))):
      np.testing.assert_allclose(np.asarray(a), b, rtol=1e-10, atol=1e-12)
    # the two-round gradient is not the one-step gradient of round 2 alone
    one_step = _fd(lambda o: _ce_np(model, _aggregate_np(o, theta1, *r2), xv, yv), o1)
    assert np.abs(one_step - g2).max() > 1e-3 * np.abs(g2).max()


def test_replay_gradient_matches_finite_differences_with_and_without_remat():
  """The replay's gradient at a random point, K = 3 with all three rounds in the window,
  and with only the last two (the first round in the window not yet filled)."""
  with jax.enable_x64(True):
    model, rng, theta, xv, yv = _setup()
    K = 3
    stack = lambda n: (lambda p: jnp.zeros((K,) + n + p.shape, p.dtype))
    window = Window(jax.tree.map(stack(()), theta), jax.tree.map(stack((D,)), theta), jnp.zeros((K, D)))
    starts, inputs = [], []
    for _ in range(K):
      r = _round_inputs(theta, rng)
      starts.append(theta)
      inputs.append(r)
      window = push(window, theta, *r)
      theta = _aggregate_np(np.zeros(D + 2), theta, *r)
    o = rng.normal(size=D + 2) * 0.3
    split = lambda o: (jnp.asarray(o[:D]), jnp.asarray(o[D]), jnp.asarray(o[D + 1]))
    for filled in (3, 2):
      def loss_np(o, filled=filled):
        th = starts[K - filled]
        for r in inputs[K - filled:]:
          th = _aggregate_np(o, th, *r)
        return _ce_np(model, th, xv, yv)
      want = _fd(loss_np, o)
      for remat in (True, False):
        f = lambda o, remat=remat, filled=filled: optax_ce(model, replay(split(o), window, filled, SERVER_LR, remat), xv, yv)
        value, grad = jax.jit(jax.value_and_grad(f))(jnp.asarray(o))  # one program, not one per primitive
        np.testing.assert_allclose(float(value), loss_np(o), rtol=1e-10)
        np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-6, atol=1e-9)


def optax_ce(model, params, x, y):
  import optax
  return optax.softmax_cross_entropy_with_integer_labels(model.apply(params, x), y).mean()


def test_k1_window_is_the_one_step_rule():
  """A one-round window replays exactly the one-step aggregate (value and gradient), and the
  K-round rule's first round (one round in its window) equals the one-step rule's."""
  with jax.enable_x64(True):
    model, rng, theta, xv, yv = _setup()
    r = _round_inputs(theta, rng)
    one = lambda p: jnp.zeros((1,) + p.shape, p.dtype)
    window = push(Window(jax.tree.map(one, theta), jax.tree.map(lambda p: jnp.zeros((1, D) + p.shape), theta),
                         jnp.zeros((1, D))), theta, *r)
    o = tuple(jnp.asarray(v) for v in (rng.normal(size=D) * 0.3, 0.2, -0.1))
    direct = lambda o: optax_ce(model, aggregate(o, theta, *r, SERVER_LR), xv, yv)
    replayed = lambda o: optax_ce(model, replay(o, window, 1, SERVER_LR), xv, yv)
    (v_rep, g_rep), (v_dir, g_dir) = (jax.jit(jax.value_and_grad(f))(o) for f in (replayed, direct))
    np.testing.assert_allclose(float(v_rep), float(v_dir), rtol=1e-12)
    for a, b in zip(g_rep, g_dir):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-14)

    rules = [learned_rule(model, xv, yv, D, SERVER_LR, OUTER_LR, learn_server_lr=True, learn_shrink=True, unroll=k)
             for k in (1, 4)]
    (p1, s1), (p4, s4) = [jax.jit(rule.apply)(rule.init(theta), theta, Stacked(*r)) for rule in rules]
    np.testing.assert_allclose(_outer(s4), _outer(s1), rtol=1e-10, atol=1e-14)
    for a, b in zip(jax.tree.leaves(p4), jax.tree.leaves(p1)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-14)


def test_runs_in_the_runner(tiny_config):
  tiny_config.algorithm.name = "learned_agg"
  tiny_config.algorithm.learned.unroll = 3
  tiny_config.algorithm.learned.outer_lr = 0.2
  state = run_config(tiny_config, 4)
  learned = state.server.opt_state
  assert int(learned.round) == 4 and learned.window.mass.shape == (3, 6)
  logits = np.asarray(learned.logits)
  assert np.all(np.isfinite(logits)) and np.abs(logits[[1, 2, 3, 4]]).max() > 0 and logits[0] == logits[5] == 0


def test_k_larger_than_the_run_is_refused(tiny_config):
  from fedjax_dg.algorithms import build_algorithm
  from fedjax_dg.algorithms.base import make_schedule
  tiny_config.algorithm.name = "learned_agg"
  tiny_config.algorithm.learned.unroll = 7
  with pytest.raises(ValueError, match=r"algorithm.learned.unroll: K=7 is larger than the run \(num_rounds=6\)"):
    build_algorithm(tiny_config, tiny_mlp(), make_schedule(4, 2, 1, 10, 5), 8, 8,
                    heldout_val=(np.zeros((2, 6)), np.zeros(2, int)))


def test_weight_figure_is_regenerated_byte_for_byte(tmp_path):
  """The figure of the learned weights, drawn twice from the committed weight files: the
  same bytes, and no date or software name in the PNG's metadata."""
  import glob
  import importlib.util
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  spec = importlib.util.spec_from_file_location(
      "plot_weights", os.path.join(root, "experiments", "learned_aggregation", "plot_weights.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  files = sorted(glob.glob(mod.DEFAULT_GLOB))
  assert len(files) >= 4
  outs = [str(tmp_path / f"w{k}.png") for k in range(2)]
  for out in outs:
    mod.main(files[:2] + ["--out", out])
  a, b = (open(o, "rb").read() for o in outs)
  assert a == b and a[:8] == b"\x89PNG\r\n\x1a\n"
  assert b"tIME" not in a and b"Software" not in a and b"matplotlib" not in a
