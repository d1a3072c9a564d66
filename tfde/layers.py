"""keras-rs-compatible layers: switch by changing one import.

>>> import keras, tensorflow as tf
>>> import tfde
>>> table = tfde.layers.TableConfig(name="movie", vocabulary_size=1000,
...                                 embedding_dim=8, optimizer="adagrad")
>>> features = {"watched": tfde.layers.FeatureConfig(
...     name="watched", table=table, input_shape=(4, 3), output_shape=(4, 8))}
>>> layer = tfde.layers.DistributedEmbedding(features)
>>> out = layer({"watched": tf.constant([[1, 2, 3]] * 4)})
>>> out["watched"].shape
TensorShape([4, 8])

Unlike keras-rs off TPU, each table's own optimizer is honoured on every
device: the tables train inside the backward pass (sparse, touched rows
only), and the optimizer given to `model.compile` trains only the dense
layers. The layer's single trainable weight, `sparse_update_trigger`, is a
zero scalar whose gradient runs that backward pass.
"""

from tfde import keras_support

if not keras_support.has_keras3():
  raise ImportError(keras_support.missing_keras3_message())


import keras  # noqa: E402
import numpy as np
import tensorflow as tf

from tfde import inputs as inputs_lib
from tfde import lookup as lookup_lib
from tfde import planner as planner_lib
from tfde import tf_internals
from tfde import tpu as tpu_lib
from tfde.compat import keras_multiworker
from tfde.config import FeatureConfig  # noqa: F401 (re-export)
from tfde.config import TableConfig  # noqa: F401 (re-export)
from tfde.ops import row_features
from tfde.tables import base as tables_base

_FEATURE_KEY = "__tfde_feature_config__"


def _serialize_structure(structure):
  return tf.nest.map_structure(
      lambda f: {_FEATURE_KEY: f.get_config()}, structure)


def _deserialize_structure(structure, tables):
  if isinstance(structure, dict):
    if set(structure) == {_FEATURE_KEY}:
      return FeatureConfig.from_config(structure[_FEATURE_KEY], tables)
    return {k: _deserialize_structure(v, tables) for k, v in structure.items()}
  if isinstance(structure, (list, tuple)):
    return type(structure)(_deserialize_structure(v, tables) for v in structure)
  raise ValueError(f"unexpected entry in a feature config structure: {structure!r}")


def _batch_size(ids):
  if isinstance(ids, tf.SparseTensor):
    return tf.cast(ids.dense_shape[0], tf.int32)
  if isinstance(ids, tf.RaggedTensor):
    return ids.nrows(out_type=tf.int32)
  return tf.shape(ids)[0]


def _placeholder_output(feature, ids):
  """Zeros of a feature's output shape (Keras's symbolic build)."""
  batch, dim = _batch_size(ids), feature.table.embedding_dim
  if feature.output == "sequence":
    return tf.zeros(tf.stack([batch, feature.max_sequence_length, dim]))
  if feature.output == "ragged":
    return tf.RaggedTensor.from_row_lengths(tf.zeros([0, dim]), tf.zeros([batch], tf.int64))
  return tf.zeros(tf.stack([batch, dim]))


class _StagedLoad:
  """The tfde layers' states read from one Keras weights store, written
  when Keras closes the store at the end of its load, and only if every
  tfde layer's state checked out and Keras recorded no other failure: a
  model with several tfde layers (or a failing dense layer) loads every
  table or none. Keras loads each object on its own and reports the
  failures at the end, so without this the layers read before a bad one
  would already be loaded."""

  _STORES = ("H5IOStore", "ShardedH5IOStore", "NpzIOStore")

  def __init__(self, store):
    self.writes, self.failed = [], False
    close = store.close

    def close_and_write():
      try:
        # Keras's saving_lib, closing the store, holds its failures and
        # whether they are only warnings. Where they cannot be read, the
        # tfde layers' own checks decide.
        others_failed, partial_ok = tf_internals.keras_load_outcome()
        if partial_ok or not (self.failed or others_failed):
          for write in self.writes:
            write()
      finally:
        del store.close
        close()

    store.close = close_and_write

  @classmethod
  def of(cls, store):
    """The staged load of a Keras weights store (one per store), or None
    for another store (a dict: written at once)."""
    if type(store).__name__ not in cls._STORES or not hasattr(store, "close"):
      return None
    staged = getattr(store, "_tfde_staged_load", None)
    if staged is None:
      staged = cls(store)
      store._tfde_staged_load = staged  # pylint: disable=protected-access
    return staged


@keras.saving.register_keras_serializable(package="tfde")
class DistributedEmbedding(keras.layers.Layer):
  """Embedding lookups for many features in sharded (or replicated) tables.

  Args:
    feature_configs: `FeatureConfig`s in any nested structure (dict, list,
      tuple, nested); inputs and outputs have the same structure. tfde's,
      `tf.tpu.experimental.embedding`'s (with their optimizers) and
      keras-rs's configs are all accepted (`tfde.tpu.as_feature_configs`).
    table_stacking: "auto" (tables of one width and placement share an
      exchange), None (each table alone), or lists of table names.
    plan: a `tfde.planner.ShardingPlan` (or its config) laying out the
      tables (row-wise, table-wise, column-wise, replicated); None keeps
      `placement`. Saved with the layer's config; it fixes the replica
      count (checkpoints and weights still restore under any plan).
    exchange: what row-wise tables send between replicas: "auto" (each
      owner's partial sums of every sample, for row-wise tables whose
      features are pooled, renormalise no rows and, where their
      `input_shape` declares it, average 2N ids a sample or more) or
      "rows" (each replica's unique ids' rows); see
      `tfde.lookup.ShardedLookup`.
    **kwargs: Keras layer arguments (name, dtype, ...).

  Build the layer under the strategy's scope (as Keras models are): its
  tables are created at construction, sharded over that strategy's
  replicas.
  """

  holds_tfde_tables = True  # see tfde.compat.keras_multiworker

  def __init__(self, feature_configs, table_stacking="auto", plan=None, exchange="auto",
               **kwargs):
    super().__init__(**kwargs)
    if not tf.nest.flatten(feature_configs):
      raise ValueError("feature_configs is empty")
    # tfde, tf.tpu.experimental.embedding or keras-rs configs (an unknown
    # object: an error naming its module and class).
    feature_configs = tpu_lib.as_feature_configs(feature_configs)
    flat = tf.nest.flatten(feature_configs)
    self._feature_configs = feature_configs
    self._flat_features = flat
    self.table_stacking = table_stacking
    self.plan = planner_lib.as_plan(plan)
    self.sparse_update_trigger = self.add_weight(
        shape=(), initializer="zeros", trainable=True,
        name="sparse_update_trigger")
    self._lookup = lookup_lib.ShardedLookup(
        {f.name: f for f in flat}, table_stacking=table_stacking, plan=self.plan,
        update_trigger=self.sparse_update_trigger.value, exchange=exchange,
        name=f"{self.name}_lookup")
    self.exchange = exchange
    self._serving_tables = None
    if isinstance(tf.distribute.get_strategy(),
                  tf.distribute.MultiWorkerMirroredStrategy):
      # Keras's fit needs two fixes under this strategy (see the module);
      # they apply to models holding a tfde layer only.
      keras_multiworker.apply()
    self.built = True

  def build(self, input_shape=None):
    del input_shape  # built at construction, under the strategy's scope

  @property
  def tables(self):
    """dict of table name -> tfde.tables.ShardedTable."""
    return self._lookup.tables

  def _by_name(self, structure, what):
    """Maps a structure like feature_configs to {feature name: leaf}."""
    if structure is None:
      return None
    configs = self._feature_configs
    if isinstance(configs, dict) and isinstance(structure, dict):
      missing = [k for k in configs if k not in structure]
      if missing and what == "inputs":
        f = tf.nest.flatten(configs[missing[0]])[0]
        raise ValueError(f"feature {f.name} (table {f.table.name}) is missing "
                         f"from the inputs")
      extra = sorted(set(structure) - set(configs))
      if extra:
        raise ValueError(f"{what} have features {extra} that are not in the "
                         f"configuration; configured: {sorted(configs)}")
      if what == "weights":
        structure = {k: structure.get(k) for k in configs}
    try:
      leaves = tf_internals.flatten_up_to(configs, structure)
    except (ValueError, TypeError) as e:
      raise ValueError(f"{what} do not have the structure of feature_configs "
                       f"({', '.join(f.name for f in self._flat_features)}): {e}"
                       ) from e
    return {f.name: x for f, x in zip(self._flat_features, leaves)
            if x is not None}

  def preprocess(self, inputs, weights=None, training=False):
    """keras-rs's optional preprocessing step. Off SparseCore there is
    nothing to precompute: returns the inputs (and weights) unchanged, in a
    form `call` accepts."""
    del training
    if weights is None:
      return inputs
    return {"inputs": inputs, "weights": weights}

  def call(self, inputs, weights=None, training=None):
    # Dynamic tables count sightings and admit ids in every call except
    # those with training=False (Keras's predict and evaluate pass it).
    updates_dynamic_tables = training is None or (
        isinstance(training, bool) and training)
    if isinstance(inputs, dict) and set(inputs) == {"inputs", "weights"} and (
        not isinstance(self._feature_configs, dict) or
        not {"inputs", "weights"} <= set(self._feature_configs)):
      inputs, weights = inputs["inputs"], inputs["weights"]  # from preprocess
    by_name = self._by_name(inputs, "inputs")
    if tf_internals.in_keras_stateless_scope():
      # Keras infers output shapes by tracing call in a scratch graph (its
      # symbolic build of subclassed models); no lookup may run there.
      return tf.nest.pack_sequence_as(self._feature_configs, [
          tf.cast(_placeholder_output(f, by_name[f.name]), self.compute_dtype)
          for f in self._flat_features])
    weights_by_name = self._by_name(weights, "weights")
    if self._serving_tables is not None:
      outputs = self._serving_lookup(self._serving_tables, by_name, weights_by_name)
    else:
      outputs = self._lookup(by_name, weights_by_name,
                             trigger=tf.convert_to_tensor(self.sparse_update_trigger.value),
                             training=updates_dynamic_tables)
    # Combined in float32; returned in the layer's compute dtype (a Keras
    # mixed-precision policy such as "mixed_bfloat16").
    dtype = tf.as_dtype(self.compute_dtype)
    return tf.nest.pack_sequence_as(
        self._feature_configs,
        [outputs[f.name] if dtype == tf.float32 else tf.cast(outputs[f.name], dtype)
         for f in self._flat_features])

  def serve_from(self, tables):
    """Looks up from `tables` (table name -> whole-table variable, or a
    `tfde.serving.DynamicServingTable`) with stock TensorFlow ops only, as
    an exported SavedModel does, until `serve_from(None)`. Used by
    `tfde.serving.export_for_serving`."""
    self._serving_tables = tables

  def _serving_lookup(self, tables, inputs, weights):
    """Lookups with stock TensorFlow ops only, on whole-table variables (see
    tfde.serving): what an exported SavedModel runs."""
    weights = weights or {}
    outputs = {}
    for f in self._flat_features:
      ids, splits, w = inputs_lib.flatten_feature(f.name, f.table.name,
                                                  inputs[f.name], weights.get(f.name),
                                                  strings=f.table.is_dynamic)
      length = output_splits = None
      if f.output != "pooled":
        if w is not None:
          raise ValueError(f"{inputs_lib.describe(f.name, f.table.name)}: weights "
                           f"are given but the feature is unpooled")
        length = f.max_sequence_length
        ids, splits, output_splits = inputs_lib.unpool(
            inputs[f.name], ids, splits, length, inputs_lib.describe(f.name, f.table.name))
      served = tables[f.table.name]
      if f.table.is_dynamic:
        rows = served.lookup(ids)
      else:
        ids = inputs_lib.check_id_range(ids, f.table.vocabulary_size, f.name,
                                        f.table.name)
        # GatherNd, not Gather: the same rows, and TensorFlow's CPU GatherNd
        # kernel copies them about a third faster (the export's forward:
        # 13 to 10 ms, bench/forward_bench.py).
        rows = tf.gather_nd(served, ids[:, None])
      rows = tf.cast(rows, tf.float32)  # reduced-precision rows combine in float32
      if f.table.max_norm is not None:
        rows = row_features.renormalize_rows(rows, f.table.max_norm)
      given = inputs[f.name]
      hotness = None  # ragged, sparse or unpooled: a segment sum
      if f.output == "pooled" and not isinstance(given, (tf.RaggedTensor, tf.SparseTensor)):
        given = tf.convert_to_tensor(given)
        hotness = 1 if given.shape.rank == 1 else tf.shape(given, out_type=tf.int64)[1]
      out = inputs_lib.combine_served_rows(
          rows, splits, w, f.table.combiner if f.output == "pooled" else "sum", hotness)
      outputs[f.name] = inputs_lib.shape_output(
          inputs_lib.FlatFeature(f.name, None, ids, splits, w, length, output_splits),
          out)
    return outputs

  def compute_output_spec(self, inputs, weights=None, training=False):
    del weights, training
    by_name = self._by_name(inputs, "inputs")
    specs = []
    for f in self._flat_features:
      batch = by_name[f.name].shape[0] if f.name in by_name else None
      if f.output == "pooled":
        shape = (batch, f.table.embedding_dim)
      else:
        shape = (batch, f.max_sequence_length, f.table.embedding_dim)
      specs.append(keras.KerasTensor(shape, dtype=self.compute_dtype,
                                     ragged=f.output == "ragged"))
    return tf.nest.pack_sequence_as(self._feature_configs, specs)

  def get_embedding_tables(self):
    """dict of table name -> the full [V, D] table as a tensor (as keras-rs
    returns: a copy, not the variables), gathered from its shards; a
    dynamic table gives its `export_rows()` dict of numpy arrays (ids,
    table, slots, counts)."""
    # On the host: a whole sharded table may not fit one accelerator.
    with tf.device("/device:CPU:0"):
      return {name: value if isinstance(value, dict) else tf.constant(value)
              for name, value in self._lookup.table_values().items()}

  # ---- saving: whole tables, so a model reloads under any replica count
  #
  # Each table's state (`Table.state()`) under keys "<table>:<key>" ("/"
  # would open groups in an H5 weight file), slots without their "slot_"
  # prefix (the format's spelling since its first version).

  @staticmethod
  def _store_key(table_name, state_key):
    return f"{table_name}:{state_key.removeprefix(tables_base.SLOT_PREFIX)}"

  def save_own_variables(self, store):
    store["sparse_update_trigger"] = np.asarray(self.sparse_update_trigger.numpy())
    for name, table in self._lookup.tables.items():
      stored = {self._store_key(name, key): value.numpy()
                for key, value in table.state().items()}
      for key, value in stored.items():
        store[key] = value
      # HDF5 keeps no checksum: a flipped bit would load silently.
      store[self._store_key(name, "checksum")] = np.asarray(
          tables_base.state_checksum(stored), np.int64)

  def load_own_variables(self, store):
    staged = _StagedLoad.of(store)
    try:
      write = self._checked_load(store)
    except Exception:
      if staged is not None:
        staged.failed = True
      raise
    if staged is None:
      write()
    else:
      staged.writes.append(write)

  def _checked_load(self, store):
    """Reads and checks every table's saved state; returns the function
    that writes them (nothing is written before every table checked out)."""
    keys = set(store.keys())
    states = {}
    for name, table in self._lookup.tables.items():
      if self._store_key(name, "table") not in keys:
        raise ValueError(f"the saved weights have no table {name!r}; saved: "
                         f"{sorted(k.split(':')[0] for k in keys if k.endswith(':table'))}")
      if (self._store_key(name, "ids") in keys) != table.is_dynamic:
        kind = "static" if table.is_dynamic else "dynamic"
        raise ValueError(f"table {name!r}: the saved table is {kind}, the "
                         f"model's is not")
      states[name] = {key: np.asarray(store[self._store_key(name, key)])
                      for key in table.state_keys()
                      if self._store_key(name, key) in keys}
    # Every table is checked before any is written: a bad file changes
    # nothing. (Files saved before checksums existed have none.)
    for name, table in self._lookup.tables.items():
      table.check_state(states[name], source="saved")
      checksum_key = self._store_key(name, "checksum")
      if checksum_key in keys:
        # Over every array saved for the table, as written (a file may hold
        # slots of another optimizer, which loading ignores).
        saved_arrays = {k: np.asarray(store[k]) for k in keys
                        if k.rsplit(":", 1)[0] == name and k != checksum_key}
        saved = int(np.asarray(store[checksum_key]))
        read = tables_base.state_checksum(saved_arrays)
        if saved != read:
          raise ValueError(f"table {name!r}: the saved weights fail their "
                           f"checksum (saved {saved}, read {read}); the file "
                           "is corrupted, and nothing was loaded")
    trigger = np.asarray(store["sparse_update_trigger"])

    def write():
      self.sparse_update_trigger.assign(trigger)
      for name, table in self._lookup.tables.items():
        table.load_state(states[name], source="saved")
    return write

  def exchanges(self):
    """Table name -> what its rows' exchange between the replicas is
    (`tfde.lookup.ShardedLookup.exchanges`)."""
    return self._lookup.exchanges()

  def get_config(self):
    config = super().get_config()
    config.update({
        "feature_configs": _serialize_structure(self._feature_configs),
        "table_stacking": self.table_stacking,
    })
    if self.plan is not None:
      config["plan"] = self.plan.get_config()
    if self.exchange != "auto":
      config["exchange"] = self.exchange
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    config["feature_configs"] = _deserialize_structure(config["feature_configs"], {})
    return cls(**config)
