"""NVIDIA SOK's (v2) API on tfde: `import tfde.compat.sok as sok`.

>>> import numpy as np, tensorflow as tf
>>> import tfde.compat.sok as sok
>>> sok.init()
>>> v = sok.Variable(np.ones((10, 4), np.float32))
>>> ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 2], tf.int64), [2, 1])
>>> with tf.GradientTape() as tape:
...   emb = sok.lookup_sparse([v], [ids], combiners=["sum"])[0]
...   loss = tf.reduce_sum(emb)
>>> grads = tape.gradient(loss, [v])
>>> sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.5)).apply_gradients(zip(grads, [v]))
>>> float(v[1, 0]), float(v[0, 0])
(0.5, 1.0)

As in SOK, a `Variable` is this process's shard of a table sharded over the
processes (one replica per process: Horovod after `init(comm_tool=
"horovod")`, or a single process), gradients are `tf.IndexedSlices` on that
shard, and an `OptimizerWrapper` applies a Keras optimizer (SGD, Adagrad,
Adam, Ftrl; Adam is lazy, as SOK's) to the touched rows only; the wrapper's
optimizer decides the table's slots on first use. Where SOK's semantics are
unclear we follow its documentation: `mode` accepts only "distributed"
(rows by id % N, SOK's default and tfde's only layout).

`DynamicVariable` is a dynamic table (any int64 key; rows made on first
lookup); its gradient is `tf.IndexedSlices` whose indices are keys, applied
by the same wrappers. SOK v1's `Init`, `DistributedEmbedding` and
`All2AllDenseEmbedding` are Keras layers over one table, with
`use_hashtable=True` (SOK's default) meaning a dynamic table holding at
most `max_vocabulary_size_per_gpu` rows per replica (beyond it, the least
frequent rows are evicted; SOK leaves a full hash table undefined), and
False a static table of `max_vocabulary_size_per_gpu` rows per replica.
Tested in one process and over 2 and 4 Horovod ranks. Their tables'
variables are in the layers' `trainable_weights`, so
`split_embedding_variable_from_others(model.trainable_variables)` finds
them.
"""

import dataclasses
import itertools

import keras
import numpy as np
import tensorflow as tf

from tfde import comm as comm_lib
from tfde import config as config_lib
from tfde import lookup as lookup_lib
from tfde import optimizers as optimizers_lib
from tfde import tables as tables_lib

_names = itertools.count()
_initialized = {"comm_tool": None}


def init(comm_tool=None, use_legacy_optimizer=True):
  """SOK v2's init. comm_tool: "horovod" (then hvd.init() is called) or
  None (a single process)."""
  del use_legacy_optimizer
  if comm_tool not in (None, "horovod"):
    raise ValueError(f"comm_tool must be 'horovod' or None, got {comm_tool!r}")
  if comm_tool == "horovod":
    import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
    hvd.init()
  _initialized["comm_tool"] = comm_tool


def _table_of(variable):
  owner = tables_lib.owner_of(variable)
  if owner is None:
    raise ValueError(f"{getattr(variable, 'name', variable)} is not a "
                     "sok.Variable")
  return owner[0]


def Variable(initial_value=None, shape=None, dtype=tf.float32,  # pylint: disable=invalid-name
             mode="distributed", initializer=None, name=None):
  """This process's shard of a [V, D] table: `initial_value` (an array of
  the whole table) or `shape` with an `initializer`."""
  if mode != "distributed":
    raise ValueError(f"mode must be 'distributed' (rows sharded by id % N), "
                     f"got {mode!r}")
  if dtype != tf.float32:
    raise ValueError(f"only float32 tables are supported, got {dtype}")
  if initial_value is not None:
    initial_value = np.asarray(initial_value, np.float32)
    shape = initial_value.shape
  if shape is None or len(shape) != 2:
    raise ValueError(f"a sok.Variable needs a [V, D] initial_value or shape, "
                     f"got {shape}")
  config = config_lib.TableConfig(
      name=name or f"sok_variable_{next(_names)}", vocabulary_size=int(shape[0]),
      embedding_dim=int(shape[1]), combiner="sum",
      initializer=initial_value if initial_value is not None else initializer)
  return _process_shard(tables_lib.ShardedTable(config, comm_lib.current()), "Variable")


def DynamicVariable(dimension, initializer=None, var_type=None,  # pylint: disable=invalid-name
                    key_type=tf.int64, dtype=tf.float32, mode="distributed",
                    name=None, **kwargs):
  """SOK v2's DynamicVariable: a dynamic table of `dimension`-wide rows for
  any int64 key (or string key: its 64-bit fingerprint,
  `tfde.inputs.string_keys`). `initializer`: "random" (SOK's default; uniform in
  [-0.05, 0.05] here), a number (a constant), or a Keras initializer that
  tfde draws per id. var_type ("hybrid", "hbm") is accepted: rows live in
  host memory."""
  del var_type, kwargs
  if mode != "distributed":
    raise ValueError(f"mode must be 'distributed', got {mode!r}")
  if key_type not in (tf.int64, tf.int32, tf.string) or dtype != tf.float32:
    raise ValueError(f"DynamicVariable supports int64/int32/string keys and float32 "
                     f"rows, got {key_type} and {dtype}")
  config = config_lib.TableConfig(
      name=name or f"sok_dynamic_variable_{next(_names)}", vocabulary_size=None,
      embedding_dim=int(dimension), combiner="sum",
      initializer="random" if initializer is None else initializer)
  return _process_shard(tables_lib.DynamicTable(config, comm_lib.current()),
                        "DynamicVariable")


def _process_shard(table, kind):
  """The variable SOK hands out: this process's one shard of `table`."""
  variables = table.local_variables()
  if len(variables) != 1:
    raise ValueError(f"sok.{kind} holds one shard per process; use "
                     "tfde.layers under MirroredStrategy instead")
  return variables[0]  # it keeps its table alive (Table._own)


def _as_list(x):
  return list(x) if isinstance(x, (list, tuple)) else [x]


def lookup_sparse(params, sp_ids, sp_weights=None, combiners=None):
  """One embedding per (variable, ids) pair: [batch, D] each. As SOK's:
  `combiners` defaults to "mean" for every lookup, and one variable with
  one SparseTensor (not lists) gives one tensor."""
  one = not isinstance(sp_ids, (list, tuple)) and not isinstance(sp_weights, tuple)
  params, sp_ids = _as_list(params), _as_list(sp_ids)
  if len(params) != len(sp_ids):
    raise ValueError(f"params and sp_ids must have one entry per feature; got "
                     f"{len(params)} and {len(sp_ids)}")
  combiners = ["mean"] * len(params) if combiners is None else _as_list(combiners)
  if len(combiners) != len(params):
    raise ValueError(f"combiners has {len(combiners)} entries for "
                     f"{len(params)} features")
  sp_weights = _as_list(sp_weights) if sp_weights is not None else [None] * len(params)
  if len(sp_weights) != len(params):
    raise ValueError(f"sp_weights has {len(sp_weights)} entries for "
                     f"{len(params)} features")
  tables = [_table_of(v) for v in params]
  features, inputs, weights = {}, {}, {}
  for i, (table, ids, w, c) in enumerate(zip(tables, sp_ids, sp_weights, combiners)):
    # The combiner is a property of the lookup in SOK, of the table config
    # in tfde: a feature carries its own copy of the config.
    cfg = dataclasses.replace(table.config, combiner=c, optimizer=table.optimizer)
    name = f"feature_{i}"
    features[name] = config_lib.FeatureConfig(name=name, table=cfg)
    inputs[name] = ids
    if w is not None:
      weights[name] = w
  lookup = lookup_lib.cached_lookup(
      tables, combiners, lambda: lookup_lib.ShardedLookup(
          list(features.values()), tables={t.name: t for t in tables},
          train_in_backward=False, name="sok_lookup"))
  out = lookup(inputs, weights or None)
  outputs = [out[f"feature_{i}"] for i in range(len(params))]
  return outputs[0] if one else outputs


class OptimizerWrapper:
  """Applies a Keras optimizer to sok.Variable gradients (touched rows)."""

  def __init__(self, optimizer):
    self._optimizer = optimizers_lib.get(optimizer, table_name="sok")

  def apply_gradients(self, grads_and_vars):
    grads_and_vars = list(grads_and_vars)
    tables = [_table_of(var) for _, var in grads_and_vars]
    # Every table checked before any switches: a refusal leaves all as they were.
    for table in tables:
      tables_lib.base.check_switch(table, self._optimizer)
    for table in tables:
      table.use_optimizer(self._optimizer)
    return self._optimizer.apply_gradients(grads_and_vars)


class optimizers:  # pylint: disable=invalid-name
  """SOK v1's optimizer names."""

  @staticmethod
  def Adam(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7):  # pylint: disable=invalid-name
    return OptimizerWrapper(optimizers_lib.Adam(
        learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon))

  LazyAdamOptimizer = Adam


def split_embedding_variable_from_others(variables):
  """(sok variables, other variables), each in the given order."""
  sok_vars, others = [], []
  for v in variables:
    is_sok = tables_lib.owner_of(v) is not None
    (sok_vars if is_sok else others).append(v)
  return sok_vars, others


# ---- SOK v1


def Init(global_batch_size=None, **kwargs):  # pylint: disable=invalid-name
  """SOK v1's Init: one replica per process (Horovod once hvd.init() has
  run, else a single process). global_batch_size is accepted: tfde
  preallocates nothing from it."""
  del global_batch_size, kwargs


def _v1_table(name, dimension, max_vocabulary_size_per_gpu, use_hashtable,
              initializer, combiner):
  comm = comm_lib.current()
  if use_hashtable:
    return config_lib.TableConfig(
        name=name, vocabulary_size=None, embedding_dim=dimension,
        combiner=combiner, initializer=initializer,
        dynamic=config_lib.DynamicConfig(
            max_rows_per_shard=int(max_vocabulary_size_per_gpu)))
  return config_lib.TableConfig(
      name=name, vocabulary_size=int(max_vocabulary_size_per_gpu) * comm.num_replicas,
      embedding_dim=dimension, combiner=combiner, initializer=initializer)


class _EmbeddingLayerBase:
  """Shared by the v1 layers: one table, one explicit-gradient lookup."""

  holds_tfde_tables = True  # see tfde.compat.keras_multiworker

  def _make_lookup(self, config):
    # SOK's tables are distributed (rows by id % N), however small.
    self._lookup = lookup_lib.ShardedLookup(
        [config_lib.FeatureConfig(name="ids", table=config)],
        train_in_backward=False, auto_replicate_bytes=0, name=f"{self.name}_lookup")
    self.table = self._lookup.tables[config.name]

  @property
  def weights(self):  # Keras collects a model's variables through this
    return list(super().weights) + self.table.local_variables()

  def _embed(self, ids):
    return self._lookup({"ids": ids})["ids"]


class DistributedEmbedding(_EmbeddingLayerBase, keras.layers.Layer):
  """SOK v1's sparse embedding layer: a SparseTensor of
  [batch * slot_num, max_nnz] ids (each row one slot of one sample) ->
  [batch, slot_num, embedding_vec_size], combining each slot's ids."""

  def __init__(self, combiner, max_vocabulary_size_per_gpu, embedding_vec_size,
               slot_num, max_nnz, max_feature_num=1, use_hashtable=True,
               key_dtype=None, embedding_initializer=None, **kwargs):
    super().__init__(**kwargs)
    del max_feature_num, key_dtype
    if combiner not in config_lib.COMBINERS:
      raise ValueError(f"combiner must be one of {config_lib.COMBINERS}, got {combiner!r}")
    self.slot_num, self.max_nnz = int(slot_num), int(max_nnz)
    self.embedding_vec_size = int(embedding_vec_size)
    self._make_lookup(_v1_table(
        f"{self.name}_table", self.embedding_vec_size, max_vocabulary_size_per_gpu,
        use_hashtable, embedding_initializer, combiner))

  def call(self, inputs, training=None):
    del training
    if not isinstance(inputs, tf.SparseTensor):
      raise ValueError(f"{self.name}: inputs must be a tf.SparseTensor of "
                       f"[batch * slot_num, max_nnz] ids, got {type(inputs).__name__}")
    out = self._embed(inputs)
    return tf.reshape(out, [-1, self.slot_num, self.embedding_vec_size])


class All2AllDenseEmbedding(_EmbeddingLayerBase, keras.layers.Layer):
  """SOK v1's dense embedding layer: ids [batch, slot_num, nnz_per_slot]
  -> [batch, slot_num, nnz_per_slot, embedding_vec_size], one row per
  id; with dynamic_input=True, ids [n] -> [n, embedding_vec_size]."""

  def __init__(self, max_vocabulary_size_per_gpu, embedding_vec_size, slot_num,
               nnz_per_slot, dynamic_input=False, use_hashtable=True,
               key_dtype=None, embedding_initializer=None, **kwargs):
    super().__init__(**kwargs)
    del key_dtype
    self.slot_num, self.nnz_per_slot = int(slot_num), int(nnz_per_slot)
    self.embedding_vec_size = int(embedding_vec_size)
    self.dynamic_input = dynamic_input
    self._make_lookup(_v1_table(
        f"{self.name}_table", self.embedding_vec_size, max_vocabulary_size_per_gpu,
        use_hashtable, embedding_initializer, "sum"))

  def call(self, inputs, training=None):
    del training
    ids = tf.convert_to_tensor(inputs)
    out = self._embed(tf.reshape(ids, [-1]))
    if self.dynamic_input:
      return out
    return tf.reshape(out, [-1, self.slot_num, self.nnz_per_slot,
                            self.embedding_vec_size])
