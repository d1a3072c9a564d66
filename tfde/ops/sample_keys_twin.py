"""The twins of the pooled exchange's key ops (kernels/sample_keys_op.cc),
in stock TensorFlow ops: a replica's ids keyed by their samples, and the
ids and row splits of the keys an owner receives.

>>> import tensorflow as tf
>>> from tfde.ops.sample_keys_twin import sample_keys, split_sample_keys
>>> keys = sample_keys(tf.constant([3, 1, 2], tf.int64), tf.constant([0, 2, 3], tf.int64),
...                    first_sample=1, stride=4)
>>> keys.numpy().tolist()
[7, 5, 10]
>>> ids, splits = split_sample_keys(keys, num_samples=3, bits=2)
>>> ids.numpy().tolist(), splits.numpy().tolist()
([3, 1, 2], [0, 0, 2, 3])
"""

import tensorflow as tf

from tfde.ops.checks import assert_that
from tfde.ops.checks import check
from tfde.ops.checks import check_rank
from tfde.ops.checks import check_row_splits
from tfde.ops.checks import check_scalars
from tfde.ops.checks import first_offender
from tfde.ops.checks import index_tensor
from tfde.ops.types import segment_ids as segment_ids_of

_INT64_MAX = 2**63 - 1


def _int64(value, name):
  return tf.cast(index_tensor(value, name), tf.int64)


def sample_keys(ids, row_splits, first_sample, stride):
  """keys[i] = (s + first_sample) * stride + ids[i], s the sample (row of
  `row_splits`) of ids[i]; every id in [0, stride), the splits a ragged
  batch's over the ids, no key past the largest int64."""
  ids, splits, first_sample, stride = (_int64(x, name) for x, name in (
      (ids, "ids"), (row_splits, "row_splits"), (first_sample, "first_sample"),
      (stride, "stride")))
  checks = (check_rank(ids, 1, "ids") + check_rank(splits, 1, "row_splits") +
            check_scalars([first_sample, stride], ["first_sample", "stride"]))
  n = tf.size(ids, out_type=tf.int64)
  samples = tf.size(splits, out_type=tf.int64) - 1
  with tf.control_dependencies(checks):
    checks += [
        assert_that(first_sample >= 0, "first_sample must be >= 0, got ", first_sample),
        assert_that(stride > 0, "stride must be positive, got ", stride)]
  with tf.control_dependencies(checks):
    checks.append(check_row_splits(splits, n, "row_splits"))
  with tf.control_dependencies(checks):
    checks.append(assert_that(
        tf.logical_or(tf.equal(samples, 0), first_sample <= _INT64_MAX // stride - samples),
        "keys of ", samples, " samples from sample ", first_sample, " at stride ", stride,
        " pass the largest int64"))
  with tf.control_dependencies(checks):
    none, i, value = first_offender((ids < 0) | (ids >= stride), ids)
    checks.append(assert_that(none, "ids[", i, "] = ", value, " is not in [0, stride = ",
                              stride, ")"))
  with tf.control_dependencies(checks):
    return keys_of_samples(ids, splits, first_sample, stride)


def keys_of_samples(ids, row_splits, first_sample, stride):
  """`sample_keys` without its checks (int64 inputs): what a GPU runs, as
  the pipeline did before the kernel, its splits checked where its batch
  came in, and no Assert's wait for the host in its step."""
  sample = segment_ids_of(row_splits, tf.int64)
  return (sample + first_sample) * stride + ids


def split_sample_keys(keys, num_samples, bits):
  """(ids, row_splits) of keys `sample * 2^bits + id` in increasing
  sample: each key's id (its remainder by 2^bits), and the [num_samples +
  1] splits of the ids by sample."""
  checks = check(0 <= bits < 63, "bits must be in [0, 63), got ", str(bits))
  keys, num_samples = _int64(keys, "keys"), _int64(num_samples, "num_samples")
  checks += check_rank(keys, 1, "keys") + check_scalars([num_samples], ["num_samples"])
  with tf.control_dependencies(checks):
    checks.append(assert_that((num_samples >= 0) & (num_samples < _INT64_MAX),
                              "num_samples must be in [0, 2^63 - 1), got ", num_samples))
  with tf.control_dependencies(checks):
    # The kernel's one pass names the first key with any fault, and the
    # fault it has (in this order).
    sample = tf.bitwise.right_shift(keys, bits)
    before = tf.concat([sample[:1], sample[:-1]], 0)
    faults = tf.stack([keys < 0, sample >= num_samples, sample < before])
    none, i, value = first_offender(tf.reduce_any(faults, 0), keys)
    # Padded by one key, where i is the size when no key is at fault.
    fault = tf.argmax(tf.gather(tf.pad(tf.cast(faults, tf.int32), [[0, 0], [0, 1]]), i,
                                axis=1))
    of_sample = tf.strings.join([" is of sample ", tf.strings.as_string(
        tf.gather(tf.pad(sample, [[0, 1]]), i)), ", "])
    said = tf.gather(tf.stack([
        tf.constant(" is negative"),
        tf.strings.join([of_sample, "not below num_samples = ",
                         tf.strings.as_string(num_samples)]),
        tf.strings.join([of_sample, "below the sample of the key before it: keys must be "
                         "in increasing sample"])]), fault)
    checks.append(assert_that(none, "keys[", i, "] = ", value, said))
  with tf.control_dependencies(checks):
    return ids_and_splits_of_keys(keys, num_samples, bits)


def ids_and_splits_of_keys(keys, num_samples, bits):
  """`split_sample_keys` without its checks (int64 inputs): what a GPU
  runs, on keys the pipeline made in increasing sample."""
  sample = tf.bitwise.right_shift(keys, bits)
  ids = tf.bitwise.bitwise_and(keys, (1 << bits) - 1)
  return ids, tf.searchsorted(sample, tf.range(num_samples + 1), out_type=tf.int64)
