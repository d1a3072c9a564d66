"""Checkpoints of TensorFlow's TPU embedding mid-level API (TPUEmbedding,
TPUEmbeddingV2's SparseCore layouts, TPUEmbeddingForServing) read into
tfde tables of any replica count, and written from them."""

import numpy as np
import tensorflow as tf

from tfde import config as config_lib
from tfde import optimizers as optimizers_lib
from tfde.tpu.configs import _describe
from tfde.tpu.configs import to_tpu_feature_configs
from tfde.tpu.optimizer_mapping import _EMBEDDING
from tfde.tpu.optimizer_mapping import tpu_slot_offsets

# tfde slot name -> TPU slot name, per optimizer kind (TPU's checkpoint keys
# are `<prefix>/<table>.S<tpu slot>`).
TPU_SLOT_NAMES = {
    "sgd": {},
    "adagrad": {"accumulator": "accumulators"},
    "adam": {"m": "momenta", "v": "velocities"},
    "ftrl": {"accumulator": "accumulators", "linear": "linears"},
}

# Where the SparseCore layouts proto lies in a TPUEmbeddingV2 checkpoint
# (tensorflow/python/tpu/tpu_embedding_v3_utils.py).
SPARSECORE_LAYOUTS_KEY = "_sparse_core_table_layouts"

_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def _tpu_slot_names(optimizer, table_name):
  """tfde slot -> TPU slot of a table's `optimizer`; a ValueError naming the
  table for one TPU embedding has not (row-wise Adagrad)."""
  if optimizer.kind not in TPU_SLOT_NAMES:
    raise ValueError(f"table {table_name!r}: optimizer {optimizer.kind!r} has no TPU "
                     "form, so no TPU checkpoint holds its slots")
  return TPU_SLOT_NAMES[optimizer.kind]


def _lookup_of(layer_or_lookup):
  lookup = getattr(layer_or_lookup, "_lookup", layer_or_lookup)
  if not hasattr(lookup, "tables") or not hasattr(lookup, "feature_configs"):
    raise ValueError(f"expected a tfde DistributedEmbedding or ShardedLookup, "
                     f"got {_describe(layer_or_lookup)}")
  for table in lookup.tables.values():
    if table.is_dynamic:
      raise ValueError(f"table {table.name!r} is dynamic; TPU embedding has no "
                       "form for it")
  return lookup


def _find_prefix(names, tables, prefix):
  """The object path under which the checkpoint holds `tables` (a name each)."""
  if prefix is not None:
    return prefix
  candidates = None
  for table in tables:
    found = {n[:-len(f"/{table}{_VALUE_SUFFIX}")] if n != f"{table}{_VALUE_SUFFIX}"
             else "" for n in names
             if n.endswith(f"/{table}{_VALUE_SUFFIX}") or n == f"{table}{_VALUE_SUFFIX}"}
    candidates = found if candidates is None else candidates & found
  if candidates and len(candidates) == 1:
    return candidates.pop()
  if candidates:
    raise ValueError(f"the checkpoint holds the tables under several objects "
                     f"{sorted(candidates)}; pass prefix=")
  return None


def _key(prefix, name, slot=None):
  path = name if slot is None else f"{name}.S{slot}"
  return (f"{prefix}/{path}" if prefix else path) + _VALUE_SUFFIX


def _sparsecore_layouts(reader, names):
  for name in names:
    if SPARSECORE_LAYOUTS_KEY in name:
      from tensorflow.core.tpu.kernels import sparse_core_layout_pb2  # pylint: disable=g-import-not-at-top
      layouts = sparse_core_layout_pb2.SparseCoreTableLayouts()
      layouts.ParseFromString(reader.get_tensor(name))
      return {layout.table_name: layout for layout in layouts.tables}
  return {}


def unshuffle_sparsecore(stacked, layout):
  """A table's [V, D] rows from SparseCore's stacked, sharded variable:
  row `id` lies in shard `(id % S + rotation) % S` at position
  `offset + id // S` (S sparse cores), padding cut off."""
  stacked = np.asarray(stacked)
  cores = layout.num_sparse_cores
  shards = stacked.reshape(cores, stacked.shape[0] // cores, stacked.shape[1])
  per_shard = layout.unsharded_padded_shape[0] // cores
  offset = layout.sparse_core_shard_row_offset
  part = np.roll(shards[:, offset:offset + per_shard], -layout.sparse_core_shard_rotation,
                 axis=0)
  rows = part.transpose(1, 0, 2).reshape(per_shard * cores, stacked.shape[1])
  vocab, dim = layout.unsharded_shape
  return rows[:vocab, :dim]


def read_tpu_checkpoint(path, table_configs, prefix=None, optimizers=None):
  """table name -> {"table": [V, D], tfde slot name: [V, D]} from a TPU
  embedding checkpoint, for tfde `TableConfig`s (their optimizers say
  which slots, and how TPU's differ). A ValueError naming the table for a
  missing table or slot, or a shape that differs.

  `optimizers`: table name -> the `SparseOptimizer` a table trains with
  (its settings may have changed since its config was made); by default
  each built from its config."""
  reader = tf.train.load_checkpoint(path)
  names = set(reader.get_variable_to_shape_map())
  layouts = _sparsecore_layouts(reader, names)
  plain = [c.name for c in table_configs if c.name not in layouts]
  stacked = sorted({layouts[c.name].stacked_table_name for c in table_configs
                    if c.name in layouts})
  if plain or stacked:
    prefix = _find_prefix(names, plain + stacked, prefix)
  found = sorted(n[:-len(_VALUE_SUFFIX)] for n in names
                 if n.endswith(_VALUE_SUFFIX) and ".S" not in n)
  values = {}
  for config in table_configs:
    layout = layouts.get(config.name)
    source = layout.stacked_table_name if layout is not None else config.name
    wanted = {"table": None}
    optimizer = (optimizers or {}).get(config.name) or optimizers_lib.get(
        config.optimizer, config.name)
    offsets = tpu_slot_offsets(optimizer)
    wanted.update(_tpu_slot_names(optimizer, config.name))
    state = {}
    for tfde_key, tpu_slot in wanted.items():
      key = _key(prefix, source, tpu_slot)
      if prefix is None or key not in names:
        what = "table" if tpu_slot is None else f"slot {tpu_slot!r}"
        raise ValueError(
            f"table {config.name!r}: the checkpoint has no {what} for it "
            f"(looked for {key!r}; variables found: {found})"
            + ("" if tpu_slot is None else
               f"; was it trained with another optimizer than "
               f"{optimizer.kind!r}?"))
      value = reader.get_tensor(key)
      if layout is not None:
        value = unshuffle_sparsecore(value, layout)
      value = np.asarray(value, np.float32)
      expected = (config.vocabulary_size, config.embedding_dim)
      if value.shape != expected:
        raise ValueError(f"table {config.name!r}: the checkpoint's "
                         f"{tfde_key if tpu_slot is None else tpu_slot} has "
                         f"shape {value.shape}, the model's is {expected}")
      if tpu_slot is not None:
        value = value - offsets.get(tfde_key, 0.0)
      state[tfde_key] = value
    values[config.name] = state
  return values


def restore_tpu_checkpoint(layer_or_lookup, path, prefix=None, step=0):
  """Loads every table of a tfde `DistributedEmbedding` or `ShardedLookup`
  (any replica count) and its optimizer slots from a TPU embedding
  checkpoint at `path`: `tf.train.Checkpoint(<prefix>=TPUEmbedding...)`,
  with tables `<prefix>/<table>` and slots `<table>.S<slot>`, or
  SparseCore's stacked and sharded tables with their layouts.

  `prefix` is the checkpoint's object path of the TPU embedding object
  (found when unambiguous). TPU checkpoints keep no per-table step, so each
  table's step becomes `step` (it matters to Adam's bias correction). Every
  table is checked before any is written: an error names the table, and
  nothing changes.
  """
  lookup = _lookup_of(layer_or_lookup)
  tables = lookup.tables
  values = read_tpu_checkpoint(path, [t.config for t in tables.values()], prefix,
                               {name: t.optimizer for name, t in tables.items()})
  states = {}
  for name, table in tables.items():
    state = {"table": values[name]["table"],
             "step": np.asarray(step, np.int64)}
    for slot in table.optimizer.slot_names:
      state["slot_" + slot] = values[name][slot]
    table.check_state(state)
    states[name] = state
  for name, table in tables.items():
    table.load_state(states[name])


def write_tpu_checkpoint(layer_or_lookup, path, prefix="embedding"):
  """Writes the tables and optimizer slots of a tfde layer or lookup as
  `tf.train.Checkpoint(<prefix>=TPUEmbeddingForServing(...))` does, so
  TensorFlow's TPU embedding objects of the same configuration restore it.
  Returns the path written."""
  lookup = _lookup_of(layer_or_lookup)
  # One feature per table is enough to make TPU's variables; learning rates
  # do not enter a checkpoint, so a constant step serves Adam's conversion.
  features = {name: config_lib.FeatureConfig(name=f"{name}_feature",
                                             table=table.config)
              for name, table in lookup.tables.items()}
  tpu_features = to_tpu_feature_configs(features, iterations=tf.constant(0))
  serving = _EMBEDDING.TPUEmbeddingForServing(tpu_features, optimizer=None)
  serving.build()
  for name, table in lookup.tables.items():
    state = {k: v.numpy() for k, v in table.state().items()}
    variables = serving._variables[name]  # pylint: disable=protected-access
    variables["parameters"].assign(state["table"])
    offsets = tpu_slot_offsets(table.optimizer)
    for slot, tpu_slot in _tpu_slot_names(table.optimizer, name).items():
      variables[tpu_slot].assign(state["slot_" + slot] + offsets.get(slot, 0.0))
  return tf.train.Checkpoint(**{prefix: serving}).write(path)
