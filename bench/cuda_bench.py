"""CUDA kernel benchmark: bench/ops_bench.py's lookup and lazy-Adam training
step on a GPU, timed on the device with CUDA events, through the launchers'
C testing API (no TensorFlow needed, so it runs on a GPU machine without a
CUDA-enabled TensorFlow).

Data (stated in the output): the shared workload (bench/workload.py), 4
tables of 1,000,000 x 64 float32, batch 4096, 20 ids per sample per table,
Zipf(1.05), sum combiner. Per table: unique -> gather -> combine, then
combine gradient -> lazy Adam on the touched rows; one host read of the
unique count per table, as the op does. Effective GB/s uses the same bytes
as ops_bench. With --cpu-forward-ms/--cpu-train-ms (from ops_bench on the
CPU machine) it also prints the ratios.

  python3 bench/cuda_bench.py [--quick] [--reps 20]
"""

import ctypes
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from workload import parse_args  # noqa: E402  (bench/ is the script's dir)

from tests.support import cuda_testing  # noqa: E402


def main():
  args, work = parse_args(__doc__, reps=20, extra=[
      ("--cpu-forward-ms", dict(type=float)), ("--cpu-train-ms", dict(type=float))])
  reason = cuda_testing.unavailable_reason()
  if reason:
    sys.exit(f"cuda_bench: cannot run: {reason}")
  ids = np.ascontiguousarray(np.stack([x.ravel() for x in work.ids(seed=0)]))
  unique = [len(np.unique(x)) for x in ids]
  with tempfile.TemporaryDirectory() as tmp:
    lib = ctypes.CDLL(cuda_testing.build_testing_library(os.path.join(tmp, "lib.so")))
    forward, train = ctypes.c_float(), ctypes.c_float()
    touched = ctypes.c_int64()
    status = lib.tfde_gpu_time_step(
        ids.ctypes.data_as(ctypes.c_void_p), work.tables, ctypes.c_int64(work.batch),
        ctypes.c_int64(work.hot), ctypes.c_int64(work.vocab), ctypes.c_int64(work.dim),
        args.reps, ctypes.byref(forward), ctypes.byref(train), ctypes.byref(touched))
  if status:
    sys.exit(f"cuda_bench: CUDA error {status}")
  assert touched.value == sum(unique), (touched.value, unique)
  gpu = os.popen("nvidia-smi --query-gpu=name --format=csv,noheader").read().strip()
  fwd_bytes, train_bytes = work.moved_bytes(unique)
  print(f"data: {work.describe()}; unique ids per table {unique}; {gpu}; "
        f"mean of {args.reps} after a warm-up")
  print(f"{'CUDA kernels':24s} {'ms':>8s} {'GB/s':>8s}")
  for name, ms, moved, cpu in (("forward", forward.value, fwd_bytes, args.cpu_forward_ms),
                               ("training step", train.value, train_bytes,
                                args.cpu_train_ms)):
    line = f"{name:24s} {ms:8.3f} {moved / ms / 1e6:8.1f}"
    if cpu:
      line += f"   {cpu / ms:6.1f}x the CPU kernels' {cpu} ms"
    print(line)


if __name__ == "__main__":
  main()
