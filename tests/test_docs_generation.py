"""Adding a method is one file and one registry line: the docs build (scripts/mkdocs_hooks.py)
writes its page and puts it in the navigation, with nothing edited by hand."""
from __future__ import annotations

import importlib.util
import os

import yaml

from fedjax_dg import algorithms
from fedjax_dg.algorithms.spec import MethodSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _hooks():
  spec = importlib.util.spec_from_file_location("mkdocs_hooks", os.path.join(ROOT, "scripts", "mkdocs_hooks.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _nav():
  with open(os.path.join(ROOT, "mkdocs.yml")) as f:
    return yaml.safe_load(f)["nav"]


def _paths(nav) -> list:
  out = []
  for item in nav:
    if isinstance(item, str):
      out.append(item)
    else:
      (v,) = item.values()
      out += _paths(v) if isinstance(v, list) else [v]
  return out


def test_a_registered_method_gets_a_page_and_a_navigation_entry(monkeypatch):
  hooks = _hooks()
  monkeypatch.setitem(algorithms.METHODS, "toypage", None)
  algorithms.register(MethodSpec("toypage", "a test", algorithms.METHODS["erm"].client))
  pages = hooks.generated_pages()
  assert "# toypage" in pages[os.path.join("methods", "toypage.md")]
  nav = hooks.navigation(_nav(), pages)
  paths = _paths(nav)
  assert os.path.join("methods", "toypage.md") in paths
  assert paths.count("methods/index.md") == 1 and "ALGORITHMS.md" in paths  # hand-written entries stay
  methods = next(v for item in nav if isinstance(item, dict) for k, v in item.items() if k == "Methods")
  assert _paths(methods)[-1] == os.path.join("methods", "toypage.md")  # registry order: registered last


def test_the_navigation_lists_every_generated_page_once():
  hooks = _hooks()
  pages = hooks.generated_pages()
  paths = _paths(hooks.navigation(_nav(), pages))
  for rel in pages:
    assert paths.count(rel) == 1, rel
  assert len(paths) == len(set(paths))
