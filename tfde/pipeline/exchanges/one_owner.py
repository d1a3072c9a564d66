"""One owner: this replica holds every row its features read (one replica,
or a table replicated on every one), and the outputs combine each id's row
straight from the tables. Nothing travels; the forward needs no dedup
(about half of its time at one replica) and writes no rows; the backward
dedups, only when a gradient is taken (the updates need unique rows), and
sums each row's gradient from the output gradient as the update applies
it (TorchRec's batched tables do the same).

>>> import tensorflow as tf
>>> import tfde
>>> t = tfde.TableConfig(name="t", vocabulary_size=8, embedding_dim=2,
...                      initializer=tf.keras.initializers.Ones())
>>> lookup = tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=t)})
>>> lookup({"f": tf.constant([[1, 2]])})["f"].numpy().tolist()
[[1.0, 1.0]]
"""

import dataclasses

import tensorflow as tf

from tfde import ops
from tfde.pipeline import batches
from tfde.pipeline.exchanges import base


@dataclasses.dataclass(frozen=True)
class OneOwnerStep(base.Step):
  """One group's step at one owner.

  Attributes (besides `base.Step`'s):
    ids: the features' fused ids: the local rows of every id, in order.
    batch: the features as one ragged batch (`batches.as_one_batch`).
  """
  ids: tf.Tensor
  batch: tuple


class OneOwner(base.Exchange):
  """Takes static float32 groups of one shard whose tables keep rows as
  stored (no max_norm), but a replicated group at several replicas, whose
  copies must apply the same update (`replicated.Replicated`)."""

  kind = "none"

  @classmethod
  def takes(cls, group, choice):
    return (group.num_shards == 1 and group.fuses_local and not choice.renormalizes() and
            not (group.replicated and choice.num_replicas > 1))

  def forward(self, features, combiners, fused_ids, training):
    del training
    group, replica = self.group, self.comm.replica_id()
    batch = batches.as_one_batch(features, combiners)
    if ops.types.on_cpu(group.device(replica)):
      # On a CPU each feature reads its own table by its own ids (the fused
      # ids and batch are the backward's). A GPU's op waits on the device
      # for its checks, so there one op serves every feature.
      outputs = base.set_output_shapes(
          group.combine_each_local(replica, features, combiners), features, group.width)
    else:
      out = group.combine_local(replica, fused_ids,
                                ops.int32_range(tf.size(fused_ids, out_type=tf.int64)), batch)
      outputs = base.split_outputs(out, features, group.width)
    return OneOwnerStep(features=features, combiners=combiners, replica=replica,
                        ids=fused_ids, batch=batch, outputs=outputs)

  def rows_of_ids(self, step, trained):
    rows = base.split_by_feature(
        self.group.lookup_local(step.replica, step.ids, None, False), step.features)
    return [rows[i] for i in trained]

  def prepare_backward(self, step):
    # Deduped in row order where that is cheap, so each table's update
    # walks its rows in address order.
    return ops.unique_rows(step.ids, self.group.row_space, self.group.device(step.replica))

  def backward(self, step, prepared, grads, for_update):
    unique, inverse = prepared
    return base.gradients_at_one_owner(unique, inverse, step.batch,
                                       base.output_gradient(grads),
                                       self.group.device(step.replica), for_update)
