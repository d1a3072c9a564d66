"""Op benchmark: tfde's lookup and lazy-Adam training step, on the C++
kernels and on the pure-TF twins, against tf.nn.embedding_lookup_sparse +
keras.optimizers.Adam, measured in one run on this machine.

Data (stated in the output): 4 tables of 1,000,000 x 64 float32, batch
4096, 20 ids per sample per table, ids Zipf(1.05) folded into the
vocabulary, sum combiner. `--quick` shrinks tables and batch for a smoke run.

The training-step ratio against tf.nn + Keras Adam is printed twice: from
the medians above, and as the median of `--rounds` rounds that alternate
the two steps (5 tfde steps, then one Keras step), so that a slow spell of
a shared machine weighs on both sides alike.

Effective GB/s counts the bytes a lookup must move, the same for every
system: forward = unique rows read + ids' rows combined + outputs written;
a training step adds the output gradients read, the row gradients written,
and for Adam the table, m and v rows read and written. The step is also
timed on dynamic tables (bench/dynamic_bench.py), which keep a row's slots
beside it.

At one replica the kernels fuse the stages around the local compute
(tfde/lookup.py): the forward combines each id's row straight from its
table, and each optimizer sums a row's gradient from the output gradient as
it applies it. Neither the gathered rows nor a [rows, dim] gradient (52 MB
each here) is written, which matters on this machine: TF's CPU allocator
hands buffers that large back to the kernel, and each fresh 4 KiB page then
costs about 1.7 us to fault in again.
"""

import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tfde  # noqa: E402
import tfde.ops  # noqa: E402
from workload import parse_args, timed  # noqa: E402  (bench/ is the script's dir)


def main():
  args, work = parse_args(__doc__, reps=7, extra=[
      ("--rounds", dict(type=int, default=5,
                        help="alternating rounds of the tfde and Keras Adam steps"))])
  tables, vocab, dim, batch, hot = (work.tables, work.vocab, work.dim,
                                    work.batch, work.hot)
  rng = np.random.default_rng(1)
  ids = work.ids(seed=0)
  unique = [len(np.unique(x)) for x in ids]
  print(f"data: {work.describe()}; unique ids per table {unique}; "
        f"TF {tf.__version__}, {os.cpu_count()} cores; median of {args.reps}")

  fwd_bytes, train_bytes = work.moved_bytes(unique)
  inputs = {f"f{t}": tf.constant(ids[t]) for t in range(tables)}
  targets = {f"f{t}": tf.constant(rng.normal(size=(batch, dim)), tf.float32)
             for t in range(tables)}
  results = {}

  def loss_of(outputs):
    return tf.add_n([tf.reduce_sum(outputs[k] * targets[k]) for k in outputs])

  # tfde, both backends: the real pipeline (ShardedLookup, one replica).
  for backend in (tfde.ops.KERNELS, tfde.ops.REFERENCE):
    with tfde.ops.backend(backend):
      lookup = tfde.lookup.ShardedLookup(work.feature_configs())

      @tf.function
      def forward(lookup=lookup):
        return lookup(inputs)

      @tf.function
      def train(lookup=lookup):
        with tf.GradientTape() as tape:
          loss = loss_of(lookup(inputs))
        tape.gradient(loss, lookup.trainable_variables)
        return loss

      results[f"tfde {backend} forward"] = timed(forward, args.reps)
      results[f"tfde {backend} train (lazy Adam)"] = timed(train, args.reps)
      if backend == tfde.ops.KERNELS:
        kernel_train = train
      if backend != tfde.ops.KERNELS:
        del lookup  # the kernels' tables stay for the interleaved rounds

  # The same step on dynamic tables (ids hashed to 64-bit keys; rows made as
  # they arrive, slots beside each row).
  from dynamic_bench import train_step_ms  # pylint: disable=g-import-not-at-top
  with tfde.ops.backend(tfde.ops.KERNELS):
    results["tfde kernels train, dynamic tables"] = train_step_ms(work, True, args.reps)[0]

  # Baseline: tf.nn.embedding_lookup_sparse, Keras Adam / SGD.
  import keras  # pylint: disable=g-import-not-at-top
  variables = [tf.Variable(tf.random.uniform((vocab, dim), -0.05, 0.05, seed=t))
               for t in range(tables)]
  sparse = []
  for t in range(tables):
    idx = np.stack(np.meshgrid(np.arange(batch), np.arange(hot), indexing="ij"), -1)
    sparse.append(tf.SparseTensor(idx.reshape(-1, 2), ids[t].reshape(-1),
                                  [batch, hot]))

  def baseline_outputs():
    return {f"f{t}": tf.nn.embedding_lookup_sparse(variables[t], sparse[t], None,
                                                   combiner="sum")
            for t in range(tables)}

  baseline_forward = tf.function(baseline_outputs)
  for name, optimizer in (("Adam", keras.optimizers.Adam(0.001)),
                          ("SGD", keras.optimizers.SGD(0.01))):
    optimizer.build(variables)

    @tf.function
    def baseline_train(optimizer=optimizer):
      with tf.GradientTape() as tape:
        loss = loss_of(baseline_outputs())
      grads = tape.gradient(loss, variables)
      optimizer.apply(grads, variables)
      return loss

    results[f"tf.nn + Keras {name} train"] = timed(
        baseline_train, max(3, args.reps // 2) if name == "Adam" else args.reps,
        warmup=1)
    if name == "Adam":
      adam_train = baseline_train
  # The target ratio again, from rounds that alternate the two steps, so a
  # slow spell of this shared machine falls on both.
  round_ratios = []
  with tfde.ops.backend(tfde.ops.KERNELS):
    for _ in range(args.rounds):
      tfde_ms = timed(kernel_train, 5, warmup=1)
      round_ratios.append(timed(adam_train, 1, warmup=0) / tfde_ms)
  results["tf.nn forward"] = timed(baseline_forward, args.reps)

  print(f"{'system':36s} {'ms':>9s} {'GB/s':>7s}")
  for name, ms in results.items():
    moved = train_bytes if "train" in name else fwd_bytes
    print(f"{name:36s} {ms:9.1f} {moved / ms / 1e6:7.2f}")
  k_fwd, r_fwd = results["tfde kernels forward"], results["tfde reference forward"]
  k_train = results["tfde kernels train (lazy Adam)"]
  print("ratios:")
  print(f"  kernel forward vs twin forward:          {r_fwd / k_fwd:6.2f}x faster "
        "(target >= 2x)")
  print(f"  kernel forward vs tf.nn forward:         "
        f"{results['tf.nn forward'] / k_fwd:6.2f}x faster")
  print(f"  kernel train vs tf.nn + Keras Adam:      "
        f"{results['tf.nn + Keras Adam train'] / k_train:6.2f}x faster (target >= 20x)")
  label = f"the same, alternating ({args.rounds} rounds):"
  print(f"  {label:41s}{statistics.median(round_ratios):6.2f}x faster (median; "
        f"min {min(round_ratios):.2f}x, max {max(round_ratios):.2f}x)")
  print(f"  kernel train vs tf.nn + Keras SGD:       "
        f"{results['tf.nn + Keras SGD train'] / k_train:6.2f}x faster")
  print(f"  kernel train vs twin train:              "
        f"{results['tfde reference train (lazy Adam)'] / k_train:6.2f}x faster")
  print(f"  dynamic-table train vs tf.nn + Keras Adam: "
        f"{results['tf.nn + Keras Adam train'] / results['tfde kernels train, dynamic tables']:6.2f}x faster")


if __name__ == "__main__":
  main()
