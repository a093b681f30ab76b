"""A sweep of the plugin's method against FedAvg, written outside the package:

  python -m fedjax_dg.bench run --sweep my_sweep.py
  python -m fedjax_dg.bench report --sweep my_sweep.py

The helpers come from the package (`fedjax_dg.bench.sweep_helpers`), the experiment from
my_config.py beside this file.
"""
import os

from fedjax_dg.bench import sweep_helpers
from fedjax_dg.bench.sweep import load_config_file

HERE = os.path.dirname(os.path.abspath(__file__))


def get_config():
  s = sweep_helpers.skeleton("The plugin's method against FedAvg on shifted blobs", "runs/plugin_sweep")
  s.base = load_config_file(os.path.join(HERE, "my_config.py"))
  s.base.imports = (os.path.join(HERE, "my_plugin.py"),)  # a file path: the workers import it wherever they run
  s.table.groups = (("B", ("fedavg",)), ("plugin", ("shrinkavg+damped",)))
  s.table.display = {"fedavg": "FedAvg", "shrinkavg+damped": "ShrinkAvg+damped"}
  s.grids.table = {"methods": ("fedavg", "shrinkavg+damped"), "client_counts": (6,), "lams": (1.0,),
                   "seeds": (0,)}
  s.launch.compilation_cache = False
  return s
