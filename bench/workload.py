"""The benchmarks' shared workload: 4 tables of 1,000,000 x 64 float32
trained with lazy Adam, batch 4096, 20 ids per sample per table drawn
Zipf(1.05) and folded into the vocabulary, sum combiner (`quick()`:
50,000 rows, batch 512)."""

import argparse
import dataclasses
import statistics
import time

import numpy as np


@dataclasses.dataclass
class Workload:
  tables: int = 4
  vocab: int = 1_000_000
  dim: int = 64
  batch: int = 4096
  hot: int = 20
  alpha: float = 1.05

  @classmethod
  def quick(cls):
    return cls(vocab=50_000, batch=512)

  def ids(self, seed=0):
    """One [batch, hot] int64 id matrix per table."""
    rng = np.random.default_rng(seed)
    return [((rng.zipf(self.alpha, size=(self.batch, self.hot)) - 1)
             % self.vocab).astype(np.int64) for _ in range(self.tables)]

  def feed(self, seed=0):
    """The one-replica benches' feed: ({feature: ids(seed) of its table},
    loss_of), where loss_of(outputs) is sum(outputs * targets), the targets
    [batch, dim] N(0, 1) draws of rng(seed + 1), one per feature."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    ids = self.ids(seed)
    rng = np.random.default_rng(seed + 1)
    inputs = {f"f{t}": tf.constant(ids[t]) for t in range(self.tables)}
    targets = {f"f{t}": tf.constant(rng.normal(size=(self.batch, self.dim)), tf.float32)
               for t in range(self.tables)}

    def loss_of(outputs):
      return tf.add_n([tf.reduce_sum(outputs[k] * targets[k]) for k in outputs])

    return inputs, loss_of

  def feature_configs(self):
    import tfde  # pylint: disable=g-import-not-at-top
    return {f"f{t}": tfde.FeatureConfig(
        name=f"f{t}", table=tfde.TableConfig(
            name=f"t{t}", vocabulary_size=self.vocab, embedding_dim=self.dim,
            optimizer=tfde.optimizers.Adam(learning_rate=0.001),
            combiner="sum", initializer="uniform", seed=t))
            for t in range(self.tables)}

  def moved_bytes(self, unique):
    """Bytes a lookup must move, the same for every system, given the
    unique ids per table: forward = unique rows read + ids' rows combined +
    outputs written; a lazy-Adam training step adds the output gradients
    read, the row gradients written, and the table, m and v rows read and
    written. Returns (forward, training step)."""
    row = self.dim * 4
    forward = sum(u * row + self.batch * self.hot * row + self.batch * row for u in unique)
    train = forward + sum(self.batch * row + u * row + 6 * u * row for u in unique)
    return forward, train

  def describe(self):
    return (f"{self.tables} tables of {self.vocab:,} x {self.dim} float32, lazy "
            f"Adam, batch {self.batch}, {self.hot} ids/sample/table, "
            f"Zipf({self.alpha}), sum combiner")


def lookup_steps(lookup, inputs, loss_of):
  """(forward, training step): tf.functions of `lookup` on `inputs`. The
  step takes the gradient of `loss_of(outputs)`, which trains the tables
  (their optimizers run in the backward), and returns the loss as [1].
  The inputs are the functions' arguments, as a real input arrives; so is
  the loss's scale (1.0): see `replica_train_step`."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  @tf.function
  def forward_of(inputs):
    return lookup(inputs)

  @tf.function
  def train_on(inputs, scale):
    with tf.GradientTape() as tape:
      loss = loss_of(lookup(inputs)) * scale
    tape.gradient(loss, lookup.trainable_variables)
    return loss[None]

  scale = tf.constant(1.0)
  return (lambda: forward_of(inputs)), (lambda: train_on(inputs, scale))


def replica_train_step(strategy, lookup):
  """A training step of `lookup` under `strategy`, a tf.function of the
  distributed inputs: each replica takes the gradient of the sum of its
  outputs, which trains the tables (their optimizers run in the
  backward).

  The sum is scaled by an argument of the function (1.0): the gradient of
  a plain sum is ones of a static shape, a constant, and TensorFlow's
  constant folding then runs the backward's exchange of it once, while
  optimizing the graph, instead of in every step, which a real loss never
  allows."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  @tf.function
  def step(inputs, scale):
    def replica_step(inputs, scale):
      with tf.GradientTape() as tape:
        out = lookup(inputs)
        loss = tf.add_n([tf.reduce_sum(o) for o in out.values()]) * scale
      tape.gradient(loss, lookup.trainable_variables)
    strategy.run(replica_step, args=(inputs, scale))

  scale = tf.constant(1.0)
  return lambda inputs: step(inputs, scale)


def timed(fn, reps, warmup=2):
  """Median milliseconds of `fn()` over `reps` runs after `warmup`."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3


def parse_args(doc, reps, extra=()):
  """(arguments, workload) of a benchmark script: --quick (the quick
  workload, 3 repetitions unless --reps says otherwise) and --reps, plus
  `extra` (name, kwargs) options."""
  parser = argparse.ArgumentParser(description=doc.split("\n")[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--reps", type=int, default=None,
                      help=f"repetitions (default {reps}; 3 with --quick)")
  for name, kwargs in extra:
    parser.add_argument(name, **kwargs)
  args = parser.parse_args()
  if args.reps is None:
    args.reps = min(reps, 3) if args.quick else reps
  elif args.reps < 1:
    parser.error(f"--reps must be at least 1, got {args.reps}")
  return args, (Workload.quick() if args.quick else Workload())
