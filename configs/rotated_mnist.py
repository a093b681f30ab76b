"""RotatedMNIST (DomainBed recipe, `fedjax_dg.data.idx.load_rotated`) as FedIIR ran it.

Guo et al. 2023, Sec. 5.1 and App. F.3 Table 3 (RotatedMNIST rows): the DomainBed MNIST ConvNet
(four 3x3 convs, average pooling) with a single linear head; one client per training
domain (the "small number of clients" scenario); 100 rounds, global step 1, one local SGD
epoch with step 1e-2 and batch 64; FedIIR gamma 1e-2, EMA 0.95; 90% / 10% of the
training domains for training / validation, the model chosen on that validation set.
The default run is FedAvg, Guo et al.'s baseline under the same settings; FedIIR is
`--config.algorithm.name=fediir`. Guo et al. (ICML 2023) averages over each domain as the test domain:
run `--config.data.test_domains='(d,)'` for d in 0..5 (all other domains train, so no
held-out validation domain). Table 2's large-client scenario: `--config.num_clients=50
--config.cohort_size=5`. FedLOE with the schedule of the FedLOE paper's Table 5 (batch 128, Adam,
T1 = 256 local steps over 8 syncs, then 4 stage-2 syncs of SGD 0.05 on the heads, IRM
lambda 100): `--config.algorithm.name=fedloe --config.client.optimizer=adam
--config.client.lr=1e-3 --config.client.batch_size=128 --config.client.local_steps=32
--config.num_rounds=8` (Table 5's 5e-5 is for a pretrained ResNet-50; see configs/fedloe.py).

`data.path` is a directory with MNIST's four IDX files (`train-images-idx3-ubyte[.gz]`,
...): `--config.data.path=/path/to/mnist`. For a quick run: `--config.data.max_per_domain=2000`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import default  # noqa: E402


def get_config():
  c = default.get_config()
  c.workdir = "runs/rotated_mnist"
  c.data.name = "rotated_mnist"
  c.data.path = "data/mnist"
  c.data.fallback_path = ""
  c.data.prefix = ""                     # file-name prefix, e.g. "emnist-digits-" for EMNIST
  c.data.num_classes = 10                # labels in the IDX files lie in [0, num_classes) (EMNIST letters: 27)
  c.data.angles = (0, 15, 30, 45, 60, 75)
  c.data.max_per_domain = 0              # 0: all 70000 / 6 images per domain
  c.data.test_domains = (5,)             # 75 degrees
  c.data.val_domains = ()
  c.data.in_val_fraction = 0.1           # Guo et al. (ICML 2023): 90% train / 10% validation
  c.data.in_test_fraction = 0.0
  c.data.leave_one_domain_out = False

  c.partition.method = "heterogeneous"
  c.partition.lam = 0.0                  # one domain per client (Guo et al. 2023, App. F.1)
  c.num_clients = 5                      # one client per training domain
  c.cohort_size = 0
  c.cohort_fraction = 1.0

  c.model.name = "cnn"
  c.model.head_hidden = ()               # Guo et al. (ICML 2023): a single linear classifier on RotatedMNIST

  c.algorithm.name = "fedavg"
  c.algorithm.fediir.gamma = 1e-2           # Guo et al. 2023, Table 3
  c.algorithm.fediir.ema = 0.95             # Guo et al. 2023, Table 3 ("ALL")

  c.client.optimizer = "sgd"
  c.client.lr = 1e-2                     # Guo et al. 2023, Table 3: eta_l
  c.client.momentum = 0.9                # the FedIIR reference code (docs/ALGORITHMS.md)
  c.client.batch_size = 64               # Guo et al. 2023, Table 3
  c.client.local_steps = 0
  c.client.local_epochs = 1              # Guo et al. 2023, Sec. 5.1
  c.server.lr = 1.0                      # Guo et al. 2023, Table 3: eta_g

  c.num_rounds = 100                     # Guo et al. 2023, Table 3: T
  c.eval_every = 5
  c.checkpoint_every = 20
  return c
