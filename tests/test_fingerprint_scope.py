"""The source fingerprint of one run (`provenance.fingerprint_of(..., algorithm=...)`): a run
goes stale when code it can execute changes, and only then. Checked on a copy of the package
edited file by file: another method's file, an error message, a warning's text leave a
run current; its own method's file, its server rule's, a file its method imports and the
engine make it stale, and the shared base is in every method's scope."""
import json
import os
import shutil

import pytest

from fedjax_dg import provenance
from fedjax_dg.bench import results as results_lib


@pytest.fixture()
def pkg(tmp_path):
  root = tmp_path / "fedjax_dg"
  shutil.copytree(provenance.package_dir(), root, ignore=shutil.ignore_patterns("__pycache__"))
  return root


def _fp(root, algorithm):
  return provenance.fingerprint_of(str(root), algorithm=algorithm)["sha256"]


def _append(path, text="_ONE_MORE_STATEMENT = 1\n"):
  path.write_text(path.read_text() + text)


def test_scope_follows_the_method_its_rule_and_their_imports():
  scope = lambda a: {r.split("/")[1] for r in provenance.algorithm_scope(a)}  # noqa: E731
  shared = {"__init__.py", "base.py", "spec.py", "fedavg.py"}
  assert scope("fish") == shared | {"fish.py"}
  assert scope("irm") == shared | {"dg.py"}
  assert scope("fediir+omg") == shared | {"fediir.py", "fedomg.py"}
  assert scope("fedomg") == shared | {"fedomg.py"}  # its own rule lives beside its clients
  assert scope("fedprox+gma") == shared | {"fedprox.py", "fedgma.py"}
  assert provenance.algorithm_scope("no_such_method") is None  # a plugin: the whole package counts


def test_another_methods_file_leaves_a_run_current_its_own_makes_it_stale(pkg):
  fish, iir_omg = _fp(pkg, "fish"), _fp(pkg, "fediir+omg")
  whole = provenance.fingerprint_of(str(pkg))["sha256"]
  _append(pkg / "algorithms" / "fedsr.py")
  assert (_fp(pkg, "fish"), _fp(pkg, "fediir+omg")) == (fish, iir_omg)
  assert provenance.fingerprint_of(str(pkg))["sha256"] != whole  # the whole package's does change
  _append(pkg / "algorithms" / "fedomg.py")
  assert _fp(pkg, "fish") == fish and _fp(pkg, "fediir+omg") != iir_omg  # the rule's file
  _append(pkg / "algorithms" / "fish.py")
  assert _fp(pkg, "fish") != fish


def test_a_file_a_method_imports_counts_for_it(pkg):
  irm = _fp(pkg, "irm")
  _append(pkg / "algorithms" / "dg.py")
  assert _fp(pkg, "irm") != irm


def test_messages_do_not_count_conditions_do():
  a = "def f(x):\n  if x < 0:\n    raise ValueError(f'x is {x}, must be >= 0')\n  warnings.warn('hm')\n  print('x', x)\n  return x\n"
  b = "def f(x):\n  if x < 0:\n    raise ValueError('another text')\n  warnings.warn('other')\n  print('y')\n  return x\n"
  assert provenance.code_of(a) == provenance.code_of(b)
  assert provenance.code_of(a) != provenance.code_of(a.replace("x < 0", "x <= 0"))
  assert provenance.code_of(a) != provenance.code_of(a.replace("ValueError", "TypeError"))
  assert provenance.code_of(a) != provenance.code_of(a.replace("  return x\n", "  return x + 1\n"))
  assert provenance.code_of("y = f('mean')\n") != provenance.code_of("y = f('sum')\n")  # strings that do work


def test_a_run_is_judged_in_the_scope_it_recorded():
  fish = provenance.provenance("fish")["source"]
  assert fish == provenance.source_fingerprint("fish") and fish["algorithm"] == "fish"
  assert not results_lib.is_stale({"provenance": {"source": fish}})
  whole = provenance.source_fingerprint()
  assert not results_lib.is_stale({"provenance": {"source": whole}})  # recorded before scoping: whole package
  edited = dict(fish, sha256="0" * 64, code=dict(fish["code"], **{"algorithms/fish.py": "0" * 16}))
  assert results_lib.is_stale({"provenance": {"source": edited}})
  assert provenance.changed_files({"provenance": {"source": edited}}) == ["algorithms/fish.py"]
  assert results_lib.is_stale({"provenance": {"source": {k: v for k, v in edited.items() if k != "code"}}})
  assert results_lib.is_stale({"config": {"algorithm": {"name": "fish"}}})  # nothing recorded: unknown code
  json.dumps(fish)  # a summary holds it


def test_changed_files_names_what_changed_and_forgets_files_found_not_numeric(pkg, monkeypatch):
  """A run records one hash per file: a later edit is named file by file, and a file added to
  `NOT_NUMERIC` after the run (found not to decide the numbers) stops counting for it, while a
  file the run did not record (new code) counts as changed."""
  before = provenance.fingerprint_of(str(pkg), algorithm="fish")
  summary = {"provenance": {"source": before}}
  assert "algorithms/fish.py" in before["code"]
  assert "algorithms/fedsr.py" not in before["code"] and "engine/round.py" in before["code"]
  _append(pkg / "engine" / "round.py")
  _append(pkg / "models" / "conv.py")
  (pkg / "engine" / "extra.py").write_text("X = 1\n")
  now = lambda skip=provenance.NOT_NUMERIC: provenance.fingerprint_of(str(pkg), skip=skip, algorithm="fish")  # noqa: E731
  monkeypatch.setattr(provenance, "source_fingerprint", lambda algorithm=None: now())
  assert provenance.changed_files(summary) == ["engine/extra.py", "engine/round.py", "models/conv.py"]
  assert results_lib.is_stale(summary)
  skip = provenance.NOT_NUMERIC + ("engine/round.py", "engine/extra.py", "models/conv.py")
  monkeypatch.setattr(provenance, "source_fingerprint", lambda algorithm=None: now(skip))
  assert provenance.changed_files(summary) == [] and not results_lib.is_stale(summary)
  assert now(skip)["sha256"] != before["sha256"]  # the whole fingerprint alone would call it stale
