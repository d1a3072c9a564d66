"""The test environments and op libraries, built once per machine.

Each environment is a virtualenv kept outside the checkout, under
$TFDE_CACHE (default ~/.cache/tfde), in a folder named by a key: the hash
of the Python version and of everything its recipe installs. A checkout
links `.venv`, `.venv-hvd`, ... to it, so that a fresh clone on a machine
that built it before reuses it, and a changed recipe builds a new one
beside the old. The same holds for the Horovod wheels (keyed by Horovod,
TensorFlow and Python) and for the op library of each environment (keyed
by that environment, the kernel sources, setup.py and the compiler).

Writes are atomic: an environment counts only once its stamp is written,
last (a half-built one is removed and built again); a wheel or library is
written beside and renamed. A lock per entry lets two checkouts build at
once without clashing.

  python3 tools/envs.py env main        # make the environment, link .venv
  python3 tools/envs.py ops main        # its op library, at build/ops/main
  python3 tools/envs.py ops main --inplace   # also at tfde/ops/_tfde_ops.so
  python3 tools/envs.py list            # what the cache holds
"""

import argparse
import contextlib
import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("TFDE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tfde")
HOROVOD = "horovod==0.28.1"
# Horovod 0.28.1 with Gloo only; CMake 4 refuses its old minimum policy.
HOROVOD_BUILD_ENV = {
    "CMAKE_POLICY_VERSION_MINIMUM": "3.5", "HOROVOD_WITH_TENSORFLOW": "1",
    "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITHOUT_MPI": "1",
    "HOROVOD_WITHOUT_PYTORCH": "1", "HOROVOD_WITHOUT_MXNET": "1"}
TEST_TOOLS = ["pytest", "pytest-timeout", "setuptools", "wheel"]

# name: (link in the checkout, pip installs in order, Horovod built against it)
# Each install is a list of pip arguments; "--no-deps" ones take a package
# whose declared requirements tensorflow-cpu already meets under another name.
RECIPES = {
    "main": (".venv", [
        ["tensorflow-cpu==2.21.0", "numpy", "absl-py", "pyyaml", "matplotlib",
         "pytest-xdist", "ruff==0.17.5"] + TEST_TOOLS,
        # keras-rs's configs are accepted by tfde (tests/unit/test_tpu.py).
        ["--no-deps", "keras-rs==0.4.0"],
        # tf_keras for tfde.dtensor; `import keras` stays Keras 3.
        ["--no-deps", "tf_keras==2.21.0"]], False),
    # The newest TensorFlow Horovod 0.28.1's CPU build supports.
    "hvd": (".venv-hvd", [
        ["tensorflow-cpu==2.18.1", "numpy", "absl-py", "pyyaml", "cmake"] + TEST_TOOLS],
        True),
    # The lowest supported TensorFlow, tf.estimator's last release and Keras 2.
    "tf215": (".venv-tf215", [
        ["tensorflow-cpu==2.15.1", "tensorflow-estimator==2.15.0", "numpy", "absl-py",
         "pyyaml", "cmake"] + TEST_TOOLS], True),
    "tf216": (".venv-tf216", [
        ["tensorflow-cpu==2.16.2", "keras==3.15.1", "numpy", "absl-py", "pyyaml", "h5py"]
        + TEST_TOOLS], False),
    "tf217": (".venv-tf217", [
        ["tensorflow-cpu==2.17.1", "keras==3.15.1", "numpy", "absl-py", "pyyaml", "h5py"]
        + TEST_TOOLS], False),
    # The peers of bench/ops_bench.py and tests/unit/test_peers.py.
    "peers": (".venv-peers", [["torch==2.13.0", "fbgemm-gpu-cpu==1.8.*", "numpy"]], False),
    "docs": (".venv-docs", [["mkdocs", "mkdocs-material", "mkdocstrings[python]"]], False),
    # What `pip install tfde[cpu]` brings, binaries only, for the wheel's
    # smoke test (`make wheel-test` installs the wheel itself into it each
    # time; a fresh environment took a minute of every `make test`).
    "wheel": (".venv-wheel", [["--only-binary", ":all:", "tensorflow-cpu==2.21.0", "numpy",
                               "absl-py", "pyyaml"]], False),
}


def _log(message):
  print(f"[envs] {message}", flush=True)


def _digest(*parts):
  return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _python_version():
  return "%d.%d.%d" % sys.version_info[:3]


@contextlib.contextmanager
def _locked(path):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    yield


def _run(cmd, **kwargs):
  subprocess.run(cmd, check=True, **kwargs)


def _pip(python, args, env=None):
  _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + args, env=env)


def env_key(name):
  _, installs, horovod = RECIPES[name]
  return _digest(_python_version(), installs, HOROVOD if horovod else None,
                 HOROVOD_BUILD_ENV if horovod else None)


def env_path(name):
  return os.path.join(CACHE, "envs", f"{name}-{env_key(name)}")


def _horovod_wheel(python, env_dir):
  """Horovod's wheel built against this environment's TensorFlow (kept:
  a build takes minutes and loads only beside the TensorFlow it saw)."""
  tf_version = subprocess.run(
      [python, "-c", "import importlib.metadata as m; print(m.version('tensorflow-cpu'))"],
      check=True, capture_output=True, text=True).stdout.strip()
  folder = os.path.join(CACHE, "wheels", _digest(HOROVOD, tf_version, _python_version(),
                                                 HOROVOD_BUILD_ENV))
  with _locked(folder):
    wheels = glob.glob(os.path.join(folder, "horovod-*.whl"))
    if wheels:
      return wheels[0]
    _log(f"building {HOROVOD} against TensorFlow {tf_version} (minutes)")
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
      env = dict(os.environ, **HOROVOD_BUILD_ENV,
                 PATH=os.path.join(env_dir, "bin") + os.pathsep + os.environ["PATH"])
      _run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
            "--no-cache-dir", "-w", scratch, HOROVOD], env=env)
      (built,) = glob.glob(os.path.join(scratch, "horovod-*.whl"))
      final = os.path.join(folder, os.path.basename(built))
      os.rename(built, final)
    return final


def ensure_env(name):
  """The environment's folder, built if the cache lacks it; links it."""
  link, installs, horovod = RECIPES[name]
  path = env_path(name)
  stamp = os.path.join(path, ".tfde-ready")
  with _locked(path):
    if not os.path.exists(stamp):
      started = time.time()
      _log(f"building environment {name} at {path}")
      shutil.rmtree(path, ignore_errors=True)  # a build that did not finish
      _run([sys.executable, "-m", "venv", path])
      python = os.path.join(path, "bin", "python")
      _pip(python, ["--upgrade", "pip"])
      for args in installs:
        _pip(python, args)
      if horovod:
        _pip(python, [_horovod_wheel(python, path)])
      with open(stamp + ".tmp", "w") as f:
        json.dump({"name": name, "python": _python_version(), "installs": installs}, f)
      os.rename(stamp + ".tmp", stamp)
      _log(f"environment {name} built in {time.time() - started:.0f} s")
  _link(os.path.join(REPO, link), path)
  return path


def _link(link, target):
  """Points `link` at `target`, replacing an older link or a folder an
  older Makefile made there."""
  if os.path.islink(link):
    if os.readlink(link) == target:
      return
    os.unlink(link)
  elif os.path.isdir(link):
    shutil.rmtree(link)
  elif os.path.exists(link):
    os.unlink(link)
  os.makedirs(os.path.dirname(link), exist_ok=True)
  tmp = link + ".tmp-link"
  if os.path.lexists(tmp):
    os.unlink(tmp)
  os.symlink(target, tmp)
  os.replace(tmp, link)


def _version_of(command):
  try:
    return subprocess.run([command, "--version"], capture_output=True, text=True).stdout
  except OSError:
    return None


def _compilers():
  """The C++ compiler's version, and nvcc's with its CUDA_HOME where one
  is found (setup.py then builds the GPU kernels too)."""
  cxx = os.environ.get("CXX", "g++")
  nvcc = shutil.which("nvcc") or (
      os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc") if os.environ.get("CUDA_HOME")
      else None)
  return (_version_of(cxx) or cxx, nvcc and _version_of(nvcc), os.environ.get("CUDA_HOME"))


def ops_key(name):
  # Every kernel source, the GPU ones in kernels/cuda/ too.
  sources = sorted(glob.glob(os.path.join(REPO, "kernels", "**", "*.cc"), recursive=True) +
                   glob.glob(os.path.join(REPO, "kernels", "**", "*.h"), recursive=True) +
                   [os.path.join(REPO, "setup.py")])
  content = hashlib.sha256()
  for source in sources:
    content.update(os.path.relpath(source, REPO).encode())
    with open(source, "rb") as f:
      content.update(f.read())
  return _digest(env_key(name), content.hexdigest(), _compilers(),
                 os.environ.get("TFDE_CUDA_ARCHS"))


def ensure_ops(name, inplace=False):
  """The op library compiled against environment `name`'s TensorFlow, at
  build/ops/NAME/_tfde_ops.so (and tfde/ops/_tfde_ops.so with inplace)."""
  env_dir = ensure_env(name)
  python = os.path.join(env_dir, "bin", "python")
  folder = os.path.join(CACHE, "ops", f"{name}-{ops_key(name)}")
  library = os.path.join(folder, "_tfde_ops.so")
  with _locked(folder):
    if not os.path.exists(library):
      started = time.time()
      _log(f"compiling the op library against environment {name}")
      os.makedirs(folder, exist_ok=True)
      with tempfile.TemporaryDirectory(dir=folder) as scratch:
        env = dict(os.environ, PATH=os.path.join(env_dir, "bin") + os.pathsep + os.environ["PATH"])
        # The same wheel build users get, into a scratch folder: tfde's
        # sources run from the checkout (PYTHONPATH), never from the cache.
        _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "--no-deps", "--no-build-isolation", "--target", os.path.join(scratch, "site"),
              REPO], env=env, cwd=REPO)
        built = os.path.join(scratch, "site", "tfde", "ops", "_tfde_ops.so")
        shutil.copy(built, library + ".tmp")
        info = os.path.join(scratch, "site", "tfde", "_build_info.py")
        if os.path.exists(info):
          shutil.copy(info, os.path.join(folder, "_build_info.py"))
        os.rename(library + ".tmp", library)
      _log(f"op library for {name} compiled in {time.time() - started:.0f} s")
  _link(os.path.join(REPO, "build", "ops", name, "_tfde_ops.so"), library)
  if inplace:
    _copy_into_package(folder)
  return library


def _copy_into_package(folder):
  """The main library inside the package, where `import tfde.ops` finds it
  without $TFDE_OPS_LIBRARY (a copy: the wheel and the package take files)."""
  for name, destination in (("_tfde_ops.so", os.path.join("tfde", "ops", "_tfde_ops.so")),
                            ("_build_info.py", os.path.join("tfde", "_build_info.py"))):
    source = os.path.join(folder, name)
    target = os.path.join(REPO, destination)
    if not os.path.exists(source):
      continue
    if os.path.exists(target) and _same(source, target):
      continue
    shutil.copy(source, target + ".tmp")
    os.replace(target + ".tmp", target)


def _same(a, b):
  with open(a, "rb") as f, open(b, "rb") as g:
    return f.read() == g.read()


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  for command in ("env", "ops", "path"):
    p = sub.add_parser(command)
    p.add_argument("names", nargs="+", choices=sorted(RECIPES))
    if command == "ops":
      p.add_argument("--inplace", action="store_true")
  sub.add_parser("list")
  args = parser.parse_args(argv)
  if args.command == "list":
    for folder in sorted(glob.glob(os.path.join(CACHE, "*", "*"))):
      print(folder)
    return 0
  for name in args.names:
    if args.command == "env":
      ensure_env(name)
    elif args.command == "ops":
      ensure_ops(name, inplace=args.inplace)
    else:
      print(env_path(name))
  return 0


if __name__ == "__main__":
  sys.exit(main())
