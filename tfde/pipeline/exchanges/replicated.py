"""Replicated tables: every replica holds every row, so the forward is one
owner's (or, where rows are not combined from the tables, its rows' read
in place), and only the gradients travel: each replica's, all-gathered and
summed per row in replica order, so every copy applies the same update.
"""

import dataclasses

import tensorflow as tf

from tfde import ops
from tfde.pipeline.exchanges import base
from tfde.pipeline.exchanges import max_norm
from tfde.pipeline.exchanges import one_owner
from tfde.pipeline.exchanges import rows


class Replicated(base.Exchange):
  """Takes replicated groups at several replicas. A copy reads its rows as
  the group would at one replica: through the first of `LOCAL` that takes
  it so (a second, short policy: an exchange added to
  `tfde.pipeline.exchanges.EXCHANGES` that should also serve replicated
  tables' reads goes here too)."""

  kind = "none"   # only the gradients travel
  # How a copy reads its rows, in order of preference.
  LOCAL = (one_owner.OneOwner, max_norm.RenormalizedRows, rows.DedupedRows)

  @classmethod
  def takes(cls, group, choice):
    return group.replicated and choice.num_replicas > 1

  def __init__(self, group, comm, choice):
    super().__init__(group, comm, choice)
    alone = dataclasses.replace(choice, num_replicas=1)
    self.local = next(e for e in self.LOCAL if e.takes(group, alone))(group, comm, alone)

  def forward(self, features, combiners, fused_ids, training):
    return self.local.forward(features, combiners, fused_ids, training)

  def rows_of_ids(self, step, trained):
    return self.local.rows_of_ids(step, trained)

  def prepare_backward(self, step):
    return self.local.prepare_backward(step)

  def backward(self, step, prepared, grads, for_update):
    del for_update  # the gathered gradients are summed into a matrix
    owned, summed = self.local.backward(step, prepared, grads, for_update=False)
    device = self.group.device(step.replica)
    every_row = self.comm.all_gather(owned)
    every_grad = self.comm.all_gather(summed)
    owned, owned_inverse, _ = ops.unique_with_counts(every_row)
    return owned, ops.sum_rows_by_index(every_grad, owned_inverse, tf.size(owned), device)
