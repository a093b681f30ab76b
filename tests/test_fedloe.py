"""FedLOE stage 2: the invariant manager's penalties in float64 NumPy, and head averaging."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_dg.algorithms.base import LocalSchedule
from fedjax_dg.algorithms.fedloe import (fish_manager, invariance_penalty, manager_objective, per_client_losses,
                                         solve_manager, stage2)
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
    penalty = jax.jit(invariance_penalty, static_argnums=0)  # one program per kind, not one per primitive
    np.testing.assert_allclose(jax.jit(per_client_losses)(*args), R, rtol=1e-10)
    np.testing.assert_allclose(penalty("irm", *args), np.sum(dw ** 2), rtol=1e-9)
    np.testing.assert_allclose(penalty("rex", *args), np.var(R), rtol=1e-9)   # eq. (3): Var
    gram = gphi @ gphi.T
    np.testing.assert_allclose(penalty("fish", *args), -(gram.sum() - np.trace(gram)), rtol=1e-9)
    w = np.array([3.0, 1.0, 2.0])
    lam = 0.7
    expect = np.sum(w / w.sum() * R) + lam * np.sum(dw ** 2)
    objective = jax.jit(manager_objective, static_argnums=5)
    np.testing.assert_allclose(objective(*args, jnp.asarray(w), "irm", lam), expect, rtol=1e-9)


@pytest.mark.parametrize("kind", ["irm", "rex", "none"])
def test_solver_lowers_the_objective(kind):
  logits, y, mask, _ = _problem(1)
  args = (jnp.asarray(logits, jnp.float32), jnp.asarray(y), jnp.asarray(mask, jnp.float32))
  w = jnp.ones(Cp)
  phi = jax.jit(solve_manager, static_argnums=(4, 6))(*args, w, kind, 1.0, 100, 0.05)
  objective = jax.jit(manager_objective, static_argnums=5)
  start = objective(jnp.full(C, 1.0 / C), *args, w, kind, 1.0)
  assert float(objective(phi, *args, w, kind, 1.0)) < float(start)


def test_fish_manager_matches_numpy():
  """Fish's first-order update on phi: per step, one SGD step on each reporting client's risk
  in turn, then phi + meta_lr (phi~ - phi) (float64 NumPy with the analytic gradient)."""
  logits, y, mask, _ = _problem(2)
  w = np.array([1.0, 0.0, 2.0])  # client 1 does not report
  steps, lr, meta = 3, 0.3, 0.05
  phi = np.full(C, 1.0 / C)
  for _ in range(steps):
    pt = phi.copy()
    for m in range(Cp):
      if w[m] == 0:
        continue
      pt = pt - lr * _np_parts(logits, y, mask, pt)[2][m]
    phi = phi + meta * (pt - phi)
  with jax.enable_x64(True):
    got = fish_manager(jnp.asarray(logits), jnp.asarray(y), jnp.asarray(mask), jnp.asarray(w), steps, lr, meta)
  np.testing.assert_allclose(np.asarray(got), phi, rtol=1e-9)


def test_fedloe_fish_never_inverts_good_heads():
  """Heads that are each good on the tuning data: Fish's combination (Table 5's meta lr) is not
  worse on the tuning split than the best single head by more than 0.05 in mean CE, where
  the penalty form of App. C.1 runs off (its objective is unbounded below)."""
  rng = np.random.default_rng(3)
  y = rng.integers(0, K, (Cp, 40))
  onehot = np.eye(K)[y]
  logits = 3.0 * onehot[:, :, None, :] + 0.5 * rng.normal(size=(Cp, 40, C, K))   # every head right, noisy
  mask = np.ones((Cp, 40))
  args = (jnp.asarray(logits, jnp.float32), jnp.asarray(y), jnp.asarray(mask, jnp.float32))
  w = jnp.ones(Cp)
  mean_ce = lambda phi: float(jnp.mean(per_client_losses(phi, *args)))
  best_single = min(mean_ce(jnp.eye(C)[c]) for c in range(C))
  phi = solve_manager(*args, w, "fish", 100.0, steps=200, lr=0.05, meta_lr=0.05)
  assert mean_ce(phi) <= best_single + 0.05
  penalty_phi = solve_manager(*args, w, "irm", 0.0, steps=0, lr=0.05)   # uniform start, for scale
  assert mean_ce(penalty_phi) < 1.0


def test_stage2_with_lambda_zero_and_no_solver_is_head_averaging():
  from fedjax_dg.engine import init_round_state, make_round
  st = ragged_store(sizes=(8, 6, 9))
  tune = ragged_store(sizes=(3, 2, 3), seed=1)
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=3, batch_size=4, epochs=1, passes=1, unroll=1)
  alg = stage2(model, sched, optax.sgd(0.1), tune, "irm", 0.0, 3, solver_steps=0)
  state0 = init_round_state(alg, None, params, 3)
  out = {}
  for strategy in ("vmap", "host_loop"):
    out[strategy], _ = make_round(alg, 3, 3, strategy)(state0, jax.tree.map(jnp.asarray, st), jax.random.PRNGKey(0))
  assert tree_max_diff(out["vmap"], out["host_loop"]) < 1e-5
  s = out["vmap"].server
  mean_head = jax.tree.map(lambda h: h.mean(0), s.heads)
  assert tree_max_diff(s.params["classifier"], mean_head) < 1e-6
  assert tree_max_diff(s.heads, state0.server.heads) > 1e-4           # every client trained its own head
  assert tree_max_diff(jax.tree.map(lambda h: h[0], s.heads), jax.tree.map(lambda h: h[1], s.heads)) > 1e-4
  assert tree_max_diff(s.params["featurizer"], params["featurizer"]) == 0.0   # the featurizer stays frozen


def test_stage2_on_uint8_images_equals_its_float_copy():
  """Stage 2 reads inputs through the model's preprocessing: a uint8 store and its [0, 1]
  float copy give the same heads and combination."""
  import ml_collections
  from fedjax_dg.engine import init_round_state, make_round
  from fedjax_dg.models import build_model
  rng = np.random.default_rng(0)
  x8 = rng.integers(0, 256, (3, 6, 8, 8, 1)).astype(np.uint8)
  yy = rng.integers(0, 3, (3, 6)).astype(np.int32)
  dom = np.zeros((3, 6), np.int32)
  counts = np.array([6, 5, 6], np.int32)
  model = build_model(ml_collections.ConfigDict({"name": "cnn", "hidden": ()}), (8, 8, 1), 3)
  params = model.init(jax.random.PRNGKey(0))
  sched = LocalSchedule(num_steps=2, batch_size=3, epochs=0, passes=1, unroll=True)
  res = []
  for x in (x8, x8.astype(np.float32) / 255.0):
    store = ClientStore(x, yy, dom, counts)
    tune = ClientStore(x[:, :3], yy[:, :3], dom[:, :3], np.array([3, 3, 3], np.int32))
    alg = stage2(model, sched, optax.sgd(0.1), tune, "irm", 1.0, 3, solver_steps=5)
    s, _ = make_round(alg, 3, 3, "vmap")(init_round_state(alg, None, params, 3), jax.tree.map(jnp.asarray, store),
                                         jax.random.PRNGKey(1))
    res.append(s.server)
  assert tree_max_diff(res[0], res[1]) < 1e-5


def _np_ce_and_grad(z, y):
  """Mean softmax cross-entropy of logits `z` and its gradient in `z`."""
  p = np.exp(z - z.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  onehot = np.eye(z.shape[1])[y]
  return float(np.mean(-np.log(p[onehot > 0]))), (p - onehot) / len(y)


def _np_stage2(st, tune, W, b, syncs, head_steps, head_lr, solver_steps, solver_lr):
  """Alg. 1's stage 2 in float64 NumPy, features frozen (the identity here): at each sync
  every client runs `head_steps` full-batch gradient steps on its head from the broadcast
  head (the stage-1 head, then eq. (12)'s combination), the server solves eq. (11) without
  penalty by Adam from uniform `phi` (data-size weights), and every head becomes
  `sum_c phi_c psi_c` (eq. 12)."""
  C = len(st.counts)
  psi = (W.copy(), b.copy())
  for _ in range(syncs):
    heads = []
    for c in range(C):                                      # 2.1: from the broadcast head
      n = int(st.counts[c])
      x, y = st.x[c, :n].astype(np.float64), st.y[c, :n]
      Wc, bc = psi[0].copy(), psi[1].copy()
      for _ in range(head_steps):
        _, gz = _np_ce_and_grad(x @ Wc + bc, y)
        Wc, bc = Wc - head_lr * x.T @ gz, bc - head_lr * gz.sum(0)
      heads.append((Wc, bc))
    tunes = [(tune.x[m, :int(tune.counts[m])].astype(np.float64), tune.y[m, :int(tune.counts[m])])
             for m in range(C)]
    yhat = [np.stack([x @ h[0] + h[1] for h in heads], 1) for x, _ in tunes]   # [n, C, K] per client
    p = np.array([len(y) for _, y in tunes], np.float64)
    p /= p.sum()
    phi, m1, m2 = np.full(C, 1.0 / C), np.zeros(C), np.zeros(C)
    for t in range(1, solver_steps + 1):                    # eq. (11) by Adam (optax defaults)
      g = sum(p[m] * np.einsum("nk,nck->c", _np_ce_and_grad(np.einsum("c,nck->nk", phi, yhat[m]), tunes[m][1])[1],
                               yhat[m]) for m in range(C))
      m1, m2 = 0.9 * m1 + 0.1 * g, 0.999 * m2 + 0.001 * g ** 2
      phi = phi - solver_lr * (m1 / (1 - 0.9 ** t)) / (np.sqrt(m2 / (1 - 0.999 ** t)) + 1e-8)
    psi = (sum(f * h[0] for f, h in zip(phi, heads)), sum(f * h[1] for f, h in zip(phi, heads)))   # eq. (12)
  return psi, phi


def test_stage2_clients_continue_from_the_combined_head_over_two_syncs():
  """Eq. (12) over two synchronisations: the mixing weights and the combined head against a
  float64 transcription, where every client starts the second sync from the first sync's
  combined head (not from its own previous head)."""
  from helpers import run_from
  st = ragged_store(sizes=(8, 6, 9))
  tune = ragged_store(sizes=(5, 4, 6), seed=1)
  model = tiny_mlp(hidden=())
  params = model.init(jax.random.PRNGKey(0))
  n_max, steps, lr, solver_steps, solver_lr = st.x.shape[1], 3, 0.5, 30, 0.1
  sched = LocalSchedule(num_steps=steps, batch_size=n_max, epochs=steps, passes=steps, unroll=1)  # full batches
  alg = stage2(model, sched, optax.sgd(lr), tune, "none", 0.0, 3, solver_steps=solver_steps, solver_lr=solver_lr)
  state = run_from(alg, params, st, 3, 3, 2)
  dense = params["classifier"]["Dense_0"]
  (W, b), phi = _np_stage2(st, tune, np.asarray(dense["kernel"], np.float64), np.asarray(dense["bias"], np.float64),
                           2, steps, lr, solver_steps, solver_lr)
  np.testing.assert_allclose(np.asarray(state.server.phi, np.float64), phi, rtol=1e-4, atol=1e-5)
  got = state.server.params["classifier"]["Dense_0"]
  np.testing.assert_allclose(np.asarray(got["kernel"], np.float64), W, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got["bias"], np.float64), b, rtol=1e-4, atol=1e-5)


def test_stage1_shares_the_run_budget_in_few_synchronisations():
  """Stage 1 is `|T1_sync|` rounds of FedAvg whose local steps, with stage 2's head steps,
  fit the budget every other method gets (`num_rounds * K`)."""
  from fedjax_dg.algorithms.fedloe import stage1_schedule
  assert stage1_schedule(60, 5, 8, 4 * 2) == (8, 36)            # 292 steps left: 8 syncs of 36
  assert stage1_schedule(60, 5, 0, 8) == (60, 5)                # 0: the config's schedule
  assert stage1_schedule(3, 1, 8, 0) == (3, 1)                  # no more syncs than steps
  for rounds, k, syncs, s2 in [(60, 5, 4, 8), (60, 1, 16, 8), (40, 3, 2, 0), (10, 7, 8, 30)]:
    r, steps = stage1_schedule(rounds, k, syncs, s2)
    assert r == min(syncs, rounds * k - s2) and steps >= 1 and r * steps + s2 <= rounds * k
    assert rounds * k - s2 - r * steps < r  # what is left over is less than one step per round
  with pytest.raises(ValueError, match="algorithm.fedloe.stage2_rounds"):
    stage1_schedule(2, 2, 8, 4)


def test_the_spec_runs_stage1_infrequently_and_evaluates_every_stage2_round():
  from fedjax_dg import algorithms
  from helpers import config_with
  spec = algorithms.METHODS["fedloe"]
  config = config_with({"algorithm.name": "fedloe", "num_rounds": 60})
  hp = algorithms.hparams_of(config, spec)
  rounds, steps = spec.first_stage(config, hp, 5)
  assert rounds == hp.stage1_syncs == 8 and rounds * steps + hp.stage2_rounds * hp.head_steps <= 60 * 5
  (stage2,) = spec.stages(hp)
  assert stage2.eval_every(config, hp) == 1 and stage2.rounds(config, hp) == hp.stage2_rounds
  assert "stage1_syncs" in algorithms.sample_hparams("fedloe", np.random.default_rng(0)).__str__()
