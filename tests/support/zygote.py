"""A fork server: one Python that has imported TensorFlow and tfde, forking
a fresh process per request, so that tests starting many short-lived
workers (every multi-worker test starts two or four; the crash-safe saves
kill one per trial) pay for the imports (about 7 s of CPU on a CI-like
host) once.

The server forks before TensorFlow makes its context or any thread (its
import alone makes none), so each child starts as a fresh process would,
with its own environment (TF_CONFIG, Horovod's rank) and working directory
set before TensorFlow reads them. Requests come over a Unix socket with
the requester's stdout and stderr, which the child writes to directly.
Per request a small watcher forks the child, reports its pid and then its
exit status (the code, or minus the signal that ended it, as `subprocess`
reports them), and kills the child's process group when the requester
goes away first, so no child outlives its requester.

Two requesters:

* the test process, through `popen`, which reads like `subprocess.Popen`
  (`pid`, also the child's process group; `returncode`, `poll`, `wait`,
  `communicate`), and starts afresh what the server cannot fork as asked
  (another Python, an environment that changes what `import tfde` reads);

      child = shared().popen([sys.executable, "-m", "tests.workers.save_worker",
                              "--mode", "local"], env=env, cwd=REPO)
      output, _ = child.communicate(timeout=60)   # stdout and stderr together

* a launcher's command (`horovodrun ... python -m tests.support.zygote
  MODULE ARGS`), where this module's `__main__` stands in for the rank:
  it asks the server named by $TFDE_ZYGOTE_SOCKET to fork MODULE with its
  own environment, passes signals on, and ends as the child ended.
"""

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOCKET_VARIABLE = "TFDE_ZYGOTE_SOCKET"

# What TensorFlow or tfde read while they are imported: a child whose
# environment differs here from the server's starts afresh instead.
IMPORT_TIME_VARIABLES = ("PYTHONPATH", "TFDE_OPS_LIBRARY", "TF_ENABLE_ONEDNN_OPTS",
                         "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD")

_SERVER = r"""
import json, os, random, runpy, select, signal, socket, sys
import numpy
import tensorflow  # noqa: F401  (the imports every child shares)
import tfde.lookup  # noqa: F401  (`import tfde` alone loads nothing yet)
if os.environ.get("TFDE_ZYGOTE_HOROVOD") == "1":
  import horovod.tensorflow  # noqa: F401
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # watchers are reaped by the kernel
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(64)
print("ready", flush=True)


def run_child(request, fds):
  os.setpgid(0, 0)
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  os.dup2(fds[0], 1)
  os.dup2(fds[1], 2)
  for fd in {null, *fds}:  # none left open for the child's own children
    os.close(fd)
  os.environ.clear()
  os.environ.update(request["env"])
  os.chdir(request["cwd"])
  sys.argv = [request["module"]] + request["args"]
  # Random streams of its own, as a fresh process draws them (the hash
  # seed stays the server's: hence two servers, see Zygote).
  random.seed()
  numpy.random.seed()
  try:
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    code = 0
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      code = e.code or 0
    else:  # sys.exit("message"), which Python writes to stderr
      print(e.code, file=sys.stderr)
      code = 1
  except KeyboardInterrupt:  # ended by SIGINT, as a fresh process would be
    import traceback
    traceback.print_exc()
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    code = 1
  except BaseException:  # the child's own traceback, then its exit
    import traceback
    traceback.print_exc()
    code = 1
  # Out through the server's frames to an interpreter's own ending (its
  # atexit hooks, TensorFlow's shutdown), not os._exit: a worker gone at
  # once after its last collective can leave a peer's last read of it
  # unanswered ("Socket closed").
  sys.exit(code)


def watch(connection):
  message, fds, _, _ = socket.recv_fds(connection, 1 << 16, 2)
  while not message.endswith(b"\n"):
    part = connection.recv(1 << 16)
    if not part:
      os._exit(1)
    message += part
  request = json.loads(message)
  child = os.fork()
  if child == 0:
    connection.close()
    run_child(request, fds)
  # The child's own process group, from this side too: a requester
  # killing the group at once finds it, whichever of the two runs first.
  try:
    os.setpgid(child, child)
  except OSError:  # it has exited already
    pass
  for fd in fds:
    os.close(fd)
  connection.sendall(f"{child}\n".encode())
  while True:
    done, status = os.waitpid(child, os.WNOHANG)
    if done:
      code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
      try:
        connection.sendall(f"{code}\n".encode())
      except OSError:
        pass
      os._exit(0)
    readable, _, _ = select.select([connection], [], [], 0.02)
    if readable and not connection.recv(64):
      # The requester is gone: so is its child, as a child of its own.
      try:
        os.killpg(child, signal.SIGKILL)
      except ProcessLookupError:
        pass


while True:
  connection, _ = listener.accept()
  if os.fork() == 0:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    listener.close()
    watch(connection)
  connection.close()
"""


def _request(path, module, args, env, cwd, stdout, stderr):
  """Asks the server at `path` for a child; (its pid, the connection its
  exit status will come on)."""
  connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  connection.connect(path)
  message = json.dumps({"module": module, "args": list(args), "env": dict(env),
                        "cwd": str(cwd)}).encode() + b"\n"
  socket.send_fds(connection, [message], [stdout, stderr])
  return int(_read_line(connection)), connection


def _read_line(connection):
  line = b""
  while not line.endswith(b"\n"):
    part = connection.recv(64)
    if not part:
      raise ConnectionError("the fork server closed the connection")
    line += part
  return line.decode().strip()


class ForkedProcess:
  """A child of the fork server, read as a `subprocess.Popen` with stdout
  (and stderr) piped as text."""

  def __init__(self, pid, connection, output):
    self.pid = pid
    self.returncode = None
    self._connection = connection
    self._output = output
    self._status = b""  # what has come of the status line

  def poll(self):
    """Its exit status once its watcher has sent it, else None (1 where
    the watcher ended without one), never raising, as Popen.poll."""
    while self.returncode is None:
      self._connection.setblocking(False)
      try:
        part = self._connection.recv(64)
      except BlockingIOError:
        return None
      finally:
        self._connection.setblocking(True)
      if not part:
        self.returncode = int(self._status) if self._status.strip() else 1
      else:
        self._status += part
        if self._status.endswith(b"\n"):
          self.returncode = int(self._status)
    return self.returncode

  def wait(self, timeout=None):
    deadline = None if timeout is None else time.monotonic() + timeout
    while self.poll() is None:
      if deadline is not None and time.monotonic() > deadline:
        raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout)
      time.sleep(0.02)
    return self.returncode

  def communicate(self, timeout=None):
    self.wait(timeout)
    self.close()
    with open(self._output, errors="replace") as f:
      return f.read(), None

  def kill(self):
    try:
      os.killpg(self.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass

  def close(self):
    """Closes the connection to its watcher: a child still running is
    killed then."""
    self._connection.close()


class Zygote:
  """The fork server, as a context manager (its exit ends the server).

  `python`: the interpreter it runs in (this one by default); `horovod`:
  it imports Horovod's TensorFlow module too (for Horovod's ranks)."""

  def __init__(self, python=sys.executable, env=None, horovod=False):
    self.python = python
    self.env = dict(env or os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    if horovod:
      self.env["TFDE_ZYGOTE_HOROVOD"] = "1"
    self._files = tempfile.mkdtemp(prefix="tfde-zygote-")
    self.socket_path = os.path.join(self._files, "socket")
    self._server = subprocess.Popen([python, "-c", _SERVER, self.socket_path], env=self.env,
                                    cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    text=True, start_new_session=True)
    self._lock = threading.Lock()
    self._count = 0
    ready = self._server.stdout.readline().strip()
    if ready != "ready":
      self.close()
      raise RuntimeError(f"the fork server did not start: {ready!r}")

  def serves(self, command, env):
    """Whether the server can fork `command` (`python -m MODULE ...` of
    its Python) as a fresh process with `env` would start."""
    return (len(command) >= 3 and command[0] == self.python and command[1] == "-m" and
            all(env.get(k) == self.env.get(k) for k in IMPORT_TIME_VARIABLES))

  def start(self, module, args, env, output=None, cwd=REPO, error_output=None):
    """Forks a child running `python -m module args` with environment `env`
    in `cwd`, writing its stdout and stderr to `output` (a file of the
    server's when None), made before this returns, its stderr to
    `error_output` instead where given; a `ForkedProcess`."""
    with self._lock:
      self._count += 1
      output = output or os.path.join(self._files, f"{self._count}.out")
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    error_fd = fd if error_output is None else os.open(
        error_output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
      pid, connection = _request(self.socket_path, module, args, env, cwd, fd, error_fd)
    finally:
      os.close(fd)
      if error_fd != fd:
        os.close(error_fd)
    return ForkedProcess(pid, connection, output)

  def run(self, command, env, cwd=REPO, timeout=None):
    """`subprocess.run(command, env=env, cwd=cwd, capture_output=True,
    text=True, timeout=timeout)`, forked here where `serves` says so: a
    `subprocess.CompletedProcess` with stdout and stderr apart."""
    if not self.serves(command, env):
      return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=timeout)
    with self._lock:
      self._count += 1
      stem = os.path.join(self._files, str(self._count))
    child = self.start(command[2], command[3:], env, stem + ".out", cwd, stem + ".err")
    try:
      child.wait(timeout)
    except subprocess.TimeoutExpired:
      child.kill()
      child.wait()
      raise
    finally:
      child.close()
    with open(stem + ".out", errors="replace") as out, open(stem + ".err", errors="replace") as err:
      stdout, stderr = out.read(), err.read()
    os.remove(stem + ".out")
    os.remove(stem + ".err")
    return subprocess.CompletedProcess(command, child.returncode, stdout, stderr)

  def popen(self, command, env, cwd=REPO):
    """`command` started with `env` in `cwd`, stdout and stderr together:
    forked here where `serves` says so, else a `subprocess.Popen` (text,
    in a session of its own)."""
    if not self.serves(command, env):
      return subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return self.start(command[2], command[3:], env, cwd=cwd)

  def close(self):
    if self._server.poll() is None:
      self._server.kill()
      self._server.wait()
    shutil.rmtree(self._files, ignore_errors=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


_shared = {}


# Servers per environment. A forked child keeps its server's string hash
# seed (Python draws it at start-up only), so the workers of one job fork
# from different servers (`for_worker`): an order that depends on hashing
# differs between them as between fresh processes, and a disagreement it
# causes fails as it would on a cluster.
SLOTS = 2


def shared(python=sys.executable, env=None, horovod=False, slot=0):
  """This process's fork server number `slot` for `python` (with `env` at
  its start, this process's by default), started on first use and ended
  at exit."""
  key = (python, horovod, slot)
  if key not in _shared:
    _shared[key] = Zygote(python, env, horovod=horovod)
    atexit.register(_shared[key].close)
  return _shared[key]


def for_worker(index, python=sys.executable, env=None, horovod=False):
  """The fork server for worker `index` of a job (see SLOTS)."""
  return shared(python, env, horovod, index % SLOTS)


def socket_paths(python, env, horovod=False):
  """$TFDE_ZYGOTE_SOCKET for a launcher's ranks: every slot's server, in
  slot order (the stand-in takes rank % SLOTS)."""
  return os.pathsep.join(shared(python, env, horovod, slot).socket_path
                         for slot in range(SLOTS))


def _main(argv):
  """`python -m tests.support.zygote MODULE ARGS`: MODULE forked by the
  server at $TFDE_ZYGOTE_SOCKET with this process's environment, working
  directory, stdout and stderr; this process passes SIGTERM, SIGINT and
  SIGHUP on to it and ends as it did."""
  paths = os.environ.pop(SOCKET_VARIABLE).split(os.pathsep)
  path = paths[int(os.environ.get("HOROVOD_RANK", "0")) % len(paths)]
  pid, connection = _request(path, argv[0], argv[1:], os.environ, os.getcwd(),
                             sys.stdout.fileno(), sys.stderr.fileno())

  def pass_on(number, _):
    try:
      os.killpg(pid, number)
    except ProcessLookupError:  # it has ended: its status is on the way
      pass

  for name in ("SIGTERM", "SIGINT", "SIGHUP"):
    signal.signal(getattr(signal, name), pass_on)
  try:
    code = int(_read_line(connection))
  except ConnectionError:
    code = 1
  if code < 0:
    if -code not in (signal.SIGKILL, signal.SIGSTOP):  # whose handlers cannot change
      signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
  sys.exit(code)


if __name__ == "__main__":
  _main(sys.argv[1:])
