"""TerraIncognita from DomainBed's image folders (`fedjax_dg.data.folders`).

`--config configs/terra_incognita.py --config.data.root=/data/terra_incognita` (the folder
DomainBed's download script makes: `location_100/ location_38/ location_43/ location_46/`,
domain ids 0..3 in that sorted order; 10 classes). None of the five source papers reports TerraIncognita:
this applies Bai et al.'s protocol (App. C-D: 100 clients by Heterogeneous Partitioning,
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
import benchmark_common  # noqa: E402


def get_config():
  c = default.get_config()
  c.workdir = "runs/terra_incognita"
  benchmark_common.image_folder_data(c)
  # location_100 tests, location_38 is held out; location_43 and location_46 train.
  benchmark_common.held_out_domains(c, test_domains=(0,), val_domains=(1,))
  benchmark_common.benchmark_protocol(
      c, lr=5e-5, batch_size=32,         # DomainBed hparams_registry defaults
      num_rounds=80)                     # as PACS in Bai et al. 2024, Table 7
  return c
