"""The error every input check raises: one line naming the field or file, printed by the CLI
as `error: <message>` with exit status 2. Kept in a module of its own so that the lowest
layers (the run directory, the data loaders) raise it without importing the config's
validation, which imports the methods and the engine."""
from __future__ import annotations


class ConfigError(ValueError):
  """A config field, or a file a run reads or owns, holds something the run cannot use."""
