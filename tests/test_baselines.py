"""Mixup, Fish, GroupDRO, AFL, FedSR and FedDG against independent float64 NumPy versions."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings, strategies as st

from fedjax_dg.algorithms.afl import afl_objective, project_simplex
from fedjax_dg.algorithms.base import Batch, make_schedule
from fedjax_dg.algorithms.dg import mixup_loss, mixup_pairing
from fedjax_dg.algorithms.feddg import amplitude_bank, amplitude_mix, low_freq_window, other_clients
from fedjax_dg.algorithms.fedsr import fedsr_loss, gaussian_kl, probabilistic_model
from fedjax_dg.algorithms.fish import fish_step
from fedjax_dg.algorithms.groupdro import groupdro_loss
from fedjax_dg.engine import init_round_state, make_round
from fedjax_dg.objectives import domain_risks, domain_slots, mixup_partners, slot_mask
from helpers import method, ragged_store, sgd_config, tiny_mlp


def _method(name, fields, model, lr=0.1, **kw):
  """`name` with `algorithm.<name>.<field>` values from the config (local SGD at `lr`, FedAvg's
  rule at step 1) on 6 clients, built as the runner builds it."""
  overrides = {f"algorithm.{name}.{k}": v for k, v in fields.items()}
  return method({"algorithm.name": name, **overrides, **sgd_config(lr), "server.lr": 1.0}, model,
                make_schedule(4, 0, 1, 12, 3), 6, **kw)



def _softmax(z):
  p = np.exp(z - z.max(-1, keepdims=True))
  return p / p.sum(-1, keepdims=True)


def _ce(z, y):
  return -np.log(_softmax(z)[np.arange(len(y)), y])


def _linear(params):
  d = params["classifier"]["Dense_0"]
  return np.asarray(d["kernel"], np.float64), np.asarray(d["bias"], np.float64)


def _batch(seed=0, n=14, dim=6, classes=3, domains=(0, 2, 3), num_pad=3):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(n, dim)).astype(np.float32)
  y = rng.integers(0, classes, n).astype(np.int32)
  dom = rng.choice(domains, n).astype(np.int32)
  mask = np.ones(n, np.float32)
  mask[n - num_pad:] = 0
  return Batch(jnp.asarray(x), jnp.asarray(y), jnp.asarray(dom), jnp.asarray(mask))


def test_domain_risks_match_numpy():
  b = _batch()
  loss = np.random.default_rng(1).random(len(b.y))
  risks, present = domain_risks(jnp.asarray(loss, jnp.float32), b.domain, b.mask, 5)
  m, d = np.asarray(b.mask), np.asarray(b.domain)
  for e in range(5):
    sel = (d == e) & (m > 0)
    assert bool(present[e]) == sel.any()
    np.testing.assert_allclose(risks[e], loss[sel].mean() if sel.any() else 0.0, rtol=1e-6)


def _np_partners(d, m, domain_order):
  """DomainBed's random_pairs_of_minibatches as a Python loop: the present domains in
  `domain_order` (a sequence of domain ids), each paired with the next one, cyclically."""
  present = [e for e in domain_order if e in set(d[m].tolist())]
  rows = {e: [i for i in range(len(d)) if m[i] and d[i] == e] for e in present}
  want = np.arange(len(d))
  for k in range(len(d)):
    if not m[k]:
      continue
    e, r = d[k], rows[d[k]].index(k)
    if len(present) == 1:
      want[k] = rows[e][(r + 1) % len(rows[e])]
    else:
      nxt = present[(present.index(e) + 1) % len(present)]
      want[k] = rows[nxt][r % len(rows[nxt])]
  return want


def _slot_order(d, m, domain_order, size, seed=0):
  """The permutation of the `size` slots (present domains in ascending id, then the unused
  slots) that puts the present domains in `domain_order`'s order, with the unused slots
  scattered among them at random (they must not matter)."""
  present = sorted(set(d[m].tolist()))
  used = [present.index(e) for e in domain_order if e in present]
  out = list(used)
  for s in np.random.default_rng(seed).permutation(np.arange(len(present), size)):
    out.insert(int(np.random.default_rng(seed + int(s)).integers(0, len(out) + 1)), int(s))
  return np.asarray(out)


@pytest.mark.parametrize("domains,order,num_domains", [
    ((0, 2, 3), None, 5), ((1,), None, 5), ((0, 4), None, 5), ((0, 2, 3), (3, 0, 4, 2, 1), 5),
    ((0, 1, 2, 3, 4), (4, 2, 0, 1, 3), 5), ((4999, 17, 2500, 3), "random", 5000), ((4321,), None, 5000)])
def test_mixup_partners_match_a_python_loop(domains, order, num_domains):
  """DomainBed's random_pairs_of_minibatches: the present domains in the drawn order, each
  paired with the next one, cyclically. The order is passed over the batch's slots (the one
  a permutation of all `num_domains` domains induces); 5000 domains as Py150's thousands."""
  b = _batch(seed=3, n=17, domains=domains)
  d, m = np.asarray(b.domain), np.asarray(b.mask) > 0
  if order == "random":
    order = tuple(np.random.default_rng(0).permutation(num_domains).tolist())
  domain_order = order or range(num_domains)
  size = min(17, num_domains)
  slot_order = None if order is None else jnp.asarray(_slot_order(d, m, domain_order, size))
  got = np.asarray(mixup_partners(b.domain, b.mask, num_domains, slot_order))
  np.testing.assert_array_equal(got, _np_partners(d, m, domain_order))


def test_domain_slots_match_numpy():
  """Slots: the real rows' domain ids renumbered by ascending id (np.unique), padding and ids
  outside 0..D-1 at slot 0 with mask 0; S = min(B, D)."""
  d = np.array([4999, 7, 7, 1234, 4999, 0, 5000, 7, 3], np.int32)
  mask = np.array([1, 1, 1, 1, 1, 1, 1, 0, 0], np.float32)  # 5000 is out of range; last two padding
  slot, ids = domain_slots(jnp.asarray(d), jnp.asarray(mask), 5000)
  real = (mask > 0) & (d < 5000)
  uniq = np.unique(d[real])
  assert ids.shape == (9,)
  np.testing.assert_array_equal(np.asarray(ids), np.r_[uniq, [5000] * (9 - len(uniq))])
  np.testing.assert_array_equal(np.asarray(slot), np.where(real, np.searchsorted(uniq, d), 0))
  np.testing.assert_array_equal(np.asarray(slot_mask(jnp.asarray(d), jnp.asarray(mask), 5000)), real)
  assert domain_slots(jnp.asarray(d), jnp.asarray(mask), 3)[1].shape == (3,)  # S = min(B, D)


def _cycle(j, d, m):
  """The cyclic order of the present domains that partner indices `j` follow, as a tuple
  starting at the smallest id."""
  nxt = {int(d[k]): int(d[j[k]]) for k in range(len(d)) if m[k]}
  start = min(nxt)
  cyc, e = [start], nxt[start]
  while e != start:
    cyc.append(e)
    e = nxt[e]
  return tuple(cyc)


def test_mixup_pairing_order_is_uniform_over_the_present_domains():
  """With 4 domains present out of 5000, the drawn pairing follows each of the 3! = 6 cyclic
  orders of the present domains with probability 1/6 (DomainBed's uniformly random order of
  the domains' minibatches; binomial sd ~ 9 of 100 per order over 600 draws), and `lam` is
  one Beta draw per present domain."""
  b = _batch(seed=3, n=24, domains=(10, 2000, 30, 4999))
  d, m = np.asarray(b.domain), np.asarray(b.mask) > 0
  keys = jax.random.split(jax.random.PRNGKey(0), 600)
  js, lams = jax.jit(jax.vmap(lambda k: mixup_pairing(k, b, 5000, 0.5)))(keys)
  js, lams = np.asarray(js), np.asarray(lams)
  counts = {}
  for j in js:
    c = _cycle(j, d, m)
    counts[c] = counts.get(c, 0) + 1
  assert len(counts) == 6 and all(60 <= v <= 140 for v in counts.values()), counts
  for lam in lams[:20]:
    per = [set(lam[(d == e) & m].tolist()) for e in (10, 30, 2000, 4999)]
    assert all(len(p) == 1 for p in per) and len({p.pop() for p in per}) == 4


def test_mixup_loss_matches_numpy():
  model = tiny_mlp(hidden=())
  params = model.init(jax.random.PRNGKey(0))
  b = _batch(seed=4, domains=(0, 2, 3, 4990))
  rng, alpha, num_domains = jax.random.PRNGKey(7), 0.4, 5000
  got = jax.jit(lambda p, bb, r: mixup_loss(model, p, bb, r, alpha, num_domains))(params, b, rng)
  # the draws: one Beta per slot and a permutation of the S = min(B, D) slots (present domains by ascending id)
  x, y, d, m = (np.asarray(a, np.float64) for a in (b.x, b.y, b.domain, b.mask))
  y, d = y.astype(int), d.astype(int)
  present = sorted(set(d[m > 0].tolist()))
  size = min(len(d), num_domains)
  lam_s = np.asarray(jax.random.beta(rng, alpha, alpha, (size,)), np.float64)
  slot_order = np.asarray(jax.random.permutation(jax.random.fold_in(rng, 1), size))
  domain_order = [present[s] for s in slot_order if s < len(present)]
  j = _np_partners(d, m > 0, domain_order)
  W, c = _linear(params)
  lam = np.array([lam_s[present.index(e)] if mk else lam_s[0] for e, mk in zip(d, m > 0)])
  z = (lam[:, None] * x + (1 - lam[:, None]) * x[j]) @ W + c
  per = lam * _ce(z, y) + (1 - lam) * _ce(z, y[j])
  want = np.mean([per[(d == e) & (m > 0)].mean() for e in present])
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_mixup_pairing_order_is_drawn_each_step():
  """Over many steps every present domain is paired with every other (DomainBed's random
  order), not always with the same next domain as a fixed cyclic order would."""
  b = _batch(seed=3, n=40, domains=(0, 1, 2, 3))
  d = np.asarray(b.domain)
  seen = set()
  js = jax.jit(jax.vmap(lambda s: mixup_pairing(jax.random.PRNGKey(s), b, 5, 0.2)[0]))(jnp.arange(40))
  for j in np.asarray(js):
    seen |= {(int(d[k]), int(d[j[k]])) for k in range(len(d)) if b.mask[k] > 0}
  assert seen == {(a, c) for a in range(4) for c in range(4) if a != c}


@pytest.mark.parametrize("num_domains,domains", [(5, (0, 2, 3)), (5000, (4999, 2, 1234))])
def test_groupdro_loss_and_weights_match_numpy(num_domains, domains):
  """Also with 5000 domains (q stays a [D] vector; the per-batch risks are segment sums, no
  value in the traced step is larger than D)."""
  model = tiny_mlp(hidden=())
  params = model.init(jax.random.PRNGKey(1))
  b = _batch(seed=5, domains=domains)
  q0 = np.random.default_rng(0).dirichlet(np.ones(num_domains))
  if num_domains == 5:
    q0 = np.array([0.1, 0.3, 0.2, 0.25, 0.15])
  eta = 0.7
  fn = jax.jit(lambda bb, q: groupdro_loss(model, params, bb, q, eta, num_domains))
  loss, q = fn(b, jnp.asarray(q0, jnp.float32))
  W, c = _linear(params)
  d, m = np.asarray(b.domain), np.asarray(b.mask) > 0
  ce = _ce(np.asarray(b.x, np.float64) @ W + c, np.asarray(b.y))
  R = np.array([ce[(d == e) & m].mean() if ((d == e) & m).any() else 0.0 for e in range(num_domains)])
  pres = np.array([((d == e) & m).any() for e in range(num_domains)], float)
  qn = q0 * np.exp(eta * R * pres)
  qn /= qn.sum()
  np.testing.assert_allclose(q, qn, rtol=1e-5, atol=1e-9)
  np.testing.assert_allclose(loss, (qn * pres * R).sum() / (qn * pres).sum(), rtol=1e-5)
  # a single-domain batch: the loss is ERM's
  b1 = b._replace(domain=jnp.full_like(b.domain, 2))
  loss1, _ = fn(b1, jnp.asarray(q0, jnp.float32))
  np.testing.assert_allclose(loss1, ce[m].mean(), rtol=1e-5)
  step = jax.make_jaxpr(jax.grad(lambda p: groupdro_loss(model, p, b, jnp.asarray(q0, jnp.float32), eta,
                                                         num_domains)[0]))(params)
  assert _max_size(step.jaxpr) <= max(num_domains, 64)  # before: a [B, D] one-hot


def _max_size(jaxpr):
  """The largest number of elements of any value in a jaxpr, its sub-jaxprs included."""
  out = 0
  for eqn in jaxpr.eqns:
    for v in eqn.outvars:
      out = max(out, int(np.prod(getattr(v.aval, "shape", ()))))
    for p in eqn.params.values():
      for sub in (p if isinstance(p, (tuple, list)) else (p,)):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          out = max(out, _max_size(sub))
  return out


def test_groupdro_weights_are_persistent_client_state():
  store = jax.tree.map(jnp.asarray, ragged_store())
  store = store._replace(domain=jnp.asarray(np.random.default_rng(0).integers(0, 3, store.y.shape), jnp.int32))
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  alg = _method("groupdro", {"eta": 0.5}, model, num_domains=3)
  state = init_round_state(alg, None, params, 6)
  rf = make_round(alg, 6, 6, "vmap")
  qs = []
  for t in range(2):
    state, _ = rf(state, store, jax.random.PRNGKey(t))
    qs.append(np.asarray(state.clients))
  np.testing.assert_allclose(qs[-1].sum(1), 1.0, rtol=1e-5)
  assert np.abs(qs[0] - 1 / 3).max() > 1e-3           # moved away from uniform
  assert np.abs(qs[1] - qs[0]).max() > 1e-4           # and kept moving from where it was
  assert np.abs(qs[1][0] - qs[1][1]).max() > 1e-4     # one q per client


@pytest.mark.parametrize("num_domains,domains", [(5, (0, 2, 3)), (5000, (4999, 2, 1234, 3))])
def test_fish_step_matches_numpy_sequential_domain_steps(num_domains, domains):
  """The inner steps in ascending domain id over the present domains, also among 5000
  domains, where the step scans the batch's S = min(B, D) slots (the traced step holds no
  value of the size of D)."""
  model = tiny_mlp(hidden=())
  params = model.init(jax.random.PRNGKey(2))
  b = _batch(seed=6, domains=domains)
  lr, meta = 0.3, 0.4
  step = fish_step(model, optax.sgd(lr), meta, num_domains)
  (got, _), _ = jax.jit(lambda p, bb: step((p, optax.sgd(lr).init(p)), bb, None))(params, b)
  W, c = _linear(params)
  Wt, ct = W.copy(), c.copy()
  x, y, d, m = np.asarray(b.x, np.float64), np.asarray(b.y), np.asarray(b.domain), np.asarray(b.mask) > 0
  for e in range(num_domains):
    sel = (d == e) & m
    if not sel.any():
      continue
    g = (_softmax(x[sel] @ Wt + ct) - np.eye(3)[y[sel]]) / sel.sum()
    Wt, ct = Wt - lr * x[sel].T @ g, ct - lr * g.sum(0)
  gW, gc = _linear(got)
  np.testing.assert_allclose(gW, W + meta * (Wt - W), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(gc, c + meta * (ct - c), rtol=1e-5, atol=1e-6)
  assert _max_size(jax.make_jaxpr(lambda p: step((p, optax.sgd(lr).init(p)), b, None))(params).jaxpr) < 64 * 3


def _project_numpy(v):
  """The Euclidean projection onto the simplex by bisection on the KKT threshold (float64)."""
  lo, hi = v.min() - 1.0, v.max()
  for _ in range(200):
    tau = (lo + hi) / 2
    lo, hi = (tau, hi) if np.maximum(v - tau, 0).sum() > 1 else (lo, tau)
  return np.maximum(v - (lo + hi) / 2, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=1, max_size=12))
def test_projection_lands_on_the_simplex_and_matches_bisection(v):
  v = np.asarray(v)
  w = np.asarray(jax.jit(project_simplex)(jnp.asarray(v, jnp.float32)), np.float64)
  assert (w >= 0).all()
  np.testing.assert_allclose(w.sum(), 1.0, atol=1e-5)
  np.testing.assert_allclose(w, _project_numpy(v), atol=2e-5)


def test_projection_leaves_simplex_points_unchanged():
  w = np.random.default_rng(0).dirichlet(np.ones(6))
  np.testing.assert_allclose(project_simplex(jnp.asarray(w, jnp.float32)), w, atol=1e-6)


def test_afl_objective_and_beta_step_match_numpy():
  store = jax.tree.map(jnp.asarray, ragged_store())
  store = store._replace(domain=jnp.asarray(np.random.default_rng(1).integers(0, 3, store.y.shape), jnp.int32))
  model = tiny_mlp(hidden=())
  params = model.init(jax.random.PRNGKey(0))
  gamma = 2.0
  beta = jnp.asarray([0.5, 0.3, 0.2])
  b = Batch(store.x[0], store.y[0], store.domain[0], (jnp.arange(12) < store.counts[0]).astype(jnp.float32))
  W, c = _linear(params)
  ce = _ce(np.asarray(b.x, np.float64) @ W + c, np.asarray(b.y))
  d, m = np.asarray(b.domain), np.asarray(b.mask) > 0
  want = sum(float(beta[e]) * (ce[(d == e) & m].mean() if ((d == e) & m).any() else 0) for e in range(3))
  np.testing.assert_allclose(afl_objective(model, 3)(beta)(params, b, None)[0], want, rtol=1e-5)

  alg = _method("afl", {"step": gamma}, model, num_domains=3)
  state = init_round_state(alg, None, params, 6)
  rf = make_round(alg, 6, 6, "vmap")
  state, _ = rf(state, store, jax.random.PRNGKey(0))
  np.testing.assert_allclose(state.server.beta, 1 / 3, rtol=1e-6)  # no beta step before the first averaging
  theta1 = state.server.params
  state, _ = rf(state, store, jax.random.PRNGKey(1))
  W, c = _linear(theta1)
  loss, cnt = np.zeros(3), np.zeros(3)
  for k in range(6):
    n = int(store.counts[k])
    ce = _ce(np.asarray(store.x[k, :n], np.float64) @ W + c, np.asarray(store.y[k, :n]))
    for e in range(3):
      sel = np.asarray(store.domain[k, :n]) == e
      loss[e] += ce[sel].sum()
      cnt[e] += sel.sum()
  np.testing.assert_allclose(state.server.beta, _project_numpy(np.full(3, 1 / 3) + gamma * loss / cnt), atol=1e-5)


def test_afl_objective_and_loss_report_over_5000_domains_match_numpy():
  """`sum_d beta_d R_d` and the pre-round per-domain loss sums and counts with 5000 domains
  (a few in the data): equal to a loop over all domains, and no traced value is larger than
  the [D] vectors themselves (before: a [rows, D] one-hot per chunk)."""
  from fedjax_dg.algorithms.afl import afl_client
  from fedjax_dg.algorithms.base import ClientData
  D = 5000
  model = tiny_mlp(hidden=())
  params = model.init(jax.random.PRNGKey(0))
  b = _batch(seed=11, n=20, domains=(4999, 7, 2048))
  beta = np.random.default_rng(2).dirichlet(np.ones(D))
  W, c = _linear(params)
  ce = _ce(np.asarray(b.x, np.float64) @ W + c, np.asarray(b.y))
  d, m = np.asarray(b.domain), np.asarray(b.mask) > 0
  want = sum(beta[e] * ce[(d == e) & m].mean() for e in range(D) if ((d == e) & m).any())
  obj = lambda p, bb, bt: afl_objective(model, D)(bt)(p, bb, None)[0]
  np.testing.assert_allclose(jax.jit(obj)(params, b, jnp.asarray(beta, jnp.float32)), want, rtol=1e-5)
  side = afl_client(model, make_schedule(4, 0, 1, 20, 3), optax.sgd(0.1), 0.1, D, stat_chunk=8)
  data = ClientData(b.x, b.y, b.domain, jnp.asarray(17))
  stat = lambda p: side.stat(p, jnp.asarray(beta, jnp.float32), None, data, None)
  loss_sum, count = jax.jit(stat)(params)
  want_sum = np.array([ce[(d == e) & m].sum() for e in range(D)])
  want_count = np.array([((d == e) & m).sum() for e in range(D)])
  np.testing.assert_allclose(loss_sum, want_sum, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(count, want_count)
  assert _max_size(jax.make_jaxpr(jax.grad(obj))(params, b, jnp.asarray(beta, jnp.float32)).jaxpr) <= D
  assert _max_size(jax.make_jaxpr(stat)(params).jaxpr) <= 3 * D  # the [chunks, D] sums


def test_afl_beta_stays_zero_on_domains_no_client_holds():
  model = tiny_mlp(hidden=())
  alg = _method("afl", {"step": 1.0}, model, num_domains=5, train_domains=(0, 1, 2))
  s = alg.server_init(None, model.init(jax.random.PRNGKey(0)))
  np.testing.assert_allclose(s.beta, [1 / 3, 1 / 3, 1 / 3, 0, 0], rtol=1e-6)
  s = alg.server_prepare(s._replace(round=jnp.asarray(1)), (jnp.asarray([3.0, 1, 2, 0, 0]), jnp.asarray([5.0, 5, 5, 0, 0])))
  assert float(s.beta[3]) == 0 and float(s.beta[4]) == 0
  np.testing.assert_allclose(float(jnp.sum(s.beta)), 1.0, rtol=1e-6)


def test_gaussian_kl_matches_closed_form_numpy():
  rng = np.random.default_rng(0)
  mu, r_mu = rng.normal(size=(2, 7, 4))
  sig, r_sig = rng.uniform(0.2, 2.0, size=(2, 7, 4))
  want = (np.log(r_sig / sig) + (sig ** 2 + (mu - r_mu) ** 2) / (2 * r_sig ** 2) - 0.5).sum(-1)
  got = gaussian_kl(*(jnp.asarray(a, jnp.float32) for a in (mu, sig, r_mu, r_sig)))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert (np.asarray(got) >= -1e-6).all()
  np.testing.assert_allclose(gaussian_kl(*(jnp.asarray(a, jnp.float32) for a in (mu, sig, mu, sig))), 0, atol=1e-6)


def _sr_model(z_dim=2, eval_samples=0):
  return probabilistic_model(tiny_mlp(hidden=()), z_dim, eval_samples)


def _sr_numpy_stats(params, x):
  d = params["featurizer"]["to_z"]
  h = np.asarray(x, np.float64) @ np.asarray(d["kernel"], np.float64) + np.asarray(d["bias"], np.float64)
  mu, s = np.split(h, 2, -1)
  return mu, np.log1p(np.exp(s))


def test_fedsr_loss_matches_numpy():
  model = _sr_model()
  params = model.init(jax.random.PRNGKey(3))
  b = _batch(seed=8)
  ref = {"mu": jnp.asarray(np.random.default_rng(1).normal(size=(3, 2)), jnp.float32),
         "s": jnp.asarray(np.random.default_rng(2).normal(size=(3, 2)), jnp.float32)}
  rng, a_l2, a_cmi = jax.random.PRNGKey(5), 0.3, 0.2
  got, _ = fedsr_loss(model, params, ref, b, rng, a_l2, a_cmi)
  mu, sig = _sr_numpy_stats(params, b.x)
  eps = np.asarray(jax.random.normal(rng, mu.shape), np.float64)
  z = mu + sig * eps
  W, c = _linear(params)
  y, m = np.asarray(b.y), np.asarray(b.mask) > 0
  r_mu, r_sig = np.asarray(ref["mu"], np.float64)[y], np.log1p(np.exp(np.asarray(ref["s"], np.float64)))[y]
  kl = (np.log(r_sig / sig) + (sig ** 2 + (mu - r_mu) ** 2) / (2 * r_sig ** 2) - 0.5).sum(-1)
  want = _ce(z @ W + c, y)[m].mean() + a_l2 * (z ** 2).sum(-1)[m].mean() + a_cmi * kl[m].mean()
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_fedsr_evaluation_uses_the_mean_or_averages_samples():
  params = _sr_model().init(jax.random.PRNGKey(4))
  x = _batch(seed=9).x
  mu, sig = _sr_numpy_stats(params, x)
  W, c = _linear(params)
  np.testing.assert_allclose(_sr_model().apply(params, x), mu @ W + c, rtol=1e-5, atol=1e-6)
  n = 5
  eps = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (n,) + mu.shape), np.float64)
  want = np.log(np.mean(_softmax((mu + sig * eps) @ W + c), 0))
  np.testing.assert_allclose(_sr_model(eval_samples=n).apply(params, x), want, rtol=1e-5, atol=1e-6)


def test_fedsr_references_stay_on_the_clients():
  store = jax.tree.map(jnp.asarray, ragged_store())
  model = _sr_model(z_dim=3)
  params = model.init(jax.random.PRNGKey(0))
  alg = _method("fedsr", {"z_dim": 3, "l2": 0.01, "cmi": 0.5}, model, lr=0.5)  # `model`: FedSR's model
  state = init_round_state(alg, None, params, 6)
  state, _ = make_round(alg, 6, 6, "vmap")(state, store, jax.random.PRNGKey(0))
  assert jax.tree.structure(state.server.params) == jax.tree.structure(params)  # the server holds no reference
  r_mu = np.asarray(state.clients["mu"])
  assert r_mu.shape == (6, 3, 3)
  assert np.abs(r_mu).max() > 0 and np.abs(r_mu[0] - r_mu[1]).max() > 0  # trained, one per client


def _mix_numpy(x, amp_other, lam, ratio):
  """ELCFS's `low_freq_mutate_np`-style reference: shift, mix a centred square, unshift."""
  h, w = x.shape[:2]
  f = np.fft.fft2(x.astype(np.float64), axes=(0, 1))
  a, p = np.fft.fftshift(np.abs(f), axes=(0, 1)), np.angle(f)
  a2 = np.fft.fftshift(amp_other.astype(np.float64), axes=(0, 1))
  b = int(np.floor(ratio * min(h, w) / 2))
  ch, cw = h // 2, w // 2
  a[ch - b:ch + b + 1, cw - b:cw + b + 1] = ((1 - lam) * a[ch - b:ch + b + 1, cw - b:cw + b + 1]
                                             + lam * a2[ch - b:ch + b + 1, cw - b:cw + b + 1])
  a = np.fft.ifftshift(a, axes=(0, 1))
  return np.real(np.fft.ifft2(a * np.exp(1j * p), axes=(0, 1)))


@pytest.mark.parametrize("shape,ratio", [((16, 16, 1), 0.25), ((12, 9, 3), 0.5), ((8, 8, 2), 1.0)])
def test_amplitude_mix_matches_numpy(shape, ratio):
  rng = np.random.default_rng(0)
  x, x2 = rng.random(shape), rng.random(shape)
  amp2 = np.abs(np.fft.fft2(x2, axes=(0, 1)))
  win = low_freq_window(shape[0], shape[1], ratio)
  for lam in (0.0, 0.3, 1.0):
    got = amplitude_mix(jnp.asarray(x, jnp.float32), jnp.asarray(amp2, jnp.float32), lam, win)
    np.testing.assert_allclose(got, _mix_numpy(x, amp2, lam, ratio), atol=1e-4)
  got0 = amplitude_mix(jnp.asarray(x, jnp.float32), jnp.asarray(amp2, jnp.float32), 0.0, win)
  np.testing.assert_allclose(got0, x, atol=1e-5)  # lam = 0 gives the image back


def test_feddg_draws_other_clients_and_builds_the_bank():
  own = other_clients(jax.random.PRNGKey(0), 3, 7, 500)
  assert not np.any(np.asarray(own) == 3) and set(np.asarray(own).tolist()) == set(range(7)) - {3}
  st = ragged_store()._replace(x=np.random.default_rng(0).random((6, 12, 5, 5, 1)).astype(np.float32))
  bank = amplitude_bank(st, 4)
  assert bank.shape == (6, 4, 5, 5, 1)
  # each entry is the spectrum of one of that client's real images
  for c in range(6):
    real = np.abs(np.fft.fft2(st.x[c, :st.counts[c]], axes=(1, 2)))
    for m in range(4):
      assert np.min(np.abs(real - bank[c, m]).reshape(len(real), -1).max(1)) < 1e-4
