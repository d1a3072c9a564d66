"""Builds the CUDA launchers with their C testing API (no TensorFlow), for
tests/unit/test_cuda_kernels.py and bench/cuda_bench.py."""

import glob
import os
import shutil
import subprocess

CUDA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "kernels", "cuda")


def unavailable_reason():
  """Why the CUDA kernels cannot run here, or None."""
  if not shutil.which("nvcc"):
    return "nvcc not found"
  smi = shutil.which("nvidia-smi")
  if not smi or subprocess.run([smi, "-L"], capture_output=True).returncode:
    return "no GPU (nvidia-smi -L failed)"
  return None


def build_testing_library(path):
  """Compiles the launchers and the testing API into the shared library
  `path` for the GPU of this machine; raises with nvcc's output on failure."""
  sources = sorted(glob.glob(os.path.join(CUDA_DIR, "*.cu.cc")))  # launchers + testing API
  cmd = ["nvcc", "-O3", "-std=c++17", "-arch=native", "-shared", "-Xcompiler", "-fPIC",
         "-o", path, "-x", "cu"] + sources
  result = subprocess.run(cmd, capture_output=True, text=True)
  if result.returncode:
    raise RuntimeError(f"nvcc failed:\n{result.stderr}")
  return path
