"""fedjax-dg: federated domain generalization in JAX/Flax."""
__version__ = "0.1.0"
