"""How the API reference renders the package's docstrings: the Google-style parser with the
options of mkdocs.yml reads each Returns section as one value described in prose (one table
row), and the committed screenshots of the reference exist and stay small."""
import ast
import inspect
import logging
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
griffe = pytest.importorskip("griffe")
yaml = pytest.importorskip("yaml")


def _docstring_options() -> dict:
  """The mkdocstrings python handler's docstring_options from mkdocs.yml."""
  with open(os.path.join(ROOT, "mkdocs.yml")) as f:
    conf = yaml.safe_load(f)
  for plugin in conf["plugins"]:
    if isinstance(plugin, dict) and "mkdocstrings" in plugin:
      return plugin["mkdocstrings"]["handlers"]["python"]["options"].get("docstring_options", {})
  raise AssertionError("mkdocs.yml: no mkdocstrings plugin")


def _returns(doc: str, options: dict) -> list:
  logging.getLogger("griffe").setLevel(logging.ERROR)  # a missing annotation is not the question here
  sections = griffe.Docstring(doc, parser="google", parser_options=options).parse()
  return [item for s in sections if s.kind.value == "returns" for item in s.value]


def _package_docstrings():
  """`(where, docstring)` of every function and class of the package with a Returns section."""
  for d, _, files in os.walk(os.path.join(ROOT, "fedjax_dg")):
    for f in sorted(files):
      if f.endswith(".py"):
        path = os.path.join(d, f)
        for node in ast.walk(ast.parse(open(path).read())):
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node)
            if doc and "\nReturns:\n" in doc:
              yield f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.name}", doc


def test_a_returns_section_is_one_row():
  from fedjax_dg import experiment
  doc = inspect.cleandoc(experiment.train_and_evaluate.__doc__)
  assert len(_returns(doc, {"returns_multiple_items": True})) > 5  # the parser's default: a row per line
  options = _docstring_options()
  (only,) = _returns(doc, options)
  assert only.description.startswith("The summary dict written to `workdir/summary.json`.")
  assert only.description.endswith("`selection` (empty).")
  split = [where for where, d in _package_docstrings() if len(_returns(d, options)) != 1]
  assert not split, split


@pytest.mark.parametrize("name", ["api_methodspec.png", "api_train_and_evaluate.png"])
def test_reference_screenshots_are_committed_and_small(name):
  from PIL import Image
  path = os.path.join(ROOT, "docs", "assets", name)
  assert os.path.getsize(path) < 400 * 1024
  with Image.open(path) as im:
    assert im.size[0] == 1280 and im.size[1] >= 1000
  assert f"assets/{name}" in open(os.path.join(ROOT, "docs", "api.md")).read()
