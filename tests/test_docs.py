"""The documentation: the site builds with warnings as errors, every code block of the
tutorials runs as written, the generated pages are current, and no document carries dates,
issue numbers or development notes."""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUTORIALS = ("docs/getting-started.md", "docs/library.md", "README.md")
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(path: str, langs=("python", "bash")):
  """`[(language, code)]` of the fenced blocks of `path` in those languages (```text blocks
  show output or commands that CI runs itself: make demo, make test, pip install)."""
  text = open(os.path.join(ROOT, path)).read()
  return [(lang, code) for lang, code in FENCE.findall(text) if lang in langs]


def _env():
  bindir = os.path.dirname(sys.executable)
  return {**os.environ, "PYTHONPATH": ROOT, "PATH": bindir + os.pathsep + os.environ["PATH"],
          "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "")}


def _workspace(tmp_path):
  """A working directory where `configs/` and `examples/` resolve as in the repository."""
  for name in ("configs", "examples"):
    os.symlink(os.path.join(ROOT, name), tmp_path / name)
  return tmp_path


def run_blocks(path: str, tmp_path, keep=lambda code: True):
  """Runs the page's python blocks in one interpreter (they build on each other) and each
  bash block in bash, in order, failing with the block's output."""
  cwd = _workspace(tmp_path)
  script = []
  for lang, code in blocks(path):
    if not keep(code):
      continue
    if lang == "python":
      script.append(code)
    else:
      script.append(f"import subprocess\nsubprocess.run(['bash', '-euo', 'pipefail', '-c', {code!r}], check=True)\n")
  assert script, f"{path}: no code blocks"
  prog = cwd / "blocks.py"
  prog.write_text("\n".join(script))
  r = subprocess.run([sys.executable, str(prog)], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, f"{path}: a code block failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
  return r


@pytest.mark.parametrize("path", TUTORIALS[:2])
def test_tutorial_blocks_run(path, tmp_path):
  run_blocks(path, tmp_path)


def test_readme_blocks_run(tmp_path):
  """The README's library example and CLI example (the sweep runs in the slow suite)."""
  r = run_blocks("README.md", tmp_path, keep=lambda code: "fedjax_dg.bench" not in code)
  assert (tmp_path / "runs" / "first" / "summary.json").exists() and (tmp_path / "runs" / "library").exists()
  assert '"splits"' in r.stdout  # the evaluate command's JSON


def test_coming_from_port_runs_and_matches_the_library(tmp_path):
  """The worked port of DomainBed's CORAL: equal to the library's `coral` objective on padded
  multi-domain batches (the block asserts it), with a penalty that is not zero, and trained."""
  r = run_blocks("docs/coming_from.md", tmp_path)
  penalties = [float(p) for p in re.findall(r"penalty ([0-9.e-]+)", r.stdout)]
  assert len(penalties) == 4 and all(p > 0 for p in penalties), r.stdout
  assert "coral_port test accuracy" in r.stdout and (tmp_path / "runs" / "coral_port" / "summary.json").exists()


@pytest.mark.slow
def test_readme_sweep_draws_figures(tmp_path):
  run_blocks("README.md", tmp_path, keep=lambda code: "fedjax_dg.bench" in code)
  figures = tmp_path / "runs" / "tiny" / "report" / "figures"
  assert (figures / "fig4_curves_C4.png").exists()
  assert len([f for f in os.listdir(figures / "runs") if f.endswith(".png")]) == 4  # 2 methods x 2 lambdas, seed 0


def test_site_builds_with_warnings_as_errors(tmp_path):
  pytest.importorskip("mkdocs")
  pytest.importorskip("mkdocstrings")
  # Not -q: quiet mode drops warnings below errors, and strict mode then counts none of them.
  r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                     cwd=ROOT, env={**_env(), "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  page = open(tmp_path / "site" / "methods" / "fedprox" / "index.html").read()
  assert "unsquared" in page  # the module docstring (the deviation it states) is on the method's page


def test_generated_pages_are_current():
  r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "docs_pages.py"), "--check"], env=_env(),
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stdout + r.stderr


def test_every_page_is_in_the_navigation():
  import yaml
  nav = open(os.path.join(ROOT, "mkdocs.yml")).read()
  for d, _, files in os.walk(os.path.join(ROOT, "docs")):
    for f in files:
      rel = os.path.relpath(os.path.join(d, f), os.path.join(ROOT, "docs"))
      if f.endswith(".md"):
        assert f" {rel}\n" in nav, f"docs/{rel} is not in mkdocs.yml's nav"
  assert yaml is not None


DEV_NOTES = re.compile(r"\bissue \d+|\bissues? #\d+|\bsession\b|\b20\d\d-\d\d-\d\d\b|\b2026\b", re.I)


def _documents():
  yield "README.md", open(os.path.join(ROOT, "README.md")).read()
  for d, _, files in os.walk(os.path.join(ROOT, "docs")):
    for f in files:
      if f.endswith(".md"):
        yield os.path.relpath(os.path.join(d, f), ROOT), open(os.path.join(d, f)).read()


def test_no_dates_issue_numbers_or_session_notes_in_documents():
  bad = [f"{path}: {m.group(0)!r}" for path, text in _documents() for m in DEV_NOTES.finditer(text)]
  assert not bad, bad


def test_documents_link_only_to_files_that_exist():
  link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
  missing = []
  for path, text in _documents():
    for target in link.findall(text):
      if "://" in target or target.startswith("mailto:"):
        continue
      if not os.path.exists(os.path.normpath(os.path.join(ROOT, os.path.dirname(path), target))):
        missing.append(f"{path} -> {target}")
  assert not missing, missing
