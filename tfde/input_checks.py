"""What makes a feature's input malformed: the predicates that stage 0
(`tfde.inputs.flatten_feature`) asserts, naming the feature and table, and
that the refusal exchange under worker processes (`inputs.flat_features`)
computes without raising, so that a check and its refusal cannot drift
apart. Each returns a bool tensor and raises nothing.

>>> import tensorflow as tf
>>> from tfde import input_checks
>>> bool(input_checks.malformed(tf.ragged.constant([[1, 2], [3]]), None, strings=False))
False
>>> bool(input_checks.counts_fit(tf.constant(2**31, tf.int64)))
False
"""

import tensorflow as tf

from tfde.ops import checks

# bincount counts into int32 positions: a sparse batch, or a sequence
# feature's batch times its length, of more would wrap (2^32 + 6 samples
# counted as 6) or fail naming nothing.
MAX_COUNTED = 2**31 - 1


def counts_fit(batch, per_sample=1):
  """Whether `batch` samples (an int64 scalar) of `per_sample` positions
  each fit bincount's int32 lengths (no product formed: it could wrap)."""
  return tf.logical_and(batch >= 0, batch <= MAX_COUNTED // per_sample)


def bincount_length(size, countable):
  """`size` (int64) as bincount's int32 length where `countable`, else 0.
  Its refusal runs first, but a graph folds a constant size ahead of it:
  wrapped, shape inference fails naming nothing; kept, Grappler folds a
  2^31-long count."""
  return tf.cast(tf.where(countable, size, 0), tf.int32)


def input_kind(value):
  if isinstance(value, tf.RaggedTensor):
    return "ragged"
  if isinstance(value, tf.SparseTensor):
    return "sparse"
  return "dense"


def same_rows(a, b):
  """Whether `a` and `b` (int tensors of one rank, rows along axis 0) are
  equal: False, not a shape error naming neither feature nor table, where
  their lengths differ, statically or not.

  >>> print(bool(same_rows(tf.constant([0, 2, 3]), tf.constant([0, 2]))))
  False
  """
  if a.shape[0] is not None and b.shape[0] is not None:  # known when traced
    return (tf.reduce_all(tf.equal(a, b)) if a.shape[0] == b.shape[0]
            else tf.constant(False))
  # A vector's length is its size: one op, where a slice of its shape is five.
  length_a, length_b = ((tf.size(a), tf.size(b)) if a.shape.rank == b.shape.rank == 1
                        else (tf.shape(a)[0], tf.shape(b)[0]))
  common = tf.minimum(length_a, length_b)
  return tf.logical_and(tf.equal(length_a, length_b),
                        tf.reduce_all(tf.equal(a[:common], b[:common])))


def ragged_weights_match(weights, splits, num_ids):
  """Whether ragged `weights` have the ids' row `splits` (int64) and one
  value per id: weights built with validate=False may hold more or fewer
  values than their own splits say."""
  return tf.logical_and(same_rows(tf.cast(weights.row_splits, tf.int64), splits),
                        tf.equal(tf.size(weights.values, out_type=tf.int64), num_ids))


def past_int64(values):
  """Which uint64 `values` are 2^63 or more: the cast to int64 would wrap
  them to negative ids."""
  return values >= tf.constant(2**63, tf.uint64)


def sparse_structure(sparse):
  """(index count, value count, whether they match, whether every index
  lies inside the dense shape): what `inputs._reordered` checks."""
  num_indices = tf.shape(sparse.indices, out_type=tf.int64)[0]
  num_values = tf.size(sparse.values, out_type=tf.int64)
  inside = tf.reduce_all(tf.logical_and(sparse.indices >= 0,
                                        sparse.indices < sparse.dense_shape))
  return num_indices, num_values, tf.equal(num_indices, num_values), inside


def sparse_malformed(sparse):
  """Whether `inputs._reordered` refuses `sparse`, computed without raising."""
  _, _, counts_match, inside = sparse_structure(sparse)
  return tf.logical_not(tf.logical_and(counts_match, inside))


def values_of(ids):
  """The ids a dense, ragged or sparse input holds, in any order."""
  return ids.values if isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)) else ids


def batch_of(ids):
  """The samples of a ragged, sparse or dense input (int64 scalar), as
  `flatten_feature` counts them; None for a rank it refuses as it is
  built."""
  if isinstance(ids, tf.RaggedTensor):
    return ids.nrows(out_type=tf.int64)
  if isinstance(ids, tf.SparseTensor):
    return ids.dense_shape[0] if ids.shape.rank == 2 else None
  return tf.shape(ids, out_type=tf.int64)[0] if ids.shape.rank in (1, 2) else None


def malformed(ids, weights, strings):
  """Whether `flatten_feature` refuses `ids` and `weights` when it runs (a
  bool scalar computed without raising; None where nothing can fail then).
  The checks made as it is built (kinds, ranks, dtypes) raise as it is
  built, before any exchange."""
  values = values_of(ids)
  if weights is not None and input_kind(weights) != input_kind(ids):
    weights = None  # refused as it is built
  bad = []
  if values.dtype == tf.uint64 and not strings:
    bad.append(tf.reduce_any(past_int64(values)))
  if isinstance(ids, tf.RaggedTensor):
    splits = tf.cast(ids.row_splits, tf.int64)
    num_ids = tf.size(values, out_type=tf.int64)
    bad.append(tf.logical_not(checks.row_splits_valid(splits, num_ids)))
    if weights is not None:
      bad.append(tf.logical_not(ragged_weights_match(weights, splits, num_ids)))
  elif isinstance(ids, tf.SparseTensor):
    ids_malformed = sparse_malformed(ids)
    bad.append(ids_malformed)
    if ids.shape.rank == 2:  # (another rank is refused as it is built)
      bad.append(tf.logical_not(counts_fit(ids.dense_shape[0])))
    if weights is not None:
      either = tf.logical_or(ids_malformed, sparse_malformed(weights))
      # Their indices compare once sorted, which only well-formed ones can be.
      bad.append(tf.cond(either, lambda: tf.constant(True), lambda: tf.logical_not(
          same_rows(tf.sparse.reorder(weights).indices, tf.sparse.reorder(ids).indices))))
  elif weights is not None:
    bad.append(tf.logical_not(same_rows(tf.shape(weights), tf.shape(ids))))
  return tf.reduce_any(tf.stack(bad)) if bad else None
