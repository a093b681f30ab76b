"""Papers are named by their authors, title and venue wherever a user reads: the package's
docstrings and messages, the README, the documentation, the configs, the examples, the
scripts, the benchmarks and the tests never call a paper by a file number such as "seed 001"."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMBERED = re.compile(r"seeds?[\s_-]*00\d", re.I)
READ_BY_USERS = ("README.md", "CITATION.cff", "CHANGELOG.md", "mkdocs.yml", "fedjax_dg", "docs", "configs", "examples",
                 "experiments", "scripts", "benchmarks", "tests")
THIS_FILE = os.path.relpath(os.path.abspath(__file__), ROOT)  # its examples of what the check finds
SUFFIXES = (".md", ".py", ".sh", ".yml", ".yaml", ".cff", ".txt", ".tex")
def user_files(root: str = ROOT) -> list[str]:
  """Paths, relative to `root`, of the text files in `READ_BY_USERS` (folders walked)."""
  out = []
  for entry in READ_BY_USERS:
    path = os.path.join(root, entry)
    if os.path.isfile(path):
      out.append(entry)
      continue
    for d, dirs, files in os.walk(path):
      # `runs` folders hold the records a sweep's jobs write (JSON, logs), not text written for a reader.
      dirs[:] = sorted(x for x in dirs if not x.startswith((".", "__")) and x != "runs")
      out += [os.path.relpath(os.path.join(d, f), root) for f in sorted(files) if f.endswith(SUFFIXES)
              and os.path.relpath(os.path.join(d, f), root) != THIS_FILE]
  return out


def numbered_mentions(text: str) -> list[str]:
  """Each line of `text` that calls a paper by number, as `line <n>: <text>`."""
  return [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}" for m in NUMBERED.finditer(text)]


@pytest.mark.parametrize("rel", user_files())
def test_no_paper_is_called_by_number(rel):
  with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
    found = numbered_mentions(f.read())
  assert not found, f"{rel} names a paper by number: {found}"


@pytest.mark.parametrize("text, hits", [
    ("as in seed 001's Table 7", 1), ("Seed 003 Sec. 5.1", 1), ("seeds 000, 002", 1),
    ("Read seed\n   000's text", 1), ("#fediir-seed-003", 1), ("seed 0 and seed 1", 0),
    ("Bai, Bagchi and Inouye, ICLR 2024", 0), ("each seed-0 run", 0)])
def test_the_check_finds_numbered_names(text, hits):
  assert len(numbered_mentions(text)) == hits


def test_the_check_reads_every_area():
  files = user_files()
  for entry in READ_BY_USERS:
    assert any(f == entry or f.startswith(entry + os.sep) for f in files), entry
