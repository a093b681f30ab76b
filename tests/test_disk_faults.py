"""Writes that fail: a full disk while writing metrics.jsonl, selected/, summary.json or a
checkpoint; a file-size limit (RLIMIT_FSIZE) below a checkpoint's size; `checkpoints/` made
read-only while orbax saves in the background. Each gives one line naming the file and the
cause, leaves nothing half-written that a resume would trust, and a resume once the disk
is writable again ends with the uninterrupted run's metrics.

The disk is real: a small tmpfs filled up just before the write (a full disk), a read-only
bind mount over `checkpoints/` just before a save starts (as root, permission bits do not
stop writes, a read-only mount does), and `ulimit -f` in the child's shell. Where
mounting is not permitted (not root, no CAP_SYS_ADMIN) those tests are skipped."""
import contextlib
import errno
import json
import os
import subprocess
import sys

import pytest

from fedjax_dg import checkpoint as ckpt_lib
from fedjax_dg import experiment, rundir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow  # each test trains a small run two or three times (20-60 s)

TINY = dict(model=("mlp", (32,)), image_size=8, num_clients=8, num_rounds=6, eval_every=2, checkpoint_every=2)


def _config():
  sys.path.insert(0, os.path.join(ROOT, "configs"))
  import default
  c = default.get_config()  # conftest's tiny_config, with SCAFFOLD (client states in the checkpoints)
  c.model.name, c.model.hidden, c.data.image_size = "mlp", (32,), 8
  c.num_clients, c.num_rounds, c.eval_every, c.checkpoint_every = 8, 6, 2, 2
  c.client.lr, c.client.momentum, c.client.batch_size, c.quiet = 0.1, 0.0, 16, True
  c.algorithm.name = "scaffold"
  return c


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  return experiment.train_and_evaluate(_config(), str(tmp_path_factory.mktemp("reference") / "run"))


def _mount(*args) -> bool:
  return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@pytest.fixture
def tmpfs(tmp_path):
  where = str(tmp_path / "fs")
  os.makedirs(where)
  if not _mount("-t", "tmpfs", "-o", "size=8m", "tmpfs", where):
    pytest.skip("cannot mount a tmpfs here (needs root)")
  try:
    yield where
  finally:
    subprocess.run(["umount", "-l", where], check=False)


def _fill(where: str, leave: int = 0) -> str:
  """Fills the file system of `where` to the last byte, then frees `leave` bytes; returns
  the filler's path."""
  path = os.path.join(where, "filler")
  with open(path, "wb", buffering=0) as f:
    for chunk in (1 << 16, 1 << 12, 1 << 9, 1):
      with contextlib.suppress(OSError):
        while True:
          f.write(b"\0" * chunk)
    f.truncate(max(f.tell() - leave, 0))
  return path


def _same_results(summary, reference):
  assert summary["selection"] == reference["selection"]
  assert summary["final"] == reference["final"]


def _nothing_half_written(workdir):
  """No temporary file, no orbax temporary folder, no checksum without its checkpoint."""
  for dirpath, dirnames, filenames in os.walk(workdir):
    for name in dirnames + filenames:
      assert ".tmp-" not in name and "orbax-checkpoint-tmp" not in name, os.path.join(dirpath, name)
  sums = os.path.join(workdir, "checkpoint_sums")
  for name in os.listdir(sums) if os.path.isdir(sums) else ():
    assert os.path.isdir(os.path.join(workdir, "checkpoints", name[:-5])), f"checksum {name} without its checkpoint"


def _resume(workdir):
  c = _config()
  c.resume = True
  return experiment.train_and_evaluate(c, workdir)


def _before(monkeypatch, owner, name, when, action):
  """Runs `action()` just before `owner.name(...)` is called with arguments matching `when`."""
  original = getattr(owner, name)

  def wrapped(*args, **kwargs):
    if when(*args, **kwargs):
      action(*args)
    return original(*args, **kwargs)
  monkeypatch.setattr(owner, name, wrapped)


# `rundir.write_metrics(workdir, records)` at round 4, `save_selected(workdir, rule, round, ...)`
# at round 4, `write_summary` at the end, `Checkpoints.save(self, step, state)` at step 4.
FULL_DISK = {
    "metrics.jsonl": (rundir, "write_metrics", lambda w, recs: recs[-1]["round"] == 4, "metrics.jsonl"),
    "selected": (rundir, "save_selected", lambda w, rule, r, *a, **k: r == 4, "selected/"),
    "summary.json": (rundir, "write_summary", lambda *a: True, "summary.json"),
}


@pytest.mark.parametrize("target", sorted(FULL_DISK))
def test_full_disk(target, tmpfs, reference, monkeypatch):
  owner, name, when, names = FULL_DISK[target]
  workdir = os.path.join(tmpfs, "run")
  filler = []
  _before(monkeypatch, owner, name, when, lambda *_: filler.append(_fill(tmpfs)) if not filler else None)
  with pytest.raises(rundir.WriteError) as e:
    experiment.train_and_evaluate(_config(), workdir)
  line = str(e.value)
  assert "\n" not in line and f"{workdir}/{names}" in line and "no space left on the device" in line, line
  assert e.value.errno == errno.ENOSPC
  monkeypatch.undo()
  os.remove(filler[0])  # space is back
  _nothing_half_written(workdir)
  _same_results(_resume(workdir), reference)


def _fails_at_checkpoint_4(monkeypatch, workdir, mounted, fault, cause: str, reference):
  """`fault` runs as the save of round 4 starts (`mounted`: the mounts it made, undone after
  the run): the run stops with one line naming checkpoints/4 and `cause`, only checkpoint 2
  and its checksum remain, nothing half-written, and the resume ends as the uninterrupted
  run."""
  _before(monkeypatch, ckpt_lib.Checkpoints, "save", lambda self, step, state: step == 4, fault)
  try:
    with pytest.raises(rundir.WriteError) as e:
      experiment.train_and_evaluate(_config(), workdir)
  finally:
    for m in mounted:
      subprocess.run(["umount", m], check=True)
  line = str(e.value)
  assert "\n" not in line and f"{workdir}/checkpoints/4" in line and cause in line, line
  monkeypatch.undo()
  ckdir = os.path.join(workdir, "checkpoints")
  assert sorted(os.listdir(ckdir)) == ["2"] and sorted(os.listdir(os.path.join(workdir, "checkpoint_sums"))) == ["2.json"]
  _nothing_half_written(workdir)
  _same_results(_resume(workdir), reference)


def test_full_disk_while_a_checkpoint_is_saved(tmp_path, reference, monkeypatch):
  """`checkpoints/` on its own volume, full as the save of round 4 starts (a one-page
  tmpfs mounted over it, after checkpoint 2 is written): orbax's background save fails, the
  next save reports it in one line naming checkpoints/4; its checksum is removed. Once the
  volume is gone (checkpoint 2 visible again) the resume ends as the uninterrupted run."""
  workdir = str(tmp_path / "run")
  ckdir = os.path.join(workdir, "checkpoints")
  mounted = []

  def full(self, *_):
    self.mngr.wait_until_finished()  # checkpoint 2 written in full
    if not _mount("-t", "tmpfs", "-o", "size=4k", "tmpfs", ckdir):
      pytest.skip("cannot mount a tmpfs here (needs root)")
    mounted.append(ckdir)
    _fill(ckdir)
  _fails_at_checkpoint_4(monkeypatch, workdir, mounted, full, "no space left on the device", reference)


def test_checkpoints_made_read_only_while_saving(tmp_path, reference, monkeypatch):
  """`checkpoints/` becomes a read-only mount as the save of round 4 starts (orbax writes it
  in the background): one line naming checkpoints/4, its checksum removed; the resume,
  once writable, continues from checkpoint 2."""
  workdir = str(tmp_path / "run")
  ckdir = os.path.join(workdir, "checkpoints")
  mounted = []

  def read_only(self, *_):
    self.mngr.wait_until_finished()  # checkpoint 2 written in full
    if _mount("--bind", ckdir, ckdir) and (mounted.append(ckdir) or _mount("-o", "remount,bind,ro", ckdir)):
      return
    pytest.skip("cannot make a read-only bind mount here (needs root)")
  _fails_at_checkpoint_4(monkeypatch, workdir, mounted, read_only, "read-only file system", reference)


def _cli(workdir, *extra, fsize_kib=None):
  """The CLI run, under a file-size limit of `fsize_kib` KiB when given (set by the shell:
  no Python runs in a forked child of this multithreaded process)."""
  c = _config()
  limit = ["bash", "-c", f'ulimit -f {fsize_kib} && exec "$@"', "bash"] if fsize_kib else []
  args = [*limit, sys.executable, "-m", "fedjax_dg", "--config", os.path.join(ROOT, "configs", "default.py"),
          "--workdir", workdir, "--config.model.name=mlp", "--config.model.hidden=(32,)",
          "--config.data.image_size=8", "--config.num_clients=8", "--config.num_rounds=6", "--config.eval_every=2",
          "--config.checkpoint_every=2", "--config.client.lr=0.1", "--config.client.momentum=0.0",
          "--config.client.batch_size=16", "--config.quiet=True", f"--config.algorithm.name={c.algorithm.name}", *extra]
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the suite's cache: JAX warns when an entry is over the limit
  return subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def test_file_size_limit_below_a_checkpoint(tmp_path, reference):
  """RLIMIT_FSIZE of 39 KiB: every file of the run fits but a checkpoint's data (SCAFFOLD's
  eight client controls, ~80 kB); Python ignores SIGXFSZ, so the write fails with EFBIG and
  the command prints one line. Without the limit, the resume ends as the uninterrupted run."""
  workdir = str(tmp_path / "run")
  r = _cli(workdir, fsize_kib=39)
  assert r.returncode == 2, r.stderr[-3000:]
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"error: {workdir}/checkpoints/2: cannot write it (larger than "
                                                 "the file-size limit (ulimit -f, RLIMIT_FSIZE))"), r.stderr[-3000:]
  _nothing_half_written(workdir)
  assert not os.listdir(os.path.join(workdir, "checkpoint_sums"))
  r = _cli(workdir, "--config.resume=True")
  assert r.returncode == 0, r.stderr[-3000:]
  with open(os.path.join(workdir, "summary.json")) as f:
    _same_results(json.load(f), reference)
