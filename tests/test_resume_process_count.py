"""A run resumed with another process count (docs/multi_process.md): two processes stopped
after round 2, resumed as one, end as the same run in one process uninterrupted (and one
resumed as two, the other way). Each checkpoint's checksum file records the topology that
saved it; a restore under another one reads every array replicated over its own devices."""
import json
import os

import pytest

from fedjax_dg import checkpoint, distributed
from test_distributed_runner import assert_same_results, one_process, two_processes


def test_checkpoints_record_their_topology(tmp_path):
  import jax.numpy as jnp
  ckpt = checkpoint.Checkpoints(str(tmp_path), run="00112233aabbccdd")
  ckpt.save(1, {"w": jnp.ones(3)})
  ckpt.close()
  record = json.load(open(tmp_path / "checkpoint_sums" / "1.json"))
  assert record["topology"] == distributed.topology() == [1, distributed.topology()[1]]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  return one_process(tmp_path_factory.mktemp("one") / "one", "--config.num_rounds=4")


@pytest.mark.slow
def test_two_processes_resumed_as_one_equal_one(tmp_path, uninterrupted):
  want = uninterrupted
  workdir = tmp_path / "two"
  two_processes(workdir, "--config.num_rounds=2")
  assert json.load(open(workdir / "checkpoint_sums" / "2.json"))["topology"][0] == 2
  got = one_process(workdir, "--config.num_rounds=4", "--config.resume=True")
  assert got["processes"] == 1
  assert_same_results(got, want)
  rounds = [json.loads(l)["round"] for l in open(workdir / "metrics.jsonl")]
  assert rounds == [1, 2, 3, 4]


@pytest.mark.slow
def test_one_process_resumed_as_two_equal_one(tmp_path, uninterrupted):
  workdir = tmp_path / "one_then_two"
  one_process(workdir, "--config.num_rounds=2")
  got, _, _ = two_processes(workdir, "--config.num_rounds=4", "--config.resume=True")
  assert got["processes"] == 2
  assert_same_results(got, uninterrupted)
  assert json.load(open(workdir / "checkpoint_sums" / "4.json"))["topology"][0] == 2
