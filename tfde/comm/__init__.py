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

import sys
import weakref

import tensorflow as tf

from tfde.comm.base import Communicator  # noqa: F401 (the interface)
from tfde.comm.base import ExchangePlan  # noqa: F401
from tfde.comm.base import in_tf1_graph  # noqa: F401
from tfde.comm.base import local_variable  # noqa: F401
from tfde.comm.horovod import HorovodCommunicator
from tfde.comm.in_process import LocalCommunicator
from tfde.comm.in_process import MirroredCommunicator
from tfde.comm.in_process import TPUCommunicator
from tfde.comm.multi_worker import MultiWorkerCommunicator

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
