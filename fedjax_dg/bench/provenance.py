"""Moved to `fedjax_dg.provenance` (the runner records it; the benchmark layer reads it)."""
from fedjax_dg.provenance import git_state, machine, provenance, versions  # noqa: F401
