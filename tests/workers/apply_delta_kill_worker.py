"""Applies a delta on disk, to be killed during it (tests/unit/test_apply_delta_atomic.py).

Usage: python -m tests.workers.apply_delta_kill_worker PRISTINE SCRATCH TARGET DELTA

First a timed rehearsal on SCRATCH (a copy of PRISTINE): how long until
the write begins (the export loaded, the delta applied in memory) and how
long in all. It prints them ("applying <before write s> <total s>"), then
applies the delta to TARGET, where the test kills it in that window.
"""

import os
import shutil
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from tfde.saving import serving  # pylint: disable=g-import-not-at-top


def main(pristine, scratch, target, delta):
  shutil.rmtree(scratch, ignore_errors=True)
  shutil.copytree(pristine, scratch)
  start = time.perf_counter()
  served = tf.saved_model.load(scratch)
  served.apply_delta(tf.constant(delta))
  before_write = time.perf_counter() - start
  shutil.rmtree(scratch)
  shutil.copytree(pristine, scratch)
  start = time.perf_counter()
  serving.apply_delta(scratch, delta)
  total = time.perf_counter() - start
  print(f"applying {before_write:.4f} {total:.4f}", flush=True)
  serving.apply_delta(target, delta)
  print("done", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:5])
