"""The communicators of one process: no strategy (`LocalCommunicator`),
TPUStrategy (`TPUCommunicator`, whose engine moves the rows) and
MirroredStrategy (`MirroredCommunicator`)."""

import tensorflow as tf

from tfde import tf_internals
from tfde.comm.base import Communicator
from tfde.comm.base import bytes_of_a_row
from tfde.comm.base import static_row_bytes


class LocalCommunicator(Communicator):
  """No strategy, or one replica: nothing to exchange. `device`: where a
  one-replica strategy keeps its variables (None: the default device)."""

  def __init__(self, device=None):
    super().__init__(1)
    self._device = device

  def local_replicas(self):
    return [0]

  def replica_device(self, replica):
    del replica
    return self._device

  def replica_id(self):
    return 0

  def _exchange_counts(self, payload):
    return payload, None

  def all_to_all(self, data, plan):
    return data


def static_replica_id():
  context = tf.distribute.get_replica_context()
  if context is None:
    raise RuntimeError("tfde lookups under a tf.distribute strategy must run "
                       "inside strategy.run (replica context)")
  replica = tf.get_static_value(context.replica_id_in_sync_group)
  if replica is None:
    raise NotImplementedError("this strategy gives no static replica id")
  return int(replica)


class TPUCommunicator(Communicator):
  """`tf.distribute.TPUStrategy`: TensorFlow's TPU embedding engine moves
  the rows between the TPU cores itself (`tfde.tables.tpu`), so the
  pipeline exchanges only its step's control flags here; its tables are
  not kept per replica (every replica is replica 0 to them).

  Attributes:
    tpu_strategy: the strategy, which the engine is built under.
  """

  def __init__(self, strategy):
    super().__init__(strategy.num_replicas_in_sync)
    self.tpu_strategy = strategy

  def local_replicas(self):
    return [0]

  def replica_id(self):
    return 0

  def gather_flags(self, flags):
    flags = tf.cast(flags, tf.int32)
    context = tf.distribute.get_replica_context()
    if context is None or self.num_replicas == 1:
      return flags[None]
    return context.all_gather(flags[None], axis=0)

  def _engine_exchanges(self, *args):
    del args
    raise NotImplementedError("under TPUStrategy the TPU embedding engine "
                              "exchanges the rows; tfde's exchanges do not run")

  _exchange_counts = all_to_all = _engine_exchanges


class MirroredCommunicator(Communicator):
  """`tf.distribute.MirroredStrategy`: N devices in one process.

  In-process collectives over logical CPU devices hang (PLATFORM_NOTES),
  so the exchange is a `merge_call`: the merge function sees every
  replica's chunks and builds each replica's received data on its device.
  """

  def __init__(self, strategy):
    super().__init__(strategy.num_replicas_in_sync)
    self._devices = list(strategy.extended.worker_devices)

  def local_replicas(self):
    return list(range(self.num_replicas))

  def replica_device(self, replica):
    return self._devices[replica]

  def replica_id(self):
    return static_replica_id()

  def _merge(self, fn, *args):
    return tf.distribute.get_replica_context().merge_call(fn, args=args)

  def _exchange_counts(self, payload):
    n = self.num_replicas

    def exchange_counts(strategy, payload):
      matrix = tf.stack(strategy.experimental_local_results(payload))
      # Column j to replica j: one Unpack, not N slices of four ops each.
      columns = tf.unstack(matrix, n, axis=1)
      received = []
      for j in range(n):
        with tf.device(self._devices[j]):
          received.append(tf.identity(columns[j]))
      return tf_internals.per_replica(received)

    return self._merge(exchange_counts, payload), None

  def all_to_all(self, data, plan):
    return self._exchange(data, plan, lambda chunks: tf.concat(chunks, 0))

  def reduce_scatter(self, data, plan):
    # Each device adds the chunks it receives, without concatenating them
    # first (a copy of N chunks).
    return self._exchange(data, plan, tf.add_n)

  def _exchange(self, data, plan, receive):
    """Chunk j of each replica's `data` (plan.send_counts) to replica j,
    which gets `receive(the chunks sent to it, in replica order)`."""
    n = self.num_replicas

    def exchange(strategy, data, counts):
      datas = strategy.experimental_local_results(data)
      all_counts = strategy.experimental_local_results(counts)
      chunks = [tf.split(datas[i], all_counts[i], num=n) for i in range(n)]
      return self._delivered(lambda j: receive([chunks[i][j] for i in range(n)]),
                             datas, all_counts)

    return self._merge(exchange, data, plan.send_counts)

  def all_gather(self, data, plan=None):
    # Each device concatenates every replica's data, without the N tiled
    # copies that all_to_all would send (the pooled exchange's output
    # gradients: 12 Tile ops and about 1 ms of a 4-replica step's kernel
    # time in a profile of bench/sharded_bench.py).
    del plan
    n = self.num_replicas  # more than one: one replica gets a LocalCommunicator

    def gather(strategy, data):
      datas = strategy.experimental_local_results(data)
      # Counted as the tiled all_to_all's: each replica's data to N - 1 others.
      sizes = tf.stack([tf.shape(d, out_type=tf.int64)[0] for d in datas])
      return self._delivered(lambda j: tf.concat(datas, 0), datas,
                             tf.tile(sizes[:, None], [1, n]))

    return self._merge(gather, data)

  def _delivered(self, receive, datas, all_counts):
    """PerReplica of `receive(j)` built on each device j, ready once every
    replica's bytes sent (`datas[i]` by `all_counts[i]`) are counted."""
    received = []
    for j in range(self.num_replicas):
      with tf.device(self._devices[j]):
        received.append(receive(j))
    with tf.control_dependencies([self._count_bytes_of_all(datas, all_counts)]):
      return tf_internals.per_replica([tf.identity(r) for r in received])

  def _count_bytes_of_all(self, datas, all_counts):
    """Adds what every replica i sends the others (`all_counts[i][j]` rows
    of `datas[i]` to replica j) to the bytes sent."""
    # One update for all replicas: one per replica (`_count_bytes`) made a
    # tenth of a traced 4-replica step's ops.
    counter = self._bytes_counter()
    if counter is None:
      return tf.no_op()
    n = self.num_replicas
    counts = tf.cast(tf.convert_to_tensor(all_counts), tf.int64)  # [sender, receiver]
    static = [static_row_bytes(d) for d in datas]
    if None not in static:
      # One constant: the bytes of sender i's row where it goes to another.
      sent = tf.constant([[0 if i == j else static[i] for j in range(n)] for i in range(n)],
                         tf.int64)
      return counter.assign_add(tf.reduce_sum(counts * sent))
    to_others = tf.constant([[0 if i == j else 1 for j in range(n)] for i in range(n)],
                            tf.int64)
    rows = tf.reduce_sum(counts * to_others, 1)
    row_bytes = tf.stack([bytes_of_a_row(d) for d in datas])
    return counter.assign_add(tf.reduce_sum(rows * row_bytes))
