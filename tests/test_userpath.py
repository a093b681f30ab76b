"""A user's path through the library: the package's entry points, custom datasets recorded
in config.json and re-scored by `evaluate`, the examples, the CLI's small promises."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable


def _env():
  return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _run(*args, cwd=ROOT, timeout=600):
  return subprocess.run([PY, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


def test_every_export_resolves():
  import fedjax_dg
  for name in fedjax_dg.__all__:
    assert getattr(fedjax_dg, name) is not None, name
  with pytest.raises(AttributeError):
    fedjax_dg.no_such_name  # noqa: B018


def test_default_config_is_the_config_file():
  sys.path.insert(0, os.path.join(ROOT, "configs"))
  import default
  import fedjax_dg
  assert fedjax_dg.default_config().to_dict() == default.get_config().to_dict()
  a = fedjax_dg.default_config()
  a.num_clients = 3
  assert fedjax_dg.default_config().num_clients == 20  # a fresh copy each call


def test_local_schedule_is_the_runners(tiny_config):
  """The library's schedule reads the batch size from the config once and equals the one
  the runner builds."""
  import fedjax_dg
  from fedjax_dg import plan as plan_lib
  tiny_config.client.batch_size = 7
  fold = fedjax_dg.load_fold(tiny_config)
  s = plan_lib.prepare(tiny_config, fold)
  sched = fedjax_dg.local_schedule(tiny_config, s.packed.counts, unroll=s.sched.unroll)
  assert sched == s.sched._replace(augment=None)
  assert sched.batch_size == 7 and sched.num_steps == int(np.ceil(s.packed.counts.max() / 7))


def test_register_dataset_refuses_lambdas_and_builtin_names():
  import fedjax_dg
  with pytest.raises(ValueError, match="module-level function"):
    fedjax_dg.register_dataset("x", lambda c: None)
  with pytest.raises(ValueError, match="built-in"):
    fedjax_dg.register_dataset("rotated_digits", "os:getcwd")


def test_progress_bar_shows_validation_not_test(tiny_config, tmp_path, capsys):
  from fedjax_dg import experiment, runbook
  tiny_config.quiet, tiny_config.num_rounds = False, 2
  experiment.train_and_evaluate(tiny_config, str(tmp_path / "w"))
  err = capsys.readouterr().err
  assert "val=" in err and "test=" not in err
  assert runbook.progress_val({"test": {"accuracy": 0.9}}) == "-"
  assert runbook.progress_val({"in_val": {"accuracy": 0.25}, "test": {"accuracy": 0.9}}) == "0.250"


def test_bytes_per_round_count_only_reporters(tiny_config, tmp_path):
  """With dropout, bytes per round = mean reporters x one client's upload + download, the
  reporters read back from metrics.jsonl."""
  from fedjax_dg import experiment
  tiny_config.engine.dropout, tiny_config.num_rounds, tiny_config.checkpoint_every = 0.5, 4, 0
  comm = experiment.train_and_evaluate(tiny_config, str(tmp_path / "w"))["communication"]
  recs = [json.loads(l) for l in open(tmp_path / "w" / "metrics.jsonl")]
  reporters = [n for r in recs for n in r["reporters"]]
  assert len(reporters) == 4 and comm["sampled_clients_per_round"] == 8
  per_client = comm["upload_bytes_per_client"] + comm["download_bytes_per_client"]
  assert comm["bytes_per_round"] == pytest.approx(np.mean(reporters) * per_client)
  assert np.mean(reporters) < 8


def test_lodo_summary_has_mean_std_and_domain_names(tiny_config, tmp_path, monkeypatch):
  from fedjax_dg import experiment, main
  accs = {0: 0.5, 1: 0.8, 2: 0.6}

  def fake_run_fold(config, fold, workdir):
    os.makedirs(workdir, exist_ok=True)
    acc = {"test": {"accuracy": accs[fold.test_domains[0]]}}
    return {"selection": {"in_domain": acc, "heldout_domain": acc}}
  monkeypatch.setattr(experiment, "run_fold", fake_run_fold)
  tiny_config.data.name = "spurious"
  tiny_config.data.correlations = (0.9, 0.8, 0.1)
  tiny_config.data.n_per_domain = 30
  tiny_config.data.leave_one_domain_out = True
  out = experiment.train_and_evaluate(tiny_config, str(tmp_path / "a"))
  sel = out["selection"]["heldout_domain"]
  values = np.array([0.5, 0.8, 0.6])
  assert sel["test"]["accuracy"] == pytest.approx(values.mean())
  assert sel["test"]["accuracy_std"] == pytest.approx(np.sqrt(((values - values.mean()) ** 2).sum() / 2))
  from fedjax_dg.data import datasets
  names = datasets.load_dataset(tiny_config.data).names
  assert sel["per_domain_test_accuracy"] == dict(zip(names, values.tolist()))
  line = main._summary_line(out)
  assert f"{values.mean():.4f} +- {sel['test']['accuracy_std']:.4f} over 3 test domains" in line
  assert all(n in line for n in names)


def test_help_lists_every_model_dataset_and_method():
  from fedjax_dg import algorithms
  from fedjax_dg.data.datasets import DATASETS
  from fedjax_dg.models import MODELS
  out = _run("-m", "fedjax_dg", "--help").stdout
  for name in (*MODELS, *DATASETS, *algorithms.METHODS):
    assert name in out, name


def test_two_plain_runs_get_their_own_workdirs(tmp_path):
  """Without a workdir on the command line each run appends its start time; no collision."""
  args = ("-m", "fedjax_dg", "--config", os.path.join(ROOT, "configs", "default.py"), "--config.num_rounds=1",
          "--config.num_clients=4", "--config.model.name=mlp", "--config.data.image_size=8",
          "--config.checkpoint_every=0", "--config.eval_every=1", "--config.quiet=True")
  for _ in range(2):
    r = _run(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Unable to initialize backend" not in r.stderr
    assert "heldout_domain-selected test accuracy" in r.stdout
  runs = sorted(glob.glob(str(tmp_path / "runs" / "default-*")))
  assert len(runs) == 2 and all(os.path.exists(os.path.join(d, "summary.json")) for d in runs)


def test_example_custom_data_and_model_and_evaluate(tmp_path):
  """The example registers a dataset and trains; `python -m fedjax_dg.evaluate` in a new
  process finds the loader through config.json and reproduces the selected test accuracy,
  without a stray absl backend line."""
  r = _run("examples/custom_data_and_model.py", "--workdir", str(tmp_path), "--rounds", "4")
  assert r.returncode == 0, r.stderr
  lines = {l.split(":", 1)[0]: json.loads(l.split(":", 1)[1]) for l in r.stdout.splitlines() if ":" in l}
  assert lines["registered"]["test_accuracy"] == lines["registered"]["rescored"] > 0.5  # chance 0.25
  assert lines["custom model"]["test_accuracy"] > 0.4
  stored = json.load(open(tmp_path / "registered" / "config.json"))["config"]["data"]
  assert stored["name"] == "shifted_blobs" and stored["loader"].endswith("custom_data_and_model.py:shifted_blobs")
  ev = _run("-m", "fedjax_dg.evaluate", "--workdir", str(tmp_path / "registered"))
  assert ev.returncode == 0, ev.stderr
  assert "Unable to initialize backend" not in ev.stderr and "xla_bridge" not in ev.stderr
  assert json.loads(ev.stdout)["splits"]["test"]["accuracy"] == lines["registered"]["test_accuracy"]


def test_example_custom_method(tmp_path):
  r = _run("examples/custom_method.py", "--workdir", str(tmp_path), "--rounds", "2")
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert set(out) == {"shrinkavg", "shrinkavg+omg"} and all(0 <= v <= 1 for v in out.values())
  cfg = json.load(open(tmp_path / "shrinkavg" / "config.json"))["config"]
  assert cfg["algorithm"]["shrinkavg"] == {"shrink": 1e-3}
