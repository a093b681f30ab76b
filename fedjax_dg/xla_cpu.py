"""XLA:CPU's flags that fedjax-dg sets by default: convolutions through XLA's own kernels.

jaxlib 0.10 hands each convolution on a CPU to YNNPACK (XLA's `individual_convolution`
YNN fusion). On the 2-core x86-64 machine of the benchmarks, one client's local work of
DomainBed's MNIST CNN (5 SGD steps of batch 32) ran 1.06-1.46x slower that way than
without YNNPACK convolutions, the programs compiled in one process and their calls
alternated (benchmarks/results/cnn_ynn_cpu.json), and 1.4-1.5x in processes of their own
with this flag (benchmarks/results/cnn_client_cpu.json; docs/peers.md). So, at
`import fedjax_dg`, before JAX starts its CPU backend, the package adds

    --xla_cpu_experimental_ynn_fusion_type=-individual_convolution

to `XLA_FLAGS`: YNNPACK keeps its other fusions (matrix products, element-wise), only the
convolutions go back to XLA. It is left out when:

  FEDJAX_DG_XLA_CPU_DEFAULTS=off      switched off (also: 0, false, no, none)
  XLA_FLAGS already names the option  the user's own setting is kept
  jaxlib is not 0.10.x                the only versions it was measured on (XLA stops
                                      a process at an option it does not know)

XLA reads `XLA_FLAGS` once, when JAX first uses a device: a process that ran JAX before
importing fedjax_dg keeps the flags it started with (set `XLA_FLAGS` yourself there).
"""
from __future__ import annotations

import os

ENV = "FEDJAX_DG_XLA_CPU_DEFAULTS"
OPTION = "--xla_cpu_experimental_ynn_fusion_type"
FLAG = OPTION + "=-individual_convolution"
MEASURED_JAXLIB = "0.10."  # the jaxlib versions (a prefix) the flag was measured on
_OFF = ("off", "0", "false", "no", "none")


def jaxlib_version() -> str | None:
  """The installed jaxlib's version, from its package metadata (jaxlib is not imported).

  Returns:
    The version string, or None when jaxlib is not installed.
  """
  from importlib import metadata
  try:
    return metadata.version("jaxlib")
  except metadata.PackageNotFoundError:
    return None


def xla_flags(environ, version: str | None) -> str | None:
  """The `XLA_FLAGS` value with the package's CPU default added, or None to leave it.

  Args:
    environ: the environment (a mapping) to read `XLA_FLAGS` and `FEDJAX_DG_XLA_CPU_DEFAULTS` from.
    version: the installed jaxlib's version string (None: not installed).

  Returns:
    The new `XLA_FLAGS` string, or None when the default does not apply (switched off,
    the option already set, or another jaxlib than the one measured).
  """
  if environ.get(ENV, "").strip().lower() in _OFF:
    return None
  current = environ.get("XLA_FLAGS", "")
  if OPTION in current or not (version or "").startswith(MEASURED_JAXLIB):
    return None
  return (current + " " + FLAG).strip()


def apply(environ=None) -> bool:
  """Adds the CPU default to `XLA_FLAGS` in `environ` (default `os.environ`) where it applies.

  Args:
    environ: the environment to change (default: `os.environ`).

  Returns:
    True if the flag was added.
  """
  environ = os.environ if environ is None else environ
  flags = xla_flags(environ, jaxlib_version())
  if flags is None:
    return False
  environ["XLA_FLAGS"] = flags
  return True
