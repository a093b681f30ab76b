"""What produced a run: package versions, the machine, the project's git commit (and whether
the tree was clean), a fingerprint of the code that decides its numbers (`fingerprint_of`:
the parsed code, so docstrings and comments do not count, and not the readers, the launcher
or the preparation tool), and what else decides its results bit for bit (`determinism`: the
host CPU's vector features XLA compiles for, threads, XLA flags, versions). The runner
records it in summary.json (`"provenance": provenance()`); the benchmark layer reads it: a
finished job whose source fingerprint differs from the current code's is *stale* (`bench
status`), and `collect` / `report` refuse stale jobs unless told otherwise."""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import os
import subprocess

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml-collections")


def versions(packages=PACKAGES) -> dict:
  """Installed version of each distribution (None where it is not installed)."""
  out = {}
  for p in packages:
    try:
      out[p] = importlib.metadata.version(p)
    except importlib.metadata.PackageNotFoundError:
      out[p] = None
  return out


def git_state(path: str | None = None) -> dict:
  """{"commit": HEAD's sha, "dirty": uncommitted changes to tracked files, "package_clean": no
  change and no untracked file under fedjax_dg/} of the checkout holding `path` (default:
  this package), or Nones outside a git checkout."""
  if path is None:
    import fedjax_dg
    path = os.path.dirname(os.path.dirname(os.path.abspath(fedjax_dg.__file__)))
  git = lambda *a: subprocess.run(["git", "-C", path, *a], capture_output=True, text=True, timeout=30)
  try:
    head = git("rev-parse", "HEAD")
  except (OSError, subprocess.SubprocessError):
    return {"commit": None, "dirty": None, "package_clean": None}
  if head.returncode != 0:
    return {"commit": None, "dirty": None}
  status = git("status", "--porcelain", "--untracked-files=no")
  package = git("status", "--porcelain", "--", "fedjax_dg")  # untracked source counts here
  return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None,
          "package_clean": (not package.stdout.strip()) if package.returncode == 0 else None}


def machine() -> dict:
  """The machine a run ran on: OS and processor, and the CPU cores this process may use."""
  import platform
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
          "cpu_count": os.cpu_count(), "usable_cores": cores}


def package_dir() -> str:
  import fedjax_dg
  return os.path.dirname(os.path.abspath(fedjax_dg.__file__))


# What does not decide a run's numbers, so that changing it leaves finished runs current:
# the benchmark layer's readers (they read finished runs: tables, figures, the report), the
# launcher's bookkeeping (job states and locks, the command line, submitit tasks, and the
# sweep expansion and the sweep configs' shared helpers, which only write configs: a run's
# config is part of its job key, so a changed expansion makes new jobs rather than stale
# ones), the reading of Bai et al.'s printed cells, the dataset preparation tool
# (it unpacks archives before any run), the TensorBoard writer, this module and the shipped
# config files (`configs/`, a folder: a run records the config it read whole). The batch
# grouping (bench/batches.py) stays in: it decides which runs share a vectorised program.
NOT_NUMERIC = ("bench/cli.py", "bench/collect.py", "bench/difficulty.py", "bench/figures.py", "bench/report.py",
               "bench/results.py", "bench/runs.py", "bench/stats.py", "bench/reference.py", "bench/sweep_helpers.py",
               "bench/__main__.py", "bench/launch.py", "bench/tasks.py", "bench/sweep.py", "bench/provenance.py",
               "data/prepare.py", "eval/tensorboard.py", "provenance.py", "configs/")


def _silence(tree: ast.AST) -> None:
  """Drops what only speaks to a reader: every docstring (a string constant opening a module,
  class or function body), the arguments of a `raise` (the exception's message), and the
  arguments of `print(...)` and `warnings.warn(...)`. Whether a raise, print or warning
  happens stays in the tree."""
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      body = node.body
      if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
          and isinstance(body[0].value.value, str):
        node.body = body[1:]
    elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
      node.exc.args, node.exc.keywords = [], []
    elif isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Name) and node.func.id == "print")
        or (isinstance(node.func, ast.Attribute) and node.func.attr == "warn"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "warnings")):
      node.args, node.keywords = [], []


def code_of(source: str, path: str = "<source>") -> str:
  """The parsed code of a Python source, without its comments, docstrings, layout or messages:
  `ast.dump` of the module with every docstring removed and the arguments of `raise`,
  `print` and `warnings.warn` dropped (`_silence`).

  Args:
    source: the file's text.
    path: its name, for the error.

  Returns:
    The dump (equal for two sources that differ only in comments, docstrings, blank lines,
    line breaks or the text of an error, a print or a warning).

  Raises:
    SyntaxError: when the source does not parse.
  """
  tree = ast.parse(source, filename=path)
  _silence(tree)
  return ast.dump(tree, annotate_fields=True, include_attributes=False)


@functools.lru_cache(maxsize=256)  # a package's files (about 110), once each per source text
def _parsed_code(source: str, path: str) -> bytes:
  """`code_of(source, path)` as bytes, computed once per process for each source text: the
  fingerprints of a sweep's methods share most of their files (the engine, data, models),
  and `bench status` fingerprints every method of the sweep."""
  return code_of(source, path).encode()


ALWAYS = ("algorithms/__init__.py", "algorithms/base.py", "algorithms/spec.py", "algorithms/fedavg.py")


def _imported_algorithm_files(root: str, rel: str) -> set:
  """The `algorithms/*.py` files that `algorithms/<rel>` imports (at any depth of its body)."""
  with open(os.path.join(root, rel), encoding="utf-8") as f:
    tree = ast.parse(f.read(), filename=rel)
  out = set()
  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.ImportFrom):
      mod = node.module or ""
      if node.level == 1:  # from . import x / from .x import y
        names = [mod] if mod else [a.name for a in node.names]
      elif mod == "fedjax_dg.algorithms":
        names = [a.name for a in node.names]
      elif mod.startswith("fedjax_dg.algorithms."):
        names = [mod.split(".")[2]]
    elif isinstance(node, ast.Import):
      names = [a.name.split(".")[2] for a in node.names if a.name.startswith("fedjax_dg.algorithms.")]
    out |= {f"algorithms/{n.split('.')[0]}.py" for n in names if n}
  return {r for r in out if os.path.exists(os.path.join(root, r))}


def _defining_files(spec) -> set | None:
  """The files defining a method's or rule's record: every function it holds (its client or
  build, model, checks, stages, preparation) and its hyperparameter class; None when one is
  not a plain function or class."""
  import dataclasses
  import inspect
  out = set()
  for f in dataclasses.fields(spec):
    v = getattr(spec, f.name)
    if v is None or isinstance(v, (str, bool, int, float, tuple)):
      continue
    v = getattr(v, "func", v)  # functools.partial
    try:
      out.add(os.path.basename(inspect.getfile(v)))
    except TypeError:
      return None
  return out


def algorithm_scope(algorithm: str, root: str | None = None) -> frozenset | None:
  """The files under `algorithms/` that a run of `algorithm.name = algorithm` can execute:
  the files defining its method's record and its server rule's (`fediir+omg`: FedIIR's
  clients, FedOMG's rule; without `+`, the method's own rule), everything they import from
  `algorithms/`, transitively, and always the registry, `base.py`, `spec.py` and `fedavg.py`
  (FedAvg's client and rules, which other methods reach through the registry). The
  registry's own imports (every method, to register it) are not followed.

  Args:
    algorithm: the config's `algorithm.name`.
    root: the package directory (default: this package).

  Returns:
    Paths relative to `root`; None when the method or rule is not one of the package's own
    (a plugin's code lives outside the package: the whole package then counts).
  """
  from fedjax_dg import algorithms
  root = root or package_dir()
  method_name, _, rule_name = algorithm.partition("+")
  method = algorithms.METHODS.get(method_name)
  rule = algorithms.RULES.get(rule_name or (method.rule if method is not None else ""))
  if method is None or rule is None:
    return None
  files = [_defining_files(method), _defining_files(rule)]
  if None in files:
    return None
  scope = set(ALWAYS) | {f"algorithms/{f}" for f in files[0] | files[1]}
  if not all(os.path.exists(os.path.join(root, r)) for r in scope):
    return None
  todo = sorted(scope - {"algorithms/__init__.py"})  # the registry imports every method to register it
  while todo:
    for r in _imported_algorithm_files(root, todo.pop()) - scope:
      scope.add(r)
      todo.append(r)
  return frozenset(scope)


def fingerprint_of(root: str, skip: tuple = NOT_NUMERIC, algorithm: str | None = None) -> dict:
  """The source fingerprint: sha256 over the parsed code (`code_of`) of every `.py` file
  under `root` but those in `skip` (its path relative to `root`, then its code, in sorted
  path order), and how many files it covers.

  It covers what decides a run's numbers and nothing else: a docstring, a comment, a layout
  change or the text of an error message leaves it unchanged (the code is hashed as parsed,
  not as bytes), and so does any change to the modules of `NOT_NUMERIC` (readers, the
  launcher's bookkeeping, the preparation tool); caches (`__pycache__`) and other file types
  never enter. For one `algorithm`, the method files it cannot execute are left out too
  (`algorithm_scope`): editing FedSR leaves a finished Fish run current. Any change to the
  code of the rest (its method, the engine, data, models, runner) changes it, and the runs
  made before become stale. What else decides bitwise results, the machine and the
  libraries, is recorded beside it (`determinism`).

  Args:
    root: the package directory.
    skip: paths relative to `root` left out.
    algorithm: the run's `algorithm.name`, or None for the whole package.

  Returns:
    {"sha256", "files", "scope", "algorithm", "code"}: "code" maps each file's path to the
    first 16 hex digits of the sha256 of its parsed code, so that a stale run can say which
    files changed (`changed_files`) and a file later found not to decide the numbers (added
    to `NOT_NUMERIC`) stops counting for the runs recorded before.
  """
  scope = None if algorithm is None else algorithm_scope(algorithm, root)
  h, n, per_file = hashlib.sha256(), 0, {}
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
    for name in sorted(f for f in filenames if f.endswith(".py")):
      path = os.path.join(dirpath, name)
      rel = os.path.relpath(path, root).replace(os.sep, "/")
      if rel in skip or rel.split("/")[0] + "/" in skip:  # a file, or a top folder ending in "/"
        continue
      if scope is not None and rel.startswith("algorithms/") and rel not in scope:
        continue
      with open(path, encoding="utf-8") as f:
        code = _parsed_code(f.read(), path)
      h.update(rel.encode() + b"\0" + str(len(code)).encode() + b"\0" + code)
      per_file[rel] = hashlib.sha256(code).hexdigest()[:16]
      n += 1
  return {"sha256": h.hexdigest(), "files": n, "scope": SCOPE if scope is None else SCOPE + "; " + METHOD_SCOPE,
          "algorithm": None if scope is None else algorithm, "code": per_file}


SCOPE = "parsed code (ast), no docstrings, comments or messages; readers, launcher and preparation tools left out"
METHOD_SCOPE = "method files the algorithm cannot execute left out"


@functools.lru_cache(maxsize=64)
def source_fingerprint(algorithm: str | None = None) -> dict:
  """`fingerprint_of` this package's directory, for one `algorithm.name` (or the whole
  package), computed once per process (the code a process imported does not change under
  it)."""
  return fingerprint_of(package_dir(), algorithm=algorithm)


def algorithm_of(summary: dict) -> str | None:
  """The `algorithm.name` of a run's summary (None when it records no config)."""
  return ((summary.get("config") or {}).get("algorithm") or {}).get("name")


# The instruction-set extensions that decide which vector code XLA's CPU backend emits: it
# compiles for the host's CPU (LLVM's host detection), so the vector width, FMA and the
# reduction order of a vectorised loop follow these flags.
SIMD_FLAGS = ("sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl",
              "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "asimd", "sve", "sve2")
ENV_PREFIXES = ("XLA_", "JAX_", "TF_CPP_", "OMP_", "MKL_", "OPENBLAS_", "NPROC")


def cpu_features(cpuinfo: str | None = None) -> dict:
  """The host CPU as XLA's CPU backend sees it.

  Args:
    cpuinfo: /proc/cpuinfo's text (read from the machine when None).

  Returns:
    {"model": the first processor's model name, "simd": the `SIMD_FLAGS` it has, "flags_sha256":
    sha256 of its whole sorted flag list}; Nones where /proc/cpuinfo is not there.
  """
  if cpuinfo is None:
    try:
      with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
        cpuinfo = f.read()
    except OSError:
      return {"model": None, "simd": None, "flags_sha256": None}
  model, flags = None, None
  for line in cpuinfo.splitlines():
    key, _, value = line.partition(":")
    key = key.strip().lower()
    if model is None and key in ("model name", "cpu model", "hardware"):
      model = value.strip()
    if flags is None and key in ("flags", "features"):
      flags = sorted(set(value.split()))
  if flags is None:
    return {"model": model, "simd": None, "flags_sha256": None}
  return {"model": model, "simd": [f for f in SIMD_FLAGS if f in flags],
          "flags_sha256": hashlib.sha256(" ".join(flags).encode()).hexdigest()}


def determinism(environ=None) -> dict:
  """What decides a run's results bit for bit beyond its code and config: the host CPU's
  features (`cpu_features`), the threads the process may use and the environment variables
  that set XLA's and the BLAS libraries' flags and thread counts (`XLA_FLAGS`, e.g.
  `--xla_cpu_max_isa`, `OMP_NUM_THREADS`), and, where JAX is already imported, its backend,
  device kind, x64 and matmul precision settings and its random-number implementation
  (`jax_default_prng_impl`, `jax_threefry_partitionable`: they decide every random draw),
  and the Python version. Two runs of one job agree bit for bit only where these, the
  library versions and the source fingerprint agree (`differences`); docs/reproducibility.md
  says which of them were measured to matter.

  Args:
    environ: the environment (os.environ when None).

  Returns:
    {"cpu", "usable_cores", "env", "jax", "python"}.
  """
  import platform
  import sys
  environ = os.environ if environ is None else environ
  env = {k: environ[k] for k in sorted(environ) if k.startswith(ENV_PREFIXES)}
  jax_info = None
  if "jax" in sys.modules:
    try:
      jax = sys.modules["jax"]
      jax_info = {"backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
                  "devices": jax.device_count(), "x64": bool(jax.config.jax_enable_x64),
                  "matmul_precision": str(jax.config.jax_default_matmul_precision),
                  "prng_impl": str(jax.config.jax_default_prng_impl),
                  "threefry_partitionable": bool(jax.config.jax_threefry_partitionable)}
    except Exception as e:  # a backend that fails to start is recorded, not fatal
      jax_info = {"error": f"{type(e).__name__}: {e}"}
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"cpu": cpu_features(), "usable_cores": cores, "env": env, "jax": jax_info,
          "python": platform.python_version()}


def provenance(algorithm: str | None = None) -> dict:
  """What produced a run: versions, git state, the machine, the source fingerprint (for the
  run's `algorithm.name`: `fingerprint_of`) and what else decides bitwise results
  (`determinism`)."""
  return {"versions": versions(), "git": git_state(), "machine": machine(), "source": source_fingerprint(algorithm),
          "determinism": determinism()}


def changed_files(summary: dict) -> list[str]:
  """Why a finished run is stale: the files of the current code, in the run's own scope,
  whose parsed code is not what the run recorded (a file it did not record counts as
  changed; one it recorded that no longer counts, removed or now in `NOT_NUMERIC`, does
  not). A run recorded without per-file hashes is compared by its whole fingerprint and
  gives ["(the whole fingerprint)"] when that differs; a run that recorded no fingerprint
  gives ["(no fingerprint recorded)"].

  Args:
    summary: the run's summary.json.

  Returns:
    The changed paths relative to the package, sorted; [] when the run is current.
  """
  recorded = (summary.get("provenance") or {}).get("source") or {}
  if not recorded.get("sha256"):
    return ["(no fingerprint recorded)"]
  current = source_fingerprint(recorded.get("algorithm"))
  if recorded["sha256"] == current["sha256"]:
    return []
  if not isinstance(recorded.get("code"), dict):
    return ["(the whole fingerprint)"]
  return sorted(rel for rel, h in current["code"].items() if recorded["code"].get(rel) != h)


def recorded_fingerprint(summary: dict) -> str | None:
  """The source fingerprint a run's summary records (None: the run predates fingerprints)."""
  return ((summary.get("provenance") or {}).get("source") or {}).get("sha256")


# The distributions whose code computes a run's numbers (the checkpoint library and the
# config parser only store and read them).
NUMERIC_PACKAGES = ("jax", "jaxlib", "numpy", "flax", "optax")


def deciding_fields(prov: dict) -> dict:
  """What in a provenance record decides a run's results bit for bit, flattened.

  Args:
    prov: a run's provenance record (`provenance()`, summary.json's "provenance").

  Returns:
    {dotted name: value}: `source.sha256`, `versions.<p>` for each of `NUMERIC_PACKAGES`,
    `determinism.cpu.simd`, `determinism.usable_cores`, `determinism.env.<VAR>` and
    `determinism.jax.<setting>`; a record made before `determinism` was recorded gives
    `determinism: None` in place of the last four, and one whose JAX settings were not read
    (JAX not imported, or an error) `determinism.jax: None`.
  """
  out = {"source.sha256": (prov.get("source") or {}).get("sha256")}
  recorded_versions = prov.get("versions") or {}
  out.update({f"versions.{p}": recorded_versions.get(p) for p in NUMERIC_PACKAGES})
  det = prov.get("determinism")
  if not isinstance(det, dict):
    out["determinism"] = None
    return out
  out["determinism.cpu.simd"] = (det.get("cpu") or {}).get("simd")
  out["determinism.usable_cores"] = det.get("usable_cores")
  out.update({f"determinism.env.{k}": v for k, v in (det.get("env") or {}).items()})
  jax_info = det.get("jax")
  if isinstance(jax_info, dict) and "error" not in jax_info:
    out.update({f"determinism.jax.{k}": v for k, v in jax_info.items()})
  else:
    out["determinism.jax"] = None
  return out


def differences(recorded: dict, current: dict | None = None) -> list[str]:
  """The fields deciding bitwise results (`deciding_fields`) on which two runs differ.

  Args:
    recorded: the provenance record of the run to reproduce.
    current: the rerun's record (`provenance()` of this process when None; import JAX first
      so that its settings are seen).

  Returns:
    One "name: recorded -> current" string per differing field, in name order; a block
    that one side did not record (`determinism`, `determinism.jax`) gives one "name: not
    recorded in the ..." entry instead of its fields.
  """
  a, b = deciding_fields(recorded), deciding_fields(provenance() if current is None else current)
  missing = []
  for block in ("determinism", "determinism.jax"):
    sides = [name for side, name in ((a, "the recorded run (it predates it or could not read it)"),
                                     (b, "this rerun")) if block in side]
    if sides:
      missing.append(f"{block}: not recorded in {' or '.join(sides)}")
      a, b = ({k: v for k, v in d.items() if k != block and not k.startswith(block + ".")} for d in (a, b))
  return [f"{k}: {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)] + missing


def rerun_warning(recorded: dict, current: dict | None = None) -> str | None:
  """One line saying why a rerun may not reproduce a recorded run bit for bit.

  Args:
    recorded: the provenance record of the run to reproduce.
    current: the rerun's record (this process's when None).

  Returns:
    None where every field of `deciding_fields` agrees, else one line naming each differing
    field with its recorded and current value.
  """
  diffs = differences(recorded, current)
  if not diffs:
    return None
  return "a rerun here may not reproduce the recorded run bit for bit; it differs in " + "; ".join(diffs)


MAX_SUMMARY_BYTES = 64 << 20  # a run's summary.json; a 60-round job's takes about 14 kB


def check_run(workdir: str) -> str:
  """Whether rerunning the run in `workdir` here is expected to reproduce it bit for bit.

  Args:
    workdir: a finished run's folder (its summary.json), or the summary.json itself.

  Returns:
    `rerun_warning`'s line, or a line saying that every field deciding bitwise results agrees.

  Raises:
    ValueError: the summary is missing, does not parse, or records no provenance (one line
      naming the file).
  """
  import json
  from fedjax_dg import bounded
  path = workdir if workdir.endswith(".json") else os.path.join(workdir, "summary.json")
  try:
    summary = json.loads(bounded.read_capped(path, MAX_SUMMARY_BYTES))
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: cannot read the run's summary ({type(e).__name__}: {e})".splitlines()[0]) from None
  recorded = summary.get("provenance") if isinstance(summary, dict) else None
  if not isinstance(recorded, dict):
    raise ValueError(f"{path}: records no provenance, so nothing says what produced the run")
  import jax  # noqa: F401  (its settings enter the current record)
  return rerun_warning(recorded) or "every field deciding bitwise results agrees with the recorded run's"


if __name__ == "__main__":
  import sys
  if len(sys.argv) != 2:
    sys.exit("usage: python -m fedjax_dg.provenance RUN_DIR (or its summary.json)")
  try:
    print(check_run(sys.argv[1]))
  except ValueError as e:
    sys.exit(str(e))
