"""The runner: validation, summary, kill-and-resume equality, the CLI."""
import json
import os
import subprocess
import sys

import pytest

import helpers

from fedjax_dg import experiment
from fedjax_dg import plan as plan_lib
from fedjax_dg import plan as plan_lib
from fedjax_dg.config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("field,value,needle", [
    ("algorithm.name", "fedbogus", "algorithm.name"),
    ("partition.lam", 1.5, "partition.lam"),
    ("partition.lam", -0.2, "partition.lam"),
    ("num_clients", 100000, "num_clients"),
    ("cohort_size", 9, "cohort_size"),
    ("client.lr", 0.0, "client.lr"),
    ("server.lr", -1.0, "server.lr"),
    ("engine.strategy", "magic", "engine.strategy"),
])
def test_bad_config_is_one_line_naming_the_field(tiny_config, tmp_path, field, value, needle, monkeypatch):
  # Nothing may compile before validation fails.
  import jax
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled before validating"))
  section, _, key = field.rpartition(".")
  target = tiny_config if not section else tiny_config[section]
  target[key] = value
  with pytest.raises(ConfigError) as e:
    experiment.train_and_evaluate(tiny_config, str(tmp_path / "w"))
  msg = str(e.value)
  assert needle in msg and "\n" not in msg


def _crash_after(n, monkeypatch):
  real = plan_lib.make_round

  def make_round(*a, **k):
    rf = real(*a, **k)
    calls = [0]

    def wrapped(state, store, rng):
      calls[0] += 1
      if calls[0] > n:
        raise RuntimeError("simulated crash")
      return rf(state, store, rng)
    return wrapped
  monkeypatch.setattr(plan_lib, "make_round", make_round)


def test_summary_and_kill_resume_equality(tiny_config, tmp_path, monkeypatch):
  tiny_config.algorithm.name = "scaffold"  # persistent client state must survive too
  full = experiment.train_and_evaluate(tiny_config, str(tmp_path / "full"))
  sel = full["selection"]["heldout_domain"]
  assert sel["round"] in (2, 4, 6) and 0.0 <= sel["test"]["accuracy"] <= 1.0
  assert full["selection"]["in_domain"]["test"]["accuracy"] >= 0.0
  lines = open(tmp_path / "full" / "metrics.jsonl").read().splitlines()
  assert [json.loads(l)["round"] for l in lines] == [2, 4, 6]

  with monkeypatch.context() as m:
    _crash_after(5, m)
    with pytest.raises(RuntimeError, match="simulated crash"):
      experiment.train_and_evaluate(tiny_config, str(tmp_path / "resumed"))
  # Without resume, the saved results are refused rather than overwritten.
  with pytest.raises(ConfigError, match="resume"):
    experiment.train_and_evaluate(tiny_config, str(tmp_path / "resumed"))
  tiny_config.resume = True
  resumed = experiment.train_and_evaluate(tiny_config, str(tmp_path / "resumed"))
  assert resumed["selection"] == full["selection"]
  assert resumed["final"] == full["final"]
  lines = open(tmp_path / "resumed" / "metrics.jsonl").read().splitlines()
  assert [json.loads(l)["round"] for l in lines] == [2, 4, 6]


def test_nan_loss_is_a_clear_error(tiny_config, tmp_path):
  tiny_config.client.lr = 1e30
  with pytest.raises(FloatingPointError, match="client.lr"):
    experiment.train_and_evaluate(tiny_config, str(tmp_path / "w"))


def test_leave_one_domain_out_runs_every_domain(tiny_config, tmp_path):
  tiny_config.data.name = "spurious"
  tiny_config.data.n_per_domain = 60
  tiny_config.data.correlations = (0.9, 0.8, 0.1)
  tiny_config.data.leave_one_domain_out = True
  tiny_config.num_clients = 2
  tiny_config.num_rounds = 2
  out = experiment.train_and_evaluate(tiny_config, str(tmp_path / "lodo"))
  assert len(out["folds"]) == 3
  tests = [json.load(open(os.path.join(f, "summary.json")))["domains"]["test"] for f in out["folds"]]
  assert sorted(t[0] for t in tests) == [0, 1, 2]
  assert len(out["selection"]["heldout_domain"]["per_fold_test_accuracy"]) == 3


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "fedjax_dg", "--config", os.path.join(ROOT, "configs/default.py"),
                         *args], capture_output=True, text=True, cwd=ROOT, timeout=600,
                        env=dict(os.environ, PYTHONPATH=helpers.pythonpath(ROOT)))


# In the slow suite: by default test_userpath.py's two plain runs run the same CLI to its summary,
# and the bad-input table's command lines exit 2 with one line.
@pytest.mark.slow
def test_cli_runs_and_rejects_bad_input(tmp_path):
  small = ["--config.model.name=mlp", "--config.model.hidden=(16,)", "--config.data.image_size=8",
           "--config.num_rounds=2", "--config.eval_every=1", "--config.num_clients=6", "--config.quiet=True"]
  out = _cli(*small, f"--config.workdir={tmp_path / 'cli'}")
  assert out.returncode == 0, out.stderr
  assert "heldout_domain-selected test accuracy" in out.stdout
  assert os.path.exists(tmp_path / "cli" / "summary.json")
  bad = _cli(*small, "--config.partition.lam=2.0", f"--config.workdir={tmp_path / 'bad'}")
  assert bad.returncode == 2
  err = [l for l in bad.stderr.splitlines() if l.startswith("error:")]
  assert len(err) == 1 and "partition.lam" in err[0]
