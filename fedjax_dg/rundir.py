"""A run directory: the files one run owns, and the one way each of them is read and written.

  LOCK           the owner: host, PID and the PID's start time of the process running the
                 run; a second process on the same directory is refused in one line, a lock
                 whose process is gone (or whose PID now belongs to another process) is stale
                 and taken over
  config.json    the run's resolved config, its identity (`run`) and, for a
                 leave-one-domain-out fold, its domains
  metrics.jsonl  one evaluation per line, each carrying the run's identity
  summary.json   the finished run's summary, carrying the run's identity
  events.jsonl   a sweep job's start / done / failed lines (fedjax_dg/bench/jobs.py)
  selected/      the parameters each selection rule has chosen so far (`<rule>.msgpack`) and
                 their record (`<rule>.json`: round, validation metrics, SHA-256, identity)
  checkpoints/, checkpoint_sums/   fedjax_dg/checkpoint.py
  checkpoint_losses.json   the training loss of each checkpoint's round, with the run's identity
                 (an evaluation of that round lost after its checkpoint is written again with it)

The identity of a run (`run_identity`) hashes every field of its config that can change
its results (all but `RESULT_NEUTRAL` and `num_rounds`, which a resume may raise) and its
fold; a resume refuses any file that carries another identity.

One policy for a JSON-lines file: a torn last line (a write cut short, no trailing newline)
is dropped with a one-line warning; any other unreadable line is an error naming the file
and the line. This module imports neither the runner nor the benchmark layer: both read
and write a run directory through it.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import socket
import time
import warnings

import numpy as np

from fedjax_dg.errors import ConfigError

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
EVENTS_FILE = "events.jsonl"
LOCK_FILE = "LOCK"
SELECTED_DIR = "selected"

# Fields that steer a run but cannot change its results: a resume may change them, a
# sweep job's key ignores them, a re-scoring may set them (and `num_rounds` may grow on
# resume, for a single-stage method).
RESULT_NEUTRAL = ("workdir", "resume", "quiet", "tensorboard", "tracking", "eval_batch_size", "checkpoint_every",
                  "distributed")


def is_writer() -> bool:
  """Whether this process writes the run directory: under `jax.distributed` process 0
  alone (fedjax_dg/distributed.py); the writers below are no-ops in the others."""
  import jax
  return jax.process_index() == 0



class RunDirError(ConfigError):
  """A file of a run directory cannot be read, or belongs to another run."""


# ----------------------------------------------------------------------------- plain values

def json_default(x):
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  return str(x)


def plain(v):
  """`v` as it reads back from JSON (tuples -> lists, numpy scalars -> numbers)."""
  return json.loads(json.dumps(v, default=json_default))


def canonical_json(tree) -> str:
  """Sorted keys, no spaces, tuples as lists: equal configs give equal strings."""
  return json.dumps(tree, sort_keys=True, separators=(",", ":"), default=strict_default)


def strict_default(x):
  """`json.dumps` default for configs: NumPy scalars as Python numbers; anything else refused."""
  if isinstance(x, np.generic):
    return x.item()
  raise TypeError(f"cannot serialise {type(x).__name__} in a config")


def flatten(tree, prefix: str = "") -> dict:
  """Nested dicts / ConfigDicts -> {"a.b.c": leaf}."""
  out = {}
  for k, v in (tree.items() if hasattr(tree, "items") else ()):
    if hasattr(v, "items") and not isinstance(v, (str, bytes)):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def config_from_json(d):
  """A config back from its JSON form (lists become the tuples config files use)."""
  import ml_collections

  def fix(v):
    if isinstance(v, dict):
      return {k: fix(x) for k, x in v.items()}
    if isinstance(v, list):
      return tuple(fix(x) for x in v)
    return v
  return ml_collections.ConfigDict(fix(d))


@functools.lru_cache(maxsize=None)
def library_defaults() -> dict:
  """The library's default config (`fedjax_dg.default_config()`), flattened, as JSON values."""
  from fedjax_dg.defaults import default_config
  return {k: json.loads(canonical_json(v)) for k, v in flatten(default_config()).items()}


def run_identity(config, fold: dict | None = None) -> str:
  """16 hex digits naming the run: its result-changing fields (those equal to their library
  default left out, so a field added later with a default keeps every identity) and fold."""
  flat = flatten(plain(config.to_dict() if hasattr(config, "to_dict") else config))
  defaults = library_defaults()
  kept = {k: v for k, v in flat.items()
          if k.split(".")[0] not in RESULT_NEUTRAL and k != "num_rounds" and (k not in defaults or v != defaults[k])}
  text = canonical_json({"config": kept, "fold": plain(fold or {})})
  return hashlib.sha256(text.encode()).hexdigest()[:16]


class WriteError(OSError):
  """A run-directory file or folder could not be written (a full disk, the file-size limit,
  a read-only folder): one line naming it and the cause. What was being written is removed
  (or, for a checkpoint, left without a checksum, so no resume trusts it)."""

  def __init__(self, path: str, cause: str, code: int | None = None):
    super().__init__(code, cause, path)
    self.cause = cause

  def __str__(self):
    return (f"{self.filename}: cannot write it ({self.cause}); nothing half-written is kept: make room or "
            "lift the limit, then resume with --config.resume=True")


_CAUSES = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
           errno.EFBIG: "larger than the file-size limit (ulimit -f, RLIMIT_FSIZE)",
           errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
           errno.EPERM: "operation not permitted", errno.ENOTDIR: "a file where a folder belongs",
           errno.ENOENT: "the folder is gone"}


def write_cause(e: BaseException) -> tuple[str, int | None]:
  """(the cause of a failed write in words, its errno): from an OSError, or from the text of
  a wrapped one (TensorStore reports `[os_error_code='28']` and the C library's wording)."""
  code = e.errno if isinstance(e, OSError) and e.errno else None
  text = str(e)
  if code is None:
    m = re.search(r"os_error_code='?(\d+)", text)
    code = int(m.group(1)) if m else next((c for c in _CAUSES if os.strerror(c) in text), None)
  if code is not None:
    return _CAUSES.get(code, os.strerror(code)), code
  lines = text.strip().splitlines()
  return f"{type(e).__name__}: {lines[0][:200] if lines else ''}", None


def write_error(path: str, e: BaseException) -> WriteError:
  """`e`, raised while writing `path`, as a WriteError naming `path`."""
  if isinstance(e, WriteError):
    return e
  return WriteError(path, *write_cause(e))


def atomic_write(path: str, data: bytes) -> None:
  """Writes `path` in one step: a kill leaves the old file or the new one; a failed write
  (a full disk, the file-size limit) leaves the old one and raises a WriteError naming `path`."""
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    _write_file(tmp, data)
    os.replace(tmp, path)
  except BaseException as e:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    if isinstance(e, OSError):
      raise write_error(path, e) from None
    raise


def _write_file(path: str, data: bytes) -> None:
  with open(path, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def _path(workdir: str, name: str) -> str:
  return os.path.join(workdir, name)


# ----------------------------------------------------------------------------- JSON files

def read_json(path: str, what: str):
  """The JSON object in `path`, None when the file does not exist; unreadable -> one line."""
  if not os.path.lexists(path):
    return None
  try:
    with open(path, "rb") as f:
      obj = json.loads(f.read().decode("utf-8"))
  except (OSError, ValueError) as e:
    raise RunDirError(f"{path}: cannot read {what} ({_why(e)})") from None
  if not isinstance(obj, dict):
    raise RunDirError(f"{path}: {what} is not a JSON object")
  return obj


def _why(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  return f"{type(e).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def read_jsonl(path: str, what: str = "a record") -> list[dict]:
  """Every JSON object of a JSON-lines file ([] when it does not exist). A torn last line is
  dropped with a warning; any other line that is not a JSON object is an error naming it."""
  if not os.path.lexists(path):
    return []
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    raise RunDirError(f"{path}: cannot read it ({_why(e)})") from None
  lines = raw.split(b"\n")
  torn = lines[-1].strip() != b""  # the last line lacks its newline: a write was cut short
  out = []
  for n, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      rec = json.loads(line.decode("utf-8"))
      if not isinstance(rec, dict):
        raise ValueError(f"a JSON {type(rec).__name__}, not an object")
    except ValueError as e:
      if torn and n == len(lines):
        warnings.warn(f"{path}: line {n} is torn (a write cut short); ignoring it")
        continue
      raise RunDirError(f"{path}: line {n} is not {what} ({_why(e)})") from None
    out.append(rec)
  return out


# ----------------------------------------------------------------------------- metrics.jsonl

def read_metrics(workdir: str) -> list[dict]:
  """The evaluations of `workdir`'s run, each with an integer `round`."""
  path = _path(workdir, METRICS_FILE)
  recs = read_jsonl(path, "an evaluation record")
  for k, r in enumerate(recs):
    try:
      r["round"] = int(r["round"])
      if not isinstance(r.get("splits", {}), dict):
        raise TypeError("its 'splits' is not an object")
    except (KeyError, TypeError, ValueError) as e:
      raise RunDirError(f"{path}: record {k + 1} is not an evaluation record ({_why(e)})") from None
  return recs


def write_metrics(workdir: str, records) -> None:
  """Replaces metrics.jsonl in one step (process 0 only)."""
  if not is_writer():
    return
  atomic_write(_path(workdir, METRICS_FILE), "".join(json.dumps(r, default=json_default) + "\n"
                                                     for r in records).encode())


def check_identity(workdir: str, records, run: str) -> None:
  """Refuses metrics records of another run (or of none)."""
  path = _path(workdir, METRICS_FILE)
  for k, r in enumerate(records):
    if r.get("run") != run:
      other = f"run {r['run']}" if r.get("run") else "no run identity"
      raise RunDirError(f"{path}: record {k + 1} (round {r['round']}) carries {other}, this config is run {run}; "
                        "resume with the run's config or choose another --config.workdir")


# ----------------------------------------------------------------------------- summary.json

def read_summary(workdir: str) -> dict | None:
  """The finished run's summary; None before it finishes; unreadable -> one line."""
  s = read_json(_path(workdir, SUMMARY_FILE), "the run's summary")
  if s is not None and not isinstance(s.get("selection", {}), dict):
    raise RunDirError(f"{_path(workdir, SUMMARY_FILE)}: its 'selection' is not an object")
  return s


def write_summary(workdir: str, summary: dict) -> None:
  if not is_writer():
    return
  atomic_write(_path(workdir, SUMMARY_FILE), json.dumps(summary, indent=2, default=json_default).encode())


# ----------------------------------------------------------------------------- config.json

def read_run_config(workdir: str) -> dict | None:
  """{"config", "run", "fold"?} stored by the run; None when there is none."""
  path = _path(workdir, CONFIG_FILE)
  stored = read_json(path, "the run's stored config")
  if stored is None:
    return None
  if not isinstance(stored.get("config"), dict):
    raise RunDirError(f"{path}: holds no 'config' object; restore it or choose another --config.workdir")
  return stored


def write_run_config(config, workdir: str, fold: dict | None = None, run: str | None = None) -> str:
  """Stores the config and its identity (default: `run_identity`; process 0 writes);
  returns the identity."""
  run = run or run_identity(config, fold)
  if not is_writer():
    return run
  record = {"run": run, "config": plain(config.to_dict())}
  if fold:
    record["fold"] = plain(fold)
  atomic_write(_path(workdir, CONFIG_FILE), json.dumps(record, indent=2).encode())
  return run


def config_differences(stored: dict, config, multi_stage: bool) -> list[str]:
  """Result-changing fields in which `config` differs from the stored config, as
  'field: <stored> in the run, <new> now'. A field one of them lacks counts only when the
  other holds a value other than its configs/default.py default."""
  old, new = flatten(plain(stored)), flatten(plain(config.to_dict()))
  defaults = library_defaults()
  missing = object()
  out = []
  for k in sorted(set(old) | set(new)):
    if k.split(".")[0] in RESULT_NEUTRAL:
      continue
    a, b = old.get(k, defaults.get(k, missing)), new.get(k, defaults.get(k, missing))
    if a == b:
      continue
    if k == "num_rounds" and not multi_stage and isinstance(a, int) and isinstance(b, int) and b > a:
      continue  # more rounds continue the same run
    show = lambda v: "(absent)" if v is missing else json.dumps(v)
    out.append(f"{k}: {show(a)} in the run, {show(b)} now")
  return out


# ----------------------------------------------------------------------------- events.jsonl

def append_event(workdir: str, kind: str, **extra) -> None:
  import datetime
  if not is_writer():
    return
  rec = {"event": kind, "host": socket.gethostname(), "pid": os.getpid(),
         "time": datetime.datetime.now().isoformat(timespec="seconds"), **extra}
  path = _path(workdir, EVENTS_FILE)
  try:
    with open(path, "a") as f:
      f.write(json.dumps(rec) + "\n")
  except OSError as e:  # a partial line is a torn last line, which read_jsonl tolerates
    raise write_error(path, e) from None


def read_events(workdir: str) -> list[dict]:
  recs = read_jsonl(_path(workdir, EVENTS_FILE), "an event record")
  return [r for r in recs if isinstance(r.get("event"), str)]


# ----------------------------------------------------------------------------- selected/

def save_selected(workdir: str, rule: str, round_: int, params, val: dict, run: str | None = None) -> None:
  """The parameters a selection rule has chosen (at round `round_`), written atomically
  (process 0 only)."""
  import jax
  from flax import serialization
  if not is_writer():
    return
  d = _path(workdir, SELECTED_DIR)
  try:
    os.makedirs(d, exist_ok=True)
  except OSError as e:
    raise write_error(d, e) from None
  blob = serialization.msgpack_serialize(serialization.to_state_dict(jax.device_get(params)))
  meta = {"rule": rule, "round": int(round_), "val": val, "sha256": hashlib.sha256(blob).hexdigest()}
  if run:
    meta["run"] = run
  files = [(os.path.join(d, f"{rule}.msgpack"), blob),
           (os.path.join(d, f"{rule}.json"), json.dumps(meta, indent=2, default=json_default).encode())]
  tmps = [f"{path}.tmp-{os.getpid()}" for path, _ in files]
  try:  # both written in full before either replaces its old file: a full disk keeps the old pair
    for tmp, (path, data) in zip(tmps, files):
      try:
        _write_file(tmp, data)
      except OSError as e:
        raise write_error(path, e) from None
    for tmp, (path, _) in zip(tmps, files):
      os.replace(tmp, path)
  finally:
    for tmp in tmps:
      with contextlib.suppress(OSError):
        os.remove(tmp)


def selected_round(workdir: str, rule: str, run: str | None = None) -> int | None:
  """The round of the parameters saved for `rule` (of run `run`, when given); None if none."""
  try:
    meta = read_json(os.path.join(workdir, SELECTED_DIR, f"{rule}.json"), "a selection record")
    if meta is None or (run is not None and meta.get("run") != run):
      return None
    return int(meta["round"])
  except (RunDirError, KeyError, TypeError, ValueError):
    return None


def load_selected(workdir: str, rule: str, target):
  """(params shaped as `target`, meta) saved for `rule`, verified against its SHA-256."""
  import jax
  from flax import serialization
  base = os.path.join(workdir, SELECTED_DIR, rule)
  if not os.path.exists(base + ".json") or not os.path.exists(base + ".msgpack"):
    raise FileNotFoundError(f"{base}.msgpack: no parameters saved for selection rule {rule!r} "
                            "(a run keeps them from this version on)")
  meta = read_json(base + ".json", "a selection record")
  if not isinstance(meta.get("round"), int) or not isinstance(meta.get("sha256"), str):
    raise RunDirError(f"{base}.json: not a selection record (needs an integer 'round' and a 'sha256')")
  with open(base + ".msgpack", "rb") as f:
    blob = f.read()
  if hashlib.sha256(blob).hexdigest() != meta["sha256"]:
    raise RunDirError(f"{base}.msgpack: contents differ from what was saved (SHA-256 mismatch)")
  try:
    params = serialization.from_state_dict(target, serialization.msgpack_restore(blob))
  except Exception as e:  # pylint: disable=broad-except  # msgpack raises its own kinds
    raise RunDirError(f"{base}.msgpack: does not fit the model ({_why(e)})") from None
  for a, b in zip(jax.tree.leaves(target), jax.tree.leaves(params)):
    if tuple(a.shape) != tuple(np.shape(b)):
      raise RunDirError(f"{base}.msgpack: does not fit the model (a leaf of shape {list(np.shape(b))}, "
                        f"the model expects {list(a.shape)}); the data set's input shape or classes differ")
  return params, meta


# ----------------------------------------------------------------------------- owners

def _proc_start(pid: int) -> str | None:
  """The start time of process `pid` (Linux: field 22 of /proc/<pid>/stat), None elsewhere."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _pid_alive(pid: int) -> bool:
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def owner_record() -> dict:
  return {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": _proc_start(os.getpid()),
          "start": time.time()}


def read_lock(path: str) -> dict | None:
  """A lock file's owner record; None when there is none; {"malformed": why} when unreadable."""
  try:
    with open(path, "rb") as f:
      rec = json.loads(f.read().decode("utf-8"))
    if not isinstance(rec, dict) or not isinstance(rec.get("pid"), int) or not isinstance(rec.get("host"), str):
      return {"malformed": "not an owner record"}
    return rec
  except FileNotFoundError:
    return None
  except IsADirectoryError:
    return {"malformed": "a folder, not a file"}
  except (OSError, ValueError) as e:
    return {"malformed": _why(e)}


def lock_is_live(lock: dict | None) -> bool:
  """A lock of a process on this host that still exists (the same process: its start time
  matches); a lock from another host (a cluster node) is taken as live; a malformed lock
  (no process wrote it whole: locks are created in one step) is not."""
  if lock is None or "malformed" in lock:
    return False
  if lock.get("host") != socket.gethostname():
    return True
  pid = int(lock["pid"])
  if not _pid_alive(pid):
    return False
  started = lock.get("pid_start")
  return started is None or _proc_start(pid) in (None, started)


def try_lock(path: str) -> dict | None:
  """Creates the lock file `path` owned by this process, in one step. Returns None when it
  is now ours, else the live owner's record. A stale or malformed lock is taken over (with
  a warning naming it)."""
  if os.path.isdir(path):
    raise RunDirError(f"{path}: a folder where the lock file belongs; remove it")
  mine = owner_record()
  tmp = f"{path}.{os.getpid()}.new"
  with open(tmp, "w") as f:
    json.dump(mine, f)
  try:
    for _ in range(3):
      try:
        os.link(tmp, path)  # atomic, fails if the lock exists: never a half-written lock
        return None
      except FileExistsError:
        held = read_lock(path)
        if held is None:
          continue  # released meanwhile
        if held.get("pid") == os.getpid() and held.get("host") == mine["host"] and "malformed" not in held:
          return held  # this process holds it already (a second run in one process)
        if lock_is_live(held):
          return held
        aside = f"{path}.stale-{os.getpid()}"
        try:
          os.rename(path, aside)  # only one process takes a stale lock over
        except FileNotFoundError:
          continue
        if read_lock(aside) != held:  # another process took it over between our read and rename
          with contextlib.suppress(OSError):
            os.link(aside, path)
          os.remove(aside)
          continue
        os.remove(aside)
        why = held.get("malformed") or f"process {held['pid']} on {held['host']} is gone"
        warnings.warn(f"{path}: taking over a stale lock ({why})")
    return read_lock(path) or {"malformed": "contended"}
  finally:
    with contextlib.suppress(OSError):
      os.remove(tmp)


def release_lock(path: str) -> None:
  """Removes the lock file if this process holds it."""
  held = read_lock(path)
  if held and held.get("pid") == os.getpid() and held.get("host") == socket.gethostname():
    with contextlib.suppress(FileNotFoundError):
      os.remove(path)


def describe_owner(held: dict) -> str:
  when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held["start"])) if isinstance(
      held.get("start"), (int, float)) else "an unknown time"
  return f"process {held.get('pid')} on {held.get('host')} (since {when})"


@contextlib.contextmanager
def owned(workdir: str):
  """Holds `workdir`'s LOCK for the block; another live owner, or a workdir that cannot be
  created or written (below a file, read-only, a device) -> one line. Under
  `jax.distributed` process 0 holds it for every process of the run."""
  path = _path(workdir, LOCK_FILE)
  if not is_writer():
    yield
    return
  try:
    os.makedirs(workdir, exist_ok=True)
    held = try_lock(path)
  except OSError as e:
    raise RunDirError(f"workdir {workdir!r}: cannot write there ({_why(e)}); choose another --config.workdir") from None
  if held is not None and held.get("pid") == os.getpid() and held.get("host") == socket.gethostname():
    yield  # already ours (an outer block holds it)
    return
  if held is not None:
    raise RunDirError(f"workdir {workdir!r} is in use by {describe_owner(held)}; wait for that run to end, "
                      f"or remove {path} if it is not running, or choose another --config.workdir")
  try:
    yield
  finally:
    release_lock(path)


# ----------------------------------------------------------------------------- what a directory holds

def holds_results(workdir: str) -> list[str]:
  """The files of a run that a fresh run would overwrite."""
  found = [n for n in (METRICS_FILE, SUMMARY_FILE) if os.path.lexists(_path(workdir, n))]
  d = _path(workdir, "checkpoints")
  if os.path.isdir(d) and any(n.split(".")[0].isdigit() for n in os.listdir(d)):
    found.append("checkpoints/")
  if os.path.lexists(_path(workdir, SELECTED_DIR)):
    found.append(SELECTED_DIR + "/")
  return found


def prepare(config, workdir: str, multi_stage: bool, fold: dict | None = None) -> str:
  """Refuses a fresh run over another run's files, and a resume of files no config.json
  describes or whose config differs in a result-changing field; then stores the config.
  Returns the run's identity (a resumed run keeps the one it started with). Runs before
  anything compiles."""
  again = "pass --config.resume=True to continue that run or choose another --config.workdir"
  found = holds_results(workdir)
  if not config.resume:
    if found:
      what = ("results" if set(found) & {METRICS_FILE, SUMMARY_FILE} else
              "checkpoints" if "checkpoints/" in found else "selected parameters")
      raise ConfigError(f"workdir {workdir!r} already holds {what} ({', '.join(found)}); {again}")
    return write_run_config(config, workdir, fold)
  if not found:
    return write_run_config(config, workdir, fold)
  stored = read_run_config(workdir)
  if stored is None:
    raise ConfigError(f"workdir {workdir!r} holds {', '.join(found)} but no {CONFIG_FILE}, so no resume can tell "
                      f"which config made them; restore {CONFIG_FILE} or choose another --config.workdir")
  diff = config_differences(stored["config"], config, multi_stage)
  if fold and stored.get("fold") and plain(stored["fold"]) != plain(fold):
    diff.append(f"fold: {json.dumps(stored['fold'])} in the run, {json.dumps(plain(fold))} now")
  if diff:
    more = f" (and {len(diff) - 4} more)" if len(diff) > 4 else ""
    raise ConfigError(f"workdir {workdir!r} holds a run with another config, which a resume cannot "
                      f"continue: {'; '.join(diff[:4])}{more}; resume with the run's values or choose "
                      "another --config.workdir")
  return write_run_config(config, workdir, fold, run=stored.get("run") or run_identity(config, fold))
