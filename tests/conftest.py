import os
import shutil
import sys
import tempfile

import jax
import pytest

# The tests compare float32 results with float64 NumPy at float32 tolerances: on GPUs whose
# default float32 matmul is TF32 (A100, H100) that needs full-precision matmuls. The variable
# carries the setting into the subprocesses the tests start.
os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
jax.config.update("jax_default_matmul_precision", "highest")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# One persistent JAX compilation cache for the whole session: the pytest-xdist workers and
# every subprocess a test starts (they inherit these variables) compile each program once.
# FEDJAX_DG_TEST_JAX_CACHE names a folder to keep between sessions (`off`: no cache); by
# default the session makes a temporary one and removes it at its end.
CACHE_VAR = "FEDJAX_DG_TEST_JAX_CACHE"

# The tests' programs are tiny and compiled once each, so compile time dominates the suite:
# it compiles with XLA's backend optimisation level 0 (LLVM's passes cost more than they
# save), XLA:CPU's loop emitters instead of its newer fusion emitters (the round programs
# compile about 2.5x faster) and code generation in one piece (no thread pool for the split
# modules). The arithmetic is the same operations; every oracle compares with its float64
# reference at its own tolerance. FEDJAX_DG_TEST_XLA_OPT=default keeps XLA's defaults.
# Subprocesses inherit the flags through XLA_FLAGS (`helpers.xla_flags`).
FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
OPT_VAR = "FEDJAX_DG_TEST_XLA_OPT"
_OWNED_CACHE = "_FEDJAX_DG_TEST_JAX_CACHE_OWNED"


def _atomic_cache_writes():
  """JAX writes a cache entry in place (`Path.write_bytes`, no lock without a size limit, and
  a size limit makes every write list the whole folder), so a concurrent reader could see a
  partial entry (a warning and a recompilation, never a wrong program). Entries are written
  to a temporary name and renamed instead; `os.replace` is atomic on POSIX."""
  try:
    from jax._src import lru_cache
    cls, suffix = lru_cache.LRUCache, lru_cache._CACHE_SUFFIX
  except (ImportError, AttributeError):
    return  # another JAX version: its own writes
  put = cls.put

  def atomic_put(self, key, value):
    if getattr(self, "eviction_enabled", True) or not key:
      return put(self, key, value)
    path = self.path / f"{key}{suffix}"
    if path.exists():
      return
    tmp = self.path / f".{key}.{os.getpid()}.tmp"
    tmp.write_bytes(value)
    os.replace(tmp, path)
  cls.put = atomic_put


def pytest_configure(config):
  config.addinivalue_line("markers", "host_devices(script, marker): a check on 4 forced host devices (below)")
  # The first process (pytest itself, before it starts any xdist worker) picks the folder;
  # workers and subprocesses inherit it through the environment.
  if not os.environ.get(CACHE_VAR):
    os.environ[CACHE_VAR] = tempfile.mkdtemp(prefix="fedjax_dg_jax_cache_")
    os.environ[_OWNED_CACHE] = str(os.getpid())
  if os.environ.get(OPT_VAR, "fast") == "fast":
    flags = os.environ.get("XLA_FLAGS", "").split()
    os.environ["XLA_FLAGS"] = " ".join(flags + [f for f in FAST_COMPILE_FLAG.split() if f not in flags])
  cache = os.environ[CACHE_VAR]
  if cache == "off":
    return
  settings = {"jax_compilation_cache_dir": cache,
              "jax_persistent_cache_min_compile_time_secs": 0.0,  # default 1 s: most test programs compile faster
              "jax_persistent_cache_min_entry_size_bytes": 0}
  for name, value in settings.items():
    os.environ[name.upper()] = str(value)
    jax.config.update(name, value)
  _atomic_cache_writes()


def pytest_unconfigure(config):
  if os.environ.get(_OWNED_CACHE) == str(os.getpid()):
    shutil.rmtree(os.environ[CACHE_VAR], ignore_errors=True)


@pytest.fixture
def tiny_config():
  """The default config shrunk to seconds: MLP, few rounds, few clients."""
  sys.path.insert(0, os.path.join(ROOT, "configs"))
  import default
  c = default.get_config()
  c.model.name = "mlp"
  c.model.hidden = (32,)
  c.data.image_size = 8
  c.num_clients = 8
  c.num_rounds = 6
  c.eval_every = 2
  c.checkpoint_every = 2
  c.client.lr = 0.1
  c.client.momentum = 0.0
  c.client.batch_size = 16
  c.quiet = True
  return c


# ----------------------------------------------------------------------------- 4-device checks
# A test marked `@pytest.mark.host_devices(SCRIPT, MARKER)` runs SCRIPT (see
# `helpers.run_on_host_devices`) on 4 forced XLA host devices. The scripts of every such test
# of the session run in one fresh Python, started once (by whichever xdist worker asks
# first); each test gets `(ok, output)` for its own script from the `host_devices` fixture.

@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups (`--dist loadgroup`)
def pytest_collection_modifyitems(config, items):
  """The 4-device tests form one pytest-xdist group: one worker runs them one after another,
  and no other worker waits on the lock while that worker runs their shared Python."""
  del config
  for item in items:
    if item.get_closest_marker("host_devices") and not item.get_closest_marker("xdist_group"):
      item.add_marker(pytest.mark.xdist_group("host_devices"))


@pytest.fixture(scope="session")
def _host_device_results(request, tmp_path_factory):
  import helpers
  scripts = {item.nodeid: tuple(item.get_closest_marker("host_devices").args)
             for item in request.session.items if item.get_closest_marker("host_devices")}
  return helpers.once_per_session(tmp_path_factory, "host_devices",
                                  lambda _: helpers.run_scripts_on_host_devices(scripts))


@pytest.fixture
def host_devices(request, _host_device_results):
  """`(ok, output)` of this test's `host_devices` script."""
  return tuple(_host_device_results[request.node.nodeid])
