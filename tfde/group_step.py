"""The value that carries one group's step from the lookup's forward to its
backward (`GroupStep`), and what the pipeline does with it on the way:
the features as one batch, the backward's dedup, the gradient's tensors.

>>> import tensorflow as tf
>>> from tfde import group_step, inputs
>>> a = inputs.FlatFeature("a", None, tf.constant([1, 2], tf.int64),
...                        tf.constant([0, 1, 2], tf.int64), None, None, None)
>>> b = inputs.FlatFeature("b", None, tf.constant([3], tf.int64),
...                        tf.constant([0, 1], tf.int64), None, None, None)
>>> splits, weights, combiner = group_step.as_one_batch([a, b], ["sum", "sum"])
>>> splits.numpy().tolist(), weights, combiner
([0, 1, 2, 3], None, 'sum')
"""

import dataclasses

import tensorflow as tf

from tfde import ops
from tfde import routing


def renormalizes(features):
  """Whether any of `features`' tables renormalises rows (max_norm)."""
  return any(f.table.config.max_norm is not None for f in features)


@dataclasses.dataclass
class GroupStep:
  """What one group's forward learned, carried to its backward.

  Attributes:
    group: the `tfde.groups.TableGroup` looked up.
    features: its features' `FlatFeature`s, in output order.
    combiners: each feature's combiner.
    replica: this replica.
    routed: stage 1's result (`tfde.routing.Routed`): what this replica
      serves, where its ids' rows arrive, the exchange plan.
    batch: the features as one ragged batch (`as_one_batch`).
    num_rows: rows the outputs read, one per unique id (one per id where
      the forward skipped the dedup).
    fused: the stages around the local compute were fused (one shard, or
      the pooled exchange's owner).
    rows: (unfused) the rows answered, one per unique id, as combined
      (after max-norm renormalisation).
    raw_rows: (unfused, max-norm tables) those rows as stored.
    row_max_norm: (max-norm tables) each answered row's table's max_norm
      (inf for tables without one).
    outputs: the features' combined outputs, float32.
    preserved: (an engine group's step) what the engine keeps from the
      forward for its update.
    deduped: `routed` holds unique requests. False only for a fused step
      whose forward needs no dedup (at one owner, or pooled); the backward
      dedups it (`deduped`) before it reads `routed`.
    pooled: (the pooled exchange) the `tfde.routing.RoutedBags` of this
      owner: `routed` and `batch` are then its rows of every sample of the
      global batch, and the outputs this replica's samples summed over the
      owners.
  """
  group: object
  features: list
  combiners: list
  replica: int
  routed: routing.Routed
  batch: tuple
  num_rows: tf.Tensor
  fused: bool
  rows: object = None
  raw_rows: object = None
  row_max_norm: object = None
  outputs: object = None
  deduped: bool = True
  # (engine groups) what the engine keeps from the forward for its update.
  preserved: object = None
  pooled: object = None


def deduped(step):
  """`step` with its requests unique (the backward's form), where the
  forward skipped the dedup (`deduped=False`: one owner, or the pooled
  exchange's owner, fused, so `routed.requested` is every id's row and
  `answer_index` the identity)."""
  if step.deduped:
    return step
  # The requests are rows of this owner (fused ids at one owner, fused
  # local rows at the pooled exchange's): deduped in row order where that
  # is cheap, so each table's update walks its rows in address order.
  unique, inverse = ops.unique_rows(step.routed.requested, step.group.row_space,
                                    step.group.device(step.replica))
  return dataclasses.replace(
      step, routed=routing.Routed(unique, None, inverse, None),
      num_rows=tf.size(unique), deduped=True)


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
  coefficients = [ops.combine_coefficients(f.row_splits, f.weights, tf.size(f.ids), combiner)[1]
                  for f, combiner in zip(features, combiners)]
  return splits, tf.concat(coefficients, 0), "sum"
