"""What a run keeps in its workdir besides its metrics, and the checks that keep it whole.

  config.json         the run's resolved config (and, for a leave-one-domain-out fold, its
                      domains); a resume must match it in every field that can change results
  checkpoints/<step>  orbax checkpoints of the round state
  checkpoint_sums/    next to each checkpoint, the SHA-256 of the state it holds: a restore is
                      verified against it, and against the expected structure and finiteness
  selected/<rule>     the model parameters at the round each selection rule has chosen so
                      far (`<rule>.msgpack`, `<rule>.json`: round, validation metrics, SHA-256)

A corrupt newest checkpoint is moved to `checkpoints_corrupt/` with a one-line warning and
the newest good one is used; when none is good the resume fails with one line and nothing
is moved. Every exit path waits for (or removes) pending background saves.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from fedjax_dg.config import ConfigError

CONFIG_FILE = "config.json"
# Fields that steer a run but cannot change its results: a resume may change them
# (and `num_rounds` may grow, for a single-stage method).
RESULT_NEUTRAL = ("workdir", "resume", "quiet", "eval_batch_size", "checkpoint_every", "tensorboard")


class CheckpointError(ValueError):
  """No checkpoint of a run can be restored intact."""


def _json_default(x):
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  return str(x)


def _plain(v):
  """`v` as it reads back from JSON (tuples -> lists, numpy scalars -> numbers)."""
  return json.loads(json.dumps(v, default=_json_default))


def flatten(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _atomic_write(path: str, data: bytes) -> None:
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


# ----------------------------------------------------------------------------- the run's config

def read_run_config(workdir: str) -> dict | None:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      stored = json.load(f)
    return stored if isinstance(stored.get("config"), dict) else None
  except (OSError, ValueError, AttributeError) as e:
    raise ConfigError(f"{path}: cannot read the run's stored config ({type(e).__name__}: {e}); "
                      "restore it or choose another --config.workdir") from None


def write_run_config(config, workdir: str, fold: dict | None = None) -> None:
  record = {"config": _plain(config.to_dict())}
  if fold:
    record["fold"] = _plain(fold)
  _atomic_write(os.path.join(workdir, CONFIG_FILE), json.dumps(record, indent=2).encode())


def config_differences(stored: dict, config, multi_stage: bool) -> list[str]:
  """Result-changing fields in which `config` differs from the stored config, as
  'field: <stored> in the run, <new> now'. A field one of them lacks counts only when the
  other holds a value other than its default (`fedjax_dg.default_config()`)."""
  from fedjax_dg.bench.sweep import library_defaults
  old, new = flatten(_plain(stored)), flatten(_plain(config.to_dict()))
  defaults = {k: _plain(v) for k, v in library_defaults().items()}
  missing = object()
  out = []
  for k in sorted(set(old) | set(new)):
    if k in RESULT_NEUTRAL:
      continue
    a, b = old.get(k, defaults.get(k, missing)), new.get(k, defaults.get(k, missing))
    if a == b:
      continue
    if k == "num_rounds" and not multi_stage and isinstance(a, int) and isinstance(b, int) and b > a:
      continue  # more rounds continue the same run
    show = lambda v: "(absent)" if v is missing else json.dumps(v)
    out.append(f"{k}: {show(a)} in the run, {show(b)} now")
  return out


def has_checkpoints(workdir: str) -> bool:
  d = os.path.join(workdir, "checkpoints")
  return os.path.isdir(d) and any(n.split(".")[0].isdigit() for n in os.listdir(d))


def prepare_workdir(config, workdir: str, multi_stage: bool, fold: dict | None = None) -> None:
  """Refuses a fresh run over saved results and a resume with a result-changing field
  changed; then stores the config. Runs before anything compiles."""
  again = "pass --config.resume=True to continue that run or choose another --config.workdir"
  if not config.resume:
    if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
      raise ConfigError(f"workdir {workdir!r} already holds results (metrics.jsonl); {again}")
    if has_checkpoints(workdir):
      raise ConfigError(f"workdir {workdir!r} already holds checkpoints (checkpoints/); {again}")
  elif os.path.exists(os.path.join(workdir, "metrics.jsonl")) or has_checkpoints(workdir):
    stored = read_run_config(workdir)  # None: a run from before configs were stored
    if stored is not None:
      diff = config_differences(stored["config"], config, multi_stage)
      if diff:
        more = f" (and {len(diff) - 4} more)" if len(diff) > 4 else ""
        raise ConfigError(f"workdir {workdir!r} holds a run with another config, which a resume cannot "
                          f"continue: {'; '.join(diff[:4])}{more}; resume with the run's values or choose "
                          "another --config.workdir")
  write_run_config(config, workdir, fold)


# ----------------------------------------------------------------------------- state checks

def _inexact(tree):
  return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]


@jax.jit
def _finite(leaves):
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves] or [jnp.bool_(True)]))


def all_finite(tree) -> bool:
  """Whether every floating leaf of `tree` is finite (one scalar transfer)."""
  leaves = _inexact(tree)
  return bool(_finite(leaves)) if leaves else True


def state_digest(tree) -> str:
  """SHA-256 over every leaf's path, dtype, shape and bytes."""
  h = hashlib.sha256()
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      leaf = jax.random.key_data(leaf)
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape};".encode())
    h.update(a.tobytes())
  return h.hexdigest()


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


class Checkpoints:
  """The run's orbax checkpoints, each saved with the digest of its state and verified on restore."""

  def __init__(self, workdir: str, max_to_keep: int = 2):
    self.workdir = os.path.abspath(workdir)
    self.dir = os.path.join(self.workdir, "checkpoints")
    self.sums = os.path.join(self.workdir, "checkpoint_sums")
    self.max_to_keep = max_to_keep
    self._open()

  def _open(self):
    with _quiet_orbax():  # it logs each unreadable step it lists; restore_latest says it in one line
      self.mngr = ocp.CheckpointManager(self.dir, options=ocp.CheckpointManagerOptions(
          max_to_keep=self.max_to_keep, create=True, cleanup_tmp_directories=True))

  def _sum_path(self, step: int) -> str:
    return os.path.join(self.sums, f"{step}.json")

  def save(self, step: int, state) -> None:
    """Writes the digest, then starts orbax's background save."""
    os.makedirs(self.sums, exist_ok=True)
    _atomic_write(self._sum_path(step), json.dumps({"step": step, "sha256": state_digest(state)}).encode())
    self.mngr.save(step, args=ocp.args.StandardSave(state))
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

  def _restore_verified(self, step: int, target):
    path = os.path.join(self.dir, str(step), "default")  # the manager's item folder, read on its own
    if not os.path.isdir(path):
      raise FileNotFoundError(f"no {path}")
    with ocp.StandardCheckpointer() as reader:
      state = reader.restore(path, target)
    want, got = jax.tree.structure(target), jax.tree.structure(state)
    if want != got:
      raise ValueError(f"the restored state has structure {got}, expected {want}")
    for a, b in zip(jax.tree.leaves(target), jax.tree.leaves(state)):
      if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"a restored leaf is {b.dtype}{list(b.shape)}, expected {a.dtype}{list(a.shape)}")
    if os.path.exists(self._sum_path(step)):
      with open(self._sum_path(step)) as f:
        saved = json.load(f)["sha256"]
      if state_digest(state) != saved:
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
    self._open()

  def close(self, quietly: bool = False) -> None:
    """Waits for pending background saves and closes. `quietly` (on an error path): a
    failing save is removed, never raised over the error that is propagating."""
    try:
      self.mngr.wait_until_finished()
      self.mngr.close()
    except Exception:  # pylint: disable=broad-except
      if not quietly:
        raise
      with contextlib.suppress(Exception):
        self.mngr.close()
      if os.path.isdir(self.dir):
        for name in os.listdir(self.dir):
          if "orbax-checkpoint-tmp" in name:
            shutil.rmtree(os.path.join(self.dir, name), ignore_errors=True)


# ----------------------------------------------------------------------------- selected parameters

def save_selected(workdir: str, rule: str, round_: int, params, val: dict) -> None:
  """The parameters a selection rule has chosen (at round `round_`), written atomically."""
  from flax import serialization
  d = os.path.join(workdir, "selected")
  os.makedirs(d, exist_ok=True)
  host = jax.device_get(params)
  blob = serialization.msgpack_serialize(serialization.to_state_dict(host))
  _atomic_write(os.path.join(d, f"{rule}.msgpack"), blob)
  meta = {"rule": rule, "round": int(round_), "val": val, "sha256": hashlib.sha256(blob).hexdigest()}
  _atomic_write(os.path.join(d, f"{rule}.json"), json.dumps(meta, indent=2).encode())


def selected_round(workdir: str, rule: str) -> int | None:
  path = os.path.join(workdir, "selected", f"{rule}.json")
  try:
    with open(path) as f:
      return int(json.load(f)["round"])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def load_selected(workdir: str, rule: str, target):
  """(params shaped as `target`, meta) saved for `rule`, verified against its SHA-256."""
  from flax import serialization
  base = os.path.join(workdir, "selected", rule)
  if not os.path.exists(base + ".json") or not os.path.exists(base + ".msgpack"):
    raise FileNotFoundError(f"{base}.msgpack: no parameters saved for selection rule {rule!r} "
                            "(a run keeps them from this version on)")
  with open(base + ".json") as f:
    meta = json.load(f)
  with open(base + ".msgpack", "rb") as f:
    blob = f.read()
  if hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
    raise ValueError(f"{base}.msgpack: contents differ from what was saved (SHA-256 mismatch)")
  try:
    params = serialization.from_state_dict(target, serialization.msgpack_restore(blob))
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{base}.msgpack: does not fit the model ({_first_line(e)})") from None
  for a, b in zip(jax.tree.leaves(target), jax.tree.leaves(params)):
    if tuple(a.shape) != tuple(np.shape(b)):
      raise ValueError(f"{base}.msgpack: does not fit the model (a leaf of shape {list(np.shape(b))}, "
                       f"the model expects {list(a.shape)}); the data set's input shape or classes differ")
  return params, meta
