"""The package's import graph has no cycle (lazy imports inside functions included), and no
module reaches into another module's private names."""
from __future__ import annotations

import ast
import os

import fedjax_dg

ROOT = os.path.dirname(fedjax_dg.__file__)


def _modules() -> dict:
  """`{module name: path}` of every module of the package (a package is its __init__)."""
  out = {}
  for dirpath, _, files in os.walk(ROOT):
    for f in files:
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(dirpath, f), os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
        out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, f)
  return out


def _target(name: str, modules: dict) -> str | None:
  """The package module an import of `name` loads (the longest known prefix)."""
  while name and name not in modules:
    name = name.rpartition(".")[0]
  return name or None


def imports(modules: dict) -> dict:
  """`{module: {(imported module, private names imported from it, line)}}`, every import
  statement of the module, at any depth."""
  graph = {}
  for mod, path in modules.items():
    tree = ast.parse(open(path).read())
    package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    edges = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        for a in node.names:
          t = _target(a.name, modules)
          if t:
            edges.add((t, (), node.lineno))
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parts = package.split(".")
          base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
        for a in node.names:
          sub = _target(f"{base}.{a.name}", modules)
          if sub and sub == f"{base}.{a.name}":  # `from pkg import module`
            edges.add((sub, (), node.lineno))
          else:
            t = _target(base, modules)
            if t:
              private = (a.name,) if a.name.startswith("_") and not a.name.startswith("__") else ()
              edges.add((t, private, node.lineno))
    graph[mod] = edges
  return graph


def _cycles(graph: dict) -> list:
  """The strongly connected components of more than one module (Tarjan), and self-loops."""
  index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w, _, _ in graph.get(v, ()):
      if w == v or w not in graph:
        continue
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))
  import sys
  limit = sys.getrecursionlimit()
  sys.setrecursionlimit(max(limit, 10000))
  try:
    for v in graph:
      if v not in index:
        visit(v)
  finally:
    sys.setrecursionlimit(limit)
  return out


def _is_parent(a: str, b: str) -> bool:
  """A package importing its own submodule (its `__init__` re-exporting) is no cycle of jobs."""
  return b.startswith(a + ".")


def test_the_package_has_no_import_cycle():
  modules = _modules()
  graph = imports(modules)
  # A package's __init__ importing its submodules, and a submodule importing a sibling via
  # the package, is how Python packages are built: only edges between modules count.
  graph = {m: {e for e in edges if not _is_parent(m, e[0]) and not _is_parent(e[0], m)} for m, edges in graph.items()}
  cycles = _cycles(graph)
  assert not cycles, f"import cycles: {cycles}"


def test_no_private_name_is_imported_from_another_module():
  modules = _modules()
  found = [(m, t, names, line) for m, edges in imports(modules).items() for t, names, line in edges
           if names and t != m]
  assert not found, f"private names imported across modules: {found}"


def test_the_cycle_finder_finds_a_cycle():
  graph = {"a": {("b", (), 1)}, "b": {("c", (), 1)}, "c": {("a", (), 1)}, "d": {("a", (), 1)}}
  assert _cycles(graph) == [["a", "b", "c"]]
  assert _cycles({"a": {("b", (), 1)}, "b": set()}) == []
