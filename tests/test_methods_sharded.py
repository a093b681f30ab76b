"""Every method on 4 forced host devices: the sharded round equals the single-device one
(the 4-device scripts of a session run in one Python: conftest's `host_devices`)."""
import pytest

SCRIPT = r"""
import sys; sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import jax, jax.numpy as jnp, numpy as np, optax
assert jax.device_count() == 4, jax.devices()
from fedjax_dg.algorithms.base import make_schedule
from fedjax_dg.algorithms.fedavg import fedavg, optax_rule
from fedjax_dg.algorithms.fedomg import fedomg
from fedjax_dg.algorithms.fediir import fediir
from fedjax_dg.algorithms.fedomg import omg_rule
from fedjax_dg.algorithms.feddim import feddim
from fedjax_dg.algorithms.fedga import fedga
from fedjax_dg.algorithms.fedgma import fedgma
from fedjax_dg.algorithms.fedsam import sam
from fedjax_dg.algorithms.fedavg import erm
from fedjax_dg.algorithms.fedloe import stage2
from fedjax_dg.algorithms.dg import dg_fedavg
from fedjax_dg.algorithms.fish import fish
from fedjax_dg.algorithms.groupdro import groupdro
from fedjax_dg.algorithms.afl import afl
from fedjax_dg.algorithms.fedsr import fedsr, probabilistic_model
from fedjax_dg.algorithms.feddg import amplitude_bank, feddg
from fedjax_dg.algorithms.fedadg import fedadg
from fedjax_dg.engine import init_round_state, make_round
from helpers import ragged_store, tiny_mlp, tree_max_diff
store = ragged_store(sizes=(9, 5, 12, 7, 3, 10, 4, 8, 6))
store = store._replace(domain=np.random.default_rng(0).integers(0, 3, store.y.shape).astype(np.int32))
img_store = jax.tree.map(jnp.asarray, store._replace(x=store.x.reshape(9, 12, 3, 2, 1)))  # for FedDG's spectra
bank = amplitude_bank(img_store, 4)
store = jax.tree.map(jnp.asarray, store)
C = 9
model = tiny_mlp()
params = model.init(jax.random.PRNGKey(0))
sched = make_schedule(4, 0, 1, 12, 3)
sgd = optax.sgd(0.1)
algs = [
  fedomg(model, sched, sgd, 7.0, 0.5),
  fedomg(model, sched, sgd, 7.0, 0.5, objective_factory=sam(erm(model), 0.05), name="fedsam+omg"),
  fedavg(model, sched, sgd, optax.sgd(1.0), sam(erm(model), 0.05), name="fedsam"),
  fediir(model, sched, sgd, optax_rule(optax.sgd(1.0)), 0.01),
  fediir(model, sched, sgd, omg_rule(7.0, 0.5), 0.01, name="fediir+omg", weighting="examples"),
  feddim(model, sched, sgd, optax_rule(optax.sgd(1.0)), 0.01, 0.5, 3, store),
  fedga(model, sched, sgd, C, 5),
  fedgma(model, sched, sgd, 1.0, 0.4),
  dg_fedavg(model, sched, sgd, optax_rule(optax.sgd(1.0)), "mixup", 0.2, 3),
  dg_fedavg(model, sched, sgd, optax_rule(optax.sgd(1.0)), "irm", 10.0, 3, 2),
  fish(model, sched, sgd, optax_rule(optax.sgd(1.0)), 0.5, 3),
  groupdro(model, sched, sgd, optax_rule(optax.sgd(1.0)), 0.1, 3),
  afl(model, sched, sgd, optax_rule(optax.sgd(1.0)), 0.5, 3),
  [fedsr(probabilistic_model(model, 4), sched, sgd, optax_rule(optax.sgd(1.0)), 4), probabilistic_model(model, 4)],
  [fedsr(probabilistic_model(model, 4), sched, sgd, omg_rule(7.0, 0.5), 4, name="fedsr+omg"), probabilistic_model(model, 4)],
  [feddg(tiny_mlp(), sched, sgd, optax_rule(optax.sgd(1.0)), bank, 0.5), img_store],  # [model or store to use]
  fedadg(model, sched, sgd, optax_rule(optax.sgd(1.0)), 8, 3, noise_dim=4, hidden=8),
]
WANT = NAMES
name_of = lambda a: (a[0] if isinstance(a, list) else a).name
algs = [a for a in algs if name_of(a) in WANT]
assert len(algs) == len(WANT), [name_of(a) for a in algs]
for alg in algs:
  p0, st = params, store
  if isinstance(alg, list):
    alg, extra = alg
    if hasattr(extra, "init"):
      p0 = extra.init(jax.random.PRNGKey(0))
    else:
      st = extra
  out = []
  for devices in (jax.devices()[:1], jax.devices()):
    state = init_round_state(alg, None, p0, C)
    rf = make_round(alg, C, 7, "vmap", devices=devices)
    for t in range(2):
      state, m = rf(state, st, jax.random.PRNGKey(t))
    out.append(state)
  d = tree_max_diff(out[0].server, out[1].server)
  print(alg.name, d, float(m["train_loss"]))
  assert d < 1e-5, (alg.name, d)
# FedLOE's stage 2 with the Fish manager (SGD steps on phi). Adam's sign-like steps on the
# near-zero gradients of identical unsampled heads would amplify summation-order noise.
s2_alg = stage2(model, sched, optax.sgd(0.1), store, "fish", 1.0, C, solver_steps=20)
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
