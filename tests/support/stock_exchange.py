"""A test-only exchange, written as a new one would be: one module and one
line in `tfde.pipeline.exchanges.EXCHANGES`. It takes the groups one
owner would (one shard, rows combined as stored) and runs them with stock
TensorFlow ops only: a gather of every id's row, segment sums per sample,
and `tf.unique` with a segment sum per row in the backward."""

import dataclasses

import tensorflow as tf

from tfde.pipeline import exchanges


@dataclasses.dataclass(frozen=True)
class StockStep(exchanges.Step):
  """Attributes (besides `exchanges.Step`'s):
    ids: the fused ids (local rows at one shard).
    samples: each id's sample among its feature's.
    coefficients: each id's factor in its sample's output.
  """
  ids: tf.Tensor
  samples: list
  coefficients: list


class StockOneOwner(exchanges.Exchange):
  """One owner's exchange in stock ops; `forwards` counts its forwards."""

  forwards = 0
  kind = "none"

  @classmethod
  def takes(cls, group, choice):
    return exchanges.OneOwner.takes(group, choice)

  def forward(self, features, combiners, fused_ids, training):
    type(self).forwards += 1
    replica = self.comm.replica_id()
    rows = self.group.lookup_local(replica, fused_ids, None, training)
    rows = tf.split(rows, [tf.size(f.ids) for f in features]) if len(features) > 1 else [rows]
    samples, coefficients, outputs = [], [], []
    for f, f_rows, combiner in zip(features, rows, combiners):
      num_samples = tf.size(f.row_splits) - 1
      sample = tf.repeat(tf.range(num_samples), f.row_splits[1:] - f.row_splits[:-1])
      weights = tf.ones([tf.size(f.ids)]) if f.weights is None else f.weights
      if combiner == "sum":
        scale = tf.ones([num_samples])
      elif combiner == "mean":
        scale = tf.math.divide_no_nan(
            1.0, tf.math.unsorted_segment_sum(weights, sample, num_samples))
      else:
        scale = tf.math.divide_no_nan(
            1.0, tf.sqrt(tf.math.unsorted_segment_sum(weights * weights, sample, num_samples)))
      coefficient = weights * tf.gather(scale, sample)
      samples.append(sample)
      coefficients.append(coefficient)
      outputs.append(tf.math.unsorted_segment_sum(f_rows * coefficient[:, None], sample,
                                                  num_samples))
    return StockStep(features=features, combiners=combiners, replica=replica, ids=fused_ids,
                     samples=samples, coefficients=coefficients, outputs=outputs)

  def backward(self, step, prepared, grads, for_update):
    del prepared, for_update  # a [rows, width] matrix suits every update
    per_id = tf.concat([tf.gather(g, s) * c[:, None]
                        for g, s, c in zip(grads, step.samples, step.coefficients)], 0)
    rows, index = tf.unique(step.ids)
    return rows, tf.math.unsorted_segment_sum(per_id, index, tf.size(rows))
