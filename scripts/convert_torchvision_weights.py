"""Converts a torchvision ResNet checkpoint to Flax featurizer params, without torch.

  python scripts/convert_torchvision_weights.py resnet50-11ad3fa6.pth resnet50.npz [--arch resnet50]

IN is a `torch.save` state_dict (`.pth` / `.pt`, zip or legacy format) or `.safetensors`;
OUT is `.npz` or `.msgpack`, which `model.pretrained_path` accepts (so does IN itself:
converting ahead only saves the conversion at start-up). `--arch` checks every key and
shape against that architecture's featurizer before writing.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fedjax_dg.models import convert  # pylint: disable=g-import-not-at-top,wrong-import-position


def check_against(arch: str, out_path: str):
  """Raises unless `out_path` loads into `arch`'s freshly initialised featurizer."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from fedjax_dg.models import resnet  # pylint: disable=g-import-not-at-top
  module = resnet.featurizer(arch, ml_collections.ConfigDict())
  shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))["params"]
  resnet.load_pretrained({"featurizer": shapes}, out_path)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("src", help="torchvision checkpoint: .pth, .pt, .bin or .safetensors")
  parser.add_argument("dst", help=f"output, one of {convert.CONVERTED_SUFFIXES}")
  parser.add_argument("--arch", choices=("resnet18", "resnet50"), help="check keys and shapes against it")
  args = parser.parse_args(argv)
  state_dict = convert.read_state_dict(args.src)
  tree = convert.torchvision_to_flax(state_dict)
  convert.save_converted(tree, args.dst)
  if args.arch:
    check_against(args.arch, args.dst)
  kept = sum(convert.flax_path(k) is not None for k in state_dict)
  print(f"{args.src}: {kept} of {len(state_dict)} tensors converted (fc and num_batches_tracked dropped) "
        f"-> {args.dst}" + (f", matches {args.arch}" if args.arch else ""))


if __name__ == "__main__":
  main()
