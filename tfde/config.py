"""Table and feature configurations, field for field keras-rs's.

>>> import tfde
>>> table = tfde.TableConfig(name="movie", vocabulary_size=1000,
...                          embedding_dim=16, optimizer="adagrad",
...                          combiner="sum")
>>> feature = tfde.FeatureConfig(name="watched", table=table,
...                              input_shape=(256, 5), output_shape=(256, 16))
>>> tfde.TableConfig.from_config(table.get_config()) == table
True
"""

import dataclasses
from typing import Any
from typing import Optional
from typing import Sequence

import numpy as np

from tfde import initializer_configs
from tfde import optimizer_configs
from tfde import tf_version

COMBINERS = ("sum", "mean", "sqrtn")
PLACEMENTS = ("auto", "default_device", "sparsecore")


UNADMITTED_VALUES = ("initial", "zeros")
NONFINITE = ("error", "skip")
OUTPUTS = ("pooled", "sequence", "ragged")
ROW_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass
class DynamicConfig:
  """How a dynamic table (`vocabulary_size=None`) admits and evicts ids.

  >>> import tfde
  >>> table = tfde.TableConfig(
  ...     name="user", vocabulary_size=None, embedding_dim=8,
  ...     dynamic=tfde.DynamicConfig(admit_after=3, evict_after_steps=1000))
  >>> table.is_dynamic, table.dynamic.max_rows_per_shard
  (True, None)

  Attributes:
    admit_after: An id gets a row (and is trained) from its
      `admit_after`-th sighting on, counting every occurrence in training
      lookups; 1 admits at once. Until then it stores nothing.
    unadmitted_value: What lookups give for an id without a row: "initial"
      (the row it would start with) or "zeros".
    evict_after_steps: Rows (and pending ids) unseen for this many training
      steps are evicted; None never evicts by age.
    max_rows_per_shard: After age eviction, each shard keeps at most this
      many rows, evicting the least frequently seen first (ties: least
      recently seen, then smallest id); None for no limit. Growth and
      eviction work together: the table grows freely up to the limit.
    evict_every_steps: How often (in training steps) eviction runs.
    eviction_record_limit: The most evicted ids a shard keeps on record for
      consumers of its changes (delta checkpoints, delta exports) that have
      not yet taken them; past it the oldest are dropped, and a consumer
      that still needed them gets its next delta refused by name (a full
      save or export is asked for), so a consumer that stops asking cannot
      grow the record without end.
  """

  admit_after: int = 1
  unadmitted_value: str = "initial"
  evict_after_steps: Optional[int] = None
  max_rows_per_shard: Optional[int] = None
  evict_every_steps: int = 1
  eviction_record_limit: int = 1_000_000

  def __post_init__(self):
    for field in ("admit_after", "evict_every_steps", "eviction_record_limit"):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"DynamicConfig.{field} must be an int >= 1, got {value!r}")
    for field in ("evict_after_steps", "max_rows_per_shard"):
      value = getattr(self, field)
      if value is not None and (not isinstance(value, int) or
                                isinstance(value, bool) or value < 1):
        raise ValueError(f"DynamicConfig.{field} must be None or an int >= 1, "
                         f"got {value!r}")
    if self.unadmitted_value not in UNADMITTED_VALUES:
      raise ValueError(f"DynamicConfig.unadmitted_value must be one of "
                       f"{UNADMITTED_VALUES}, got {self.unadmitted_value!r}")

  @property
  def evicts(self):
    return self.evict_after_steps is not None or self.max_rows_per_shard is not None

  def get_config(self):
    return dataclasses.asdict(self)

  @classmethod
  def from_config(cls, config):
    return cls(**config)


@dataclasses.dataclass(eq=False)
class TableConfig:
  """One embedding table, shared by one or more features.

  Attributes:
    name: Unique name of the table; names its variables and checkpoints.
    vocabulary_size: Number of rows. Ids must lie in [0, vocabulary_size).
      `None` makes a dynamic table that grows as new ids arrive.
    embedding_dim: Width of a row.
    initializer: How rows start: a Keras initializer (instance, name or
      config dict), or None for keras-rs's default,
      `VarianceScaling(mode="fan_out")` (rows of standard deviation
      1/sqrt(embedding_dim)), or a static table's whole [vocabulary_size,
      embedding_dim] array. Kept as given (`tfde.initializer_configs.
      resolve` says what it means, and what else it may be: a TF
      initializer, SOK's "random", a number). Rows are initialised as a
      function of (seed, global row), so a table is the same for any
      replica count.
    optimizer: The table's own sparse optimizer: "sgd", "adagrad",
      "rowwise_adagrad" (static tables, not column-wise), "adam" (lazy),
      "ftrl", a Keras optimizer of those classes, or a
      `tfde.optimizers.SparseOptimizer`, or its config dict. Kept as
      given (a table builds its optimizer from it; tables given one
      `SparseOptimizer` share it) and checked here; `optimizer_config()`
      is its canonical config. Applied to touched rows only, inside the
      backward pass. None means SGD with learning rate 0.01.
    combiner: How the ids of one sample combine: "mean", "sum" or "sqrtn".
    placement: "auto" shards large tables and replicates small ones,
      "default_device" replicates the table on every replica (data
      parallel), "sparsecore" asks for TPU SparseCore.
    max_ids_per_partition: keras-rs's SparseCore buffer hint; kept for
      compatibility and validated, unused off SparseCore.
    max_unique_ids_per_partition: as above, for unique ids.
    seed: Seed of the deterministic row initialisation.
    dynamic: For a dynamic table, its `DynamicConfig` (admission and
      eviction); None gives the defaults (admit at once, never evict). Only
      for `vocabulary_size=None`.
    nonfinite: What a step whose gradients for this table hold NaN or Inf
      does: "error" raises an InvalidArgumentError naming the table and the
      step before any of its rows or slots is updated (a dynamic table's
      forward has still counted the step's sightings); "skip" skips the
      table's update for that step (every replica alike) and counts it
      (`Table.skipped_updates()`).
    max_norm: None, or a positive float: each row is renormalised on lookup
      to an L2 norm of at most `max_norm` (`tf.clip_by_norm` per row, as
      `tf.nn.embedding_lookup(max_norm=...)` does; the stored row is left
      as it is), and its gradient goes through that renormalisation. Rows
      are read, not fused with the combine, for such tables. (Gradient
      clipping is the optimizer's `clipnorm` / `clipvalue`.)
    dtype: How rows are stored: "float32", "bfloat16" or "float16" (half
      the memory). Lookups read them into float32 and combine in float32;
      optimizer slots stay float32; each update is computed in float32 and
      rounded stochastically (unbiased; a function of seed, step, row and
      column, so reproducible) into the row's type. Reduced-precision
      tables run on stock TF ops (the C++ kernels take float32 tables) and
      must be static (vocabulary_size set). They saturate: an update whose
      float32 result lies beyond the type's largest finite value (65504
      for float16) stores that value, sign kept, never inf, and counts in
      `Table.skipped_updates()`; `tfde.checkpoint.warm_start` refuses such
      values.
  """

  name: str
  vocabulary_size: Optional[int]
  embedding_dim: int
  initializer: Any = None
  optimizer: Any = None
  combiner: str = "mean"
  placement: str = "auto"
  max_ids_per_partition: int = 256
  max_unique_ids_per_partition: int = 256
  seed: int = 0
  dynamic: Optional[DynamicConfig] = None
  nonfinite: str = "error"
  max_norm: Optional[float] = None
  dtype: str = "float32"

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"TableConfig.name must be a non-empty string, got "
                       f"{self.name!r}")
    where = f"TableConfig {self.name!r}"
    if self.vocabulary_size is not None:
      if (not isinstance(self.vocabulary_size, int) or
          isinstance(self.vocabulary_size, bool) or self.vocabulary_size <= 0):
        raise ValueError(f"{where}: vocabulary_size must be a positive int or "
                         f"None (dynamic), got {self.vocabulary_size!r}")
    if (not isinstance(self.embedding_dim, int) or
        isinstance(self.embedding_dim, bool) or self.embedding_dim <= 0):
      raise ValueError(f"{where}: embedding_dim must be a positive int, got "
                       f"{self.embedding_dim!r}")
    if self.combiner not in COMBINERS:
      raise ValueError(f"{where}: combiner must be one of {COMBINERS}, got "
                       f"{self.combiner!r}")
    if self.placement not in PLACEMENTS:
      raise ValueError(f"{where}: placement must be one of {PLACEMENTS}, got "
                       f"{self.placement!r}")
    for field in ("max_ids_per_partition", "max_unique_ids_per_partition"):
      value = getattr(self, field)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{where}: {field} must be a positive int, got {value!r}")
    if self.nonfinite not in NONFINITE:
      raise ValueError(f"{where}: nonfinite must be one of {NONFINITE}, got "
                       f"{self.nonfinite!r}")
    if self.max_norm is not None:
      if (isinstance(self.max_norm, bool) or
          not isinstance(self.max_norm, (int, float)) or not self.max_norm > 0 or
          self.max_norm == float("inf")):
        raise ValueError(f"{where}: max_norm must be None or a positive finite "
                         f"number, got {self.max_norm!r}")
      self.max_norm = float(self.max_norm)
    if self.dtype not in ROW_DTYPES:
      raise ValueError(f"{where}: dtype must be one of {ROW_DTYPES}, got "
                       f"{self.dtype!r}")
    if self.dtype != "float32" and self.vocabulary_size is None:
      raise ValueError(f"{where}: dtype={self.dtype!r} needs a static table; "
                       f"dynamic tables (vocabulary_size=None) hold float32 rows")
    if not isinstance(self.seed, int):
      raise ValueError(f"{where}: seed must be an int, got {self.seed!r}")
    if self.vocabulary_size is None:
      if self.dynamic is None:
        self.dynamic = DynamicConfig()
      elif isinstance(self.dynamic, dict):
        self.dynamic = DynamicConfig.from_config(self.dynamic)
      elif not isinstance(self.dynamic, DynamicConfig):
        raise ValueError(f"{where}: dynamic must be a DynamicConfig, got "
                         f"{type(self.dynamic).__name__}")
    elif self.dynamic is not None:
      raise ValueError(f"{where}: dynamic options need vocabulary_size=None "
                       f"(a dynamic table), got vocabulary_size="
                       f"{self.vocabulary_size}")
    # Kept as given; what it means checks it, and is kept too: a Keras
    # initializer without a seed draws its seed once, when it is made, so
    # every shard and table of this config must draw from one.
    self._keras_initializer = initializer_configs.resolve(
        self.initializer, self.name, self.embedding_dim)
    if initializer_configs.is_array(self.initializer):
      shape = tuple(self.initializer.shape)
      if self.is_dynamic or shape != (self.vocabulary_size, self.embedding_dim):
        raise ValueError(
            f"{where}: an initial array must be the static table's whole "
            f"[vocabulary_size, embedding_dim] = [{self.vocabulary_size}, "
            f"{self.embedding_dim}] rows, got shape {list(shape)}")
    # Its canonical config validates it (a ValueError naming the setting);
    # a schedule is not serialised to be checked.
    optimizer = optimizer_configs.canonical(self.optimizer, self.name, keep_schedule=True)
    if self.is_dynamic and optimizer_configs.slot_width(optimizer) is not None:
      raise ValueError(f"{where}: {optimizer['kind']!r} keeps one slot value per "
                       "row, and a dynamic table keeps each slot as wide as a row; "
                       "use a static table (vocabulary_size) or another optimizer")

  @property
  def is_dynamic(self):
    return self.vocabulary_size is None

  def keras_initializer(self):
    """What `initializer` means: a Keras initializer (or the array
    given), made once per config (`tfde.initializer_configs.resolve`).

    >>> type(TableConfig(name="t", vocabulary_size=10, embedding_dim=4,
    ...                  initializer="zeros").keras_initializer()).__name__
    'Zeros'
    """
    return self._keras_initializer

  def optimizer_config(self):
    """The canonical config of `optimizer` (`tfde.optimizer_configs`):
    what the table's optimizer is built from, read now (a SparseOptimizer
    given may have changed since).

    >>> TableConfig(name="t", vocabulary_size=10, embedding_dim=4,
    ...             optimizer="sgd").optimizer_config()
    {'kind': 'sgd', 'learning_rate': 0.01}
    """
    return optimizer_configs.canonical(self.optimizer, self.name)

  def column_wise_refusal(self):
    """Why this table cannot be split into column slices (what follows
    "table 'name' " in the error), or None when it can: one answer for
    the tables (`tfde.tables.column_wise`) and the planner.

    >>> TableConfig(name="t", vocabulary_size=10, embedding_dim=4,
    ...             optimizer="rowwise_adagrad").column_wise_refusal()[:42]
    "trains with 'rowwise_adagrad', which keeps"
    """
    if self.is_dynamic:
      return ("is dynamic; column_wise applies to static tables only (a dynamic "
              "row is created and drawn per id by its store, and its admission "
              "and eviction state would be kept per slice); use row_wise or "
              "table_wise")
    if self.max_norm is not None:
      return ("has max_norm: column_wise does not apply (a row's norm spans all "
              "its columns, which no slice holds); use row_wise or table_wise")
    optimizer = self.optimizer_config()
    if optimizer_configs.slot_width(optimizer) is not None:
      return (f"trains with {optimizer['kind']!r}, which keeps one accumulator "
              "per whole row: column_wise does not apply (no slice holds a whole "
              "row); use row_wise, table_wise or table_row_wise")
    if optimizer.get("clipnorm") is not None:
      return ("clips gradients by norm (clipnorm): column_wise does not apply (a "
              "row's gradient norm spans all its columns, which no slice holds); "
              "use clipvalue, or row_wise, table_wise or table_row_wise")
    if self.dtype != "float32":
      return (f"stores {self.dtype} rows: column_wise does not apply (each "
              "update's stochastic rounding is drawn per row and column of the "
              "whole table); use row_wise or table_wise")
    return None

  def __eq__(self, other):
    if not isinstance(other, TableConfig):
      return NotImplemented
    return self.get_config() == other.get_config()

  def __hash__(self):
    return hash((self.name, self.vocabulary_size, self.embedding_dim))

  def get_config(self):
    keras = tf_version.keras()
    return {
        "name": self.name,
        "vocabulary_size": self.vocabulary_size,
        "embedding_dim": self.embedding_dim,
        "initializer": keras.initializers.serialize(self.keras_initializer()),
        "optimizer": self.optimizer_config(),
        "combiner": self.combiner,
        "placement": self.placement,
        "max_ids_per_partition": self.max_ids_per_partition,
        "max_unique_ids_per_partition": self.max_unique_ids_per_partition,
        "seed": self.seed,
        "dynamic": None if self.dynamic is None else self.dynamic.get_config(),
        "nonfinite": self.nonfinite,
        "max_norm": self.max_norm,
        "dtype": self.dtype,
    }

  @classmethod
  def from_config(cls, config):
    keras = tf_version.keras()
    config = dict(config)
    initializer = config["initializer"]
    # An initial array serialises as Keras's "__numpy__" (or "__tensor__")
    # value, which only its generic deserializer reads back.
    config["initializer"] = (
        keras.saving.deserialize_keras_object(initializer)
        if isinstance(initializer, dict) and
        initializer.get("class_name") in ("__numpy__", "__tensor__")
        else keras.initializers.deserialize(initializer))
    return cls(**config)


@dataclasses.dataclass(eq=False)
class FeatureConfig:
  """One input feature, looked up in one table.

  Attributes:
    name: Name of the feature; errors about its input name it.
    table: The `TableConfig` it looks up. Several features may share one.
    input_shape: Shape of the per-replica input batch, e.g. (batch, hotness)
      or (batch,). The first entry is the batch size; None entries are
      unknown. Used to validate inputs and describe outputs.
    output_shape: Shape of the output, normally (batch, embedding_dim).
    max_sequence_length: TF TPU embedding's field. None (the default) pools
      each sample's ids into one row with the table's combiner. An int L >= 1
      makes a sequence feature: the output is [batch, L, embedding_dim], one
      row per id in order, padded with zero rows past a sample's length and
      truncated after its first L ids (as TPU embedding does); the combiner
      is then ignored. Dense inputs longer than L are truncated too; ids
      of a sparse input sit at their column. A sequence feature takes no
      weights (as on TPU).
    output: "pooled" (one row per sample), "sequence" ([batch, L, dim]: set
      by max_sequence_length) or "ragged" (max_sequence_length None: a
      `tf.RaggedTensor` [batch, (ids), dim], one row per id, no padding).
      None (the default) means "sequence" when max_sequence_length is set,
      else "pooled". Unpooled ids train like pooled ones: their gradients
      are summed per row with those of the table's other features.
  """

  name: str
  table: TableConfig
  input_shape: Optional[Sequence[Optional[int]]] = None
  output_shape: Optional[Sequence[Optional[int]]] = None
  max_sequence_length: Optional[int] = None
  output: Optional[str] = None

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"FeatureConfig.name must be a non-empty string, got "
                       f"{self.name!r}")
    if not isinstance(self.table, TableConfig):
      raise ValueError(f"FeatureConfig {self.name!r}: table must be a "
                       f"TableConfig, got {type(self.table).__name__}")
    for field in ("input_shape", "output_shape"):
      shape = getattr(self, field)
      if shape is None:
        continue
      try:
        shape = tuple(None if d is None else int(d) for d in shape)
      except (TypeError, ValueError) as e:
        raise ValueError(f"FeatureConfig {self.name!r}: {field} must be a "
                         f"sequence of ints or None, got {shape!r}") from e
      if any(d is not None and d < 0 for d in shape):
        raise ValueError(f"FeatureConfig {self.name!r}: {field} has a "
                         f"negative size: {shape}")
      setattr(self, field, shape)
    if self.max_sequence_length is not None and (
        not isinstance(self.max_sequence_length, int) or
        isinstance(self.max_sequence_length, bool) or
        self.max_sequence_length < 1):
      raise ValueError(
          f"FeatureConfig {self.name!r}: max_sequence_length must be None "
          f"(pooled) or an int >= 1, got {self.max_sequence_length!r} "
          f"(table {self.table.name!r})")
    if self.output is None:
      self.output = "pooled" if self.max_sequence_length is None else "sequence"
    if self.output not in OUTPUTS:
      raise ValueError(f"FeatureConfig {self.name!r}: output must be one of "
                       f"{OUTPUTS}, got {self.output!r}")
    if (self.output == "sequence") != (self.max_sequence_length is not None):
      raise ValueError(
          f"FeatureConfig {self.name!r}: output={self.output!r} with "
          f"max_sequence_length={self.max_sequence_length!r}: a [batch, L, dim] "
          f"output is output='sequence' with max_sequence_length=L; "
          f"'pooled' and 'ragged' take max_sequence_length=None")
    if (self.output_shape is not None and self.output_shape and
        self.output_shape[-1] not in (None, self.table.embedding_dim)):
      raise ValueError(
          f"FeatureConfig {self.name!r}: output_shape {self.output_shape} must "
          f"end in the table's embedding_dim {self.table.embedding_dim} "
          f"(table {self.table.name!r})")

  def declared_ids_per_sample(self):
    """The most ids a sample has as `input_shape` declares them (the
    product past the batch; 1 for (batch,)), or None where it does not.

    >>> t = TableConfig(name="t", vocabulary_size=8, embedding_dim=4)
    >>> shapes = None, (32,), (32, 5), (32, None), (32, 2, 3)
    >>> tuple(FeatureConfig(name="f", table=t, input_shape=s).declared_ids_per_sample()
    ...       for s in shapes)
    (None, 1, 5, None, 6)
    """
    shape = self.input_shape
    if shape is None or any(d is None for d in shape[1:]):
      return None
    return int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1

  def __eq__(self, other):
    if not isinstance(other, FeatureConfig):
      return NotImplemented
    return self.get_config() == other.get_config()

  def __hash__(self):
    return hash((self.name, self.table.name))

  def get_config(self):
    return {
        "name": self.name,
        "table": self.table.get_config(),
        "input_shape": None if self.input_shape is None else list(self.input_shape),
        "output_shape": None if self.output_shape is None else list(self.output_shape),
        "max_sequence_length": self.max_sequence_length,
        "output": self.output,
    }

  @classmethod
  def from_config(cls, config, tables=None):
    """`tables` maps table names to already-built TableConfigs, so features
    that shared a table share it again after the round trip."""
    config = dict(config)
    table_config = config["table"]
    if tables is not None and table_config["name"] in tables:
      config["table"] = tables[table_config["name"]]
    else:
      config["table"] = TableConfig.from_config(table_config)
      if tables is not None:
        tables[table_config["name"]] = config["table"]
    return cls(**config)
