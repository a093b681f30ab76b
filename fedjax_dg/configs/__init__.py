"""The config files shipped with the package: the repository's `configs/`, installed with
the package, so that an installed `fedjax-dg` runs them without a checkout.

    python -m fedjax_dg.configs list                 # every shipped config and what it is
    python -m fedjax_dg.configs path pacs[:SETTING]  # its installed file, for --config
    python -m fedjax_dg.configs copy DIR             # all of them into DIR, to edit

    fedjax-dg --config "$(python -m fedjax_dg.configs path default)" --config.num_rounds=2
    fedjax-dg-sweep run --sweep "$(python -m fedjax_dg.configs path sweeps/tiny)"

A config is named by its path under `configs/` without `.py` (`pacs`, `sweeps/tiny`); the
repository's spelling (`configs/pacs.py`) is accepted too, and `:SETTING` is passed on as
`--config FILE:SETTING` takes it. The dataset configs import their neighbours
(`default.py`, `benchmark_common.py`) from their own folder, so `copy` copies them all.
"""
from __future__ import annotations

import ast
import os
import shutil
import textwrap

SHIPPED = "shipped"  # the folder of this package holding the files (the repository's configs/)


class ConfigNotFound(ValueError):
  """A one-line error naming a config that is not shipped, or a copy that would overwrite."""


def folder() -> str:
  """The folder holding the shipped config files.

  Returns:
    Its path: inside the installed package, or the repository's `configs/` in a checkout.

  Raises:
    ConfigNotFound: when the package was installed without its config files.
  """
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), SHIPPED)
  if not os.path.isfile(os.path.join(path, "default.py")):
    raise ConfigNotFound(f"{path}: the package's config files are not installed (no default.py); "
                         "reinstall fedjax-dg or use a checkout's configs/")
  return path


def names() -> list[str]:
  """Every shipped config, by name.

  Returns:
    The names, sorted: each file's path under the config folder without `.py`, with `/`
    between folders (`default`, `pacs`, `sweeps/tiny`).
  """
  root = folder()
  out = []
  for d, dirs, files in os.walk(root):
    dirs[:] = sorted(x for x in dirs if not x.startswith((".", "__")))
    rel = os.path.relpath(d, root)
    out += [f[:-3] if rel == "." else f"{rel.replace(os.sep, '/')}/{f[:-3]}"
            for f in files if f.endswith(".py") and not f.startswith("__")]
  return sorted(out)


def path(name: str) -> str:
  """The installed file of a shipped config, as `--config` / `--sweep` take it.

  Args:
    name: `pacs`, `sweeps/tiny`, `configs/pacs.py` or `pacs.py`, optionally followed by
      `:SETTING` (`pacs:fediir`).

  Returns:
    The file's absolute path, followed by `:SETTING` when one was given.

  Raises:
    ConfigNotFound: one line naming the config and the shipped ones.
  """
  stem, sep, setting = name.partition(":")
  stem = stem.strip().replace(os.sep, "/")
  stem = stem[len("configs/"):] if stem.startswith("configs/") else stem
  stem = stem[:-3] if stem.endswith(".py") else stem
  known = names()
  if stem not in known:
    raise ConfigNotFound(f"no shipped config {name!r}; shipped: {', '.join(known)}")
  return os.path.join(folder(), *stem.split("/")) + ".py" + sep + setting


def summary(name: str, width: int = 100) -> str:
  """What a shipped config is: the first paragraph of its docstring, shortened.

  Args:
    name: a shipped config (see `path`).
    width: the most characters of the paragraph kept (whole words, then " ...").

  Returns:
    That paragraph ("" without a docstring), marked as a helper when the file defines no
    `get_config` (the dataset configs import it).
  """
  with open(path(name).partition(":")[0], encoding="utf-8") as f:
    tree = ast.parse(f.read())
  sentence = textwrap.shorten((ast.get_docstring(tree) or "").split("\n\n")[0], width, placeholder=" ...")
  runnable = any(isinstance(n, ast.FunctionDef) and n.name == "get_config" for n in tree.body)
  return sentence if runnable else f"(helper, no get_config) {sentence}".rstrip()


def copy(dest: str) -> list[str]:
  """Copies every shipped config into `dest` (its folders kept), to edit and run from there.

  Args:
    dest: the folder to copy into; created when absent.

  Returns:
    The paths written.

  Raises:
    ConfigNotFound: one line naming the first file of `dest` a copy would overwrite; nothing
      is written then.
  """
  root = folder()
  pairs = [(os.path.join(root, *n.split("/")) + ".py", os.path.join(dest, *n.split("/")) + ".py") for n in names()]
  clash = next((d for _, d in pairs if os.path.lexists(d)), None)
  if clash:
    raise ConfigNotFound(f"{clash}: exists; copy into an empty folder or remove it")
  for src, dst in pairs:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copyfile(src, dst)
  return [d for _, d in pairs]
