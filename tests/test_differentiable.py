"""Gradients through rounds against central finite differences in float64."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dg.algorithms.base import make_schedule
from fedjax_dg.engine import init_round_state, make_round
from fedjax_dg.engine.differentiable import run_rounds, with_server_lr
from helpers import method, ragged_store, sgd_config, tiny_mlp


def test_grad_wrt_aggregation_weights_and_server_lr_matches_finite_differences():
  with jax.enable_x64(True):
    st = jax.tree.map(jnp.asarray, ragged_store())
    st = st._replace(x=st.x.astype(jnp.float64))
    C = st.counts.shape[0]
    model = tiny_mlp()
    params = jax.tree.map(lambda a: a.astype(jnp.float64), model.init(jax.random.PRNGKey(0)))
    sched = make_schedule(4, 3, 1, int(st.counts.max()), int(st.counts.min()))
    alg = method({"algorithm.name": "fedavgm", **sgd_config(0.3), **sgd_config(1.0, 0.5, prefix="server")}, model,
                 sched, C, builder=True)  # eta_g lives in the round state's hyperparameters
    rf = make_round(alg, C, C, "vmap")
    state0 = init_round_state(alg, None, params, C)
    keys = [jax.random.PRNGKey(t) for t in range(2)]
    xv = jax.random.normal(jax.random.PRNGKey(9), (40, 6), jnp.float64)
    yv = jax.random.randint(jax.random.PRNGKey(8), (40,), 0, 3)

    def val_loss(logit_w, server_lr):
      state = with_server_lr(state0, server_lr)
      out = run_rounds(rf, state, st, keys, jax.nn.softmax(logit_w))
      return optax.softmax_cross_entropy_with_integer_labels(model.apply(out.server.params, xv), yv).mean()

    a0 = jnp.asarray(np.random.default_rng(0).normal(size=C) * 0.5)
    lr0 = jnp.asarray(0.8)
    ga, glr = jax.jit(jax.grad(val_loss, argnums=(0, 1)))(a0, lr0)
    val_loss = jax.jit(val_loss)  # one program for the finite differences, not one per primitive
    eps = 1e-6
    fd = np.array([(val_loss(a0.at[i].add(eps), lr0) - val_loss(a0.at[i].add(-eps), lr0)) / (2 * eps) for i in range(C)])
    np.testing.assert_allclose(np.asarray(ga), fd, rtol=1e-5, atol=1e-9)
    fd_lr = (val_loss(a0, lr0 + eps) - val_loss(a0, lr0 - eps)) / (2 * eps)
    np.testing.assert_allclose(float(glr), float(fd_lr), rtol=1e-5)
    assert np.abs(np.asarray(ga)).max() > 1e-6  # the weights matter
