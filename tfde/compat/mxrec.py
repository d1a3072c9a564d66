"""Huawei mxRec's training flow on tfde: hash tables with dynamic expansion,
local embeddings and row addresses, and optimizers applied by address, in a
TF1 graph (`tf.compat.v1.Session`).

>>> import numpy as np
>>> import tensorflow as tf
>>> from tfde.compat import mxrec
>>> with tf.Graph().as_default():
...   mxrec.init(use_dynamic_expansion=True)
...   optimizer = mxrec.lazy_adam.create_hash_optimizer_by_addr(learning_rate=0.01)
...   table = mxrec.create_table(key_dtype=tf.int64, dim=4, name="user",
...                              emb_initializer=tf.zeros_initializer(),
...                              optimizer_list=[optimizer])
...   ids = tf.constant([[2**40, -7], [3, 2**40]], tf.int64)
...   emb = mxrec.sparse_lookup(table, ids, is_train=True)
...   loss = tf.reduce_sum(tf.square(emb - 1.0))
...   local = tf.compat.v1.get_collection(mxrec.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
...   addresses = tf.compat.v1.get_collection(mxrec.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
...   grads = tf.gradients(loss, local)
...   train = optimizer.apply_gradients(list(zip(grads, addresses)))
...   with tf.compat.v1.Session() as sess:
...     sess.run(tf.compat.v1.global_variables_initializer())
...     first = sess.run([loss, train])[0]
...     second = sess.run(loss)
>>> emb.shape.as_list(), bool(second < first)
([2, 2, 4], True)

Semantics, following mxRec's documentation:
- `init(use_dynamic_expansion=True)` makes tables grow with every new id
  (tfde's dynamic tables); with False a table holds at most
  `device_vocabulary_size` rows, evicting the least frequent (mxRec's fixed
  device capacity).
- `sparse_lookup` returns one row per id (shape ids.shape + [dim], no
  combining) and, in training, puts the rows it looked up (the "local
  embeddings", one per unique id) and their row addresses in the
  collections `ASCEND_SPARSE_LOOKUP_LOCAL_EMB` and
  `ASCEND_SPARSE_LOOKUP_ID_OFFSET`.
- `tf.gradients(loss, local_embeddings)` then gives each row's gradient,
  and the table's optimizer applies `[(grad, address)]`: one step per table
  per call, however many lookups used it. An address that is not a row of
  its table (stale, or made up) is an InvalidArgumentError; -1 (an id not
  admitted) is skipped.
- One replica per process, as mxRec: a single process, or Horovod ranks
  (`horovodrun`), where ids travel to their owner (id mod N) and the local
  embeddings are the rows a rank owns and serves to every rank; their
  gradients come back through the reverse exchange.
"""

import types

import tensorflow as tf

from tfde import comm as comm_lib
from tfde import config as config_lib
from tfde import initializers
from tfde import inputs as inputs_lib
from tfde import ops
from tfde import optimizers as optimizers_lib
from tfde import routing
from tfde import tables as tables_lib

ASCEND_SPARSE_LOOKUP_LOCAL_EMB = "ASCEND_SPARSE_LOOKUP_LOCAL_EMB"
ASCEND_SPARSE_LOOKUP_ID_OFFSET = "ASCEND_SPARSE_LOOKUP_ID_OFFSET"

_settings = {"initialized": False, "use_dynamic_expansion": False}
# The attribute by which a row-address tensor names its HashTable: it goes
# with the tensor (and its graph), never into a process-wide registry.
_TABLE_ATTRIBUTE = "_tfde_hash_table"


def init(use_dynamic_expansion=False, **options):
  """mxRec's `init`: records the dynamic-expansion switch. Other mxRec
  options (train_steps, use_mpi, ...) are accepted and have no effect."""
  _settings.update(initialized=True, use_dynamic_expansion=bool(use_dynamic_expansion),
                   options=dict(options))


def get_use_dynamic_expansion():
  return _settings["use_dynamic_expansion"]


class HashOptimizer:
  """A table optimizer in mxRec's shape: made first, named in
  `create_table(optimizer_list=...)`, applied to (gradient, address) pairs."""

  def __init__(self, sparse_optimizer):
    self.sparse_optimizer = sparse_optimizer

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Applies [(gradient of local embeddings, their addresses)]; pairs of
    one table are summed per row and applied as one step."""
    by_table = {}
    for grad, address in grads_and_vars:
      table = getattr(address, _TABLE_ATTRIBUTE, None) if tf.is_tensor(address) else None
      if table is None:
        raise ValueError(f"{address!r} is not a row-address tensor from "
                         "sparse_lookup (ASCEND_SPARSE_LOOKUP_ID_OFFSET)")
      if table.optimizer is not self:
        raise ValueError(f"table {table.name!r} was created with another "
                         "optimizer in its optimizer_list")
      if grad is None:
        continue
      by_table.setdefault(table.name, (table, []))[1].append((grad, address))
    with tf.name_scope(name or "hash_optimizer"):
      pending = []
      for table, pairs in by_table.values():
        addresses = tf.concat([a for _, a in pairs], 0)
        grads = tf.concat([tf.convert_to_tensor(g) for g, _ in pairs], 0)
        unique, inverse = tf.unique(addresses, out_idx=tf.int32)
        summed = tf.math.unsorted_segment_sum(grads, inverse, tf.size(unique))
        pending.append((table, unique, summed))
      finite = optimizers_lib.all_finite([p[2] for p in pending],
                                         pending[0][0].table.comm if pending else None)
      updates = [table.table.apply_gradient(
          table.replica, unique, summed, optimizer=self.sparse_optimizer,
          by_address=True, finite=finite[i])
                 for i, (table, unique, summed) in enumerate(pending)]
      if global_step is not None:
        with tf.control_dependencies(updates):
          updates.append(tf.compat.v1.assign_add(global_step, 1))
    return tf.group(updates)


# What mxRec's optimizers take that changes nothing here: names of the
# optimizer and its slot variables, locking, Ascend's fused operators.
_NO_EFFECT = ("name", "use_locking", "use_fusion_optim", "accum_name", "linear_name")


def _optimizer_module(kind, defaults, renames=None, by_address_defaults=None):
  """mxRec's module of one optimizer: `defaults`, mxRec's own where they
  differ from tfde's Keras ones; `renames`, its argument names to tfde's;
  `by_address_defaults`, what its `_by_addr` constructor adds."""
  cls = {"sgd": optimizers_lib.SGD, "adagrad": optimizers_lib.Adagrad,
         "adam": optimizers_lib.Adam, "ftrl": optimizers_lib.Ftrl}[kind]

  def make(extra_defaults):
    def create(learning_rate=None, **hyper):
      hyper = dict(dict(defaults, **extra_defaults), **{
          (renames or {}).get(k, k): v for k, v in hyper.items() if k not in _NO_EFFECT})
      decay = hyper.pop("weight_decay", None)
      if decay:
        raise ValueError(
            f"mxRec's {kind} optimizer with weight_decay={decay}: tfde's sparse "
            "optimizers have no weight decay (mxRec's gradient_descent."
            "create_hash_optimizer_by_addr decays by 0.0001 unless given "
            "weight_decay); pass weight_decay=0 to train without it")
      if kind == "adagrad" and not hyper["initial_accumulator_value"] > 0:
        raise ValueError("mxRec's adagrad divides by the accumulators' square root (no "
                         "epsilon): initial_accumulator_value must be positive, got "
                         f"{hyper['initial_accumulator_value']!r}")
      default_rate = hyper.pop("learning_rate", None)
      learning_rate = default_rate if learning_rate is None else learning_rate
      return HashOptimizer(cls(learning_rate=learning_rate, **hyper))
    return create

  by_address = make(by_address_defaults or {})
  return types.SimpleNamespace(create_hash_optimizer=make({}),
                               create_hash_optimizer_by_addr=by_address,
                               create_hash_optimizer_by_address=by_address)


# mxRec's optimizer modules, with its defaults (its documentation's; the
# TF1 optimizers it derives from: Adagrad divides by sqrt(accumulator),
# with no epsilon) and its argument names mapped to tfde's.
lazy_adam = _optimizer_module("adam", {"learning_rate": 0.001, "epsilon": 1e-8},
                              renames={"beta1": "beta_1", "beta2": "beta_2"})
gradient_descent = _optimizer_module("sgd", {}, by_address_defaults={"weight_decay": 0.0001})
adagrad = _optimizer_module("adagrad", {"learning_rate": 0.001,
                                        "initial_accumulator_value": 0.9, "epsilon": 0.0})
ftrl = _optimizer_module("ftrl", {})


class HashTable:
  """What create_table returns: a tfde dynamic table and its optimizer."""

  def __init__(self, table, optimizer):
    self.table = table
    self.optimizer = optimizer
    self.replica = 0

  @property
  def name(self):
    return self.table.name

  @property
  def dim(self):
    return self.table.embedding_dim


def create_table(key_dtype=tf.int64, dim=None, name=None, emb_initializer=None,
                 device_vocabulary_size=None, optimizer_list=None, **options):
  """mxRec's `create_table`: a hash table of `dim`-wide rows for any id.

  Args:
    key_dtype: tf.int64, tf.int32 or tf.string (keys are the strings'
      64-bit fingerprints, `tfde.inputs.string_keys`).
    dim: the embedding width.
    name: the table's name.
    emb_initializer: a TF or Keras initializer of a kind tfde draws per id
      (zeros, constant, uniform, normal, truncated normal). mxRec needs
      one; None here gives `tfde.TableConfig`'s default (rows of standard
      deviation 1/sqrt(dim)).
    device_vocabulary_size: without dynamic expansion, the rows a table
      keeps (least frequent evicted beyond it).
    optimizer_list: one HashOptimizer (mxRec takes a list).
    **options: other mxRec options, accepted without effect.
  """
  del options
  if not _settings["initialized"]:
    raise RuntimeError("call tfde.compat.mxrec.init(...) before create_table")
  if key_dtype not in (tf.int64, tf.int32, tf.string):
    raise ValueError(f"table {name!r}: key_dtype must be tf.int64, tf.int32 or tf.string, "
                     f"got {key_dtype!r}")
  if not optimizer_list or len(optimizer_list) != 1 or not isinstance(
      optimizer_list[0], HashOptimizer):
    raise ValueError(f"table {name!r}: optimizer_list must hold one optimizer "
                     "from tfde.compat.mxrec (e.g. lazy_adam.create_hash_optimizer)")
  expansion = _settings["use_dynamic_expansion"]
  if not expansion and not device_vocabulary_size:
    raise ValueError(f"table {name!r}: without dynamic expansion, "
                     "device_vocabulary_size bounds the table; give it")
  initializer = emb_initializer
  if initializer is not None:
    initializer = initializers.resolve(initializer, name)
  optimizer = optimizer_list[0]
  config = config_lib.TableConfig(
      name=name, vocabulary_size=None, embedding_dim=dim, initializer=initializer,
      optimizer=optimizer.sparse_optimizer, combiner="sum",
      dynamic=config_lib.DynamicConfig(
          max_rows_per_shard=None if expansion else int(device_vocabulary_size)))
  comm = comm_lib.current()
  if len(comm.local_replicas()) != 1:
    raise ValueError("tfde.compat.mxrec runs one replica per process (Horovod, "
                     f"as mxRec); this process has {len(comm.local_replicas())}")
  table = HashTable(tables_lib.DynamicTable(config, comm), optimizer)
  table.replica = comm.local_replicas()[0]
  return table


def sparse_lookup(hashtable, ids, send_count=None, is_train=True, name=None,
                  **options):
  """One row per id: returns ids.shape + [dim]. In training, ids are
  counted and admitted, and the looked-up rows and their addresses go to
  the mxRec collections (see the module doc)."""
  del send_count, options  # routing sizes are computed, not configured
  if not isinstance(hashtable, HashTable):
    raise ValueError(f"sparse_lookup needs a table from create_table, got "
                     f"{type(hashtable).__name__}")
  ids = tf.convert_to_tensor(ids)
  if not ids.dtype.is_integer and ids.dtype != tf.string:
    raise TypeError(f"table {hashtable.name}: ids must be integers or strings, got "
                    f"{ids.dtype.name}")
  with tf.name_scope(name or f"sparse_lookup_{hashtable.name}"):
    keys = (inputs_lib.string_keys(ids) if ids.dtype == tf.string
            else tf.cast(ids, tf.int64))
    flat = tf.reshape(keys, [-1])
    unique, inverse, counts = ops.unique_with_counts(flat)
    table = hashtable.table
    comm = table.comm
    routed = routing.route_to_owners(
        comm, unique, inverse, comm.num_replicas, counts=tf.cast(counts, tf.int64),
        dynamic=True, stamp=table.steps[hashtable.replica].read_value())
    # The local embeddings are the rows this replica owns and serves; their
    # gradients come back through the reverse exchange.
    local, addresses = table.lookup_with_addresses(
        hashtable.replica, routed.requested, routed.counts, training=is_train)
    answered = routing.answer_requesters(comm, local, routed)
    if is_train:
      tf.compat.v1.add_to_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB, local)
      tf.compat.v1.add_to_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET, addresses)
      setattr(addresses, _TABLE_ATTRIBUTE, hashtable)
    rows = tf.gather(answered, routed.answer_index)
    return tf.reshape(rows, tf.concat([tf.shape(ids), [hashtable.dim]], 0))
