"""The communicators' interface (`Communicator`), the plan of one exchange,
and the process-local variables a communicator and the tables keep."""

import abc
import dataclasses

import tensorflow as tf

from tfde import tf_internals
from tfde.ops import checks


@dataclasses.dataclass(frozen=True)
class ExchangePlan:
  """Counts of one all-to-all, from this replica's point of view.

  send_counts[j]: rows this replica sends to replica j.
  recv_counts[i]: rows it receives from replica i.
  max_chunk: the largest chunk anywhere (for padded transports), or None.
  """
  send_counts: tf.Tensor
  recv_counts: tf.Tensor
  max_chunk: object = None

  def reversed(self):
    return ExchangePlan(self.recv_counts, self.send_counts, self.max_chunk)


# A variable of this process only, outside any strategy's variable creator
# (the tables' shards and counters, the bytes-sent counter).
local_variable = tf_internals.local_variable


def in_tf1_graph():
  """Whether ops built now go into a TF1 graph (`tf.compat.v1.Session`,
  an estimator's): no automatic control dependencies, and a session runs
  only what its fetches reach. False eagerly and in a TF2 function."""
  return not tf.compat.v1.executing_eagerly_outside_functions()


def static_row_bytes(data):
  """The bytes of one row of `data` where its shape says them, else None."""
  row_elements = data.shape[1:].num_elements()
  return None if row_elements is None else row_elements * data.dtype.size


def bytes_of_a_row(data):
  """The bytes of one row of `data`, an int64 scalar: a constant where its
  shape says it (ops to count them were a tenth of a traced sharded
  step's)."""
  static = static_row_bytes(data)
  if static is not None:
    return tf.constant(static, tf.int64)
  return tf.reduce_prod(tf.shape(data, out_type=tf.int64)[1:]) * data.dtype.size


class Communicator(abc.ABC):
  """One way of exchanging data between the N replicas of a step."""

  num_replicas: int

  def __init__(self, num_replicas):
    self.num_replicas = num_replicas
    self._bytes_sent = None
    self._bytes_counter()

  @abc.abstractmethod
  def local_replicas(self):
    """Replica ids whose shards live in this process."""

  def replica_device(self, replica):
    """The device that holds `replica`'s shards (None: the default)."""
    del replica
    return None

  def plan(self, send_counts, stamp=None):
    """The exchange of `send_counts[j]` rows to each replica j. `stamp`: the
    step this exchange belongs to (a scalar), checked against every
    replica's."""
    payload = tf.cast(send_counts, tf.int32)
    if stamp is not None:
      # Counts and stamps travel as the two columns of one tensor.
      stamps = tf.fill(tf.shape(payload), tf.cast(stamp % 2**31, tf.int32))
      payload = tf.stack([payload, stamps], 1)
    received, max_chunk = self._exchange_counts(payload)
    if stamp is None:
      return ExchangePlan(send_counts, received, max_chunk)
    recv_counts, recv_stamps = received[:, 0], received[:, 1]
    own = tf.cast(stamp % 2**31, tf.int32)
    none, other, step = checks.first_offender(tf.not_equal(recv_stamps, own), recv_stamps)
    check = checks.assert_that(
        none, "replica ", other, " is at step ", step, " but replica ", str(self.replica_id()),
        " is at step ", own, ": the workers are out of step (did one go on "
        "after a failed step?)")
    with tf.control_dependencies([check]):
      return ExchangePlan(send_counts, tf.identity(recv_counts), max_chunk)

  # Whether the replicas span several processes (workers; one may hold
  # several replicas), each building its own graph: then a replica whose
  # step fails leaves its peers waiting in the step's exchanges, and
  # collectives pair up by their call order, so every graph must make the
  # same ones. False where one process, and one graph, runs every
  # replica's step (which fails as one).
  replicas_in_own_processes = False

  def gather_flags(self, flags):
    """[N, k] int32: every replica's `flags` ([k] int32), in replica order.
    A control exchange, like the counts of a plan: not counted in
    `bytes_sent`."""
    flags = tf.cast(flags, tf.int32)
    if self.num_replicas == 1:
      return flags[None]
    received, _ = self._exchange_counts(tf.tile(flags[None], [self.num_replicas, 1]))
    return received

  def after_the_forward(self, outputs):
    """What a backward's exchanges must wait for, given the forward's
    `outputs`: in a TF1 graph at several replicas, the outputs. A TF1
    session runs only what its fetches reach: fetching the train op
    alone, an owner whose updates need none of the rows it sends back
    would skip that exchange, and a peer waiting in it would hang. (A TF2
    function runs all its stateful ops, eager ops run as they come: there
    the backward stays free to start before the forward ends.)"""
    return list(outputs) if in_tf1_graph() and self.num_replicas > 1 else []

  @abc.abstractmethod
  def _exchange_counts(self, payload):
    """(payload[j] of every replica, stacked: what replica i sent here is
    row i; the largest count anywhere or None). `payload` is [N] or [N, k]
    int32, row j destined to replica j."""

  @abc.abstractmethod
  def replica_id(self):
    """This replica's id (a Python int), called in replica context."""

  @abc.abstractmethod
  def all_to_all(self, data, plan):
    """Sends data[rows of chunk j] to replica j; returns what arrives,
    grouped by source replica. Chunks follow plan.send_counts."""

  def reduce_scatter(self, data, plan):
    """The sum of what every replica sends this one: `data`'s chunks
    follow plan.send_counts, as all_to_all's, and every chunk a replica
    receives has one shape (plan.recv_counts are all equal)."""
    received = self.all_to_all(data, plan)
    if self.num_replicas == 1:
      return received
    return tf.add_n(tf.split(received, self.num_replicas))

  def all_gather(self, data, plan=None):
    """Every replica's `data` concatenated in replica order, on every
    replica (sizes may differ). Built on all_to_all: each replica sends its
    whole `data` to everyone. `plan`: that exchange's plan where every
    replica knows every size already (its send counts this replica's size
    N times, its receive counts every replica's), saving the count
    exchange."""
    if self.num_replicas == 1:
      return data
    if plan is None:
      n = tf.shape(data, out_type=tf.int32)[0]
      plan = self.plan(tf.fill([self.num_replicas], n))
    tiled = tf.tile(data, tf.concat([[self.num_replicas],
                                     tf.ones([tf.rank(data) - 1], tf.int32)], 0))
    return self.all_to_all(tiled, plan)

  def gather_replica_values(self, values_by_replica):
    """[N, ...]: every replica's value stacked in replica order, given this
    process's {replica: value}. Called in cross-replica context (saving a
    checkpoint); every process must call it."""
    if sorted(values_by_replica) != list(range(self.num_replicas)):
      raise NotImplementedError(
          f"{type(self).__name__} cannot gather values held by other processes")
    return tf.stack([tf.convert_to_tensor(values_by_replica[r])
                     for r in range(self.num_replicas)])

  def concat_replica_values(self, parts_by_replica):
    """Every replica's parts, each concatenated along axis 0 in replica
    order, given this process's {replica: [part, ...]}. Parts may differ in
    length between replicas. Cross-replica context; every process calls it.

    One gather of all the lengths, then one per part, padded to the longest
    (and to at least one row: a collective of an empty tensor crashes
    MultiWorkerMirroredStrategy)."""
    sizes = self.gather_replica_values(
        {r: tf.stack([tf.shape(p, out_type=tf.int32)[0] for p in parts])
         for r, parts in parts_by_replica.items()})  # [N, parts]
    results = []
    for k in range(len(next(iter(parts_by_replica.values())))):
      longest = tf.maximum(tf.reduce_max(sizes[:, k]), 1)

      def padded(x, longest=longest):
        return tf.pad(x, [[0, longest - tf.shape(x)[0]]] + [[0, 0]] * (x.shape.rank - 1))

      stacked = self.gather_replica_values(
          {r: padded(parts[k]) for r, parts in parts_by_replica.items()})
      results.append(tf.boolean_mask(stacked, tf.sequence_mask(sizes[:, k], longest)))
    return results

  def bytes_sent(self):
    """Bytes this process has sent to other replicas so far (counted in
    TF2, eagerly or in tf.functions)."""
    counter = self._bytes_counter()
    return 0 if counter is None else int(counter.numpy())

  def reset_bytes_sent(self):
    counter = self._bytes_counter()
    if counter is not None:
      counter.assign(0)

  def _bytes_counter(self):
    """The process's bytes-sent variable, made at its first TF2 use. A TF1
    graph (an estimator's) gets none: the communicator outlives the graph,
    and a variable in it would join that graph's checkpoints, so that they
    would differ by what the process did before."""
    if in_tf1_graph():
      return None
    if self._bytes_sent is None:
      self._bytes_sent = local_variable(tf.constant(0, tf.int64), "tfde_bytes_sent")
    return self._bytes_sent

  def _count_bytes(self, data, send_counts, own_replica):
    counter = self._bytes_counter()
    if counter is None:
      return tf.no_op()
    counts = tf.cast(send_counts, tf.int64)
    if isinstance(own_replica, int):
      # The rows to the others by a constant mask: fewer ops than a slice.
      others = [0 if r == own_replica else 1 for r in range(self.num_replicas)]
      remote_rows = tf.reduce_sum(counts * tf.constant(others, tf.int64))
    else:
      remote_rows = tf.reduce_sum(counts) - counts[own_replica]
    return counter.assign_add(remote_rows * bytes_of_a_row(data))
