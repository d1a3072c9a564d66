"""Collective instance keys: which collective of a traced step is which.

Workers of a multi-process job must give the same key to the same
collective. Keys are named by call site, in call order, per key space (one
per lookup), so that two lookups' steps, which may send other shapes, never
share a key.

>>> from tfde import collective_keys
>>> counter = collective_keys.CallSiteCounter()
>>> with collective_keys.key_space("lookup0"):
...   [counter.next(), counter.next()]
['lookup0_0', 'lookup0_1']
"""

import contextlib
import itertools
import threading
import weakref

import tensorflow as tf

_key_spaces = threading.local()


@contextlib.contextmanager
def key_space(name):
  """Names the collectives made inside (a lookup's, forward and backward):
  the k-th collective of one lookup's traced step and of another's, which
  may send other shapes, then differ (`CallSiteCounter`)."""
  previous = getattr(_key_spaces, "name", "")
  _key_spaces.name = name
  try:
    yield
  finally:
    _key_spaces.name = previous


class CallSiteCounter:
  """Names the collectives of one traced function in call order, per key
  space (`key_space`): "lookup3_5" is lookup 3's sixth.

  Workers must agree on which collective is which. A counter kept across
  traces would not do: a worker retraces when its own input shapes change
  (ragged batches), so two workers can trace a step a different number of
  times. Counting afresh in every graph gives the same numbers to the same
  call sites in every trace on every worker; eagerly, workers run in lock
  step and one running count serves.
  """

  def __init__(self):
    self._per_graph = weakref.WeakKeyDictionary()
    self._eager = {}

  def next(self):
    space = getattr(_key_spaces, "name", "")
    if tf.executing_eagerly():
      counters = self._eager
    else:
      graph = tf.compat.v1.get_default_graph()
      if graph not in self._per_graph:
        self._per_graph[graph] = {}
      counters = self._per_graph[graph]
    if space not in counters:
      counters[space] = itertools.count()
    number = next(counters[space])
    return f"{space}_{number}" if space else str(number)
