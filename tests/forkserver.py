"""Command lines run as forked children of one Python that has imported the package once.

`python -m MODULE ARGS` and `python SCRIPT ARGS` each pay the interpreter's start and the
package's imports (JAX, Flax, optax, absl: seconds). A `ForkServer` starts one Python with
the given environment and working folder, imports the modules it is given there (without
starting any JAX backend), and runs each command line in a child forked from it: the child
sets `sys.argv` and `sys.path[0]` as the interpreter does, points its file descriptors 0, 1
and 2 at /dev/null and two files, runs the module or script as `__main__`
(`runpy`), then finishes as an interpreter does (non-daemon threads joined, `atexit`
handlers run, the exit status of `SystemExit` or 1 with the traceback on stderr). Each
command gets its own process, exit status, stdout and stderr; what differs from a fresh
interpreter is only that the pre-imported modules are not imported again.

A process with a started JAX backend must not fork (JAX warns on stderr when one does: a
command line whose one-line stderr is checked then fails, so a pre-import that starts a
backend cannot pass unnoticed).
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile

_DRIVER = r"""
import atexit, json, os, runpy, sys, threading, traceback
proto = os.dup(1)  # the replies; what the imports or the server print goes to stderr
os.dup2(2, 1)


def reply(value):
  os.write(proto, (json.dumps(value) + "\n").encode())


for name in json.loads(sys.argv[1]):
  __import__(name)
main_path = list(sys.path)


def exit_code(e):
  if e.code is None:
    return 0
  if isinstance(e.code, int):
    return e.code
  print(e.code, file=sys.stderr)  # as the interpreter does for a non-integer code
  return 1


def child(req):
  os.close(proto)
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
    f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(f, fd)
    os.close(f)
  os.close(null)
  os.chdir(req["cwd"])
  target, args = req["target"], req["args"]
  sys.path[:] = main_path
  code = 0
  try:
    if req["module"]:
      sys.path[0] = os.getcwd()  # `python -m`: the working folder first
      sys.argv = [target] + args
      runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
      sys.path[0] = os.path.dirname(os.path.abspath(target))  # `python SCRIPT`: the script's folder
      sys.argv = [target] + args
      runpy.run_path(target, run_name="__main__")
  except SystemExit as e:
    code = exit_code(e)
  except BaseException:
    traceback.print_exc()
    code = 1
  try:
    threading._shutdown()  # pylint: disable=protected-access  # the interpreter joins non-daemon threads
  except Exception:  # pylint: disable=broad-except
    pass
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  return code


reply("READY")
for line in sys.stdin:
  req = json.loads(line)
  pid = os.fork()
  if pid == 0:
    code = 1
    try:
      code = child(req)
    finally:
      os._exit(code)
  reply(pid)
  _, status = os.waitpid(pid, 0)
  reply(os.waitstatus_to_exitcode(status))
"""


class ForkServer:
  """One Python forking a child per command line (see the module docstring).

  Args:
    env: the environment of the server and so of every child.
    cwd: the working folder of every child.
    imports: modules the server imports before it forks any child.
    prefix: a command that starts the server, e.g. bash setting a `ulimit` that the
      children inherit, then `exec "$@"`.

  Use as a context manager, or call `close`.
  """

  def __init__(self, env: dict, cwd: str, imports=(), prefix=()):
    self.cwd = cwd
    self._tmp = tempfile.TemporaryDirectory(prefix="forkserver_")
    self._log = open(os.path.join(self._tmp.name, "server.err"), "w+")
    self._proc = subprocess.Popen([*prefix, sys.executable, "-c", _DRIVER, json.dumps(list(imports))], cwd=cwd, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
    self._buf = b""
    ready = self._line(300)
    if ready != '"READY"':
      self._proc.kill()
      self._proc.wait()
      raise RuntimeError(f"the fork server did not start: {ready}{self._server_err()}")
    self._n = 0

  def _server_err(self) -> str:
    self._log.seek(0)
    return self._log.read()[-3000:]

  def _line(self, timeout: float):
    """The server's next line, or None after `timeout` seconds without one."""
    fd = self._proc.stdout.fileno()
    while b"\n" not in self._buf:
      if not select.select([fd], [], [], timeout)[0]:
        return None
      chunk = os.read(fd, 4096)
      if not chunk:
        raise RuntimeError(f"the fork server died: {self._server_err()}")
      self._buf += chunk
    line, self._buf = self._buf.split(b"\n", 1)
    return line.decode()

  def run(self, target: str, args, module: bool, timeout: float = 300) -> tuple[int, str, str]:
    """Runs one command line in a forked child.

    Args:
      target: the module (`module`: `python -m TARGET`) or the script's path (`python TARGET`).
      args: the command line's arguments after the target.
      module: whether `target` names a module.
      timeout: seconds the child may run.

    Returns:
      (exit status, stdout, stderr) of the child.

    Raises:
      subprocess.TimeoutExpired: the child ran past `timeout` (it is killed).
      RuntimeError: the server died.
    """
    self._n += 1
    out, err = (os.path.join(self._tmp.name, f"{self._n}.{s}") for s in ("out", "err"))
    req = {"target": target, "args": [str(a) for a in args], "module": module, "cwd": self.cwd,
           "stdout": out, "stderr": err}
    self._proc.stdin.write((json.dumps(req) + "\n").encode())
    self._proc.stdin.flush()
    pid = json.loads(self._line(60) or "null")
    line = self._line(timeout)
    if line is None:
      os.kill(pid, signal.SIGKILL)
      self._line(60)
      raise subprocess.TimeoutExpired([target, *args], timeout)
    texts = []
    for path in (out, err):
      with open(path, errors="replace") as f:
        texts.append(f.read())
      os.remove(path)
    return json.loads(line), texts[0], texts[1]

  def close(self):
    if self._proc.poll() is None:
      self._proc.stdin.close()
      try:
        self._proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self._proc.kill()
        self._proc.wait()
    self._log.close()
    self._tmp.cleanup()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
