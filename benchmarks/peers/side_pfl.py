"""pfl-research's side of the peer comparison (its PyTorch backend, one process): the
workload as pfl's own FedAvg benchmarks write it (`FederatedDataset` over user ids,
`FederatedAveraging`, `SimulatedBackend`, `PyTorchModel` with local SGD and a central SGD
of step 1, users averaged uniformly: every user holds the same number of examples, so this
is FedAvg's weighting by examples). The torch models are benchmarks/torch_peer.py's, which
match fedjax_dg.models layer for layer. See common.py for the workloads and the protocol.

pfl iterates a user's examples in order (no shuffle) in batches of `local_batch_size`;
workload B's 5 local steps are `local_num_steps=5`."""
from __future__ import annotations

import os
import sys
import time

_T_START = time.time()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import common  # noqa: E402


def main(argv=None):
  args = common.side_args(argv)
  common.emit("start", t=_T_START)
  w = args.w
  import numpy as np
  import torch
  import torch.nn.functional as F
  from pfl.aggregate.simulate import SimulatedBackend
  from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
  from pfl.callback.base import TrainingProcessCallback
  from pfl.data.dataset import Dataset
  from pfl.data.federated_dataset import FederatedDataset
  from pfl.data.sampling import get_user_sampler
  from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
  from pfl.metrics import Metrics, Weighted
  from pfl.model.pytorch import PyTorchModel
  import torch_peer
  common.emit("imported", t=time.time())
  torch.set_num_threads(args.threads)
  torch.manual_seed(0)
  np.random.seed(0)

  C, n = w["clients"], w["examples"]
  x, y = common.load_data(args.x, args.y)

  class Net(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.net = torch_peer.build(w["model"], common.NUM_CLASSES)

    def forward(self, xb):
      return self.net(xb)

    def loss(self, xb, yb, eval=False):  # noqa: A002  (pfl's signature)
      self.train(not eval)
      return F.cross_entropy(self(xb), yb.long())  # pfl hands every array over as float32

    @torch.no_grad()
    def metrics(self, xb, yb, eval=False):  # noqa: A002
      self.eval()
      loss = F.cross_entropy(self(xb), yb.long(), reduction="sum")
      return {"loss": Weighted(float(loss), len(yb))}

  def user_data(uid):  # NCHW float32 and int64 labels, as the torch models read them
    rows = slice(uid * n, (uid + 1) * n)
    return Dataset((np.ascontiguousarray(np.moveaxis(x[rows], -1, 1)), np.asarray(y[rows])), user_id=uid)

  net = Net()
  model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                       central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
  train_data = FederatedDataset(user_data, get_user_sampler("random", list(range(C))))
  backend = SimulatedBackend(training_data=train_data, val_data=train_data)
  steps = dict(local_num_epochs=None, local_num_steps=w["steps"]) if w["steps"] else dict(local_num_epochs=w["epochs"])
  train_params = NNTrainHyperParams(local_learning_rate=w["lr"], local_batch_size=w["batch"], **steps)
  params = NNAlgorithmParams(central_num_iterations=w["rounds"], evaluation_frequency=10 ** 9,
                             train_cohort_size=w["cohort"], val_cohort_size=0)

  class Clock(TrainingProcessCallback):
    def __init__(self):
      self.t0 = None

    def on_train_begin(self, *, model):
      self.t0 = time.time()
      return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
      t1 = time.time()
      common.emit("round", round=central_iteration, t0=self.t0, t1=t1)
      self.t0 = t1
      return False, Metrics()

  common.emit("built", t=time.time())
  FederatedAveraging().run(algorithm_params=params, backend=backend, model=model, model_train_params=train_params,
                           model_eval_params=NNEvalHyperParams(local_batch_size=None), callbacks=[Clock()],
                           send_metrics_to_platform=False)

  k = min(common.EVAL_EXAMPLES, len(y))
  with torch.no_grad():
    net.eval()
    xe = torch.from_numpy(np.ascontiguousarray(np.moveaxis(x[:k], -1, 1)))
    loss = float(F.cross_entropy(net(xe), torch.from_numpy(np.asarray(y[:k]))))
  import pfl
  common.emit("done", t=time.time(), loss=loss, torch=torch.__version__, pfl=getattr(pfl, "__version__", "?"))


if __name__ == "__main__":
  main()
