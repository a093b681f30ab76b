"""Your own methods, server rules and datasets on the command line, in sweeps and in re-scoring,
without editing the package.

A plugin is a Python module that registers what it defines when it is imported
(`fedjax_dg.register_method`, `fedjax_dg.register_rule`, `fedjax_dg.register_dataset`).
The runner imports plugins before it checks a config, in every process that reads one (the
command line, a sweep's workers, `python -m fedjax_dg.evaluate`), from two places:

  config.imports    a tuple of module names (`"mymethods"`, importable from the working
                    folder or `PYTHONPATH`) or paths of `.py` files (`"plugins/mine.py"`,
                    relative to the working folder); recorded in each run's config.json,
                    so a re-score or a resumed sweep job imports them again;
  entry points      every entry point of the group `fedjax_dg.plugins` of an installed
                    distribution (`[project.entry-points."fedjax_dg.plugins"]` in its
                    pyproject.toml), loaded once per process.

A plugin that cannot be imported is refused in one line naming it and the error.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys

from fedjax_dg.errors import ConfigError

ENTRY_POINT_GROUP = "fedjax_dg.plugins"


def _import_file(path: str):
  """The module of the file `path`, imported once under the name of its stem."""
  full = os.path.abspath(path)
  name = os.path.splitext(os.path.basename(full))[0]
  loaded = sys.modules.get(name)
  if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") == full:
    return loaded
  if not os.path.isfile(full):
    raise ConfigError(f"imports: no such file {path!r}")
  spec = importlib.util.spec_from_file_location(name, full)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    sys.modules.pop(name, None)
    raise
  return module


def import_plugin(entry: str):
  """Imports one plugin: a module name, or the path of a `.py` file.

  Args:
    entry: `"package.module"`, or a path ending in `.py` (relative to the working folder).

  Returns:
    The imported module.

  Raises:
    ConfigError: one line naming the entry and why it could not be imported.
  """
  if not isinstance(entry, str) or not entry.strip():
    raise ConfigError(f"imports: every entry must be a module name or a .py file, got {entry!r}")
  try:
    if entry.endswith(".py") or os.sep in entry:
      return _import_file(entry)
    if os.getcwd() not in sys.path and "" not in sys.path:  # a console script's path lacks the working folder
      sys.path.append(os.getcwd())
    return importlib.import_module(entry)
  except ConfigError:
    raise
  except Exception as e:  # pylint: disable=broad-except  # the plugin's own error, in one line
    first = (str(e).strip().splitlines() or [""])[0]
    raise ConfigError(f"imports: cannot import {entry!r} ({type(e).__name__}: {first})") from None


def load_entry_points() -> list[str]:
  """Imports every entry point of the group `fedjax_dg.plugins` (a module imported before is
  not run again: Python keeps it in `sys.modules`). Returns their names."""
  out = []
  for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
    try:
      ep.load()
    except Exception as e:  # pylint: disable=broad-except
      first = (str(e).strip().splitlines() or [""])[0]
      raise ConfigError(f"entry point {ep.name!r} ({ep.value}) of group {ENTRY_POINT_GROUP!r} cannot be "
                        f"imported ({type(e).__name__}: {first})") from None
    out.append(ep.name)
  return out


def load(config) -> None:
  """Imports the plugins a config names (`config.imports`) and the installed entry points,
  before the config is checked. Importing a module twice does nothing.

  Args:
    config: an experiment config (a ConfigDict, or anything with `.get("imports")`).

  Raises:
    ConfigError: one line for an entry that is no string or cannot be imported.
  """
  load_entry_points()
  entries = config.get("imports", ()) if hasattr(config, "get") else ()
  if isinstance(entries, str):
    raise ConfigError(f"imports must be a tuple of module names or .py files, got the string {entries!r}; "
                      f"write ({entries!r},)")
  for entry in entries or ():
    import_plugin(entry)

