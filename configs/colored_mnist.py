"""ColoredMNIST (DomainBed recipe, `fedjax_dg.data.idx.load_colored`) under Bai et al.'s
federated benchmark protocol.

Data (DomainBed `ColoredMNIST`): three environments with colour-flip probabilities 0.1,
0.2, 0.9 ('+90%', '+80%', '-90%'), 25% label noise, 2 x 14 x 14 images; '-90%', where
the colour's correlation with the label reverses, is the test domain as in DomainBed.
Protocol (Bai et al. 2024, App. C.2, D.2-D.3): 10% / 10% of each training domain as in-domain
validation / test; C = 100 clients by Heterogeneous Partitioning (lambda = 0: every client
sees one domain; the paper sweeps lambda in {1, 0.1, 0}, `--config.partition.lam`); the
round is chosen on validation accuracy. With only two training domains a held-out
validation domain would leave one domain to train on, so selection uses the in-domain
validation split (DomainBed's training-domain validation).

ColoredMNIST is in none of the five source papers' tables, so optimisation follows DomainBed's
hparams_registry for its small-image datasets (Adam, lr 1e-3, batch 64, no weight decay,
the MNIST ConvNet) and the budget of Bai et al. 2024, Table 7, for FEMNIST, its MNIST-like dataset
(40 communication rounds, one local epoch each).

`data.path` is a directory with MNIST's four IDX files: `--config.data.path=/path/to/mnist`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import default  # noqa: E402


def get_config():
  c = default.get_config()
  c.workdir = "runs/colored_mnist"
  c.data.name = "colored_mnist"
  c.data.path = "data/mnist"
  c.data.fallback_path = ""
  c.data.prefix = ""
  c.data.num_classes = 10                # labels in the IDX files lie in [0, num_classes) (EMNIST letters: 27)
  c.data.color_flips = (0.1, 0.2, 0.9)   # DomainBed ColoredMNIST environments
  c.data.label_noise = 0.25              # DomainBed / IRM
  c.data.downsample = 2                  # 14x14 (IRM; early DomainBed); 1 keeps 28x28 (DomainBed now)
  c.data.max_per_domain = 0
  c.data.test_domains = (2,)             # '-90%'
  c.data.val_domains = ()
  c.data.in_val_fraction = 0.1           # Bai et al. 2024, App. C.2
  c.data.in_test_fraction = 0.1
  c.data.leave_one_domain_out = False

  c.partition.method = "heterogeneous"
  c.partition.lam = 0.0                  # Bai et al. (ICLR 2024): lambda in {1, 0.1, 0}
  c.num_clients = 100                    # Bai et al. 2024, Table 6: C = 100
  c.cohort_size = 0
  c.cohort_fraction = 1.0

  c.model.name = "cnn"
  c.model.head_hidden = ()

  c.algorithm.name = "fedavg"
  c.client.optimizer = "adam"            # Bai et al.'s ERM baseline trains locally with Adam
  c.client.lr = 1e-3                     # DomainBed hparams_registry, SMALL_IMAGES
  c.client.batch_size = 64               # DomainBed hparams_registry, SMALL_IMAGES
  c.client.weight_decay = 0.0
  c.client.local_steps = 0
  c.client.local_epochs = 1
  c.server.lr = 1.0

  c.num_rounds = 40                      # Bai et al. 2024, Table 7: FEMNIST total communication
  c.eval_every = 2
  c.checkpoint_every = 10
  return c
