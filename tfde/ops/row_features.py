"""Row features made of stock TensorFlow ops only, with no kernel: the
weights' gradient of a combine, max-norm renormalisation, per-row gradient
clipping, and reduced-precision (bfloat16, float16) tables, whose rows the
kernels (float32 tables) do not take; these run the same on either backend.
They build on the twins (`tfde.ops.reference`).
"""

import tensorflow as tf

from tfde.ops.checks import check
from tfde.ops.checks import check_update_inputs
from tfde.ops.checks import check_variables
from tfde.ops.checks import index_tensor
from tfde.ops.reference import ROW_UPDATES
from tfde.ops.reference import check_combiner
from tfde.ops.reference import check_sparse_update
from tfde.ops.reference import mix_keys
from tfde.ops.reference import scalar_checks
from tfde.ops.reference import select_rows
from tfde.ops.reference import table_of_fused_rows
from tfde.ops.reference import uniform01
from tfde.ops.types import BagGradients
from tfde.ops.types import int32_range


def combine_weights_grad(grad, id_rows, row_splits, weights, output, combiner="sum"):
  """d loss / d weights of `embedding_combine`: [n], one per id.

  `grad` [batch, dim] is the output's gradient, `id_rows` [n, dim] each
  id's row (as combined), `output` [batch, dim] the combined output. With
  W the sum of a sample's weights and S the root of their squares:
  sum: <g, r_i>; mean: (<g, r_i> - <g, out>) / W; sqrtn:
  (<g, r_i> - w_i <g, out> / S) / S, as `tf.nn.embedding_lookup_sparse`
  differentiates them (0 where the divisor is 0)."""
  check_combiner(combiner)
  grad = tf.cast(grad, tf.float32)
  batch = tf.size(row_splits) - 1
  segment_ids = tf.ragged.row_splits_to_segment_ids(row_splits, out_type=tf.int32)
  dots = tf.reduce_sum(tf.gather(grad, segment_ids) * tf.cast(id_rows, tf.float32), 1)
  if combiner == "sum":
    return dots
  w = tf.cast(weights, tf.float32)
  grad_dot_out = tf.gather(tf.reduce_sum(grad * tf.cast(output, tf.float32), 1),
                           segment_ids)
  if combiner == "mean":
    divisor = tf.gather(tf.math.unsorted_segment_sum(w, segment_ids, batch), segment_ids)
    return tf.math.divide_no_nan(dots - grad_dot_out, divisor)
  root = tf.gather(tf.sqrt(tf.math.unsorted_segment_sum(w * w, segment_ids, batch)),
                   segment_ids)
  return tf.math.divide_no_nan(dots - w * tf.math.divide_no_nan(grad_dot_out, root), root)


def _norm_scale(rows, max_norm):
  """Per row: max_norm / |row| where |row| > max_norm, else 1 (also where
  max_norm is inf: no limit). Float32."""
  rows = tf.cast(rows, tf.float32)
  norm = tf.norm(rows, axis=1)
  return rows, norm, tf.where(norm > max_norm, max_norm / tf.maximum(norm, 1e-30),
                              tf.ones_like(norm))


def renormalize_rows(rows, max_norm):
  """rows [k, dim] scaled to a norm of at most `max_norm` (a scalar or one
  per row; inf: no limit), as `tf.nn.embedding_lookup(max_norm=...)`
  (`tf.clip_by_norm` per row) does."""
  rows, _, scale = _norm_scale(rows, max_norm)
  return rows * scale[:, None]


def renormalize_rows_grad(rows, grad, max_norm):
  """The gradient w.r.t. the stored rows of `renormalize_rows(rows)` given
  `grad` w.r.t. its result: s (g - x <x, g> / |x|^2) with s = max_norm / |x|
  for the rows it scaled, g for the others."""
  rows, norm, scale = _norm_scale(rows, max_norm)
  grad = tf.cast(grad, tf.float32)
  projection = rows * (tf.reduce_sum(rows * grad, 1) /
                       tf.maximum(norm * norm, 1e-30))[:, None]
  scaled = norm > max_norm
  return tf.where(scaled[:, None], scale[:, None] * (grad - projection), grad)


def clip_row_gradients(grad, clipnorm=None, clipvalue=None):
  """Each row of `grad` [k, dim] scaled to an L2 norm of at most `clipnorm`
  (`tf.clip_by_norm` per row), then clipped to [-clipvalue, clipvalue]."""
  grad = tf.cast(grad, tf.float32)
  if clipnorm is not None:
    grad = renormalize_rows(grad, tf.constant(clipnorm, tf.float32))
  if clipvalue is not None:
    grad = tf.clip_by_value(grad, -clipvalue, clipvalue)
  return grad


# ---- reduced-precision (bfloat16, float16) tables: stock ops only. The
# kernels read and update float32 tables; these tables take this path on
# either backend.

ROW_DTYPES = (tf.float32, tf.bfloat16, tf.float16)


def rounding_noise(seed, step, global_rows, dim):
  """[k, dim] uniform draws in (0, 1) for stochastic rounding: a function
  of (seed, step, global row, column) only, so a table rounds the same
  whatever its replica count, and every copy of a replicated table alike."""
  salt = tf.cast(seed, tf.int64) * 1000003 + tf.cast(step, tf.int64)
  salt_key = mix_keys(tf.bitcast(tf.reshape(salt, [1]), tf.uint64))
  key = mix_keys(tf.bitwise.bitwise_xor(tf.bitcast(tf.cast(global_rows, tf.int64), tf.uint64),
                                    salt_key))
  return uniform01(key, dim, 7)


def stochastic_round(x, dtype, noise):
  """float32 `x` rounded to `dtype` (bfloat16 or float16) up or down at
  random, so that the expected result is x: the nearer neighbour y, and
  the other neighbour with probability |x - y| / (distance between them),
  drawn from `noise` (uniform in (0, 1), x's shape).

  Saturating: a finite x beyond `dtype`'s largest finite value (65504 for
  float16) is stored as that value, with x's sign, never as inf (see
  `saturates`)."""
  x = tf.cast(x, tf.float32)
  largest = float(dtype.max)
  x = tf.where(tf.math.is_finite(x), tf.clip_by_value(x, -largest, largest), x)
  nearest = tf.cast(x, dtype)
  near = tf.cast(nearest, tf.float32)
  bits = tf.bitwise.bitwise_and(tf.cast(tf.bitcast(nearest, tf.int16), tf.int32), 0xFFFF)
  sign = tf.bitwise.bitwise_and(bits, 0x8000)
  magnitude = tf.bitwise.bitwise_and(bits, 0x7FFF)
  # The other neighbour: one step away from zero if |x| lies beyond the
  # nearest value, one step towards it otherwise (never below zero).
  away = tf.abs(x) > tf.abs(near)
  other_magnitude = tf.where(away, magnitude + 1, tf.maximum(magnitude - 1, 0))
  other_bits = tf.bitwise.bitwise_or(sign, other_magnitude)
  other_bits = tf.where(other_bits > 0x7FFF, other_bits - 0x10000, other_bits)
  other = tf.bitcast(tf.cast(other_bits, tf.int16), dtype)
  gap = tf.abs(tf.cast(other, tf.float32) - near)
  probability = tf.math.divide_no_nan(tf.abs(x - near), gap)
  exact_or_special = tf.logical_or(tf.equal(x, near), tf.logical_not(tf.math.is_finite(near)))
  take_other = tf.logical_and(tf.cast(noise, tf.float32) < probability,
                              tf.logical_not(exact_or_special))
  return tf.where(take_other, other, nearest)


def saturates(x, dtype):
  """Whether some finite element of float32 `x` lies beyond `dtype`'s
  largest finite value, so `stochastic_round` saturates it (a scalar bool)."""
  x = tf.cast(x, tf.float32)
  return tf.reduce_any(tf.logical_and(tf.math.is_finite(x),
                                      tf.abs(x) > float(dtype.max)))


def gather_rows_float32(tables, rows, bases):
  """`gather_from_tables` for tables of any row dtype: float32 rows."""
  rows = index_tensor(rows, "rows")
  table_index, local = table_of_fused_rows(rows, bases)
  if len(tables) == 1:
    return tf.cast(tf.gather(tables[0], local), tf.float32)
  table_index = tf.cast(tf.maximum(table_index, 0), tf.int32)
  parts = tf.dynamic_partition(local, table_index, len(tables))
  slots = tf.dynamic_partition(int32_range(tf.size(rows, out_type=tf.int64)), table_index,
                               len(tables))
  return tf.dynamic_stitch(slots, [tf.cast(tf.gather(t, p), tf.float32)
                                   for t, p in zip(tables, parts)])


def sparse_apply_rounded(kind, variables, indices, grad, scalars, noise_of,
                         grad_rows=None, on_saturate=None):
  """`sparse_apply` for a table of reduced precision: the update computed
  in float32 from its rows (slots stay float32), the new rows rounded
  stochastically with `noise_of(indices)` ([k, dim] uniform draws). A new
  row value beyond the row type's range saturates (`stochastic_round`);
  `on_saturate(flag)` (optional) gets the scalar bool saying whether any
  did and returns an op run with the update (a table counts it)."""
  table = variables[0]
  check(table.dtype in ROW_DTYPES, f"table {table.name} has rows of "
        f"{table.dtype.name}; tables hold float32, bfloat16 or float16")
  check_variables(variables[1:])
  checks = scalar_checks(kind, scalars)
  indices = index_tensor(indices, "indices")
  grad = grad.dense() if isinstance(grad, BagGradients) else tf.convert_to_tensor(grad)
  grad = tf.cast(grad, tf.float32)
  if grad_rows is not None:
    grad_rows = index_tensor(grad_rows, "grad_rows")
  checks += check_update_inputs(indices, grad, grad_rows, "indices")
  with tf.control_dependencies(checks):
    grad = select_rows(grad, grad_rows, tf.size(indices))
  checks += check_sparse_update(variables, indices, grad, kind)
  with tf.control_dependencies(checks):
    rows = [tf.cast(tf.gather(table, indices), tf.float32)] + [
        tf.gather(v, indices) for v in variables[1:]]
    new_rows = ROW_UPDATES[kind](rows, grad, *scalars)
    counted = ([] if on_saturate is None else
               [on_saturate(saturates(new_rows[0], table.dtype))])
    new_rows[0] = stochastic_round(new_rows[0], table.dtype, noise_of(indices))
    return tf.group([v.scatter_update(tf.IndexedSlices(r, indices))
                     for v, r in zip(variables, new_rows)] + counted)
