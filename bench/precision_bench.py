"""Reduced-precision rows: memory per row and speed against float32.

For each row type (float32, bfloat16, float16), the shared workload's
tables (bench/workload.py; `--quick`: 50,000 rows, batch 512) in one
`tfde.lookup.ShardedLookup` without a strategy: bytes per row of the
table variables (rows only; slots stay float32), the median forward time,
and the median lazy-Adam training step, both in a tf.function. bfloat16 and
float16 tables run on stock TF ops (the C++ kernels take float32 tables),
so part of any difference is the kernels', not the type's.

  python3 bench/precision_bench.py [--quick] [--reps 10]
"""

import dataclasses
import os
import sys

import numpy as np
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from workload import lookup_steps  # noqa: E402  (bench/ is the script's dir)
from workload import parse_args  # noqa: E402  (bench/ is the script's dir)
from workload import timed  # noqa: E402  (bench/ is the script's dir)

import tfde  # noqa: E402


def run(work, dtype, reps):
  configs = {}
  for name, f in work.feature_configs().items():
    table = dataclasses.replace(f.table, dtype=dtype)
    configs[name] = tfde.FeatureConfig(name=name, table=table)
  lookup = tfde.lookup.ShardedLookup(configs)
  inputs = {f"f{t}": tf.constant(x) for t, x in enumerate(work.ids(seed=0))}
  row_bytes = sum(
      v.dtype.size * int(np.prod(v.shape[1:])) for t in lookup.tables.values()
      for v in t.local_variables()) / len(lookup.tables)

  forward, train = lookup_steps(
      lookup, inputs, lambda out: tf.add_n([tf.reduce_sum(o) for o in out.values()]))
  return row_bytes, timed(forward, reps), timed(train, reps)


def main():
  args, work = parse_args(__doc__, reps=10)
  print(f"precision_bench: {work.describe()} (rows in the type named), "
        f"{args.reps} reps, ops on {tfde.ops.current_backend()}")
  print(f"{'rows':>9} {'bytes/row':>10} {'forward ms':>11} {'train ms':>9}")
  base = None
  for dtype in ("float32", "bfloat16", "float16"):
    row_bytes, fwd, step = run(work, dtype, args.reps)
    base = base or (fwd, step)
    print(f"{dtype:>9} {row_bytes:>10.0f} {fwd:>11.2f} {step:>9.2f}"
          f"   (x{fwd / base[0]:.2f} forward, x{step / base[1]:.2f} train vs float32)")


if __name__ == "__main__":
  main()
