"""Stages 1 and 3 of a lookup: unique ids to their owners (`id % N`) and
the rows they serve back, with the backward of both.

>>> import tensorflow as tf
>>> from tfde import comm, routing
>>> routed = routing.route_to_owners(
...     comm.current(), tf.constant([4, 9], tf.int64), tf.constant([0, 1, 0]),
...     num_shards=1)
>>> routed.requested.numpy().tolist(), routed.plan is None
([4, 9], True)
"""

import dataclasses

import tensorflow as tf

from tfde import ops


@dataclasses.dataclass
class Routed:
  """The result of stage 1 for one replica.

  Attributes:
    requested: what this replica serves: local rows (static tables) or ids
      (dynamic tables), grouped by the replica that asked.
    counts: their sightings in the batch (dynamic tables), else None.
    answer_index: where each of this replica's ids finds its row among the
      answers of stage 3.
    plan: the exchange, or None when this replica owns every row.
  """
  requested: tf.Tensor
  counts: object
  answer_index: tf.Tensor
  plan: object


def route_to_owners(comm, unique, inverse, num_shards, counts=None, dynamic=False,
                    stamp=None, owner=None):
  """Stage 1, input distribution: the unique ids (with their counts, if
  given) grouped by owner, `id mod N` (or every id to replica `owner`, a
  table-wise table's), and sent to it. `stamp`: the step the exchange
  belongs to, checked against every replica's (`Communicator.plan`)."""
  if num_shards == 1:
    # This replica owns every row: nothing to route, and the requests are
    # already unique.
    return Routed(unique, counts, inverse, None)
  if owner is not None:
    size = tf.size(unique, out_type=tf.int32)
    owner_ids, positions = unique, tf.range(size)
    send_counts = tf.one_hot(owner, num_shards, on_value=size, off_value=0,
                             dtype=tf.int32)
  else:
    owner_ids, send_counts, positions = ops.partition_by_shard(unique, num_shards,
                                                               dynamic=dynamic)
  plan = comm.plan(send_counts, stamp=stamp)
  if counts is None:
    requested, requested_counts = comm.all_to_all(owner_ids, plan), None
  else:
    # Ids and counts travel together, as the two columns of one tensor.
    grouped_counts = tf.scatter_nd(positions[:, None], counts, tf.shape(counts))
    received = comm.all_to_all(tf.stack([owner_ids, grouped_counts], 1), plan)
    requested, requested_counts = received[:, 0], received[:, 1]
  # Where each id's row will arrive: composing the two permutations spares
  # copying the answered rows back into unique order.
  return Routed(requested, requested_counts, tf.gather(positions, inverse), plan)


def answer_requesters(comm, rows, routed):
  """Stage 3, output distribution: the rows served go back to the replicas
  that asked for them."""
  return rows if routed.plan is None else comm.all_to_all(rows, routed.plan.reversed())


def gradients_to_owners(comm, answer_grad, routed, device=None, row_space=None,
                        for_update=False):
  """The backward of stages 1 to 3: (the distinct rows or ids this replica
  serves, their gradients summed over every replica that asked).

  `row_space`: where the requests are row numbers (a static group's local
  rows), the size of their space: with `for_update`, they are then deduped
  in row order where that is cheap (`ops.unique_rows`), else by hashing.
  `for_update`: the gradients only feed a sparse update, so they come in
  the form it reads best where `device` says the rows live
  (`ops.gradients_for_update`: on a CPU, each row's received gradients
  summed as the update applies them, no [rows, dim] sum written); else a
  matrix (`ops.sum_rows_by_index`).

  Row order pays only with the bags: the update then walks the rows in
  address order and reads the received gradients in place. Summing into
  a matrix in row order writes it out of order, which was slower
  (notes/session13/owner_order_ab.txt: 47.6 against 39.9 ms at two
  replicas); bags in first-appearance order gained nothing beyond the noise
  (session 13); both together did (notes/session16/replica_ab_owner_bags.txt).
  """
  if routed.plan is None:
    return routed.requested, answer_grad
  owner_grad = comm.all_to_all(answer_grad, routed.plan)
  # Several replicas may have asked for the same row.
  owned, owned_inverse = ops.unique_rows(routed.requested, row_space if for_update else None,
                                         device)
  if for_update:
    # Each received gradient row is a sample of one id.
    one_each = tf.range(tf.size(owned_inverse, out_type=tf.int64) + 1)
    return owned, ops.gradients_for_update(owner_grad, owned_inverse, one_each, None,
                                           tf.size(owned), "sum", device=device)
  return owned, ops.sum_rows_by_index(owner_grad, owned_inverse, tf.size(owned), device)
