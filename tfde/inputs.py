"""Stage 0 of a lookup: every feature's batch (dense, ragged or sparse,
with optional weights) as flat ids, row splits and weights, validated.

>>> import tensorflow as tf
>>> from tfde import inputs
>>> ids, splits, weights = inputs.flatten_feature(
...     "f", "t", tf.ragged.constant([[3, 1], [], [2]]))
>>> ids.numpy().tolist(), splits.numpy().tolist(), weights
([3, 1, 2], [0, 2, 2, 3], None)

Errors name the feature and its table, and are raised before any table
changes.
"""

import dataclasses

import tensorflow as tf

from tfde.ops import checks


@dataclasses.dataclass
class FlatFeature:
  """A feature's batch as flat ids, row splits and optional weights."""
  name: str
  table: object
  ids: tf.Tensor          # int64 [n]
  row_splits: tf.Tensor   # int64 [batch + 1]
  weights: object         # float32 [n] or None


def describe(feature_name, table_name):
  # No quotes: graph-mode Assert messages escape them.
  return f"feature {feature_name} (table {table_name})"


def _check_ids_dtype(ids, where):
  if not ids.dtype.is_integer:
    raise TypeError(f"{where}: ids must be int32 or int64, got {ids.dtype.name}")
  return tf.cast(ids, tf.int64)


def _kind(value):
  if isinstance(value, tf.RaggedTensor):
    return "ragged"
  if isinstance(value, tf.SparseTensor):
    return "sparse"
  return "dense"


def flatten_feature(feature_name, table_name, inputs, weights=None):
  """(ids int64 [n], row_splits int64 [B+1], weights float32 [n] or None).

  Dense inputs of rank 1 give one id per sample, rank 2 [batch, hotness]
  give `hotness` ids per sample; ragged inputs give their rows; sparse
  inputs [batch, hotness] give the ids present in each row. Weights must
  have the same kind and structure as the ids.
  """
  where = describe(feature_name, table_name)
  if weights is not None and _kind(weights) != _kind(inputs):
    raise ValueError(f"{where}: weights are {_kind(weights)} but the ids are "
                     f"{_kind(inputs)}; they must match")
  if isinstance(inputs, tf.RaggedTensor):
    if inputs.ragged_rank != 1 or inputs.shape.rank != 2:
      raise ValueError(f"{where}: ragged ids must be [batch, (hotness)], got "
                       f"shape {inputs.shape}")
    ids = _check_ids_dtype(inputs.values, where)
    splits = tf.cast(inputs.row_splits, tf.int64)
    w = None
    if weights is not None:
      guards = [checks.assert_that(
          tf.reduce_all(tf.equal(tf.cast(weights.row_splits, tf.int64), splits)),
          f"{where}: weights do not have the same row lengths as the ids")]
      with tf.control_dependencies(guards):
        w = tf.cast(weights.values, tf.float32)
    return ids, splits, w
  if isinstance(inputs, tf.SparseTensor):
    if inputs.shape.rank != 2:
      raise ValueError(f"{where}: sparse ids must be [batch, hotness], got "
                       f"shape {inputs.shape}")
    inputs = tf.sparse.reorder(inputs)
    ids = _check_ids_dtype(inputs.values, where)
    batch = inputs.dense_shape[0]
    counts = tf.math.bincount(tf.cast(inputs.indices[:, 0], tf.int32),
                              minlength=tf.cast(batch, tf.int32),
                              maxlength=tf.cast(batch, tf.int32), dtype=tf.int64)
    splits = tf.concat([[0], tf.cumsum(counts)], 0)
    w = None
    if weights is not None:
      weights = tf.sparse.reorder(weights)
      same = tf.logical_and(
          tf.equal(tf.shape(weights.indices)[0], tf.shape(inputs.indices)[0]),
          tf.reduce_all(tf.equal(tf.shape(weights.indices), tf.shape(inputs.indices))))
      same = tf.cond(same, lambda: tf.reduce_all(tf.equal(weights.indices,
                                                          inputs.indices)),
                     lambda: tf.constant(False))
      guards = [checks.assert_that(
          same, f"{where}: weights do not have the same indices as the ids")]
      with tf.control_dependencies(guards):
        w = tf.cast(weights.values, tf.float32)
    return ids, splits, w
  inputs = tf.convert_to_tensor(inputs)
  ids = _check_ids_dtype(inputs, where)
  rank = inputs.shape.rank
  if rank == 1:
    ids = tf.reshape(ids, [-1, 1])
  elif rank != 2:
    raise ValueError(f"{where}: dense ids must have rank 1 or 2, got shape "
                     f"{inputs.shape}")
  batch = tf.shape(ids, out_type=tf.int64)[0]
  hotness = tf.shape(ids, out_type=tf.int64)[1]
  splits = tf.range(batch + 1, dtype=tf.int64) * hotness
  w = None
  if weights is not None:
    weights = tf.convert_to_tensor(weights, tf.float32)
    if weights.shape.rank is not None and weights.shape.rank != rank:
      raise ValueError(f"{where}: weights have shape {weights.shape} but the "
                       f"ids have shape {inputs.shape}")
    guards = [checks.assert_that(
        tf.reduce_all(tf.equal(tf.shape(weights), tf.shape(inputs))),
        f"{where}: weights have shape ", tf.shape(weights),
        " but the ids have shape ", tf.shape(inputs))]
    with tf.control_dependencies(guards):
      w = tf.reshape(weights, [-1])
  return tf.reshape(ids, [-1]), splits, w


def check_id_range(ids, vocabulary_size, feature_name, table_name):
  """Fails with the first out-of-range id, its position and its table."""
  bad = checks.first_index_where((ids < 0) | (ids >= vocabulary_size))
  check = checks.assert_that(
      tf.equal(tf.size(bad), 0), describe(feature_name, table_name), ": id ",
      tf.gather(ids, bad), " at position ", bad, " is out of range [0, ",
      str(vocabulary_size), ")")
  with tf.control_dependencies([check]):
    return tf.identity(ids)
