"""The lookup pipeline: one exchange per table width per step.

>>> import tensorflow as tf
>>> import tfde
>>> table = tfde.TableConfig(name="t", vocabulary_size=100, embedding_dim=4,
...                          optimizer="sgd", combiner="sum")
>>> lookup = tfde.lookup.ShardedLookup(
...     {"a": tfde.FeatureConfig(name="a", table=table),
...      "b": tfde.FeatureConfig(name="b", table=table)})
>>> out = lookup({"a": tf.constant([[1, 2], [3, 3]]),
...               "b": tf.ragged.constant([[5], [], [7, 8, 9]])})
>>> out["a"].shape, out["b"].shape
(TensorShape([2, 4]), TensorShape([3, 4]))

Forward, per group of tables of one width, as three stages:

1. input distribution: flatten every feature (dense, ragged or sparse, with
   optional weights) to ids and row splits; offset each table's ids into a
   fused id space; dedup; group the unique ids by owner (`id % N`); send
   each owner the local rows it must serve (all-to-all);
2. local compute: gather the requested rows from this replica's shards;
3. output distribution: send the rows back (the reverse all-to-all),
   restore the unique order, and combine per sample (sum, mean, sqrtn).

Backward reverses it: per-unique-id gradients (one fused segment sum over
all features of the group), the all-to-all to the owners, a sum of the
gradients each owned row received, and one optimizer step per table,
applied to the touched rows only, once per step however many features
share the table. With `train_in_backward=False` the backward instead
returns `tf.IndexedSlices` gradients for the local shards (SOK style) and
applies nothing.
"""

import collections
import dataclasses

import tensorflow as tf
from tensorflow.python.eager import tape as tape_lib

from tfde import comm as comm_lib
from tfde import ops
from tfde import sharding
from tfde import tables as tables_lib
from tfde.ops import checks
from tfde.ops import reference


@dataclasses.dataclass
class FlatFeature:
  """A feature's batch as flat ids, row splits and optional weights."""
  name: str
  table: object
  ids: tf.Tensor          # int64 [n]
  row_splits: tf.Tensor   # int64 [batch + 1]
  weights: object         # float32 [n] or None


def _where(feature_name, table_name):
  # No quotes: graph-mode Assert messages escape them.
  return f"feature {feature_name} (table {table_name})"


def _check_ids_dtype(ids, where):
  if not ids.dtype.is_integer:
    raise TypeError(f"{where}: ids must be int32 or int64, got {ids.dtype.name}")
  return tf.cast(ids, tf.int64)


def _kind(value):
  if isinstance(value, tf.RaggedTensor):
    return "ragged"
  if isinstance(value, tf.SparseTensor):
    return "sparse"
  return "dense"


def flatten_feature(feature_name, table_name, inputs, weights=None):
  """(ids int64 [n], row_splits int64 [B+1], weights float32 [n] or None).

  Dense inputs of rank 1 give one id per sample, rank 2 [batch, hotness]
  give `hotness` ids per sample; ragged inputs give their rows; sparse
  inputs [batch, hotness] give the ids present in each row. Weights must
  have the same kind and structure as the ids.
  """
  where = _where(feature_name, table_name)
  if weights is not None and _kind(weights) != _kind(inputs):
    raise ValueError(f"{where}: weights are {_kind(weights)} but the ids are "
                     f"{_kind(inputs)}; they must match")
  if isinstance(inputs, tf.RaggedTensor):
    if inputs.ragged_rank != 1 or inputs.shape.rank != 2:
      raise ValueError(f"{where}: ragged ids must be [batch, (hotness)], got "
                       f"shape {inputs.shape}")
    ids = _check_ids_dtype(inputs.values, where)
    splits = tf.cast(inputs.row_splits, tf.int64)
    w = None
    if weights is not None:
      guards = [checks.assert_that(
          tf.reduce_all(tf.equal(tf.cast(weights.row_splits, tf.int64), splits)),
          f"{where}: weights do not have the same row lengths as the ids")]
      with tf.control_dependencies(guards):
        w = tf.cast(weights.values, tf.float32)
    return ids, splits, w
  if isinstance(inputs, tf.SparseTensor):
    if inputs.shape.rank != 2:
      raise ValueError(f"{where}: sparse ids must be [batch, hotness], got "
                       f"shape {inputs.shape}")
    inputs = tf.sparse.reorder(inputs)
    ids = _check_ids_dtype(inputs.values, where)
    batch = inputs.dense_shape[0]
    counts = tf.math.bincount(tf.cast(inputs.indices[:, 0], tf.int32),
                              minlength=tf.cast(batch, tf.int32),
                              maxlength=tf.cast(batch, tf.int32), dtype=tf.int64)
    splits = tf.concat([[0], tf.cumsum(counts)], 0)
    w = None
    if weights is not None:
      weights = tf.sparse.reorder(weights)
      same = tf.logical_and(
          tf.equal(tf.shape(weights.indices)[0], tf.shape(inputs.indices)[0]),
          tf.reduce_all(tf.equal(tf.shape(weights.indices), tf.shape(inputs.indices))))
      same = tf.cond(same, lambda: tf.reduce_all(tf.equal(weights.indices,
                                                          inputs.indices)),
                     lambda: tf.constant(False))
      guards = [checks.assert_that(
          same, f"{where}: weights do not have the same indices as the ids")]
      with tf.control_dependencies(guards):
        w = tf.cast(weights.values, tf.float32)
    return ids, splits, w
  inputs = tf.convert_to_tensor(inputs)
  ids = _check_ids_dtype(inputs, where)
  rank = inputs.shape.rank
  if rank == 1:
    ids = tf.reshape(ids, [-1, 1])
  elif rank != 2:
    raise ValueError(f"{where}: dense ids must have rank 1 or 2, got shape "
                     f"{inputs.shape}")
  batch = tf.shape(ids, out_type=tf.int64)[0]
  hotness = tf.shape(ids, out_type=tf.int64)[1]
  splits = tf.range(batch + 1, dtype=tf.int64) * hotness
  w = None
  if weights is not None:
    weights = tf.convert_to_tensor(weights, tf.float32)
    if weights.shape.rank is not None and weights.shape.rank != rank:
      raise ValueError(f"{where}: weights have shape {weights.shape} but the "
                       f"ids have shape {inputs.shape}")
    guards = [checks.assert_that(
        tf.reduce_all(tf.equal(tf.shape(weights), tf.shape(inputs))),
        f"{where}: weights have shape ", tf.shape(weights),
        " but the ids have shape ", tf.shape(inputs))]
    with tf.control_dependencies(guards):
      w = tf.reshape(weights, [-1])
  return tf.reshape(ids, [-1]), splits, w


def check_id_range(ids, vocabulary_size, feature_name, table_name):
  """Fails with the first out-of-range id, its position and its table."""
  bad = checks.first_index_where((ids < 0) | (ids >= vocabulary_size))
  check = checks.assert_that(
      tf.equal(tf.size(bad), 0), _where(feature_name, table_name), ": id ",
      tf.gather(ids, bad), " at position ", bad, " is out of range [0, ",
      str(vocabulary_size), ")")
  with tf.control_dependencies([check]):
    return tf.identity(ids)


@dataclasses.dataclass
class Routed:
  """The result of stage 1 for one replica.

  Attributes:
    requested: what this replica serves: local rows (static tables) or ids
      (dynamic tables), grouped by the replica that asked.
    counts: their sightings in the batch (dynamic tables), else None.
    answer_index: where each of this replica's ids finds its row among the
      answers of stage 3.
    plan: the exchange, or None when this replica owns every row.
  """
  requested: tf.Tensor
  counts: object
  answer_index: tf.Tensor
  plan: object


def route_to_owners(comm, unique, inverse, num_shards, counts=None, dynamic=False):
  """Stage 1, input distribution: the unique ids (with their counts, if
  given) grouped by owner, `id mod N`, and sent to it."""
  if num_shards == 1:
    # This replica owns every row: nothing to route, and the requests are
    # already unique.
    return Routed(unique, counts, inverse, None)
  owner_ids, send_counts, positions = ops.partition_by_shard(unique, num_shards,
                                                             dynamic=dynamic)
  plan = comm.plan(send_counts)
  if counts is None:
    requested, requested_counts = comm.all_to_all(owner_ids, plan), None
  else:
    # Ids and counts travel together, as the two columns of one tensor.
    grouped_counts = tf.scatter_nd(positions[:, None], counts, tf.shape(counts))
    received = comm.all_to_all(tf.stack([owner_ids, grouped_counts], 1), plan)
    requested, requested_counts = received[:, 0], received[:, 1]
  # Where each id's row will arrive: composing the two permutations spares
  # copying the answered rows back into unique order.
  return Routed(requested, requested_counts, tf.gather(positions, inverse), plan)


def answer_requesters(comm, rows, routed):
  """Stage 3, output distribution: the rows served go back to the replicas
  that asked for them."""
  return rows if routed.plan is None else comm.all_to_all(rows, routed.plan.reversed())


def gradients_to_owners(comm, answer_grad, routed):
  """The backward of stages 1 to 3: (the distinct rows or ids this replica
  serves, their gradients summed over every replica that asked)."""
  if routed.plan is None:
    return routed.requested, answer_grad
  owner_grad = comm.all_to_all(answer_grad, routed.plan)
  # Several replicas may have asked for the same row.
  owned, owned_inverse, _ = ops.unique_with_counts(routed.requested)
  return owned, tf.math.unsorted_segment_sum(owner_grad, owned_inverse, tf.size(owned))


class _Group:
  """Tables of one width, looked up together: one exchange for sharded
  tables, one gradient all-gather for replicated ones."""

  def __init__(self, tables, num_shards):
    self.tables = tables
    self.replicated = tables[0].replicated
    self.dynamic = tables[0].is_dynamic
    self.index = {t.name: i for i, t in enumerate(tables)}
    self.num_shards = 1 if self.replicated else num_shards
    self.width = tables[0].embedding_dim
    # Dynamic tables have no row space to fuse: each is a group of its own.
    self.layout = None if self.dynamic else sharding.FusedGroupLayout(
        [t.vocabulary_size for t in tables], self.num_shards)


def _same_table(a, b):
  """Same storage and training, whatever combiner each feature asks for."""
  def key(c):
    return (c.name, c.vocabulary_size, c.embedding_dim, c.placement,
            c.optimizer.get_config(), c.seed)
  return key(a) == key(b)


def _replicate(config, auto_replicate_bytes):
  if config.is_dynamic:
    if config.placement == "default_device":
      raise ValueError(f"table {config.name!r} is dynamic; it is sharded, so "
                       "placement 'default_device' does not apply")
    return False
  if config.placement == "sparsecore":
    raise ValueError(
        f"table {config.name!r}: placement 'sparsecore' needs TPU SparseCore, "
        "which this process does not have; use 'auto' or 'default_device'")
  if config.placement == "default_device":
    return True
  size = config.vocabulary_size * config.embedding_dim * 4
  return size <= auto_replicate_bytes


def _stack_tables(tables, table_stacking):
  """Groups of tables that share an exchange (same width and placement)."""
  def key(t):
    if t.is_dynamic:
      return (t.embedding_dim, "dynamic", t.name)  # always alone
    return (t.embedding_dim, "replicated" if t.replicated else "sharded", "")

  if table_stacking == "auto":
    by_key = collections.defaultdict(list)
    for name in sorted(tables):
      by_key[key(tables[name])].append(tables[name])
    return [by_key[k] for k in sorted(by_key)]
  if table_stacking is None:
    return [[tables[name]] for name in sorted(tables)]
  if not isinstance(table_stacking, (list, tuple)) or not all(
      isinstance(g, (list, tuple)) for g in table_stacking):
    raise ValueError(f"table_stacking must be 'auto', None or a list of lists "
                     f"of table names, got {table_stacking!r}")
  seen, groups = set(), []
  for names in table_stacking:
    unknown = sorted(set(names) - set(tables))
    if unknown:
      raise ValueError(f"table_stacking names unknown tables {unknown}")
    repeated = sorted(set(names) & seen)
    if repeated:
      raise ValueError(f"table_stacking lists tables {repeated} twice")
    seen.update(names)
    members = [tables[n] for n in names]
    if len(members) > 1 and any(t.is_dynamic for t in members):
      raise ValueError(f"table_stacking group {list(names)} holds a dynamic "
                       "table; dynamic tables are looked up alone")
    if len({key(t) for t in members}) > 1:
      raise ValueError(f"table_stacking group {list(names)} mixes widths or "
                       "placements; stacked tables must share both")
    groups.append(members)
  groups.extend([tables[n]] for n in sorted(set(tables) - seen))
  return groups


class ShardedLookup(tf.Module):
  """Looks up many features in sharded tables in one pipeline.

  Args:
    feature_configs: dict (or flat list) of `FeatureConfig`s; features that
      name the same `TableConfig` share its table.
    tables: optional dict of table name -> ShardedTable to use; the rest
      are created here, in the current strategy's scope.
    train_in_backward: apply each table's optimizer inside the backward
      pass (default); False returns IndexedSlices gradients for the local
      shard variables instead.
    table_stacking: which tables share an exchange: "auto" (all tables of
      one width and placement), None (each table alone), or a list of lists
      of table names (tables left out go alone).
    auto_replicate_bytes: tables with placement "auto" and at most this
      many bytes (V * D * 4) are replicated instead of sharded. The
      low-level default 0 shards them all; the Keras layer sets keras-rs's
      "auto" policy (`tfde.layers.AUTO_REPLICATE_BYTES`).
    update_trigger: the scalar variable whose gradient runs the backward
      pass (the Keras layer passes one of its weights); made here if None.

  `trainable_variables` is a single zero scalar whose gradient is what runs
  the backward pass: pass it to `tape.gradient` (Keras does so through the
  layer); its gradient is zero, so any dense optimizer leaves it alone.
  """

  def __init__(self, feature_configs, tables=None, train_in_backward=True,
               table_stacking="auto", auto_replicate_bytes=0,
               update_trigger=None, name="sharded_lookup"):
    super().__init__(name=name)
    if isinstance(feature_configs, dict):
      feature_configs = list(feature_configs.values())
    self.feature_configs = {f.name: f for f in feature_configs}
    if len(self.feature_configs) != len(feature_configs):
      raise ValueError("feature names must be unique")
    self.comm = comm_lib.current()
    self.tables = dict(tables or {})
    for feature in feature_configs:
      cfg = feature.table
      existing = self.tables.get(cfg.name)
      if existing is None and cfg.is_dynamic:
        _replicate(cfg, auto_replicate_bytes)  # validates the placement
        self.tables[cfg.name] = tables_lib.DynamicTable(cfg, self.comm)
      elif existing is None:
        self.tables[cfg.name] = tables_lib.ShardedTable(
            cfg, self.comm, replicated=_replicate(cfg, auto_replicate_bytes))
      elif existing.config is not cfg and not _same_table(existing.config, cfg):
        raise ValueError(f"two different tables are named {cfg.name!r}")
    self.train_in_backward = train_in_backward
    self._groups = [_Group(ts, self.comm.num_replicas)
                    for ts in _stack_tables(self.tables, table_stacking)]
    if update_trigger is None:
      with tf.init_scope():
        update_trigger = tf.Variable(0.0, trainable=True,
                                     name="sparse_update_trigger")
    self.update_trigger = update_trigger

  def flatten(self, inputs, weights=None):
    """Stage 0: every configured feature as a FlatFeature (validated)."""
    if not isinstance(inputs, dict):
      raise TypeError(f"inputs must be a dict of feature name -> ids, got "
                      f"{type(inputs).__name__}")
    unknown = sorted(set(inputs) - set(self.feature_configs))
    if unknown:
      raise ValueError(f"features {unknown} are not in the configuration; "
                       f"configured: {sorted(self.feature_configs)}")
    weights = weights or {}
    unknown = sorted(set(weights) - set(self.feature_configs))
    if unknown:
      raise ValueError(f"weights given for unknown features {unknown}")
    flat = []
    for name, feature in self.feature_configs.items():
      table = self.tables[feature.table.name]
      if name not in inputs:
        raise ValueError(f"{_where(name, table.name)} is missing from the inputs")
      ids, splits, w = flatten_feature(name, table.name, inputs[name],
                                       weights.get(name))
      if not table.is_dynamic:
        # Dynamic tables take any int64 id as a key.
        ids = check_id_range(ids, table.vocabulary_size, name, table.name)
      flat.append(FlatFeature(name, table, ids, splits, w))
    return flat

  # Trace-time Python only: autograph must not rewrite the pipeline.
  @tf.autograph.experimental.do_not_convert
  def __call__(self, inputs, weights=None, trigger=None, training=True):
    """Returns a dict of feature name -> [batch, dim] embeddings.

    `trigger` overrides the value of `update_trigger` (the Keras layer
    passes its weight's value). `training=False` (evaluation, serving)
    keeps dynamic tables as they are: no sightings counted, no rows made.
    """
    flat = self.flatten(inputs, weights)
    comm = comm_lib.current()
    if comm.num_replicas != self.comm.num_replicas:
      raise RuntimeError(
          f"the tables were built for {self.comm.num_replicas} replicas but "
          f"this call runs with {comm.num_replicas}; build and call under the "
          "same strategy")
    if trigger is None:
      trigger = tf.convert_to_tensor(self.update_trigger)
    outputs = {}
    for group in self._groups:
      members = [f for f in flat if f.table.name in group.index]
      if members:
        if group.dynamic:
          results = self._lookup_dynamic_group(group, members, trigger, training)
        else:
          results = self._lookup_group(group, members, trigger)
        for feature, out in zip(members, results):
          outputs[feature.name] = out
    return {name: outputs[name] for name in self.feature_configs}

  # ---- the pipeline for one group

  def _lookup_group(self, group, features, trigger):
    comm = self.comm
    num_shards = group.num_shards
    replica = comm.replica_id()
    layout = group.layout
    fused_ids = tf.concat(
        [f.ids + layout.id_offset(group.index[f.table.name]) for f in features], 0)
    sizes = [tf.size(f.ids) for f in features]
    # A feature's own config decides its combiner (SOK picks it per lookup).
    combiners = [self.feature_configs[f.name].table.combiner for f in features]

    @tf.custom_gradient
    def lookup(trigger_value):
      # 1. Input distribution: dedup, group the unique ids by owner, and
      #    send each owner the local rows it must serve.
      unique, inverse, _ = ops.unique_with_counts(fused_ids)
      routed = route_to_owners(comm, unique, inverse, num_shards)
      # When this replica owns every row it reads (one shard), the kernels
      # fuse the stages around the local compute, as TorchRec's batched
      # tables do: the outputs combine each id's row straight from its
      # table, and the optimizer sums each row's gradient from the output
      # gradient as it applies it. Neither the gathered rows nor a [rows,
      # dim] gradient is written. (The twins have no fused ops; composing
      # stock ops is faster for them.)
      all_local = routed.plan is None and ops.current_backend() == ops.KERNELS
      # The rows this replica's ids read, one per unique id (answered in
      # the owners' order, which answer_index follows).
      num_rows = tf.size(unique)
      # The features as one ragged batch, for the fused forward and backward.
      batch = self._as_one_batch(features, combiners)
      if all_local:
        outputs = self._combine_from_tables(group, replica, features, routed, batch)
      else:
        # 2. Local compute.
        rows = self._gather_owned(group, replica, routed.requested)
        # 3. Output distribution.
        answered = answer_requesters(comm, rows, routed)
        outputs = self._combine(features, answered, routed.answer_index, sizes, combiners)

      def grad_fn(*output_grads, variables=None):
        every_copy = group.replicated and comm.num_replicas > 1
        if all_local and self.train_in_backward and not every_copy:
          owned = routed.requested
          summed = self._answer_grad(features, output_grads, routed.answer_index,
                                     batch, num_rows, group.width, as_bags=True)
        else:
          # One gradient row per answered row, so already grouped by owner.
          answer_grad = self._answer_grad(features, output_grads, routed.answer_index,
                                          batch, num_rows, group.width)
          owned, summed = gradients_to_owners(comm, answer_grad, routed)
        if every_copy:
          # Every copy applies the same update: the gradients of all
          # replicas, summed per row in replica order on each of them.
          every_row = comm.all_gather(owned)
          every_grad = comm.all_gather(answer_grad)
          owned, owned_inverse, _ = ops.unique_with_counts(every_row)
          summed = tf.math.unsorted_segment_sum(every_grad, owned_inverse,
                                                tf.size(owned))
        per_table = self._split_by_table(group, owned)
        variables = variables or []
        if self.train_in_backward:
          updates = [table.apply_shard_update(replica, local_rows, summed,
                                              grad_rows=grad_rows)
                     for table, (local_rows, grad_rows) in zip(group.tables, per_table)]
          # Zero, but computed from the updates' results, so whatever
          # consumes the trigger's gradient runs them.
          applied = tf.add_n([tf.cast(u, trigger_value.dtype) for u in updates])
          trigger_grad = tf.zeros_like(trigger_value) * applied
          return trigger_grad, [None] * len(variables)
        slices = {}
        for table, (local_rows, grad_rows) in zip(group.tables, per_table):
          shard = table.shard(replica)
          grads = summed if grad_rows is None else tf.gather(summed, grad_rows)
          slices[id(shard)] = tf.IndexedSlices(grads, local_rows,
                                               tf.shape(shard, out_type=tf.int64))
        return (tf.zeros_like(trigger_value),
                [slices.get(id(v)) for v in variables])

      return outputs, grad_fn

    return lookup(trigger)

  def _lookup_dynamic_group(self, group, features, trigger, training):
    """The pipeline for one dynamic table: ids are keys, routed by floor(id
    mod N), each with its number of sightings in this batch (admission
    counts them); the owner finds or creates the rows."""
    comm = self.comm
    num_shards = group.num_shards
    replica = comm.replica_id()
    table = group.tables[0]
    ids = tf.concat([f.ids for f in features], 0)
    sizes = [tf.size(f.ids) for f in features]
    combiners = [self.feature_configs[f.name].table.combiner for f in features]

    @tf.custom_gradient
    def lookup(trigger_value):
      # 1. Input distribution: unique ids with their counts, to their owners.
      unique, inverse, counts = ops.unique_with_counts(ids)
      routed = route_to_owners(comm, unique, inverse, num_shards,
                               counts=tf.cast(counts, tf.int64), dynamic=True)
      # 2. Local compute: find (or, training, admit and create) the rows.
      if not self.train_in_backward:
        # Gradients go to the shard's stand-in variable (SOK style).
        tape_lib.variable_accessed(table.gradient_variables[replica])
      rows = table.lookup_shard(replica, routed.requested, routed.counts, training)
      # 3. Output distribution.
      answered = answer_requesters(comm, rows, routed)
      outputs = self._combine(features, answered, routed.answer_index, sizes, combiners)

      def grad_fn(*output_grads, variables=None):
        answer_grad = self._answer_grad(features, output_grads, routed.answer_index,
                                        self._as_one_batch(features, combiners),
                                        tf.shape(answered)[0], table.embedding_dim)
        owned, summed = gradients_to_owners(comm, answer_grad, routed)
        variables = variables or []
        if not self.train_in_backward:
          stand_in = table.gradient_variables[replica]
          slices = tf.IndexedSlices(
              summed, owned, tf.constant([2**62, table.embedding_dim], tf.int64))
          return (tf.zeros_like(trigger_value),
                  [slices if v is stand_in else None for v in variables])
        step = table.apply_shard_update(replica, owned, summed)
        trigger_grad = tf.zeros_like(trigger_value) * tf.cast(step, trigger_value.dtype)
        return trigger_grad, [None] * len(variables)

      return outputs, grad_fn

    return lookup(trigger)

  @staticmethod
  def _combine(features, answered, answer_index, sizes, combiners):
    """Each feature's [batch, dim] output from the rows answered for it."""
    indices = tf.split(answer_index, sizes) if len(features) > 1 else [answer_index]
    return [ops.embedding_combine(answered, idx, f.row_splits, f.weights, c)
            for f, idx, c in zip(features, indices, combiners)]

  def _owned_shards(self, group, replica):
    shards = [t.shard(replica) for t in group.tables]
    if not self.train_in_backward:
      # The kernels read the variables through their handles, which a tape
      # does not see; tell it, so gradients can flow to the shards. (When
      # training in backward, watching them would only cost a copy.)
      for shard in shards:
        tape_lib.variable_accessed(shard)
    return shards

  def _gather_owned(self, group, replica, local_rows):
    return ops.gather_from_tables(self._owned_shards(group, replica), local_rows,
                                  group.layout.base)

  def _combine_from_tables(self, group, replica, features, routed, batch):
    """Each feature's output read straight from the shards (one shard): one
    op for all the group's features."""
    shards = self._owned_shards(group, replica)
    splits, weights, combiner = batch
    out = ops.combine_from_tables(shards, routed.requested, group.layout.base,
                                  routed.answer_index, splits, weights, combiner)
    outputs = [out] if len(features) == 1 else tf.split(
        out, [tf.size(f.row_splits) - 1 for f in features])
    for f, o in zip(features, outputs):
      o.set_shape([f.row_splits.shape[0] - 1 if f.row_splits.shape[0] else None,
                   group.width])
    return outputs

  @staticmethod
  def _split_by_table(group, fused_rows):
    """Per table: (its local rows, which gradient rows belong to them).

    Only the small index vectors are partitioned; the optimizers read the
    gradient rows in place (grad_rows)."""
    if len(group.tables) == 1:
      return [(fused_rows, None)]
    return ops.split_rows_by_table(fused_rows, group.layout.base)

  @staticmethod
  def _as_one_batch(features, combiners):
    """The features as one ragged batch: (row_splits, weights, combiner).

    Several features fold each one's combiner into per-id coefficients
    (the weights of a "sum") and concatenate their samples, so one combine
    or gradient op serves them all."""
    if len(features) == 1:
      return features[0].row_splits, features[0].weights, combiners[0]
    needs_weights = any(f.weights is not None or c != "sum"
                        for f, c in zip(features, combiners))
    coefficients, splits, offset = [], [tf.zeros([1], tf.int64)], tf.constant(0, tf.int64)
    for f, combiner in zip(features, combiners):
      if needs_weights:
        _, coef = reference.combine_coefficients(f.row_splits, f.weights,
                                                 tf.size(f.ids), combiner)
        coefficients.append(coef)
      splits.append(f.row_splits[1:] + offset)
      offset += f.row_splits[-1]
    return (tf.concat(splits, 0), tf.concat(coefficients, 0) if needs_weights else None,
            "sum")

  @staticmethod
  def _answer_grad(features, output_grads, inverse, batch, num_rows, dim, as_bags=False):
    """Gradient w.r.t. the `num_rows` rows the combine read, given the
    features as one batch (`_as_one_batch`): a [num_rows, dim] matrix, or
    with `as_bags` a `tfde.ops.BagGradients` standing for it."""
    grads = [tf.zeros(tf.stack([tf.size(f.row_splits) - 1, dim]), tf.float32)
             if g is None else g for f, g in zip(features, output_grads)]
    grad = grads[0] if len(grads) == 1 else tf.concat(grads, 0)
    splits, weights, combiner = batch
    if as_bags:
      return ops.bag_gradients(grad, inverse, splits, weights, num_rows, combiner)
    return ops.embedding_combine_grad(grad, inverse, splits, weights, num_rows, combiner)

  def _trackable_children(self, save_type="checkpoint", **kwargs):
    children = super()._trackable_children(save_type, **kwargs)
    if save_type == "savedmodel":
      # A SavedModel serves from whole-table copies (tfde.serving); the
      # training shards, slots and steps stay out of it.
      children = {k: v for k, v in children.items() if k != "tables"}
    return children

  @property
  def trainable_variables(self):
    """What to pass to `tape.gradient`: the update trigger, plus the local
    shard variables when gradients are returned rather than applied."""
    if self.train_in_backward:
      return (self.update_trigger,)
    return (self.update_trigger,) + tuple(
        v for name in sorted(self.tables)
        for v in self.tables[name].local_variables())

  # ---- views

  def table_values(self):
    """dict of table name -> full [V, D] numpy table (eager); a dynamic
    table gives its `export_rows()` dict (ids, table, slots, counts)."""
    return {name: t.export_rows() if t.is_dynamic
            else t.full_table() for name, t in self.tables.items()}
