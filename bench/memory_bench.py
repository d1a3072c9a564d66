"""Bounded memory: a dynamic table with a row budget fed 20 million distinct
ids, and layers created and deleted over and over.

Data (stated in the output):
- budget: one dynamic table of width 8 trained by Adagrad (a row holds its
  embedding and accumulator), `DynamicConfig(max_rows_per_shard=ROWS)`;
  20,000,000 distinct int64 ids (a multiplicative hash of 0..20M-1) fed as
  training steps of 100,000 ids each, every id once. Eviction keeps the
  table at ROWS rows, so resident memory must stay within the documented
  bound: the process's RSS after the first step plus
  BOUND_BYTES_PER_ROW * ROWS (`tfde.tables.DynamicTable.memory_bytes`,
  table, index and pending map at their largest).
- cycles: a DistributedEmbedding with a 200,000 x 16 static and a dynamic
  table, built, trained one step and deleted, 60 times; RSS must not grow
  after the first few (tables of deleted layers are freed).

Writes bench/results/memory_bench.png (RSS against ids seen, and against
cycles) and prints the figures.

  python bench/memory_bench.py [--quick]
"""

import argparse
import gc
import os
import resource
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tfde  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
# The documented bound for a live row of width 8 with one slot (embedding
# and accumulator, 64 bytes): at most 256 bytes of resident memory a row,
# counting the id index, the counts and last-seen stamps, the eviction's
# scratch and the allocator's slack (measured: about 200).
BOUND_BYTES_PER_ROW = 256


def rss_bytes():
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * resource.getpagesize()


def budget_run(total_ids, rows, batch):
  config = tfde.TableConfig(
      name="budget", vocabulary_size=None, embedding_dim=8, optimizer="adagrad",
      initializer="zeros", dynamic=tfde.DynamicConfig(max_rows_per_shard=rows))
  lookup = tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=config)})
  table = lookup.tables["budget"]

  @tf.function
  def step(ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(lookup({"f": ids})["f"])
    tape.gradient(loss, lookup.trainable_variables)

  points, base = [], None
  start = time.perf_counter()
  for first in range(0, total_ids, batch):
    ids = (np.arange(first, min(first + batch, total_ids), dtype=np.uint64)
           * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
    step(tf.constant(ids))
    rss = rss_bytes()
    base = base if base is not None else rss
    points.append((first + len(ids), rss, table.size()))
    if len(points) % 20 == 0:
      print(f"  {first + len(ids):>11,} ids seen: {table.size():,} rows, "
            f"RSS {rss / 2**20:.0f} MiB ({time.perf_counter() - start:.0f} s)", flush=True)
  return points, base


def cycles_run(count):
  rss = []
  for _ in range(count):
    static = tfde.TableConfig(name="s", vocabulary_size=200_000, embedding_dim=16,
                              optimizer="adam")
    dynamic = tfde.TableConfig(name="d", vocabulary_size=None, embedding_dim=16,
                               optimizer="adagrad")
    layer = tfde.layers.DistributedEmbedding(
        {"s": tfde.FeatureConfig(name="s", table=static),
         "d": tfde.FeatureConfig(name="d", table=dynamic)})
    with tf.GradientTape() as tape:
      out = layer({"s": tf.constant([[1, 2]]), "d": tf.constant([[5, 6]], tf.int64)})
      loss = tf.reduce_sum(out["s"]) + tf.reduce_sum(out["d"])
    tape.gradient(loss, layer.trainable_variables)
    del layer, out, tape
    gc.collect()
    rss.append(rss_bytes())
  return rss


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args()
  total, rows, cycles = (2_000_000, 100_000, 15) if args.quick else (20_000_000, 1_000_000, 60)
  print(f"budget: {total:,} distinct ids in steps of 100,000 into a width-8 Adagrad "
        f"dynamic table of at most {rows:,} rows; TF {tf.__version__}")
  points, base = budget_run(total, rows, 100_000)
  bound = base + BOUND_BYTES_PER_ROW * rows
  peak = max(rss for _, rss, _ in points)
  print(f"rows at the end {points[-1][2]:,} (budget {rows:,}); RSS after the first "
        f"step {base / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB "
        f"({(peak - base) / rows:.0f} bytes a row), bound {bound / 2**20:.0f} MiB: "
        f"{'within' if peak <= bound else 'OVER'} the bound")
  cycle_rss = cycles_run(cycles)
  settled = cycle_rss[min(4, len(cycle_rss) - 1)]
  growth = cycle_rss[-1] - settled
  print(f"cycles: {cycles} layers built, trained and deleted; RSS after cycle 5 "
        f"{settled / 2**20:.0f} MiB, after cycle {cycles} {cycle_rss[-1] / 2**20:.0f} MiB "
        f"(growth {growth / 2**20:+.1f} MiB)")
  os.makedirs(RESULTS, exist_ok=True)
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  seen = np.array([p[0] for p in points]) / 1e6
  left.plot(seen, np.array([p[1] for p in points]) / 2**20, label="RSS")
  left.axhline(bound / 2**20, color="red", linestyle="--", label="documented bound")
  left.set_xlabel("distinct ids seen (millions)")
  left.set_ylabel("resident memory (MiB)")
  left.set_title(f"dynamic table, budget {rows:,} rows")
  left.legend()
  right.plot(np.arange(1, cycles + 1), np.array(cycle_rss) / 2**20, marker=".")
  right.set_xlabel("layers built and deleted")
  right.set_ylabel("resident memory (MiB)")
  right.set_title("create / delete cycles")
  fig.tight_layout()
  path = os.path.join(RESULTS, "memory_bench.png")
  fig.savefig(path, dpi=100)
  print(f"wrote {path}")
  return 0 if peak <= bound else 1


if __name__ == "__main__":
  sys.exit(main())
