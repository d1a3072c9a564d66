"""Stages 1 and 3 of a lookup, with the backward of both: unique ids to
their owners (`id % N`) and the rows they serve back; or, for row-wise
groups by default, every id with its sample to its owner and each owner's
partial sums of the samples back (`route_bags_to_owners`).

>>> import tensorflow as tf
>>> from tfde import comm, routing
>>> routed = routing.route_to_owners(
...     comm.current(), tf.constant([4, 9], tf.int64), tf.constant([0, 1, 0]),
...     num_shards=1)
>>> routed.requested.numpy().tolist(), routed.plan is None
([4, 9], True)
"""

import dataclasses
import functools

import tensorflow as tf

from tfde import comm as comm_lib
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


def _in_name_scope(name):
  """Builds the decorated stage under `name`: each exchange shows in graphs
  and profiles (`tests/unit/test_sharded.py` checks the one built against
  `exchanges()` by it)."""
  def decorate(stage):
    @functools.wraps(stage)
    def scoped(*args, **kwargs):
      with tf.name_scope(name):
        return stage(*args, **kwargs)
    return scoped
  return decorate


@_in_name_scope("rows_exchange")
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
  (bench/sharded_bench.py: 47.6 against 39.9 ms at two
  replicas); bags in first-appearance order gained nothing beyond the
  noise; both together did.
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


@dataclasses.dataclass
class RoutedBags:
  """Stage 1 of the pooled exchange, for one replica (`route_bags_to_owners`).

  Attributes:
    requested: the local rows of every id this replica owns, from every
      replica's batch, grouped by sample of the global batch (not deduped).
    row_splits: [global samples + 1]: `requested[row_splits[b]:
      row_splits[b + 1]]` are sample b's rows here. Replica r's samples
      follow replica r - 1's.
    weights: each requested row's coefficient in its sample's sum (its
      weight over the combiner's divisor), or None where every one is 1
      (an unweighted sum; the ones travel only between worker processes).
    partials: the exchange of the partial sums, `[global samples, width]`
      on each owner, back to the replicas whose samples they are.
    plan: the exchange of the ids (`requested` arrived by it).
    positions: where each of this replica's ids went in what it sent, so
      that rows answered per request come back in id order
      (`rows_to_requesters`).
  """
  requested: tf.Tensor
  row_splits: tf.Tensor
  weights: object
  partials: object
  plan: object
  positions: tf.Tensor


def sample_key_bits(row_space, num_shards):
  """The bits a fused id takes under its sample in the pooled exchange's
  keys (`route_bags_to_owners`), or None where the keys would not fit.

  A key is `sample * N * 2^bits + fused id`; with `N * 2^bits` below 2^31
  an int64 key holds 2^32 samples of the global batch, more than the
  exchanges take: their splits count in int32.

  >>> sample_key_bits(1000, 4), sample_key_bits(2**28, 4), sample_key_bits(2**28 + 1, 4)
  (10, 28, None)
  """
  bits = max(int(row_space - 1).bit_length(), 1)
  return bits if num_shards << bits < 2**31 else None


@_in_name_scope("partial_sums_exchange")
def route_bags_to_owners(comm, fused_ids, batch, num_shards, row_space, stamp=None):
  """Stage 1 of the pooled exchange: every id of this replica's `batch`
  (row splits, weights, combiner over `fused_ids`) to its owner (`id mod
  N`) with its sample and coefficient (none for an unweighted sum in one
  process), so that each owner sums its rows of
  every sample of the global batch (a `RoutedBags`), and the replicas add
  the owners' partial sums (`sum_partials`): TorchRec's row-wise sharding.

  At a few owners this moves far fewer bytes than the rows of the unique
  ids: one [samples, width] partial per owner and replica each way against
  one row per unique id (at many owners with few ids per sample, the
  rows are fewer). No rows are gathered or copied between replicas, and
  the owners read their rows' gradients from the output gradients in
  place, as one owner does.

  `fused_ids` are int64 (`tfde.groups.TableGroup.fused_ids`); the
  batch's weights are None or one per id, as stage 0 checked them (not the
  kernels' empty tensor for none).

  >>> import tensorflow as tf
  >>> from tfde import comm
  >>> bags = route_bags_to_owners(comm.current(), tf.constant([3, 1, 3], tf.int64),
  ...                             (tf.constant([0, 2, 3], tf.int64), None, "mean"),
  ...                             num_shards=1, row_space=4)
  >>> bags.requested.numpy().tolist(), bags.row_splits.numpy().tolist()
  ([3, 1, 3], [0, 2, 3])
  >>> bags.weights.numpy().tolist()
  [0.5, 0.5, 1.0]
  """
  splits, weights, combiner = batch
  samples = tf.size(splits, out_type=tf.int32) - 1
  every_samples = comm.gather_flags(samples[None])[:, 0]
  me = comm.replica_id()
  # Summed in int64, so that no offset wraps silently. Past 2^31 - 1
  # samples is still not supported: tf.size above counts a group's fused
  # batch in int32 (in a graph it refuses more; eagerly it wraps), and the
  # exchanges' splits count in int32.
  every_batch = tf.cast(every_samples, tf.int64)
  offset = tf.reduce_sum(every_batch[:me])
  global_samples = tf.reduce_sum(every_batch)
  # The sample travels inside the id: with rows below 2^bits, (sample *
  # N * 2^bits + id) has the id's owner (mod N), and its quotient by N is
  # (sample * 2^bits + local row), so one partition and one exchange carry
  # both, and the owner splits them with a mask and a shift.
  bits = sample_key_bits(row_space, num_shards)
  if bits is None:
    raise ValueError(f"{row_space} rows at {num_shards} owners leave no room "
                     "for the sample in an int64 id: exchange rows instead")
  keyed = ops.sample_keys(fused_ids, splits, offset, num_shards << bits)
  local_keyed, send_counts, positions = ops.partition_by_shard(keyed, num_shards)
  plan = comm.plan(send_counts, stamp=stamp)
  received = comm.all_to_all(local_keyed, plan)
  # Received in increasing sample (each replica's ids keep their order in
  # a stable partition, and replica r's samples follow r - 1's), which the
  # op checks as it takes the row splits.
  requested, row_splits = ops.split_sample_keys(received, global_samples, bits)
  unit = weights is None and combiner == "sum"
  if unit and not comm.replicas_in_own_processes:
    # One graph makes every replica's step: each owner knows it receives
    # ones, and combines without them (a plain sum, x * 1 being x).
    coefficients = None
  elif unit:
    # Workers name their collectives by call order, so every graph of a
    # lookup (training, evaluation, with weights or without) makes the same
    # ones: the ones travel too. Each owner knows what it receives and
    # combines without them, once they have arrived.
    coefficients = comm.all_to_all(tf.ones(tf.shape(local_keyed), tf.float32), plan)
    with tf.control_dependencies([coefficients]):
      requested = tf.identity(requested)
    coefficients = None
  else:
    coefficients = ops.id_coefficients(splits, weights, tf.size(fused_ids), combiner)
    coefficients = comm.all_to_all(
        tf.scatter_nd(positions[:, None], coefficients, tf.shape(coefficients)), plan)
  # Each owner sends every replica its samples' rows of the partial sums:
  # counts every replica knows, so no exchange of counts.
  partials = comm_lib.ExchangePlan(every_samples, tf.fill(tf.shape(every_samples), samples),
                                   tf.reduce_max(every_samples))
  return RoutedBags(requested, row_splits, coefficients, partials, plan, positions)


def sum_partials(comm, partials, routed_bags):
  """Stage 3 of the pooled exchange: each owner's `partials` ([global
  samples, width]) to the replicas whose samples they are; this replica's
  [samples, width] outputs, the sum of every owner's part."""
  return comm.reduce_scatter(partials, routed_bags.partials)


def rows_to_requesters(comm, rows, routed_bags):
  """One row per id of this replica's batch, in id order, from `rows`
  (each owner's rows of `routed_bags.requested`): for what needs each
  id's own row at the replica that asked (the weights' gradients)."""
  answered = comm.all_to_all(rows, routed_bags.plan.reversed())
  return tf.gather(answered, routed_bags.positions)


def output_gradients_to_owners(comm, output_grad, routed_bags):
  """The backward of `sum_partials`: this replica's output gradient
  ([samples, width]) to every owner, which gets the global batch's
  ([global samples, width]), the gradient of its partial sums."""
  return comm.all_gather(output_grad, routed_bags.partials.reversed())
