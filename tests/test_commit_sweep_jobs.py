"""scripts/commit_sweep_jobs.sh commits a sweep's finished and failed jobs (their record
files only), leaves running jobs, checkpoints and anything else staged alone, and records
a failed job's later success."""
import json
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "commit_sweep_jobs.sh")
RUNS = "experiments/grid/runs"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo, *args) -> str:
  return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def write(path, text="{}\n"):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(text)


def job(repo, key, *files):
  for f in files:
    write(os.path.join(repo, RUNS, key, f), json.dumps({"file": f}) + "\n")


@pytest.fixture
def repo(tmp_path):
  r = tmp_path / "repo"
  r.mkdir()
  git(r, "init", "-q", "-b", "main")
  git(r, "config", "user.email", "t@example.org")
  git(r, "config", "user.name", "t")
  write(r / ".gitignore", f"/{RUNS}/\n")
  write(r / "README.md", "x\n")
  git(r, "add", ".gitignore", "README.md")
  git(r, "commit", "-q", "-m", "start")
  return r


def run_script(repo):
  return subprocess.run(["bash", SCRIPT, RUNS], cwd=repo, capture_output=True, text=True, timeout=60)


def test_commits_finished_and_failed_jobs_only(repo):
  job(repo, "done1", "summary.json", "metrics.jsonl", "events.jsonl", "job.json", "log.txt", "config.json",
      "checkpoints/20/state", "selected/heldout_domain.msgpack")
  job(repo, "failed1", "error.txt", "events.jsonl", "job.json")
  job(repo, "running1", "metrics.jsonl", "events.jsonl", "job.json", "RUNNING")
  write(repo / "README.md", "changed and staged, not the script's to commit\n")
  git(repo, "add", "README.md")
  p = run_script(repo)
  assert p.returncode == 0, p.stderr
  tracked = set(git(repo, "ls-files", RUNS).split())
  assert tracked == {f"{RUNS}/done1/{f}" for f in ("summary.json", "metrics.jsonl", "events.jsonl", "job.json")} | {
      f"{RUNS}/failed1/{f}" for f in ("error.txt", "events.jsonl", "job.json")}
  assert "1 more finished, 1 more failed (1 done in all)" in git(repo, "log", "-1", "--format=%s")
  assert git(repo, "diff", "--cached", "--name-only").split() == ["README.md"]  # still staged, not committed
  assert git(repo, "show", "--name-only", "--format=", "HEAD").split().count("README.md") == 0


def test_a_failed_job_that_later_succeeds_is_recorded_and_nothing_new_makes_no_commit(repo):
  job(repo, "j", "error.txt", "events.jsonl", "job.json")
  assert run_script(repo).returncode == 0
  head = git(repo, "rev-parse", "HEAD")
  assert run_script(repo).returncode == 0
  assert git(repo, "rev-parse", "HEAD") == head, "a commit with nothing new"
  os.remove(repo / RUNS / "j" / "error.txt")
  job(repo, "j", "summary.json", "metrics.jsonl")
  write(repo / RUNS / "j" / "events.jsonl", '{"event": "failed"}\n{"event": "done"}\n')
  assert run_script(repo).returncode == 0
  tracked = set(git(repo, "ls-files", RUNS).split())
  assert tracked == {f"{RUNS}/j/{f}" for f in ("summary.json", "metrics.jsonl", "events.jsonl", "job.json")}
  assert '"done"' in git(repo, "show", f"HEAD:{RUNS}/j/events.jsonl")


def test_refuses_a_missing_root_in_one_line(repo):
  p = subprocess.run(["bash", SCRIPT, "no/such/runs"], cwd=repo, capture_output=True, text=True, timeout=60)
  assert p.returncode == 1
  assert p.stderr.strip().count("\n") == 0 and "no/such/runs" in p.stderr
