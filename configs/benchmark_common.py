"""Settings the image benchmark configs share: how the images load, and two papers' protocols.

Each function takes the ConfigDict of `default.get_config()` and sets fields in place; the
dataset configs (pacs.py, vlcs.py, office_home.py, terra_incognita.py, iwildcam.py,
camelyon17.py, celeba.py) call them and set their own values (the papers' per-dataset table
entries) themselves.

Left at default.py's values, so set nowhere here:
- `data.root`: the unpacked dataset, `--config.data.root=/path/to/<dataset>`.
- `data.cache_dir`: "" is `<root>/.fedjax_dg_cache/<image_size>`.
- `data.max_per_domain` (image folders) / `data.max_per_split` (WILDS): > 0 keeps that many
  random images per domain / rows per official split (quick runs).
- `data.dtype`: "uint8" stored pixels; "float32" is [0, 1] at 4x the memory.
- `data.num_workers`: decoding threads; 0 is one per CPU (at most 32).
- `model.pretrained_path`: local ImageNet weights (torchvision layout); "" is random init.
- `model.freeze_bn`: True, as DomainBed freezes the BN statistics.
- `partition.method` "heterogeneous", `cohort_size` 0 with `cohort_fraction` 1 (every client
  every round), `client.weight_decay` 0, `client.local_steps` 0 (local epochs count).
"""


def image_folder_data(c):
  """DomainBed's image folders (`fedjax_dg.data.folders`), one folder per domain."""
  c.data.name = "image_folder"
  c.data.image_size = 224                # DomainBed: Resize((224, 224))
  c.data.augment = True                  # DomainBed's training augmentation (data/augment.py)


def wilds_data(c, dataset, *, select_metric, image_size, augment_preset="domainbed"):
  """A WILDS release folder (`fedjax_dg.data.wilds`) under WILDS's official split scheme."""
  c.data.name = "wilds"
  c.data.dataset = dataset
  c.data.select_metric = select_metric   # wilds.KEY_METRIC: selection on WILDS's key metric
  c.data.image_size = image_size
  c.data.augment = True
  c.data.augment_preset = augment_preset  # augment.PRESETS


def held_out_domains(c, test_domains, val_domains):
  """Bai et al. 2024, App. C.2: a test and a held-out validation domain; the rest train."""
  c.data.test_domains = test_domains
  c.data.val_domains = val_domains
  c.data.lodo_validation = "heldout_domain"  # Bai et al. (ICLR 2024): leave-one-domain-out holds the next domain out
  c.data.in_val_fraction = 0.1           # Bai et al. 2024, App. C.2: 10% + 10% of the training
  c.data.in_test_fraction = 0.1          # domains as in-domain validation / test


def benchmark_protocol(c, *, lr, batch_size, num_rounds, num_clients=100, checkpoint_every=10):
  """Bai et al. (ICLR 2024) App. C-D.

  ResNet-50; `num_clients` by Heterogeneous Partitioning, all clients every round; FedAvg
  (default.py's algorithm) of one local Adam epoch; early stopping on the held-out domain.
  The dataset config passes its client learning rate, batch and rounds (Table 7 where the
  paper gives them) and sets Table 7's per-method values.
  """
  c.num_clients = num_clients            # Bai et al. 2024, Sec. 4.3: 100
  c.partition.lam = 0.1                  # Bai et al. (ICLR 2024) report lambda = 1, 0.1 and 0
  c.model.name = "resnet50"              # Bai et al. 2024, App. D.1; DomainBed's default backbone
  c.client.optimizer = "adam"
  c.client.lr = lr
  c.client.batch_size = batch_size
  c.client.local_epochs = 1              # Bai et al. 2024, App. D
  _rounds(c, num_rounds, checkpoint_every)


def fediir_protocol(c, *, model, feature_projection, head_hidden, lr):
  """Guo et al. (ICML 2023) Sec. 5.1 and App. F.3 Table 3: FedIIR, one client per domain.

  The featurizer is the ResNet with its last fully connected layer replaced by a linear
  layer of `feature_projection` features (Sec. 5.1: 512 for ResNet-18 on VLCS and PACS,
  2048 for ResNet-50 on OfficeHome; `model.feature_projection`, models.ProjectedFeaturizer),
  and the two-layer head reads its output.

  The test domain (`--config.data.test_domains='(d,)'`, d in 0..3, averaged in the paper)
  is left out and the other three train, 10% of them the validation set the model is
  chosen on (no held-out domain). The dataset config sets Table 3's `algorithm.fediir.gamma`.
  """
  _one_client_per_domain(c)
  c.model.name = model                   # Guo et al. 2023, Sec. 5.1
  c.model.feature_projection = feature_projection  # Guo et al. 2023, Sec. 5.1: the extra linear layer
  c.model.head_hidden = head_hidden      # two FC layers, d -> d/2 -> K (docs/ALGORITHMS.md)
  c.algorithm.name = "fediir"
  c.algorithm.fediir.ema = 0.95             # Guo et al. 2023, Table 3 ("ALL")
  c.client.optimizer = "sgd"             # Guo et al. 2023, Sec. 5.1: SGD, momentum 0.9
  c.client.momentum = 0.9
  c.client.lr = lr                       # Guo et al. 2023, Table 3: eta_l
  c.client.batch_size = 32               # Guo et al. 2023, Table 3
  c.client.local_epochs = 1              # Guo et al. 2023, Sec. 5.1
  c.server.lr = 1.0                      # Guo et al. 2023, Table 3: eta_g
  _rounds(c, num_rounds=100, checkpoint_every=10)  # Guo et al. 2023, Table 3: T


def fedomg_protocol(c, *, algorithm="fedomg"):
  """Nguyen et al. 2025, App. D.6 (FDG scenarios) and its PACS/VLCS/OfficeHome hyperparameter table.

  One client per source domain, the test domain left out (`data.leave_one_domain_out=True`
  runs every domain once, validated in-domain); pretrained ResNet-18 (`model.pretrained_path`);
  100 rounds of 5 local epochs ("5 local training rounds") of SGD, step 1e-3, batch 16.
  FedOMG's server: `eta_g` = 0.5, i.e. `server.lr` = 0.5 / N (fedomg.py: the rule steps
  `server.lr N d`; docs/ALGORITHMS.md's reading of Sec. 5's global-lr study
  for PACS/VLCS; the table's "Global lr" entry could not be read from the paper), searching radius
  `kappa` = 0.5, solver step 25, solver momentum 0.5, 21 solver iterations (the table): the
  authors' `utils/fed_merge.py: OMG` loop `for i in range(21)` evaluates the objective 21 times
  and steps 20 times (`if i < 20`), i.e. `algorithm.omg.steps = 20` here.
  `fedsam+omg`: perturbation 0.6 (the table's "Perturbation control"). Not given by D.6: the
  head (linear here), SGD momentum (0 here), the validation split (10% here, as the paper
  D.6 follows: Guo et al. 2023).
  """
  _one_client_per_domain(c)
  c.model.name = "resnet18"              # Nguyen et al. 2025, D.6
  c.algorithm.name = algorithm
  c.client.optimizer = "sgd"             # Nguyen et al. 2025, D.6
  c.client.momentum = 0.0
  c.client.lr = 1e-3                     # Nguyen et al. 2025, D.6
  c.client.batch_size = 16               # Nguyen et al. 2025, D.6
  c.client.local_epochs = 5              # Nguyen et al. 2025, D.6: 5 local training rounds
  c.server.lr = 0.5 / c.num_clients      # eta_g = 0.5 (docs/ALGORITHMS.md) on the authors' d = FedAvg's update / N
  c.algorithm.omg.kappa = 0.5            # Nguyen et al. 2025, D.6 table: searching radius
  c.algorithm.omg.lr = 25.0              # Nguyen et al. 2025, D.6 table: training lr (of the solver)
  c.algorithm.omg.momentum = 0.5         # Nguyen et al. 2025, D.6 table: momentum
  c.algorithm.omg.steps = 20             # Nguyen et al. 2025, D.6 table's 21 iterations: the authors' range(21), 20 steps
  c.algorithm.fedsam.rho = 0.6           # Nguyen et al. 2025, D.6 table: FedSAM+OMG perturbation control
  _rounds(c, num_rounds=100, checkpoint_every=10)  # Nguyen et al. 2025, D.6


def fedloe_protocol(c):
  """The FedLOE paper's App. D.2-D.4, Table 5 (PACS / OfficeHome column).

  The test domain is left out and the other three train; 5% of the training data is the
  validation split and 5% the in-domain test split (D.3); each client holds one domain and
  keeps 10% of its rows as the tuning split (`algorithm.fedloe.tune_fraction`). ResNet-50
  featurizer and a linear head (D.3). Stage 1: 256 local Adam iterations over 8
  synchronisations (32 per round), batch 128; stage 2: 8 SGD iterations over 4
  synchronisations (2 per sync), step 0.05, weight decay 5e-4. The dataset config sets
  the stage-1 learning rate. The number of clients per domain is not stated (one here).
  Table 5 stops at a fixed iteration for PACS/OfficeHome; this keeps the run's per-round
  evaluations and selection within stage 2 (the summary says so).
  """
  _one_client_per_domain(c)
  c.data.in_val_fraction = 0.05          # the FedLOE paper's D.3: 5% validation
  c.data.in_test_fraction = 0.05         # the FedLOE paper's D.3: 5% in-domain test
  c.model.name = "resnet50"              # the FedLOE paper's D.3
  c.algorithm.name = "fedloe"
  c.algorithm.fedloe.tune_fraction = 0.1     # the FedLOE paper's D.3: 10% of each client's rows
  c.algorithm.fedloe.stage2_rounds = 4       # Table 5: stage 2 total communication
  c.algorithm.fedloe.head_steps = 2          # Table 5: 8 iterations / 4 syncs
  c.algorithm.fedloe.head_lr = 0.05          # Table 5
  c.algorithm.fedloe.head_weight_decay = 5e-4  # Table 5
  c.client.optimizer = "adam"            # Table 5: stage 1 ADAM
  c.client.batch_size = 128              # Table 5
  c.client.local_steps = 256 // 8        # Table 5: 256 iterations, 8 synchronisations
  _rounds(c, num_rounds=8, checkpoint_every=4)


def _one_client_per_domain(c):
  c.data.test_domains = (0,)             # domain 0; sweep d in 0..3
  c.data.val_domains = ()
  c.data.lodo_validation = "in_domain"   # data.leave_one_domain_out: every non-test domain trains
  c.data.in_val_fraction = 0.1           # Guo et al. (ICML 2023): 90% train / 10% validation
  c.data.in_test_fraction = 0.0
  c.num_clients = 3                      # one client per training domain
  c.partition.lam = 0.0                  # complete heterogeneity: a client holds one domain


def _rounds(c, num_rounds, checkpoint_every):
  c.num_rounds = num_rounds
  c.eval_every = 1                       # model selection picks a round
  c.checkpoint_every = checkpoint_every
