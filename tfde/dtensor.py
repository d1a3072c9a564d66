"""tfde tables on a DTensor mesh, for the tf_keras DTensor workflow.

>>> import tfde.dtensor   # needs tf_keras: pip install tfde[dtensor]

A table of V rows is one `DVariable` of [N * R, D] (R = ceil(V / N))
sharded on dim 0 over the mesh dimension `mesh_dim` of size N: the device
at coordinate s holds tfde's shard s (global rows s, s + N, s + 2N, ...,
the `id % N` layout of `tfde.tables.ShardedTable`) as its own [R, D]
component, and each optimizer slot is laid out the same way.

Forward (inside the user's `tf.function`, all DTensor ops): the step's
ids are gathered to every device (small), the table is viewed as
[N, R, D] sharded on dim 0 (a local reshape), each device reads only its
own rows (`tf.gather(..., axis=1, batch_dims=1)`, ids it does not own
masked), a sum over the shard dimension (an all-reduce of the rows read,
never of the table) gives every id's row, and each feature combines its
samples into a batch-sharded [B, D] output. Nothing in it grows with V.

Training: DTensor has no layout propagation for `ResourceScatter*` (nor
for tfde's C++ ops), and its `TensorScatterUpdate` rewrites whole shards
(measured: 20 ms at 1 MiB, 2.7 s at 64 MiB per table on 4 CPUs), so the
sparse update runs per device, outside the DTensor function: the train
step returns the gradients of the rows each device read
(`sparse_gradients`), and `apply_gradients` unpacks them and runs the
table's own sparse optimizer (tfde's kernels) on each device's shard
component, in place, on the touched rows only. Those updates leave reads
sharing the shard (`copy_on_read=False`, see `tfde.ops.sparse_apply`):
DTensor lowers the forward's gathers to a read of the whole component, and
after TF's usual sparse update each such read would copy it, O(V / N) per
step. The train step:

    with tf.GradientTape() as tape:
      loss = ...model(inputs)...
    sources = embedding.gradient_sources()
    grads = tape.gradient(loss, model.trainable_variables + sources)
    n = len(model.trainable_variables)
    optimizer.apply_gradients(zip(grads[:n], model.trainable_variables))
    return loss, embedding.sparse_gradients(grads[n:])   # end of tf.function
  ...
  loss, sparse = train_step(inputs, labels)
  embedding.apply_gradients(sparse)                    # eager

Inputs are DTensors sharded on their batch dimension over `mesh_dim`:
dense int ids of shape [B] or [B, H], with -1 padding the ragged samples
(`dtensor.pack` takes dense tensors only), and optional float weights of
the same shape. Outputs are [B, D] DTensors sharded the same way.

Ids outside [0, V) (-1 pads) are refused by a check that every device runs
on the gathered ids, naming the feature and table. A device that fails it
first cancels the collectives the others are still in, and DTensor's
default (asynchronous) device may raise one of their CancelledErrors
instead; the named error is then in the log only. A synchronous DTensor
device reports the named error (docs/doors/dtensor.md, Known limits, has the
measurements).
"""

import numpy as np
import tensorflow as tf

from tfde import tf_internals

try:
  import tf_keras
except ImportError as e:  # pragma: no cover - depends on the environment
  raise ImportError(
      "tfde.dtensor is a tf_keras layer (TensorFlow's DTensor Keras "
      "workflow); install tf_keras matching TensorFlow, e.g. "
      "`pip install --no-deps tf_keras==2.21.0` or `pip install tfde[dtensor]`"
  ) from e

from tensorflow.experimental import dtensor as dt

from tfde import config as config_lib
from tfde import initializers
from tfde import ops
from tfde import sharding
from tfde.tables import base

__all__ = ["DistributedEmbedding", "DTensorTable"]


def _shard_view(handle, shape, name):
  """A plain resource variable over one device's component of a DVariable
  (its handle from `dtensor.unpack`), so tfde's ops update it in place."""
  return tf_internals.variable_over_handle(handle, shape, handle_dtype(handle), name)


def handle_dtype(handle):
  del handle
  return tf.float32


class DTensorTable(base.Table):
  """One static table sharded by `id % N` over a mesh dimension.

  >>> import tfde, tfde.dtensor
  >>> from tensorflow.experimental import dtensor
  >>> mesh = dtensor.create_mesh([("batch", 1)], devices=["CPU:0"])
  >>> config = tfde.TableConfig(name="t", vocabulary_size=10, embedding_dim=4)
  >>> table = tfde.dtensor.DTensorTable(config, mesh)
  >>> table.variable.shape, table.num_shards
  (TensorShape([10, 4]), 1)

  Attributes:
    variable: the [N * R, D] DVariable, sharded on dim 0 over `mesh_dim`.
    slots: slot name -> DVariable laid out like `variable`.
    steps: device index -> int64 step variable on that device.
  """

  # Per-device views and their functions are not the table's variables.
  _TF_MODULE_IGNORED_PROPERTIES = base.Table._TF_MODULE_IGNORED_PROPERTIES.union(
      ("_views", "_apply_function"))

  def __init__(self, config, mesh, mesh_dim="batch"):
    if config.is_dynamic:
      raise ValueError(f"table {config.name!r}: tfde.dtensor holds static "
                       "tables only (vocabulary_size must be set)")
    super().__init__(config)
    if mesh_dim not in mesh.dim_names:
      raise ValueError(f"table {config.name!r}: mesh has no dimension "
                       f"{mesh_dim!r} (it has {list(mesh.dim_names)})")
    self.mesh, self.mesh_dim = mesh, mesh_dim
    self.num_shards = mesh.dim_size(mesh_dim)
    self.rows_per_shard = sharding.rows_per_shard(config.vocabulary_size,
                                                  self.num_shards)
    self.layout = dt.Layout([mesh_dim, dt.UNSHARDED], mesh)
    self.devices = list(mesh.local_devices())
    # The shard each local device holds: its coordinate along mesh_dim.
    self.device_shards = [loc[mesh_dim] for loc in mesh.local_device_locations()]
    self.variable = dt.DVariable(self._pack(
        lambda s: initializers.shard_value(config, self.num_shards, s)),
        trainable=False, name=f"{config.name}/table")
    self.slots = self._new_slots(self.optimizer)
    for index, device in enumerate(self.devices):
      with tf.device(device):
        self.steps[index] = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                        name=f"{config.name}/step_{index}")
        self.skips[index] = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                        name=f"{config.name}/skips_{index}")
    self._views = None
    self._apply_function = None

  def _pack(self, shard_value):
    """A [N * R, D] DTensor whose device components are built on their own
    device from `shard_value(s)` (no device ever holds the whole table)."""
    components = []
    for device, shard in zip(self.devices, self.device_shards):
      with tf.device(device):
        components.append(tf.identity(tf.cast(shard_value(shard), tf.float32)))
    return dt.pack(components, self.layout)

  def _new_slots(self, optimizer):
    shape = optimizer.slot_shape([self.rows_per_shard, self.embedding_dim])
    return {name: dt.DVariable(self._pack(lambda s, name=name: tf.fill(
        shape, optimizer.slot_initial_value(name))), trainable=False,
        name=f"{self.name}/{name}") for name in optimizer.slot_names}

  def use_optimizer(self, optimizer):
    if base.switches_optimizer(self, optimizer):
      self.optimizer = optimizer
      self.slots = self._new_slots(optimizer)
      self._views = None
      self._apply_function = None

  # ---- forward (DTensor ops, inside the user's tf.function)

  def read_rows(self, ids):
    """Rows of `ids` (replicated int64 [M], -1 for none): each device reads
    only its own rows. Returns (local rows [N, M] sharded on dim 0, -1 where
    the shard does not own the id; rows read [N, M, D] sharded likewise)."""
    n = self.num_shards
    shards = tf.range(n, dtype=tf.int64)[:, None]
    owned = tf.logical_and(ids[None, :] >= 0, ids[None, :] % n == shards)
    local = tf.where(owned, ids[None, :] // n, tf.constant(-1, tf.int64))
    local = dt.relayout(local, dt.Layout([self.mesh_dim, dt.UNSHARDED], self.mesh))
    table = tf.reshape(self.variable.read_value(),
                       [n, self.rows_per_shard, self.embedding_dim])
    table = dt.relayout(table, dt.Layout([self.mesh_dim, dt.UNSHARDED, dt.UNSHARDED],
                                         self.mesh))
    rows = tf.gather(table, tf.maximum(local, 0), axis=1, batch_dims=1)
    mask = tf.cast(local >= 0, rows.dtype)[:, :, None]
    return local, rows * mask

  # ---- the sparse update (eager, per device)

  def _device_views(self):
    if self._views is None:
      variables = [self.variable] + [self.slots[s] for s in self.optimizer.slot_names]
      shapes = [[self.rows_per_shard, v.shape[1]] for v in variables]
      handles = [dt.unpack(v.handle) for v in variables]
      self._views = [[_shard_view(h[i], shape, f"{self.name}_{k}_dev{i}")
                      for k, (h, shape) in enumerate(zip(handles, shapes))]
                     for i in range(len(self.devices))]
    return self._views

  def apply_sparse(self, local_rows, grads, optimizer=None):
    """One optimizer step from one training step's rows: `local_rows`
    [N, M] (sharded, -1 for none) and `grads` [N, M, D] DTensors. Each
    device sums the gradients of the rows it owns and updates them in place
    in its component; nothing else is read or written. Eager (one function
    call running on every device at once)."""
    optimizer = self.update_optimizer(optimizer)
    key = (optimizer.kind, id(optimizer))
    if self._apply_function is None or self._apply_function[0] != key:
      self._apply_function = (key, self._make_apply_function(optimizer))
    return self._apply_function[1](dt.unpack(local_rows), dt.unpack(grads))

  def _make_apply_function(self, optimizer):
    views = self._device_views()
    dim = self.embedding_dim
    count = len(self.devices)

    @tf.function(input_signature=[
        [tf.TensorSpec([None, None], tf.int64)] * count,
        [tf.TensorSpec([None, None, dim], tf.float32)] * count])
    def apply(rows_by_device, grads_by_device):
      owned = []
      for device, rows, grad in zip(self.devices, rows_by_device, grads_by_device):
        with tf.device(device):
          rows, grad = tf.reshape(rows, [-1]), tf.reshape(grad, [-1, dim])
          keep = rows >= 0
          rows, grad = tf.boolean_mask(rows, keep), tf.boolean_mask(grad, keep)
          unique, inverse = tf.unique(rows, out_idx=tf.int32)
          summed = tf.math.unsorted_segment_sum(grad, inverse, tf.size(unique))
          owned.append((unique, summed, tf.reduce_all(tf.math.is_finite(summed))))
      # One flag for all devices: the table is updated everywhere or nowhere.
      finite = tf.reduce_all(tf.stack([flag for _, _, flag in owned]))
      steps = []
      for index, (device, (unique, summed, _)) in enumerate(zip(self.devices, owned)):
        def update(index=index, unique=unique, summed=summed):
          step = self.steps[index].assign_add(1)
          # copy_on_read=False: the forward reads each shard whole (DTensor
          # lowers its gathers to a read), and in TF's copy-on-read mode
          # every such read would copy the shard: O(V / N) per step.
          with tf.control_dependencies([optimizer.apply(
              views[index][0], dict(zip(optimizer.slot_names, views[index][1:])),
              unique, summed, step, copy_on_read=False)]):
            return tf.identity(step)
        with tf.device(device):
          steps.append(self.guard_nonfinite(index, finite, update))
      return steps

    return apply

  # ---- the contract's other paths: this kind trains through apply_sparse

  def lookup_local(self, replica, requested, counts, training):
    raise NotImplementedError(f"table {self.name!r} lives on a DTensor mesh; "
                              "look it up with tfde.dtensor.DistributedEmbedding")

  def apply_gradient(self, replica, rows, grads, optimizer=None, grad_rows=None,
                     finite=None):
    raise NotImplementedError(f"table {self.name!r} lives on a DTensor mesh; "
                              "train it with DistributedEmbedding.apply_gradients")

  def gradient_variable(self, replica):
    raise NotImplementedError(f"table {self.name!r} lives on a DTensor mesh")

  # ---- whole-table state (host tensors, independent of N)

  def shard_values(self, variable):
    """[N, R, D] numpy: each shard as its device holds it (one per shard)."""
    values = {}
    for shard, component in zip(self.device_shards, dt.unpack(variable.read_value())):
      values.setdefault(shard, component.numpy())
    return np.stack([values[s] for s in range(self.num_shards)])

  def _whole(self, variable):
    shards = self.shard_values(variable)
    full = np.transpose(shards, [1, 0, 2]).reshape(-1, shards.shape[-1])
    return tf.constant(full[:self.vocabulary_size])

  def state(self, keys=None):
    keys = keys or self.state_keys()
    tensors = {}
    for key in keys:
      if key == "step":
        tensors["step"] = tf.constant(self.step_value(), tf.int64)
      elif key == "table":
        tensors[key] = self._whole(self.variable)
      else:
        tensors[key] = self._whole(self.slots[key[len(base.SLOT_PREFIX):]])
    return tensors

  def check_state(self, state, source="checkpoint"):
    super().check_state(state, source)
    for key in self.state_keys():
      if key != "step":
        self._check_shape(state, key, (self.vocabulary_size, self.state_width(key)),
                          source)

  def advise_memory(self):
    # A mesh's variables are DTensors, which tfde's op (plain resource
    # handles) does not take.
    return ops.advise_huge_pages([])

  def _load_state(self, state, source):
    self.check_state(state, source)
    padding = self.rows_per_shard * self.num_shards - self.vocabulary_size
    for key in self.state_keys():
      if key == "step":
        for step in self.steps.values():
          step.assign(tf.cast(state["step"], tf.int64))
        continue
      full = np.pad(np.asarray(state[key], np.float32), [[0, padding], [0, 0]])
      shards = full.reshape(self.rows_per_shard, self.num_shards, -1)
      variable = (self.variable if key == "table" else
                  self.slots[key[len(base.SLOT_PREFIX):]])
      variable.assign(self._pack(lambda s, shards=shards: shards[:, s]))
    return tf.no_op()

  def full_table(self):
    return self._whole(self.variable).numpy()

  def full_slot(self, slot_name):
    return self._whole(self.slots[slot_name]).numpy()


class _SparseUpdateAnchor(dt.DVariable):
  """The layer's trainable stand-in on the tape (see `gradient_sources`).

  A Keras optimizer cannot train the tables: their rows are updated per
  device by `apply_gradients`, from `sparse_gradients`. A step written as
  for dense layers (`tape.gradient(loss, model.trainable_variables)`, each
  gradient handed to the optimizer) would reach only this anchor and train
  nothing, so an optimizer's update of it is refused by name unless the
  step took `gradient_sources()` after the layer's last call."""

  _tfde_layer_name = "?"
  _tfde_sources_taken = True

  def _tfde_check(self):
    if not self._tfde_sources_taken:
      raise ValueError(
          f"tfde.dtensor.DistributedEmbedding {self._tfde_layer_name!r}: an "
          "optimizer is updating its tables' stand-in (sparse_update_anchor) in a "
          "step that did not ask for gradient_sources(); a Keras optimizer does "
          "not train tfde's tables, and this step would train none of them. Take "
          "grads = tape.gradient(loss, dense_variables + layer.gradient_sources()), "
          "return layer.sparse_gradients(grads[n:]) from the step, and call "
          "layer.apply_gradients(sparse) after it (docs/doors/dtensor.md)")

  def assign(self, *args, **kwargs):
    self._tfde_check()
    return super().assign(*args, **kwargs)

  def assign_add(self, *args, **kwargs):
    self._tfde_check()
    return super().assign_add(*args, **kwargs)

  def assign_sub(self, *args, **kwargs):
    self._tfde_check()
    return super().assign_sub(*args, **kwargs)


class DistributedEmbedding(tf_keras.layers.Layer):
  """tfde's tables on a DTensor mesh, as a tf_keras layer.

  >>> import tensorflow as tf, tfde, tfde.dtensor
  >>> from tensorflow.experimental import dtensor
  >>> mesh = dtensor.create_mesh([("batch", 1)], devices=["CPU:0"])
  >>> table = tfde.TableConfig(name="t", vocabulary_size=10, embedding_dim=4,
  ...                          combiner="sum")
  >>> layer = tfde.dtensor.DistributedEmbedding(
  ...     {"f": tfde.FeatureConfig(name="f", table=table)}, mesh)
  >>> ids = dtensor.copy_to_mesh(tf.constant([[1, 2], [3, -1]], tf.int64),
  ...                            dtensor.Layout.replicated(mesh, 2))
  >>> layer({"f": ids})["f"].shape
  TensorShape([2, 4])
  >>> again = tfde.dtensor.DistributedEmbedding.from_config(layer.get_config(), mesh)
  >>> again.feature_configs["f"].table == table
  True

  Args:
    feature_configs: dict of name -> `tfde.FeatureConfig` (or a list).
    mesh: the `dtensor.Mesh`.
    mesh_dim: the mesh dimension the tables are sharded over, and the
      inputs' and outputs' batch dimension is sharded over. On a mesh with
      other dimensions too (say "batch" x "model"), every device along them
      holds its coordinate's shard, and all of them apply the same update.
  """

  def __init__(self, feature_configs, mesh, mesh_dim="batch", **kwargs):
    super().__init__(**kwargs)
    if isinstance(feature_configs, (list, tuple)):
      feature_configs = {f.name: f for f in feature_configs}
    for name, feature in feature_configs.items():
      if not isinstance(feature, config_lib.FeatureConfig):
        raise ValueError(f"feature {name!r}: expected a tfde.FeatureConfig, got "
                         f"{type(feature).__name__}")
    self.feature_configs = dict(feature_configs)
    self.mesh, self.mesh_dim = mesh, mesh_dim
    tables = {}
    for feature in self.feature_configs.values():
      table = feature.table
      if table.name in tables and tables[table.name].config is not table:
        raise ValueError(f"two different tables are named {table.name!r}")
      if table.name not in tables:
        tables[table.name] = DTensorTable(table, mesh, mesh_dim)
    self._tables = tables
    # Records the rows read on the gradient tape (see gradient_sources).
    self.sparse_update_anchor = _SparseUpdateAnchor(
        dt.call_with_layout(tf.zeros, dt.Layout.replicated(mesh, 0), []),
        trainable=True, name="sparse_update_anchor")
    self.sparse_update_anchor._tfde_layer_name = self.name
    self._last_read = None

  @property
  def tables(self):
    return dict(self._tables)

  def _check(self, name, ids, weights):
    feature = self.feature_configs[name]
    where = f"feature {name} (table {feature.table.name})"
    if not ids.dtype.is_integer:
      raise TypeError(f"{where}: ids must be int32 or int64, got {ids.dtype.name}")
    if ids.shape.rank not in (1, 2):
      raise ValueError(f"{where}: ids must be [batch] or [batch, hotness] "
                       f"(dense, -1 pads), got shape {ids.shape}")
    if weights is not None and weights.shape.rank != ids.shape.rank:
      raise ValueError(f"{where}: weights of shape {weights.shape} do not match "
                       f"ids of shape {ids.shape}")
    return where

  def call(self, inputs, weights=None):
    unknown = sorted(set(inputs) - set(self.feature_configs))
    missing = sorted(set(self.feature_configs) - set(inputs))
    if unknown or missing:
      raise ValueError(f"inputs must have exactly the features "
                       f"{sorted(self.feature_configs)}; unknown {unknown}, "
                       f"missing {missing}")
    weights = weights or {}
    mesh = self.mesh
    replicated = {1: dt.Layout.replicated(mesh, 1), 2: dt.Layout.replicated(mesh, 2)}
    by_table = {}
    for name in sorted(self.feature_configs):
      ids, w = inputs[name], weights.get(name)
      where = self._check(name, ids, w)
      table = self._tables[self.feature_configs[name].table.name]
      # DTensor's collectives take no uint64 ids, so they become int64
      # here; one of 2^63 or more, which the cast wraps to a negative id
      # (2^64 - 1 to the padding -1: a silent zero row), is marked first.
      checks = []
      if ids.dtype == tf.uint64:
        wrapped = tf.reshape(tf.cast(ids >= tf.constant(2**63, tf.uint64), tf.int32), [-1])
        checks.append(tf.debugging.Assert(
            tf.equal(tf.reduce_max(dt.relayout(wrapped, replicated[1])), 0),
            [f"{where}: ids must lie in [0, {table.vocabulary_size}); got a uint64 "
             "id of 2^63 or more"]))
      ids = tf.cast(ids, tf.int64)
      if ids.shape.rank == 1:
        ids = ids[:, None]
        w = None if w is None else w[:, None]
      ids = dt.relayout(ids, replicated[2])
      checks.append(tf.debugging.Assert(
          tf.reduce_all(tf.logical_and(ids >= -1, ids < table.vocabulary_size)),
          [f"{where}: ids must lie in [0, {table.vocabulary_size}) (-1 pads); got "
           "min and max", tf.reduce_min(ids), tf.reduce_max(ids)]))
      with tf.control_dependencies(checks):
        ids = tf.identity(ids)
      valid = tf.cast(ids >= 0, tf.float32)
      w = valid if w is None else dt.relayout(tf.cast(w, tf.float32), replicated[2]) * valid
      by_table.setdefault(table.name, []).append((name, ids, w))
    outputs, read = {}, {}
    anchor = tf.convert_to_tensor(self.sparse_update_anchor)
    for table_name, features in by_table.items():
      table = self._tables[table_name]
      flat = tf.concat([tf.reshape(ids, [-1]) for _, ids, _ in features], 0)
      local, rows = table.read_rows(flat)
      # rows + 0 * anchor: the tape records the rows read (the anchor is
      # trainable), so tape.gradient can be asked for them.
      rows = rows + tf.zeros([], rows.dtype) * anchor
      read[table_name] = (local, rows)
      every = tf.reduce_sum(rows, axis=0)   # all-reduce of the rows read
      offset = 0
      for name, ids, w in features:
        batch, hot = ids.shape
        part = tf.reshape(every[offset:offset + batch * hot],
                          [batch, hot, table.embedding_dim])
        offset += batch * hot
        part = dt.relayout(part, dt.Layout([self.mesh_dim, dt.UNSHARDED, dt.UNSHARDED], mesh))
        w = dt.relayout(w, dt.Layout([self.mesh_dim, dt.UNSHARDED], mesh))
        summed = tf.reduce_sum(part * w[:, :, None], axis=1)
        combiner = table.config.combiner
        if combiner == "sum":
          out = summed
        else:
          scale = (tf.reduce_sum(w, axis=1) if combiner == "mean" else
                   tf.sqrt(tf.reduce_sum(w * w, axis=1)))
          out = tf.math.divide_no_nan(summed, scale[:, None])
        outputs[name] = out
    self._last_read = read
    # Until gradient_sources() is asked for, an optimizer's update of the
    # anchor means a step that trains no table (see _SparseUpdateAnchor).
    self.sparse_update_anchor._tfde_sources_taken = False
    return outputs

  # ---- training

  def gradient_sources(self):
    """The rows the last call read, one [N, M, D] tensor per table (in the
    order of `tables`): pass them to `tape.gradient` after the model's
    variables."""
    if self._last_read is None:
      raise ValueError("gradient_sources() comes after a call of the layer "
                       "in the same train step")
    self.sparse_update_anchor._tfde_sources_taken = True
    return [self._last_read[t][1] for t in sorted(self._last_read)]

  def sparse_gradients(self, grads):
    """Pairs `tape.gradient`'s results for `gradient_sources()` with the
    rows they belong to; return the result from the train step."""
    names = sorted(self._last_read)
    if len(grads) != len(names):
      raise ValueError(f"expected {len(names)} gradients (one per table "
                       f"{names}), got {len(grads)}")
    # table -> (rows each device read [N, M], -1 for none; their gradients
    # [N, M, D]), both sharded on dim 0: a plain structure, so a
    # tf.function returns it.
    # (The tape may lay a gradient out otherwise: relayout it, a local
    # slice, so each device holds its shard's rows.)
    sharded = dt.Layout([self.mesh_dim, dt.UNSHARDED, dt.UNSHARDED], self.mesh)
    return {t: (self._last_read[t][0],
                dt.relayout(tf.zeros_like(self._last_read[t][1]) if g is None else g,
                            sharded))
            for t, g in zip(names, grads)}

  def apply_gradients(self, sparse):
    """Each table's own sparse optimizer step on the touched rows of each
    device's shard (eager; after the train step)."""
    unknown = sorted(set(sparse) - set(self._tables))
    if unknown:
      raise ValueError(f"no tables {unknown} in this layer")
    for name in sorted(sparse):
      rows, grads = sparse[name]
      self._tables[name].apply_sparse(rows, grads)

  def get_config(self):
    """The features (tables shared between features stay shared) and
    `mesh_dim`; a mesh is not serialisable: `from_config(config, mesh)`."""
    config = super().get_config()
    config["feature_configs"] = {
        name: f.get_config() for name, f in self.feature_configs.items()}
    config["mesh_dim"] = self.mesh_dim
    return config

  @classmethod
  def from_config(cls, config, mesh=None):
    if mesh is None:
      raise ValueError("tfde.dtensor.DistributedEmbedding.from_config needs the "
                       "mesh: from_config(config, mesh)")
    config = dict(config)
    tables = {}
    config["feature_configs"] = {
        name: config_lib.FeatureConfig.from_config(f, tables)
        for name, f in config["feature_configs"].items()}
    return cls(mesh=mesh, **config)
