"""MultiWorkerMirroredStrategy's communicator: TensorFlow's collective ops
between processes."""

import itertools
import zlib

import tensorflow as tf

from tfde import collective_keys
from tfde.comm.base import Communicator
from tfde.comm.in_process import static_replica_id


class MultiWorkerCommunicator(Communicator):
  """`tf.distribute.MultiWorkerMirroredStrategy`: processes on hosts
  (TF_CONFIG), through TensorFlow's collective ops.

  `all_to_all_v2` needs a first dimension equal to the group size
  (PLATFORM_NOTES), so chunks are padded to a common size, known to all
  from an all-gather of the send counts. TensorFlow fixes the shape of a
  collective instance key at its first use, so the padded size is rounded
  up to one of a few geometric buckets (steps of 2^(1/4), at most 19%
  padding) and the bucket picks the instance key: each key always carries
  one shape, and the set of keys stays small. For the same reason a key
  names what its call site sends besides its place in the traced function:
  the k-th collective of two functions (a train and an eval step, two
  lookups) may send other shapes. What a worker knows of a shape
  statically may differ from another's (a width known here, unknown
  there), so the key takes the lookup (`key_space`), the dtype and the
  rank, which every worker knows alike.
  """

  # Collective keys of our own, far from the strategy's (which count up
  # from 1).
  _GROUP_KEY = 0x7DE00
  _INSTANCE_KEY_BASE = 0x7DE0000
  _BUCKETS_PER_CALL_SITE = 128
  # Traced call sites hash into the first half of these key ranges, alike
  # on every worker whatever order they trace in (two of 100 share one with
  # probability about 1e-3, which breaks only if they send other shapes);
  # eager calls, which workers make in lock step, take the second half in
  # turn.
  _KEY_SLOTS = 2**23

  replicas_in_own_processes = True

  def __init__(self, strategy):
    super().__init__(strategy.num_replicas_in_sync)
    self._strategy = strategy
    self._devices = list(strategy.extended.worker_devices)
    resolver = strategy.cluster_resolver
    self._task_id = resolver.task_id if resolver.task_id is not None else 0
    self._local_count = len(self._devices)
    self._call_sites = collective_keys.CallSiteCounter()
    self._eager_sites = itertools.count()

  def gather_replica_values(self, values_by_replica):
    if self._local_count == 1 and tf.executing_eagerly():
      # One collective op, where `strategy.gather` traces a new function
      # at every call (88 ms each: a checkpoint of a static and a dynamic
      # table took 1.5 s to save between two workers, 0.3 s so).
      ((replica, value),) = values_by_replica.items()
      value = tf.convert_to_tensor(value)[None]
      with tf.device(self.replica_device(replica)):
        return tf.raw_ops.CollectiveGatherV2(
            input=value, group_size=self.num_replicas, group_key=self._GROUP_KEY,
            instance_key=self._instance_key(value), ordering_token=[])
    per_replica = self._strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.convert_to_tensor(
            values_by_replica[ctx.replica_id_in_sync_group])[None])
    return self._strategy.gather(per_replica, axis=0)

  def local_replicas(self):
    first = self._task_id * self._local_count
    return list(range(first, first + self._local_count))

  def replica_device(self, replica):
    return self._devices[replica - self._task_id * self._local_count]

  def replica_id(self):
    return static_replica_id()

  def _instance_key(self, sends, bucket=0):
    """The key of the next call site, which `sends` (a tensor: its dtype
    and rank; the size of its chunks picks the bucket)."""
    half = self._KEY_SLOTS // 2
    if tf.executing_eagerly():
      slot = half + next(self._eager_sites) % half
    else:
      site = f"{self._call_sites.next()}:{sends.dtype.name}:{sends.shape.rank}"
      slot = zlib.crc32(site.encode()) % half
    return self._INSTANCE_KEY_BASE + slot * self._BUCKETS_PER_CALL_SITE + bucket

  def _exchange_counts(self, payload):
    matrix = tf.raw_ops.CollectiveGatherV2(
        input=payload[None], group_size=self.num_replicas, group_key=self._GROUP_KEY,
        instance_key=self._instance_key(payload[None]), ordering_token=[])
    received = matrix[:, self.replica_id()]
    counts = matrix if payload.shape.rank == 1 else matrix[..., 0]  # stamps aside
    return received, tf.reduce_max(counts)

  @staticmethod
  def _padded_chunk(max_chunk):
    """(bucket index, chunk size >= max_chunk) for a run-time max_chunk."""
    m = tf.cast(tf.maximum(max_chunk, 1), tf.float64)
    log2 = tf.math.log(m) / tf.math.log(tf.constant(2.0, tf.float64))
    bucket = tf.cast(tf.math.ceil(4.0 * log2 - 1e-9),
                     tf.int32)
    size = tf.cast(tf.math.ceil(tf.pow(tf.constant(2.0, tf.float64),
                                       tf.cast(bucket, tf.float64) / 4.0) - 1e-9),
                   tf.int32)
    return bucket, tf.maximum(size, tf.cast(m, tf.int32))

  def all_to_all(self, data, plan):
    n = self.num_replicas
    me = self.replica_id()
    bucket, chunk = self._padded_chunk(plan.max_chunk)
    send_counts = tf.cast(plan.send_counts, tf.int32)
    row_shape = tf.shape(data)[1:]
    # Each destination's chunk followed by zeros up to the padded size, in
    # one concat: one copy of the data (the split shares its input's buffer
    # where each piece stays aligned, as rows of 64-byte multiples do),
    # where a scatter into the padded buffer took 2.8x as long
    # (a microbenchmark of the two, 2-process MWMS on CPU).
    padding = chunk - send_counts
    pieces = []
    for j, part in enumerate(tf.split(data, send_counts, num=n)):
      pieces += [part, tf.zeros(tf.concat([padding[j:j + 1], row_shape], 0), data.dtype)]
    padded = tf.reshape(tf.concat(pieces, 0), tf.concat([[n, chunk], row_shape], 0))
    counted = self._count_bytes(data, send_counts, me)
    with tf.control_dependencies([counted]):
      received = tf.raw_ops.CollectiveAllToAllV2(
          input=padded, group_size=n, group_key=self._GROUP_KEY,
          instance_key=self._instance_key(padded, bucket), ordering_token=[])
    # Each source's rows, without its padding: a split and one concat
    # again, a little cheaper than a boolean mask (3.1 against 3.4 ms, the
    # same file).
    recv_counts = tf.cast(plan.recv_counts, tf.int32)
    flat = tf.reshape(received, tf.concat([[n * chunk], row_shape], 0))
    sizes = tf.reshape(tf.stack([recv_counts, chunk - recv_counts], 1), [-1])
    return tf.concat(tf.split(flat, sizes, num=2 * n)[::2], 0)
