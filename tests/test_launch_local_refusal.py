"""scripts/launch_local.sh and a refusal of bad input (exit status 2): every process refuses
the same way and process 0 alone prints the line; a later process that refuses sooner must
not get process 0 killed before its line is out."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "scripts", "launch_local.sh")

# Process 1 refuses at once and silently; process 0 takes a moment, then prints the line.
FAKE = r"""
import sys, time
pid = next(a.split("=")[1] for a in sys.argv if a.startswith("--config.distributed.process_id="))
if pid == "0":
  time.sleep(1.5)
  print("error: --config.foo: unknown config field", file=sys.stderr)
sys.exit(2)
"""


def test_process_zeros_line_survives_a_later_process_that_refused_first(tmp_path):
  fake = tmp_path / "fake.py"
  fake.write_text(FAKE)
  env = {**os.environ, "FEDJAX_DG": f"{sys.executable} {fake}", "PYTHON": sys.executable}
  p = subprocess.run(["bash", LAUNCH, "2", "--config.foo=1"], env=env, capture_output=True, text=True, timeout=60)
  assert p.returncode == 2
  assert [l for l in p.stderr.splitlines() if l.startswith(("error:", "launch_local.sh:"))] == [
      "error: --config.foo: unknown config field"], p.stderr


def test_a_process_that_never_exits_is_stopped_after_the_grace_period(tmp_path):
  fake = tmp_path / "fake.py"
  fake.write_text("import sys, time\n"
                  "pid = next(a.split('=')[1] for a in sys.argv if a.startswith('--config.distributed.process_id='))\n"
                  "time.sleep(600) if pid == '0' else sys.exit(2)\n")
  env = {**os.environ, "FEDJAX_DG": f"{sys.executable} {fake}", "PYTHON": sys.executable, "LAUNCH_LOCAL_GRACE_S": "1"}
  p = subprocess.run(["bash", LAUNCH, "2"], env=env, capture_output=True, text=True, timeout=60)
  assert p.returncode == 2
