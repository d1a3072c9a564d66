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

Row-wise groups of pooled features exchange partial sums instead where
that pays (`tfde.exchange_kind`'s rule): every id goes to its owner with
its sample; each owner combines its rows of every sample of the global
batch from its shard; each replica adds the owners' partial sums.
Backward, every owner gets every output gradient (`tfde.routing`).

Each way of exchanging is a type (`tfde.pipeline.exchanges`), which the
policy there (`choose`) gives each group from the configuration.
"""


import dataclasses
import itertools

import tensorflow as tf

from tfde import collective_keys
from tfde import comm as comm_lib
from tfde import groups as groups_lib
from tfde import inputs as inputs_lib
from tfde import tables as tables_lib
from tfde import tf_internals
from tfde.pipeline import batches
from tfde.pipeline import exchanges as exchanges_lib
from tfde.pipeline import updates as updates_lib
from tfde.planner import layout as plan_layout
from tfde.tables import tpu as tpu_tables
from tfde.tpu import configs as tpu_configs


def wants_gradient(tensor):
  """Whether a gradient of `tensor` may be asked for: a tape watches it
  (eagerly, or while tracing a tf.function), or a TF1 graph, where
  tf.gradients may ask for anything later."""
  if not tf.executing_eagerly() and not tf_internals.building_function_graph():
    return True
  return tf_internals.tape_records(tensor)


def cached_lookup(tables, key, make):
  """The lookup a front door made for `tables` and `key` (its features'
  shape), made by `make()` the first time. Kept on the first table, so it
  lives as long as the tables do, and no longer (no registry)."""
  cache = tables[0].__dict__.setdefault("_door_lookups", {})
  key = tuple(id(t) for t in tables) + tuple(key)
  if key not in cache:
    cache[key] = make()
  return cache[key]


def same_table(a, b):
  """Same storage and training, whatever combiner each feature asks for."""
  def key(c):
    return (c.name, c.vocabulary_size, c.embedding_dim, c.placement,
            c.optimizer_config(), c.seed)
  return key(a) == key(b)


# Numbers the lookups a process builds, in order (`ShardedLookup._key_space`).
_LOOKUP_NUMBERS = itertools.count()


class ShardedLookup(tf.Module):
  """Looks up many features in sharded tables in one pipeline.

  Args:
    feature_configs: `FeatureConfig`s in a dict, list or any nested
      structure: tfde's, `tf.tpu.experimental.embedding`'s or keras-rs's
      (see `tfde.tpu.as_feature_configs`); features that name the same
      `TableConfig` share its table.
    tables: optional dict of table name -> ShardedTable to use; the rest
      are created here, in the current strategy's scope.
    train_in_backward: apply each table's optimizer inside the backward
      pass (default); False returns IndexedSlices gradients for the local
      shard variables instead.
    table_stacking: which tables share an exchange: "auto" (all tables of
      one width and placement), None (each table alone), or a list of lists
      of table names (tables left out go alone).
    auto_replicate_bytes: tables with placement "auto" and at most this
      many bytes (V * D * 4) are replicated instead of sharded; None (the
      default) takes `tfde.placement`'s, as the Keras layer does; 0 shards
      every "auto" table.
    update_trigger: the scalar variable whose gradient runs the backward
      pass (the Keras layer passes one of its weights); made here if None.
    plan: a `tfde.planner.ShardingPlan` (or its config dict) giving each
      table its sharding kind (row-wise, table-wise, column-wise,
      replicated) and owners; tables it does not name, and every table when
      None, follow `placement` and `auto_replicate_bytes` as before.
    exchange: what row-wise groups send between replicas: "auto" (the
      default) each owner's partial sums of every sample where that pays,
      else the rows of each replica's unique ids; "rows" always the rows.
      `tfde.pipeline.exchanges.choose` gives each group its exchange (by
      `tfde.exchange_kind`'s rule for partial sums); `exchanges()` says
      what each table takes.

  `trainable_variables` is a single zero scalar whose gradient is what runs
  the backward pass: pass it to `tape.gradient` (Keras does so through the
  layer); its gradient is zero, so any dense optimizer leaves it alone.
  """

  def __init__(self, feature_configs, tables=None, train_in_backward=True,
               table_stacking="auto", auto_replicate_bytes=None,
               update_trigger=None, plan=None, exchange="auto", name="sharded_lookup"):
    super().__init__(name=name)
    if exchange not in ("auto", "rows"):
      raise ValueError(f"exchange must be 'auto' or 'rows', got {exchange!r}")
    self.exchange = exchange
    self.plan = plan_layout.as_plan(plan)
    # tfde, tf.tpu.experimental.embedding or keras-rs configs, any nesting.
    feature_configs = tpu_configs.as_feature_configs(feature_configs)
    feature_configs = (list(feature_configs.values())
                       if isinstance(feature_configs, dict) and
                       not any(isinstance(v, (dict, list, tuple))
                               for v in feature_configs.values())
                       else tf.nest.flatten(feature_configs))
    self.feature_configs = {f.name: f for f in feature_configs}
    if len(self.feature_configs) != len(feature_configs):
      raise ValueError("feature names must be unique")
    self.comm = comm_lib.current()
    # Names this lookup's collectives apart from other lookups' (workers
    # build their lookups in the same order).
    self._key_space = f"lookup{next(_LOOKUP_NUMBERS)}"
    self.tables = dict(tables or {})
    # Under TPUStrategy, TensorFlow's TPU embedding holds every table (None
    # elsewhere); tracked here, so checkpoints hold its variables.
    self._engine = tpu_tables.engine_for(feature_configs, table_stacking, self.comm,
                                         tables, train_in_backward)
    for feature in feature_configs:
      cfg = feature.table
      existing = self.tables.get(cfg.name)
      if existing is None:
        layout = None if self.plan is None else self.plan.layout_of(
            cfg, self.comm.num_replicas)
        self.tables[cfg.name] = tables_lib.make_table(cfg, self.comm,
                                                      auto_replicate_bytes, layout,
                                                      engine=self._engine)
      elif existing.config is not cfg and not same_table(existing.config, cfg):
        raise ValueError(f"two different tables are named {cfg.name!r}")
    self.train_in_backward = train_in_backward
    self._update = updates_lib.of(train_in_backward)
    if self.plan is not None and table_stacking not in ("auto", None):
      raise ValueError("a plan fuses the tables of one width itself; pass "
                       "table_stacking='auto' (or None) with it")
    # Column-wise tables are looked up through their slices.
    self._lookup_tables = {}
    for name, table in self.tables.items():
      for part in getattr(table, "slices", [table]):
        if part.name in self._lookup_tables or (part is not table and
                                                part.name in self.tables):
          raise ValueError(f"table {name!r}: its column slice {part.name!r} "
                           "has the name of another table")
        self._lookup_tables[part.name] = part
    self._groups = groups_lib.make_groups(self._lookup_tables, table_stacking,
                                          self.comm.num_replicas)
    if update_trigger is None:
      with tf.init_scope():
        update_trigger = tf.Variable(0.0, trainable=True,
                                     name="sparse_update_trigger")
    self.update_trigger = update_trigger

  def flatten(self, inputs, weights=None):
    """Stage 0: every configured feature as a FlatFeature (validated)."""
    comm = comm_lib.current()
    return inputs_lib.flat_features(self.feature_configs, self.tables, inputs, weights,
                                    comm.gather_flags if comm.replicas_in_own_processes else None)

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
    # A column-wise table's feature is looked up once per slice; its
    # output is the slices' outputs side by side.
    parts = []
    for f in flat:
      for part in getattr(f.table, "slices", [f.table]):
        parts.append(dataclasses.replace(f, table=part))
    plan = []
    for group in self._groups:
      members = [f for f in parts if f.table.name in group.index]
      if members:
        plan.append((group, members))
    outputs = {}
    for feature, out in zip([f for _, members in plan for f in members],
                            self._lookup_groups(plan, trigger, training)):
      outputs.setdefault(feature.name, {})[feature.table.name] = (feature, out)
    result = {}
    for name in self.feature_configs:
      table = self.tables[self.feature_configs[name].table.name]
      slices = getattr(table, "slices", None)
      if slices is None:
        feature, out = outputs[name][table.name]
      else:
        feature = outputs[name][slices[0].name][0]
        out = tf.concat([outputs[name][s.name][1] for s in slices], 1)
      result[name] = inputs_lib.shape_output(feature, out)
    return result

  # ---- the pipeline: each group's exchange forward, and back

  def _exchange_of(self, group, names):
    """The exchange of `group` for the features `names`: the policy's
    choice (`tfde.pipeline.exchanges.choose`), from the configuration."""
    choice = exchanges_lib.Choice([self.feature_configs[n] for n in names],
                                  self.comm.num_replicas, self.exchange, self.plan)
    return exchanges_lib.choose(group, choice, self.comm)

  def _lookup_groups(self, plan, trigger, training):
    """Every group's pipeline, [(group, features)], under one custom
    gradient: the backward sees every group's gradients at once, so a step
    that one table refuses (non-finite gradients) updates no table."""
    prepared = []
    for group, features in plan:
      exchange = self._exchange_of(group, [f.name for f in features])
      # A feature's own config decides its combiner (SOK picks it per
      # lookup). Unpooled features sum samples of one id (or none).
      combiners = [self.feature_configs[f.name].table.combiner
                   if self.feature_configs[f.name].output == "pooled" else "sum"
                   for f in features]
      # Weights are inputs of the lookup, differentiated as
      # tf.nn.embedding_lookup_sparse does, when something asks for it.
      trained = [i for i, f in enumerate(features)
                 if f.weights is not None and wants_gradient(f.weights)]
      exchange.refuse_weight_gradients(features, wants_gradient)
      prepared.append((exchange, features, exchange.fused_ids(features), combiners, trained))

    @tf.custom_gradient
    def lookup(trigger_value, *weight_values):
      pairs, outputs = [], []
      given = iter(weight_values)
      for exchange, features, fused_ids, combiners, trained in prepared:
        members = list(features)
        for i in trained:
          members[i] = dataclasses.replace(members[i], weights=next(given))
        self._update.watch(exchange, self.comm.replica_id())
        step = exchange.forward(members, combiners, fused_ids, training)
        pairs.append((exchange, step))
        outputs.extend(step.outputs)

      def grad_fn(*output_grads, variables=None):
        grads, start = [], 0
        for _, step in pairs:
          grads.append(list(output_grads[start:start + len(step.features)]))
          start += len(step.features)
        # After every exchange of the forward, on every replica, where the
        # runtime needs it (`Communicator.after_the_forward`).
        with collective_keys.key_space(self._key_space), \
            tf.control_dependencies(self.comm.after_the_forward(outputs)):
          return self._backward(pairs, grads, trigger_value, variables or [],
                                [p[4] for p in prepared])

      return outputs, grad_fn

    with tables_lib.graph_saving.custom_gradients_see_rank_local_variables(), \
        collective_keys.key_space(self._key_space):
      return lookup(trigger, *[p[1][i].weights for p in prepared for i in p[4]])

  def exchanges(self):
    """Table name -> what its rows' exchange between the replicas is:
    "partial sums" (each owner's sums of every sample), "rows" (each
    replica's unique ids' rows), or "none" (one replica, replicated tables,
    whose backward all-gathers gradients, or an engine's).

    >>> import tfde
    >>> t = tfde.TableConfig(name="t", vocabulary_size=8, embedding_dim=4)
    >>> ShardedLookup({"f": tfde.FeatureConfig(name="f", table=t)}).exchanges()
    {'t': 'none'}
    """
    whole = {part.name: name for name, table in self.tables.items()
             for part in getattr(table, "slices", [table])}
    kinds = {}
    for group in self._groups:
      exchange = self._exchange_of(group, [
          name for name, f in self.feature_configs.items()
          if any(whole[part] == f.table.name for part in group.index)])
      for table in exchange.group.tables:
        # A column-wise table's slices may exchange in several groups.
        previous = kinds.setdefault(whole[table.name], exchange.kind)
        if previous != exchange.kind:
          kinds[whole[table.name]] = "rows" if "rows" in (previous, exchange.kind) else previous
    return kinds

  def _backward(self, pairs, output_grads, trigger_value, variables, trained_weights):
    """Gradients of the rows read, to their owners, summed per row; then
    the update (`tfde.pipeline.updates`). One entry per group in `pairs`
    ([(exchange, step)]), `output_grads` and `trained_weights`."""
    grads = [[tf.zeros_like(out) if g is None else g
              for out, g in zip(step.outputs, step_grads)]
             for (_, step), step_grads in zip(pairs, output_grads)]
    weights_grads, previous = [], []
    for (exchange, step), g, trained in zip(pairs, grads, trained_weights):
      # In group order, as the gradients' exchanges below: the pooled
      # exchange sends each id's row back for them.
      with tf.control_dependencies(previous):
        group_grads = exchange.weights_gradients(step, g, trained)
      weights_grads += group_grads
      previous = group_grads or previous
    # Outside the chains below: what waits on no exchange (a dedup) may
    # run as soon as the forward's ids are known.
    prepared = [exchange.prepare_backward(step) for exchange, step in pairs]
    # The weights' gradients read the rows as the forward combined them,
    # so before this step's update.
    with tf.control_dependencies(weights_grads):
      owned, previous = [], []
      for (exchange, step), ready, g in zip(pairs, prepared, grads):
        # One group's exchanges at a time, in the same order on every
        # replica: exchanges left free to run together would each hold an
        # executor thread while they wait for their peers.
        with tf.control_dependencies(previous):
          rows, summed = exchange.backward(step, ready, g, self._update.for_update)
        owned.append((rows, summed))
        previous = [rows] + batches.tensors_of(summed)
      trigger_grad, variables_grads = self._update.finish(
          self.comm, pairs, owned, grads, trigger_value, variables)
    return [trigger_grad] + weights_grads, variables_grads

  def _trackable_children(self, save_type="checkpoint", **kwargs):
    children = super()._trackable_children(save_type, **kwargs)
    # Column slices are saved through their whole table (`tables`).
    children.pop("_lookup_tables", None)
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
