"""Communicators: the all-to-all exchange of variable-size chunks between
replicas, one small class per way of running, behind one interface.

The lookup pipeline calls `current()` and never asks which strategy it
runs under:

>>> import tensorflow as tf
>>> from tfde import comm
>>> c = comm.current()          # no strategy: one replica, no traffic
>>> c.num_replicas
1
>>> plan = c.plan(tf.constant([3]))
>>> c.all_to_all(tf.constant([7, 8, 9]), plan).numpy().tolist()
[7, 8, 9]

An exchange is planned once from the send counts (`plan`); the plan gives
each replica its receive counts and can be reversed, so the rows that
answer a request travel back without another count exchange. A plan may
carry a step stamp: every replica's step travels with its counts, and
replicas at different steps fail with an error naming both, instead of
pairing one worker's step with another's next one.

Each communicator counts the bytes its process sends to other replicas
(`bytes_sent()`), readable after a step.
"""

import abc
import dataclasses
import itertools
import sys
import weakref
import zlib

import tensorflow as tf
from tensorflow.python.distribute import values as distribute_values
from tensorflow.python.ops import collective_ops
from tensorflow.python.ops import resource_variable_ops

from tfde import collective_keys
from tfde.ops import checks
from tfde.ops import types


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


def local_variable(initial_value, name, trainable=False, device=None):
  """A plain variable that belongs to this process only.

  Built directly as a ResourceVariable, which bypasses the variable
  creator of an enclosing strategy scope: a shard or a counter must not
  become a mirrored variable.
  """
  with tf.init_scope(), tf.device(device):
    return resource_variable_ops.ResourceVariable(
        initial_value, name=name, trainable=trainable)


def _row_bytes(data):
  row_elements = tf.reduce_prod(tf.shape(data, out_type=tf.int64)[1:])
  return row_elements * data.dtype.size


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

  def gather_flags(self, flags):
    """[N, k] int32: every replica's `flags` ([k] int32), in replica order.
    A control exchange, like the counts of a plan: not counted in
    `bytes_sent`."""
    flags = tf.cast(flags, tf.int32)
    if self.num_replicas == 1:
      return flags[None]
    received, _ = self._exchange_counts(tf.tile(flags[None], [self.num_replicas, 1]))
    return received

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

  def all_gather(self, data):
    """Every replica's `data` concatenated in replica order, on every
    replica (sizes may differ). Built on all_to_all: each replica sends its
    whole `data` to everyone."""
    if self.num_replicas == 1:
      return data
    n = tf.shape(data, out_type=tf.int32)[0]
    counts = tf.fill([self.num_replicas], n)
    tiled = tf.tile(data, tf.concat([[self.num_replicas],
                                     tf.ones([tf.rank(data) - 1], tf.int32)], 0))
    return self.all_to_all(tiled, self.plan(counts))

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
    if not tf.compat.v1.executing_eagerly_outside_functions():
      return None
    if self._bytes_sent is None:
      self._bytes_sent = local_variable(tf.constant(0, tf.int64), "tfde_bytes_sent")
    return self._bytes_sent

  def _count_bytes(self, data, send_counts, own_replica):
    counter = self._bytes_counter()
    if counter is None:
      return tf.no_op()
    remote_rows = (tf.reduce_sum(tf.cast(send_counts, tf.int64)) -
                   tf.cast(send_counts[own_replica], tf.int64))
    return counter.assign_add(remote_rows * _row_bytes(data))


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


def _static_replica_id():
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
    return _static_replica_id()

  def _merge(self, fn, *args):
    return tf.distribute.get_replica_context().merge_call(fn, args=args)

  def _exchange_counts(self, payload):
    n = self.num_replicas

    def exchange_counts(strategy, payload):
      matrix = tf.stack(strategy.experimental_local_results(payload))
      received = []
      for j in range(n):
        with tf.device(self._devices[j]):
          received.append(tf.identity(matrix[:, j]))
      return distribute_values.PerReplica(received)

    return self._merge(exchange_counts, payload), None

  def all_to_all(self, data, plan):
    n = self.num_replicas

    def exchange(strategy, data, counts):
      datas = strategy.experimental_local_results(data)
      all_counts = strategy.experimental_local_results(counts)
      chunks = [tf.split(datas[i], all_counts[i], num=n) for i in range(n)]
      received = []
      for j in range(n):
        with tf.device(self._devices[j]):
          received.append(tf.concat([chunks[i][j] for i in range(n)], 0))
      counted = [self._count_bytes(datas[i], all_counts[i], i) for i in range(n)]
      with tf.control_dependencies(counted):
        received = [tf.identity(r) for r in received]
      return distribute_values.PerReplica(received)

    return self._merge(exchange, data, plan.send_counts)


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
    return _static_replica_id()

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
    matrix = collective_ops.all_gather_v2(
        payload[None], group_size=self.num_replicas,
        group_key=self._GROUP_KEY, instance_key=self._instance_key(payload[None]))
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
    # (notes/session16/padding_micro.txt).
    padding = chunk - send_counts
    pieces = []
    for j, part in enumerate(tf.split(data, send_counts, num=n)):
      pieces += [part, tf.zeros(tf.concat([padding[j:j + 1], row_shape], 0), data.dtype)]
    padded = tf.reshape(tf.concat(pieces, 0), tf.concat([[n, chunk], row_shape], 0))
    counted = self._count_bytes(data, send_counts, me)
    with tf.control_dependencies([counted]):
      received = collective_ops.all_to_all_v2(
          padded, group_size=n, group_key=self._GROUP_KEY,
          instance_key=self._instance_key(padded, bucket))
    # Each source's rows, without its padding: a split and one concat
    # again, a little cheaper than a boolean mask (3.1 against 3.4 ms, the
    # same file).
    recv_counts = tf.cast(plan.recv_counts, tf.int32)
    flat = tf.reshape(received, tf.concat([[n * chunk], row_shape], 0))
    sizes = tf.reshape(tf.stack([recv_counts, chunk - recv_counts], 1), [-1])
    return tf.concat(tf.split(flat, sizes, num=2 * n)[::2], 0)


class HorovodCommunicator(Communicator):
  """Horovod (`horovodrun`): one process per replica, `hvd.alltoall`
  with splits, which takes variable-size chunks directly."""

  def __init__(self, hvd):
    super().__init__(hvd.size())
    self._hvd = hvd
    self._rank = hvd.rank()
    self._call_sites = collective_keys.CallSiteCounter()

  def local_replicas(self):
    return [self._rank]

  def replica_id(self):
    return self._rank

  def gather_replica_values(self, values_by_replica):
    value = _stateful_identity(tf.convert_to_tensor(values_by_replica[self._rank])[None])
    return self._hvd.allgather(value, name=f"tfde_gather_{self._call_sites.next()}")

  def _name(self):
    # Horovod matches collectives across ranks by name.
    return f"tfde_all_to_all_{self._call_sites.next()}"

  def _splits(self, counts):
    """`counts` as a collective's int32 splits, never a constant.

    Horovod's collectives are not stateful ops: where all of one's inputs
    are constants in a traced step (a batch of static shape, a sum's
    output gradient of ones), TensorFlow's constant folding runs the
    collective while optimizing the graph, on each rank at its own moment
    and in its own order, and the ranks block in each other's optimizers
    (notes/session21/horovod_hang.txt). Splits computed from a variable's
    value are never folded: `zero_from(bytes sent)` is 0, which no optimizer
    can tell. The read is ordered only among the counter's own updates; a
    stateful identity would join the chain of every stateful op of the
    function, and a placeholder with a default is folded by the runtime.
    """
    counts = tf.cast(counts, tf.int32)
    if tf.executing_eagerly():
      return counts
    counter = self._bytes_counter()
    if counter is None:  # a TF1 graph: no automatic control dependencies
      return _stateful_identity(counts)
    return counts + tf.cast(types.zero_from(counter.read_value()), tf.int32)

  def _exchange_counts(self, payload):
    ones = tf.ones([self.num_replicas], tf.int32)
    received = self._hvd.alltoall(payload, splits=self._splits(ones), name=self._name(),
                                  ignore_name_scope=True)
    if isinstance(received, tuple):  # newer Horovod returns the splits too
      received = received[0]
    return received, None

  def all_to_all(self, data, plan):
    counted = self._count_bytes(data, plan.send_counts, self._rank)
    with tf.control_dependencies([counted]):
      received = self._hvd.alltoall(data, splits=self._splits(plan.send_counts),
                                    name=self._name(), ignore_name_scope=True)
    return received[0] if isinstance(received, tuple) else received


def _stateful_identity(tensor):
  """`tensor`, through a stateful op, which no graph optimizer folds
  (`HorovodCommunicator._splits`): `Print` forwards its input and, told to
  print the first 0 times, prints nothing."""
  if tf.executing_eagerly():
    return tensor
  return tf.raw_ops.Print(input=tensor, data=[], message="", first_n=0)


_by_strategy = weakref.WeakKeyDictionary()
_local = None
_horovod = None


def _initialized_horovod():
  hvd = sys.modules.get("horovod.tensorflow")
  if hvd is None:
    return None
  try:
    return hvd if hvd.is_initialized() and hvd.size() > 1 else None
  except (ValueError, AttributeError):
    return None


def current():
  """The communicator for the context this is called in."""
  global _local, _horovod
  strategy = tf.distribute.get_strategy()
  # Horovod ranks may each run a one-replica strategy: they exchange
  # through Horovod, and a strategy of several replicas through itself.
  several = tf.distribute.has_strategy() and (strategy.num_replicas_in_sync > 1 or
                                              is_tpu_strategy(strategy))
  hvd = None if several else _initialized_horovod()
  if hvd is not None:
    if _horovod is None:
      _horovod = HorovodCommunicator(hvd)
    return _horovod
  if tf.distribute.has_strategy():
    if strategy not in _by_strategy:
      _by_strategy[strategy] = _for_strategy(strategy)
    return _by_strategy[strategy]
  if _local is None:
    _local = LocalCommunicator()
  return _local


def is_tpu_strategy(strategy):
  """Whether `strategy` is a TPUStrategy (V1 or V2; known by class name, so
  no TPU import is needed)."""
  names = {cls.__name__ for cls in type(strategy).__mro__}
  return bool(names & {"TPUStrategyV2", "TPUStrategy", "TPUStrategyV1"})


def _for_strategy(strategy):
  if strategy.num_replicas_in_sync == 1 and not is_tpu_strategy(strategy):
    # Its tables live on the strategy's device, as its other variables do
    # (a MirroredStrategy over "/cpu:0" on a GPU machine).
    return LocalCommunicator(strategy.extended.worker_devices[0])
  if is_tpu_strategy(strategy):
    return TPUCommunicator(strategy)
  if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return MultiWorkerCommunicator(strategy)
  if isinstance(strategy, tf.distribute.MirroredStrategy):
    return MirroredCommunicator(strategy)
  raise NotImplementedError(
      f"tfde has no communicator for {type(strategy).__name__} yet; supported: "
      "no strategy, MirroredStrategy, MultiWorkerMirroredStrategy, Horovod")
