"""What a user sees around the core: a missing optional extra is one line naming the extra,
`--help` texts end in whole sentences, and the README and the documentation's home page
count the methods the registry holds."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "sweeps", "tiny.py")


def _env():
  return {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "") or "cpu"}


def _bench_without_matplotlib(args, tmp_path):
  """`python -m fedjax_dg.bench ARGS` in a process where `import matplotlib` fails."""
  code = ("import sys; sys.modules['matplotlib'] = None\n"
          "from fedjax_dg.bench import cli\n"
          f"sys.argv = ['fedjax-dg-sweep'] + {args!r}\n"
          "cli.run()\n")
  return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                        timeout=300)


def test_figures_without_matplotlib_is_one_line_naming_the_extra(tmp_path):
  # "figures" takes the same call site and message; the next test checks that it asks too
  for cmd in ("report",):
    r = _bench_without_matplotlib([cmd, "--sweep", TINY, f"--sweep.root={tmp_path}/tiny",
                                   "--sweep.figures.curves_grid=table"], tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines == [f'error: {cmd} draws figures with matplotlib, which is not installed: '
                     'pip install "fedjax-dg[bench]"'], r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_a_sweep_without_figures_does_not_ask_for_matplotlib(monkeypatch):
  import importlib.util

  import ml_collections
  from fedjax_dg.bench import cli
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
  sweep = ml_collections.ConfigDict({"grids": {"table": {}}, "figures": {}})
  assert cli._missing_matplotlib("report", sweep) is None  # pylint: disable=protected-access
  sweep.figures.curves_grid = "table"
  assert "fedjax-dg[bench]" in cli._missing_matplotlib("report", sweep)  # pylint: disable=protected-access
  assert "fedjax-dg[bench]" in cli._missing_matplotlib("figures", sweep)  # pylint: disable=protected-access
  assert cli._missing_matplotlib("status", sweep) is None  # pylint: disable=protected-access


def test_prepare_help_gives_the_whole_description():
  r = subprocess.run([sys.executable, "-m", "fedjax_dg.data.prepare", "--help"], cwd=ROOT, env=_env(),
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  from fedjax_dg.data import prepare
  first_paragraph = " ".join(prepare.__doc__.split("\n\n")[0].split())
  assert first_paragraph.endswith(".")
  assert first_paragraph in " ".join(r.stdout.split())


def _method_counts(path: str) -> list[int]:
  text = open(os.path.join(ROOT, path)).read()
  return [int(n) for n in re.findall(r"\b(\d+) methods and their compositions", text)]


def test_readme_and_docs_home_count_the_registered_methods():
  from fedjax_dg.algorithms import METHODS
  for path in ("README.md", "docs/index.md"):
    counts = _method_counts(path)
    assert counts and all(n == len(METHODS) for n in counts), (path, counts, len(METHODS))


def test_readme_and_install_page_give_a_gpu_install_line():
  for path in ("README.md", "docs/getting-started.md"):
    assert re.search(r'pip install -e "\.\[test\]" "jax\[cuda1\d\]"', open(os.path.join(ROOT, path)).read()), path
