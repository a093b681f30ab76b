"""The library's default configuration: every field a config may hold, with its default.

`default_config()` is the demo (FedAvg on the embedded rotated-digits dataset, 20
single-domain clients): domains are rotations 0..75 degrees; 0 degrees is the held-out
validation domain and 75 the test domain, the other four train. lambda = 0 (complete
heterogeneity) gives every client one domain (5 clients per domain).

It is also the schema: a config may set only the fields it has (`config.check_keys`), at
any depth, `algorithm.<method>.<field>` included.
"""
import ml_collections

# The engine strategies a config may name (fedjax_dg/engine/round.py runs them).
STRATEGIES = ("vmap", "chunked", "sequential", "host_loop")
# How the runs of a batch share their compiled round (fedjax_dg/batch.py; docs/batched_runs.md).
RUN_AXES = ("map", "vmap")


def default_config() -> ml_collections.ConfigDict:
  """A fresh copy of the default config (the registry's methods at the time of the call)."""
  from fedjax_dg import algorithms
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.workdir = "runs/default"
  c.resume = False
  # A batch of runs in one compiled program (docs/batched_runs.md): one entry per run, each a
  # string of comma-separated overrides of this config, e.g. ("seed=1", "seed=2,client.lr=0.05");
  # run i writes an ordinary run directory <workdir>/run_<i>. Empty: one run in <workdir>.
  c.runs = ()
  # Plugins imported before the config is checked (fedjax_dg/plugins.py): module names or .py
  # files that register methods, server rules or datasets, e.g. ("mymethods", "plugins/data.py").
  c.imports = ()

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
  # How each leave-one-domain-out fold validates (data/splits.py LODO_VALIDATION): "heldout_domain"
  # holds out the next domain (Bai et al. 2024); "in_domain" trains on every non-test domain and selects
  # on the in-domain validation split (the FedLOE, FedOMG, FedIIR and FedDIM papers).
  c.data.lodo_validation = "heldout_domain"
  # Bai et al. 2024's R_DG (Sec. 4.1): this fraction of each test domain leaves the test split (which
  # keeps the rest); with _include it joins training as a training domain, else it is set aside.
  c.data.test_domain_train_fraction = 0.0
  c.data.test_domain_train_include = True
  # On-disk datasets (configs/rotated_mnist.py, colored_mnist.py, pacs.py, ...; docs/datasets/index.md).
  c.data.loader = ""             # a dataset added with fedjax_dg.register_dataset: "module:function" (recorded by the runner)
  c.data.path = ""               # root of the files; "" for the embedded datasets
  c.data.fallback_path = ""      # searched when data.path has no files (e.g. Debian's package location)
  c.data.prefix = ""             # IDX file-name prefix (EMNIST's "emnist-digits-")
  c.data.num_classes = 10        # IDX datasets: the label classes kept (0..num_classes-1)
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
  # Text (configs/civilcomments.py, py150.py) and FEMNIST (configs/femnist.py); docs/datasets/index.md.
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
  c.model.feature_projection = 0    # > 0: a linear layer of that width ends the featurizer (Guo et al. 2023 Sec. 5.1)
  c.model.pretrained_path = ""      # resnet18/50: torchvision weights (.pth/.safetensors) or converted .npz
  c.model.freeze_bn = True          # resnet: batch-norm statistics frozen (DomainBed)
  c.model.freeze_featurizer = False
  c.model.hf_config = ""            # distilbert / gpt2: a local Hugging Face config.json ("" = base sizes)
  c.model.hf_weights = ""           # distilbert / gpt2: local model.safetensors or pytorch_model.bin
  c.model.dtype = "float32"         # computation dtype: float32 | bfloat16 (params and optimizer state stay float32)
  c.model.conv_impl = "xla"         # convolutions: xla (lax.conv) | gemm (im2col matrix products, models/conv.py)

  # The method (`fedavg`, or a method and a server rule: `fediir+omg`, `irm+omg`) and one block
  # of hyperparameters per method and rule, with the papers' defaults, generated from the
  # method specs (docs/methods/index.md; e.g. --config.algorithm.fedprox.mu=0.1).
  c.algorithm = algorithms.default_hparams()
  c.algorithm.name = "fedavg"
  # FedLOE (the FedLOE paper): stage 1 is this config's FedAvg for num_rounds syncs (set
  # client.optimizer='adam' and client.local_steps = T1 / syncs as in Table 5).

  c.client = ml_collections.ConfigDict()
  c.client.optimizer = "sgd"
  c.client.lr = 0.1
  c.client.momentum = 0.9
  c.client.weight_decay = 0.0
  c.client.b1 = 0.9          # client.optimizer = adam / yogi
  c.client.b2 = 0.999
  c.client.eps = 1e-8
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
  c.tensorboard = False      # also write TensorBoard event files to <workdir>/tensorboard/ (tensorboard extra)
  c.tracking = ""            # "mlflow" or "mlflow:URI": log the finished run to MLflow (tracking extra)
  c.activity = True          # the clients record how much the method's own term acted (docs/activity.md);
                             # False skips those records (one backward pass a round), the updates unchanged

  c.engine = ml_collections.ConfigDict()
  c.engine.strategy = "auto"  # vmap | chunked | sequential | host_loop | auto
  c.engine.chunk_size = 10
  c.engine.host_store = False  # True: client inputs stay in host memory, minibatches fetched per step
  c.engine.unroll = -1        # local-step scan unroll: -1 the measured default (engine.measured), else the factor
  c.engine.dropout = 0.0      # probability that a sampled client does not report in a round
  c.engine.straggler_fraction = 0.0  # share of the cohort that takes only part of its local steps
  c.engine.buckets = False    # epoch mode: run each client at its own steps (results equal the masked run)
  # A batch of runs (config.runs, the sweep launcher): "map" loops over the runs inside the one
  # compiled program (each run the single run's arithmetic, bit for bit on CPU), "vmap" adds a
  # run axis to every array (fills a GPU), "auto": "map" on CPU, "vmap" on GPU and TPU.
  c.engine.run_axis = "auto"
  # True: persistent client states (SCAFFOLD's controls, ...) in host memory, kept only for
  # clients once sampled and checkpointed sparsely (engine/host_state.py; docs/multi_process.md)
  c.engine.host_client_states = False

  # Several processes under jax.distributed (fedjax_dg/distributed.py; docs/multi_process.md).
  c.distributed = ml_collections.ConfigDict()
  c.distributed.initialize = "off"        # off | auto (Slurm & co. detected) | local (the fields below)
  c.distributed.coordinator_address = ""  # local: process 0's HOST:PORT
  c.distributed.num_processes = 1         # local: how many processes take part
  c.distributed.process_id = 0            # local: this process's id in [0, num_processes)
  c.distributed.timeout_s = 120           # the processes must meet within this many seconds
  c.distributed.heartbeat_s = 60          # a process silent this long counts as dead; the others stop
  return c
