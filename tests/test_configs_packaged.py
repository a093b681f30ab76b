"""The shipped configs (`fedjax_dg.configs`): the repository's `configs/` installed with the
package, named, copied, and run from an installation made with `pip install --target`
outside the checkout."""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from fedjax_dg import configs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _repo_configs() -> set:
  """Every .py file under the repository's configs/, as a path relative to it."""
  base = os.path.join(ROOT, "configs")
  return {os.path.relpath(os.path.join(d, f), base) for d, dirs, fs in os.walk(base)
          for f in fs if f.endswith(".py") and "__pycache__" not in d}


def test_names_and_paths_are_the_repositorys_configs():
  assert {n + ".py" for n in configs.names()} == _repo_configs()
  want = os.path.realpath(os.path.join(ROOT, "configs", "sweeps", "tiny.py"))
  for spelling in ("sweeps/tiny", "sweeps/tiny.py", "configs/sweeps/tiny.py"):
    assert os.path.realpath(configs.path(spelling)) == want
  got = configs.path("pacs:fediir")
  assert got.endswith(".py:fediir") and os.path.samefile(got[:-len(":fediir")], os.path.join(ROOT, "configs", "pacs.py"))
  with pytest.raises(configs.ConfigNotFound, match=r"^no shipped config 'pac'; shipped: benchmark_common, "):
    configs.path("pac")
  assert configs.summary("default").startswith("The demo: FedAvg")
  assert configs.summary("benchmark_common").startswith("(helper, no get_config) ")


def test_copy_writes_every_config_and_refuses_to_overwrite(tmp_path):
  written = configs.copy(str(tmp_path / "mine"))
  assert {os.path.relpath(w, tmp_path / "mine") for w in written} == _repo_configs()
  sys.path.insert(0, str(tmp_path / "mine"))  # a config imports its neighbours from its folder
  try:
    spec = importlib.util.spec_from_file_location("copied_pacs", tmp_path / "mine" / "pacs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.get_config("fediir").model.feature_projection == 512
  finally:
    sys.path.remove(str(tmp_path / "mine"))
  (tmp_path / "other" / "sweeps").mkdir(parents=True)
  (tmp_path / "other" / "sweeps" / "tiny.py").write_text("# mine\n")
  with pytest.raises(configs.ConfigNotFound, match=r"sweeps/tiny.py: exists; copy into an empty folder"):
    configs.copy(str(tmp_path / "other"))
  assert os.listdir(tmp_path / "other") == ["sweeps"]  # nothing written


def _cli(args, cwd, pythonpath, timeout=300):
  env = {**os.environ, "PYTHONPATH": pythonpath, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_installed_package_runs_its_configs_outside_the_checkout(tmp_path):
  """`pip install --no-deps --no-build-isolation --target T` of a copy of the source tree;
  from a folder outside the checkout with only T on the path, the shipped configs are
  listed, a run and a sweep read theirs, and the CLI names a missing one in one line."""
  pytest.importorskip("pip")
  if importlib.util.find_spec("wheel") is None:
    import setuptools
    if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (70, 1):
      pytest.skip("building a wheel without isolation needs setuptools>=70.1 or the wheel package (the test extra)")
  src = tmp_path / "src"
  src.mkdir()
  for name in ("pyproject.toml", "README.md", "LICENSE"):
    shutil.copy(os.path.join(ROOT, name), src / name)
  skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
  shutil.copytree(os.path.join(ROOT, "fedjax_dg"), src / "fedjax_dg", symlinks=True, ignore=skip)
  shutil.copytree(os.path.join(ROOT, "configs"), src / "configs", ignore=skip)
  target = tmp_path / "T"
  r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                      "--target", str(target), str(src)], capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  shipped = target / "fedjax_dg" / "configs" / configs.SHIPPED
  assert not os.path.islink(shipped)  # the files themselves, not the checkout's link
  installed = {os.path.relpath(os.path.join(d, f), shipped) for d, _, fs in os.walk(shipped)
               for f in fs if f.endswith(".py")}
  assert installed == _repo_configs()
  from fedjax_dg import provenance  # the shipped configs are no part of the code a run's staleness reads
  assert provenance.fingerprint_of(str(target / "fedjax_dg")) == provenance.source_fingerprint()

  away = tmp_path / "elsewhere"
  away.mkdir()
  r = _cli(["-c", "import fedjax_dg; print(fedjax_dg.__file__)"], away, str(target))
  assert r.stdout.strip() == str(target / "fedjax_dg" / "__init__.py"), r.stderr
  r = _cli(["-m", "fedjax_dg.configs", "list"], away, str(target))
  assert r.returncode == 0 and [line.split()[0] for line in r.stdout.splitlines()[:-1]] == configs.names()
  r = _cli(["-m", "fedjax_dg.configs", "path", "default"], away, str(target))
  default = r.stdout.strip()
  assert r.returncode == 0 and default == str(shipped / "default.py")
  r = _cli(["-m", "fedjax_dg.configs", "path", "nope"], away, str(target))
  assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith("error: no shipped config 'nope'; shipped: ")
  assert r.stderr.count("\n") == 1

  r = _cli(["-m", "fedjax_dg", "--config", default, "--config.model.name=mlp", "--config.data.image_size=8",
            "--config.num_clients=4", "--config.num_rounds=1", "--config.eval_every=1",
            f"--config.workdir={away / 'run'}"], away, str(target), timeout=600)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
  assert os.path.exists(away / "run" / "summary.json")
  tiny = _cli(["-m", "fedjax_dg.configs", "path", "sweeps/tiny"], away, str(target)).stdout.strip()
  r = _cli(["-m", "fedjax_dg.bench", "status", "--sweep", tiny, f"--sweep.root={away / 'sweep'}"], away, str(target))
  assert r.returncode == 0 and "pending" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
