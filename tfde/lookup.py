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
that pays (`tfde.exchange_kind`): every id goes to its owner with its
sample; each owner combines its rows of every sample of the global batch
from its shard; each replica adds the owners' partial sums. Backward,
every owner gets every output gradient (`tfde.routing`).
"""


import dataclasses
import itertools

import tensorflow as tf

from tfde import collective_keys
from tfde import comm as comm_lib
from tfde import exchange_kind
from tfde import group_step
from tfde import groups as groups_lib
from tfde import inputs as inputs_lib
from tfde import ops
from tfde import planner as planner_lib
from tfde import routing
from tfde import tables as tables_lib
from tfde import tf_internals
from tfde import tpu as tpu_lib
from tfde.tables import tpu as tpu_tables


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
            c.optimizer.get_config(), c.seed)
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
      `tfde.exchange_kind` says which groups take which; `exchanges()`
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
    self.plan = planner_lib.as_plan(plan)
    # tfde, tf.tpu.experimental.embedding or keras-rs configs, any nesting.
    feature_configs = tpu_lib.as_feature_configs(feature_configs)
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

  # ---- the pipeline: three stages forward per group, and backward

  def _lookup_groups(self, plan, trigger, training):
    """Every group's pipeline, [(group, features)], under one custom
    gradient: the backward sees every group's gradients at once, so a step
    that one table refuses (non-finite gradients) updates no table."""
    prepared = []
    for group, features in plan:
      # A feature's own config decides its combiner (SOK picks it per
      # lookup). Unpooled features sum samples of one id (or none).
      combiners = [self.feature_configs[f.name].table.combiner
                   if self.feature_configs[f.name].output == "pooled" else "sum"
                   for f in features]
      # Weights are inputs of the lookup, differentiated as
      # tf.nn.embedding_lookup_sparse does, when something asks for it.
      trained = [i for i, f in enumerate(features)
                 if f.weights is not None and wants_gradient(f.weights)]
      refuse = getattr(group, "refuse_weight_gradients", None)
      if refuse is not None:
        refuse(features, wants_gradient)
      prepared.append((group, features, group.fused_ids(features), combiners, trained))

    @tf.custom_gradient
    def lookup(trigger_value, *weight_values):
      steps, outputs = [], []
      given = iter(weight_values)
      for group, features, fused_ids, combiners, trained in prepared:
        members = list(features)
        for i in trained:
          members[i] = dataclasses.replace(members[i], weights=next(given))
        step = group.forward(self, members, combiners, fused_ids, training)
        steps.append(step)
        outputs.extend(step.outputs)

      def grad_fn(*output_grads, variables=None):
        grads, start = [], 0
        for step in steps:
          grads.append(list(output_grads[start:start + len(step.features)]))
          start += len(step.features)
        # After every exchange of the forward, on every replica. A TF1
        # session runs only what its fetches reach: fetching the train op
        # alone, an owner whose updates need none of the rows it sends back
        # would skip that exchange, and a peer waiting in it would hang.
        # (A TF2 function runs all its stateful ops, eager ops run as they
        # come: there the backward stays free to start before the forward
        # ends.)
        with collective_keys.key_space(self._key_space), \
            tf.control_dependencies(outputs if comm_lib.in_tf1_graph() and
                                    self.comm.num_replicas > 1 else []):
          return self._backward(steps, grads, trigger_value, variables or [],
                                [p[4] for p in prepared])

      return outputs, grad_fn

    with tables_lib.graph_saving.custom_gradients_see_rank_local_variables(), \
        collective_keys.key_space(self._key_space):
      return lookup(trigger, *[p[1][i].weights for p in prepared for i in p[4]])

  def exchange_forward(self, group, features, combiners, fused_ids, training):
    """A group's forward through the replicas' exchange (`TableGroup.forward`):
    stage 1, then stages 2 and 3."""
    step = self._input_dist(group, features, combiners, fused_ids)
    step.outputs = self._compute_and_output_dist(step, training)
    return step

  def _input_dist(self, group, features, combiners, fused_ids):
    """Stage 1: dedup, group the unique ids by owner, and send each owner
    what it must serve (local rows, or ids with their sighting counts); or
    (the pooled exchange) every id with its sample and, where needed, its
    coefficient."""
    comm = self.comm
    if exchange_kind.pools_partials(self.exchange, group,
                                    [self.feature_configs[f.name] for f in features],
                                    self.plan):
      bags = routing.route_bags_to_owners(
          comm, fused_ids, group_step.as_one_batch(features, combiners), group.num_shards,
          group.row_space, stamp=group.step(comm.replica_id()))
      # Each owner's step is then the fused step of one owner over the
      # global batch's bags of its rows; its backward dedups them.
      return group_step.GroupStep(
          group=group, features=features, combiners=combiners,
          replica=comm.replica_id(),
          routed=routing.Routed(bags.requested, None,
                                ops.int32_range(tf.size(bags.requested, out_type=tf.int64)),
                                None),
          batch=(bags.row_splits, bags.weights, "sum"), num_rows=tf.size(bags.requested),
          fused=True, deduped=False, pooled=bags)
    if (group.num_shards == 1 and group.fuses_local and
        not group_step.renormalizes(features)):
      # One owner and a fused combine: the forward reads each id's row
      # where it lies, so nothing needs the dedup (about half of the
      # forward's time at one replica). The backward dedups (`group_step.deduped`),
      # only when a gradient is taken: the updates need unique rows.
      return group_step.GroupStep(
          group=group, features=features, combiners=combiners,
          replica=comm.replica_id(),
          routed=routing.Routed(fused_ids, None,
                                ops.int32_range(tf.size(fused_ids, out_type=tf.int64)),
                                None),
          batch=group_step.as_one_batch(features, combiners), num_rows=tf.size(fused_ids),
          fused=True, deduped=False)
    if group.row_space is None:  # ids, not rows (dynamic tables: with their counts)
      unique, inverse, counts = ops.unique_with_counts(fused_ids)
      counts = tf.cast(counts, tf.int64) if group.routes_ids else None
    else:
      # Fused ids lie below the owners' row space times N. Deduped in
      # increasing order where the bitmap is cheap, each owner receives
      # one increasing run of rows from each replica: its gather reads
      # them in address order.
      unique, inverse = ops.unique_rows(fused_ids, group.row_space * group.num_shards,
                                        group.device(comm.replica_id()))
      counts = None
    routed = routing.route_to_owners(
        comm, unique, inverse, group.num_shards, counts=counts,
        dynamic=group.routes_ids,
        stamp=group.step(comm.replica_id()) if group.num_shards > 1 else None,
        owner=group.owner)
    return group_step.GroupStep(
        group=group, features=features, combiners=combiners,
        replica=comm.replica_id(), routed=routed,
        batch=group_step.as_one_batch(features, combiners), num_rows=tf.size(unique),
        # When this replica owns every row it reads, the stages around the
        # local compute fuse, as TorchRec's batched tables do: outputs
        # combine each id's row straight from its table, and the optimizer
        # sums each row's gradient from the output gradient as it applies
        # it. Neither the gathered rows nor a [rows, dim] gradient is
        # written.
        fused=(routed.plan is None and group.fuses_local and
               not group_step.renormalizes(features)))

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
    return exchange_kind.of_tables(self.exchange, self._groups, self.feature_configs,
                                   self.tables, self.plan)

  def _compute_and_output_dist(self, step, training):
    """Stages 2 and 3: the owners read their rows, send them back, and each
    feature's samples combine them; or (fused) the outputs combine from the
    tables, at the owners as partial sums where the exchange pools."""
    group, routed, features = step.group, step.routed, step.features
    if not self.train_in_backward:
      # The kernels read the variables through their handles, which a tape
      # does not see; tell it, so gradients can flow to them. (When
      # training in backward, watching them would only cost a copy.)
      for variable in group.gradient_variables(step.replica):
        tf_internals.mark_variable_read(variable)
    if step.fused:
      if step.pooled is None and not step.deduped and ops.types.on_cpu(
          group.device(step.replica)):
        # One shard, every id's row read where it lies: on a CPU each
        # feature from its own table (the fused ids and batch are the
        # backward's). A GPU's op waits on the device for its checks, so
        # there one op serves every feature.
        outputs = group.combine_each_local(step.replica, features, step.combiners)
      else:
        out = group.combine_local(step.replica, routed.requested, routed.answer_index,
                                  step.batch)
        if step.pooled is not None:
          # That was this owner's part of every sample of the global
          # batch: this replica's samples are every owner's parts summed.
          out = routing.sum_partials(self.comm, out, step.pooled)
        outputs = [out] if len(features) == 1 else tf.split(
            out, [tf.size(f.row_splits) - 1 for f in features])
      for f, o in zip(features, outputs):
        o.set_shape([f.row_splits.shape[0] - 1 if f.row_splits.shape[0] else None,
                     group.width])
      return outputs
    rows = group.lookup_local(step.replica, routed.requested, routed.counts, training)
    answered = routing.answer_requesters(self.comm, rows, routed)
    if group_step.renormalizes(features):
      # On the requester, which keeps the rows as stored for the backward.
      per_id = tf.concat([
          tf.fill([tf.size(f.ids)], f.table.config.max_norm or float("inf"))
          for f in features], 0)
      step.row_max_norm = tf.math.unsorted_segment_max(
          per_id, routed.answer_index, tf.shape(answered)[0])
      step.raw_rows = answered
      answered = ops.renormalize_rows(answered, step.row_max_norm)
    step.rows = answered
    sizes = [tf.size(f.ids) for f in features]
    indices = (tf.split(routed.answer_index, sizes) if len(features) > 1
               else [routed.answer_index])
    return [ops.embedding_combine(answered, idx, f.row_splits, f.weights, c)
            for f, idx, c in zip(features, indices, step.combiners)]

  def _weights_gradients(self, step, grads, trained_weights):
    """d loss / d weights of the features in `trained_weights` (indices),
    from the rows each id was combined from (read again when fused)."""
    if not trained_weights:
      return []
    routed = step.routed
    sizes = [tf.size(f.ids) for f in step.features]
    if step.pooled is not None:
      # The owners summed the rows; each id's own row comes from its owner
      # now, in id order (this exchange only where weights are trained).
      per_id = routing.rows_to_requesters(
          self.comm, step.group.lookup_local(step.replica, step.pooled.requested, None,
                                             False), step.pooled)
      rows_of = tf.split(per_id, sizes) if len(sizes) > 1 else [per_id]
    else:
      rows = step.rows
      if rows is None:  # fused: the forward wrote no rows
        rows = step.group.lookup_local(step.replica, routed.requested, routed.counts,
                                       False)
      indices = (tf.split(routed.answer_index, sizes) if len(sizes) > 1
                 else [routed.answer_index])
      rows_of = {i: tf.gather(rows, indices[i]) for i in trained_weights}
    out = []
    for i in trained_weights:
      f = step.features[i]
      out.append(ops.combine_weights_grad(
          grads[i], rows_of[i], f.row_splits, f.weights,
          step.outputs[i], step.combiners[i]))
    return out

  def _backward(self, steps, output_grads, trigger_value, variables, trained_weights):
    """Gradients of the rows read, to their owners, summed per row; then
    one optimizer step per table (or IndexedSlices, SOK style). One entry
    per group in `steps`, `output_grads` and `trained_weights`."""
    steps = [group_step.deduped(step) for step in steps]
    grads = [[tf.zeros_like(out) if g is None else g
              for out, g in zip(step.outputs, step_grads)]
             for step, step_grads in zip(steps, output_grads)]
    weights_grads, previous = [], []
    for step, g, trained in zip(steps, grads, trained_weights):
      # In group order, as the gradients' exchanges below: the pooled
      # exchange sends each id's row back for them.
      with tf.control_dependencies(previous):
        group_grads = self._weights_gradients(step, g, trained)
      weights_grads += group_grads
      previous = group_grads or previous
    # The weights' gradients read the rows as the forward combined them,
    # so before this step's update.
    with tf.control_dependencies(weights_grads):
      trigger_grad, variables_grads = self._rows_backward(steps, grads, trigger_value,
                                                          variables)
    return [trigger_grad] + weights_grads, variables_grads

  def exchange_gradients(self, step, grads):
    """(rows this replica owns, their gradients summed over every replica),
    through the replicas' exchange (`TableGroup.backward_gradients`)."""
    group = step.group
    output_grad = grads[0] if len(grads) == 1 else tf.concat(grads, 0)
    if step.pooled is not None:
      # The gradient of an owner's partial sums is the global batch's
      # output gradient: from there its step is one owner's.
      output_grad = routing.output_gradients_to_owners(self.comm, output_grad, step.pooled)
    splits, weights, combiner = step.batch
    every_copy = group.replicated and self.comm.num_replicas > 1
    if step.fused and self.train_in_backward and not every_copy:
      return step.routed.requested, ops.gradients_for_update(
          output_grad, step.routed.answer_index, splits, weights, step.num_rows, combiner,
          device=group.device(step.replica))
    # One gradient row per answered row, so already grouped by owner.
    answer_grad = ops.embedding_combine_grad(output_grad, step.routed.answer_index,
                                             splits, weights, step.num_rows, combiner)
    if step.raw_rows is not None:
      answer_grad = ops.renormalize_rows_grad(step.raw_rows, answer_grad,
                                              step.row_max_norm)
    return group.owned_gradients(self.comm, answer_grad, step.routed,
                                 group.device(step.replica),
                                 for_update=self.train_in_backward)

  def _rows_backward(self, steps, grads, trigger_value, variables):
    owned, previous = [], []
    for step, g in zip(steps, grads):
      # One group's exchanges at a time, in the same order on every
      # replica: exchanges left free to run together would each hold an
      # executor thread while they wait for their peers.
      with tf.control_dependencies(previous):
        rows, summed = step.group.backward_gradients(self, step, g)
      owned.append((rows, summed))
      previous = [rows] + group_step.tensors_of(summed)
    if self.train_in_backward:
      with tf.control_dependencies(previous):
        finite = self._finite_by_table(steps, grads)
      # A table that refuses a non-finite step refuses it for the whole
      # step: every table's check runs before any table of any group is
      # updated (each table's own guard alone would let the others train).
      refusals = [c for step in steps for t in step.group.tables
                  for c in t.nonfinite_checks(step.replica, finite[t.name])]
      applied = []
      with tf.control_dependencies(refusals):
        # As data too: a control edge into a tf.cond (a skipping table's
        # guard) does not hold back the ops of its branches.
        finite = {name: tf.identity(flag) for name, flag in finite.items()}
        for step, (rows, summed) in zip(steps, owned):
          applied += step.group.apply_gradient(
              step.replica, tf.identity(rows), group_step.map_tensors(tf.identity, summed),
              finite)
      # Zero, but computed from the updates' results (new steps), so
      # whatever consumes the trigger's gradient runs them. Not zeros times
      # them: Grappler rewrites that as zeros, and Keras fit on TF 2.16 (a
      # step function inside another) then ran no update at all.
      done = tf.add_n([tf.cast(u, trigger_value.dtype) for u in applied])
      return tf.zeros_like(trigger_value) + ops.zero_from(done), [None] * len(variables)
    slices = {}
    for step, (rows, summed) in zip(steps, owned):
      slices.update(step.group.gradient_slices(step.replica, rows, summed))
    return tf.zeros_like(trigger_value), [slices.get(id(v)) for v in variables]

  def _finite_by_table(self, steps, output_grads):
    """table name -> whether every replica's gradients for the table's rows
    are finite this step (its features' output gradients and weights), for
    the tables of every group in one exchange. One flag for all replicas,
    so a table is updated everywhere or nowhere."""
    names, flags = [], []
    for step, grads in zip(steps, output_grads):
      for table in step.group.tables:
        name = table.name
        parts = [tf.reduce_all(tf.math.is_finite(g)) for f, g in
                 zip(step.features, grads) if f.table.name == name]
        parts += [tf.reduce_all(tf.math.is_finite(f.weights)) for f in step.features
                  if f.table.name == name and f.weights is not None]
        names.append(name)
        flags.append(tf.reduce_all(tf.stack(parts)) if parts else tf.constant(True))
    every = self.comm.gather_flags(tf.cast(tf.stack(flags), tf.int32))
    finite = tf.equal(tf.reduce_min(every, axis=0), 1)
    return {name: finite[i] for i, name in enumerate(names)}

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
