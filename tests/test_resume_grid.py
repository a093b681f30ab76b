"""scripts/resume_grid.sh refuses to resume a sweep whose finished jobs ran under other code
(one line naming the sweep and the count, exit 1, nothing started), and says its usage."""
import os
import shutil
import subprocess
import sys

import pytest

from fedjax_dg.bench import sweep as sweep_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "resume_grid.sh")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_report2 import write_run  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("pgrep") is None,
                                reason="needs git and pgrep")


def _run(*args):
  env = dict(os.environ, PYTHON=sys.executable)
  return subprocess.run(["bash", SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_a_stale_job_stops_the_resume_before_anything_starts(tmp_path):
  s = sweep_lib.load_config_file(os.path.join(ROOT, "configs", "sweeps", "tiny.py"))
  s.root = str(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  key = next(iter(exp.jobs))
  write_run(exp.jobs[key].workdir, {1: {"heldout_val": 0.5, "in_val": 0.5, "in_test": 0.5, "test": 0.4}},
            fingerprint="0" * 64)  # ran under other code
  p = _run("configs/sweeps/tiny.py", str(tmp_path / "runs"), str(tmp_path / "work"))
  assert p.returncode == 1, p.stdout + p.stderr
  assert p.stderr.strip() == (f"error: configs/sweeps/tiny.py: 1 stale job(s) under {tmp_path / 'runs'} (`bench "
                              "status` lists them); not resuming")
  assert not (tmp_path / "work").exists()  # no worktree, no grid, no commit loop


def test_usage():
  p = _run("configs/sweeps/tiny.py")
  assert p.returncode == 2 and p.stderr.startswith("usage: ")
