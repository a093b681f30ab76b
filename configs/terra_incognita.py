"""TerraIncognita from DomainBed's image folders (`fedjax_dg.data.folders`).

`--config configs/terra_incognita.py --config.data.root=/data/terra_incognita` (the folder
DomainBed's download script makes: `location_100/ location_38/ location_43/ location_46/`,
domain ids 0..3 in that sorted order; 10 classes). No seed paper reports TerraIncognita:
this applies seed 001's protocol (App. C-D: 100 clients by Heterogeneous Partitioning,
one held-out validation domain, 10% + 10% of the training domains as in-domain validation
/ test, FedAvg of one local Adam epoch, all clients every round, early stopping on the
held-out domain) with DomainBed's ERM defaults for the rest (`hparams_registry.py`:
ResNet-50, Adam step 5e-5, batch 32, no weight decay) and PACS's 80 rounds. The test
domain location_100 and validation domain location_38 are our choice; DomainBed
reports every domain as the test domain once (`--config.data.leave_one_domain_out=True`).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import default  # noqa: E402


def get_config():
  c = default.get_config()
  c.workdir = "runs/terra_incognita"
  c.data.name = "image_folder"
  c.data.root = ""                       # --config.data.root=/path/to/terra_incognita
  c.data.image_size = 224                # DomainBed: Resize((224, 224))
  c.data.cache_dir = ""                  # "": <root>/.fedjax_dg_cache/<image_size>
  c.data.max_per_domain = 0              # > 0: that many random images per domain (quick runs)
  c.data.dtype = "uint8"                 # stored pixels; "float32" is [0, 1] at 4x the memory
  c.data.num_workers = 0                 # decoding threads; 0: one per CPU (at most 32)
  c.data.augment = True                  # DomainBed's training augmentation (data/augment.py)
  c.data.augment_preset = "domainbed"
  c.data.test_domains = (0,)             # location_100
  c.data.val_domains = (1,)              # location_38; location_43 and location_46 train
  c.data.in_val_fraction = 0.1           # seed 001 App. C.2
  c.data.in_test_fraction = 0.1
  c.data.leave_one_domain_out = False

  c.partition.method = "heterogeneous"
  c.partition.lam = 0.1                  # seed 001 reports lambda = 1, 0.1 and 0
  c.num_clients = 100                    # seed 001 Sec. 4.3
  c.cohort_size = 0
  c.cohort_fraction = 1.0

  c.model.name = "resnet50"              # DomainBed's default backbone; seed 001 App. D.1
  c.model.head_hidden = ()
  c.model.pretrained_path = ""           # local ImageNet weights (torchvision layout); "": random init
  c.model.freeze_bn = True               # DomainBed freezes the BN statistics

  c.algorithm.name = "fedavg"
  c.client.optimizer = "adam"
  c.client.lr = 5e-5                     # DomainBed hparams_registry default
  c.client.batch_size = 32               # DomainBed hparams_registry default
  c.client.weight_decay = 0.0
  c.client.local_steps = 0
  c.client.local_epochs = 1              # seed 001 App. D
  c.server.lr = 1.0

  c.num_rounds = 80                      # as PACS in seed 001 Table 7
  c.eval_every = 1                       # model selection picks a round
  c.checkpoint_every = 10
  return c
