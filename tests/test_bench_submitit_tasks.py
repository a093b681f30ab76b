"""A sweep job as two submitit tasks (the processes of one jax.distributed run) on submitit's
local cluster: the same jobs.csv scores as the job in one process, one set of run files, a
rerun skipped as done by both tasks; process 0's decision (skip, busy) reaches every task; a
bad config fails every task with one recorded line; a task killed mid-run stops the other
with one recorded line; the settings' own checks."""
import csv
import json
import math
import os
import signal
import time

import ml_collections
import pytest

from fedjax_dg import distributed, rundir
from fedjax_dg.bench import collect, launch, sweep as sweep_lib, tasks

pytest.importorskip("submitit")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "sweeps", "tiny.py")
SCORE_COLUMNS = [f"{rule}_{f}" for rule in ("heldout_domain", "in_domain", "oracle")
                 for f in ("round", "val", "test", "in_test")] + ["final_round", "final_test"]


@pytest.fixture(autouse=True)
def cpu_tasks(monkeypatch):
  """The tasks run on CPU (gloo), also on a machine with accelerators."""
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")


def tiny(root, seeds=(0,), lams=(1.0,), **base) -> sweep_lib.Expansion:
  """configs/sweeps/tiny.py's FedAvg at `lams` and `seeds` under `root`."""
  s = sweep_lib.load_config_file(TINY)
  s.root = str(root)
  s.grids = ml_collections.ConfigDict({"table": {"methods": ("fedavg",), "client_counts": (4,), "lams": lams,
                                                 "seeds": seeds}})
  for k, v in base.items():
    s.base[k] = v
  return s, sweep_lib.expand(s)


def two_task_executor(folder):
  return launch._executor(str(folder), "local", tasks.task_parameters({"timeout_min": 10}, 2))


def events(job, kind=None):
  return [e for e in launch.read_events(job.workdir) if kind is None or e["event"] == kind]


def scores(sweep, exp, out) -> dict:
  collect.collect(sweep, str(out), exp)
  with open(os.path.join(out, "jobs.csv")) as f:
    return {r["key"]: r for r in csv.DictReader(f)}


# ------------------------------------------------------------------------ settings (no process)

@pytest.mark.parametrize("value, launcher, cluster, fragment", [
    (0, "submitit", None, "--tasks_per_job (processes per job) must be an integer >= 1, got 0"),
    (1.5, "submitit", None, "must be an integer >= 1, got 1.5"),
    (2, "local", None, "--tasks_per_job=2 runs a job as several submitit tasks: use --launcher=submitit"),
    (2, "submitit", "debug", "submitit's debug cluster runs one task in this process"),
])
def test_tasks_per_job_refused(value, launcher, cluster, fragment):
  with pytest.raises(sweep_lib.SweepError) as e:
    tasks.check_tasks_per_job(value, launcher, cluster)
  assert fragment in str(e.value) and "\n" not in str(e.value)


def test_tasks_per_job_accepted_and_submitit_parameters():
  assert tasks.check_tasks_per_job(1, "local") == 1 and tasks.check_tasks_per_job(4, "submitit", "local") == 4
  p = tasks.task_parameters({"timeout_min": 5, "nodes": 2, "slurm_srun_args": ["--cpu-bind=none"]}, 4)
  assert p == {"timeout_min": 5, "nodes": 2, "tasks_per_node": 2,
               "slurm_srun_args": ["--cpu-bind=none", "--kill-on-bad-exit=1"]}
  assert tasks.task_parameters(p, 4) == p  # the kill flag once
  with pytest.raises(sweep_lib.SweepError, match="nodes=3 must be >= 1 and divide tasks_per_job=4"):
    tasks.task_parameters({"nodes": 3}, 4)
  with pytest.raises(sweep_lib.SweepError, match="tasks_per_node=4 contradicts tasks_per_job=2"):
    tasks.task_parameters({"tasks_per_node": 4}, 2)
  ports = tasks.free_ports(3)
  assert len(set(ports)) == 3


def test_each_task_gets_its_distributed_fields_and_the_key_stays(tmp_path):
  _, exp = tiny(tmp_path)
  job = next(iter(exp.jobs.values()))
  local = tasks.with_task(job.config, tasks.coordinator("local", 1234), 2, 1)
  d = local.distributed
  assert (d.initialize, d.coordinator_address, d.num_processes, d.process_id) == ("local", "localhost:1234", 2, 1)
  assert job.config.distributed.initialize == "off"  # the job's own config is left alone
  slurm = tasks.with_task(job.config, tasks.coordinator("slurm", 0), 8, 3).distributed
  assert (slurm.initialize, slurm.num_processes, slurm.process_id) == ("auto", 1, 0)  # Slurm says them
  assert "distributed" in rundir.RESULT_NEUTRAL  # so the job's key, taken without it, is the same
  old = job.config.copy_and_resolve_references()
  del old["distributed"]
  assert tasks.with_task(old, tasks.coordinator("local", 1), 2, 0).distributed.timeout_s == \
      job.config.distributed.timeout_s  # a config without the block gets the default one


def test_run_submitit_refuses_before_writing(tmp_path):
  _, exp = tiny(tmp_path / "sweep")
  with pytest.raises(sweep_lib.SweepError, match="submitit.nodes=3 must be >= 1 and divide tasks_per_job=2"):
    launch.run_submitit(exp, str(tmp_path / "submitit"), cluster="local", parameters={"nodes": 3}, tasks=2)
  assert not os.path.exists(tmp_path / "sweep") and not os.path.exists(tmp_path / "submitit")


# ------------------------------------------------------------------------ two local tasks

def test_process_zero_decides_for_every_task(tmp_path):
  """A done job is skipped and a job another live process holds is busy in BOTH tasks (task 1
  never decides alone); a job whose config is invalid fails in both, recorded once by task 0;
  a lock task 0 cannot read (a folder) fails both at once, neither waiting for the other."""
  _, exp = tiny(tmp_path / "sweep", seeds=(0, 1), lams=(1.0, 1.5))
  launch.prepare(exp)
  job = {(e.axes["seed"], e.axes["lam"]): exp.jobs[e.key] for e in exp.entries}
  done, busy, bad, unreadable = job[(0, 1.0)], job[(1, 1.0)], job[(0, 1.5)], job[(1, 1.5)]
  os.mkdir(os.path.join(unreadable.workdir, "RUNNING"))
  with open(os.path.join(done.workdir, "metrics.jsonl"), "w") as f:  # what `job_state` reads as done
    f.write('{"round": 1, "splits": {}}\n')
  with open(os.path.join(done.workdir, "summary.json"), "w") as f:
    json.dump({"selection": {}}, f)
  assert rundir.try_lock(os.path.join(busy.workdir, "RUNNING")) is None  # this test process holds it
  assert [launch.job_state(j.workdir) for j in (done, busy, bad)] == ["done", "running", "pending"]
  executor = two_task_executor(tmp_path / "submitit")
  with launch._job_environ(""), executor.batch():
    handles = tasks.submit(executor, [done, busy, bad, unreadable])
  assert [h.results() for h in handles] == [["skipped", "skipped"], ["busy", "busy"], ["failed", "failed"],
                                            ["failed", "failed"]]
  assert events(done) == [] and events(busy) == [] and events(unreadable) == []
  assert "a folder where the lock file belongs" in handles[3].task(0).stderr()
  assert launch.read_lock(busy.workdir)["pid"] == os.getpid()  # still this process's
  (start,), (failed,) = events(bad, "start"), events(bad, "failed")
  assert len(events(bad)) == 2 and start["pid"] == failed["pid"] != os.getpid()
  assert "partition.lam" in failed["error"] and "\n" not in failed["error"], failed
  assert launch.job_state(bad.workdir) == "failed" and not os.path.exists(os.path.join(bad.workdir, "RUNNING"))


@pytest.mark.slow
def test_two_tasks_equal_one_process_and_rerun_skips(tmp_path):
  """jobs.csv scores of the job as two tasks equal the job run in one process (`execute`).
  Tolerance: the accuracies are counts over a split, equal unless a prediction sits within
  float32 rounding of a tie; the two-process run sums the cohort's updates across processes
  (gloo) in another order than one device does, a difference of a few float32 ulps per round
  (test_distributed_runner.py compares summary.json with the same 1e-6); rounds are equal."""
  one_sweep, one = tiny(tmp_path / "one")
  two_sweep, two = tiny(tmp_path / "two")
  (job_one,), (job_two,) = one.jobs.values(), two.jobs.values()
  launch.prepare(one)
  assert launch.execute(job_one.workdir) == "done"
  t0 = time.time()
  assert launch.run_submitit(two, str(tmp_path / "submitit"), cluster="local", parameters={"timeout_min": 10},
                             wait=True, quiet=True, tasks=2) == ["done"]
  seconds = time.time() - t0
  want, got = scores(one_sweep, one, tmp_path / "out_one"), scores(two_sweep, two, tmp_path / "out_two")
  assert list(got) == list(want) == [job_two.key]
  for col in SCORE_COLUMNS:
    x, y = got[job_two.key][col], want[job_one.key][col]
    assert (x == "") == (y == ""), col
    if x:
      assert math.isclose(float(x), float(y), rel_tol=0, abs_tol=0 if col.endswith("round") else 1e-6), (col, x, y)
  assert json.load(open(os.path.join(job_two.workdir, "summary.json")))["processes"] == 2
  # One set of run files, written by task 0: one start and one done line, no lock, no temporary file.
  assert [e["event"] for e in events(job_two)] == ["start", "done"], seconds
  names = set(os.listdir(job_two.workdir))
  assert {"job.json", "events.jsonl", "log.txt", "metrics.jsonl", "summary.json", "config.json"} <= names
  assert not {"RUNNING", "LOCK", "error.txt"} & names and not [n for n in names if ".tmp" in n], names
  with open(os.path.join(job_two.workdir, "metrics.jsonl")) as f:
    assert [json.loads(line)["round"] for line in f] == [1, 2, 3]  # once per round, not once per task
  # A rerun: nothing to submit; the job's tasks, submitted anyway, both skip it.
  assert launch.run_submitit(two, str(tmp_path / "submitit"), cluster="local", wait=True, quiet=True, tasks=2) == []
  executor = two_task_executor(tmp_path / "submitit")
  with launch._job_environ(""), executor.batch():
    (handle,) = tasks.submit(executor, [job_two])
  assert handle.results() == ["skipped", "skipped"]
  assert len(events(job_two)) == 2


def _task_pid(handle, rank: int, deadline: float) -> int:
  """The pid of task `rank` of a local submitit job (a child of its controller process)."""
  import psutil
  while time.time() < deadline:
    for child in psutil.Process(handle._process.pid).children():
      try:
        if child.environ().get("SUBMITIT_LOCAL_GLOBALID") == str(rank):
          return child.pid
      except psutil.Error:
        continue
    time.sleep(0.2)
  raise AssertionError(f"no task {rank}")


def _ended(pid: int) -> bool:
  import psutil
  try:
    return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return True


@pytest.mark.slow
@pytest.mark.parametrize("killed", [1, 0])
def test_a_killed_task_stops_the_other(tmp_path, killed):
  """A task SIGKILLed mid-run: the other ends within bounded time. Task 1 killed: task 0
  leaves its collective when the connection closes, records the job failed with one line
  and removes the lock (outcome "failed"). Task 0 (the writer) killed: JAX ends task 1 when
  the coordinator goes; the job is left interrupted, to resume on the next run."""
  _, exp = tiny(tmp_path / "sweep", num_rounds=200, checkpoint_every=0)
  (job,) = exp.jobs.values()
  (handle,) = launch.run_submitit(exp, str(tmp_path / "submitit"), cluster="local",
                                  parameters={"timeout_min": 10}, quiet=True, tasks=2)
  deadline = time.time() + 300
  pid, other = _task_pid(handle, killed, deadline), _task_pid(handle, 1 - killed, deadline)
  metrics = os.path.join(job.workdir, "metrics.jsonl")
  while not (os.path.exists(metrics) and os.path.getsize(metrics)) and time.time() < deadline:
    time.sleep(0.2)
  assert not os.path.exists(os.path.join(job.workdir, "summary.json")), "the run ended before the kill"
  os.kill(pid, signal.SIGKILL)
  killed_at = time.time()
  while not _ended(other) and time.time() < killed_at + 120:
    time.sleep(0.2)
  stopped = time.time() - killed_at
  # Bound: the grace `distributed.fail` gives a launcher (5 s) plus slack for a loaded machine;
  # far below distributed.heartbeat_s (60 s), which a hung collective would wait for.
  assert stopped < distributed.PEER_LOST_GRACE_S + 25, stopped
  assert not os.path.exists(os.path.join(job.workdir, "RUNNING")) or killed == 0
  if killed == 1:
    assert tasks.outcome(handle, job.workdir) == "failed"
    (failed,) = events(job, "failed")
    assert "\n" not in failed["error"] and failed["error"].startswith("PeerLost: lost another task of this job"), failed
    assert launch.job_state(job.workdir) == "failed"
  else:
    assert tasks.outcome(handle, job.workdir) == "interrupted"
    assert [e["event"] for e in events(job)] == ["start"] and launch.job_state(job.workdir) == "interrupted"
