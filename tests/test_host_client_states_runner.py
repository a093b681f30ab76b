"""Host-held client states through the runner (`engine.host_client_states`): SCAFFOLD's
control variates in host memory, stored for sampled clients only, equal the device-held run;
checkpoints hold them sparsely, and a resume from one equals the uninterrupted run."""
import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from fedjax_dg import experiment
from fedjax_dg.config import ConfigError
from fedjax_dg.engine.host_state import HostClientStates


def _config(tiny_config, host: bool, rounds: int = 4):
  c = tiny_config
  c.algorithm.name = "scaffold"
  c.num_clients, c.cohort_size, c.num_rounds, c.eval_every, c.checkpoint_every = 12, 3, rounds, 1, 2
  c.engine.host_client_states = host
  return c


def _final_metrics(summary):
  return [summary["final"]["train_loss"]] + [m["accuracy"] for m in summary["final"]["splits"].values()]


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def device_run(tmp_path_factory):
  from fedjax_dg import default_config
  c = default_config()  # conftest's tiny_config, built once for the module
  c.model.name, c.model.hidden, c.data.image_size, c.client.lr, c.client.momentum = "mlp", (32,), 8, 0.1, 0.0
  c.client.batch_size, c.quiet = 16, True
  config = _config(c, host=False)
  workdir = str(tmp_path_factory.mktemp("device") / "run")
  return experiment.train_and_evaluate(config, workdir), workdir


def test_host_states_equal_device_states(device_run, tiny_config, tmp_path):
  want, want_dir = device_run
  got = experiment.train_and_evaluate(_config(tiny_config, host=True), str(tmp_path / "host"))
  assert got["selection"] == want["selection"]  # the same selected rounds and metrics
  for a, b in zip(_records(tmp_path / "host"), _records(want_dir)):
    assert a["round"] == b["round"]
    np.testing.assert_allclose(a["train_loss"], b["train_loss"], rtol=1e-6)
    assert a["splits"] == b["splits"]


def test_checkpoint_holds_only_sampled_clients(tiny_config, tmp_path):
  config = _config(tiny_config, host=True, rounds=2)
  workdir = str(tmp_path / "run")
  experiment.train_and_evaluate(config, workdir)
  record = json.load(open(os.path.join(workdir, "checkpoint_sums", "2.json")))
  used = record["host_client_states"][0]
  with ocp.StandardCheckpointer() as reader:
    saved = reader.restore(os.path.join(workdir, "checkpoints", "2", "default"))
  ids = np.asarray(saved["state"]["clients"]["ids"])
  assert len(ids) == used and len(set(ids.tolist())) == used
  assert 3 <= used <= 6 < config.num_clients  # two cohorts of 3 out of 12: never every client
  for rows in jax.tree.leaves(saved["state"]["clients"]["rows"]):
    assert rows.shape[0] == used
  # the sampled clients are the ones whose controls moved off their initial zeros
  assert all(np.abs(np.asarray(r)).sum() > 0 for r in jax.tree.leaves(saved["state"]["clients"]["rows"]))


def test_resume_from_sparse_checkpoint_equals_uninterrupted(device_run, tiny_config, tmp_path):
  want, _ = device_run
  workdir = str(tmp_path / "run")
  experiment.train_and_evaluate(_config(tiny_config, host=True, rounds=2), workdir)  # then "killed"
  config = _config(tiny_config, host=True, rounds=4)
  config.resume = True
  got = experiment.train_and_evaluate(config, workdir)
  assert got["selection"] == want["selection"]
  np.testing.assert_allclose(_final_metrics(got), _final_metrics(want), rtol=1e-6)


def test_restored_table_is_the_saved_one():
  one = {"c": np.zeros((3,), np.float32)}
  table = HostClientStates(one, 100)
  table.scatter(np.array([7, 42, 100]), {"c": np.array([[1, 2, 3], [4, 5, 6], [9, 9, 9]], np.float32)})
  table.scatter(np.array([3, 7]), {"c": np.array([[0, 0, 1], [1, 1, 1]], np.float32)})
  again = HostClientStates(one, 100).from_sparse(table.sparse())
  np.testing.assert_array_equal(again.stacked()["c"], table.stacked()["c"])
  assert again.used == 3 and list(again.slot[[7, 42, 3]]) == list(table.slot[[7, 42, 3]])
  with pytest.raises(ValueError, match="host-held client ids"):
    HostClientStates(one, 10).from_sparse(table.sparse())  # ids beyond 10 clients


def test_multi_stage_method_refuses_host_states(tiny_config, tmp_path):
  config = tiny_config
  config.algorithm.name = "fedloe"
  config.engine.host_client_states = True
  with pytest.raises(ConfigError, match="engine.host_client_states: 'fedloe' runs in stages"):
    experiment.train_and_evaluate(config, str(tmp_path / "run"))


def test_floyd_sample_is_a_uniform_subset():
  """Cohorts of more than FLOYD_ABOVE clients: distinct sorted ids, every client and every
  pair of clients included as often as in a uniform k-subset of n (k/n, k(k-1)/(n(n-1)))."""
  from fedjax_dg.engine.cohort import floyd_sample
  n, k, draws = 12, 4, 6000
  ids = np.asarray(jax.vmap(lambda key: floyd_sample(key, n, k))(jax.random.split(jax.random.PRNGKey(0), draws)))
  assert (np.diff(ids, axis=1) > 0).all() and ids.min() >= 0 and ids.max() < n  # distinct, sorted, in range
  member = np.zeros((draws, n))
  np.put_along_axis(member, ids, 1.0, axis=1)
  p1 = k / n
  assert np.abs(member.mean(0) - p1).max() < 5 * np.sqrt(p1 * (1 - p1) / draws)
  pairs = (member.T @ member / draws)[np.triu_indices(n, 1)]
  p2 = k * (k - 1) / (n * (n - 1))
  assert np.abs(pairs - p2).max() < 5 * np.sqrt(p2 * (1 - p2) / draws)
