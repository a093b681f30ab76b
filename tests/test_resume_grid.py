"""scripts/resume_grid.sh refuses to resume a sweep whose finished jobs ran under other code
(checked with the code the grid would run; one line naming the sweep and the count, exit 1,
nothing started) or into a WORK/code that is not a worktree of the repository, and says its
usage."""
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

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("pgrep") is None
                                or shutil.which("realpath") is None, reason="needs git, pgrep and realpath")


def _run(*args, cwd=ROOT):
  env = dict(os.environ, PYTHON=sys.executable)
  return subprocess.run(["bash", SCRIPT, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def test_a_stale_job_stops_the_resume_before_anything_starts(tmp_path):
  s = sweep_lib.load_config_file(os.path.join(ROOT, "configs", "sweeps", "tiny.py"))
  s.root = str(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  key = next(iter(exp.jobs))
  write_run(exp.jobs[key].workdir, {1: {"heldout_val": 0.5, "in_val": 0.5, "in_test": 0.5, "test": 0.4}},
            fingerprint="0" * 64)  # ran under other code
  work = tmp_path / "work"
  try:
    # WORK relative to the caller's directory (any folder of the repository).
    here = os.path.join(ROOT, "tests")
    p = _run("configs/sweeps/tiny.py", str(tmp_path / "runs"), os.path.relpath(work, here), cwd=here)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stderr.strip() == (f"error: configs/sweeps/tiny.py: 1 stale job(s) under {tmp_path / 'runs'} (`bench "
                                "status` lists them); not resuming")
    assert not (work / "run.log").exists() and not (work / "grid.pgid").exists()  # no grid, no commit loop
    assert (work / "code" / "fedjax_dg").is_dir()  # the code the check ran: a worktree of HEAD
  finally:
    subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", str(work / "code")], capture_output=True)


def test_a_work_folder_that_is_not_a_worktree_is_refused(tmp_path):
  (tmp_path / "work" / "code").mkdir(parents=True)
  p = _run("configs/sweeps/tiny.py", str(tmp_path / "runs"), str(tmp_path / "work"))
  assert p.returncode == 1
  assert p.stderr.strip() == (f"error: {tmp_path / 'work' / 'code'} exists and is not a worktree of {ROOT}; move it "
                              "away")


def test_usage():
  p = _run("configs/sweeps/tiny.py")
  assert p.returncode == 2 and p.stderr.startswith("usage: ")


def test_code_names_the_commit_the_grid_runs(tmp_path):
  """GRID_CODE pins the worktree to a commit (the code the finished jobs ran); one that is not a
  commit is refused before anything is created."""
  p = subprocess.run(["bash", SCRIPT, "configs/sweeps/tiny.py", str(tmp_path / "runs"), str(tmp_path / "work")],
                     cwd=ROOT, capture_output=True, text=True, timeout=300,
                     env=dict(os.environ, PYTHON=sys.executable, GRID_CODE="no-such-commit"))
  assert p.returncode == 1 and p.stderr.strip() == f"error: GRID_CODE=no-such-commit: not a commit of {ROOT}"
  assert not (tmp_path / "work").exists()
  parent = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD~1"], capture_output=True, text=True).stdout.strip()
  if not parent:
    pytest.skip("a clone without HEAD's parent")
  s = sweep_lib.load_config_file(os.path.join(ROOT, "configs", "sweeps", "tiny.py"))
  s.root = str(tmp_path / "runs")
  exp = sweep_lib.expand(s)
  write_run(exp.jobs[next(iter(exp.jobs))].workdir, {1: {"heldout_val": 0.5, "in_val": 0.5, "in_test": 0.5,
                                                         "test": 0.4}}, fingerprint="0" * 64)  # stops the resume
  work = tmp_path / "work"
  try:
    p = subprocess.run(["bash", SCRIPT, "configs/sweeps/tiny.py", str(tmp_path / "runs"), str(work)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHON=sys.executable, GRID_CODE="HEAD~1"))
    assert p.returncode == 1, p.stdout + p.stderr
    head = subprocess.run(["git", "-C", str(work / "code"), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert head.stdout.strip() == parent  # the check ran the pinned commit's code
  finally:
    subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", str(work / "code")], capture_output=True)
