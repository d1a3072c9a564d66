"""A fork server: one Python that has imported TensorFlow and tfde, forking
a fresh process per request, so that a test starting many short-lived
workers (the crash-safe saves kill one per trial) pays for the imports once.

The server forks before TensorFlow makes its context or any thread (its
import alone makes none), so each child starts as a fresh process would,
with its own environment (TF_CONFIG) set before TensorFlow reads it.

  with Zygote() as zygote:
    child = zygote.start("tests.workers.save_worker", ["--mode", "local", ...],
                         env={...}, output=path)   # in its own process group
    os.killpg(child, signal.SIGKILL)
"""

import json
import os
import signal
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SERVER = r"""
import json, os, runpy, signal, sys
import tensorflow  # noqa: F401  (the imports every child shares)
import tfde  # noqa: F401
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
print("ready", flush=True)
for line in sys.stdin:
  request = json.loads(line)
  # Made before the fork, so that it exists when the caller reads the pid.
  out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
  pid = os.fork()
  if pid == 0:
    os.setpgid(0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request["module"]] + request["args"]
    try:
      runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
      code = 0
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # the child's own traceback, then its exit
      import traceback
      traceback.print_exc()
      code = 1
    sys.stdout.flush()
    os._exit(code)
  # The child's own process group, from this side too: a caller killing
  # the group at once finds it, whichever of the two runs first.
  try:
    os.setpgid(pid, pid)
  except OSError:  # it has exited already
    pass
  os.close(out)
  print(pid, flush=True)
"""


class Zygote:
  """The fork server, as a context manager (its exit ends the server)."""

  def __init__(self):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    self._server = subprocess.Popen([sys.executable, "-c", _SERVER], env=env, cwd=REPO,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready = self._server.stdout.readline().strip()
    if ready != "ready":
      self.close()
      raise RuntimeError(f"the fork server did not start: {ready!r}")

  def start(self, module, args, env, output):
    """Forks a child running `python -m module args` with environment `env`,
    writing its stdout and stderr to `output` (made before this returns);
    returns its pid, which is also its process group."""
    request = {"module": module, "args": list(args), "env": dict(env), "output": output}
    self._server.stdin.write(json.dumps(request) + "\n")
    self._server.stdin.flush()
    return int(self._server.stdout.readline())

  def close(self):
    if self._server.poll() is None:
      self._server.stdin.close()
      try:
        self._server.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self._server.send_signal(signal.SIGKILL)
        self._server.wait()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
