"""The docs build's hook (mkdocs.yml `hooks:`): everything generated from the registries is
regenerated before the pages are read, so adding a method or a prepared dataset edits no
documentation by hand.

  - the method pages (`docs/methods/<name>.md`) and the prepared datasets' pages
    (`docs/datasets/<name>.md`): `scripts/docs_pages.py`;
  - the tables of docs/methods/index.md: `scripts/readme_tables.py`;
  - the navigation: the Methods and Datasets sections list every generated page, in the
    registry's order, keeping the title a page already has in mkdocs.yml.
"""
from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script(name: str):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _write_if_changed(path: str, text: str) -> None:
  old = open(path).read() if os.path.exists(path) else None
  if old != text:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)


def generated_pages() -> dict:
  """`{docs-relative path: text}` of every generated page."""
  pages = _script("docs_pages").pages()
  return {os.path.relpath(os.path.join(ROOT, rel), os.path.join(ROOT, "docs")): text for rel, text in pages.items()}


def _entry_path(entry):
  """The page path of a nav entry (`"x.md"` or `{"Title": "x.md"}`), or None for a section."""
  if isinstance(entry, str):
    return entry
  (value,) = entry.values()
  return value if isinstance(value, str) else None


def navigation(nav: list, pages) -> list:
  """`nav` with each section holding generated pages (Methods, Datasets) listing exactly the
  generated pages of its folder, in registry order; an entry that is no generated page
  stays where it is, and a page keeps the title it had."""
  out = []
  for item in nav:
    if not isinstance(item, dict) or not isinstance(next(iter(item.values())), list):
      out.append(item)
      continue
    (title, entries), = item.items()
    folders = {os.path.dirname(p) for p in map(_entry_path, entries) if p in pages}
    if not folders:
      out.append({title: navigation(entries, pages)})
      continue
    titles = {_entry_path(e): (next(iter(e)) if isinstance(e, dict) else None) for e in entries}
    kept = [e for e in entries if _entry_path(e) not in pages]
    for rel in pages:
      if os.path.dirname(rel) in folders:
        name = titles.get(rel) or os.path.splitext(os.path.basename(rel))[0]
        kept.append({name: rel})
    out.append({title: kept})
  return out


def on_config(config, **kwargs):  # pylint: disable=unused-argument
  pages = generated_pages()
  for rel, text in pages.items():
    _write_if_changed(os.path.join(ROOT, "docs", rel), text)
  tables = _script("readme_tables")
  for rel in tables.PAGES:
    path = os.path.join(ROOT, rel)
    _write_if_changed(path, tables.render(open(path).read()))
  config["nav"] = navigation(config["nav"], pages)
  return config
