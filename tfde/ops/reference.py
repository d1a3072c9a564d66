"""Pure-TF twins of tfde's custom ops, made of stock TensorFlow ops only.

Each function has the same signature and results as its kernel in
`native`. They are the test oracle's second opinion, the fallback when the
op library is absent, and what an exported SavedModel uses so that it
serves without tfde installed. Bad input raises the same
`tf.errors.InvalidArgumentError` as the kernel (or TypeError for an index
of another dtype), before any variable is written; a twin accepts nothing
its kernel refuses (tfde.ops.checks holds the kernels' checks).

>>> import tensorflow as tf
>>> from tfde.ops import reference
>>> unique, inverse, counts = reference.unique_with_counts(
...     tf.constant([7, 3, 7], tf.int64))
>>> unique.numpy().tolist(), inverse.numpy().tolist(), counts.numpy().tolist()
([7, 3], [0, 1, 0], [2, 1])
"""

import tensorflow as tf

from tfde.ops.checks import assert_that
from tfde.ops.checks import check
from tfde.ops.checks import check_bases
from tfde.ops.checks import check_fused_tables
from tfde.ops.checks import check_rank
from tfde.ops.checks import check_row_splits  # noqa: F401 (the twin, shared with sample_keys')
from tfde.ops.checks import check_scalars
from tfde.ops.checks import check_update_inputs
from tfde.ops.checks import check_variables
from tfde.ops.checks import dim
from tfde.ops.checks import equal
from tfde.ops.checks import first_offender
from tfde.ops.checks import first_repeat
from tfde.ops.checks import grad_rows_in_range
from tfde.ops.checks import index_tensor
from tfde.ops.checks import shape_parts
from tfde.ops.checks import shape_string
from tfde.ops.sample_keys_twin import sample_keys  # noqa: F401 (twins of their own module)
from tfde.ops.sample_keys_twin import split_sample_keys  # noqa: F401
from tfde.ops.types import BagGradients  # noqa: F401 (sparse_apply takes one)
from tfde.ops.types import int32_range

COMBINERS = ("sum", "mean", "sqrtn")


def check_combiner(combiner):
  """The kernels' attribute check (an InvalidArgumentError at once)."""
  check(combiner in COMBINERS,
        f"combiner must be one of sum, mean, sqrtn; got {combiner!r}")


def _weights_or_ones(weights, n):
  if weights is None:
    return tf.ones([n], tf.float32)
  weights = tf.cast(weights, tf.float32)
  # An empty weights tensor means "no weights", as for the kernel: n ones
  # follow it then, none otherwise. Not a tf.cond, whose two branch
  # functions cost a traced step more than the rest of this op.
  num_ones = tf.where(tf.equal(tf.size(weights, out_type=tf.int64), 0), tf.cast(n, tf.int64),
                      tf.constant(0, tf.int64))
  return tf.concat([weights, tf.ones(num_ones[None], tf.float32)], 0)


# Index inputs stay int32 or int64 as given (stock ops take either); no
# value is narrowed.


def unique_with_counts(ids):
  ids = index_tensor(ids, "ids")
  with tf.control_dependencies(check_rank(ids, 1, "ids")):
    return tf.unique_with_counts(ids, out_idx=tf.int32)


def partition_by_shard(ids, num_shards, dynamic=False):
  ids = index_tensor(ids, "ids")
  num_shards = index_tensor(num_shards, "num_shards")
  checks = check_rank(ids, 1, "ids") + check_rank(num_shards, 0, "num_shards") + [
      assert_that(num_shards > 0, "num_shards must be positive, got ", num_shards),
      assert_that(tf.cast(num_shards, tf.int64) <= 2**31 - 1, "num_shards = ",
                  num_shards, " is too large; at most 2^31 - 1 shards")]
  if not dynamic:
    none, i, value = first_offender(ids < 0, ids)
    checks.append(assert_that(none, "ids[", i, "] = ", value,
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


def check_id_range(ids, vocabulary_size, what):
  ids = index_tensor(ids, "ids")
  checks = check_rank(ids, 1, f"{what}: ids")
  wide = tf.cast(ids, tf.int64)  # a vocabulary past int32 compares exactly
  none, i, value = first_offender((wide < 0) | (wide >= vocabulary_size), ids)
  checks.append(assert_that(none, what, ": id ", value, " at position ", i,
                            " is out of range [0, ", str(vocabulary_size), ")"))
  with tf.control_dependencies(checks):
    return tf.identity(ids)


def sorted_unique_in_range(ids, num_ids):
  ids = index_tensor(ids, "ids")
  checks = check_rank(ids, 1, "ids")
  wide = tf.cast(ids, tf.int64)
  none, i, value = first_offender((wide < 0) | (wide >= num_ids), ids)
  checks.append(assert_that(none, "ids[", i, "] = ", value, " is out of range [0, ",
                            str(num_ids), ")"))
  with tf.control_dependencies(checks):
    unique = tf.sort(tf.unique(ids).y)
    return unique, tf.searchsorted(unique, ids, out_type=tf.int32)


def stamp_rows(stamps, rows, step):
  rows = index_tensor(rows, "rows")
  size = dim(stamps, 0)
  checks = check_rank(rows, 1, "rows")
  none, i, value = first_offender((rows < 0) | (tf.cast(rows, tf.int64) >= size), rows)
  checks.append(assert_that(none, "rows[", i, "] = ", value, " is out of range [0, ", size,
                            ")"))
  with tf.control_dependencies(checks):
    return scatter_stamps(stamps, rows, step)


def scatter_stamps(stamps, rows, step):
  """stamps[rows] = step by TensorFlow's scatter, which checks the rows
  itself (in its own words)."""
  return stamps.scatter_update(tf.IndexedSlices(
      tf.fill(tf.shape(rows), tf.cast(step, tf.int64)), rows))


def _ragged_checks(inverse, row_splits, weights, num_rows):
  """The kernels' checks of a ragged batch (CheckRaggedInputs and the
  values' checks): shapes first, then row_splits, then the inverse index."""
  weights_for_shape = tf.zeros([0]) if weights is None else tf.convert_to_tensor(weights)
  vectors = [inverse, row_splits, weights_for_shape]
  what = "inverse, row_splits and weights must be vectors, got shapes "
  ranks = [t.shape.rank for t in vectors]
  if None not in ranks:
    checks = check(ranks == [1, 1, 1], what,
                   ", ".join(shape_string(t.shape) for t in vectors))
  else:
    shapes = []
    for i, t in enumerate(vectors):
      shapes += ([", "] if i else []) + ["[", tf.shape(t), "]"]
    checks = check(tf.reduce_all([tf.equal(tf.rank(t), 1) for t in vectors]), what, *shapes)
  checks += check(dim(row_splits, 0) >= 1 if isinstance(dim(row_splits, 0), int) else
                  tf.size(row_splits) >= 1, "row_splits must have at least one element")
  n = tf.size(inverse, out_type=row_splits.dtype)
  with tf.control_dependencies(checks):
    checks += [
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
  none, i, value = first_offender(
      (inverse < 0) | (tf.cast(inverse, tf.int64) >= tf.cast(num_rows, tf.int64)), inverse)
  checks.append(assert_that(none, "inverse[", i, "] = ", value, " is out of range [0, ",
                            num_rows, ")"))
  return checks


def combine_coefficients(row_splits, weights, n, combiner, segment_ids=None):
  """Per id: its sample and w_i / divisor(sample), as the kernel computes.
  `segment_ids`: each id's sample where the caller has them (from splits
  it checked), else TensorFlow's from `row_splits`."""
  check_combiner(combiner)
  batch = tf.size(row_splits) - 1
  if segment_ids is None:
    segment_ids = tf.ragged.row_splits_to_segment_ids(row_splits, out_type=tf.int32)
  w = _weights_or_ones(weights, n)
  if combiner == "sum":
    return segment_ids, w
  return segment_ids, over_divisors(w, segment_ids, batch, combiner)


def over_divisors(w, segment_ids, batch, combiner):
  """Each id's weight `w` over its sample's divisor under a "mean" or
  "sqrtn" `combiner` (the sum of its sample's weights, or the root of
  their squares), 0 where that is 0."""
  # In double, as the kernel: squares of large weights overflow float32.
  w64 = tf.cast(w, tf.float64)
  if combiner == "mean":
    divisor = tf.math.unsorted_segment_sum(w64, segment_ids, batch)
  else:
    divisor = tf.sqrt(tf.math.unsorted_segment_sum(w64 * w64, segment_ids, batch))
  return tf.cast(w64 * tf.math.divide_no_nan(tf.constant(1.0, tf.float64),
                                             tf.gather(divisor, segment_ids)), tf.float32)


def _check_float(tensor, name):
  """The kernels' dtype attribute T: float32, float16 or bfloat16."""
  check(tensor.dtype in (tf.float32, tf.float16, tf.bfloat16),
        f"{name} must be float32, float16 or bfloat16, got {tensor.dtype.name}")


def embedding_combine(rows, inverse, row_splits, weights=None, combiner="sum"):
  check_combiner(combiner)
  rows = tf.convert_to_tensor(rows)
  _check_float(rows, "rows")
  inverse = index_tensor(inverse, "inverse")
  row_splits = tf.convert_to_tensor(row_splits)
  checks = check_rank(rows, 2, "rows")
  checks += _ragged_checks(inverse, row_splits, weights, dim(rows, 0))
  with tf.control_dependencies(checks):
    n = tf.size(inverse)
    segment_ids, coefficient = combine_coefficients(row_splits, weights, n, combiner)
    gathered = tf.cast(tf.gather(rows, inverse), tf.float32)
    out = tf.math.unsorted_segment_sum(gathered * coefficient[:, None],
                                       segment_ids, tf.size(row_splits) - 1)
  return tf.cast(out, rows.dtype)


def _checked_coefficients(inverse, row_splits, weights, num_unique, combiner,
                          checks=()):
  """(inverse, each id's sample, each id's coefficient), after `checks` and
  the checks of the combine's gradient inputs. The inverse comes back in
  num_unique's dtype: stock ops that count segments (unsorted_segment_sum,
  bincount) take the count in the ids' dtype, and unsorted_segment_sum
  wraps an int64 count to an int32 one."""
  check_combiner(combiner)
  inverse = index_tensor(inverse, "inverse")
  row_splits = tf.convert_to_tensor(row_splits)
  checks = list(checks) + check_rank(num_unique, 0, "num_unique")
  checks.append(assert_that(num_unique >= 0, "num_unique must be >= 0, got ", num_unique))
  checks += _ragged_checks(inverse, row_splits, weights, num_unique)
  with tf.control_dependencies(checks):
    bag_of, coefficient = combine_coefficients(row_splits, weights, tf.size(inverse),
                                               combiner)
    return tf.cast(inverse, num_unique.dtype), bag_of, coefficient


def embedding_combine_grad(grad, inverse, row_splits, weights, num_unique,
                           combiner="sum"):
  grad = tf.convert_to_tensor(grad)
  _check_float(grad, "grad")
  row_splits = tf.convert_to_tensor(row_splits)
  num_unique = index_tensor(num_unique, "num_unique")
  checks = check_rank(grad, 2, "grad")
  batch = dim(row_splits, 0) - 1 if row_splits.shape.rank == 1 else None
  if batch is not None:
    checks += check(equal(dim(grad, 0), batch), "grad has ", dim(grad, 0),
                    " rows but row_splits describes ", batch, " samples")
  inverse, segment_ids, coefficient = _checked_coefficients(
      inverse, row_splits, weights, num_unique, combiner, checks)
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


def check_sparse_update(variables, indices, grad, kind=None):
  """The kernels' checks of a sparse update's targets and rows, before any
  write: slots shaped like the table (a row-wise `kind`'s [rows, 1]), grad
  as wide, rows in range and none repeated."""
  table = variables[0]
  checks = []
  # The slots' shape: the table's, or a row-wise kind's [rows, 1].
  if kind in ROW_WISE_KINDS:
    want, want_dynamic = (tf.TensorShape([table.shape[0], 1]),
                          lambda: tf.stack([tf.shape(table)[0], 1]))
    why = (", so the slot must have shape [", dim(table, 0), ",1]")
  else:
    want, want_dynamic, why = table.shape, lambda: tf.shape(table), ()
  for v in variables[1:]:
    checks += check(v.shape == want if v.shape.is_fully_defined() and
                    want.is_fully_defined() else
                    tf.reduce_all(tf.equal(tf.shape(v), want_dynamic())),
                    f"slot variable {v.name} has shape ", *shape_parts(v),
                    " but the table has ", *shape_parts(table), *why)
  checks += check(equal(dim(grad, 1), dim(table, 1)), "grad has width ", dim(grad, 1),
                  " but the table has width ", dim(table, 1))
  num_rows = tf.cast(tf.shape(table)[0], indices.dtype)
  none, i, value = first_offender((indices < 0) | (indices >= num_rows), indices)
  checks.append(assert_that(none, "indices[", i, "] = ", value, " is out of range [0, ",
                            num_rows, ")"))
  repeat, earlier = first_repeat(indices)
  checks.append(assert_that(
      tf.equal(tf.size(repeat), 0), "indices[", repeat, "] = ",
      tf.gather(indices, repeat), " repeats indices[",
      tf.gather(earlier, repeat),
      "]; sum the gradients of a row before applying them"))
  return checks


def _f32(x):
  return tf.cast(x, tf.float32)


def select_rows(grad, grad_rows, n):
  """The gradient rows of n entries: grad[grad_rows] (checked), or the
  first n rows of grad when grad_rows is None or empty, as the kernels
  read them."""
  if grad_rows is None:
    return grad[:n]
  grad_rows = index_tensor(grad_rows, "grad_rows")
  with tf.control_dependencies([grad_rows_in_range(grad_rows, grad)]):
    if isinstance(dim(grad_rows, 0), int) and dim(grad_rows, 0) == 0:
      return grad[:n]
    return tf.gather(grad, tf.cond(tf.size(grad_rows) > 0, lambda: grad_rows,
                                   lambda: tf.range(n, dtype=grad_rows.dtype)))

# The optimizers' row formulas (Keras 3's rules), on tensors: rows[0] is the
# table's rows, rows[1:] the slots' rows; each returns the new rows.


def sgd_rows(rows, grad, learning_rate):
  return [rows[0] - _f32(learning_rate) * grad]


def adagrad_rows(rows, grad, learning_rate, epsilon):
  acc = rows[1] + grad * grad
  return [rows[0] - _f32(learning_rate) * grad / tf.sqrt(acc + _f32(epsilon)), acc]


def rowwise_adagrad_rows(rows, grad, learning_rate, epsilon):
  # FBGEMM's EXACT_ROWWISE_ADAGRAD: rows[1] is [k, 1], one value per row.
  width = tf.cast(tf.shape(grad)[1], tf.float32)
  acc = rows[1] + tf.reduce_sum(grad * grad, axis=1, keepdims=True) / width
  multiplier = _f32(learning_rate) / (tf.sqrt(acc) + _f32(epsilon))
  return [rows[0] - grad * multiplier, acc]


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
               "rowwise_adagrad": rowwise_adagrad_rows,
               "adam": lazy_adam_rows, "ftrl": ftrl_rows}
# How many optimizer slots each kind keeps beside the table.
NUM_SLOTS = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 1, "adam": 2, "ftrl": 2}
# Kinds whose slots hold one value per row ([rows, 1]), not one per element.
ROW_WISE_KINDS = frozenset({"rowwise_adagrad"})


def check_dynamic_update_kind(kind):
  """Both dynamic stores' refusal of a kind they have no update for: a
  dynamic table keeps every slot as wide as a row."""
  if kind in ROW_WISE_KINDS:
    raise ValueError(f"dynamic tables have no {kind!r} update (their slots are as "
                     "wide as a row)")


# The scalar inputs of each kind's update, in order, as the ops name them.
SCALAR_NAMES = {
    "sgd": ("learning_rate",),
    "adagrad": ("learning_rate", "epsilon"),
    "rowwise_adagrad": ("learning_rate", "epsilon"),
    "adam": ("learning_rate", "beta_1", "beta_2", "epsilon", "step"),
    "ftrl": ("learning_rate", "l1", "l2", "l2_shrinkage", "beta", "learning_rate_power"),
}


def scalar_checks(kind, scalars):
  """The kernels' checks of an update's scalar inputs (ReadParams)."""
  checks = check_scalars(scalars, SCALAR_NAMES[kind])
  if kind == "adam":
    step = _f32(scalars[4])
    checks.append(assert_that(step >= 1.0, "step must be >= 1 (1-based), got ", step))
  if kind == "ftrl":
    lr = _f32(scalars[0])
    checks.append(assert_that(lr > 0.0, "learning_rate must be positive, got ", lr))
  return checks


def sparse_apply(kind, variables, indices, grad, scalars, grad_rows=None,
                 copy_on_read=True):
  # copy_on_read only says which side copies a shared buffer (the kernels'
  # attr); TF's scatter ops below always put the variable in copy-on-read
  # mode, and the values are the same either way.
  del copy_on_read
  check(len(variables) == 1 + NUM_SLOTS[kind],
        f"{kind} updates a table and {NUM_SLOTS[kind]} slot(s), got "
        f"{len(variables)} variables")
  check(len(scalars) == len(SCALAR_NAMES[kind]),
        f"{kind} takes {len(SCALAR_NAMES[kind])} scalars "
        f"({', '.join(SCALAR_NAMES[kind])}), got {len(scalars)}")
  check_variables(variables)
  checks = scalar_checks(kind, scalars)
  indices = index_tensor(indices, "indices")
  if grad_rows is not None:
    grad_rows = index_tensor(grad_rows, "grad_rows")
  grad = grad.dense() if isinstance(grad, BagGradients) else tf.convert_to_tensor(grad)
  checks += check_update_inputs(indices, grad, grad_rows, "indices")
  with tf.control_dependencies(checks):
    grad = select_rows(grad, grad_rows, tf.size(indices))
  checks += check_sparse_update(variables, indices, grad, kind)
  with tf.control_dependencies(checks):
    rows = [tf.gather(v, indices) for v in variables]
    new_rows = ROW_UPDATES[kind](rows, grad, *scalars)
    return tf.group([v.scatter_update(tf.IndexedSlices(r, indices))
                     for v, r in zip(variables, new_rows)])


def advise_huge_pages(variables, collapse=True):
  """Stock TensorFlow has no way to advise the memory of a variable: the
  twin advises nothing (0 bytes, 0 bytes), which changes no value, as the
  kernel's advice changes none. Plain zeros: no op joins a graph."""
  del variables, collapse
  return 0, 0


def table_of_fused_rows(rows, bases):
  """Each fused row's table (-1 below the first; int64) and its row there."""
  # In int64: a base may not fit the rows' dtype (a later table's rows
  # then are simply absent).
  # The arithmetic in int64 too: TensorFlow computes int32 arithmetic of
  # GPU tensors on the host, copying them there and back.
  wide = tf.cast(rows, tf.int64)
  base = tf.constant([int(b) for b in bases], tf.int64)
  table_index = tf.searchsorted(base, wide, side="right", out_type=tf.int64) - 1
  local = wide - tf.gather(base, tf.maximum(table_index, 0))
  return table_index, tf.cast(local, rows.dtype)


def split_rows_by_table(rows, bases):
  check_bases(bases, len(bases))
  rows = index_tensor(rows, "rows")
  checks = check_rank(rows, 1, "rows")
  none, i, value = first_offender(rows < 0, rows)
  checks.append(assert_that(none, "rows[", i, "] = ", value, " is negative"))
  with tf.control_dependencies(checks):
    table_index, local = table_of_fused_rows(rows, bases)
    table_index = tf.cast(table_index, tf.int32)  # dynamic_partition's type
    positions = int32_range(tf.size(rows, out_type=tf.int64))
    return list(zip(tf.dynamic_partition(local, table_index, len(bases)),
                    tf.dynamic_partition(positions, table_index, len(bases))))


def combine_from_tables(tables, rows, bases, inverse, row_splits, weights=None,
                        combiner="sum"):
  check_combiner(combiner)
  return embedding_combine(gather_from_tables(tables, rows, bases), inverse, row_splits,
                           weights, combiner)


def gather_from_tables(tables, rows, bases):
  checks = check_fused_tables(tables, bases)
  rows = index_tensor(rows, "rows")
  checks += check_rank(rows, 1, "rows")
  with tf.control_dependencies(checks):
    count = len(tables)
    table_index, local = table_of_fused_rows(rows, bases)
    sizes = tf.cast(tf.stack([tf.shape(t)[0] for t in tables]), rows.dtype)
    none, i, value = first_offender(
        (table_index < 0) | (local >= tf.gather(sizes, tf.maximum(table_index, 0))), rows)
    checks.append(assert_that(none, "rows[", i, "] = ", value,
                              " is outside every table of the group"))
  with tf.control_dependencies(checks):
    table_index = tf.cast(tf.maximum(table_index, 0), tf.int32)
    parts = tf.dynamic_partition(local, table_index, count)
    slots = tf.dynamic_partition(int32_range(tf.size(rows, out_type=tf.int64)), table_index,
                                 count)
    # Read through the handles, as the kernel does: a tape then does not
    # watch (and copy) whole tables for a lookup that trains in backward.
    gathered = [tf.raw_ops.ResourceGather(resource=t.handle, indices=p, dtype=tf.float32)
                for t, p in zip(tables, parts)]
    return tf.dynamic_stitch(slots, gathered)


# ---- dynamic tables' initial values


_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB


def mix_keys(x):
  """splitmix64's finaliser on uint64 tensors (the kernel's MixId)."""
  shift = lambda v, k: tf.bitwise.right_shift(v, tf.constant(k, tf.uint64))
  x = tf.bitwise.bitwise_xor(x, shift(x, 30)) * tf.constant(_MIX_1, tf.uint64)
  x = tf.bitwise.bitwise_xor(x, shift(x, 27)) * tf.constant(_MIX_2, tf.uint64)
  return tf.bitwise.bitwise_xor(x, shift(x, 31))


def uniform01(key, dim, k):
  """[n, dim] float64 draws in (0, 1) for (id key, column, k)."""
  columns = tf.bitwise.left_shift(tf.range(dim, dtype=tf.int64), 3) + k
  h = mix_keys(tf.bitwise.bitwise_xor(key[:, None],
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
  seed_key = mix_keys(tf.bitcast(tf.constant([spec.seed], tf.int64), tf.uint64))
  key = mix_keys(tf.bitwise.bitwise_xor(tf.bitcast(ids, tf.uint64), seed_key))
  # The kernel's attributes are float32: the same parameters, rounded so,
  # then drawn in float64 as it does.
  a = tf.cast(tf.constant(spec.initializer_a, tf.float32), tf.float64)
  b = tf.cast(tf.constant(spec.initializer_b, tf.float32), tf.float64)
  kind = spec.initializer
  if kind == "zeros":
    v = tf.zeros([n, spec.dim], tf.float64)
  elif kind == "constant":
    v = tf.fill([n, spec.dim], a)
  elif kind == "uniform":
    v = a + (b - a) * uniform01(key, spec.dim, 0)
  elif kind == "normal":
    v = a + b * _box_muller(uniform01(key, spec.dim, 0), uniform01(key, spec.dim, 1))
  elif kind == "truncated_normal":
    # Up to four draws within two standard deviations, then clipped.
    z = _box_muller(uniform01(key, spec.dim, 6), uniform01(key, spec.dim, 7))
    for k in (2, 1, 0):
      candidate = _box_muller(uniform01(key, spec.dim, 2 * k),
                              uniform01(key, spec.dim, 2 * k + 1))
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
