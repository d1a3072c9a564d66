"""tfde.dtensor against naive DTensor, as the vocabulary grows.

Mesh of 4 logical CPUs; one table of 1 to 64 MiB (embedding_dim 64,
vocabulary = MiB * 4096), global batch 512 x 4 ids (uniform), sum
combiner, lazy Adam. Per size (median of `--reps` calls, ms):

- tfde lookup: `tfde.dtensor.DistributedEmbedding`'s forward (each device
  reads its own rows of its [V/4, D] shard);
- tfde train step: forward, gradients of the rows read, and the per-device
  sparse lazy-Adam update of the touched rows (`apply_gradients`);
- naive lookup: `tf.gather` on the read value of a [V, D] DVariable
  sharded on dim 0 (the gather on the DVariable itself is refused), which
  all-concats the table on every device first;
- naive train step: the same lookup, then the dense write DTensor allows,
  `v.assign(tf.tensor_scatter_nd_update(v, ids, rows - lr * grads))` (the
  ResourceScatter* ops and TensorScatterSub have no layout propagation).

Each time is the median wall time and, in brackets, the process's CPU
time per call, which a busy machine inflates less.

Memory: the process's peak RSS growth (MiB) during each phase (phases run
in order of growing tables, so a phase's growth is what it allocates
beyond everything before it), and the bytes one device holds for the
table (its component).

  python bench/dtensor_bench.py [--reps 5] [--sizes 1,4,16,64]
"""

import argparse
import os
import resource
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * 4)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tensorflow.experimental import dtensor  # noqa: E402

import tfde  # noqa: E402
import tfde.dtensor  # noqa: E402

DIM, BATCH, HOT = 64, 512, 4


def peak_mib():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds():
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def timed(fn, reps):
  """Median wall ms of `reps` calls, and the process's mean CPU ms per call
  (what the step costs the machine, whatever else runs on it)."""
  fn()  # trace, warm
  fn()
  times = []
  cpu_start = cpu_seconds()
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return 1000 * float(np.median(times)), 1000 * (cpu_seconds() - cpu_start) / reps


def measure(fn, reps):
  before = peak_mib()
  ms, cpu_ms = timed(fn, reps)
  return ms, cpu_ms, peak_mib() - before


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--sizes", default="1,4,16,64")
  args = parser.parse_args()
  mesh = dtensor.create_mesh([("batch", 4)], devices=[f"CPU:{i}" for i in range(4)])
  batch_layout = dtensor.Layout(["batch", dtensor.UNSHARDED], mesh)
  rng = np.random.default_rng(0)
  print(f"mesh of 4 logical CPUs, dim {DIM}, batch {BATCH} x {HOT} ids, lazy Adam")
  print("ms: median wall (process CPU per call)")
  print(f"{'MiB':>4} {'rows':>9} | {'tfde lookup':>16} {'tfde train':>16} | "
        f"{'naive lookup':>16} {'naive train':>18} | {'peak MiB: tfde':>14} "
        f"{'naive':>6} | {'MiB/device':>10}")
  for mib in [int(s) for s in args.sizes.split(",")]:
    vocab = mib * 2**20 // (4 * DIM)
    ids_np = rng.integers(0, vocab, size=(BATCH, HOT))
    ids = dtensor.relayout(dtensor.copy_to_mesh(
        tf.constant(ids_np, tf.int64), dtensor.Layout.replicated(mesh, 2)), batch_layout)
    table = tfde.TableConfig(name=f"t{mib}", vocabulary_size=vocab, embedding_dim=DIM,
                             optimizer="adam", combiner="sum", initializer="zeros")
    layer = tfde.dtensor.DistributedEmbedding(
        {"f": tfde.FeatureConfig(name="f", table=table)}, mesh)

    @tf.function
    def lookup(ids):
      return layer({"f": ids})["f"]

    @tf.function
    def train(ids):
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(layer({"f": ids})["f"] - 1.0))
      return layer.sparse_gradients(tape.gradient(loss, layer.gradient_sources()))

    def tfde_lookup():
      dtensor.unpack(lookup(ids))[0].numpy()

    def tfde_train():
      layer.apply_gradients(train(ids))
      dtensor.unpack(layer.tables[table.name].variable.read_value())[0][0, 0].numpy()

    lookup_ms = measure(tfde_lookup, args.reps)
    train_ms = measure(tfde_train, args.reps)

    naive = dtensor.DVariable(dtensor.call_with_layout(
        tf.zeros, dtensor.Layout(["batch", dtensor.UNSHARDED], mesh), [vocab, DIM]))

    @tf.function
    def naive_lookup(ids):
      return tf.reduce_sum(tf.gather(naive.read_value(), ids), axis=1)

    @tf.function
    def naive_train(ids):
      rows = tf.gather(naive.read_value(), ids)
      grads = 2.0 * (tf.reduce_sum(rows, axis=1, keepdims=True) - 1.0) * tf.ones_like(rows)
      flat = tf.reshape(ids, [-1, 1])
      new_rows = tf.reshape(rows - 0.01 * grads, [-1, DIM])
      naive.assign(tf.tensor_scatter_nd_update(naive.read_value(), flat, new_rows))
      return naive.read_value()[:1]

    naive_lookup_ms = measure(lambda: dtensor.unpack(naive_lookup(ids))[0].numpy(),
                              args.reps)
    naive_train_ms = measure(lambda: dtensor.unpack(naive_train(ids))[0].numpy(),
                             max(1, args.reps // 2))
    per_device = layer.tables[table.name].rows_per_shard * DIM * 4 / 2**20
    def cell(ms, cpu_ms, _):
      return f"{ms:7.1f} ({cpu_ms:6.1f})"
    print(f"{mib:>4} {vocab:>9} | {cell(*lookup_ms):>16} {cell(*train_ms):>16} | "
          f"{cell(*naive_lookup_ms):>16} {cell(*naive_train_ms):>18} | "
          f"{max(lookup_ms[2], train_ms[2]):>14.1f} "
          f"{max(naive_lookup_ms[2], naive_train_ms[2]):>6.1f} | "
          f"{per_device:>10.2f}", flush=True)
    naive = layer = None  # frees them before the next size (not `del`: closures above read them)


if __name__ == "__main__":
  main()
