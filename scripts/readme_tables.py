"""Regenerates the README's tables that come from the method specs (between
`<!-- BEGIN name -->` and `<!-- END name -->` markers): `python scripts/readme_tables.py`."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fedjax_dg import algorithms  # noqa: E402

TABLES = {"methods": algorithms.methods_table, "hparams": algorithms.hparams_table,
          "communication": algorithms.communication_table}


def render(text: str) -> str:
  for name, fn in TABLES.items():
    # an empty block ("BEGIN\nEND") is filled too
    text = re.sub(rf"(<!-- BEGIN {name} -->\n)(?:.*?\n)?(<!-- END {name} -->)",
                  lambda m: m.group(1) + fn() + "\n" + m.group(2), text, flags=re.S)
  return text


if __name__ == "__main__":
  path = os.path.join(ROOT, "README.md")
  with open(path) as f:
    text = f.read()
  with open(path, "w") as f:
    f.write(render(text))
