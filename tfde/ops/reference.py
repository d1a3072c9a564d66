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

import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops

from tfde.ops.checks import assert_that
from tfde.ops.checks import first_index_where
from tfde.ops.checks import first_repeat
from tfde.ops.checks import index_tensor
from tfde.ops.types import BagGradients  # noqa: F401 (sparse_apply takes one)


def shape_string(shape):
  """A static shape as the kernels' messages write one: [4,4], ? where
  unknown."""
  shape = tf.TensorShape(shape)
  if shape.rank is None:
    return "<unknown>"
  return "[" + ",".join("?" if d is None else str(d) for d in shape.as_list()) + "]"


def check_variables(variables):
  """The kernels' check of the variables they read or update
  (kernels/variables.h): float32 matrices. Raised at once: a variable's
  dtype and rank are known before it is read."""
  for v in variables:
    if v.dtype != tf.float32 or v.shape.rank != 2:
      raise tf.errors.InvalidArgumentError(
          None, None, f"variable {v.name} must be a float32 matrix, got "
          f"{v.dtype.name} {shape_string(v.shape)}")


def _weights_or_ones(weights, n):
  if weights is None:
    return tf.ones([n], tf.float32)
  weights = tf.cast(weights, tf.float32)
  # An empty weights tensor means "no weights", as for the kernel.
  return tf.cond(tf.equal(tf.size(weights), 0), lambda: tf.ones([n], tf.float32),
                 lambda: weights)


# Index inputs stay int32 or int64 as given (stock ops take either); no
# value is narrowed.


def unique_with_counts(ids):
  ids = index_tensor(ids, "ids")
  return tf.unique_with_counts(tf.reshape(ids, [-1]), out_idx=tf.int32)


def _scalar_check(value, name):
  return assert_that(tf.equal(tf.rank(value), 0), name, " must be a scalar, got shape ",
                     tf.shape(value))


def partition_by_shard(ids, num_shards, dynamic=False):
  ids = index_tensor(ids, "ids")
  num_shards = index_tensor(num_shards, "num_shards")
  checks = [_scalar_check(num_shards, "num_shards"),
            assert_that(num_shards > 0, "num_shards must be positive, got ", num_shards),
            assert_that(tf.cast(num_shards, tf.int64) <= 2**31 - 1, "num_shards = ",
                        num_shards, " is too large; at most 2^31 - 1 shards")]
  if not dynamic:
    bad = first_index_where(ids < 0)
    checks.append(assert_that(tf.equal(tf.size(bad), 0), "ids[", bad, "] = ",
                          tf.gather(ids, bad),
                          " is negative; a static table has rows "
                          "0..vocabulary_size-1"))
  with tf.control_dependencies(checks):
    num_shards = tf.cast(num_shards, tf.int32)
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
      assert_that(tf.size(row_splits) >= 1,
              "row_splits must have at least one element"),
      assert_that(tf.equal(row_splits[0], 0), "row_splits[0] must be 0, got ",
              row_splits[:1]),
      assert_that(tf.reduce_all(row_splits[1:] >= row_splits[:-1]),
              "row_splits must be non-decreasing"),
      assert_that(tf.equal(row_splits[-1], n), "row_splits[-1] = ", row_splits[-1:],
              " must equal the number of ids, ", n),
  ]
  if weights is not None:
    num_weights = tf.size(weights, out_type=row_splits.dtype)
    checks.append(assert_that(
        tf.logical_or(tf.equal(num_weights, 0), tf.equal(num_weights, n)),
        "weights has ", num_weights, " elements but there are ", n,
        " ids; pass one weight per id or none"))
  bad = first_index_where((inverse < 0) |
                          (tf.cast(inverse, tf.int64) >= tf.cast(num_rows, tf.int64)))
  checks.append(assert_that(tf.equal(tf.size(bad), 0), "inverse[", bad, "] = ",
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
  inverse = index_tensor(inverse, "inverse")
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
  the combine's gradient inputs. The inverse comes back in num_unique's
  dtype: stock ops that count segments (unsorted_segment_sum, bincount) take
  the segment count in the ids' dtype, and unsorted_segment_sum wraps an
  int64 count to an int32 one."""
  inverse = index_tensor(inverse, "inverse")
  row_splits = tf.convert_to_tensor(row_splits)
  checks = [_scalar_check(num_unique, "num_unique"),
            assert_that(num_unique >= 0, "num_unique must be >= 0, got ", num_unique)]
  checks += _ragged_checks(inverse, row_splits, weights, num_unique)
  with tf.control_dependencies(checks):
    bag_of, coefficient = combine_coefficients(row_splits, weights, tf.size(inverse),
                                               combiner)
    return tf.cast(inverse, num_unique.dtype), bag_of, coefficient


def embedding_combine_grad(grad, inverse, row_splits, weights, num_unique,
                           combiner="sum"):
  grad = tf.convert_to_tensor(grad)
  num_unique = index_tensor(num_unique, "num_unique")
  inverse, segment_ids, coefficient = _checked_coefficients(inverse, row_splits, weights,
                                                            num_unique, combiner)
  per_id = tf.cast(tf.gather(grad, segment_ids), tf.float32) * coefficient[:, None]
  out = tf.math.unsorted_segment_sum(per_id, inverse, num_unique)
  return tf.cast(out, grad.dtype)


def bag_gradient_index(inverse, row_splits, weights, num_unique, combiner="sum"):
  num_unique = index_tensor(num_unique, "num_unique")
  inverse, bag_of, coefficient = _checked_coefficients(inverse, row_splits, weights,
                                                       num_unique, combiner)
  order = tf.argsort(inverse, stable=True)
  per_row = tf.math.bincount(inverse, minlength=num_unique, maxlength=num_unique,
                             dtype=tf.int64)
  segments = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(per_row)], 0)
  return segments, tf.gather(bag_of, order), tf.gather(coefficient, order)


def bag_gradients_dense(grads):
  """The [rows, dim] gradient matrix that `grads` stands for."""
  return grads.dense()


def _update_checks(var, indices, grad):
  """Range and duplicate checks that must pass before any write."""
  indices = index_tensor(indices, "indices")
  num_rows = tf.cast(tf.shape(var)[0], indices.dtype)
  n = tf.size(indices, out_type=tf.int32)
  bad = first_index_where((indices < 0) | (indices >= num_rows))
  checks = [
      assert_that(tf.equal(tf.shape(grad)[0], n), "grad has ", tf.shape(grad)[0],
              " rows but there are ", n, " indices"),
      assert_that(tf.equal(tf.size(bad), 0), "indices[", bad, "] = ",
              tf.gather(indices, bad), " is out of range [0, ", num_rows, ")"),
  ]
  repeat, earlier = first_repeat(indices)
  checks.append(assert_that(
      tf.equal(tf.size(repeat), 0), "indices[", repeat, "] = ",
      tf.gather(indices, repeat), " repeats indices[",
      tf.gather(earlier, repeat),
      "]; sum the gradients of a row before applying them"))
  return checks


def _f32(x):
  return tf.cast(x, tf.float32)


def select_rows(grad, grad_rows):
  """grad[grad_rows] (checked), or grad itself when grad_rows is None."""
  if grad_rows is None:
    return grad
  grad_rows = index_tensor(grad_rows, "grad_rows")
  bad = first_index_where((grad_rows < 0) |
                          (grad_rows >= tf.shape(grad, out_type=grad_rows.dtype)[0]))
  check = assert_that(tf.equal(tf.size(bad), 0), "grad_rows[", bad, "] = ",
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


def scalar_checks(kind, scalars):
  if kind == "adam":
    step = _f32(scalars[4])
    return [assert_that(step >= 1.0, "step must be >= 1 (1-based), got ", step)]
  if kind == "ftrl":
    lr = _f32(scalars[0])
    return [assert_that(lr > 0.0, "learning_rate must be positive, got ", lr)]
  return []


def sparse_apply(kind, variables, indices, grad, scalars, grad_rows=None):
  check_variables(variables)
  if isinstance(grad, BagGradients):
    grad = bag_gradients_dense(grad)
  grad = select_rows(grad, grad_rows)
  checks = _update_checks(variables[0], indices, grad) + scalar_checks(kind, scalars)
  with tf.control_dependencies(checks):
    rows = [tf.gather(v, indices) for v in variables]
    new_rows = ROW_UPDATES[kind](rows, grad, *scalars)
    return tf.group([v.scatter_update(tf.IndexedSlices(r, indices))
                     for v, r in zip(variables, new_rows)])


def split_rows_by_table(rows, bases):
  rows = index_tensor(rows, "rows")
  bad = first_index_where(rows < 0)
  check = assert_that(tf.equal(tf.size(bad), 0), "rows[", bad, "] = ", tf.gather(rows, bad),
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
  check_variables(tables)
  rows = index_tensor(rows, "rows")
  count = len(tables)
  base = tf.constant([int(b) for b in bases], rows.dtype)
  table_index = tf.cast(tf.searchsorted(base, rows, side="right"), tf.int32) - 1
  local = rows - tf.gather(base, tf.maximum(table_index, 0))
  sizes = tf.cast(tf.stack([tf.shape(t)[0] for t in tables]), rows.dtype)
  bad = first_index_where((rows < 0) |
                          (local >= tf.gather(sizes, tf.maximum(table_index, 0))))
  check = assert_that(tf.equal(tf.size(bad), 0), "rows[", bad, "] = ",
                  tf.gather(rows, bad), " is outside every table of the group")
  with tf.control_dependencies([check]):
    parts = tf.dynamic_partition(local, table_index, count)
    slots = tf.dynamic_partition(tf.range(tf.size(rows)), table_index, count)
    # Read through the handles, as the kernel does: a tape then does not
    # watch (and copy) whole tables for a lookup that trains in backward.
    gathered = [gen_resource_variable_ops.resource_gather(t.handle, p, tf.float32)
                for t, p in zip(tables, parts)]
    return tf.dynamic_stitch(slots, gathered)




# ---- dynamic tables' initial values


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

