"""Horovod's communicator: `hvd.alltoall` between the ranks of `horovodrun`."""

import tensorflow as tf

from tfde import collective_keys
from tfde.comm.base import Communicator
from tfde.comm.base import in_tf1_graph
from tfde.ops import types


class HorovodCommunicator(Communicator):
  """Horovod (`horovodrun`): one process per replica, `hvd.alltoall`
  with splits, which takes variable-size chunks directly."""

  replicas_in_own_processes = True

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
    return self._kept(self._hvd.allgather(value, name=f"tfde_gather_{self._call_sites.next()}"))

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
    (real `horovodrun` jobs hung so). Splits computed from a variable's
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
    return self._kept(received), None

  def all_to_all(self, data, plan):
    counted = self._count_bytes(data, plan.send_counts, self._rank)
    # Horovod takes no received counts, but the plan's exchange of them
    # (and its check of the replicas' steps) must run on every rank: a TF1
    # session runs only what its fetches reach. (A TF2 function runs it.)
    with tf.control_dependencies([counted] + ([plan.recv_counts] if in_tf1_graph() else [])):
      received = self._hvd.alltoall(data, splits=self._splits(plan.send_counts),
                                    name=self._name(), ignore_name_scope=True)
    return self._kept(received[0] if isinstance(received, tuple) else received)

  def _kept(self, received):
    """`received` (a collective's result), kept by every rank that builds it.

    In a TF1 graph a session runs only what its fetches reach, and Grappler
    turns a stateless op whose results feed only control edges into a no-op;
    Horovod's collectives are stateless. An exchange a rank needs only to be
    done (the forward's rows, on an owner whose updates need none of them;
    see `tfde.lookup`) would be skipped there, and its peers would wait for
    it. With one element of it read by a stateful identity, it runs
    wherever anything depends on it, by data or control. (One element: the
    identity has only a CPU kernel, and the rows stay where they are. A
    TF2 function runs every stateful op of its own, and its steps read
    each exchange as data.)
    """
    if not in_tf1_graph():
      return received
    with tf.control_dependencies([_stateful_identity(tf.reshape(received, [-1])[:1])]):
      return tf.identity(received)


def _stateful_identity(tensor):
  """`tensor`, through a stateful op, which no graph optimizer folds
  (`HorovodCommunicator._splits`): `Print` forwards its input and, told to
  print the first 0 times, prints nothing."""
  if tf.executing_eagerly():
    return tensor
  return tf.raw_ops.Print(input=tensor, data=[], message="", first_n=0)
