"""Hyperparameters are run-time values: the round state carries them (`RoundState.hparams`),
so runs that differ only in them are one `vmap` of the round, and a loss after some rounds
is differentiable in them. Every method is built from a config, as the runner builds it."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import tree_max_diff


def _config(tiny_config, name: str, strategy: str = "sequential"):
  c = tiny_config
  c.algorithm.name = name
  c.model.hidden = (16,)
  c.num_clients = 4
  c.client.local_steps = 2
  c.engine.strategy = strategy
  c.engine.chunk_size = 2
  c.algorithm.irm.anneal_steps = 0   # the penalty weight applies from the first step
  return c


def _setup(c):
  from fedjax_dg import plan as plan_lib
  from fedjax_dg.data import datasets, splits
  fold = splits.fold_from_config(datasets.load_dataset(c.data), c.data)
  return plan_lib.prepare(c, fold), fold


def _start(s, c, hparams=None):
  from fedjax_dg.engine import init_round_state
  k_init, k_server, _ = jax.random.split(jax.random.PRNGKey(c.seed), 3)
  stage = s.stages[0]
  return init_round_state(stage.builder, k_server, s.model.init(k_init), s.num_clients, hparams=hparams)


def _other(hparams, changes):
  """`hparams` with `changes` ({(group, field): value}) applied."""
  out = {g: dict(d) for g, d in hparams.items()}
  for (g, f), v in changes.items():
    out[g][f] = jnp.asarray(v, out[g][f].dtype)
  return out


CHANGES = {"fedavg": {}, "fedprox": {("method", "mu"): 0.5}, "irm": {("method", "lam"): 10.0},
           "scaffold": {}, "fediir": {("method", "gamma"): 0.5, ("method", "ema"): 0.5}}


@pytest.mark.parametrize("strategy", ["sequential"] + [pytest.param(s, marks=pytest.mark.slow)
                                                      for s in ("vmap", "chunked", "host_loop")])
def test_vmap_over_hyperparameters_equals_separate_runs(tiny_config, strategy):
  """Two round states that differ only in their hyperparameters (the client step size and
  the method's own weight), run as one `jax.vmap` of two rounds, equal the two runs done
  one after the other; and the two runs differ (the values are read, not baked in)."""
  for name, changes in CHANGES.items():
    c = _config(tiny_config.copy_and_resolve_references(), name, strategy)
    c.client.momentum = 0.0 if name == "scaffold" else 0.5
    s, _ = _setup(c)
    round_fn = s.stages[0].round_fn
    store = jax.tree.map(jnp.asarray, s.packed)
    a = _start(s, c)
    b = a._replace(hparams=_other(a.hparams, {("client", "lr"): 0.03, **changes}))
    keys = [jax.random.PRNGKey(7 + t) for t in range(2)]

    def run(state):
      for k in keys:
        state, _ = round_fn(state, store, k)
      return state

    separate = [run(a).server.params, run(b).server.params]
    both = jax.vmap(run)(jax.tree.map(lambda x, y: jnp.stack([x, y]), a, b)).server.params
    for i in range(2):
      assert tree_max_diff(jax.tree.map(lambda t: t[i], both), separate[i]) < 1e-5, (name, i)
    assert tree_max_diff(separate[0], separate[1]) > 1e-3, name


def _val_loss_after_rounds(tiny_config):
  """`f(hparams)`: the validation cross-entropy after 2 FedProx rounds from fixed
  parameters, everything in float64."""
  c = _config(tiny_config, "fedprox", "sequential")
  c.client.momentum = 0.0
  s, fold = _setup(c)
  round_fn = s.stages[0].round_fn
  f64 = lambda t: jax.tree.map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a, t)
  store = f64(jax.tree.map(jnp.asarray, s.packed))
  state = f64(_start(s, c))
  val = fold.eval_splits()["heldout_val"]
  xv, yv = jnp.asarray(val.x[:64], jnp.float64), jnp.asarray(val.y[:64])
  model = s.model

  def f(hparams):
    st = state._replace(hparams=hparams)
    for t in range(2):
      st, _ = round_fn(st, store, jax.random.PRNGKey(t))
    logits = model.apply(st.server.params, xv)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, yv))
  return f, state.hparams


# In the slow suite: by default test_meta.py's exact hypergradient ("sequential") checks
# d/d client.lr and d/d method.mu of FedProx's rounds against finite differences in float64.
@pytest.mark.slow
def test_gradient_in_mu_and_client_lr_matches_finite_differences(tiny_config):
  """d(validation loss after 2 rounds) / d(FedProx's mu) and / d(client.lr) by autodiff
  through the rounds equal central finite differences, in float64."""
  with jax.enable_x64(True):
    f, hp = _val_loss_after_rounds(tiny_config)
    hp = _other(hp, {("method", "mu"): 0.3})
    grads = jax.grad(f)(hp)
    for group, field, h in (("method", "mu", 1e-4), ("client", "lr", 1e-5)):
      up, down = (_other(hp, {(group, field): float(hp[group][field]) + d}) for d in (h, -h))
      fd = (float(f(up)) - float(f(down))) / (2 * h)
      got = float(grads[group][field])
      assert abs(fd) > 1e-6, (field, fd)   # the loss depends on it
      np.testing.assert_allclose(got, fd, rtol=1e-5, err_msg=field)
