"""Flower's side of the peer comparison: its simulation engine (Ray actors, one CPU per
client as Flower's default `client_resources`), `flwr.simulation.start_simulation` with the
built-in `FedAvg` strategy (clients weighted by examples, server step 1) and a
`NumPyClient` training the torch model of benchmarks/torch_peer.py (which matches
fedjax_dg.models layer for layer) with SGD. Each actor process memory-maps the data set
and reads its client's rows. See common.py for the workloads and the protocol.

A client iterates its examples in order in batches of `batch` for `epochs` passes, or for
`steps` steps (the pfl side's loop). Round times are read where the strategy hands the
round's work out (`configure_fit`) and where it has aggregated it (`aggregate_fit`)."""
from __future__ import annotations

import os
import sys
import time

_T_START = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import common  # noqa: E402


def _client_fn_factory(w: dict, xp: str, yp: str, threads: int):
  """`client_fn(context)` for Flower: builds a NumPyClient over client `partition-id`'s rows."""
  def client_fn(context):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from flwr.client import NumPyClient
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.dirname(HERE))
    import common as c
    import torch_peer
    torch.set_num_threads(threads)
    x, y = c.load_data(xp, yp)
    n = w["examples"]
    cid = int(context.node_config["partition-id"])
    rows = slice(cid * n, (cid + 1) * n)
    xs = torch.from_numpy(np.ascontiguousarray(np.moveaxis(x[rows], -1, 1)))
    ys = torch.from_numpy(np.asarray(y[rows]))
    net = torch_peer.build(w["model"], c.NUM_CLASSES)

    class Client(NumPyClient):
      def fit(self, parameters, config):
        with torch.no_grad():
          for p, v in zip(net.parameters(), parameters):
            p.copy_(torch.from_numpy(v))
        opt = torch.optim.SGD(net.parameters(), lr=w["lr"])
        net.train()
        steps, done = c.local_steps(w), 0
        while done < steps:
          for s in range(0, n, w["batch"]):
            if done == steps:
              break
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(xs[s:s + w["batch"]]), ys[s:s + w["batch"]]).backward()
            opt.step()
            done += 1
        return [p.detach().numpy().copy() for p in net.parameters()], n, {}

    return Client().to_client()
  return client_fn


def main(argv=None):
  args = common.side_args(argv)
  common.emit("start", t=_T_START)
  w = args.w
  import numpy as np
  import torch
  import torch.nn.functional as F
  import flwr
  from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
  from flwr.server import ServerConfig
  from flwr.server.strategy import FedAvg
  from flwr.simulation import start_simulation
  import torch_peer
  common.emit("imported", t=time.time())
  torch.manual_seed(0)
  torch.set_num_threads(args.threads)
  net = torch_peer.build(w["model"], common.NUM_CLASSES)
  init = [p.detach().numpy().copy() for p in net.parameters()]
  final = {}

  class TimedFedAvg(FedAvg):
    def configure_fit(self, server_round, parameters, client_manager):
      final["t0"] = time.time()
      return super().configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round, results, failures):
      params, metrics = super().aggregate_fit(server_round, results, failures)
      if failures:
        common.fail(f"flower: {len(failures)} client(s) failed in round {server_round}: {failures[0]!r}")
      final["params"] = params
      common.emit("round", round=server_round - 1, t0=final["t0"], t1=time.time())
      return params, metrics

  C = w["clients"]
  strategy = TimedFedAvg(fraction_fit=w["cohort"] / C, min_fit_clients=w["cohort"], min_available_clients=C,
                         fraction_evaluate=0.0, min_evaluate_clients=0,
                         initial_parameters=ndarrays_to_parameters(init))
  common.emit("built", t=time.time())
  start_simulation(client_fn=_client_fn_factory(w, args.x, args.y, 1), num_clients=C,
                   config=ServerConfig(num_rounds=w["rounds"]), strategy=strategy,
                   client_resources={"num_cpus": 1, "num_gpus": 0.0},
                   ray_init_args={"include_dashboard": False, "ignore_reinit_error": True,
                                  "num_cpus": os.cpu_count(), "log_to_driver": False})
  with torch.no_grad():
    for p, v in zip(net.parameters(), parameters_to_ndarrays(final["params"])):
      p.copy_(torch.from_numpy(v))
    net.eval()
    x, y = common.load_data(args.x, args.y)
    k = min(common.EVAL_EXAMPLES, len(y))
    xe = torch.from_numpy(np.ascontiguousarray(np.moveaxis(x[:k], -1, 1)))
    loss = float(F.cross_entropy(net(xe), torch.from_numpy(np.asarray(y[:k]))))
  common.emit("done", t=time.time(), loss=loss, torch=torch.__version__, flwr=flwr.__version__)


if __name__ == "__main__":
  main()
