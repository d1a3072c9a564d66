"""Pooled partial sums: every id travels to its owner with its sample;
each owner sums its rows of every sample of the global batch straight
from its tables, and each replica adds the owners' partial sums of its
samples (TorchRec's row-wise sharding of pooled features;
`tfde.routing.route_bags_to_owners`). Backward, every owner gets the
global batch's output gradient, and from there its step is one owner's.
Which row-wise groups take it: `tfde.exchange_kind`.
"""

import dataclasses

import tensorflow as tf

from tfde import exchange_kind
from tfde import ops
from tfde import routing
from tfde.pipeline import batches
from tfde.pipeline.exchanges import base


@dataclasses.dataclass(frozen=True)
class PartialSumsStep(base.Step):
  """One group's step through the exchange of partial sums: its `outputs`
  are every owner's partial sums added.

  Attributes (besides `base.Step`'s):
    bags: this owner's rows of every sample of the global batch, as
      routed (`tfde.routing.RoutedBags`).
  """
  bags: routing.RoutedBags


class PartialSums(base.Exchange):
  """Takes the row-wise groups whose features pool, where that pays or a
  plan says so (`tfde.exchange_kind.pools_partials`)."""

  kind = "partial sums"

  @classmethod
  def takes(cls, group, choice):
    return exchange_kind.pools_partials(choice.exchange, group, choice.configs, choice.plan)

  def forward(self, features, combiners, fused_ids, training):
    del training
    group, replica = self.group, self.comm.replica_id()
    bags = routing.route_bags_to_owners(
        self.comm, fused_ids, batches.as_one_batch(features, combiners), group.num_shards,
        group.row_space, stamp=group.step(replica))
    partials = group.combine_local(
        replica, bags.requested, ops.int32_range(tf.size(bags.requested, out_type=tf.int64)),
        self._batch(bags))
    # That was this owner's part of every sample of the global batch: this
    # replica's samples are every owner's parts summed.
    out = routing.sum_partials(self.comm, partials, bags)
    return PartialSumsStep(features=features, combiners=combiners, replica=replica,
                           bags=bags, outputs=base.split_outputs(out, features, group.width))

  @staticmethod
  def _batch(bags):
    """The owner's bags as one ragged batch of coefficients' sums."""
    return bags.row_splits, bags.weights, "sum"

  def rows_of_ids(self, step, trained):
    # The owners summed the rows; each id's own row comes from its owner
    # now, in id order (this exchange only where weights are trained).
    per_id = routing.rows_to_requesters(
        self.comm, self.group.lookup_local(step.replica, step.bags.requested, None, False),
        step.bags)
    rows = base.split_by_feature(per_id, step.features)
    return [rows[i] for i in trained]

  def prepare_backward(self, step):
    return ops.unique_rows(step.bags.requested, self.group.row_space,
                           self.group.device(step.replica))

  def backward(self, step, prepared, grads, for_update):
    # The gradient of an owner's partial sums is the global batch's output
    # gradient.
    output_grad = routing.output_gradients_to_owners(self.comm, base.output_gradient(grads),
                                                     step.bags)
    unique, inverse = prepared
    return base.gradients_at_one_owner(unique, inverse, self._batch(step.bags), output_grad,
                                       self.group.device(step.replica), for_update)
