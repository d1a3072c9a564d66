"""Delta checkpoints against full ones: size and time as the fraction of
rows touched since the previous save grows.

Data (stated in the output): one static table of ROWS x DIM float32 rows
(10,000,000 x 8 by default) trained by Adagrad (a row saves its embedding
and accumulator: 64 bytes) through `tfde.lookup.ShardedLookup` in a
`tf.function` step; each step looks up BATCH distinct ids (no id twice in
a phase, so the touched fraction is exact) and applies one update. A
`tfde.checkpoint.DeltaCheckpointManager` saves once whole, then after each
phase of training touching a fraction of the rows it saves a delta. Each
save's time (writing, plus the CRC-32 of its files) and size are measured;
the full save is repeated at the end.

Then the same for a dynamic table (`--dynamic-rows` live rows, default
2,000,000; Adagrad): its delta exports only the rows last seen since the
previous save (`TfdeDynamicTableExport` with `seen_after`), so its time follows the
rows touched, not the live rows.

Writes bench/results/delta_bench.png and prints markdown tables.

  python bench/delta_bench.py [--rows N] [--quick]
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tfde  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
FRACTIONS = (0.001, 0.01, 0.03, 0.1, 0.3)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--rows", type=int, default=10_000_000)
  parser.add_argument("--dim", type=int, default=8)
  # 15,000 distinct ids a step: about 300 training steps over the phases.
  parser.add_argument("--batch", type=int, default=15_000)
  parser.add_argument("--dynamic-rows", type=int, default=2_000_000)
  parser.add_argument("--quick", action="store_true",
                      help="1M rows (200,000 live rows in the dynamic table)")
  args = parser.parse_args()
  rows = 1_000_000 if args.quick else args.rows
  config = tfde.TableConfig(name="items", vocabulary_size=rows, embedding_dim=args.dim,
                            optimizer=tfde.optimizers.Adagrad(learning_rate=0.1))
  lookup = tfde.lookup.ShardedLookup({"item": tfde.FeatureConfig(name="item", table=config)})
  step = training_step(lookup, "item")
  directory = tempfile.mkdtemp(prefix="tfde_delta_bench_")
  manager = tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(lookup=lookup), directory, full_every_n=100, max_to_keep=1)
  rng = np.random.default_rng(0)
  print(f"table: {rows:,} x {args.dim} float32, Adagrad (rows + accumulator: "
        f"{rows * args.dim * 8 / 1e6:,.0f} MB); batches of {args.batch:,} distinct ids")

  def timed_save():
    start = time.perf_counter()
    manager.save()
    return time.perf_counter() - start, manager.links()[-1]

  full_time, link = timed_save()
  assert link["kind"] == "full"
  full_times, full_bytes = [full_time], link["bytes"]
  results, steps = [], 0
  for fraction in FRACTIONS:
    touched = int(rows * fraction)
    ids = rng.permutation(rows)[:touched]
    start = time.perf_counter()
    for lo in range(0, touched, args.batch):
      step(tf.constant(ids[lo:lo + args.batch, None], tf.int64))
      steps += 1
    train_time = time.perf_counter() - start
    delta_time, link = timed_save()
    assert link["kind"] == "delta"
    results.append((fraction, touched, link["bytes"], delta_time, train_time))
    print(f"  touched {fraction:6.1%} ({touched:,} rows, {steps} steps so far): "
          f"delta {link['bytes'] / 1e6:,.1f} MB in {delta_time:.2f} s")
  manager = tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(lookup=lookup), directory, full_every_n=1, max_to_keep=1)
  for _ in range(2):
    full_time, link = timed_save()
    full_times.append(full_time)
  shutil.rmtree(directory)

  full_time = float(np.median(full_times))
  print(f"\nfull checkpoint: {full_bytes / 1e6:,.1f} MB, median {full_time:.2f} s "
        f"({', '.join(f'{t:.2f}' for t in full_times)}); {steps} training steps\n")
  print("| touched since last save | rows | delta size | delta save | vs full size | vs full time |")
  print("|---|---|---|---|---|---|")
  for fraction, touched, size, seconds, _ in results:
    print(f"| {fraction:.1%} | {touched:,} | {size / 1e6:,.1f} MB | {seconds:.2f} s | "
          f"{size / full_bytes:.1%} | {seconds / full_time:.1%} |")
  print(f"| full | {rows:,} | {full_bytes / 1e6:,.1f} MB | {full_time:.2f} s | 100% | 100% |")
  _plot(results, full_bytes, full_time, rows, args.dim)
  dynamic_part(200_000 if args.quick else args.dynamic_rows, args.dim, args.batch)


def training_step(lookup, feature):
  """One update of the rows `ids` [k, 1] of `feature` look up (a squared loss)."""

  @tf.function(reduce_retracing=True)
  def step(ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(lookup({feature: ids})[feature]))
    tape.gradient(loss, lookup.trainable_variables)

  return step


def dynamic_part(live, dim, batch):
  """A dynamic table of `live` rows: delta saves after touching 0.1% and
  1% of them, against full saves."""
  config = tfde.TableConfig(name="users", vocabulary_size=None, embedding_dim=dim,
                            optimizer=tfde.optimizers.Adagrad(learning_rate=0.1))
  lookup = tfde.lookup.ShardedLookup({"user": tfde.FeatureConfig(name="user", table=config)})
  table = lookup.tables["users"]
  rng = np.random.default_rng(1)
  ids = rng.choice(2**40, size=live, replace=False).astype(np.int64)
  table.assign_rows(ids, rng.normal(size=(live, dim)).astype(np.float32),
                    counts=np.ones(live, np.int64), last_seen=np.ones(live, np.int64),
                    step=1)
  step = training_step(lookup, "user")
  directory = tempfile.mkdtemp(prefix="tfde_delta_bench_dynamic_")
  checkpoint = tf.train.Checkpoint(lookup=lookup)
  manager = tfde.checkpoint.DeltaCheckpointManager(checkpoint, directory,
                                                   full_every_n=100, max_to_keep=1)

  def timed_save(mgr):
    start = time.perf_counter()
    mgr.save()
    return time.perf_counter() - start, mgr.links()[-1]

  full_time, link = timed_save(manager)
  full_bytes = link["bytes"]
  print(f"\ndynamic table: {table.size():,} live rows x {dim}, Adagrad; "
        f"full save {full_bytes / 1e6:,.1f} MB in {full_time:.2f} s")
  print("| touched since last save | rows | delta size | delta save | vs full time |")
  print("|---|---|---|---|---|")
  order = rng.permutation(live)
  done = 0
  for fraction in (0.001, 0.01):
    touched = ids[order[done:done + int(live * fraction)]]
    done += touched.size
    for lo in range(0, touched.size, batch):
      step(tf.constant(touched[lo:lo + batch, None]))
    seconds, link = timed_save(manager)
    assert link["kind"] == "delta"
    print(f"| {fraction:.1%} | {touched.size:,} | {link['bytes'] / 1e6:,.2f} MB | "
          f"{seconds:.2f} s | {seconds / full_time:.1%} |")
  full_manager = tfde.checkpoint.DeltaCheckpointManager(checkpoint, directory,
                                                        full_every_n=1, max_to_keep=1)
  again, link = timed_save(full_manager)
  print(f"| full | {table.size():,} | {link['bytes'] / 1e6:,.1f} MB | "
        f"{again:.2f} s (first {full_time:.2f} s) | 100% |")
  shutil.rmtree(directory)


def _plot(results, full_bytes, full_time, rows, dim):
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    print("(matplotlib missing: no plot)")
    return
  fractions = [r[0] * 100 for r in results]
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  left.plot(fractions, [r[2] / 1e6 for r in results], "o-", label="delta")
  left.axhline(full_bytes / 1e6, color="gray", linestyle="--", label="full")
  left.set(xscale="log", yscale="log", xlabel="rows touched since last save (%)",
           ylabel="MB", title="checkpoint size")
  right.plot(fractions, [r[3] for r in results], "o-", label="delta")
  right.axhline(full_time, color="gray", linestyle="--", label="full")
  right.set(xscale="log", yscale="log", xlabel="rows touched since last save (%)",
            ylabel="seconds", title="save time")
  for ax in (left, right):
    ax.legend()
  fig.suptitle(f"delta vs full checkpoint, {rows:,} x {dim} table, Adagrad")
  fig.tight_layout()
  os.makedirs(RESULTS, exist_ok=True)
  fig.savefig(os.path.join(RESULTS, "delta_bench.png"), dpi=100)
  print(f"plot: {os.path.join(RESULTS, 'delta_bench.png')}")


if __name__ == "__main__":
  main()
