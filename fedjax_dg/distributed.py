"""The runner on several processes (`jax.distributed`): start-up, agreement, who writes.

`config.distributed.initialize` says how the processes find each other:

  "off"    one process (the default); `jax.distributed` is not started.
  "auto"   `jax.distributed.initialize()` with JAX's cluster auto-detection (Slurm, Open MPI,
           Kubernetes, Cloud TPU): the coordinator, the process count and this process's id
           come from the job's environment.
  "local"  the coordinator, count and id given in `distributed.coordinator_address`,
           `distributed.num_processes` and `distributed.process_id`
           (scripts/launch_local.sh passes them).

Every process runs the same program on its share of the cohort (the engine shards the
cohort axis over every process's devices); process 0 alone writes the run directory
(`is_writer`), and every process takes part in each checkpoint save and restore (orbax's
multi-process protocol, one directory). Start-up is agreed: every process validates its
config and compares a hash of it with the others' (`agree`), so a bad value or a config
that differs across processes stops every process with one line before anything compiles.
A process that cannot reach the others within `distributed.timeout_s` stops with one line
(a watchdog, before XLA's own abort); one that dies later is noticed by the others through
the coordinator's heartbeat (`distributed.heartbeat_s`), and the launchers stop the rest
(scripts/launch_local.sh; `srun --kill-on-bad-exit=1`).
"""
from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
import time

import numpy as np

from fedjax_dg.engine.host_state import host_value  # noqa: F401  (re-exported)
from fedjax_dg.errors import ConfigError

MODES = ("off", "auto", "local")


def settings(config):
  """The config's `distributed` block, or None when it has none (a config from before it)."""
  return config.get("distributed", None)


def mode(config) -> str:
  d = settings(config)
  return "off" if d is None else d.initialize


def check(config) -> None:
  """The `distributed` block's own checks, one line each (no JAX, no network)."""
  d = settings(config)
  if d is None:
    return
  if d.initialize not in MODES:
    raise ConfigError(f"distributed.initialize: unknown {d.initialize!r}; choose one of {list(MODES)}")
  if d.timeout_s < 1 or d.heartbeat_s < 1:
    field = "timeout_s" if d.timeout_s < 1 else "heartbeat_s"
    raise ConfigError(f"distributed.{field} must be >= 1 (seconds), got {d[field]}")
  if d.initialize != "local":
    return
  if not d.coordinator_address or ":" not in d.coordinator_address:
    raise ConfigError(f"distributed.coordinator_address: distributed.initialize='local' needs the coordinator as "
                      f"HOST:PORT (process 0's machine), got {d.coordinator_address!r}")
  if d.num_processes < 1:
    raise ConfigError(f"distributed.num_processes must be >= 1 with distributed.initialize='local', "
                      f"got {d.num_processes}")
  if not 0 <= d.process_id < d.num_processes:
    raise ConfigError(f"distributed.process_id must lie in [0, {d.num_processes - 1}] "
                      f"(distributed.num_processes={d.num_processes}), got {d.process_id}")


def check_strategy(config) -> None:
  """The host loop dispatches to one process's devices: refused under several processes."""
  if config.engine.strategy == "host_loop" and process_count() > 1:
    raise ConfigError(f"engine.strategy: host_loop runs on one process's devices; under jax.distributed "
                      f"({process_count()} processes) use vmap, chunked, sequential or auto")


def claim_process_id(d) -> str:
  """Takes this machine's lock on (`d.coordinator_address`, `d.process_id`) for the rest of
  this process's life, so that a second process of the same job given the same id on this
  machine is refused at once, in one line, instead of meeting the first inside
  `jax.distributed` (where it waits, then may abort in C++). The lock is an `flock` on a file
  in the temporary folder, released by the operating system when the process ends, however
  it ends; its descriptor is deliberately left open.

  Args:
    d: the config's `distributed` block (initialize='local').

  Returns:
    The lock file's path.

  Raises:
    ConfigError: when another live process on this machine holds the same id.
  """
  import fcntl
  import tempfile
  name = hashlib.sha256(f"{d.coordinator_address}|{int(d.process_id)}".encode()).hexdigest()[:16]
  path = os.path.join(tempfile.gettempdir(), f"fedjax_dg-process-{name}.lock")
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
    os.close(fd)
    raise ConfigError(f"distributed.process_id: {d.process_id} is already used by process {holder} on this machine "
                      f"(coordinator {d.coordinator_address}); give each of the {d.num_processes} processes its own id "
                      f"in [0, {d.num_processes - 1}], as scripts/launch_local.sh does") from None
  os.ftruncate(fd, 0)
  os.write(fd, str(os.getpid()).encode())
  return path


def _watchdog(seconds: float, line: str):
  """Exits the process with `line` unless cancelled within `seconds`."""
  def fire():
    print(f"error: {line}", file=sys.stderr, flush=True)
    os._exit(2)  # pylint: disable=protected-access  # the initializing thread is blocked in C++
  timer = threading.Timer(seconds, fire)
  timer.daemon = True
  timer.start()
  return timer


def initialize(config) -> None:
  """Starts `jax.distributed` as `config.distributed.initialize` says (a no-op for "off" and
  when it is already running). Must run before anything else uses JAX."""
  check(config)
  how = mode(config)
  if how == "off":
    return
  import jax
  from jax._src import distributed as jax_distributed  # whether it is running: no public accessor
  if jax_distributed.global_state.client is not None:
    return
  d = settings(config)
  jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes
  kwargs = dict(initialization_timeout=int(d.timeout_s) + 30, heartbeat_timeout_seconds=int(d.heartbeat_s),
                shutdown_timeout_seconds=int(d.heartbeat_s))
  if how == "local":
    claim_process_id(d)
    kwargs.update(coordinator_address=d.coordinator_address, num_processes=int(d.num_processes),
                  process_id=int(d.process_id))
    where = f"the coordinator at {d.coordinator_address}"
    if d.process_id == 0:
      line = (f"distributed.num_processes: not all {d.num_processes} processes joined {where} within "
              f"{d.timeout_s} s (distributed.timeout_s); start every process, e.g. scripts/launch_local.sh "
              f"{d.num_processes} ARGS...")
    else:
      line = (f"distributed.coordinator_address: no coordinator answered at {d.coordinator_address} within "
              f"{d.timeout_s} s (distributed.timeout_s); start process 0 there, or fix the address")
  else:
    line = (f"distributed.initialize='auto': the processes of this job did not meet within {d.timeout_s} s "
            "(distributed.timeout_s); is this a Slurm (or other auto-detected) job with every task started?")
  timer = _watchdog(float(d.timeout_s), line)
  try:
    jax.distributed.initialize(**kwargs)
  except (RuntimeError, ValueError) as e:  # no cluster detected, bad values
    raise ConfigError(f"distributed.initialize={how!r}: {' '.join(str(e).split())}") from None
  finally:
    timer.cancel()


def process_index() -> int:
  import jax
  return jax.process_index()


def process_count() -> int:
  import jax
  return jax.process_count()


def is_writer() -> bool:
  """Whether this process writes the run directory: process 0 (the only one without
  `jax.distributed`)."""
  return process_index() == 0


def config_hash(config) -> bytes:
  """32 bytes naming every field of the config but this process's id."""
  from fedjax_dg import rundir
  flat = rundir.flatten(rundir.plain(config.to_dict()))
  flat.pop("distributed.process_id", None)
  return hashlib.sha256(rundir.canonical_json(flat).encode()).digest()


class AgreedError(ConfigError):
  """A start-up failure every process raises alike; process 0 alone prints it."""


_LINE = 480  # bytes of the first failing process's line that the others receive


def _one_line(e: BaseException) -> str:
  return " ".join(str(e).split()) or type(e).__name__


def agree(config, error: BaseException | None = None) -> None:
  """Every process exchanges its config hash and its start-up error line (if any); then
  every process raises the same one-line `AgreedError` where any process failed (the first
  failing process's line) or any config hash differs, so no process goes on alone into a
  collective. A single process: re-raises `error`."""
  if process_count() == 1:
    if error is not None:
      raise error
    return
  from jax.experimental import multihost_utils
  line = _one_line(error).encode()[:_LINE] if error is not None else b""
  mine = np.frombuffer(config_hash(config) + bytes([error is not None]) + line.ljust(_LINE, b"\0"), np.uint8)
  every = np.asarray(multihost_utils.process_allgather(mine))  # [processes, 33 + _LINE]
  failed = [int(p) for p in np.nonzero(every[:, 32])[0]]
  if failed:
    first = bytes(every[failed[0], 33:]).rstrip(b"\0").decode(errors="replace")
    if error is not None and not isinstance(error, (ConfigError, OSError, ValueError, FloatingPointError)):
      raise error  # not a line for the user: its traceback
    more = f" (process {failed[0]}; every process stops)" if failed != list(range(len(every))) else ""
    raise AgreedError(f"{first}{more}") from error
  differ = [int(p) for p in range(len(every)) if not np.array_equal(every[p, :32], every[0, :32])]
  if differ:
    raise AgreedError(f"distributed: the config of process(es) {differ} differs from process 0's (config hash "
                      f"{bytes(every[differ[0], :8]).hex()} != {bytes(every[0, :8]).hex()}); start every process "
                      "with the same --config file and overrides")




# What a collective raises when another process of the job is gone.
_PEER_LOST = re.compile(r"Gloo|Connection (reset|closed|refused)|[Hh]eartbeat|UNAVAILABLE|coordination service|"
                        r"Barrier timed out|DEADLINE_EXCEEDED")
PEER_LOST_GRACE_S = 5.0


def peer_lost(e: BaseException) -> bool:
  """Whether `e` says that another process of the job is gone (its own line says why)."""
  return bool(_PEER_LOST.search(str(e)))


def fail(e: BaseException) -> None:
  """Ends this process of a multi-process run with at most one line and status 2, without
  `jax.distributed`'s shutdown barrier (which would wait for the processes it lost):
  a start-up error every process shares is printed by process 0 alone; an error that only
  says another process is gone is printed after `PEER_LOST_GRACE_S` seconds, by which time a
  launcher that saw that process fail has stopped this one (so the job shows the failed
  process's line, not one per survivor); any other error with this process's id."""
  line = " ".join(str(e).split())
  if isinstance(e, AgreedError):
    if is_writer():
      print(f"error: {line}", file=sys.stderr)
  elif peer_lost(e):
    time.sleep(PEER_LOST_GRACE_S)
    print(f"error: process {process_index()}: lost another process of the job ({line[:200]})", file=sys.stderr)
  else:
    print(f"error: process {process_index()}: {line}", file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(2)  # pylint: disable=protected-access


def topology() -> list[int]:
  """What a checkpoint records of the job that saved it.

  Returns:
    [processes, devices over every process].
  """
  import jax
  return [process_count(), jax.device_count()]


def replicated(shape_tree, other_topology: bool = False):
  """`shape_tree` (ShapeDtypeStructs) with every leaf replicated over all devices of every
  process: what a multi-process restore reads into, and what a restore of a checkpoint saved
  under another topology (`other_topology`: another process or device count) reads into,
  so that a run may be resumed with another process count. Unchanged in one process
  restoring its own topology's checkpoint."""
  import jax
  if process_count() == 1 and not other_topology:
    return shape_tree
  mesh = jax.make_mesh((jax.device_count(),), ("clients",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices())  # the engine's mesh (engine/executors.py): one mesh per round
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), shape_tree)
