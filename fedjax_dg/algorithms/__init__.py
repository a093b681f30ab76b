"""Algorithm registry: one line per method. Each method lives in its own file."""
from __future__ import annotations

from fedjax_dg.algorithms.base import Algorithm, ClientOutput, Stacked, make_optimizer, make_schedule
from fedjax_dg.algorithms.fedavg import fedavg, minibatch_sgd
from fedjax_dg.algorithms.fedprox import fedprox
from fedjax_dg.algorithms.scaffold import scaffold

# name -> server optimizer used by the FedAvg family (None: see build_algorithm).
_FEDOPT = {"fedavg": "sgd", "erm": "sgd", "fedavgm": "momentum", "fedadam": "adam", "fedyogi": "yogi"}
ALGORITHMS = ("erm", "minibatch_sgd", "fedavg", "fedavgm", "fedadam", "fedyogi", "fedprox", "scaffold")


def server_optimizer(kind: str, server_config):
  import ml_collections
  c = ml_collections.ConfigDict(server_config.to_dict())
  if kind == "momentum":
    c.optimizer = "sgd"
  elif kind == "sgd":
    c.optimizer, c.momentum = "sgd", 0.0
  else:
    c.optimizer = kind
  return make_optimizer(c)


def build_algorithm(config, model, sched, num_clients: int, cohort_size: int) -> Algorithm:
  """The algorithm `config.algorithm.name` names, built from the config's fields."""
  name = config.algorithm.name
  client_opt = make_optimizer(config.client)
  if name in _FEDOPT:
    return fedavg(model, sched, client_opt, server_optimizer(_FEDOPT[name], config.server), name=name)
  if name == "fedprox":
    return fedprox(model, sched, client_opt, server_optimizer("sgd", config.server), config.algorithm.prox_mu)
  if name == "scaffold":
    return scaffold(model, sched, config.client.lr, config.server.lr, cohort_size, num_clients)
  if name == "minibatch_sgd":
    return minibatch_sgd(model, config.client.batch_size, client_opt)
  raise ValueError(f"algorithm.name: unknown algorithm {name!r}; choose one of {list(ALGORITHMS)}")
