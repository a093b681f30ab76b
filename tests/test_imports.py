"""Every module of the package imports on its own, first, in a fresh interpreter (an import
cycle shows only when a module of the cycle is the first one imported)."""
import os
import pkgutil
import subprocess
import sys

import pytest

import fedjax_dg
import helpers

SCRIPT = r"""
import importlib, sys
failed = []
for name in sys.argv[1:]:
  for m in [m for m in sys.modules if m == "fedjax_dg" or m.startswith("fedjax_dg.")]:
    del sys.modules[m]
  try:
    importlib.import_module(name)
  except Exception as e:
    failed.append(f"{name}: {type(e).__name__}: {e}")
print("\n".join(failed))
"""


# In the slow suite: by default test_import_graph.py's test_the_package_has_no_import_cycle
# finds cycles statically (lazy imports included); this one also catches an import-order
# failure through a package's __init__ and an import-time error in a module no test imports.
@pytest.mark.slow
def test_every_module_imports_first():
  names = sorted(m.name for m in pkgutil.walk_packages(fedjax_dg.__path__, "fedjax_dg.")
                 if not m.name.endswith("__main__"))
  assert "fedjax_dg.engine" in names and "fedjax_dg.checkpoint" in names and len(names) > 40
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=helpers.pythonpath(root))
  out = subprocess.run([sys.executable, "-c", SCRIPT, *names], capture_output=True, text=True, timeout=300, env=env,
                       cwd=root)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == "", out.stdout
