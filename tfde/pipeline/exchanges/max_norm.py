"""Deduplicated rows renormalised on lookup: tables with a `max_norm`
exchange their rows as stored, and each requester renormalises the rows
it combines (`tf.nn.embedding_lookup(max_norm=...)`), keeping them as
stored for the backward.

>>> import tensorflow as tf
>>> import tfde
>>> t = tfde.TableConfig(name="t", vocabulary_size=8, embedding_dim=2,
...                      max_norm=0.5, initializer=tf.keras.initializers.Ones())
>>> lookup = tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=t)})
>>> round(float(tf.norm(lookup({"f": tf.constant([[1]])})["f"])), 4)
0.5
"""

import dataclasses

import tensorflow as tf

from tfde import ops
from tfde.pipeline.exchanges import rows


@dataclasses.dataclass(frozen=True)
class RenormalizedRowsStep(rows.RowsStep):
  """A `RowsStep` whose rows were renormalised.

  Attributes (besides `rows.RowsStep`'s):
    stored_rows: the answered rows as stored.
    row_max_norm: each answered row's table's max_norm (inf for tables
      without one).
  """
  stored_rows: tf.Tensor
  row_max_norm: tf.Tensor


class RenormalizedRows(rows.DedupedRows):
  """Takes the groups a `DedupedRows` would where a table has a max_norm."""

  step_type = RenormalizedRowsStep

  @classmethod
  def takes(cls, group, choice):
    del group
    return choice.renormalizes()

  def _as_combined(self, answered, features, routed):
    # On the requester, which keeps the rows as stored for the backward.
    per_id = tf.concat([tf.fill([tf.size(f.ids)], f.table.config.max_norm or float("inf"))
                        for f in features], 0)
    row_max_norm = tf.math.unsorted_segment_max(per_id, routed.answer_index,
                                                tf.shape(answered)[0])
    return (ops.renormalize_rows(answered, row_max_norm),
            {"stored_rows": answered, "row_max_norm": row_max_norm})

  def _stored_gradient(self, step, answer_grad):
    return ops.renormalize_rows_grad(step.stored_rows, answer_grad, step.row_max_norm)
