"""Pure-TF twins of tfde's custom ops, made of stock TensorFlow ops only.

Each function has the same signature and results as its kernel in
`native`. They are the test oracle's second opinion, the fallback when the
op library is absent, and what an exported SavedModel uses so that it
serves without tfde installed. Bad input raises the same
`tf.errors.InvalidArgumentError`, before any variable is written.

>>> import tensorflow as tf
>>> from tfde.ops import reference
>>> unique, inverse, counts = reference.unique_with_counts(
...     tf.constant([7, 3, 7], tf.int64))
>>> unique.numpy().tolist(), inverse.numpy().tolist(), counts.numpy().tolist()
([7, 3], [0, 1, 0], [2, 1])
"""

import dataclasses

import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops
from tensorflow.python.ops import resource_variable_ops


def _message(parts):
  """The message as a string tensor: strings as they are, tensors as their
  comma-separated elements."""
  return tf.strings.join([
      p if isinstance(p, str) else tf.strings.reduce_join(
          tf.strings.as_string(tf.reshape(p, [-1])), separator=",")
      for p in parts])


def _assert(condition, *message):
  """Raises InvalidArgumentError with `message` when `condition` is false.

  The message parts are strings and small tensors, concatenated. Eagerly it
  raises at once; in a graph it is an Assert op to add as a control
  dependency of whatever it guards.
  """
  if tf.executing_eagerly():
    if not bool(condition):
      raise tf.errors.InvalidArgumentError(
          None, None, _message(message).numpy().decode())
    return tf.no_op()
  return tf.debugging.Assert(condition, [_message(message)])


def first_index_where(mask):
  """The first i with mask[i], as a [0]- or [1]-shaped int64 tensor."""
  return tf.reshape(tf.where(mask), [-1])[:1]


def _weights_or_ones(weights, n):
  if weights is None:
    return tf.ones([n], tf.float32)
  weights = tf.cast(weights, tf.float32)
  # An empty weights tensor means "no weights", as for the kernel.
  return tf.cond(tf.equal(tf.size(weights), 0), lambda: tf.ones([n], tf.float32),
                 lambda: weights)


def unique_with_counts(ids):
  ids = tf.convert_to_tensor(ids)
  return tf.unique_with_counts(tf.reshape(ids, [-1]), out_idx=tf.int32)


def partition_by_shard(ids, num_shards, dynamic=False):
  ids = tf.convert_to_tensor(ids)
  num_shards = tf.cast(num_shards, tf.int32)
  checks = [_assert(num_shards > 0, "num_shards must be positive, got ",
                    num_shards)]
  if not dynamic:
    bad = first_index_where(ids < 0)
    checks.append(_assert(tf.equal(tf.size(bad), 0), "ids[", bad, "] = ",
                          tf.gather(ids, bad),
                          " is negative; a static table has rows "
                          "0..vocabulary_size-1"))
  with tf.control_dependencies(checks):
    n = tf.cast(num_shards, ids.dtype)
    shard = tf.cast(tf.math.floormod(ids, n), tf.int32)
    order = tf.argsort(shard, stable=True)
    local = ids if dynamic else tf.math.floordiv(ids, n)
    local_ids = tf.gather(local, order)
    shard_counts = tf.math.bincount(shard, minlength=num_shards,
                                    maxlength=num_shards, dtype=tf.int32)
    positions = tf.math.invert_permutation(order)
  return local_ids, shard_counts, positions


def _ragged_checks(inverse, row_splits, weights, num_rows):
  n = tf.size(inverse, out_type=row_splits.dtype)
  checks = [
      _assert(tf.size(row_splits) >= 1,
              "row_splits must have at least one element"),
      _assert(tf.equal(row_splits[0], 0), "row_splits[0] must be 0, got ",
              row_splits[:1]),
      _assert(tf.reduce_all(row_splits[1:] >= row_splits[:-1]),
              "row_splits must be non-decreasing"),
      _assert(tf.equal(row_splits[-1], n), "row_splits[-1] = ", row_splits[-1:],
              " must equal the number of ids, ", n),
  ]
  if weights is not None:
    num_weights = tf.size(weights, out_type=row_splits.dtype)
    checks.append(_assert(
        tf.logical_or(tf.equal(num_weights, 0), tf.equal(num_weights, n)),
        "weights has ", num_weights, " elements but there are ", n,
        " ids; pass one weight per id or none"))
  bad = first_index_where((inverse < 0) | (inverse >= num_rows))
  checks.append(_assert(tf.equal(tf.size(bad), 0), "inverse[", bad, "] = ",
                        tf.gather(inverse, bad), " is out of range [0, ",
                        num_rows, ")"))
  return checks


def combine_coefficients(row_splits, weights, n, combiner):
  """Per id: its sample and w_i / divisor(sample), as the kernel computes."""
  batch = tf.size(row_splits) - 1
  segment_ids = tf.ragged.row_splits_to_segment_ids(row_splits, out_type=tf.int32)
  w = _weights_or_ones(weights, n)
  if combiner == "sum":
    return segment_ids, w
  if combiner == "mean":
    divisor = tf.math.unsorted_segment_sum(w, segment_ids, batch)
  elif combiner == "sqrtn":
    divisor = tf.sqrt(tf.math.unsorted_segment_sum(w * w, segment_ids, batch))
  else:
    raise ValueError(f"combiner must be one of sum, mean, sqrtn; got {combiner!r}")
  return segment_ids, w * tf.math.divide_no_nan(1.0, tf.gather(divisor, segment_ids))


def embedding_combine(rows, inverse, row_splits, weights=None, combiner="sum"):
  rows = tf.convert_to_tensor(rows)
  inverse = tf.cast(inverse, tf.int32)
  row_splits = tf.convert_to_tensor(row_splits)
  checks = _ragged_checks(inverse, row_splits, weights, tf.shape(rows)[0])
  with tf.control_dependencies(checks):
    n = tf.size(inverse)
    segment_ids, coefficient = combine_coefficients(row_splits, weights, n, combiner)
    gathered = tf.cast(tf.gather(rows, inverse), tf.float32)
    out = tf.math.unsorted_segment_sum(gathered * coefficient[:, None],
                                       segment_ids, tf.size(row_splits) - 1)
  return tf.cast(out, rows.dtype)


def _checked_coefficients(inverse, row_splits, weights, num_unique, combiner):
  """(inverse, each id's sample, each id's coefficient), after the checks of
  the combine's gradient inputs."""
  inverse = tf.cast(inverse, tf.int32)
  row_splits = tf.convert_to_tensor(row_splits)
  checks = _ragged_checks(inverse, row_splits, weights, tf.cast(num_unique, tf.int32))
  with tf.control_dependencies(checks):
    bag_of, coefficient = combine_coefficients(row_splits, weights, tf.size(inverse),
                                               combiner)
    return tf.identity(inverse), bag_of, coefficient


def embedding_combine_grad(grad, inverse, row_splits, weights, num_unique,
                           combiner="sum"):
  grad = tf.convert_to_tensor(grad)
  num_unique = tf.cast(num_unique, tf.int32)
  inverse, segment_ids, coefficient = _checked_coefficients(inverse, row_splits, weights,
                                                            num_unique, combiner)
  per_id = tf.cast(tf.gather(grad, segment_ids), tf.float32) * coefficient[:, None]
  out = tf.math.unsorted_segment_sum(per_id, inverse, num_unique)
  return tf.cast(out, grad.dtype)


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


def bag_gradient_index(inverse, row_splits, weights, num_unique, combiner="sum"):
  num_unique = tf.cast(num_unique, tf.int32)
  inverse, bag_of, coefficient = _checked_coefficients(inverse, row_splits, weights,
                                                       num_unique, combiner)
  order = tf.argsort(inverse, stable=True)
  per_row = tf.math.bincount(inverse, minlength=num_unique, maxlength=num_unique,
                             dtype=tf.int64)
  segments = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(per_row)], 0)
  return segments, tf.gather(bag_of, order), tf.gather(coefficient, order)


def _bag_checks(grads):
  entries = tf.size(grads.bags, out_type=tf.int64)
  segments = grads.segments
  bad = first_index_where((grads.bags < 0) | (grads.bags >= tf.shape(grads.output_grad)[0]))
  return [
      _assert(tf.size(segments) >= 1, "segments must have at least one element"),
      _assert(tf.equal(tf.size(grads.weights, out_type=tf.int64), entries),
              "bag_weights has ", tf.size(grads.weights), " elements but bags has ", entries),
      _assert(tf.equal(segments[0], 0), "segments[0] must be 0, got ", segments[:1]),
      _assert(tf.reduce_all(segments[1:] >= segments[:-1]),
              "segments must be non-decreasing"),
      _assert(tf.equal(segments[-1], entries), "segments[-1] = ", segments[-1:],
              " must equal the number of bag entries, ", entries),
      _assert(tf.equal(tf.size(bad), 0), "bags[", bad, "] = ", tf.gather(grads.bags, bad),
              " is out of range [0, ", tf.shape(grads.output_grad)[0], ")"),
  ]


def bag_gradients_dense(grads):
  """The [rows, dim] gradient matrix that `grads` stands for."""
  with tf.control_dependencies(_bag_checks(grads)):
    # (row_splits_to_segment_ids takes about a second for 200,000 rows.)
    entries = tf.range(tf.size(grads.bags, out_type=tf.int64))
    row_of_entry = tf.searchsorted(grads.segments[1:], entries, side="right",
                                   out_type=tf.int32)
    per_entry = (tf.gather(tf.cast(grads.output_grad, tf.float32), grads.bags)
                 * grads.weights[:, None])
    return tf.math.unsorted_segment_sum(per_entry, row_of_entry, grads.num_rows)


def _update_checks(var, indices, grad):
  """Range and duplicate checks that must pass before any write."""
  indices = tf.convert_to_tensor(indices)
  num_rows = tf.cast(tf.shape(var)[0], indices.dtype)
  n = tf.size(indices, out_type=tf.int32)
  bad = first_index_where((indices < 0) | (indices >= num_rows))
  checks = [
      _assert(tf.equal(tf.shape(grad)[0], n), "grad has ", tf.shape(grad)[0],
              " rows but there are ", n, " indices"),
      _assert(tf.equal(tf.size(bad), 0), "indices[", bad, "] = ",
              tf.gather(indices, bad), " is out of range [0, ", num_rows, ")"),
  ]
  _, inverse = tf.unique(indices, out_idx=tf.int32)
  first_position = tf.math.unsorted_segment_min(tf.range(n), inverse, n)
  earlier = tf.gather(first_position, inverse)
  repeat = first_index_where(tf.not_equal(earlier, tf.range(n)))
  checks.append(_assert(
      tf.equal(tf.size(repeat), 0), "indices[", repeat, "] = ",
      tf.gather(indices, repeat), " repeats indices[",
      tf.gather(earlier, repeat),
      "]; sum the gradients of a row before applying them"))
  return checks


def _f32(x):
  return tf.cast(x, tf.float32)


def _select_rows(grad, grad_rows):
  """grad[grad_rows] (checked), or grad itself when grad_rows is None."""
  if grad_rows is None:
    return grad
  grad_rows = tf.cast(grad_rows, tf.int32)
  bad = first_index_where((grad_rows < 0) | (grad_rows >= tf.shape(grad)[0]))
  check = _assert(tf.equal(tf.size(bad), 0), "grad_rows[", bad, "] = ",
                  tf.gather(grad_rows, bad), " is out of range [0, ",
                  tf.shape(grad)[0], ")")
  with tf.control_dependencies([check]):
    return tf.gather(grad, grad_rows)


# The optimizers' row formulas (Keras 3's rules), on tensors: rows[0] is the
# table's rows, rows[1:] the slots' rows; each returns the new rows.


def sgd_rows(rows, grad, learning_rate):
  return [rows[0] - _f32(learning_rate) * grad]


def adagrad_rows(rows, grad, learning_rate, epsilon):
  acc = rows[1] + grad * grad
  return [rows[0] - _f32(learning_rate) * grad / tf.sqrt(acc + _f32(epsilon)), acc]


def lazy_adam_rows(rows, grad, learning_rate, beta_1, beta_2, epsilon, step):
  step, beta_1, beta_2 = _f32(step), _f32(beta_1), _f32(beta_2)
  alpha = (_f32(learning_rate) * tf.sqrt(1.0 - tf.pow(beta_2, step)) /
           (1.0 - tf.pow(beta_1, step)))
  m = rows[1] + (grad - rows[1]) * (1.0 - beta_1)
  v = rows[2] + (grad * grad - rows[2]) * (1.0 - beta_2)
  return [rows[0] - m * alpha / (tf.sqrt(v) + _f32(epsilon)), m, v]


def ftrl_rows(rows, grad, learning_rate, l1, l2, l2_shrinkage, beta,
              learning_rate_power):
  w, acc, lin = rows
  lr = _f32(learning_rate)
  power = -_f32(learning_rate_power)
  l2_total = _f32(l2) + _f32(beta) / (2.0 * lr)
  grad_to_use = grad + 2.0 * _f32(l2_shrinkage) * w
  new_acc = acc + grad * grad
  new_acc_pow = tf.pow(new_acc, power)
  lin = lin + grad_to_use - (new_acc_pow - tf.pow(acc, power)) / lr * w
  quadratic = new_acc_pow / lr + 2.0 * l2_total
  l1 = _f32(l1)
  return [(tf.clip_by_value(lin, -l1, l1) - lin) / quadratic, new_acc, lin]


ROW_UPDATES = {"sgd": sgd_rows, "adagrad": adagrad_rows,
               "adam": lazy_adam_rows, "ftrl": ftrl_rows}


def _scalar_checks(kind, scalars):
  if kind == "adam":
    step = _f32(scalars[4])
    return [_assert(step >= 1.0, "step must be >= 1 (1-based), got ", step)]
  if kind == "ftrl":
    lr = _f32(scalars[0])
    return [_assert(lr > 0.0, "learning_rate must be positive, got ", lr)]
  return []


def sparse_apply(kind, variables, indices, grad, scalars, grad_rows=None):
  if isinstance(grad, BagGradients):
    grad = bag_gradients_dense(grad)
  grad = _select_rows(grad, grad_rows)
  checks = _update_checks(variables[0], indices, grad) + _scalar_checks(kind, scalars)
  with tf.control_dependencies(checks):
    rows = [tf.gather(v, indices) for v in variables]
    new_rows = ROW_UPDATES[kind](rows, grad, *scalars)
    return tf.group([v.scatter_update(tf.IndexedSlices(r, indices))
                     for v, r in zip(variables, new_rows)])


def split_rows_by_table(rows, bases):
  rows = tf.convert_to_tensor(rows)
  bad = first_index_where(rows < 0)
  check = _assert(tf.equal(tf.size(bad), 0), "rows[", bad, "] = ", tf.gather(rows, bad),
                  " is negative")
  with tf.control_dependencies([check]):
    base = tf.constant([int(b) for b in bases], rows.dtype)
    table_index = tf.cast(tf.searchsorted(base, rows, side="right"), tf.int32) - 1
    local = rows - tf.gather(base, table_index)
    positions = tf.range(tf.size(rows, out_type=tf.int32))
    return list(zip(tf.dynamic_partition(local, table_index, len(bases)),
                    tf.dynamic_partition(positions, table_index, len(bases))))


def combine_from_tables(tables, rows, bases, inverse, row_splits, weights=None,
                        combiner="sum"):
  return embedding_combine(gather_from_tables(tables, rows, bases), inverse, row_splits,
                           weights, combiner)


def gather_from_tables(tables, rows, bases):
  rows = tf.convert_to_tensor(rows)
  count = len(tables)
  base = tf.constant([int(b) for b in bases], rows.dtype)
  table_index = tf.cast(tf.searchsorted(base, rows, side="right"), tf.int32) - 1
  local = rows - tf.gather(base, tf.maximum(table_index, 0))
  sizes = tf.cast(tf.stack([tf.shape(t)[0] for t in tables]), rows.dtype)
  bad = first_index_where((rows < 0) |
                          (local >= tf.gather(sizes, tf.maximum(table_index, 0))))
  check = _assert(tf.equal(tf.size(bad), 0), "rows[", bad, "] = ",
                  tf.gather(rows, bad), " is outside every table of the group")
  with tf.control_dependencies([check]):
    parts = tf.dynamic_partition(local, table_index, count)
    slots = tf.dynamic_partition(tf.range(tf.size(rows)), table_index, count)
    # Read through the handles, as the kernel does: a tape then does not
    # watch (and copy) whole tables for a lookup that trains in backward.
    gathered = [gen_resource_variable_ops.resource_gather(t.handle, p, tf.float32)
                for t, p in zip(tables, parts)]
    return tf.dynamic_stitch(slots, gathered)


# ---- dynamic tables


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

  @property
  def num_slots(self):
    return 1 + len(self.slot_initial_values)


_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB


def _mix(x):
  """splitmix64's finaliser on uint64 tensors (the kernel's MixId)."""
  shift = lambda v, k: tf.bitwise.right_shift(v, tf.constant(k, tf.uint64))
  x = tf.bitwise.bitwise_xor(x, shift(x, 30)) * tf.constant(_MIX_1, tf.uint64)
  x = tf.bitwise.bitwise_xor(x, shift(x, 27)) * tf.constant(_MIX_2, tf.uint64)
  return tf.bitwise.bitwise_xor(x, shift(x, 31))


def _uniform01(key, dim, k):
  """[n, dim] float64 draws in (0, 1) for (id key, column, k)."""
  columns = tf.bitwise.left_shift(tf.range(dim, dtype=tf.int64), 3) + k
  h = _mix(tf.bitwise.bitwise_xor(key[:, None],
                                  tf.bitcast(columns, tf.uint64)[None, :]))
  bits = tf.bitwise.right_shift(h, tf.constant(40, tf.uint64))
  return (tf.cast(bits, tf.float64) + 0.5) / 16777216.0


def _box_muller(u1, u2):
  return tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(6.283185307179586 * u2)


def dynamic_initial_values(spec, ids):
  """[n, dim] float32 initial embeddings of `ids`: a function of (seed, id,
  column) only, the same as the kernel's."""
  ids = tf.reshape(tf.cast(ids, tf.int64), [-1])
  n = tf.size(ids)
  seed_key = _mix(tf.bitcast(tf.constant([spec.seed], tf.int64), tf.uint64))
  key = _mix(tf.bitwise.bitwise_xor(tf.bitcast(ids, tf.uint64), seed_key))
  a = tf.constant(spec.initializer_a, tf.float64)
  b = tf.constant(spec.initializer_b, tf.float64)
  kind = spec.initializer
  if kind == "zeros":
    v = tf.zeros([n, spec.dim], tf.float64)
  elif kind == "constant":
    v = tf.fill([n, spec.dim], a)
  elif kind == "uniform":
    v = a + (b - a) * _uniform01(key, spec.dim, 0)
  elif kind == "normal":
    v = a + b * _box_muller(_uniform01(key, spec.dim, 0), _uniform01(key, spec.dim, 1))
  elif kind == "truncated_normal":
    # Up to four draws within two standard deviations, then clipped.
    z = _box_muller(_uniform01(key, spec.dim, 6), _uniform01(key, spec.dim, 7))
    for k in (2, 1, 0):
      candidate = _box_muller(_uniform01(key, spec.dim, 2 * k),
                              _uniform01(key, spec.dim, 2 * k + 1))
      z = tf.where(tf.abs(candidate) <= 2.0, candidate, z)
    v = a + b * tf.clip_by_value(z, -2.0, 2.0)
  else:
    raise ValueError(f"unknown initializer {kind!r}")
  return tf.cast(v, tf.float32)


def embeddings_or_default(spec, ids, rows, values):
  """[n, dim] embeddings of `ids`, whose rows in `values` [K, dim] are
  `rows` (-1: none): the stored row, else what the table's spec gives ids
  without a row (zeros, or the id's initial value)."""
  found = rows >= 0
  # One zero row past the end stands in for the missing (values may be
  # empty).
  padded = tf.concat([values, tf.zeros([1, spec.dim])], 0)
  stored = tf.gather(padded, tf.where(found, rows, tf.shape(values, out_type=tf.int64)[0]))
  if spec.zeros_until_admitted:
    return stored
  return tf.where(found[:, None], stored, dynamic_initial_values(spec, ids))


def _check_unique_ids(ids):
  n = tf.size(ids, out_type=tf.int32)
  _, inverse = tf.unique(ids, out_idx=tf.int32)
  first_position = tf.math.unsorted_segment_min(tf.range(n), inverse, n)
  earlier = tf.gather(first_position, inverse)
  repeat = first_index_where(tf.not_equal(earlier, tf.range(n)))
  return _assert(tf.equal(tf.size(repeat), 0), "ids[", repeat, "] = ",
                 tf.gather(ids, repeat), " repeats ids[", tf.gather(earlier, repeat),
                 "]; sum the gradients of an id before applying them")


def _find(table, keys):
  """A tf.lookup table's values for keys, as a vector of known rank."""
  return tf.reshape(table.lookup(keys), [-1])


def _local_variable(initial_value, shape, name, device):
  # A ResourceVariable built directly, outside any strategy's variable
  # creator: a shard's storage must not become a mirrored variable.
  with tf.init_scope(), tf.device(device):
    return resource_variable_ops.ResourceVariable(
        initial_value, shape=tf.TensorShape(shape), name=name, trainable=False)


def _ops_of(updates):
  """The ops of variable and table updates. A graph-mode assign returns a
  lazy read whose graph element is a read, not the assign: depending on it
  does not order later reads after the write."""
  if tf.executing_eagerly():
    return []  # eager ops run in program order
  return [u if isinstance(u, tf.Operation) else u.op for u in updates
          if u is not None]


class DynamicStoreTwin:
  """A dynamic table shard of stock TF: `tf.lookup` hash tables from id to
  row and from id to pending sightings, and variables of rows kept compact
  (eviction rebuilds them). Same behaviour as the kernel's resource.
  """

  _count = 0

  def __init__(self, spec, name, device=None):
    self.spec = spec
    s, d = spec.num_slots, spec.dim
    # Unique names: a TF1 graph shares a hash table by node name.
    DynamicStoreTwin._count += 1
    name = f"{name}_{DynamicStoreTwin._count}"
    with tf.device(device):
      self._index = tf.lookup.experimental.MutableHashTable(
          tf.int64, tf.int64, default_value=-1, name=f"{name}_index")
      self._pending_count = tf.lookup.experimental.MutableHashTable(
          tf.int64, tf.int64, default_value=0, name=f"{name}_pending_count")
      self._pending_last = tf.lookup.experimental.MutableHashTable(
          tf.int64, tf.int64, default_value=-1, name=f"{name}_pending_last")
      self._values = _local_variable(tf.zeros([0, s, d]), [None, s, d],
                                     f"{name}_values", device)
      self._keys, self._counts, self._last = [
          _local_variable(tf.zeros([0], tf.int64), [None], f"{name}_{what}", device)
          for what in ("keys", "counts", "last_seen")]

  def _new_rows(self, ids):
    """[k, slots, dim]: initial embeddings and slot values of new rows."""
    init = dynamic_initial_values(self.spec, ids)
    slots = [tf.fill(tf.shape(init), tf.constant(v, tf.float32))
             for v in self.spec.slot_initial_values]
    return tf.stack([init] + slots, axis=1)

  def _embeddings_of(self, ids):
    return embeddings_or_default(self.spec, ids, _find(self._index, ids),
                                 self._values[:, 0])

  def lookup(self, ids, counts, step, insert):
    """(rows of `ids`, the addresses of their rows after the lookup, -1 for
    ids without a row). With `insert`, each id counts `counts[i]` sightings
    at `step` and may be admitted."""
    ids = tf.reshape(tf.cast(ids, tf.int64), [-1])
    if not insert:
      return self._embeddings_of(ids), _find(self._index, ids)
    step = tf.cast(step, tf.int64)
    unique, inverse = tf.unique(ids, out_idx=tf.int32)
    seen_now = tf.math.unsorted_segment_sum(tf.cast(counts, tf.int64), inverse,
                                            tf.size(unique))
    rows = _find(self._index, unique)
    present = rows >= 0
    known_rows = tf.boolean_mask(rows, present)
    updates = [
        self._counts.scatter_add(tf.IndexedSlices(tf.boolean_mask(seen_now, present),
                                                  known_rows)),
        self._last.scatter_max(tf.IndexedSlices(
            tf.fill(tf.shape(known_rows), step), known_rows)),
    ]
    new_ids = tf.boolean_mask(unique, ~present)
    seen = _find(self._pending_count, new_ids) + tf.boolean_mask(seen_now, ~present)
    admit = seen >= self.spec.admit_after
    admitted, admitted_seen = tf.boolean_mask(new_ids, admit), tf.boolean_mask(seen, admit)
    waiting, waiting_seen = tf.boolean_mask(new_ids, ~admit), tf.boolean_mask(seen, ~admit)
    with tf.control_dependencies(_ops_of(updates)):
      # One read of the ids: the new rows' numbers and the grown id list
      # must agree (a TF1 graph could run a second read after the write).
      keys = tf.convert_to_tensor(self._keys)
      base = tf.shape(keys, out_type=tf.int64)[0]
      k = tf.size(admitted, out_type=tf.int64)
      updates += [
          self._values.assign(tf.concat([self._values, self._new_rows(admitted)], 0)),
          self._keys.assign(tf.concat([keys, admitted], 0)),
          self._counts.assign(tf.concat([self._counts, admitted_seen], 0)),
          self._last.assign(tf.concat([self._last, tf.fill([k], step)], 0)),
          self._index.insert(admitted, base + tf.range(k, dtype=tf.int64)),
          self._pending_count.remove(admitted),
          self._pending_last.remove(admitted),
          self._pending_count.insert(waiting, waiting_seen),
          self._pending_last.insert(waiting, tf.fill(tf.shape(waiting), step)),
      ]
    with tf.control_dependencies(_ops_of(updates)):
      return self._embeddings_of(ids), _find(self._index, ids)

  def apply(self, kind, ids, grad, scalars, grad_rows=None, by_address=False):
    """Applies `kind`'s update to the rows of `ids` (unique); ids without a
    row are skipped. With `by_address`, `ids` are row addresses: -1 is
    skipped, any other must be a live row. Returns how many rows changed."""
    ids = tf.reshape(tf.cast(ids, tf.int64), [-1])
    grad = _select_rows(tf.cast(grad, tf.float32), grad_rows)
    # In a TF1 graph nothing orders variable reads: read the table only
    # once the ids (which may come from this step's lookup) exist.
    with tf.control_dependencies([ids, grad]):
      return self._apply(kind, ids, grad, scalars, by_address)

  def _apply(self, kind, ids, grad, scalars, by_address):
    n = tf.size(ids, out_type=tf.int32)
    checks = [_assert(tf.equal(tf.shape(grad)[0], n), "grad has ", tf.shape(grad)[0],
                      " rows but there are ", n, " ids"),
              _assert(tf.equal(tf.shape(grad)[1], self.spec.dim), "grad has width ",
                      tf.shape(grad)[1], " but the table has width ",
                      str(self.spec.dim))] + _scalar_checks(kind, scalars)
    if by_address:
      size = tf.shape(self._keys, out_type=tf.int64)[0]
      has_row = tf.not_equal(ids, -1)
      bad = first_index_where(has_row & ((ids < 0) | (ids >= size)))
      checks.append(_assert(
          tf.equal(tf.size(bad), 0), "addresses[", bad, "] = ", tf.gather(ids, bad),
          " is not a row of the table (addresses come from this step's lookup; "
          "-1 marks an id without a row)"))
      real = tf.boolean_mask(ids, has_row)
      checks.append(_check_unique_ids(real))
    else:
      checks.append(_check_unique_ids(ids))
    with tf.control_dependencies(checks):
      rows = ids if by_address else _find(self._index, ids)
      present = rows >= 0
      rows = tf.boolean_mask(rows, present)
      current = tf.gather(self._values, rows)
      new = ROW_UPDATES[kind]([current[:, s] for s in range(self.spec.num_slots)],
                              tf.boolean_mask(grad, present), *scalars)
      update = self._values.scatter_nd_update(rows[:, None], tf.stack(new, axis=1))
    with tf.control_dependencies(_ops_of([update])):
      return tf.size(rows, out_type=tf.int64)

  def export(self):
    order = tf.argsort(self._keys, stable=True)
    pending_ids, pending_counts = [tf.reshape(x, [-1]) for x in
                                   self._pending_count.export()]
    pending_order = tf.argsort(pending_ids, stable=True)
    pending_ids = tf.gather(pending_ids, pending_order)
    return (tf.gather(self._keys, order), tf.gather(self._values, order),
            tf.gather(self._counts, order), tf.gather(self._last, order),
            pending_ids, tf.gather(pending_counts, pending_order),
            _find(self._pending_last, pending_ids))

  def import_(self, ids, values, counts, last_seen, pending_ids, pending_counts,
              pending_last_seen):
    ids = tf.cast(ids, tf.int64)
    values = tf.convert_to_tensor(values, tf.float32)
    k = tf.size(ids)
    checks = [
        _assert(tf.reduce_all(tf.equal(
            tf.shape(values), tf.stack([k, self.spec.num_slots, self.spec.dim]))),
            "values have shape ", tf.shape(values), " but the table needs [",
            k, ", ", str(self.spec.num_slots), ", ", str(self.spec.dim),
            "] (ids, slots, dim)"),
        _check_unique_ids(ids)]
    with tf.control_dependencies(checks):
      clear = [self._index.remove(self._index.export()[0]),
               self._pending_count.remove(self._pending_count.export()[0]),
               self._pending_last.remove(self._pending_last.export()[0])]
    with tf.control_dependencies(_ops_of(clear)):
      return tf.group(
          self._values.assign(values), self._keys.assign(ids),
          self._counts.assign(tf.cast(counts, tf.int64)),
          self._last.assign(tf.cast(last_seen, tf.int64)),
          self._index.insert(ids, tf.range(tf.size(ids, out_type=tf.int64))),
          self._pending_count.insert(pending_ids, tf.cast(pending_counts, tf.int64)),
          self._pending_last.insert(pending_ids, tf.cast(pending_last_seen, tf.int64)))

  def evict(self, step, max_unseen_steps, max_rows):
    """The kernel's eviction rules; returns the evicted ids, sorted."""
    step = tf.cast(step, tf.int64)
    # Each variable read once, before any write (see lookup).
    keys, last = tf.convert_to_tensor(self._keys), tf.convert_to_tensor(self._last)
    counts, values = tf.convert_to_tensor(self._counts), tf.convert_to_tensor(self._values)
    n = tf.shape(keys)[0]
    evict = tf.zeros([n], tf.bool)
    if max_unseen_steps > 0:
      evict = step - last >= max_unseen_steps
    if max_rows > 0:
      kept = tf.cast(tf.reshape(tf.where(~evict), [-1]), tf.int32)
      # Coldest first: fewest sightings, then least recent, then smallest id.
      order = tf.gather(kept, tf.argsort(tf.gather(keys, kept), stable=True))
      order = tf.gather(order, tf.argsort(tf.gather(last, order), stable=True))
      order = tf.gather(order, tf.argsort(tf.gather(counts, order), stable=True))
      excess = tf.maximum(tf.size(kept) - max_rows, 0)
      victims = order[:excess]
      evict = evict | tf.scatter_nd(victims[:, None], tf.ones_like(victims, tf.bool), [n])
    keep = tf.reshape(tf.where(~evict), [-1])
    evicted = tf.sort(tf.boolean_mask(keys, evict))
    kept_keys = tf.gather(keys, keep)
    updates = [self._index.remove(evicted)]
    with tf.control_dependencies(_ops_of(updates)):
      updates += [
          self._index.insert(kept_keys, tf.range(tf.size(keep, out_type=tf.int64))),
          self._values.assign(tf.gather(values, keep)),
          self._counts.assign(tf.gather(counts, keep)),
          self._last.assign(tf.gather(last, keep)),
          self._keys.assign(kept_keys)]
    if max_unseen_steps > 0:
      pending_ids = tf.reshape(self._pending_count.export()[0], [-1])
      stale = tf.boolean_mask(
          pending_ids, step - _find(self._pending_last, pending_ids) >= max_unseen_steps)
      updates += [self._pending_count.remove(stale), self._pending_last.remove(stale)]
    with tf.control_dependencies(_ops_of(updates)):
      return tf.identity(evicted)

  def stats(self):
    """[live rows, ids pending admission, estimated bytes held]."""
    size = tf.shape(self._keys, out_type=tf.int64)[0]
    pending = self._pending_count.size()
    row_bytes = 4 * self.spec.num_slots * self.spec.dim + 3 * 8
    # The hash tables' entries, at about 48 bytes each.
    return tf.stack([size, pending, size * (row_bytes + 48) + 2 * pending * 48])
