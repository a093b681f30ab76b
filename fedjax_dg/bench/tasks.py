"""One sweep job as N submitit tasks: the N processes of one `jax.distributed` run.

`bench run --launcher=submitit --tasks_per_job=N` (or `sweep.launch.tasks_per_job`) submits
each job as one submitit job of N tasks (Slurm: `tasks_per_node`, split over `nodes` when
the submitit parameters name them; `cluster="local"`: N local processes). Every task runs
`execute_task`:

1. It reads the job's job.json and sets the job's `distributed` fields (result-neutral, so
   the job's key is unchanged): on Slurm `initialize="auto"` (JAX reads the layout from
   Slurm's environment); on the local cluster `initialize="local"` with the coordinator at
   `localhost:PORT` (a free port chosen at submission), `num_processes` and `process_id`
   from submitit's `JobEnvironment` (num_tasks, global_rank). Then `jax.distributed`
   starts (`fedjax_dg.distributed.initialize`, bounded by `distributed.timeout_s`).
2. Process 0 alone decides whether the job runs (`jobs.decide`: done -> "skipped",
   another live process holds its lock -> "busy", else it takes the lock) and sends its
   decision to every task (`multihost_utils.broadcast_one_to_all`), so no task skips alone
   while the others enter the run's collectives.
3. Every task runs the job's runner; process 0 alone writes the job's files (job.json
   stays, events.jsonl, error.txt, log.txt, the RUNNING lock) as the runner's own files.

A failure every task shares (a bad config: `distributed.agree`) is recorded once by
process 0 and every task returns "failed". Any other failure ends its task at once with one
line and status 2 (`distributed.fail`, after process 0 has recorded it when it is the one
failing); the others lose it in their next collective (at once when its connection closes,
else after `distributed.heartbeat_s`) and end the same way, process 0 recording a
`PeerLost` line. A killed process 0 takes the others down through JAX's coordinator, which
it hosts, and leaves the job interrupted (resumed by the next run). On Slurm, submitit's
`srun` gets `--kill-on-bad-exit=1`, which stops the others at once.

Several jobs are not batched into one program of a multi-process job: with N > 1 each
submitit job runs one sweep job.
"""
from __future__ import annotations

import os
import socket
import sys

import numpy as np

from fedjax_dg.bench import jobs
from fedjax_dg.bench import sweep as sweep_lib

DECISIONS = ("run", "skipped", "busy", "failed")
KILL_ON_BAD_EXIT = "--kill-on-bad-exit=1"


def check_tasks_per_job(tasks: int, launcher: str = "submitit", cluster: str | None = None,
                        flag: str = "--tasks_per_job") -> int:
  """`tasks` as an int >= 1 that `launcher` (and submitit's `cluster`) can run; one line otherwise."""
  if isinstance(tasks, bool) or not isinstance(tasks, (int, np.integer)) or tasks < 1:
    raise sweep_lib.SweepError(f"{flag} (processes per job) must be an integer >= 1, got {tasks!r}")
  if tasks > 1 and launcher != "submitit":
    raise sweep_lib.SweepError(f"{flag}={tasks} runs a job as several submitit tasks: use --launcher=submitit, "
                               f"or --tasks_per_job=1 with the {launcher} launcher (one process per job)")
  if tasks > 1 and cluster == "debug":
    raise sweep_lib.SweepError(f"{flag}={tasks}: submitit's debug cluster runs one task in this process; "
                               "use --cluster=local or Slurm")
  return int(tasks)


def task_parameters(parameters: dict, tasks: int) -> dict:
  """submitit parameters for jobs of `tasks` tasks: `tasks_per_node` (`tasks` over `nodes`
  when given), and `--kill-on-bad-exit=1` among Slurm's srun arguments."""
  params = dict(parameters)
  nodes = int(params.get("nodes", 1))
  if nodes < 1 or tasks % nodes:
    raise sweep_lib.SweepError(f"sweep.launch.submitit.nodes={params.get('nodes')!r} must be >= 1 and divide "
                               f"tasks_per_job={tasks}")
  if "tasks_per_node" in params and int(params["tasks_per_node"]) != tasks // nodes:
    raise sweep_lib.SweepError(f"sweep.launch.submitit.tasks_per_node={params['tasks_per_node']} contradicts "
                               f"tasks_per_job={tasks} over {nodes} node(s); leave tasks_per_node out")
  srun = list(params.get("slurm_srun_args", []) or [])
  params.update(tasks_per_node=tasks // nodes, slurm_srun_args=srun + [KILL_ON_BAD_EXIT] * (KILL_ON_BAD_EXIT
                                                                                              not in srun))
  return params


def free_ports(n: int) -> list[int]:
  """`n` distinct free TCP ports on localhost (each job's coordinator on the local cluster)."""
  socks = [socket.socket() for _ in range(n)]
  try:
    for s in socks:
      s.bind(("localhost", 0))
    return [s.getsockname()[1] for s in socks]
  finally:
    for s in socks:
      s.close()


def coordinator(cluster: str, port: int) -> dict:
  """The `distributed` fields every task of a job on `cluster` sets (process count and id aside)."""
  if cluster == "local":
    return {"initialize": "local", "coordinator_address": f"localhost:{port}"}
  return {"initialize": "auto"}


def with_task(config, fields: dict, num_tasks: int, rank: int):
  """`config` with its `distributed` block set for task `rank` of `num_tasks` (the counts
  matter only for `initialize="local"`; "auto" reads them from the cluster)."""
  config = config.copy_and_resolve_references()
  if "distributed" not in config:  # a base config written before the block existed
    from fedjax_dg import defaults
    config.distributed = defaults.default_config().distributed
  d = config.distributed
  d.initialize = fields["initialize"]
  if d.initialize == "local":
    d.coordinator_address, d.num_processes, d.process_id = fields["coordinator_address"], num_tasks, rank
  return config


def agreed(decision: str) -> str:
  """Process 0's `decision` (one of DECISIONS), as every process receives it."""
  from jax.experimental import multihost_utils
  code = multihost_utils.broadcast_one_to_all(np.int32(DECISIONS.index(decision)))
  return DECISIONS[int(code)]


def execute_task(workdir: str, fields: dict, ignore_locks: bool = False) -> str:
  """One submitit task of a multi-task job (see the module docstring). Returns process 0's
  outcome in every task: "skipped", "busy", "done" or "failed"."""
  import submitit
  from fedjax_dg import distributed
  env = submitit.JobEnvironment()
  _, config = jobs.load_job(workdir)
  config = with_task(config, fields, env.num_tasks, env.global_rank)
  distributed.initialize(config)  # before anything uses JAX
  writer = distributed.is_writer()
  decision = agreed(_decide(workdir, ignore_locks) if writer else "run")
  if decision != "run":
    return decision
  jobs.quiet_logging()
  if writer:
    return _run_writer(workdir, config)
  return _run_other(workdir, config)


def _decide(workdir: str, ignore_locks: bool) -> str:
  """`jobs.decide`, or "failed" (one line on stderr) where the job's folder cannot be read:
  every task hears it, none waits in a collective."""
  try:
    return jobs.decide(workdir, ignore_locks)
  except Exception as e:  # pylint: disable=broad-except  # e.g. an unreadable lock or folder
    print(f"error: {workdir}: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
    return "failed"


def _run_writer(workdir: str, config) -> str:
  """Process 0: the job's files, the lock released; a failure the others do not share ends it."""
  from fedjax_dg import distributed
  try:
    error = jobs.run_held(workdir, config, _run_saying_lost)
  finally:
    jobs.release(workdir)
  if error is not None and not isinstance(error, distributed.AgreedError):
    distributed.fail(error)  # one line, then exits: the others are in a collective
  return "failed" if error is not None else "done"


class PeerLost(RuntimeError):
  """Another task of the job is gone (its own log says why)."""


def _run_saying_lost(config, workdir: str) -> None:
  """`jobs.run_config`; a collective's error that another task is gone says so in one line."""
  from fedjax_dg import distributed
  try:
    jobs.run_config(config, workdir)
  except Exception as e:  # pylint: disable=broad-except
    if not distributed.peer_lost(e):
      raise
    raise PeerLost(f"lost another task of this job (see its submitit log): {' '.join(str(e).split())[:300]}") from e


def _run_other(workdir: str, config) -> str:
  """Process 1 and up: the runner without the job's files (it writes nothing there)."""
  from fedjax_dg import distributed
  try:
    jobs.run_config(config, workdir)
  except distributed.AgreedError:
    return "failed"  # process 0 recorded it
  except Exception as e:  # pylint: disable=broad-except  # one line, then exits
    distributed.fail(e)
  return "done"


def outcome(handle, workdir: str) -> str:
  """A multi-task submitit job's outcome: task 0's, or, where a task ended without a result
  (`distributed.fail` exits at once, a task was killed), the job's state from its files:
  "done", "failed" (error.txt), "interrupted" (started, its writer gone: the next run
  resumes it), else "failed"."""
  try:
    return handle.results()[0]
  except Exception:  # pylint: disable=broad-except  # submitit.core.utils.UncompletedJobError, FailedJobError
    state = jobs.job_state(workdir)
    return state if state in ("done", "failed", "interrupted") else "failed"


def submit(executor, jobs: list, ignore_locks: bool = False) -> list:
  """Submits each of `jobs` as one submitit job of the executor's tasks (inside
  `executor.batch()`: one Slurm array); each job gets its own coordinator port."""
  fields = [coordinator(executor.cluster, p) for p in free_ports(len(jobs))]
  return [executor.submit(execute_task, os.path.abspath(j.workdir), f, ignore_locks) for j, f in zip(jobs, fields)]
