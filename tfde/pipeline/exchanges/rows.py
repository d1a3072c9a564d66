"""Deduplicated rows: each replica dedups its ids, sends each owner the
local rows (or, for dynamic tables, the ids with their sightings) it must
serve, and gets their rows back (TorchRec's row-wise sharding, its
`input_dist` / `compute` / `output_dist`). Backward, each id's gradient
travels to its owner, which sums what every replica sent per row.

>>> import tensorflow as tf
>>> import tfde
>>> t = tfde.TableConfig(name="t", vocabulary_size=8, embedding_dim=2,
...                      dtype="bfloat16")
>>> lookup = tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=t)})
>>> lookup({"f": tf.constant([[1, 2]])})["f"].shape
TensorShape([1, 2])
"""

import dataclasses

import tensorflow as tf

from tfde import ops
from tfde import routing
from tfde.pipeline import batches
from tfde.pipeline.exchanges import base


@dataclasses.dataclass(frozen=True)
class RowsStep(base.Step):
  """One group's step through the exchange of rows.

  Attributes (besides `base.Step`'s):
    routed: stage 1's result (`tfde.routing.Routed`): what this replica
      serves, where its ids' rows arrive, the exchange's plan.
    batch: the features as one ragged batch (`batches.as_one_batch`).
    num_rows: the rows answered, one per unique id.
    rows: those rows, as combined.
  """
  routed: routing.Routed
  batch: tuple
  num_rows: tf.Tensor
  rows: tf.Tensor


class DedupedRows(base.Exchange):
  """Takes every group no other exchange takes: the rows of unique ids
  travel."""

  step_type = RowsStep

  @classmethod
  def takes(cls, group, choice):
    del group, choice
    return True

  @property
  def kind(self):
    return "rows" if self.group.num_shards > 1 else "none"

  def forward(self, features, combiners, fused_ids, training):
    group, replica = self.group, self.comm.replica_id()
    routed, num_rows = self._input_dist(fused_ids, replica)
    # Stage 2, then 3: the owners read the rows asked of them and send them back.
    served = group.lookup_local(replica, routed.requested, routed.counts, training)
    answered = routing.answer_requesters(self.comm, served, routed)
    rows, kept = self._as_combined(answered, features, routed)
    outputs = [ops.embedding_combine(rows, index, f.row_splits, f.weights, c)
               for f, index, c in zip(features,
                                      base.split_by_feature(routed.answer_index, features),
                                      combiners)]
    return self.step_type(features=features, combiners=combiners, replica=replica,
                          routed=routed, batch=batches.as_one_batch(features, combiners),
                          num_rows=num_rows, rows=rows, outputs=outputs, **kept)

  def _input_dist(self, fused_ids, replica):
    """Stage 1: dedup, group the unique ids by owner, and send each owner
    what it must serve. (the routed requests, how many unique ids)."""
    group = self.group
    if group.row_space is None:  # ids, not rows (dynamic tables: with their counts)
      unique, inverse, counts = ops.unique_with_counts(fused_ids)
      counts = tf.cast(counts, tf.int64) if group.routes_ids else None
    else:
      # Fused ids lie below the owners' row space times N. Deduped in
      # increasing order where the bitmap is cheap, each owner receives
      # one increasing run of rows from each replica: its gather reads
      # them in address order.
      unique, inverse = ops.unique_rows(fused_ids, group.row_space * group.num_shards,
                                        group.device(replica))
      counts = None
    routed = routing.route_to_owners(
        self.comm, unique, inverse, group.num_shards, counts=counts,
        dynamic=group.routes_ids,
        stamp=group.step(replica) if group.num_shards > 1 else None,
        owner=group.owner)
    return routed, tf.size(unique)

  def _as_combined(self, answered, features, routed):
    """(the answered rows as the outputs combine them, the other fields of
    this exchange's step)."""
    del features, routed
    return answered, {}

  def _stored_gradient(self, step, answer_grad):
    """The gradient of the rows as stored, from that of the rows combined."""
    del step
    return answer_grad

  def rows_of_ids(self, step, trained):
    indices = base.split_by_feature(step.routed.answer_index, step.features)
    return [tf.gather(step.rows, indices[i]) for i in trained]

  def answer_gradients(self, step, grads):
    """One gradient row per answered row (so already grouped by owner)."""
    splits, weights, combiner = step.batch
    answer_grad = ops.embedding_combine_grad(base.output_gradient(grads),
                                             step.routed.answer_index, splits, weights,
                                             step.num_rows, combiner)
    return self._stored_gradient(step, answer_grad)

  def backward(self, step, prepared, grads, for_update):
    del prepared
    group = self.group
    return routing.gradients_to_owners(
        self.comm, self.answer_gradients(step, grads), step.routed,
        group.device(step.replica), row_space=group.row_space,
        for_update=for_update and group.fuses_local)
