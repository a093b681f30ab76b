"""A run of the plugin's method with the plugin's rule on the plugin's dataset:

  fedjax-dg --config my_config.py --config.workdir=runs/plugin

run from this folder (the plugin is imported from the working folder).
"""
import fedjax_dg


def get_config():
  c = fedjax_dg.default_config()
  c.imports = ("my_plugin",)           # imported before the config is checked
  c.data.name = "shifted_blobs"
  c.data.test_domains, c.data.val_domains = (3,), (0,)
  c.model.name, c.model.hidden = "mlp", (16,)
  c.algorithm.name = "shrinkavg+damped"
  c.algorithm.shrinkavg = {"shrink": 1e-3}
  c.algorithm.damped = {"damping": 0.5}
  c.num_clients, c.num_rounds, c.eval_every, c.checkpoint_every = 6, 4, 2, 0
  c.client.momentum = 0.0
  c.workdir = "runs/plugin"
  return c
