"""The cohort axis sharded over the devices of 2 processes under `jax.distributed` (the
multi-controller runtime), on localhost with CPU collectives (gloo): the round equals the
single-process one. The test starts both processes and stops them itself."""
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from fedjax_dg.algorithms.base import make_schedule
from fedjax_dg.engine import init_round_state, make_round
import helpers
from helpers import method, ragged_store, sgd_config, tiny_mlp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES, C, COHORT, ROUNDS = (9, 5, 12, 7, 3, 10, 4, 8, 6), 9, 7, 3

WORKER = r"""
import sys
pid, port, out, cases = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4].split(",")
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"localhost:{{port}}", num_processes=2, process_id=pid)
import numpy as np
from jax.experimental import multihost_utils
from test_engine_distributed import run_case
assert jax.process_count() == 2 and len(jax.devices()) == 2 and len(jax.local_devices()) == 1
res = {{}}
for case in cases:
  state = run_case(case)  # make_round's default devices: every process's
  assert all(len(x.sharding.device_set) == 2 for x in jax.tree.leaves(state.server)), "not spread over both"
  for i, x in enumerate(jax.tree.leaves(state)):
    res[f"{{case}}/{{i}}"] = np.asarray(multihost_utils.process_allgather(x, tiled=True))
if pid == 0:
  np.savez(out, **res)
print("WORKER_OK", pid, flush=True)
"""


def run_case(case, devices=None):
  """`case` = "algorithm/strategy": the round state after ROUNDS rounds."""
  name, strategy = case.split("/")
  model = tiny_mlp()
  params = model.init(jax.random.PRNGKey(0))
  sched = make_schedule(4, 0, 2, max(SIZES), min(SIZES))
  momentum = 0.9 if name == "fedavg" else 0.0   # SCAFFOLD option II: plain SGD
  alg = method({"algorithm.name": name, **sgd_config(0.1, momentum), "server.lr": 1.0}, model, sched, C, COHORT)
  state = init_round_state(alg, jax.random.PRNGKey(1), params, C)
  rf = make_round(alg, C, COHORT, strategy, chunk_size=2, devices=devices)
  store = ragged_store(sizes=SIZES)
  for t in range(ROUNDS):
    state, _ = rf(state, store, jax.random.PRNGKey(t))
  return state


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _two_processes(cases, tmp_path):
  script = tmp_path / "worker.py"
  script.write_text(WORKER.format(root=ROOT, tests=os.path.join(ROOT, "tests")))
  out, port = tmp_path / "out.npz", str(_free_port())
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=helpers.xla_flags())
  procs = [subprocess.Popen([sys.executable, str(script), str(i), port, str(out), ",".join(cases)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
  try:
    logs = [p.communicate(timeout=600)[0] for p in procs]
  finally:
    for p in procs:  # never leave a worker behind
      if p.poll() is None:
        p.kill()
        p.wait()
  for i, (p, log) in enumerate(zip(procs, logs)):
    assert p.returncode == 0 and f"WORKER_OK {i}" in log, log[-4000:]
  return np.load(out)


# In the slow suite (both cases): by default test_distributed_runner.py's
# test_two_processes_equal_one runs SCAFFOLD in 2 processes through the runner (a sharded chunk
# executor, the same classes as "scaffold/chunked") and compares its selection and metrics;
# here the whole round state is compared at 1e-5.
@pytest.mark.slow
@pytest.mark.parametrize("cases", [
    ["scaffold/chunked"], ["fedavg/vmap", "fedavg/sequential", "scaffold/vmap", "scaffold/sequential"]])
def test_two_processes_equal_one(cases, tmp_path):
  got = _two_processes(cases, tmp_path)
  for case in cases:
    want = jax.tree.leaves(run_case(case, devices=jax.local_devices()[:1]))
    assert len(want) == len([k for k in got.files if k.startswith(case + "/")])
    for i, w in enumerate(want):
      np.testing.assert_allclose(got[f"{case}/{i}"], np.asarray(w), atol=1e-5, err_msg=f"{case} leaf {i}")
