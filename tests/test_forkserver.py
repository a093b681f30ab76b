"""tests/forkserver.py: a command line run in a forked child gives what a fresh interpreter
gives (exit status, stdout, stderr, argv, sys.path[0], exit handlers, threads joined)."""
import os
import subprocess
import sys
import textwrap

import pytest

import forkserver

SCRIPT = textwrap.dedent("""
    import atexit, json, os, sys, threading, time
    what = sys.argv[1]
    atexit.register(lambda: print("atexit ran", flush=True))
    print(json.dumps({"argv": [os.path.basename(sys.argv[0])] + sys.argv[1:], "path0": sys.path[0],
                      "cwd": os.getcwd(), "main": __name__}))
    print("to stderr", file=sys.stderr)
    if what == "thread":  # a non-daemon thread: the interpreter waits for it before exiting
      threading.Thread(target=lambda: (time.sleep(0.2), print("thread done", flush=True))).start()
    elif what == "exit3":
      sys.exit(3)
    elif what == "exit_text":
      sys.exit("a message")
    elif what == "raise":
      raise ValueError("boom")
    elif what == "sleep":
      time.sleep(60)
    """)


@pytest.fixture
def tree(tmp_path):
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "__init__.py").write_text("")
  (tmp_path / "pkg" / "__main__.py").write_text(SCRIPT)
  (tmp_path / "tool.py").write_text(SCRIPT)
  (tmp_path / "work").mkdir()
  return tmp_path


def fresh(tree, target, args, module):
  argv = [sys.executable, "-m", target, *args] if module else [sys.executable, target, *args]
  env = dict(os.environ, PYTHONPATH=str(tree))
  r = subprocess.run(argv, cwd=tree / "work", env=env, capture_output=True, text=True, timeout=60)
  return r.returncode, r.stdout, r.stderr


@pytest.mark.parametrize("module", [True, False], ids=["module", "script"])
def test_a_forked_command_line_gives_what_a_fresh_interpreter_gives(tree, module):
  target = "pkg" if module else str(tree / "tool.py")
  with forkserver.ForkServer(dict(os.environ, PYTHONPATH=str(tree)), str(tree / "work"), ("json",)) as server:
    for what in ("ok", "thread", "exit3", "exit_text", "raise"):
      got, want = server.run(target, [what, "x y"], module), fresh(tree, target, [what, "x y"], module)
      assert got[:2] == want[:2], what
      if what == "raise":  # the traceback names the server's frames above runpy's: compare its ends
        assert got[2].startswith("to stderr\nTraceback") and want[2].startswith("to stderr\nTraceback")
        assert got[2].splitlines()[-1] == want[2].splitlines()[-1] == "ValueError: boom"
      else:
        assert got[2] == want[2], what
    assert '"main": "__main__"' in got[1] and "atexit ran" in got[1]


def test_a_command_line_past_its_timeout_is_killed(tree):
  with forkserver.ForkServer(dict(os.environ, PYTHONPATH=str(tree)), str(tree / "work")) as server:
    with pytest.raises(subprocess.TimeoutExpired):
      server.run(str(tree / "tool.py"), ["sleep"], False, timeout=0.5)
    assert server.run(str(tree / "tool.py"), ["exit3"], False)[0] == 3  # the server goes on
