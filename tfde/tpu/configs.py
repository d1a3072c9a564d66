"""tfde's table and feature configs as TPU embedding ones and back, and
feature configs in any vocabulary (tfde, `tf.tpu.experimental.embedding`,
keras-rs) read as tfde's."""


import numpy as np
import tensorflow as tf

from tfde import config as config_lib
from tfde import initializers
from tfde.tpu.optimizer_mapping import _EMBEDDING
from tfde.tpu.optimizer_mapping import _SOURCE_ATTRIBUTE
from tfde.tpu.optimizer_mapping import from_tpu_optimizer
from tfde.tpu.optimizer_mapping import to_tpu_optimizer


def to_tpu_table_config(table, iterations=None, optimizer=None):
  """A `tf.tpu.experimental.embedding.TableConfig` for a static tfde
  `TableConfig` (see `to_tpu_optimizer` for `iterations`). `optimizer`:
  the `SparseOptimizer` the table trains with, by default built from its
  config."""
  if table.is_dynamic:
    raise ValueError(f"table {table.name!r} is dynamic (vocabulary_size=None); "
                     "TPU embedding tables have a fixed vocabulary")
  # TPU embedding pads the width it calls the initializer with.
  initializer = initializers.of_width(table.keras_initializer(), table.embedding_dim,
                                      table.name)
  if initializers.is_array(initializer):
    value = np.asarray(initializer, np.float32)
    initializer = lambda shape, dtype=tf.float32, **_: tf.constant(value, dtype)
  tpu_table = _EMBEDDING.TableConfig(
      vocabulary_size=table.vocabulary_size, dim=table.embedding_dim,
      initializer=initializer,
      optimizer=to_tpu_optimizer(table.optimizer if optimizer is None else optimizer,
                                 table.name, iterations),
      combiner=table.combiner, name=table.name)
  # tfde's fields TPU has no place for (seed, placement, partition hints,
  # nonfinite) come back with the table (`from_tpu_table_config`).
  setattr(tpu_table, _SOURCE_ATTRIBUTE, table)
  return tpu_table


def from_tpu_table_config(tpu_table, name=None):
  """A tfde `TableConfig` for a `tf.tpu.experimental.embedding.TableConfig`
  (`name` for an unnamed one)."""
  name = tpu_table.name or name
  where = f"table {name!r}"
  source = getattr(tpu_table, _SOURCE_ATTRIBUTE, None)
  if source is not None and (
      source.name, source.vocabulary_size, source.embedding_dim,
      source.combiner) == (tpu_table.name, tpu_table.vocabulary_size,
                           tpu_table.dim, tpu_table.combiner) and (
          _built_from(tpu_table.optimizer) == source.optimizer_config()):
    return source
  if not isinstance(tpu_table.combiner, str):
    raise ValueError(f"{where}: TPU combiner {type(tpu_table.combiner).__name__} "
                     "has no tfde equivalent; use 'sum', 'mean' or 'sqrtn'")
  if getattr(tpu_table, "quantization_config", None) is not None:
    raise ValueError(f"{where}: TPU quantization_config has no tfde equivalent")
  if getattr(tpu_table, "dtype", tf.float32) != tf.float32:
    raise ValueError(f"{where}: tfde tables are float32, got "
                     f"{tpu_table.dtype!r}")
  return config_lib.TableConfig(
      name=name, vocabulary_size=int(tpu_table.vocabulary_size),
      embedding_dim=int(tpu_table.dim), initializer=tpu_table.initializer,
      optimizer=from_tpu_optimizer(tpu_table.optimizer, name),
      combiner=tpu_table.combiner)


def _built_from(tpu_optimizer):
  """The config of the tfde optimizer `to_tpu_optimizer` made
  `tpu_optimizer` from, or None."""
  source = getattr(tpu_optimizer, _SOURCE_ATTRIBUTE, None)
  return None if source is None else source.get_config()


def _has_sequence_length():
  return "max_sequence_length" in {
      f.name for f in config_lib.dataclasses.fields(config_lib.FeatureConfig)}


def to_tpu_feature_configs(feature_configs, iterations=None, optimizers=None):
  """tfde `FeatureConfig`s (any nested structure) as
  `tf.tpu.experimental.embedding.FeatureConfig`s in the same structure;
  features sharing a table share its TPU `TableConfig`.

  An output_shape loses its last entry (TPU's omits the width);
  `max_sequence_length` None is TPU's 0. See `to_tpu_optimizer` for
  `iterations`. `optimizers`: table name -> the `SparseOptimizer` it
  trains with (by default each built from its config).
  """
  tables = {}

  def convert(feature):
    if not isinstance(feature, config_lib.FeatureConfig):
      raise ValueError(f"to_tpu_feature_configs takes tfde FeatureConfigs, got "
                       f"{_describe(feature)}")
    table = feature.table
    if getattr(feature, "output", None) == "ragged":
      raise ValueError(f"feature {feature.name!r} (table {table.name!r}): "
                       "output='ragged' has no TPU embedding form; use "
                       "max_sequence_length (a padded sequence) or pooling")
    if getattr(table, "max_norm", None) is not None:
      raise ValueError(f"table {table.name!r}: max_norm has no TPU embedding "
                       "form")
    if table.name not in tables:
      tables[table.name] = to_tpu_table_config(
          table, iterations, (optimizers or {}).get(table.name))
    output_shape = (None if feature.output_shape is None
                    else list(feature.output_shape[:-1]))
    return _EMBEDDING.FeatureConfig(
        table=tables[table.name], name=feature.name,
        max_sequence_length=getattr(feature, "max_sequence_length", None) or 0,
        output_shape=output_shape)

  return tf.nest.map_structure(convert, feature_configs)


def from_tpu_feature_configs(tpu_feature_configs):
  """`tf.tpu.experimental.embedding.FeatureConfig`s (any nested structure)
  as tfde `FeatureConfig`s in the same structure; features sharing a TPU
  table share one tfde `TableConfig`. Unnamed features take their dict key
  (or "feature_<i>"), unnamed tables "table_<i>", in order."""
  return as_feature_configs(tpu_feature_configs)


# ---------------------------------------------------------------- any vocabulary

def _describe(obj):
  return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _is_keras_rs(obj, class_name):
  # Duck-typed: keras-rs is not a dependency of tfde.
  return (type(obj).__module__.startswith("keras_rs") and
          type(obj).__name__ == class_name)


def as_feature_configs(feature_configs):
  """Any nested structure of tfde, `tf.tpu.experimental.embedding` or
  keras-rs `FeatureConfig`s as tfde `FeatureConfig`s, same structure. Tables
  shared by several features stay shared (one tfde `TableConfig` per source
  table). An unknown object: a ValueError naming its module and class.

  >>> import tensorflow as tf, tfde
  >>> t = tf.tpu.experimental.embedding.TableConfig(
  ...     vocabulary_size=10, dim=4, name="t",
  ...     optimizer=tf.tpu.experimental.embedding.SGD(0.1))
  >>> f = tfde.tpu.as_feature_configs(
  ...     [tf.tpu.experimental.embedding.FeatureConfig(table=t, name="a")])
  >>> f[0].table.embedding_dim, f[0].table.optimizer.kind
  (4, 'sgd')
  """
  tables = {}   # id(source table) -> tfde TableConfig
  names = iter(range(1 << 30))

  def table_of(source, convert):
    key = id(source)
    if key not in tables:
      tables[key] = convert()
    return tables[key]

  def convert(feature, path):
    if isinstance(feature, config_lib.FeatureConfig):
      table = table_of(feature.table, lambda: feature.table)
      if table is feature.table:
        return feature
      return dataclass_replace(feature, table=table)
    default_name = path or f"feature_{next(names)}"
    if isinstance(feature, _EMBEDDING.FeatureConfig):
      table = table_of(feature.table, lambda: from_tpu_table_config(
          feature.table, name=f"table_{len(tables)}"))
      output_shape = None
      if feature.output_shape is not None and feature.output_shape.rank:
        output_shape = tuple(feature.output_shape.as_list()) + (table.embedding_dim,)
      kwargs = {}
      if feature.max_sequence_length:
        if not _has_sequence_length():
          raise ValueError(f"feature {feature.name or default_name!r}: "
                           "max_sequence_length needs a tfde with sequence "
                           "features")
        kwargs["max_sequence_length"] = int(feature.max_sequence_length)
      return config_lib.FeatureConfig(name=feature.name or default_name,
                                      table=table, output_shape=output_shape,
                                      **kwargs)
    if _is_keras_rs(feature, "FeatureConfig"):
      source = feature.table
      if not _is_keras_rs(source, "TableConfig"):
        raise ValueError(f"keras-rs feature {feature.name!r}: its table is a "
                         f"{_describe(source)}, not a keras-rs TableConfig")
      table = table_of(source, lambda: config_lib.TableConfig(
          name=source.name, vocabulary_size=source.vocabulary_size,
          embedding_dim=source.embedding_dim, initializer=source.initializer,
          optimizer=source.optimizer, combiner=source.combiner,
          placement=source.placement,
          max_ids_per_partition=source.max_ids_per_partition,
          max_unique_ids_per_partition=source.max_unique_ids_per_partition))
      return config_lib.FeatureConfig(
          name=feature.name, table=table,
          input_shape=getattr(feature, "input_shape", None),
          output_shape=getattr(feature, "output_shape", None))
    raise ValueError(
        f"feature_configs must hold tfde, tf.tpu.experimental.embedding or "
        f"keras-rs FeatureConfig objects; got a {_describe(feature)}"
        + (f" at {path!r}" if path else ""))

  paths = _leaf_names(feature_configs)
  flat = tf.nest.flatten(feature_configs)
  return tf.nest.pack_sequence_as(
      feature_configs, [convert(f, p) for f, p in zip(flat, paths)])


def dataclass_replace(feature, **changes):
  return config_lib.dataclasses.replace(feature, **changes)


def _leaf_names(structure):
  """Per leaf of `structure` (tf.nest order), its innermost dict key, or
  None."""
  if isinstance(structure, dict):
    return [p for key in sorted(structure)
            for p in ([key] if not _is_nested(structure[key])
                      else _leaf_names(structure[key]))]
  if isinstance(structure, (list, tuple)):
    return [p for v in structure
            for p in ([None] if not _is_nested(v) else _leaf_names(v))]
  return [None]


def _is_nested(value):
  return isinstance(value, (dict, list, tuple))
