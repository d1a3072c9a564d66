"""Input checks shared by the twins and the pipeline: errors that name the
bad value, raised eagerly at once and in graphs as Assert ops.

>>> import tensorflow as tf
>>> from tfde.ops import checks
>>> checks.first_index_where(tf.constant([False, True, True])).numpy().tolist()
[1]
>>> checks.index_tensor([0.0, 1.7], "inverse")
Traceback (most recent call last):
TypeError: inverse must be an int32 or int64 tensor, got float32
>>> try:
...   checks.assert_that(tf.constant(False), "id ", tf.constant([7]), " is bad")
... except tf.errors.InvalidArgumentError as e:
...   print(e.message)
id 7 is bad
"""

import tensorflow as tf


def message(parts):
  """The message as a string tensor: strings as they are, tensors as their
  comma-separated elements."""
  return tf.strings.join([
      p if isinstance(p, str) else tf.strings.reduce_join(
          tf.strings.as_string(tf.reshape(p, [-1])), separator=",")
      for p in parts])


def assert_that(condition, *parts):
  """Raises InvalidArgumentError with the message `parts` when `condition`
  is false.

  The message parts are strings and small tensors, concatenated. Eagerly it
  raises at once; in a graph it is an Assert op to add as a control
  dependency of whatever it guards.
  """
  if tf.executing_eagerly():
    if not bool(condition):
      raise tf.errors.InvalidArgumentError(
          None, None, message(parts).numpy().decode())
    return tf.no_op()
  return tf.debugging.Assert(condition, [message(parts)])


def index_tensor(value, name):
  """`value` as a tensor of an index dtype, int32 or int64; any other dtype
  is a TypeError naming `name`, never a cast (a float index would be
  truncated, a wider one wrapped)."""
  tensor = tf.convert_to_tensor(value)
  if tensor.dtype not in (tf.int32, tf.int64):
    raise TypeError(f"{name} must be an int32 or int64 tensor, got {tensor.dtype.name}")
  return tensor


def first_index_where(mask):
  """The first i with mask[i], as a [0]- or [1]-shaped int64 tensor."""
  return tf.reshape(tf.where(mask), [-1])[:1]



def first_repeat(values):
  """(positions of the first repeated value (a [0]- or [1]-shaped int32
  tensor), the earlier position each value first appeared at)."""
  n = tf.size(values, out_type=tf.int32)
  _, inverse = tf.unique(values, out_idx=tf.int32)
  first_position = tf.math.unsorted_segment_min(tf.range(n), inverse, n)
  earlier = tf.gather(first_position, inverse)
  return first_index_where(tf.not_equal(earlier, tf.range(n))), earlier

