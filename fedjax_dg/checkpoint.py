"""A run's orbax checkpoints, and the checks that keep them whole and its own.

  checkpoints/<step>  orbax checkpoints of {"round", "run", "state"}: the round state, with
                      the round it follows and the run's identity (fedjax_dg/rundir.py)
  checkpoint_sums/    next to each checkpoint, {"step", "run", "sha256"}: the SHA-256 of the
                      state it holds; a restore is verified against it, against the round and
                      identity stored inside the checkpoint, the expected structure and finiteness

Client states held in host memory (`engine.host_client_states`, `HostClientStates`) are
saved sparsely: the ids of the clients once sampled and their states, nothing for the
others; the checksum file records how many. Under `jax.distributed` every process takes
part in each save and restore (orbax's multi-process protocol, one directory); process 0
alone writes the checksum files and moves corrupt checkpoints aside.

A checkpoint that fails any check (corrupt, no checksum file, another round's contents under
this step, another run's) is moved to `checkpoints_corrupt/` with a one-line warning and the
newest good one is used; when none is good the resume fails with one line and nothing is
moved. Every exit path waits for (or removes) pending background saves.

A save that fails (a full disk, the file-size limit, `checkpoints/` made read-only while
orbax writes in the background) is reported as one line naming the checkpoint and the
cause (`rundir.WriteError`), at the next save or at the end of the run, whichever comes
first; what it left is removed (orbax's temporary folders, its step folder) and so is its
checksum file, so a resume never trusts it and continues from the newest intact checkpoint.
While a manager is open, orbax's own log records (each failure logged at length from its
background threads) are dropped: the one line says it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import traceback
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from fedjax_dg import rundir
from fedjax_dg.engine.host_state import HostClientStates, host_value



class CheckpointError(ValueError):
  """No checkpoint of a run can be restored intact."""


# ----------------------------------------------------------------------------- state checks

def _is_host(x) -> bool:
  return isinstance(x, HostClientStates)


def saveable(tree):
  """`tree` with each host-held client-state table as its sparse form (`HostClientStates.sparse`)."""
  return jax.tree.map(lambda x: x.sparse() if _is_host(x) else x, tree)


def device_view(tree):
  """`tree` with each host-held table as one client's stacked state `[1, ...]` (for shape-only
  uses such as `jax.eval_shape`)."""
  return jax.tree.map(lambda x: x.gather(np.zeros((1,), np.int64)) if _is_host(x) else x, tree)


def shape_of(tree):
  """`jax.eval_shape` of `tree`'s leaves; host-held tables are kept as they are (a restore
  target's template)."""
  return jax.tree.map(lambda x: x if _is_host(x) else jax.eval_shape(lambda: x), tree)


def _host_counts(tree) -> list[int]:
  return [x.used for x in jax.tree.leaves(tree) if _is_host(x)]


def _inexact(tree):
  return [x for x in jax.tree.leaves(saveable(tree)) if jnp.issubdtype(x.dtype, jnp.inexact)]


@jax.jit
def _finite(leaves):
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves] or [jnp.bool_(True)]))


def all_finite(tree) -> bool:
  """Whether every floating leaf of `tree` is finite (one scalar transfer; host-held client
  states are checked on the host, where they are)."""
  leaves = _inexact(tree)
  on_host = [x for x in leaves if isinstance(x, np.ndarray)]
  if not all(np.isfinite(x).all() for x in on_host):
    return False
  leaves = [x for x in leaves if not isinstance(x, np.ndarray)]
  return bool(_finite(leaves)) if leaves else True


def state_digest(tree) -> str:
  """SHA-256 over every leaf's path, dtype, shape and bytes."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(saveable(tree))[0]:
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      leaf = jax.random.key_data(leaf)
    a = np.ascontiguousarray(host_value(leaf))
    h.update(f"{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape};".encode())
    h.update(a.tobytes())
  return h.hexdigest()


def _replicated(target, saved_topology=None):
  """The restore target; under `jax.distributed`, or for a checkpoint saved under another
  topology (`saved_topology`, [processes, devices], from its checksum file), every array
  replicated over all devices."""
  from fedjax_dg import distributed
  return distributed.replicated(target, saved_topology is not None and saved_topology != distributed.topology())


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  line = f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
  line = re.sub(r"\.?\s*See full TensorStore details.*", "", line)  # then a method's repr, with an address
  line = re.sub(r"\s*\[source locations=.*", "", line)  # newer TensorStore: its C++ source lines
  return line


# ----------------------------------------------------------------------------- checkpoints

@contextlib.contextmanager
def _quiet_orbax():
  from absl import logging
  level = logging.get_verbosity()
  logging.set_verbosity(logging.FATAL)
  try:
    yield
  finally:
    logging.set_verbosity(level)


class _DropOrbaxRecords(logging.Filter):
  """Drops log records emitted from orbax's modules (its background save threads log a
  failed write with a traceback per array; `Checkpoints` reports it in one line)."""

  def filter(self, record):
    return f"{os.sep}orbax{os.sep}" not in record.pathname


def _closed_loop_noise(exc_type, exc, tb) -> bool:
  """Whether an exception reported through `sys.unraisablehook` (or `sys.excepthook`) is
  TensorStore calling back into the event loop orbax has closed after a failed save ("Event
  loop is closed" from asyncio's `call_soon_threadsafe`): noise after the failure the run
  reports in one line."""
  last = traceback.extract_tb(tb)[-1:] if tb is not None else []
  return (exc_type is RuntimeError and "Event loop is closed" in str(exc)
          and any(f.filename.endswith(os.path.join("asyncio", "base_events.py")) for f in last))


class _DropOrbaxUnretrieved(logging.Filter):
  """Drops asyncio's "exception was never retrieved" record for a future whose exception was
  raised in orbax (a failed write of a background save, collected when the process ends):
  one raised in an orbax module, or one whose message names a save's temporary directory
  (`*.orbax-checkpoint-tmp*`, as TensorStore's writer raises them with no orbax frame)."""

  def filter(self, record):
    exc = record.exc_info[1] if record.exc_info else None
    tb = exc.__traceback__ if exc is not None else None
    in_orbax = tb is not None and any(f"{os.sep}orbax{os.sep}" in f.filename for f in traceback.extract_tb(tb))
    in_orbax = in_orbax or (exc is not None and ".orbax-checkpoint-tmp" in str(exc))
    return not (in_orbax and "exception was never retrieved" in record.getMessage())


def quiet_failed_saves() -> None:
  """For a command-line process: orbax's log records and the closed-loop noise of a failed
  background save are dropped for the life of the process (they may come after the run
  has stopped; the run's one-line error says what failed)."""
  logging.getLogger("absl").addFilter(_DropOrbaxRecords())
  logging.getLogger("asyncio").addFilter(_DropOrbaxUnretrieved())
  unraisable, hook = sys.unraisablehook, sys.excepthook

  def unraisablehook(u):
    if not _closed_loop_noise(u.exc_type, u.exc_value, u.exc_traceback):
      unraisable(u)

  def excepthook(exc_type, exc, tb):
    if not _closed_loop_noise(exc_type, exc, tb):
      hook(exc_type, exc, tb)
  sys.unraisablehook, sys.excepthook = unraisablehook, excepthook


class Checkpoints:
  """The run's orbax checkpoints, each saved with the digest of its state and verified on restore."""

  def __init__(self, workdir: str, max_to_keep: int = 2, run: str | None = None):
    self.workdir = os.path.abspath(workdir)
    self.run = run  # the run's identity (rundir.run_identity); None: not checked
    self.dir = os.path.join(self.workdir, "checkpoints")
    self.sums = os.path.join(self.workdir, "checkpoint_sums")
    self.max_to_keep = max_to_keep
    self._pending = None  # the step of the background save in flight
    self._filter = _DropOrbaxRecords()
    logging.getLogger("absl").addFilter(self._filter)
    self._open()

  def _open(self):
    with _quiet_orbax():  # it logs each unreadable step it lists; restore_latest says it in one line
      self.mngr = ocp.CheckpointManager(self.dir, options=ocp.CheckpointManagerOptions(
          max_to_keep=self.max_to_keep, create=True, cleanup_tmp_directories=True,
          # step folders made before save() returns: when they cannot be made (a read-only
          # checkpoints/), asynchronous creation leaves background threads waiting minutes
          # for them, which holds the process open after the run has stopped
          async_options=ocp.AsyncOptions(create_directories_asynchronously=False)))

  def _sum_path(self, step: int) -> str:
    return os.path.join(self.sums, f"{step}.json")

  def _wrap(self, step: int, state):
    run = bytes.fromhex(self.run) if self.run else bytes(8)
    return {"round": np.asarray(step, np.int32), "run": np.frombuffer(run, np.uint8).copy(), "state": state}

  def save(self, step: int, state) -> None:
    """Writes the digest (process 0), then starts orbax's background save (every process).
    The previous save's failure (or this one's, when it fails at once) is raised here as a
    one-line rundir.WriteError."""
    self._wait()
    writer = rundir.is_writer()
    from fedjax_dg import distributed
    record = {"step": step, "run": self.run, "sha256": state_digest(state),  # every process: may gather
              "topology": distributed.topology()}
    if _host_counts(state):
      record["host_client_states"] = _host_counts(state)
    if writer:
      try:
        os.makedirs(self.sums, exist_ok=True)
      except OSError as e:
        raise rundir.write_error(self.sums, e) from None
      rundir.atomic_write(self._sum_path(step), json.dumps(record).encode())
    self._pending = step
    try:
      self.mngr.save(step, args=ocp.args.StandardSave(self._wrap(step, saveable(state))))
    except Exception as e:  # pylint: disable=broad-except  # orbax/TensorStore wrap the OSError
      raise self._failed(e) from None
    if not writer:
      return
    keep = {str(s) for s in self.mngr.all_steps()} | {str(step)}
    for name in os.listdir(self.sums):  # digests of checkpoints orbax has since deleted
      if name.endswith(".json") and name[:-5] not in keep:
        with contextlib.suppress(FileNotFoundError):
          os.remove(os.path.join(self.sums, name))

  def _steps_on_disk(self) -> list[int]:
    steps = set(int(s) for s in self.mngr.all_steps())
    if os.path.isdir(self.dir):  # also step folders orbax does not list (an empty one, say)
      steps |= {int(n) for n in os.listdir(self.dir) if n.isdigit() and os.path.isdir(os.path.join(self.dir, n))}
    return sorted(steps, reverse=True)

  def _read_sum(self, step: int) -> dict:
    path = self._sum_path(step)
    if not os.path.exists(path):
      raise ValueError(f"it has no checksum file ({os.path.relpath(path, self.workdir)})")
    saved = rundir.read_json(path, "a checkpoint checksum")
    if not isinstance(saved.get("sha256"), str) or saved.get("step") != step:
      raise ValueError(f"its checksum file is not this step's (step {saved.get('step')!r})")
    if self.run and saved.get("run") != self.run:
      raise ValueError(f"its checksum file is run {saved.get('run')}'s, this is run {self.run}")
    return saved

  def _restore_verified(self, step: int, target):
    saved = self._read_sum(step)
    path = os.path.join(self.dir, str(step), "default")  # the manager's item folder, read on its own
    if not os.path.isdir(path):
      raise FileNotFoundError(f"no {path}")
    template = target
    counts = saved.get("host_client_states", [])
    if len(counts) != len(_host_counts(template)):
      raise ValueError(f"its checksum file records {len(counts)} host-held client-state table(s), this run has "
                       f"{len(_host_counts(template))} (engine.host_client_states differs)")
    counts = iter(counts)
    target = jax.tree.map(lambda x: x.sparse_shape(int(next(counts))) if _is_host(x) else x, template)
    target = {"round": jax.ShapeDtypeStruct((), np.int32), "run": jax.ShapeDtypeStruct((8,), np.uint8), "state": target}
    with ocp.StandardCheckpointer() as reader:
      whole = reader.restore(path, _replicated(target, saved.get("topology")))
    want, got = jax.tree.structure(target), jax.tree.structure(whole)
    if want != got:
      raise ValueError(f"the restored state has structure {got}, expected {want}")
    for a, b in zip(jax.tree.leaves(target), jax.tree.leaves(whole)):
      if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"a restored leaf is {b.dtype}{list(b.shape)}, expected {a.dtype}{list(a.shape)}")
    stored_round = int(np.asarray(whole["round"]))
    if stored_round != step:
      raise ValueError(f"it holds round {stored_round}'s state, not round {step}'s")
    stored_run = bytes(np.asarray(whole["run"], np.uint8)).hex()
    if self.run and stored_run != self.run:
      raise ValueError(f"it holds run {stored_run}'s state, this is run {self.run}")
    state = jax.tree.map(lambda t, got: t.from_sparse(got) if _is_host(t) else got, template, whole["state"],
                         is_leaf=_is_host)
    if state_digest(state) != saved["sha256"]:
      raise ValueError("its contents differ from what was saved (SHA-256 mismatch)")
    if not all_finite(state):
      raise ValueError("it holds NaN or inf")
    return state

  def restore_latest(self, target_of):
    """(step, state) of the newest checkpoint that restores intact, `target_of(step)` giving
    its expected structure; (None, None) when there is none. Newer corrupt ones are moved to
    `checkpoints_corrupt/` with a one-line warning; when every one is corrupt, one line."""
    bad, found = [], None
    with _quiet_orbax():  # orbax logs a failed restore at length; the warning says it in one line
      for step in self._steps_on_disk():
        try:
          found = (step, self._restore_verified(step, target_of(step)))
          break
        except Exception as e:  # pylint: disable=broad-except  # any failure means: not this one
          bad.append((step, _first_line(e)))
    why = "; ".join(f"checkpoint {s}: {r}" for s, r in bad)
    if found is None and bad:
      raise CheckpointError(f"{self.dir}: no checkpoint restores intact ({why}); move the folder away "
                            "to rerun from the start")
    if found is None:
      return None, None
    if bad:
      self._set_aside([s for s, _ in bad])
      warnings.warn(f"{self.dir}: skipping corrupt checkpoint(s) ({why}); moved to "
                    f"{self.workdir}/checkpoints_corrupt/, resuming from checkpoint {found[0]}")
    return found

  def _set_aside(self, steps) -> None:
    self.mngr.close()
    if rundir.is_writer():
      self._move_aside(steps)
    ocp.multihost.sync_global_processes("fedjax_dg_checkpoints_set_aside")  # the others wait for the move
    self._open()

  def _move_aside(self, steps) -> None:
    aside = os.path.join(self.workdir, "checkpoints_corrupt")
    os.makedirs(aside, exist_ok=True)
    for s in steps:
      dest = os.path.join(aside, str(s))
      k = 1
      while os.path.exists(dest):
        dest, k = os.path.join(aside, f"{s}.{k}"), k + 1
      shutil.move(os.path.join(self.dir, str(s)), dest)
      with contextlib.suppress(FileNotFoundError):
        os.remove(self._sum_path(s))

  def _wait(self) -> None:
    """Waits for the background save; its failure as a one-line rundir.WriteError."""
    try:
      self.mngr.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._failed(e) from None
    self._pending = None

  def _failed(self, e: BaseException) -> rundir.WriteError:
    """Removes what the failed save of step `_pending` left (its checksum file first, so a
    partial checkpoint is never trusted, then its folders where they can be removed) and
    returns the error naming it."""
    step, self._pending = self._pending, None
    where = os.path.join(self.dir, str(step)) if step is not None else self.dir
    if step is not None and rundir.is_writer():  # process 0 owns the files
      with contextlib.suppress(OSError):
        os.remove(self._sum_path(step))
      shutil.rmtree(where, ignore_errors=True)
    self._remove_tmp()
    return rundir.write_error(where, e)

  def _remove_tmp(self) -> None:
    if not rundir.is_writer():  # process 0 owns the files
      return
    with contextlib.suppress(OSError):
      for name in os.listdir(self.dir):
        if "orbax-checkpoint-tmp" in name:
          shutil.rmtree(os.path.join(self.dir, name), ignore_errors=True)

  def close(self, quietly: bool = False) -> None:
    """Waits for pending background saves and closes. `quietly` (on an error path): a
    failing save is removed, never raised over the error that is propagating."""
    try:
      try:
        self._wait()
        self.mngr.close()
      except Exception:  # pylint: disable=broad-except
        with contextlib.suppress(Exception):
          self.mngr.close()
        if self._pending is not None:
          self._failed(RuntimeError("the run stopped"))
        self._remove_tmp()
        if not quietly:
          raise
    finally:
      logging.getLogger("absl").removeFilter(self._filter)
