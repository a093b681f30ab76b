"""Every method on 4 forced host devices: the sharded round equals the single-device one."""
from helpers import run_on_host_devices

SCRIPT = r"""
import sys; sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import jax, jax.numpy as jnp, optax
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
from fedjax_dg.algorithms.fedloe import init_stage2, make_stage2
from fedjax_dg.engine import init_round_state, make_round
from helpers import ragged_store, tiny_mlp, tree_max_diff
store = jax.tree.map(jnp.asarray, ragged_store(sizes=(9, 5, 12, 7, 3, 10, 4, 8, 6)))
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
  feddim(model, sched, sgd, optax_rule(optax.sgd(1.0)), 0.01, 0.5, 3, 8),
  fedga(model, sched, sgd, C, 5),
  fedgma(model, sched, sgd, 1.0, 0.4),
]
for alg in algs:
  out = []
  for devices in (jax.devices()[:1], jax.devices()):
    state = init_round_state(alg, None, params, C)
    rf = make_round(alg, C, 7, "vmap", devices=devices)
    for t in range(2):
      state, m = rf(state, store, jax.random.PRNGKey(t))
    out.append(state)
  d = tree_max_diff(out[0].server, out[1].server)
  print(alg.name, d, float(m["train_loss"]))
  assert d < 1e-5, (alg.name, d)
stage2 = make_stage2(model, sched, 0.1, "rex", 1.0, solver_steps=20)
s2 = stage2(init_stage2(params["classifier"], C), params["featurizer"], store, store, jax.random.PRNGKey(0))
assert jnp.isfinite(s2.phi).all()
print("METHODS_SHARDED_OK")
"""


def test_methods_sharded_over_four_host_devices():
  run_on_host_devices(SCRIPT, "METHODS_SHARDED_OK")
