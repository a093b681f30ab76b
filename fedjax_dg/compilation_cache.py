"""JAX's persistent compilation cache, on by default for the command line and the library.

A run compiles its round, its evaluation and a few small programs; on a CPU that is most
of the seconds before the first round. With the cache, a second run of the same shapes
(the next seed, the next point of a sweep, a resume) reads the compiled programs from disk
instead. Where the cache lives:

  FEDJAX_DG_COMPILATION_CACHE unset   `$XDG_CACHE_HOME/fedjax_dg/jax` (default `~/.cache/fedjax_dg/jax`)
  FEDJAX_DG_COMPILATION_CACHE=<dir>   that folder
  FEDJAX_DG_COMPILATION_CACHE=off     no cache (also: 0, false, no, none)

A cache folder set through JAX itself (`JAX_COMPILATION_CACHE_DIR` or
`jax.config.update("jax_compilation_cache_dir", ...)`) is left as it is. Every program is
cached whatever its compile time or size (`jax_persistent_cache_min_compile_time_secs = 0`,
`jax_persistent_cache_min_entry_size_bytes = 0`): the rounds of a small run compile in
well under JAX's default threshold of one second each, and they add up. Processes may
share the folder (a sweep's workers): a process that meets an entry another one is still
writing warns and compiles the program again; it never runs a half-written one. Measured effect on a small run:
docs/peers.md (start-up).
"""
from __future__ import annotations

import os

ENV = "FEDJAX_DG_COMPILATION_CACHE"
_OFF = ("off", "0", "false", "no", "none")


def cache_dir(environ=None) -> str | None:
  """The cache folder the environment asks for, or None when the cache is switched off.

  Args:
    environ: the environment to read (default: `os.environ`).

  Returns:
    An absolute folder path, or None for `FEDJAX_DG_COMPILATION_CACHE=off`.
  """
  environ = os.environ if environ is None else environ
  value = environ.get(ENV, "").strip()
  if value.lower() in _OFF:
    return None
  if value:
    return os.path.abspath(os.path.expanduser(value))
  base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
  return os.path.join(base, "fedjax_dg", "jax")


def enable(path: str | None = None, environ=None) -> str | None:
  """Turns JAX's persistent compilation cache on (idempotent; call before compiling).

  Args:
    path: the cache folder; default `cache_dir(environ)`.
    environ: the environment to read (default: `os.environ`).

  Returns:
    The folder in use (one JAX was already given is kept), or None when the cache is off.
  """
  environ = os.environ if environ is None else environ
  import jax
  current = jax.config.jax_compilation_cache_dir
  if current:
    return current
  path = path or cache_dir(environ)
  if path is None:
    return None
  try:
    os.makedirs(path, exist_ok=True)
  except OSError:  # a read-only home: run without the cache rather than fail
    return None
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path
