"""VLCS from DomainBed's image folders (`fedjax_dg.data.folders`) as FedIIR ran it.

`--config configs/vlcs.py --config.data.root=/data/VLCS` (the folder holding
`Caltech101/ LabelMe/ SUN09/ VOC2007/`, domain ids 0..3; 5 classes). Bai et al. (ICLR 2024) does not
evaluate VLCS; this is Guo et al. (ICML 2023) Sec. 5.1 and App. F.3 Table 3 (VLCS rows):
ResNet-18 whose last fully connected layer is replaced by a 512-d linear layer (Sec. 5.1;
`model.feature_projection = 512`), then a two-layer head (512 -> 256 -> 5); one client
per training domain; the test domain (`--config.data.test_domains='(d,)'`, d in 0..3,
averaged in the paper) is left out and the other three train, 10% of them the validation
set the model is chosen on; SGD momentum 0.9, step 1e-3, batch 32, one local epoch, global
step 1, 100 rounds; FedIIR gamma 5e-3, EMA 0.95. FedAvg under the same settings:
`--config.algorithm.name=fedavg`; the 50 clients of Guo et al. 2023, Table 2, as many sampled per
round as there are training domains: `--config.num_clients=50 --config.cohort_size=3`.
Images: DomainBed's 224 x 224 resize and augmentation.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import default  # noqa: E402
import benchmark_common  # noqa: E402


def get_config():
  c = default.get_config()
  c.workdir = "runs/vlcs_fediir"
  benchmark_common.image_folder_data(c)
  benchmark_common.fediir_protocol(      # test domain 0: Caltech101
      c, model="resnet18", feature_projection=512,  # Guo et al. 2023, Sec. 5.1
      head_hidden=(256,), lr=1e-3)       # Guo et al. 2023, Table 3 (VLCS)
  c.algorithm.fediir.gamma = 5e-3           # Guo et al. 2023, Table 3 (VLCS)
  return c
