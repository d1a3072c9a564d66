"""What every exchange (`tfde.pipeline.exchanges`) does with a group's
step: the features as one batch, the gradient's tensors.

>>> import tensorflow as tf
>>> from tfde import inputs
>>> from tfde.pipeline import batches
>>> a = inputs.FlatFeature("a", None, tf.constant([1, 2], tf.int64),
...                        tf.constant([0, 1, 2], tf.int64), None, None, None)
>>> b = inputs.FlatFeature("b", None, tf.constant([3], tf.int64),
...                        tf.constant([0, 1], tf.int64), None, None, None)
>>> splits, weights, combiner = batches.as_one_batch([a, b], ["sum", "sum"])
>>> splits.numpy().tolist(), weights, combiner
([0, 1, 2, 3], None, 'sum')
"""

import dataclasses

import tensorflow as tf

from tfde import ops


@dataclasses.dataclass(frozen=True)
class Carried:
  """A value the backward carries to a group's update as it is, never
  mapped (an engine's preserved forward outputs, whose structure and
  static fields its update needs intact)."""
  value: object


def map_tensors(fn, grads):
  """`fn` applied to a gradient's tensors: a tensor, the tensor fields of a
  `BagGradients`, or those in lists and tuples of them (an engine group's);
  names and `Carried` values are kept. The same structure back."""
  if isinstance(grads, ops.BagGradients):
    return dataclasses.replace(grads, **{
        f.name: fn(getattr(grads, f.name)) for f in dataclasses.fields(grads)
        if isinstance(getattr(grads, f.name), tf.Tensor)})
  if isinstance(grads, Carried):
    return grads
  if isinstance(grads, (list, tuple)):
    return type(grads)(map_tensors(fn, g) for g in grads)
  if isinstance(grads, str):
    return grads
  return fn(grads)


def tensors_of(grads):
  """The tensors of a gradient (a tensor or a `BagGradients`)."""
  found = []
  map_tensors(found.append, grads)
  return found


def as_one_batch(features, combiners):
  """The features as one ragged batch: (row_splits, weights, combiner).

  Several features concatenate their samples, so one combine or gradient
  op serves them all. Features of one combiner keep it (where only some
  are weighted, the others weigh 1): the kernels then compute each
  sample's divisor as they combine. Mixed combiners are folded into
  per-id coefficients, the weights of a "sum"."""
  if len(features) == 1:
    return features[0].row_splits, features[0].weights, combiners[0]
  splits, offset = [tf.zeros([1], tf.int64)], tf.constant(0, tf.int64)
  for f in features:
    splits.append(f.row_splits[1:] + offset)
    offset += f.row_splits[-1]
  splits = tf.concat(splits, 0)
  if len(set(combiners)) == 1:
    if all(f.weights is None for f in features):
      return splits, None, combiners[0]
    return splits, tf.concat([tf.ones([tf.size(f.ids)]) if f.weights is None else f.weights
                              for f in features], 0), combiners[0]
  coefficients = [ops.id_coefficients(f.row_splits, f.weights, tf.size(f.ids), combiner)
                  for f, combiner in zip(features, combiners)]
  return splits, tf.concat(coefficients, 0), "sum"
