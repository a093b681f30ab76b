"""The demo: FedAvg on the embedded rotated-digits dataset, 20 single-domain clients.

Domains are rotations 0..75 degrees; 0 degrees is the held-out validation domain and 75
the test domain, the other four train. lambda = 0 (complete heterogeneity) gives every
client one domain (5 clients per domain).
"""
import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.workdir = "runs/default"
  c.resume = False

  c.data = ml_collections.ConfigDict()
  c.data.name = "rotated_digits"
  c.data.image_size = 16
  c.data.angles = (0, 15, 30, 45, 60, 75)
  c.data.correlations = (0.95, 0.9, 0.8, 0.7, 0.5, 0.1)  # for data.name = "spurious"
  c.data.n_per_domain = 400                               # for data.name = "spurious"
  c.data.seed = 0
  c.data.test_domains = (5,)
  c.data.val_domains = (0,)
  c.data.in_val_fraction = 0.1
  c.data.in_test_fraction = 0.1
  c.data.leave_one_domain_out = False
  # On-disk datasets (configs/rotated_mnist.py, colored_mnist.py, pacs.py, ...; README "Datasets").
  c.data.path = ""               # root of the files; "" for the embedded datasets
  c.data.fallback_path = ""      # searched when data.path has no files (e.g. Debian's package location)
  c.data.prefix = ""             # IDX file-name prefix (EMNIST's "emnist-digits-")
  c.data.max_per_domain = 0      # 0 = every example; else a random subsample per domain
  c.data.color_flips = (0.1, 0.2, 0.9)  # colored_mnist: colour-flip probability per domain
  c.data.label_noise = 0.25
  c.data.downsample = 2
  c.data.tfds_name = ""          # data.name = "tfds": any TFDS image classification dataset
  c.data.tfds_data_dir = ""
  c.data.tfds_image_key = "image"
  c.data.tfds_label_key = "label"
  c.data.tfds_domain_key = ""    # a feature whose values are the domains; "" = one domain per split
  c.data.tfds_split = "train"
  c.data.tfds_domain_splits = ("train", "test")
  c.data.tfds_download = False
  c.data.root = ""               # image_folder / wilds: the unpacked dataset
  c.data.dataset = ""            # wilds: iwildcam | camelyon17 | celeba
  c.data.cache_dir = ""          # decoded-image cache; "" = <root>/.fedjax_dg_cache/<image_size>
  c.data.max_per_split = 0       # wilds: 0 = every row; else a random subsample per official split
  c.data.dtype = "uint8"         # image_folder / wilds pixels in memory (uint8, or float32 in [0, 1])
  c.data.num_workers = 0         # decoding threads; 0 = one per CPU
  c.data.augment = False         # DomainBed's training augmentation, inside the jitted local step
  c.data.augment_preset = "domainbed"  # domainbed | celeba | camelyon17
  c.data.select_metric = "accuracy"    # model selection metric (WILDS: macro_f1, worst_group_accuracy)
  # Text (configs/civilcomments.py, py150.py) and FEMNIST (configs/femnist.py); README "Text and FEMNIST".
  c.data.tokenizer = ""          # civilcomments: a local tokenizer.json (distilbert-base-uncased's)
  c.data.max_tokens = 300        # civilcomments: tokens per comment after truncation
  c.data.pad_id = 1              # py150: the pad id in the WILDS token files (CodeGPT's <pad>)
  c.data.civil_domain_fields = ("black", "y")  # civilcomments: the client domains (WILDS / the authors' grouper)
  c.data.femnist_val_writers = 1   # femnist: held-out validation writers (ids 0..V-1)
  c.data.femnist_test_writers = 1  # femnist: test writers (ids V..V+T-1)

  c.partition = ml_collections.ConfigDict()
  c.partition.method = "heterogeneous"  # heterogeneous | dirichlet | iid
  c.partition.lam = 0.0                 # Heterogeneous Partitioning's lambda
  c.partition.alpha = 0.5               # Dirichlet concentration
  c.num_clients = 20
  c.cohort_size = 0          # clients per round; 0 means use cohort_fraction
  c.cohort_fraction = 1.0

  c.model = ml_collections.ConfigDict()
  c.model.name = "cnn"       # cnn (DomainBed MNIST CNN) | mlp | femnist_cnn | resnet18 | resnet50 | distilbert | gpt2
  c.model.hidden = (200, 200)
  c.model.head_hidden = ()
  c.model.pretrained_path = ""      # resnet18/50: torchvision weights (.pth/.safetensors) or converted .npz
  c.model.freeze_bn = True          # resnet: batch-norm statistics frozen (DomainBed)
  c.model.freeze_featurizer = False
  c.model.hf_config = ""            # distilbert / gpt2: a local Hugging Face config.json ("" = base sizes)
  c.model.hf_weights = ""           # distilbert / gpt2: local model.safetensors or pytorch_model.bin

  c.algorithm = ml_collections.ConfigDict()
  c.algorithm.name = "fedavg"
  c.algorithm.prox_mu = 0.01  # FedProx
  c.algorithm.sam_rho = 0.05  # FedSAM perturbation radius
  c.algorithm.omg_kappa = 0.5  # FedOMG searching radius (seed 002); server.lr is eta_g
  c.algorithm.omg_lr = 25.0    # FedOMG solver: heavy-ball SGD on the simplex weights
  c.algorithm.omg_momentum = 0.5
  c.algorithm.omg_steps = 20
  c.algorithm.iir_gamma = 1e-2  # FedIIR penalty coefficient (seed 003 Table 3: RotatedMNIST 1e-2)
  c.algorithm.iir_ema = 0.95    # FedIIR EMA of the global head gradient
  c.algorithm.dim_lambda = 1e-2  # FedDIM regulariser weight (seed 004: 1e-4 .. 1e-1)
  c.algorithm.dim_momentum = 0.5  # FedDIM momentum m of the global insight matrices
  c.algorithm.ga_step = 0.2     # FedGA step size d (authors' code), decays linearly to 0
  # Centralised DG objectives inside clients (DomainBed defaults).
  c.algorithm.irm_lambda = 100.0
  c.algorithm.vrex_lambda = 10.0
  c.algorithm.dg_anneal_steps = 500  # IRM / VREx: penalty weight 1 for this many update steps
  c.algorithm.coral_gamma = 1.0
  c.algorithm.mmd_gamma = 1.0
  c.algorithm.mixup_alpha = 0.2     # Mixup's Beta(alpha, alpha) (DomainBed; seed 001 App. D)
  c.algorithm.fish_meta_lr = 0.5    # Fish meta step (DomainBed default; seed 001 App. D uses 0.1)
  c.algorithm.groupdro_eta = 0.01   # GroupDRO group-weight step (DomainBed default)
  c.algorithm.afl_step = 0.1        # AFL's gamma_beta (ours: App. D gives only learning rates)
  c.algorithm.sr_z_dim = 64         # FedSR representation size
  c.algorithm.sr_l2 = 0.01          # FedSR a_L2 (seed 001 App. D)
  c.algorithm.sr_cmi = 0.001        # FedSR a_CMI (seed 001 App. D)
  c.algorithm.sr_eval_samples = 0   # FedSR evaluation: 0 = the mean of z, else samples averaged
  c.algorithm.fdg_window = 0.25     # FedDG low-frequency window: half-width floor(r min(H, W) / 2)
  c.algorithm.fdg_bank_size = 16    # FedDG amplitude spectra per client in the server's bank
  c.algorithm.adg_lambda0 = 0.55    # FedADG weight of L_advf; lambda_1 = 1 - lambda_0 on CE (authors' code: 0.15)
  c.algorithm.adg_e0_epochs = 1     # FedADG E0: ERM epochs before the adversarial epochs (Bai et al.: 1)
  c.algorithm.adg_gen_lr = 7e-4     # FedADG generator step (seed 001 Table 7; authors 7e-3 with client lr 1e-2)
  c.algorithm.adg_disc_lr = 7e-4    # FedADG discriminator step
  c.algorithm.adg_noise_dim = 1024  # FedADG generator noise size (Bai et al.; authors 2048)
  c.algorithm.adg_hidden = 1024     # FedADG D width and projection size; G's hidden layer is 4x
  c.algorithm.gma_tau = 0.4  # FedGMA mask threshold (seed 001 App. D: 0.1 or 0.4); server.lr is eta_g
  # FedLOE (seed 000): stage 1 is this config's FedAvg for num_rounds syncs (set
  # client.optimizer='adam' and client.local_steps = T1 / syncs as in Table 5); then:
  c.algorithm.loe_tune_fraction = 0.1   # each client's tuning split
  c.algorithm.loe_stage2_rounds = 4     # |T2_sync|
  c.algorithm.loe_head_lr = 0.05        # stage-2 local head SGD
  c.algorithm.loe_head_epochs = 1       # E2
  c.algorithm.loe_penalty = "irm"       # irm | fish | rex | none
  c.algorithm.loe_lambda = 100.0
  c.algorithm.loe_solver_steps = 200
  c.algorithm.loe_solver_lr = 0.05

  c.client = ml_collections.ConfigDict()
  c.client.optimizer = "sgd"
  c.client.lr = 0.1
  c.client.momentum = 0.9
  c.client.weight_decay = 0.0
  c.client.batch_size = 32
  c.client.local_steps = 0   # > 0: fixed steps per round; 0: local_epochs passes
  c.client.local_epochs = 1

  c.server = ml_collections.ConfigDict()
  c.server.lr = 1.0          # eta_g
  c.server.momentum = 0.9    # FedAvgM
  c.server.b1 = 0.9          # FedAdam / FedYogi
  c.server.b2 = 0.99
  c.server.eps = 1e-3

  c.num_rounds = 80
  c.eval_every = 5
  c.checkpoint_every = 20
  c.eval_batch_size = 512
  c.quiet = False            # hide the progress bar

  c.engine = ml_collections.ConfigDict()
  c.engine.strategy = "auto"  # vmap | chunked | sequential | host_loop | auto
  c.engine.chunk_size = 10
  c.engine.host_store = False  # True: client inputs stay in host memory, minibatches fetched per step
  c.engine.unroll = -1        # local-step scan unroll: -1 auto (full on CPU), else the factor
  return c
