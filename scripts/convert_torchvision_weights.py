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


def convert_file(src: str, dst: str, arch: str | None = None) -> str:
  """Converts `src` to `dst` (checked against `arch` if given); returns the summary line."""
  if not dst.endswith(convert.CONVERTED_SUFFIXES):
    raise ValueError(f"{dst}: converted weights are written as one of {convert.CONVERTED_SUFFIXES}")
  state_dict = convert.read_state_dict(src)
  try:
    tree = convert.torchvision_to_flax(state_dict)
  except ValueError as e:  # a key or a shape that is not a torchvision ResNet's
    raise ValueError(f"{src}: {e}") from None
  convert.save_converted(tree, dst)
  if arch:
    check_against(arch, dst)
  kept = sum(convert.flax_path(k) is not None for k in state_dict)
  return (f"{src}: {kept} of {len(state_dict)} tensors converted (fc and num_batches_tracked dropped) "
          f"-> {dst}" + (f", matches {arch}" if arch else ""))


def main(argv=None) -> int:
  """0 on success; 2 (and one line on stderr naming the file) for a file that cannot be
  read, converted or written, as for a usage error."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("src", help="torchvision checkpoint: .pth, .pt, .bin or .safetensors")
  parser.add_argument("dst", help=f"output, one of {convert.CONVERTED_SUFFIXES}")
  parser.add_argument("--arch", choices=("resnet18", "resnet50"), help="check keys and shapes against it")
  args = parser.parse_args(argv)
  try:
    line = convert_file(args.src, args.dst, args.arch)
  except (ValueError, OSError) as e:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  print(line)
  return 0


if __name__ == "__main__":
  sys.exit(main())
