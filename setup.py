"""Builds tfde and its C++ op library.

The ops are compiled with g++ against the installed TensorFlow's headers and
`libtensorflow_framework` (the flags `tf.sysconfig` gives), into
`tfde/ops/_tfde_ops.so` inside the installed package. Where `nvcc` and a
CUDA-enabled TensorFlow exist, the same op classes are built with
GOOGLE_CUDA (they then register GPU kernels too), with their GPU functors
and CUDA launchers from `kernels/cuda/`.

TensorFlow must already be installed: under pip's build isolation it is not
importable, so the flags are asked of the interpreter that runs pip, with
the isolation's environment removed (or of $TFDE_TF_PYTHON).
$TFDE_PREBUILT_OPS names a library compiled before from the same sources
against the same TensorFlow, which the build packs instead of compiling.
"""

import concurrent.futures
import functools
import glob
import json
import os
import shutil
import subprocess
import sys

from setuptools import Extension
from setuptools import find_packages
from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = os.path.join("tfde", "ops", "_tfde_ops.so")

_QUERY = (
    "import json, tensorflow as tf; print(json.dumps({"
    "'version': tf.__version__,"
    "'cflags': tf.sysconfig.get_compile_flags(),"
    "'lflags': tf.sysconfig.get_link_flags(),"
    "'cuda': tf.test.is_built_with_cuda()}))")


def tensorflow_build_info():
  python = os.environ.get("TFDE_TF_PYTHON", sys.executable)
  env = {k: v for k, v in os.environ.items()
         if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
  env["TF_CPP_MIN_LOG_LEVEL"] = "3"
  try:
    out = subprocess.run([python, "-c", _QUERY], env=env, check=True,
                         capture_output=True, text=True).stdout
  except subprocess.CalledProcessError as e:
    raise SystemExit(
        "tfde's ops build against an installed TensorFlow 2.15-2.21, but "
        f"`{python} -c 'import tensorflow'` failed:\n{e.stderr[-2000:]}\n"
        "Install tensorflow, tensorflow-cpu or tensorflow-tpu first.") from e
  return json.loads(out.strip().splitlines()[-1])


_TF_INFO = []


def cached_tensorflow_build_info():
  """tensorflow_build_info(), asked once per setup.py run, or None where no
  TensorFlow is importable (an sdist needs none)."""
  if not _TF_INFO:
    try:
      _TF_INFO.append(tensorflow_build_info())
    except SystemExit:
      _TF_INFO.append(None)
  return _TF_INFO[0]


def tensorflow_extras():
  """The extras naming a TensorFlow distribution, pinned to the minor
  version the op library is compiled against (its C++ ABI holds within a
  minor version only): `tfde[cpu]` on TF 2.21.0 requires
  tensorflow-cpu>=2.21,<2.22.

  No TensorFlow is an unconditional requirement: tensorflow,
  tensorflow-cpu and tensorflow-tpu are different distributions of the
  same `tensorflow` module, pip cannot say "any one of them", and
  requiring one installs a second copy over a user's other one (a GPU
  user's `tensorflow` overwritten by `tensorflow-cpu`, or the reverse).
  `import tfde` checks instead, naming both versions and the fix
  (tfde.tensorflow_mismatch)."""
  info = cached_tensorflow_build_info()
  if info is None:
    spec = ">=2.15,<2.22"
  else:
    major, minor = (int(p) for p in info["version"].split(".")[:2])
    spec = f">={major}.{minor},<{major}.{minor + 1}"
  return {"cpu": [f"tensorflow-cpu{spec}"], "gpu": [f"tensorflow[and-cuda]{spec}"],
          "tpu": [f"tensorflow-tpu{spec}"]}


class BuildTfdeOps(build_ext):
  """Compiles kernels/*.cc (in parallel; TFDE_BUILD_JOBS caps how many at
  once) and links the op library."""

  def run(self):
    info = cached_tensorflow_build_info()
    if info is None:
      info = tensorflow_build_info()   # raises, saying why
    print(f"tfde: building ops against TensorFlow {info['version']}")
    target = os.path.join(HERE if self.inplace else self.build_lib, LIBRARY)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    # The TensorFlow this library is for: `import tfde` refuses another
    # minor version with a message naming both (tfde.tensorflow_mismatch).
    with open(os.path.join(os.path.dirname(os.path.dirname(target)), "_build_info.py"),
              "w") as f:
      f.write('"""Written by setup.py when the op library was built."""\n'
              f"TENSORFLOW_VERSION = {info['version']!r}\n")
    prebuilt = os.environ.get("TFDE_PREBUILT_OPS")
    if prebuilt:
      # A library tools/envs.py already compiled from these same sources
      # against this same TensorFlow (its cache key): packed, not rebuilt.
      shutil.copy(prebuilt, target)
      print(f"tfde: packed {prebuilt} as {target}")
      return
    build_dir = os.path.join(self.build_temp, "tfde_ops")
    os.makedirs(build_dir, exist_ok=True)
    cxx = os.environ.get("CXX", "g++")
    # -fno-math-errno: no errno from sqrt/pow, so the optimizers' row loops
    # vectorise (nothing in the kernels reads errno).
    cflags = ["-O3", "-fno-math-errno", "-fPIC", "-Wno-deprecated-declarations"] + info["cflags"]
    # The op classes (kernels/*.cc) register GPU kernels too when built with
    # GOOGLE_CUDA; their GPU functors are kernels/cuda/*.cc (g++), calling
    # the CUDA launchers kernels/cuda/*.cu.cc (nvcc).
    cuda = self._cuda_available(info)
    gpu_flags = (["-DGOOGLE_CUDA=1", "-I" + os.path.join(self._cuda_home(), "include")]
                 if cuda else [])
    sources = sorted(glob.glob(os.path.join(HERE, "kernels", "*.cc")))
    if cuda:
      sources += sorted(p for p in glob.glob(os.path.join(HERE, "kernels", "cuda", "*.cc"))
                        if not p.endswith(".cu.cc"))
    objects = []
    commands = []
    for src in sources:
      obj = os.path.join(build_dir, os.path.basename(src) + ".o")
      objects.append(obj)
      commands.append([cxx, "-c", src, "-o", obj] + cflags + gpu_flags)
    if cuda:
      commands += self._launcher_commands(build_dir, objects)
    # TFDE_BUILD_JOBS caps the parallel compiles (a shared machine: 1).
    jobs = int(os.environ.get("TFDE_BUILD_JOBS") or os.cpu_count() or 1)
    jobs = max(1, min(len(commands), jobs))
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
      for cmd, result in zip(commands, pool.map(self._compile, commands)):
        if result.returncode:
          sys.stderr.write(result.stderr)
          source = next(a for a in cmd if a.endswith((".cc", ".cu")))
          raise SystemExit(f"tfde: compiling {source} failed")
    link = [cxx, "-shared", "-o", target] + objects
    if cuda:
      # The launchers carry the CUDA runtime nvcc built them for, linked in
      # ahead of TensorFlow's library and kept private to this one: a
      # CUDA-enabled TensorFlow exports a runtime of its own (a stub over
      # the libcudart.so of the CUDA it was built with), which may be an
      # older version than nvcc's. Both drive the device's primary context,
      # and the launchers run on the streams TensorFlow hands them.
      link += ["-L" + self._cudart_dir(), "-lcudart_static",
               "-Wl,--exclude-libs,libcudart_static.a", "-ldl", "-lrt", "-lpthread"]
    link += info["lflags"]
    subprocess.run(link, check=True)
    print(f"tfde: wrote {target}")

  @staticmethod
  def _compile(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)

  @staticmethod
  @functools.lru_cache(maxsize=None)
  def _cuda_home():
    # CUDA_HOME, else the toolkit above nvcc, else /usr/local/cuda (where a
    # wrapper nvcc in /usr/local/bin leaves no headers beside it).
    nvcc = shutil.which("nvcc")
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                  nvcc and os.path.dirname(os.path.dirname(os.path.realpath(nvcc))),
                  "/usr/local/cuda"]
    for home in filter(None, candidates):
      if os.path.exists(os.path.join(home, "include", "cuda_runtime.h")):
        return home
    raise SystemExit("tfde: nvcc found but no CUDA toolkit headers (cuda_runtime.h); "
                     "set CUDA_HOME to the toolkit")

  def _nvcc(self):
    # The toolkit's own nvcc, so that the launchers and the runtime they
    # link come from one CUDA version.
    own = os.path.join(self._cuda_home(), "bin", "nvcc")
    return own if os.path.exists(own) else shutil.which("nvcc")

  def _cudart_dir(self):
    for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
      path = os.path.join(self._cuda_home(), sub)
      if os.path.exists(os.path.join(path, "libcudart_static.a")):
        return path
    raise SystemExit(f"tfde: no libcudart_static.a under {self._cuda_home()}; "
                     "set CUDA_HOME to the toolkit")

  def _cuda_available(self, info):
    if not shutil.which("nvcc"):
      print("tfde: CUDA kernels skipped: nvcc not found; CPU build only")
      return False
    if not info["cuda"]:
      print(f"tfde: CUDA kernels skipped: TensorFlow {info['version']} is not "
            "built with CUDA; CPU build only")
      return False
    return True

  def _launcher_commands(self, build_dir, objects):
    # kernels/cuda/*.cu.cc are the CUDA launchers (nvcc). testing_api.cu.cc
    # is the C API for tests/unit/test_cuda_kernels.py only, not part of the library.
    cuda_dir = os.path.join(HERE, "kernels", "cuda")
    launchers = sorted(p for p in glob.glob(os.path.join(cuda_dir, "*.cu.cc"))
                       if not p.endswith("testing_api.cu.cc"))
    commands = []
    for src in launchers:
      obj = os.path.join(build_dir, os.path.basename(src)[:-3] + ".o")
      objects.append(obj)
      commands.append([self._nvcc(), "-c", "-x", "cu", src, "-o", obj, "-O3",
                       "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC",
                       "-std=c++17"] + self._cuda_archs())
    return commands

  @staticmethod
  def _cuda_archs():
    # TFDE_CUDA_ARCHS="80;90" picks the targets; the default is the GPU here.
    archs = os.environ.get("TFDE_CUDA_ARCHS")
    if not archs:
      return ["-arch=native"]
    return [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs.split(";")]

setup(
    name="tfde",
    version="0.1.0",
    description="TensorFlow Distributed Embeddings: sharded embedding tables, "
    "all-to-all lookups and sparse optimizers on stock TensorFlow",
    packages=find_packages(include=["tfde", "tfde.*"]),
    # A placeholder extension makes setuptools run build_ext and tag the
    # wheel as platform-specific; BuildTfdeOps does the real work.
    ext_modules=[Extension("tfde.ops._tfde_ops", sources=[])],
    cmdclass={"build_ext": BuildTfdeOps},
    python_requires=">=3.9",
    # TensorFlow is not a hard requirement (see tensorflow_extras): the
    # extras pin the minor version the op library was built against.
    install_requires=["numpy", "absl-py", "pyyaml"],
    extras_require={
        **tensorflow_extras(),
        "horovod": ["horovod==0.28.1"],
        "plots": ["matplotlib"],
        # tf_keras's only requirement is the `tensorflow` distribution: with
        # tensorflow-cpu installed, prefer `pip install --no-deps tf_keras`.
        "dtensor": ["tf_keras>=2.18,<2.22"],
        "test": ["pytest", "pytest-timeout"],
    },
    # `import tfde` is lazy, so the command's help needs no TensorFlow.
    # tfde_cli: the command's old module, a deprecated alias for one release.
    py_modules=["tfde_cli"],
    entry_points={"console_scripts": ["tfde=tfde.app.command:main"]},
    zip_safe=False,
)
