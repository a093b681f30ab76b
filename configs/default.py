"""The demo: FedAvg on the embedded rotated-digits dataset, 20 single-domain clients.

The library's default config (`fedjax_dg.default_config()`, fedjax_dg/defaults.py, which
documents every field); other config files start from it.
"""
from fedjax_dg import default_config


def get_config():
  return default_config()
