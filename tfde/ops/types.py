"""Values the ops pass between them: a row gradient kept as bags, and the
description of a dynamic table shard. Shared by the kernels' wrappers, the
twins and the pipeline.
"""

import dataclasses

import tensorflow as tf

from tfde.ops.checks import assert_that
from tfde.ops.checks import first_offender


def on_cpu(device):
  """Whether `device` is a CPU's: by name, or, where no device is named
  (a TF1 graph's variable left to the placer), where no GPU is visible.

  >>> on_cpu("/job:localhost/replica:0/task:0/device:CPU:0")
  True
  """
  if device:
    return "CPU" in device.upper()
  return not tf.config.list_physical_devices("GPU")


def on_gpu(device):
  """Whether the device name `device` (None or "": not known) is a GPU's.

  >>> on_gpu("/job:localhost/replica:0/task:0/device:GPU:1"), on_gpu(None)
  (True, False)
  """
  return "GPU" in (device or "").upper()


def int32_range(size):
  """0, 1, ..., size - 1 as int32, for an int64 scalar `size`.

  Made in int64 and narrowed: TensorFlow keeps int32 tensors of a GPU in
  host memory for Range and arithmetic, so an int32 range would be built
  on the host and copied to the device (0.4 ms a step for 5M ids on an
  H200).

  >>> import tensorflow as tf
  >>> int32_range(tf.constant(3, tf.int64)).numpy().tolist()
  [0, 1, 2]
  """
  return tf.cast(tf.range(size), tf.int32)


def segment_ids(row_splits, out_type=tf.int64, num_ids=None):
  """The sample of each id of a ragged batch whose splits are valid
  (checked where the batch came in): i for every id in [row_splits[i],
  row_splits[i + 1]), as `tf.ragged.row_splits_to_segment_ids` gives them
  (but int64 by default, not the splits' dtype). `num_ids`: the count of
  ids (the last split) where the caller has it.

  A binary search of each id's position in the splits, a handful of ops:
  TensorFlow's builds about 70 into a graph per call (a sixth of a traced
  4-replica step of tests/support/sharded_harness.py) to check splits that
  the pipeline has checked already. The twins keep TensorFlow's, and its
  refusals of bad splits.

  >>> import tensorflow as tf
  >>> segment_ids(tf.constant([0, 2, 2, 3], tf.int64)).numpy().tolist()
  [0, 0, 2]
  >>> segment_ids(tf.constant([0, 1, 1, 3], tf.int64), num_ids=tf.constant(3)).numpy().tolist()
  [0, 2, 2]
  >>> segment_ids(tf.constant([0], tf.int32), tf.int32).numpy().tolist()
  []
  """
  row_splits = tf.convert_to_tensor(row_splits)
  limit = row_splits[-1] if num_ids is None else tf.cast(num_ids, row_splits.dtype)
  positions = tf.range(limit, dtype=row_splits.dtype)
  # The op itself, on a batch of one (tf.searchsorted wraps it in about 20
  # ops of reshapes for any leading dimensions), over all the splits: a
  # position's upper bound there is its sample + 1 (no slice of the splits,
  # four ops).
  bound = tf.raw_ops.UpperBound(sorted_inputs=tf.expand_dims(row_splits, 0),
                                values=tf.expand_dims(positions, 0), out_type=out_type)
  return tf.squeeze(bound, 0) - 1


@dataclasses.dataclass(frozen=True)
class BagGradients:
  """Row gradients kept as the ids that read each row, so a lookup's
  backward can feed the optimizer without writing a [rows, dim] gradient
  (kernels/bag_gradients.h; TorchRec's fused backward-optimizer does the
  same). Row k's gradient is the sum of `weights[j] * output_grad[bags[j]]`
  over j in [segments[k], segments[k + 1]).

  >>> import tensorflow as tf
  >>> import tfde.ops
  >>> grads = tfde.ops.bag_gradients(
  ...     tf.constant([[1.0], [10.0]]), inverse=[0, 1, 0],
  ...     row_splits=tf.constant([0, 2, 3], tf.int64), weights=None,
  ...     num_unique=2, combiner="sum")
  >>> grads.segments.numpy().tolist(), grads.bags.numpy().tolist()
  ([0, 2, 3], [0, 1, 0])
  >>> tfde.ops.bag_gradients_dense(grads).numpy().ravel().tolist()
  [11.0, 1.0]

  Attributes:
    output_grad: [batch, dim] gradient of the lookup's output.
    segments: [rows + 1] int64, where each row's entries start.
    bags: [entries] int32, the output row (sample) of each entry.
    weights: [entries] float32, each entry's coefficient (its weight over
      the combiner's divisor).
  """
  output_grad: tf.Tensor
  segments: tf.Tensor
  bags: tf.Tensor
  weights: tf.Tensor

  @property
  def num_rows(self):
    return tf.size(self.segments, out_type=tf.int32) - 1

  def checks(self):
    """Assert ops that the bags are well formed (see the class doc)."""
    entries = tf.size(self.bags, out_type=tf.int64)
    segments = self.segments
    batch = tf.shape(self.output_grad)[0]
    none, i, value = first_offender((self.bags < 0) | (self.bags >= batch), self.bags)
    return [
        assert_that(tf.size(segments) >= 1, "segments must have at least one element"),
        assert_that(tf.equal(tf.size(self.weights, out_type=tf.int64), entries),
                    "bag_weights has ", tf.size(self.weights),
                    " elements but bags has ", entries),
        assert_that(tf.equal(segments[0], 0), "segments[0] must be 0, got ", segments[:1]),
        assert_that(tf.reduce_all(segments[1:] >= segments[:-1]),
                    "segments must be non-decreasing"),
        assert_that(tf.equal(segments[-1], entries), "segments[-1] = ", segments[-1:],
                    " must equal the number of bag entries, ", entries),
        assert_that(none, "bags[", i, "] = ", value, " is out of range [0, ", batch, ")"),
    ]

  def dense(self, sum_rows_by_index=tf.math.unsorted_segment_sum):
    """The [rows, dim] gradient matrix these bags stand for: each entry's
    output-gradient row times its weight, summed per row by
    `sum_rows_by_index(rows, index, num_rows)` (stock ops by default;
    `tfde.ops.bag_gradients_dense` sums on the kernels)."""
    with tf.control_dependencies(self.checks()):
      # (row_splits_to_segment_ids takes about a second for 200,000 rows.)
      entries = tf.range(tf.size(self.bags, out_type=tf.int64))
      row_of_entry = tf.searchsorted(self.segments[1:], entries, side="right",
                                     out_type=tf.int32)
      per_entry = (tf.gather(tf.cast(self.output_grad, tf.float32), self.bags)
                   * self.weights[:, None])
      return sum_rows_by_index(per_entry, row_of_entry, self.num_rows)


# The widest row (embedding and slots) a dynamic table stores, as its kernel
# (`TfdeDynamicTableHandle`) also refuses: 8 GiB, far past any embedding.
MAX_ROW_FLOATS = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class DynamicTableSpec:
  """What a dynamic table shard stores and how new rows start.

  Attributes:
    dim: embedding width.
    slot_initial_values: one initial value per optimizer slot; each row
      keeps its embedding and its slots side by side.
    initializer: "zeros", "constant" (a), "uniform" (a = min, b = max),
      "normal" or "truncated_normal" (a = mean, b = stddev; truncated at
      two standard deviations).
    initializer_a, initializer_b: the initializer's parameters.
    seed: seed of the per-id initial values.
    admit_after: sightings of an id before it gets a row (1: at once).
    zeros_until_admitted: lookups of ids without a row give zeros instead
      of the id's initial value.
  """

  dim: int
  slot_initial_values: tuple = ()
  initializer: str = "zeros"
  initializer_a: float = 0.0
  initializer_b: float = 0.0
  seed: int = 0
  admit_after: int = 1
  zeros_until_admitted: bool = False

  def __post_init__(self):
    # What the kernel's attributes accept, refused here for both backends.
    for name, low in (("dim", 1), ("admit_after", 1)):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"DynamicTableSpec.{name} must be an int >= {low}, "
                         f"got {value!r}")
    if not isinstance(self.seed, int) or not -2**63 <= self.seed < 2**63:
      raise ValueError(f"DynamicTableSpec.seed must be an int64, got {self.seed!r}")
    if self.initializer not in ("zeros", "constant", "uniform", "normal",
                                "truncated_normal"):
      raise ValueError(f"DynamicTableSpec.initializer: unknown {self.initializer!r}")
    if self.dim * self.num_slots > MAX_ROW_FLOATS:
      raise ValueError(f"DynamicTableSpec.dim = {self.dim} with {self.num_slots} slots is "
                       f"too wide a row: at most {MAX_ROW_FLOATS} floats")

  @property
  def num_slots(self):
    return 1 + len(self.slot_initial_values)


def zero_from(nonnegative):
  """0, of the dtype of `nonnegative` (never negative), computed from it:
  whatever takes the result reads `nonnegative` as data.

  >>> import tensorflow as tf
  >>> int(zero_from(tf.constant(7)))
  0

  Graph optimizers rewrite `0 * x` as 0 and drop `x`; none can tell that
  min(x, 0) is 0. Where a value exists only to make something run (an
  update, an exchange; see `one_read_from`), that difference decides
  whether it runs.
  """
  return tf.minimum(nonnegative, tf.zeros([], nonnegative.dtype))


def one_read_from(tensors):
  """The int64 scalar 1, computed from the sizes of `tensors` (tensors or
  `BagGradients`): an op that takes it reads them as data.

  >>> import tensorflow as tf
  >>> int(one_read_from([tf.zeros([0, 4]), tf.constant([3, 5])]))
  1

  Horovod's collectives are not stateful ops, so Grappler's dependency
  optimizer turns one whose outputs feed only control edges into a no-op:
  that rank then never joins the exchange, and its peers wait for it
  forever (a real `horovodrun` job hung so). A replica that receives an
  exchange's result only to order an update after it (one holding none of
  a table's rows) takes this value instead of a control dependency. It
  holds because an exchange's result has a first dimension unknown until
  it runs: the size of a tensor of static shape is folded to a constant.
  """
  flat = []
  for value in tensors:
    flat += ([getattr(value, f.name) for f in dataclasses.fields(value)]
             if isinstance(value, BagGradients) else [value])
  sizes = [tf.size(t, out_type=tf.int64) for t in flat if t is not None]
  return 1 + zero_from(tf.add_n(sizes))
