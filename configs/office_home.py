"""OfficeHome from DomainBed's image folders (`fedjax_dg.data.folders`) as FedIIR ran it.

`--config configs/office_home.py --config.data.root=/data/office_home` (the folder holding
`Art/ Clipart/ Product/ Real World/`, domain ids 0..3; 65 classes). Bai et al. (ICLR 2024) does not
evaluate OfficeHome; this is Guo et al. (ICML 2023) Sec. 5.1 and App. F.3 Table 3
(OfficeHome rows): ResNet-50 whose last fully connected layer is replaced by a 2048-d
linear layer (Sec. 5.1; `model.feature_projection = 2048`), then a two-layer head
(2048 -> 1024 -> 65); one client per
training domain; the test domain (`--config.data.test_domains='(d,)'`, d in 0..3, averaged
in the paper) is left out and the other three train, 10% of them the validation set the
model is chosen on; SGD momentum 0.9, step 1e-3, batch 32, one local epoch, global step 1,
100 rounds; FedIIR gamma 5e-4, EMA 0.95. FedAvg under the same settings:
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
  c.workdir = "runs/office_home_fediir"
  benchmark_common.image_folder_data(c)
  benchmark_common.fediir_protocol(      # test domain 0: Art
      c, model="resnet50", feature_projection=2048,  # Guo et al. 2023, Sec. 5.1
      head_hidden=(1024,), lr=1e-3)      # Guo et al. 2023, Table 3 (OfficeHome)
  c.algorithm.fediir.gamma = 5e-4           # Guo et al. 2023, Table 3 (OfficeHome)
  return c
