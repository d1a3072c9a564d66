"""TensorFlow's TPU embedding engine as a tfde table kind (TPUStrategy).

>>> import tfde
>>> from tfde.tables import tpu as tpu_tables
>>> t = tfde.TableConfig(name="a", vocabulary_size=100, embedding_dim=8,
...                      optimizer="sgd", max_ids_per_partition=64)
>>> features = [tfde.FeatureConfig(name="f", table=t, input_shape=(32, 2))]
>>> tpu_features = tfde.tpu.to_tpu_feature_configs(features)
>>> config = tpu_tables.sparse_core_config(features, tpu_features, None,
...                                        num_partitions=2, cores_per_partition=4)
>>> config.disable_table_stacking, config.max_ids_per_table
(True, {'a': 64})

Under `tf.distribute.TPUStrategy` the communicator is a
`tfde.comm.TPUCommunicator`, and `engine_for` builds one `TPUEngine` for
a lookup's tables: `TPUEmbeddingV2` on TPUs with SparseCore,
`TPUEmbedding` on older ones, fed with `tfde.tpu`'s converted configs
(optimizers reconciled; Adam's bias correction reads the engine's step
counter). Each table is a `TPUTable`, whose rows live in the engine, and
the tables form one `tfde.groups.EngineGroup`: the group's step hands the
inputs, as given, to the engine (`activations`), and the backward hands it
the output gradients (`apply_gradients`), as keras-rs's TensorFlow backend
does, after the pipeline's one-flag-per-table finite check. The pipeline
never asks which kind it runs: the table and its group do.

SparseCore settings come from the tfde configs: each table's
`max_ids_per_partition` / `max_unique_ids_per_partition` go into
`SparseCoreEmbeddingConfig.max_ids_per_table` / `max_unique_ids_per_table`
(keyed by stacked table, summed over the tables a stack holds), and
`table_stacking` decides the stacks: None disables stacking, "auto" stacks
tables of one width and optimizer, a list of names (one stack) or a list
of lists (one stack each, others alone); stacks become explicit table
layouts from TensorFlow's own SparseCore layout stacker.

What runs here, without a TPU: the configuration (this module's
functions, tested exactly), and the dispatch and training calls against a
stand-in engine that records what it was given (tests/unit/test_tpu.py). The
engine itself has not been run by tfde's tests.
"""

import collections

import tensorflow as tf

from tfde import optimizers
from tfde import tf_internals
from tfde.ops import checks
from tfde.tpu import configs as tpu_configs

_EMBEDDING = tf.tpu.experimental.embedding

# The engines by TPU generation; tests replace them with stand-ins.
ENGINES = {
    "sparsecore": lambda features, config: _EMBEDDING.TPUEmbeddingV2(
        features, optimizer=None, pipeline_execution_with_tensor_core=False,
        sparse_core_embedding_config=config),
    "tensorcore": lambda features, config: _EMBEDDING.TPUEmbedding(
        features, optimizer=None),
}


def engine_for(feature_configs, table_stacking, communicator, given_tables=None,
               train_in_backward=True):
  """The `TPUEngine` that holds every table of a lookup of `feature_configs`
  (tfde's, flat) under TPUStrategy (`communicator` a TPUCommunicator), or
  None under any other runtime. The engine makes and trains every table
  itself: tables built before (`given_tables`) and gradients returned
  rather than applied (`train_in_backward=False`) are refused."""
  strategy = getattr(communicator, "tpu_strategy", None)
  if strategy is None:
    return None
  if given_tables:
    raise ValueError(f"tables {sorted(given_tables)} were built before the lookup; "
                     "under TPUStrategy the TPU embedding engine makes every table "
                     "of a lookup itself (pass none)")
  if not train_in_backward:
    raise ValueError("train_in_backward=False returns gradients of tfde's shard "
                     "variables; under TPUStrategy the TPU embedding engine holds "
                     "the tables and applies their optimizers itself")
  refuse_unhonoured(feature_configs)
  return TPUEngine(feature_configs, table_stacking, strategy)


def refuse_unhonoured(feature_configs):
  """Refuses, by table, settings the TPU engine cannot honour: with
  nonfinite="error" the step's assertion is compiled away by XLA on a TPU,
  so a non-finite step would silently reach the engine as zero gradients."""
  for feature in feature_configs:
    if feature.table.nonfinite != "skip":
      raise ValueError(
          f"table {feature.table.name!r}: nonfinite={feature.table.nonfinite!r} "
          "cannot be honoured under TPUStrategy (XLA compiles the step's "
          "assertion away, so a non-finite step would become zero gradients "
          "without an error); set TableConfig(nonfinite='skip'), which hands "
          "the engine zeros for that table's step")


def refuse_outside_engine(config, communicator):
  """Under TPUStrategy a table lives in the engine of a lookup: one built on
  its own there (a ShardedTable, SOK's, mxRec's) would hold a slice of its
  rows that nothing exchanges."""
  if getattr(communicator, "tpu_strategy", None) is not None:
    raise ValueError(f"table {config.name!r}: under TPUStrategy tables live in "
                     "TensorFlow's TPU embedding engine; build them through "
                     "tfde.layers.DistributedEmbedding or tfde.lookup.ShardedLookup")


def hardware(strategy):
  """("sparsecore" | "tensorcore", sparse cores per chip) of a TPUStrategy."""
  feature = strategy.extended.tpu_hardware_feature
  kind = feature.embedding_feature
  names = tf.tpu.experimental.HardwareFeature.EmbeddingFeature
  if kind in (names.V2,):
    return "sparsecore", int(feature.num_embedding_devices_per_chip)
  if kind in (names.V1,):
    return "tensorcore", 0
  raise ValueError("this TPU has no embedding engine (neither SparseCore nor "
                   "the TensorCore embedding feature)")


def stacking_groups(table_names, table_stacking):
  """Lists of table names, one per stack TPU is asked to make, from
  keras-rs's `table_stacking`: "auto" (None here: by width and optimizer),
  None (each table alone), a list of names (one stack), a list of lists."""
  if table_stacking == "auto":
    return None
  if table_stacking is None:
    return [[name] for name in table_names]
  if not isinstance(table_stacking, (list, tuple)) or not table_stacking:
    raise ValueError(f"table_stacking must be 'auto', None, a list of table "
                     f"names or a list of lists of them, got {table_stacking!r}")
  groups = ([list(table_stacking)] if all(isinstance(n, str) for n in table_stacking)
            else [list(g) for g in table_stacking])
  seen = set()
  for group in groups:
    for name in group:
      if name not in table_names:
        raise ValueError(f"table_stacking names table {name!r}, which is not "
                         f"configured; tables: {sorted(table_names)}")
      if name in seen:
        raise ValueError(f"table_stacking names table {name!r} twice")
      seen.add(name)
  return groups + [[n] for n in table_names if n not in seen]


def sparse_core_config(feature_configs, tpu_feature_configs, table_stacking,
                       num_partitions, cores_per_partition):
  """The `SparseCoreEmbeddingConfig` for tfde `feature_configs` (flat list)
  and their TPU conversion; for explicit stacks, sets each TPU table's
  `layout` from TensorFlow's SparseCore layout stacker (one stacker group
  per stack, so only the listed tables share one)."""
  tables, samples, counts = {}, collections.Counter(), collections.Counter()
  tpu_tables = {}
  for feature, tpu_feature in zip(tf.nest.flatten(feature_configs),
                                  tf.nest.flatten(tpu_feature_configs)):
    tables[feature.table.name] = feature.table
    tpu_tables[feature.table.name] = tpu_feature.table
    batch = (feature.input_shape or [None])[0] or 1
    samples[feature.table.name] += batch
    counts[feature.table.name] += 1
  names = sorted(tables)
  groups = stacking_groups(names, table_stacking)
  if groups is None:
    # "auto": tables of one width and optimizer share a stack, as TF's own
    # stacker groups them; made here so the stacks' names (which key the
    # buffer sizes) are known.
    by_key = collections.defaultdict(list)
    for name in names:
      by_key[(tables[name].embedding_dim,
              repr(tables[name].optimizer_config()))].append(name)
    groups = list(by_key.values())
  stack_of = {name: name for name in names}
  if any(len(g) > 1 for g in groups):
    stacker = tf_internals.sparse_core_layout_stacker(
        num_partitions=num_partitions, sparse_cores_per_partition=cores_per_partition,
        disable_table_stacking=False)
    for index, group in enumerate(groups):
      kinds = {repr(tables[n].optimizer_config()) for n in group}
      widths = {tables[n].embedding_dim for n in group}
      if len(group) > 1 and (len(kinds) > 1 or len(widths) > 1):
        raise ValueError(f"table_stacking stacks {group}, whose optimizers or "
                         "widths differ; TPU stacks only tables of one width "
                         "and optimizer")
      for name in group:
        stacker.AddTable(table_name=name, table_height=tables[name].vocabulary_size,
                         table_width=tables[name].embedding_dim,
                         group=f"tfde_stack_{index}", output_samples=samples[name],
                         num_features=counts[name])
    for layout in stacker.GetLayouts().tables:
      tpu_tables[layout.table_name].layout = layout
      stack_of[layout.table_name] = layout.stacked_table_name
  max_ids, max_unique = collections.Counter(), collections.Counter()
  for name in names:
    key = stack_of[name]
    max_ids[key] += tables[name].max_ids_per_partition
    max_unique[key] += tables[name].max_unique_ids_per_partition
  return _EMBEDDING.SparseCoreEmbeddingConfig(
      disable_table_stacking=table_stacking is None,
      max_ids_per_table=dict(max_ids), max_unique_ids_per_table=dict(max_unique),
      # Tables are made on the TPU: built on the host inside a Keras trace,
      # they would die with its FuncGraph (keras-rs's reason, kept).
      initialize_tables_on_host=False)


class TPUEngine(tf.Module):
  """One TPU embedding object for all of a lookup's tables.

  Args:
    feature_configs: tfde `FeatureConfig`s (flat list).
    table_stacking: keras-rs's table_stacking (see `stacking_groups`).
    strategy: the TPUStrategy it is built under.
  """

  def __init__(self, feature_configs, table_stacking, strategy):
    super().__init__(name="tpu_engine")
    self.kind, cores = hardware(strategy)
    with tf.init_scope():
      # Updates applied so far: Adam's bias correction and learning-rate
      # schedules read it through the converted learning rates.
      self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False,
                                    name="tpu_engine_iterations")
    self.feature_configs = {f.name: f for f in feature_configs}
    # One optimizer per table, the engine's update and its `TPUTable`'s.
    self.optimizers = {}
    for f in feature_configs:
      if f.table.name not in self.optimizers:
        self.optimizers[f.table.name] = optimizers.get(f.table.optimizer, f.table.name)
    self.tpu_feature_configs = tpu_configs.to_tpu_feature_configs(
        self.feature_configs, iterations=self.iterations, optimizers=self.optimizers)
    self.sparse_core_config = None
    if self.kind == "sparsecore":
      self.sparse_core_config = sparse_core_config(
          list(self.feature_configs.values()),
          [self.tpu_feature_configs[n] for n in self.feature_configs],
          table_stacking, strategy.num_replicas_in_sync, cores)
    elif table_stacking not in ("auto", None):
      raise ValueError("table_stacking lists apply to SparseCore; this TPU "
                       "has none (use 'auto' or None)")
    self.embedding = ENGINES[self.kind](self.tpu_feature_configs,
                                        self.sparse_core_config)

  def activations(self, features, training):
    """The engine's lookup of `features` (`tfde.inputs.FlatFeature`s of its
    tables, carrying their inputs as given): (their activations, in order;
    what the engine preserves for `apply_gradients`)."""
    inputs, weights = {}, {}
    for feature in features:
      ids, given_weights = feature.source
      inputs[feature.name] = self._as_engine_input(feature, ids)
      weights[feature.name] = (None if given_weights is None else
                               self._as_engine_input(feature, given_weights))
    if self.kind == "sparsecore":
      activations, preserved = self.embedding(inputs, weights)
    else:
      self.embedding.enqueue(inputs, weights, training=training)
      activations, preserved = self.embedding.dequeue(), None
    return [activations[f.name] for f in features], preserved

  def apply_gradients(self, gradients, preserved):
    """Each table's optimizer step in the engine, from feature name ->
    output gradient; counts the step. Returns the new count."""
    if self.kind == "sparsecore":
      applied = self.embedding.apply_gradients(gradients, preserved_outputs=preserved)
    else:
      applied = self.embedding.apply_gradients(gradients)
    with tf.control_dependencies([a for a in tf.nest.flatten(applied)
                                  if a is not None]):
      return self.iterations.assign_add(1)

  @staticmethod
  def _as_engine_input(feature, value):
    # A dense [batch, hotness] input is one sample per row, combined
    # (keras-rs and tfde); TPU embedding would read it as a sequence.
    if (isinstance(value, tf.Tensor) and value.shape.rank == 2 and
        feature.sequence_length is None):
      return tf.RaggedTensor.from_tensor(value)
    return value


class TPUTable:
  """A table whose rows live in the TPU engine (the kind `make_table`
  makes with an engine). Its whole-table state is the engine's: save and
  restore the layer with `tf.train.Checkpoint` (TensorFlow's format, which
  `tfde.tpu.restore_tpu_checkpoint` reads back off TPU).

  Its lookup takes the feature inputs as given (`takes_inputs_as_given`): tfde's
  flattening and id checks would add dynamic shapes and string ops to the
  TPU program, and XLA compiles assertions away.

  Non-finite gradients: the pipeline's one finite flag per table reaches
  the engine as zero gradients for that table (SGD and Adagrad then change
  nothing; Adam and FTRL move their slots as a zero gradient does). With
  nonfinite="error" is refused when the engine is built (`refuse_unhonoured`):
  on a TPU XLA drops the assertion it needs. Per-id weights get no
  gradient from the engine: a lookup whose weights a tape watches is
  refused by name (`tfde.groups.EngineGroup`)."""

  replicated = False
  routes_ids = False

  def __init__(self, config, engine):
    self.config = config
    self.engine = engine
    self.optimizer = engine.optimizers[config.name]

  @property
  def name(self):
    return self.config.name

  @property
  def embedding_dim(self):
    return self.config.embedding_dim

  @property
  def is_dynamic(self):
    return False

  # Stage 0 hands the engine the inputs as given (`FlatFeature.source`), so
  # nothing is added to the TPU program there: tfde's flattening and id
  # checks use dynamic shapes and string ops that a TPU program must send
  # to the host, and XLA compiles their assertions away.
  takes_inputs_as_given = True

  def _engine_only(self, *args, **kwargs):
    raise NotImplementedError(
        f"table {self.name!r} lives in the TPU embedding engine, which looks "
        "it up, trains and checkpoints it as a whole")

  lookup_local = apply_gradient = gradient_variable = gradient_slices = _engine_only
  state = load_state = use_optimizer = local_variables = _engine_only
  full_table = full_slot = _engine_only

  def nonfinite_checks(self, replica, finite):
    del replica
    if finite is None or self.config.nonfinite == "skip":
      return []
    return [checks.assert_that(
        finite, f"table {self.name}: the gradient of engine step ",
        tf.convert_to_tensor(self.engine.iterations) + 1,
        " holds NaN or Inf; no table of the step was updated "
        "(TableConfig(nonfinite='skip') hands the engine zeros instead)")]
