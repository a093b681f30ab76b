"""fedjax-dg: federated domain generalization in JAX/Flax."""
__version__ = "0.1.0"


def default_config():
  """The library's default config (fedjax_dg/defaults.py): every field a config may hold."""
  from fedjax_dg.defaults import default_config as make
  return make()
