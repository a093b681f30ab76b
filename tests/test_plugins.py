"""Your own method, server rule, dataset and sweep from a folder outside the repository:
examples/plugin/ copied to a temporary folder and run there by the command line, the sweep
tools and the re-scorer, none of which imports anything from the repository's folders."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from fedjax_dg import config as config_lib
from fedjax_dg import default_config, plugins

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the package as installed, nothing else
  env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
  return env


def _run(args, cwd, timeout=600):
  r = subprocess.run([sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  return r


@pytest.fixture
def outside(tmp_path):
  folder = tmp_path / "my_project"
  shutil.copytree(os.path.join(ROOT, "examples", "plugin"), folder)
  assert not str(folder).startswith(ROOT)
  return folder


def test_a_plugin_runs_from_the_command_line_and_is_rescored(outside):
  r = _run(["-m", "fedjax_dg", "--config", "my_config.py", "--config.workdir=runs/plugin", "--config.quiet=True"],
           cwd=outside)
  assert "done:" in r.stdout + r.stderr
  summary = json.load(open(outside / "runs" / "plugin" / "summary.json"))
  assert summary["config"]["algorithm"]["name"] == "shrinkavg+damped"
  assert summary["config"]["imports"] == ["my_plugin"]
  test_acc = summary["selection"]["heldout_domain"]["test"]["accuracy"]
  assert test_acc > 0.4  # four classes of separable blobs: chance is 0.25
  ev = _run(["-m", "fedjax_dg.evaluate", "--workdir", "runs/plugin"], cwd=outside)
  assert json.loads(ev.stdout[ev.stdout.index("{"):])["splits"]["test"]["accuracy"] == test_acc


def test_a_sweep_outside_the_repository_runs_and_reports(outside):
  _run(["-m", "fedjax_dg.bench", "run", "--sweep", "my_sweep.py", "--sweep.root=runs/sweep", "--workers=1"],
       cwd=outside, timeout=900)
  _run(["-m", "fedjax_dg.bench", "report", "--sweep", "my_sweep.py", "--sweep.root=runs/sweep",
        "--out=runs/sweep/report"], cwd=outside)
  report = open(outside / "runs" / "sweep" / "report" / "REPORT.md").read()
  assert "ShrinkAvg+damped" in report and "FedAvg" in report


def test_a_plugin_that_cannot_be_imported_is_refused_in_one_line(tmp_path):
  config = default_config()
  config.imports = ("no_such_plugin_module",)
  with pytest.raises(config_lib.ConfigError, match=r"^imports: cannot import 'no_such_plugin_module' "
                                                    r"\(ModuleNotFoundError"):
    config_lib.validate(config)
  (tmp_path / "broken.py").write_text("raise RuntimeError('half written\\nsecond line')\n")
  config.imports = (str(tmp_path / "broken.py"),)
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(config)
  assert str(e.value) == f"imports: cannot import {str(tmp_path / 'broken.py')!r} (RuntimeError: half written)"
  config.imports = (str(tmp_path / "missing.py"),)
  with pytest.raises(config_lib.ConfigError, match="imports: no such file"):
    config_lib.validate(config)


def test_a_plugin_file_registers_what_it_defines(tmp_path, monkeypatch):
  from fedjax_dg import algorithms
  from fedjax_dg.data import datasets
  shutil.copy(os.path.join(ROOT, "examples", "plugin", "my_plugin.py"), tmp_path / "my_plugin_copy.py")
  for table, key in ((algorithms.METHODS, "shrinkavg"), (algorithms.RULES, "damped"), (datasets.DATASETS, "shifted_blobs")):
    monkeypatch.setitem(table, key, None)  # undone at the end: the registries as they were
    del table[key]
  monkeypatch.delitem(sys.modules, "my_plugin_copy", raising=False)
  plugins.import_plugin(str(tmp_path / "my_plugin_copy.py"))
  assert "shrinkavg" in algorithms.METHODS and "damped" in algorithms.RULES and "shifted_blobs" in datasets.DATASETS
  algorithms.resolve("shrinkavg+damped")


def test_a_run_list_on_the_command_line_names_each_run_and_its_file(outside):
  """A batch from the command line prints one line per run and points to runs.json (a
  batch writes no summary.json of its own)."""
  r = _run(["-m", "fedjax_dg", "--config", "my_config.py", "--config.workdir=runs/list", "--config.quiet=True",
            "--config.num_rounds=2", "--config.runs=('seed=0', 'seed=1')"], cwd=outside)
  lines = r.stdout.strip().splitlines()
  assert lines[-3].startswith("run 0 (runs/list/run_0): heldout_domain-selected test accuracy")
  assert lines[-2].startswith("run 1 (runs/list/run_1): heldout_domain-selected test accuracy")
  assert lines[-1] == "results in runs/list/runs.json and each run's summary.json"
  assert (outside / "runs" / "list" / "runs.json").exists() and not (outside / "runs" / "list" / "summary.json").exists()
