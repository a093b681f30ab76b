"""Regenerates the documentation's tables that come from the method specs (between
`<!-- BEGIN name -->` and `<!-- END name -->` markers in docs/methods/index.md):
`python scripts/readme_tables.py`."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from fedjax_dg import algorithms  # noqa: E402

PAGES = (os.path.join("docs", "methods", "index.md"),)  # the pages holding generated tables


def pages_list() -> str:
  """Links to every method's page, by benchmark group."""
  groups = {}
  for name, spec in algorithms.METHODS.items():
    groups.setdefault(spec.group, []).append(f"[`{name}`]({name}.md)")
  return "\n".join(f"- **{g}**: " + ", ".join(links) for g, links in groups.items())


TABLES = {"methods": algorithms.methods_table, "hparams": algorithms.hparams_table,
          "communication": algorithms.communication_table, "pages": pages_list}


def render(text: str) -> str:
  for name, fn in TABLES.items():
    # an empty block ("BEGIN\nEND") is filled too
    text = re.sub(rf"(<!-- BEGIN {name} -->\n)(?:.*?\n)?(<!-- END {name} -->)",
                  lambda m: m.group(1) + fn() + "\n" + m.group(2), text, flags=re.S)
  return text


if __name__ == "__main__":
  for rel in PAGES:
    path = os.path.join(ROOT, rel)
    with open(path) as f:
      text = f.read()
    with open(path, "w") as f:
      f.write(render(text))
