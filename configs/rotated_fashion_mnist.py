"""RotatedMNIST's recipe on Fashion-MNIST: the `rotated_mnist` config with other images.

None of the five source papers uses Fashion-MNIST; everything but the data follows the
RotatedMNIST settings of Guo et al. (ICML 2023), Table 3 (see configs/rotated_mnist.py). The ten
clothing classes are harder
than digits, so expect lower accuracies than Guo et al.'s RotatedMNIST numbers.

The images come from `data.path` if it holds the four IDX files, else from Debian's
`dataset-fashion-mnist` package (`/usr/share/datasets/fashion-mnist`, gzipped IDX files):
`sudo apt-get install dataset-fashion-mnist` or `scripts/install_fashion_mnist.sh`.
A quick run: `--config.data.max_per_domain=2000 --config.num_rounds=10`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rotated_mnist  # noqa: E402

DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"  # = fedjax_dg.data.idx.DEBIAN_FASHION_MNIST


def get_config():
  c = rotated_mnist.get_config()
  c.workdir = "runs/rotated_fashion_mnist"
  c.data.path = "data/fashion-mnist"
  c.data.fallback_path = DEBIAN_FASHION_MNIST
  return c
