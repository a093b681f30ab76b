"""Every method on 4 forced host devices: the sharded round equals the single-device one
(the 4-device scripts of a session run in one Python: conftest's `host_devices`)."""
import pytest

SCRIPT = r"""
import sys; sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import jax, jax.numpy as jnp, numpy as np
assert jax.device_count() == 4, jax.devices()
from fedjax_dg import algorithms
from fedjax_dg.algorithms.base import make_schedule
from fedjax_dg.engine import init_round_state, make_round
from helpers import config_with, method, ragged_store, sgd_config, tiny_mlp, tree_max_diff
store = ragged_store(sizes=(9, 5, 12, 7, 3, 10, 4, 8, 6))
store = store._replace(domain=np.random.default_rng(0).integers(0, 3, store.y.shape).astype(np.int32))
img_store = jax.tree.map(jnp.asarray, store._replace(x=store.x.reshape(9, 12, 3, 2, 1)))  # for FedDG's spectra
store = jax.tree.map(jnp.asarray, store)
C = 9
model = tiny_mlp()
params = model.init(jax.random.PRNGKey(0))
sched = make_schedule(4, 0, 1, 12, 3)
# Each method from the config, as the runner builds it: the config's method fields, local SGD
# at 0.1; the sizes small (FedSR's z, FedADG's networks, FedDG's bank).
FIELDS = {{
  "fedomg": {{}}, "fedsam+omg": {{"algorithm.fedsam.rho": 0.05}}, "fedsam": {{"algorithm.fedsam.rho": 0.05}},
  "fediir": {{"algorithm.fediir.gamma": 0.01}}, "fediir+omg": {{"algorithm.fediir.gamma": 0.01}},
  "feddim": {{"algorithm.feddim.lam": 0.01}}, "fedga": {{"algorithm.fedga.gap_fraction": 0.0, "num_rounds": 5}},
  "fedgma": {{"algorithm.gma.tau": 0.4}}, "mixup": {{}}, "irm": {{"algorithm.irm.lam": 10.0, "algorithm.irm.anneal_steps": 2}},
  "fish": {{}}, "groupdro": {{"algorithm.groupdro.eta": 0.1}}, "afl": {{"algorithm.afl.step": 0.5}},
  "fedsr": {{"algorithm.fedsr.z_dim": 4}}, "fedsr+omg": {{"algorithm.fedsr.z_dim": 4}},
  "feddg": {{"algorithm.feddg.bank_size": 4}},
  "fedadg": {{"model.name": "mlp", "algorithm.fedadg.noise_dim": 4, "algorithm.fedadg.hidden": 8}},
}}
for name in NAMES:
  overrides = {{"algorithm.name": name, **sgd_config(0.1), **FIELDS[name]}}
  m = algorithms.model_for(config_with(overrides), model)  # FedSR's probabilistic model
  st = img_store if name == "feddg" else store
  alg = method(overrides, m, sched, C, 7, num_domains=3, store=st)
  p0 = m.init(jax.random.PRNGKey(0))
  out = []
  for devices in (jax.devices()[:1], jax.devices()):
    state = init_round_state(alg, None, p0, C)
    rf = make_round(alg, C, 7, "vmap", devices=devices)
    for t in range(2):
      state, m_ = rf(state, st, jax.random.PRNGKey(t))
    out.append(state)
  d = tree_max_diff(out[0].server, out[1].server)
  print(alg.name, d, float(m_["train_loss"]))
  assert d < 1e-5, (alg.name, d)
# FedLOE's stage 2 with the Fish manager (SGD steps on phi), as the runner builds it after
# stage 1. Adam's sign-like steps on the near-zero gradients of identical unsampled heads
# would amplify summation-order noise.
loe = {{"algorithm.name": "fedloe", **sgd_config(0.1), "client.batch_size": 4, "algorithm.fedloe.penalty": "fish",
        "algorithm.fedloe.lam": 1.0, "algorithm.fedloe.solver_steps": 20}}
ctx = method(loe, model, sched, C, 7, num_domains=3, store=store, tune_store=store, builder=True).source_ctx
[(_, _, build)] = algorithms.later_stages(ctx)
s2_alg = build()
s2 = [make_round(s2_alg, C, 7, "vmap", devices=d)(init_round_state(s2_alg, None, params, C), store,
                                                   jax.random.PRNGKey(0))[0] for d in (jax.devices()[:1], jax.devices())]
assert jnp.isfinite(s2[1].server.phi).all() and tree_max_diff(s2[0].server, s2[1].server) < 1e-5
print("METHODS_SHARDED_OK")
"""


# By default one method of each kind of exchange: a stacked rule (FedOMG on FedIIR's clients,
# with its pre-round statistic), server-side side state (FedDIM), a post-round report
# (FedGA), persistent client state (GroupDRO) and a server-side weight vector (AFL); the
# rest with -m slow.
DEFAULT_METHODS = ("fediir+omg", "feddim", "fedga", "groupdro", "afl")
SEED_METHODS = ("fedomg", "fedsam+omg", "fedsam", "fediir", "fedgma")
BASELINES_STATEFUL = ("fedsr",)
BASELINES_STATELESS = ("mixup", "irm", "fish", "fedsr+omg", "feddg", "fedadg")


def on_host_devices(names):
  """The 4-device check of the methods `names`."""
  return pytest.mark.host_devices(SCRIPT.replace("NAMES", repr(tuple(names))), "METHODS_SHARDED_OK")


@on_host_devices(DEFAULT_METHODS)
def test_methods_sharded_over_four_host_devices(host_devices):
  ok, output = host_devices
  assert ok, output


@pytest.mark.slow
@on_host_devices(SEED_METHODS + BASELINES_STATEFUL)
def test_more_methods_sharded_over_four_host_devices(host_devices):
  ok, output = host_devices
  assert ok, output


@pytest.mark.slow
@on_host_devices(BASELINES_STATELESS)
def test_more_baselines_sharded_over_four_host_devices(host_devices):
  ok, output = host_devices
  assert ok, output
