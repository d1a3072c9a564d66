"""Dynamic-table benchmark: memory and insert time as a table grows to a
million live ids, and a training step on dynamic tables against the same
step on static ones, measured in one run.

Data (stated in the output):
- growth: 1,000,000 distinct ids drawn uniformly over int64, inserted in
  10 batches of 100,000 into one table of width 16 trained by SGD, on the
  kernel's hash table and on its tf.lookup twin (the twin to 300,000 ids);
- training: the shared workload (bench/workload.py: 4 tables, batch 4096,
  20 ids per sample, Zipf(1.05), lazy Adam, width 64), ids hashed to 64-bit
  keys for the dynamic tables, which start empty and grow during warm-up.
Effective GB/s uses ops_bench's byte count. Writes
bench/results/dynamic_bench.png (memory against live rows; step times).

  python bench/dynamic_bench.py [--quick]
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from workload import parse_args  # noqa: E402  (bench/ is the script's dir)
from workload import timed  # noqa: E402  (bench/ is the script's dir)

import tfde  # noqa: E402
import tfde.ops  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BOUND_BYTES_PER_ROW = 100 + 4 * 16  # tests' bound for width 8, widened to 16


def growth(backend, ids, batch):
  """[(live rows, bytes held, seconds for the batch)] as ids are inserted."""
  config = tfde.TableConfig(name=f"grow_{backend}", vocabulary_size=None,
                            embedding_dim=16, optimizer="sgd", initializer="zeros")
  points = []
  with tfde.ops.backend(backend):
    table = tfde.tables.DynamicTable(config)
    for start in range(0, len(ids), batch):
      chunk = tf.constant(ids[start:start + batch], tf.int64)
      begin = time.perf_counter()
      table.lookup_local(0, chunk, tf.ones_like(chunk), training=True).numpy()
      points.append((table.size(), table.memory_bytes(), time.perf_counter() - begin))
  return points


def hashed(ids):
  """Workload ids as a hashing front end makes them: 64-bit, half negative."""
  return (ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)


def train_step_ms(work, dynamic, reps):
  configs = work.feature_configs()
  if dynamic:
    configs = {k: tfde.FeatureConfig(name=k, table=tfde.TableConfig.from_config(
        dict(c.table.get_config(), vocabulary_size=None)))
               for k, c in configs.items()}
  lookup = tfde.lookup.ShardedLookup(configs)
  ids = work.ids(seed=0)
  inputs = {f"f{t}": tf.constant(hashed(x) if dynamic else x) for t, x in enumerate(ids)}
  rng = np.random.default_rng(1)
  targets = {k: tf.constant(rng.normal(size=(work.batch, work.dim)), tf.float32)
             for k in inputs}

  @tf.function
  def train():
    with tf.GradientTape() as tape:
      out = lookup(inputs)
      loss = tf.add_n([tf.reduce_sum(out[k] * targets[k]) for k in out])
    tape.gradient(loss, lookup.trainable_variables)
    return loss

  return timed(train, reps), lookup


def main():
  args, work = parse_args(__doc__, reps=7)
  total, batch = (100_000, 10_000) if args.quick else (1_000_000, 100_000)
  rng = np.random.default_rng(0)
  ids = np.unique(rng.integers(-2**63, 2**63 - 1, size=total + total // 20, dtype=np.int64))
  ids = rng.permutation(ids)[:total]

  print(f"growth: {total:,} distinct int64 ids in batches of {batch:,}, width 16, SGD")
  curves = {tfde.ops.KERNELS: growth(tfde.ops.KERNELS, ids, batch),
            tfde.ops.REFERENCE: growth(tfde.ops.REFERENCE, ids[:total * 3 // 10], batch)}
  for backend, points in curves.items():
    rows, held, _ = points[-1]
    rate = sum(len(ids[:batch]) for _ in points) / sum(p[2] for p in points)
    print(f"  {backend:10s} {rows:>9,} rows  {held / 1e6:8.1f} MB held  "
          f"{held / rows:6.1f} B/row  {rate / 1e6:6.2f} M ids/s inserted")

  print(f"training: {work.describe()}; static vs dynamic tables (kernels), "
        f"median of {args.reps}")
  with tfde.ops.backend(tfde.ops.KERNELS):
    static_ms, _ = train_step_ms(work, dynamic=False, reps=args.reps)
    dynamic_ms, lookup = train_step_ms(work, dynamic=True, reps=args.reps)
  unique = [len(np.unique(x)) for x in work.ids(seed=0)]
  _, train_bytes = work.moved_bytes(unique)
  live = sum(t.size() for t in lookup.tables.values())
  for name, ms in (("static tables", static_ms), ("dynamic tables", dynamic_ms)):
    print(f"  {name:16s} {ms:8.1f} ms  {train_bytes / ms / 1e6:6.2f} GB/s")
  print(f"  dynamic / static: {dynamic_ms / static_ms:.2f}x the step time; "
        f"{live:,} live rows in the dynamic tables")

  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  for backend, points in curves.items():
    left.plot([p[0] for p in points], [p[1] / 1e6 for p in points], marker="o",
              label=f"{backend} (held)")
  xs = np.array([0, total])
  left.plot(xs, xs * BOUND_BYTES_PER_ROW / 1e6, "k--", label=f"{BOUND_BYTES_PER_ROW} B/row")
  left.set_xlabel("live rows")
  left.set_ylabel("MB")
  left.set_title("dynamic table memory, width 16")
  left.legend()
  right.bar(["static", "dynamic"], [static_ms, dynamic_ms])
  right.set_ylabel("ms per training step")
  right.set_title("4 tables x batch 4096 x 20 ids, lazy Adam")
  os.makedirs(RESULTS, exist_ok=True)
  path = os.path.join(RESULTS, "dynamic_bench.png")
  fig.tight_layout()
  fig.savefig(path)
  print(f"plot: {path}")


if __name__ == "__main__":
  main()
