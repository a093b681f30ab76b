"""Every method runs with its inputs in host memory (`engine.host_store=True`) and gives the
packed store's results: one round of `train_and_evaluate` each way, summary metrics compared.

FedDG used to fail here (its amplitude bank reads `store.x[c, rows]`). The default suite runs
`DEFAULT` (FedDG; SCAFFOLD, with client state; the host store of FedAvg and of FedIIR, with a
pre-round full pass, is checked strategy by strategy in test_host_store.py), about 15 s on 2 CPU
cores; the rest are marked `slow`: `python -m pytest -m slow tests/test_host_store_methods.py`.
"""
import math

import pytest

from fedjax_dg import experiment
from fedjax_dg.algorithms import ALGORITHMS

DEFAULT = ("feddg", "scaffold")


def one_round_config(c, name: str, host_store: bool):
  """`tiny_config` (conftest) cut to one round of `name` on 4 clients."""
  c.algorithm.name = name
  c.num_clients, c.num_rounds, c.eval_every, c.checkpoint_every = 4, 1, 1, 0
  c.quiet = True
  c.engine.host_store = host_store
  c.client.local_steps = 3  # a few minibatches, not an epoch: the methods, not the data size, matter here
  if name == "feddg":  # amplitude spectra of images: the digits are 8x8x1 images (the MLP flattens them)
    c.algorithm.feddg.bank_size = 4
  if name == "fedadg":
    c.algorithm.fedadg.hidden = c.algorithm.fedadg.noise_dim = 16
  if name == "fedloe":
    c.algorithm.fedloe.stage2_rounds = 1
    c.algorithm.fedloe.solver_steps = 5
  return c


def summary_metrics(summary) -> dict:
  """`{path: number}` of the final record and the two selections."""
  out = {}

  def walk(prefix, v):
    if isinstance(v, dict):
      for k, w in v.items():
        walk(f"{prefix}/{k}", w)
    elif isinstance(v, (list, tuple)):
      for k, w in enumerate(v):
        walk(f"{prefix}/{k}", w)
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
      out[prefix] = float(v)

  walk("final", summary["final"])
  walk("selection", summary["selection"])
  return out


def assert_host_store_matches(tiny_config, tmp_path, name):
  """Helper: `name` for one round with the host store equals the packed store, metric by metric."""
  import copy
  runs = {}
  for host in (False, True):
    c = one_round_config(copy.deepcopy(tiny_config), name, host)
    runs[host] = summary_metrics(experiment.train_and_evaluate(c, str(tmp_path / f"{name}-host{int(host)}")))
  packed, host = runs[False], runs[True]
  assert packed.keys() == host.keys(), name  # FedLOE ends on a stage-2 record (heads, no train loss)
  assert any(k.endswith("accuracy") for k in packed), name
  for k in packed:
    assert math.isfinite(packed[k]), (name, k)
    assert host[k] == pytest.approx(packed[k], rel=1e-5, abs=1e-6), (name, k, host[k], packed[k])


@pytest.mark.parametrize("name", [n if n in DEFAULT else pytest.param(n, marks=pytest.mark.slow) for n in ALGORITHMS])
def test_every_method_with_the_host_store_equals_the_packed_store(tiny_config, tmp_path, name):
  assert_host_store_matches(tiny_config, tmp_path, name)


def test_the_default_set_is_in_the_registry():
  assert set(DEFAULT) <= set(ALGORITHMS)
