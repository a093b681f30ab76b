"""FedGMA's masked server step against NumPy, and tau = 0 is FedAvg."""
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_dg.algorithms.base import LocalSchedule, Stacked
from fedjax_dg.algorithms.fedgma import gma_rule
from helpers import method, ragged_store, run_from, sgd_config, tiny_mlp, tree_max_diff


def test_gma_step_matches_numpy():
  rng = np.random.default_rng(0)
  deltas = rng.normal(size=(5, 7))
  deltas[:, 0] = np.abs(deltas[:, 0])             # full agreement on coordinate 0
  weights = np.array([3.0, 1.0, 2.0, 4.0, 0.0])   # the last member is padding
  theta = rng.normal(size=7)
  lr, tau = 0.7, 0.5
  real = deltas[:4]
  agree = np.abs(np.sign(real).mean(0))
  mask = np.where(agree >= tau, 1.0, agree)
  expect = theta + lr * mask * ((weights[:4] / weights[:4].sum()) @ real)
  got, _ = gma_rule(lr, tau).apply((), jnp.asarray(theta), Stacked(jnp.asarray(deltas), jnp.asarray(weights)))
  np.testing.assert_allclose(np.asarray(got), expect, rtol=1e-6)
  assert mask[0] == 1.0 and (mask < 1).any()


def test_threshold_zero_is_fedavg():
  st = ragged_store()
  C = len(st.counts)
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=4, epochs=1, passes=1, unroll=1)
  common = {**sgd_config(0.1), "server.lr": 0.8}
  out = [run_from(alg, params, st, C, 4, 3, "chunked", chunk_size=3).server.params
         for alg in (method({"algorithm.name": "fedgma", "algorithm.gma.tau": 0.0, **common}, model, sched, C, 4),
                     method({"algorithm.name": "fedavg", **common}, model, sched, C, 4))]
  assert tree_max_diff(out[0], out[1]) < 1e-6
