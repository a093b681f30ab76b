"""The tutorials run as written: every ```python block of a page, in order, in a fresh Python."""
import os
import re
import subprocess
import sys

from helpers import pythonpath

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_page(page: str) -> str:
  with open(os.path.join(ROOT, page)) as f:
    code = "\n".join(re.findall(r"```python\n(.*?)```", f.read(), re.S))
  assert code.strip(), f"{page} has no python block"
  env = dict(os.environ, PYTHONPATH=pythonpath(ROOT), JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
  assert out.returncode == 0, out.stdout + out.stderr
  return out.stdout


def test_differentiable_rounds_tutorial():
  out = run_page("docs/tutorials/differentiable_rounds.md")
  losses = [float(v) for v in re.findall(r"outer step \d: worst-class loss ([0-9.]+)", out)]
  assert len(losses) == 5 and losses[-1] < losses[0], out  # the outer steps lower the objective
  assert "d/d client.lr" in out and "d/d shrink" in out, out
