"""Small shared fixtures: a tiny ragged client store and an MLP."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_dg.data.store import ClientStore
from fedjax_dg.models import build_model


def ragged_store(sizes=(9, 5, 12, 7, 3, 10), dim=6, classes=3, seed=0) -> ClientStore:
  rng = np.random.default_rng(seed)
  n_max = max(sizes)
  x = np.zeros((len(sizes), n_max, dim), np.float32)
  y = np.zeros((len(sizes), n_max), np.int32)
  for c, n in enumerate(sizes):
    x[c, :n] = rng.normal(size=(n, dim)) + c * 0.3
    y[c, :n] = rng.integers(0, classes, n)
  dom = np.repeat(np.arange(len(sizes))[:, None] % 3, n_max, 1).astype(np.int32)
  return ClientStore(x, y, dom, np.array(sizes, np.int32))


def tiny_mlp(dim=6, classes=3, hidden=(8,), head_hidden=()):
  return build_model(ml_collections.ConfigDict({"name": "mlp", "hidden": hidden, "head_hidden": head_hidden}),
                     (dim,), classes)


def client_arrays(store: ClientStore, c):
  n = int(store.counts[c])
  return jnp.asarray(store.x[c, :n]), jnp.asarray(store.y[c, :n])


def tree_max_diff(a, b):
  """The largest absolute difference between two trees' leaves, in float32 (NumPy on the host:
  no XLA program per leaf shape)."""
  f = lambda t: np.asarray(t, np.float32)
  return max(float(np.max(np.abs(f(x) - f(y)))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# `jax.jit(..., compiler_options=XLA_DEFAULT_OPT)`: one program compiled at XLA's default
# backend optimisation level (3), where the suite compiles at 0 (conftest.py).
XLA_DEFAULT_OPT = {"xla_backend_optimization_level": 3}


def xla_flags(devices: int = 0) -> str:
  """XLA_FLAGS for a test's subprocess: the suite's own flags (conftest: the compile
  optimisation level) without any forced host-device count, plus `devices` forced host
  devices when given."""
  import os
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
  return " ".join(flags + ([f"--xla_force_host_platform_device_count={devices}"] if devices else []))


def run_on_host_devices(script_template: str, marker: str, n: int = 4):
  """Runs `script_template` (formatted with `root` and `tests`) in a fresh Python with `n`
  forced XLA host devices and checks it printed `marker`."""
  ok, output = run_scripts_on_host_devices({"script": (script_template, marker)}, n)["script"]
  assert ok, output


_SCRIPTS_DRIVER = r"""
import contextlib, io, json, sys, traceback
results = {}
for name, (code, marker) in json.load(sys.stdin).items():
  out = io.StringIO()
  try:
    with contextlib.redirect_stdout(out):
      exec(compile(code, name, "exec"), {"__name__": "__main__"})
    ok = marker in out.getvalue()
  except BaseException:  # the check failed: its traceback is its result
    out.write(traceback.format_exc())
    ok = False
  results[name] = (ok, out.getvalue())
print("SCRIPT_RESULTS " + json.dumps(results))
"""


def run_scripts_on_host_devices(scripts: dict, n: int = 4) -> dict:
  """Runs the scripts `{name: (script_template, marker)}` (each formatted with `root` and
  `tests`) one after another in ONE fresh Python with `n` forced XLA host devices, each in
  its own namespace. Returns `{name: (ok, output)}`: ok when the script ran to its end and
  printed its marker; output is what it printed, with its traceback when it raised."""
  import json
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  codes = {k: (t.format(root=root, tests=os.path.join(root, "tests")), m) for k, (t, m) in scripts.items()}
  env = dict(os.environ, XLA_FLAGS=xla_flags(n), JAX_PLATFORMS="cpu")
  try:  # 10 minutes a script
    out = subprocess.run([sys.executable, "-c", _SCRIPTS_DRIVER], input=json.dumps(codes), env=env,
                         capture_output=True, text=True, timeout=600 * len(codes))
  except subprocess.TimeoutExpired as e:
    return {k: (False, f"the {n}-device Python ran past {e.timeout} s") for k in scripts}
  line = next((l for l in out.stdout.splitlines() if l.startswith("SCRIPT_RESULTS ")), None)
  if out.returncode != 0 or line is None:
    failure = f"the {n}-device Python failed (exit status {out.returncode}): {out.stdout[-4000:]}{out.stderr[-4000:]}"
    return {k: (False, failure) for k in scripts}
  results = json.loads(line[len("SCRIPT_RESULTS "):])
  return {k: (ok, output if ok else output + out.stderr[-2000:]) for k, (ok, output) in results.items()}


def once_per_session(tmp_path_factory, name: str, produce):
  """`produce(folder)` (a JSON value, computed in the empty `folder`) run once per session:
  the first pytest-xdist worker to ask runs it under a file lock, the others wait and read
  its result (and may read `folder`, e.g. a trained workdir, but not change it)."""
  import json
  import os
  import shutil
  from filelock import FileLock
  base = tmp_path_factory.getbasetemp()
  root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "once_per_session"
  root.mkdir(exist_ok=True)
  folder, result = root / name, root / f"{name}.json"
  with FileLock(str(root / f"{name}.lock")):
    if not result.exists():
      shutil.rmtree(folder, ignore_errors=True)  # what a failed attempt left
      folder.mkdir()
      value = produce(folder)
      result.write_text(json.dumps(value))
  return json.loads(result.read_text())


def run_from(alg, params, store, num_clients: int, cohort: int, rounds: int, strategy: str = "vmap",
             chunk_size: int = 1):
  """The round state after `rounds` rounds of `alg` from `params` (round keys 0, 1, ...)."""
  from fedjax_dg.engine import init_round_state, make_round
  state = init_round_state(alg, None, params, num_clients)
  rf = make_round(alg, num_clients, cohort, strategy, chunk_size=chunk_size)
  store = jax.tree.map(jnp.asarray, store)
  for t in range(rounds):
    state, _ = rf(state, store, jax.random.PRNGKey(t))
  return state


def pythonpath(root: str) -> str:
  """PYTHONPATH for a subprocess that must import this checkout's package first, keeping
  what the environment adds (packages installed with pip --target)."""
  import os
  rest = os.environ.get("PYTHONPATH", "")
  return root + (os.pathsep + rest if rest else "")


def run_config(config, rounds: int):
  """`rounds` rounds of the run `config` describes, built as the runner builds it
  (`plan.prepare`), with the runner's keys; returns the final round state."""
  from fedjax_dg import plan as plan_lib
  from fedjax_dg.data import datasets, splits
  from fedjax_dg.engine import init_round_state
  fold = splits.fold_from_config(datasets.load_dataset(config.data), config.data)
  s = plan_lib.prepare(config, fold)
  stage = s.stages[0]
  k_init, k_server, k_rounds = jax.random.split(jax.random.PRNGKey(config.seed), 3)
  state = init_round_state(stage.builder, k_server, s.model.init(k_init), s.num_clients)
  store = jax.tree.map(jnp.asarray, s.packed)
  for t in range(rounds):
    state, _ = stage.round_fn(state, store, jax.random.fold_in(k_rounds, t))
  return state


def config_with(overrides: dict | None = None, base=None):
  """`base` (default: `fedjax_dg.default_config()`) with the dotted `overrides` applied, as a
  config file or `--config.client.lr=0.1` sets them: `{"algorithm.name": "fedprox",
  "algorithm.fedprox.mu": 0.1, "client.lr": 0.1}`. An unknown key is a KeyError naming it."""
  import copy
  from fedjax_dg import default_config
  c = default_config() if base is None else copy.deepcopy(base)
  for key, value in (overrides or {}).items():
    *parents, leaf = key.split(".")
    node = c
    for p in parents:
      node = node[p]
    if leaf not in node:
      raise KeyError(f"config_with: unknown config key {key!r}")
    node[leaf] = value
  return c


def method(overrides: dict, model, sched, num_clients: int = 1, cohort_size: int | None = None,
           num_domains: int = 1, train_domains=None, store=None, tune_store=None, heldout_val=None,
           builder: bool = False):
  """The method the config `config_with(overrides)` names, built as the runner builds it
  (`plan.prepare`: the config validated, `algorithms.context`, `algorithms.Builder`):
  the `Algorithm` with the config's hyperparameters, or with `builder` the `Builder` itself
  (the engine then carries the hyperparameters in the round state). `model` and the local
  schedule `sched` are given (the runner derives them from `config.model` and `config.client`),
  so a test picks its own tiny model and loop; `config.client` gives the optimizer and its
  values, `config.server` the server rule's."""
  from fedjax_dg import algorithms
  from fedjax_dg import config as config_lib
  cohort_size = cohort_size or num_clients
  config = config_with({"num_clients": num_clients, "cohort_size": cohort_size, **overrides})
  config_lib.validate(config)
  ctx = algorithms.context(config, model, sched, num_clients, cohort_size, num_domains,
                           train_domains, store, tune_store, heldout_val)
  b = algorithms.Builder(ctx)
  return b if builder else b()


def sgd_config(lr: float, momentum: float = 0.0, prefix: str = "client") -> dict:
  """Overrides for `optax.sgd(lr, momentum)` as the client optimizer (`prefix="server"`: the
  server's values; the server rule, `fedavg` or `avgm`, is the method's choice)."""
  out = {f"{prefix}.optimizer": "sgd", f"{prefix}.lr": lr, f"{prefix}.momentum": momentum}
  return out if prefix == "client" else {k: v for k, v in out.items() if not k.endswith(".optimizer")}


def adam_config(lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, prefix: str = "client") -> dict:
  """Overrides for `optax.adam(lr, b1, b2, eps)` (optax's defaults) as the client optimizer
  (`prefix="server"`: the server's values, for the `adam` rule)."""
  out = {f"{prefix}.optimizer": "adam", f"{prefix}.lr": lr, f"{prefix}.b1": b1, f"{prefix}.b2": b2,
         f"{prefix}.eps": eps}
  return out if prefix == "client" else {k: v for k, v in out.items() if not k.endswith(".optimizer")}


def learn_in_process(config) -> dict:
  """Stage 1 of the run `config` describes, in this process: built as the runner builds it
  (`plan.prepare`), with the runner's keys, `config.num_rounds` rounds. Returns each
  round's `train_loss`, the final model's scores on the evaluation splits (the runner's
  `Evaluator` and metric) and the number of clients: what a whole run's metrics.jsonl and
  summary.json report of stage 1, without its files, checkpoints and periodic evaluations."""
  from fedjax_dg import plan as plan_lib
  from fedjax_dg.data import datasets, splits
  from fedjax_dg.engine import init_round_state
  from fedjax_dg.eval.evaluate import Evaluator
  fold = splits.fold_from_config(datasets.load_dataset(config.data), config.data)
  s = plan_lib.prepare(config, fold)
  stage = s.stages[0]
  k_init, k_server, k_rounds = jax.random.split(jax.random.PRNGKey(config.seed), 3)
  state = init_round_state(stage.builder, k_server, s.model.init(k_init), s.num_clients)
  store = jax.tree.map(jnp.asarray, s.packed)
  losses = []
  for t in range(int(config.num_rounds)):
    state, m = stage.round_fn(state, store, jax.random.fold_in(k_rounds, t))
    losses.append(float(m["train_loss"]))
  evaluator = Evaluator(s.model, fold.eval_splits(), fold.num_classes, config.eval_batch_size, metrics=fold.metrics)
  return {"train_loss": losses, "splits": evaluator(stage.algorithm.params_of(state.server)),
          "num_clients": s.num_clients}
