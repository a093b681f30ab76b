"""Two processes of one `jax.distributed` job given the same `distributed.process_id` on one
machine: the second is refused at once, in one line, before `jax.distributed` starts; the
id is free again when its holder ends, however it ends."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOLD = r"""
import sys, time, ml_collections
from fedjax_dg import distributed
d = ml_collections.ConfigDict({"coordinator_address": sys.argv[1], "process_id": 1, "num_processes": 2})
distributed.claim_process_id(d)
print("held", flush=True)
time.sleep(300)
"""


def free_address() -> str:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return f"localhost:{s.getsockname()[1]}"


def env():
  return dict(os.environ, PYTHONPATH=helpers.pythonpath(ROOT), JAX_PLATFORMS="cpu")


def holder(address):
  """A process holding id 1 of the job at `address` (it has printed "held")."""
  p = subprocess.Popen([sys.executable, "-c", HOLD, address], env=env(), stdout=subprocess.PIPE, text=True, cwd=ROOT)
  assert p.stdout.readline().strip() == "held"
  return p


def second_process(tmp, address, timeout_s=30):
  argv = [sys.executable, "-m", "fedjax_dg", "--config", "configs/default.py", "--config.model.name=mlp",
          "--config.num_clients=4", "--config.num_rounds=4", "--config.checkpoint_every=0", f"--config.workdir={tmp}/W",
          "--config.distributed.initialize=local", f"--config.distributed.coordinator_address={address}",
          "--config.distributed.num_processes=2", "--config.distributed.process_id=1",
          f"--config.distributed.timeout_s={timeout_s}"]
  start = time.time()
  out = subprocess.run(argv, env=env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
  return out, time.time() - start


# In the slow suite: by default test_bad_inputs.py's case "two processes given the same process
# id" runs the same `holder` and `second_process` (exit status 2, one line, the whole line
# compared in docs/bad_inputs.md); a wait inside jax.distributed would end in another line.
@pytest.mark.slow
def test_a_second_process_with_the_same_id_is_refused_at_once(tmp_path):
  address = free_address()
  p = holder(address)
  try:
    out, took = second_process(tmp_path, address, timeout_s=60)
  finally:
    p.kill()
    p.wait()
  assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr[-2000:]
  assert out.stderr.strip() == (f"error: distributed.process_id: 1 is already used by process {p.pid} on this machine "
                                f"(coordinator {address}); give each of the 2 processes its own id in [0, 1], as "
                                "scripts/launch_local.sh does")
  assert took < 60  # not the start-up timeout: refused before jax.distributed waits


def test_the_id_is_free_again_once_its_holder_is_killed(tmp_path):
  address = free_address()
  p = holder(address)
  os.kill(p.pid, signal.SIGKILL)
  p.wait()
  out, _ = second_process(tmp_path, address, timeout_s=3)  # no process 0: the coordinator's line, not the id's
  assert out.returncode == 2 and "no coordinator answered at" in out.stderr and "already used" not in out.stderr, \
      out.stderr[-2000:]
