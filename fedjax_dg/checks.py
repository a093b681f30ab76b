"""Type, range and size checks of a config, run before any data is read or anything compiles.

`check_config` runs first in `config.validate`: every field of `configs/default.py` must
keep its type there (an integer stays an integer, `True` is not a seed, a tuple is not a
string, nothing is None, no float is NaN or infinite), and the fields below keep their
ranges, in config files as on the command line. `check_memory` runs once the data's shape
is known, before the round compiles: an estimate of the round's memory (parameters,
gradients and optimizer state per client in parallel; activations of a batch; the
`[steps, batch]` index arrays of the local loop) against the device's memory, naming the
fields that dominate it. Each failure is one `ConfigError` line naming the field.
"""
from __future__ import annotations

import math
import os

from fedjax_dg.errors import ConfigError
from fedjax_dg.rundir import library_defaults

# Sequences whose entries may be any finite number (the others keep their default's type).
NUMBER_SEQUENCES = ("data.angles", "data.correlations", "data.color_flips")
# The top-level blocks every config holds.
BLOCKS = ("data", "model", "client", "server", "algorithm", "partition", "engine")

_SEED_MAX = 2 ** 32 - 1  # jax.random.PRNGKey and NumPy's generators take 32-bit seeds here
_INT_MAX = 2 ** 31 - 1

# The one home of every scalar range a config field must keep: field -> (low, high, low
# inclusive, high inclusive, what); None: unbounded on that side. A failure reads
# "<field> must <what>, got <value>".
RANGES = {
    "seed": (0, _SEED_MAX, True, True, "be an integer >= 0 and < 2**32"),
    "data.seed": (0, _SEED_MAX, True, True, "be an integer >= 0 and < 2**32"),
    "num_clients": (1, None, True, True, "be >= 1"),
    "cohort_size": (0, None, True, True, "be >= 0 (0: use cohort_fraction)"),
    "cohort_fraction": (0.0, 1.0, False, True, "lie in (0, 1]"),
    "num_rounds": (1, None, True, True, "be >= 1"),
    "eval_every": (1, None, True, True, "be >= 1"),
    "checkpoint_every": (0, None, True, True, "be >= 0 (0: never)"),
    "eval_batch_size": (1, None, True, True, "be >= 1"),
    "partition.lam": (0.0, 1.0, True, True, "lie in [0, 1]"),
    "partition.alpha": (0.0, None, False, True, "be > 0"),
    "client.lr": (0.0, None, False, True, "be a positive step size"),
    "client.batch_size": (1, None, True, True, "be >= 1"),
    "client.local_steps": (0, None, True, True, "be >= 0"),
    "client.momentum": (0.0, 1.0, True, False, "lie in [0, 1)"),
    "client.weight_decay": (0.0, None, True, True, "be >= 0"),
    "server.lr": (0.0, None, False, True, "be a positive step size"),
    "server.momentum": (0.0, 1.0, True, False, "lie in [0, 1)"),
    "server.b1": (0.0, 1.0, True, False, "be in [0, 1)"),
    "server.b2": (0.0, 1.0, True, False, "be in [0, 1)"),
    "server.eps": (0.0, None, False, True, "be > 0"),
    "engine.chunk_size": (1, None, True, True, "be >= 1"),
    "engine.dropout": (0.0, 1.0, True, False, "lie in [0, 1)"),
    "engine.straggler_fraction": (0.0, 1.0, True, True, "lie in [0, 1]"),
    "engine.unroll": (-1, _INT_MAX, True, True, "be >= 1, or -1 (the measured default)"),
    "data.num_workers": (0, 1024, True, True, "be in [0, 1024] (0: no worker threads)"),
    "data.max_per_domain": (0, _INT_MAX, True, True, "be >= 0 (0: all)"),
    "data.max_per_split": (0, _INT_MAX, True, True, "be >= 0 (0: all)"),
    "data.n_per_domain": (1, 10 ** 7, True, True, "be in [1, 10**7]"),
    "data.label_noise": (0.0, 1.0, True, True, "be in [0, 1]"),
    "data.downsample": (1, 64, True, True, "be in [1, 64]"),
    "data.image_size": (1, 4096, True, True, "be in [1, 4096]"),
    "data.max_tokens": (1, 1 << 20, True, True, "be in [1, 2**20]"),
    "data.pad_id": (0, 1 << 24, True, True, "be a token id in [0, 2**24]"),
    "data.in_val_fraction": (0.0, 1.0, True, False, "be in [0, 1)"),
    "data.in_test_fraction": (0.0, 1.0, True, False, "be in [0, 1)"),
    "data.test_domain_train_fraction": (0.0, 1.0, True, False, "be in [0, 1)"),
    "data.femnist_test_writers": (0, _INT_MAX, True, True, "be >= 0"),
    "data.femnist_val_writers": (0, _INT_MAX, True, True, "be >= 0"),
    "distributed.num_processes": (1, 1 << 20, True, True, "be an integer in [1, 2**20]"),
    "distributed.process_id": (0, 1 << 20, True, False, "be an integer >= 0 (below distributed.num_processes)"),
    "distributed.timeout_s": (1, 86400, True, True, "be in [1, 86400] seconds"),
    "distributed.heartbeat_s": (1, 86400, True, True, "be in [1, 86400] seconds"),
}
# Entries of these sequences lie in [0, 1].
UNIT_SEQUENCES = ("data.color_flips",)  # data.correlations: checked by the spurious loader


def _kind(default) -> str:
  if isinstance(default, bool):
    return "bool"
  if isinstance(default, int):
    return "int"
  if isinstance(default, float):
    return "float"
  if isinstance(default, str):
    return "str"
  if isinstance(default, list):
    return "seq"
  return "any"


def _is_int(v) -> bool:
  import numpy as np
  return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_number(v) -> bool:
  import numpy as np
  return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


_WANT = {"bool": "True or False", "int": "an integer", "float": "a finite number", "str": "a string",
         "seq": "a tuple"}


def _check_type(path: str, v, default) -> None:
  kind = _kind(default)
  if kind == "any":
    return
  if v is None:
    raise ConfigError(f"{path} must be {_WANT[kind]}, got None")
  ok = {"bool": lambda: isinstance(v, bool), "int": lambda: _is_int(v),
        "float": lambda: _is_number(v) and math.isfinite(v), "str": lambda: isinstance(v, str),
        "seq": lambda: isinstance(v, (tuple, list))}[kind]()
  if not ok:
    hint = f", e.g. ({v!r},)" if kind == "seq" and not isinstance(v, str) and _is_number(v) else ""
    raise ConfigError(f"{path} must be {_WANT[kind]}, got {v!r} ({type(v).__name__}){hint}")
  if kind == "seq":
    _check_entries(path, tuple(v), default)


def _check_entries(path: str, v: tuple, default: list) -> None:
  if path in NUMBER_SEQUENCES:
    bad = next((x for x in v if not (_is_number(x) and math.isfinite(x))), None)
    if bad is not None:
      raise ConfigError(f"{path}: every entry must be a finite number, got {bad!r} in {v!r}")
    if path in UNIT_SEQUENCES:
      out = next((x for x in v if not 0.0 <= x <= 1.0), None)
      if out is not None:
        raise ConfigError(f"{path}: every entry must lie in [0, 1], got {out!r} in {v!r}")
    return
  if default and all(_is_int(x) for x in default):
    bad = next((x for x in v if not _is_int(x)), None)
    if bad is not None:
      raise ConfigError(f"{path}: every entry must be an integer, got {bad!r} ({type(bad).__name__}) in {v!r}")
  elif default and all(isinstance(x, str) for x in default):
    bad = next((x for x in v if not isinstance(x, str)), None)
    if bad is not None:
      raise ConfigError(f"{path}: every entry must be a string, got {bad!r} in {v!r}")


def _check_range(path: str, v) -> None:
  lo, hi, lo_in, hi_in, what = RANGES[path]
  if not _is_number(v):
    return  # its type was checked, or the field is not a library field
  below = lo is not None and (v < lo if lo_in else v <= lo)
  above = hi is not None and (v > hi if hi_in else v >= hi)
  if below or above or (isinstance(v, float) and not math.isfinite(v)):
    raise ConfigError(f"{path} must {what}, got {v!r}")


def _flat(config) -> dict:
  from fedjax_dg.rundir import flatten
  return flatten(config)


def check_config(config) -> None:
  """Types of every library field, the ranges above, the method name's form."""
  if not hasattr(config, "items"):
    raise ConfigError(f"the config must be an ml_collections.ConfigDict, got {type(config).__name__}")
  missing = [b for b in BLOCKS if b not in config]
  if missing:
    raise ConfigError(f"the config lacks the {missing[0]!r} block{' (and ' + ', '.join(missing[1:]) + ')' if missing[1:] else ''}; "
                      "build it on configs/default.py's get_config()")
  flat = _flat(config)
  defaults = library_defaults()
  for path, v in flat.items():
    if path in defaults:
      _check_type(path, v, defaults[path])
    elif isinstance(v, float) and not math.isfinite(v):
      raise ConfigError(f"{path} must be a finite number, got {v!r}")
  for path in RANGES:
    if path in flat:
      _check_range(path, flat[path])
  _check_data_size(config)
  _check_run_axis(flat)
  check_runs(config, flat)
  name = config.algorithm.get("name", "")
  if isinstance(name, str) and (not name or any(not part.strip() for part in name.split("+"))):
    raise ConfigError(f"algorithm.name: {name!r} names no method in one of its parts; write METHOD or "
                      "METHOD+RULE, e.g. 'fediir' or 'fediir+omg'")


def _check_run_axis(flat: dict) -> None:
  from fedjax_dg.defaults import RUN_AXES
  v = flat.get("engine.run_axis", "auto")
  if v not in RUN_AXES + ("auto",):
    raise ConfigError(f"engine.run_axis must be one of {', '.join(RUN_AXES + ('auto',))}, got {v!r}")


# ----------------------------------------------------------------------------- run lists

# Fields a run of a batch may not override: the list itself, and where the runs go.
NOT_PER_RUN = ("runs", "workdir", "resume")


def _split_top(text: str) -> list[str]:
  """`text` split at the commas outside brackets and quotes."""
  parts, depth, quote, cur = [], 0, None, ""
  for ch in text:
    if quote:
      quote = None if ch == quote else quote
    elif ch in "'\"":
      quote = ch
    elif ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    elif ch == "," and depth == 0:
      parts.append(cur)
      cur = ""
      continue
    cur += ch
  return parts + [cur]


def parse_run(entry, i: int, known) -> dict:
  """`{field: value}` of the run list's entry `i` (`"seed=1,client.lr=0.05"`); values are
  Python literals (a bare word is a string). One line naming the entry otherwise."""
  import ast
  if not isinstance(entry, str):
    raise ConfigError(f"runs[{i}] must be a string of overrides such as 'seed=1,client.lr=0.05', got {entry!r}")
  out = {}
  for part in _split_top(entry):
    field, eq, text = part.partition("=")
    field, text = field.strip(), text.strip()
    if not eq or not field or not text:
      raise ConfigError(f"runs[{i}]: {part.strip()!r} is not field=value (e.g. 'seed=1,client.lr=0.05')")
    if field in NOT_PER_RUN:
      raise ConfigError(f"runs[{i}]: {field} is shared by the whole batch, not set per run")
    if field in out:
      raise ConfigError(f"runs[{i}]: {field} is set twice in one entry ({entry!r}); give each field once")
    if field not in known:
      import difflib
      near = difflib.get_close_matches(field, list(known), 1)
      raise ConfigError(f"runs[{i}]: unknown field {field!r}" + (f"; did you mean {near[0]!r}?" if near else ""))
    try:
      out[field] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      out[field] = text
  return out


def check_runs(config, flat: dict | None = None) -> None:
  """`config.runs`: every entry parses into overrides of known fields."""
  runs = config.get("runs", ())
  if not runs:
    return
  known = flat if flat is not None else _flat(config)
  for i, entry in enumerate(runs):
    parse_run(entry, i, known)


# ----------------------------------------------------------------------------- memory

def _check_data_size(config, available: int | None = None) -> None:
  """The embedded data set's float32 images (`data.n_per_domain` per angle at
  `data.image_size` squared) must fit in memory before they are generated."""
  d = config.data
  if d.name != "rotated_digits":
    return
  nbytes = int(d.n_per_domain) * len(d.angles) * int(d.image_size) ** 2 * 4
  available = device_memory() if available is None else available
  if nbytes > available:
    raise ConfigError(f"data.image_size: {d.n_per_domain} x {len(d.angles)} images of {d.image_size}^2 pixels need "
                      f"{nbytes / 2 ** 30:.1f} GiB, more than the {available / 2 ** 30:.1f} GiB of memory; lower "
                      "data.image_size or data.n_per_domain")


def _cgroup_limit() -> int | None:
  """The memory limit of this process's cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`),
  or None where there is none."""
  for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
    try:
      with open(path) as f:
        text = f.read(64).strip()
    except OSError:
      continue
    if text.isdigit() and int(text) < 1 << 60:  # v1 reports "no limit" as a huge number
      return int(text)
  return None


def memory_limits() -> list[tuple[int, str]]:
  """`[(bytes, what)]` of every limit on this process's memory that can be read: its first
  local device's (a GPU's), else the machine's memory; `ulimit -v` (RLIMIT_AS); the cgroup's
  (a container, Slurm's `--mem` under cgroups); Slurm's `SLURM_MEM_PER_NODE`."""
  import jax
  out = []
  stats = None
  try:
    stats = jax.local_devices()[0].memory_stats()
  except Exception:  # pylint: disable=broad-except  # CPU backends have none
    pass
  if stats and stats.get("bytes_limit"):
    return [(int(stats["bytes_limit"]), "the device's memory")]
  out.append((int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "the machine's memory"))
  import resource
  soft, _ = resource.getrlimit(resource.RLIMIT_AS)
  if soft != resource.RLIM_INFINITY and soft > 0:
    out.append((int(soft), "the process's address-space limit (ulimit -v)"))
  cg = _cgroup_limit()
  if cg:
    out.append((cg, "the cgroup's memory limit"))
  slurm = os.environ.get("SLURM_MEM_PER_NODE", "")
  if slurm.isdigit() and int(slurm) > 0:
    out.append((int(slurm) << 20, "Slurm's --mem"))
  return out


def device_memory() -> int:
  """Bytes of memory this process may use: a GPU's limit, on CPU the smallest of the
  machine's memory, `ulimit -v`, the cgroup's limit and Slurm's `--mem` (`memory_limits`)."""
  return min(b for b, _ in memory_limits())


def _available_text(available: int) -> str:
  """`available` bytes, and which limit they are."""
  what = next((w for b, w in memory_limits() if b == available), "the memory available")
  return f"{what}, {available / 2 ** 30:.1f} GiB"


def _activation_bytes_per_example(model, params_shape, input_shape) -> int:
  """Bytes of every module's output for one example (flax `capture_intermediates`), each in
  its own dtype (the computation dtype, `model.dtype`), and, where the convolutions are
  matrix products (`model.conv_impl = "gemm"`), each one's im2col patches: H' W' kh kw C_in
  numbers for a kernel larger than 1x1 (a 1x1 kernel reads its input as it is, or a strided
  slice of it, not counted: under 1% of ResNet-18's activations)."""
  import jax
  import jax.numpy as jnp
  x = jax.ShapeDtypeStruct((1,) + tuple(input_shape), jnp.float32)
  try:
    _, inter = jax.eval_shape(lambda p, x: model.module.apply(
        {"params": p}, model._in(x), capture_intermediates=True, mutable=["intermediates"]), params_shape, x)  # pylint: disable=protected-access
  except Exception:  # pylint: disable=broad-except  # a model that does not take the keyword: its input, scaled
    return 4 * 64 * math.prod(input_shape)
  total = int(sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(inter)))
  if getattr(model, "conv_impl", "xla") == "gemm":
    total += _gemm_patch_bytes(inter.get("intermediates", {}), params_shape)
  return total


def _gemm_patch_bytes(inter, params) -> int:
  """Bytes of the im2col patches of every convolution in `inter` (a module's captured
  outputs, nested as its parameters are): a module whose parameters hold a 4-D `kernel`
  [kh, kw, C_in, C_out] reads H' W' kh kw C_in numbers of its output's dtype for each
  output [1, H', W', C_out] it returned (once per call)."""
  total = 0
  kernel = params.get("kernel") if hasattr(params, "get") else None
  outs = inter.get("__call__") if hasattr(inter, "get") else None
  if kernel is not None and len(kernel.shape) == 4 and outs:
    kh, kw, cin, _ = kernel.shape
    if kh * kw > 1:
      total += sum(y.shape[1] * y.shape[2] * kh * kw * cin * y.dtype.itemsize for y in outs if len(y.shape) == 4)
  for name, sub in (inter.items() if hasattr(inter, "items") else ()):
    if name != "__call__" and hasattr(params, "get") and name in params:
      total += _gemm_patch_bytes(sub, params[name])
  return total


def round_memory(config, model, input_shape, parallel: int, num_steps: int, batch_size: int | None = None) -> dict:
  """Bytes of the round's main terms: per-client state, activations, the loop's index arrays.
  `batch_size`: the rows a step reads (the run clips `client.batch_size` to its largest
  client); None: `client.batch_size`.

  An estimate on the safe side: every module's output is counted twice (kept for the
  backward pass, and its cotangent), in the computation dtype, and each client holds float32
  parameters, gradients and two optimizer moments. Against XLA's own plan of the rounds
  measured on an H200 (benchmarks/results/gpu_h200/, the clients in parallel under `vmap`
  or `chunked`) it lies between the plan's temporaries and 2.5 times its whole size
  (tests/test_engine_defaults.py)."""
  import jax
  import jax.numpy as jnp
  x = jnp.zeros((1,) + tuple(input_shape), jnp.float32)
  params_shape = jax.eval_shape(lambda r: model.module.init(r, model._in(x))["params"], jax.random.PRNGKey(0))  # pylint: disable=protected-access
  P = int(sum(math.prod(a.shape) for a in jax.tree.leaves(params_shape)))
  B = int(config.client.batch_size if batch_size is None else batch_size)
  per_client = 4 * P * 4  # parameters, gradients and up to two optimizer moments, float32
  return {"params": P,
          "state": 4 * P * 4 + parallel * per_client,
          "activations": parallel * B * _activation_bytes_per_example(model, params_shape, input_shape) * 2,
          "indices": parallel * num_steps * B * 5}  # int32 indices and a bool mask per step and row


def round_fits(config, model, input_shape, parallel: int, num_steps: int, available: int | None = None,
               batch_size: int | None = None) -> bool:
  """Whether the round's estimated memory (`round_memory`) fits `available` bytes (None:
  `device_memory()`); True where the model cannot be traced for an estimate, as
  `check_memory` lets such a round run."""
  try:
    m = round_memory(config, model, input_shape, parallel, num_steps, batch_size)
  except Exception:  # pylint: disable=broad-except  # no estimate: nothing to refuse
    return True
  return m["state"] + m["activations"] + m["indices"] <= (device_memory() if available is None else available)


def check_memory(config, model, input_shape, parallel: int, strategy: str, num_steps: int,
                 available: int | None = None, batch_size: int | None = None) -> None:
  """Refuses a round whose estimated memory exceeds the device's, naming the fields.

  Args:
    config: the run's config.
    model: the model the method trains.
    input_shape: one example's shape.
    parallel: clients one device trains at the same time (`plan.parallel_clients` of the
      strategy).
    strategy: the resolved execution strategy (for the advice in the message).
    num_steps: local steps per round.
    available: the memory to compare with; None: the least of this process's limits
      (`memory_limits`).
    batch_size: the rows a step reads (at most the largest client's); None: `client.batch_size`.

  Raises:
    ConfigError: one line naming the fields that dominate the estimate.
  """
  try:
    m = round_memory(config, model, input_shape, parallel, num_steps, batch_size)
  except Exception:  # pylint: disable=broad-except  # a model the estimate cannot trace: no estimate
    return
  total = m["state"] + m["activations"] + m["indices"]
  limit = f"the device's {available / 2 ** 30:.1f} GiB" if available is not None else None
  available = device_memory() if available is None else available
  if total <= available:
    return
  limit = limit or _available_text(available)
  B = int(config.client.batch_size if batch_size is None else batch_size)
  steps = "client.local_steps" if config.client.local_steps > 0 else "client.local_epochs"
  why = {"state": (f"{m['params']:,} parameters x {parallel} client(s) in parallel",
                   f"model.{'hidden' if config.model.name == 'mlp' else 'name'}"),
         "activations": (f"batches of {B} of inputs {tuple(input_shape)} x {parallel} client(s)",
                         "client.batch_size" + (", data.image_size" if len(input_shape) == 3 else "")),
         "indices": (f"{num_steps:,} local steps x batch {B} x {parallel} client(s)",
                     f"{steps}, client.batch_size")}
  worst = max(("state", "activations", "indices"), key=m.get)
  if strategy in ("sequential", "host_loop") or parallel == 1:
    more = ""
  elif strategy == "chunked":
    more = " (or fewer clients in parallel: engine.chunk_size, or engine.strategy='sequential')"
  else:
    more = " (or fewer clients in parallel: cohort_size, engine.strategy='chunked' or 'sequential')"
  raise ConfigError(f"{why[worst][1]}: the round needs about {total / 2 ** 30:.1f} GiB ({why[worst][0]}: "
                    f"{m[worst] / 2 ** 30:.1f} GiB), more than {limit}; "
                    f"lower {why[worst][1]}{more}")
