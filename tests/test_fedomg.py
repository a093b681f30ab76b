"""FedOMG's direction against an independent float64 NumPy implementation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dg.algorithms.base import LocalSchedule
from fedjax_dg.algorithms.fedomg import omg_direction
from helpers import method, ragged_store, run_from, sgd_config, tiny_mlp, tree_max_diff


def numpy_omg(G, kappa, lr=25.0, mu=0.5, steps=20):
  """docs/ALGORITHMS.md's FedOMG step, written with the analytic gradient of the softmax chain."""
  G = np.asarray(G, np.float64)
  N = len(G)
  GG = G @ G.T
  s = np.mean(np.sqrt(np.diag(GG) + 1e-4))
  M = GG / s ** 2
  b = M.mean(1)
  c = kappa * np.sqrt(b.mean() + 1e-4)

  def softmax(w):
    e = np.exp(w - w.max())
    return e / e.sum()

  def F(w):
    g = softmax(w)
    return g @ b + c * np.sqrt(g @ M @ g + 1e-4)

  def grad(w):
    g = softmax(w)
    u = b + c * (M @ g) / np.sqrt(g @ M @ g + 1e-4)   # dF/dGamma
    return g * (u - g @ u)                              # through the softmax Jacobian

  w, v = np.zeros(N), np.zeros(N)
  best_w, best_f = w.copy(), F(w)
  for _ in range(steps):
    v = mu * v + grad(w)
    w = w - lr * v
    if F(w) < best_f:
      best_w, best_f = w.copy(), F(w)
  g = softmax(best_w)
  return (G.mean(0) + c / np.sqrt(g @ M @ g + 1e-4) * (g @ G)) / (1 + kappa ** 2)


@pytest.mark.parametrize("N", [2, 3, 10, 50])
@pytest.mark.parametrize("kappa", [0.2, 0.5, 0.9])
def test_omg_direction_matches_numpy(N, kappa):
  rng = np.random.default_rng(N)
  G = rng.normal(size=(N, 37)) + rng.normal(size=37)  # correlated rows, as client updates are
  direction = jax.jit(lambda g: omg_direction(g, kappa))  # one program, not one per primitive
  with jax.enable_x64(True):
    d = np.asarray(direction(jnp.asarray(G)))
  np.testing.assert_allclose(d, numpy_omg(G, kappa), rtol=1e-9, atol=1e-12)
  d32 = np.asarray(direction(jnp.asarray(G, jnp.float32)))
  np.testing.assert_allclose(d32, numpy_omg(G, kappa), rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize("N", [2, 3, 10, 50])
def test_kappa_zero_is_the_mean_and_identical_updates_scale(N):
  G = np.random.default_rng(0).normal(size=(N, 11)).astype(np.float32)
  direction = jax.jit(omg_direction, static_argnums=1)
  np.testing.assert_allclose(direction(G, 0.0), G.mean(0), rtol=1e-6, atol=1e-7)
  same = np.tile(G[:1], (N, 1))
  kappa = 0.5
  np.testing.assert_allclose(direction(same, kappa), G[0] * (1 + kappa) / (1 + kappa ** 2), rtol=1e-3)


def test_mask_ignores_padding_rows():
  G = np.random.default_rng(1).normal(size=(5, 9)).astype(np.float32)
  padded = np.concatenate([G, np.random.default_rng(2).normal(size=(3, 9)).astype(np.float32)])
  mask = np.array([1] * 5 + [0] * 3)
  direction = jax.jit(omg_direction, static_argnums=1)
  np.testing.assert_allclose(direction(padded, 0.5, mask=mask), direction(G, 0.5), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["vmap", "chunked", "host_loop"])
def test_fedomg_kappa_zero_round_is_fedavg_scaled(strategy):
  """FedOMG at kappa = 0 with the same server step size equals FedAvg (the rule carries
  FedAvg's scale), whatever the strategy and however the cohort is padded."""
  st = ragged_store()
  C = len(st.counts)
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=4, epochs=0, passes=3, unroll=1)
  S = 5
  common = {**sgd_config(0.1), "server.lr": 1.0}
  omg = method({"algorithm.name": "fedomg", "algorithm.omg.kappa": 0.0, **common}, model, sched, C, S, builder=True)
  avg = method({"algorithm.name": "fedavg", **common}, model, sched, C, S, builder=True)
  out = [run_from(alg, params, st, C, S, 3, strategy, chunk_size=2).server.params for alg in (omg, avg)]
  assert tree_max_diff(out[0], out[1]) < 1e-5


def authors_omg(G, kappa, num_tasks=None, final_eps=1e-4):
  """float64 NumPy transcription of FedOMG's `FedOMG-DG/algorithms/FedOMG/utils/fed_merge.py:
  OMG` (torch SGD with momentum on `w`, `for i in range(21)`: the objective at every `i`,
  a step while `i < 20`); `final_eps` is the code's `+ 1e-4` in `lmbda`'s denominator."""
  G = np.asarray(G, np.float64)
  N = num_tasks or len(G)
  GG = G @ G.T
  scale = np.mean(np.sqrt(np.diag(GG) + 1e-4))
  GG = GG / scale ** 2
  Gg = GG.mean(1)
  c = np.sqrt(Gg.mean() + 1e-4) * kappa
  softmax = lambda w: np.exp(w - w.max()) / np.exp(w - w.max()).sum()
  obj = lambda w: softmax(w) @ Gg + c * np.sqrt(softmax(w) @ GG @ softmax(w) + 1e-4)

  def grad(w):
    ww = softmax(w)
    u = Gg + c * (GG @ ww) / np.sqrt(ww @ GG @ ww + 1e-4)
    return ww * (u - ww @ u)

  w, buf, w_best, obj_best = np.zeros(N), None, None, np.inf
  for i in range(21):
    if obj(w) < obj_best:
      obj_best, w_best = obj(w), w.copy()
    if i < 20:
      g = grad(w)
      buf = g if buf is None else 0.5 * buf + g      # torch.optim.SGD(momentum=0.5), dampening 0
      w = w - 25.0 * buf
  ww = softmax(w_best)
  lmbda = c / (np.sqrt(ww @ GG @ ww + 1e-4) + final_eps)
  return ((1 / N + ww * lmbda)[:, None] * G).sum(0) / (1 + kappa ** 2)


def test_configured_solver_is_the_authors_loop():
  """The PACS FedOMG protocol's solver settings give the authors' `OMG` (with its final
  `1e-4` dropped, the documented deviation), on three clients as in its PACS runs."""
  import importlib.util
  import os
  from fedjax_dg.algorithms import RULES, hparams_of
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "pacs.py")
  spec = importlib.util.spec_from_file_location("pacs_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  hp = hparams_of(module.get_config("fedomg"), RULES["omg"])
  worst = 0.0
  for seed in range(8):
    rng = np.random.default_rng(seed)
    G = rng.normal(size=(3, 41)) * rng.uniform(0.2, 3.0, size=(3, 1)) + rng.normal(size=41)
    with jax.enable_x64(True):
      d = np.asarray(omg_direction(jnp.asarray(G), hp.kappa, hp.lr, hp.momentum, hp.steps))
    want = authors_omg(G, hp.kappa, final_eps=0.0)
    worst = max(worst, float(np.max(np.abs(d - want))))
  assert worst < 1e-9, worst


# fedprox in the slow suite: the rule acts on the clients' messages only; "fedavg" covers a
# plain objective client, as FedProx's is, and "irm" one with a broadcast of its own.
@pytest.mark.parametrize("base", ["fedavg", pytest.param("fedprox", marks=pytest.mark.slow), "irm"])
def test_x_plus_omg_at_kappa_zero_is_x_from_the_config_defaults(tiny_config, base):
  """`X+omg` with `kappa = 0` and the default `server.lr` equals `X` (FedAvg's rule): the
  rule carries FedAvg's scale, built as the runner builds it from the config."""
  from helpers import run_config
  tiny_config.num_clients = 6
  tiny_config.client.local_steps = 3
  out = {}
  for name in (base, base + "+omg"):
    c = tiny_config.copy_and_resolve_references()
    c.algorithm.name = name
    c.algorithm.omg.kappa = 0.0
    out[name] = run_config(c, 2).server.params
  assert tiny_config.server.lr == 1.0
  assert tree_max_diff(out[base], out[base + "+omg"]) < 1e-5
