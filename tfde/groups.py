"""Table groups: the tables that travel together through one exchange per
step, and what the pipeline asks of them.

>>> import tfde
>>> a = tfde.TableConfig(name="a", vocabulary_size=10, embedding_dim=4)
>>> b = tfde.TableConfig(name="b", vocabulary_size=7, embedding_dim=4)
>>> tables = {c.name: tfde.tables.make_table(c, auto_replicate_bytes=0)
...           for c in (a, b)}
>>> [[t.name for t in g.tables] for g in make_groups(tables, "auto", 1)]
[['a', 'b']]

Static tables of one width and placement share a fused row space
(`sharding.FusedGroupLayout`): one unique, one exchange, one gather for
all of them. A dynamic table is a group of its own, its ids routed as
keys with their sighting counts. A group is storage: the exchanges
(`tfde.pipeline.exchanges`) call the same methods on both, and each group
delegates to its tables' contract (`tfde.tables.base.Table`); no group
calls back into the pipeline.
"""

import collections

import tensorflow as tf

from tfde import ops
from tfde import routing
from tfde import sharding


class TableGroup:
  """Tables that share an exchange. Subclasses say how their ids fuse and
  how a replica serves and trains the rows routed to it.

  Attributes:
    tables: the member tables, in fused order.
    index: table name -> position in `tables`.
    width: the shared embedding width.
    replicated: every replica holds every row (data parallel).
    num_shards: replicas the rows are spread over (1 when replicated).
    routes_ids: ids travel as keys with their counts (dynamic tables),
      not as local rows.
    fuses_local: when one replica owns every row it reads, the outputs
      may be combined straight from the tables (`combine_local`) and the
      gradients applied from bags; at several owners, each owner applies
      the gradients it receives from bags too.
    row_space: where the requests routed to an owner are row numbers (a
      static group's fused local rows), the size of that row space (every
      owner's rows lie below it), else None (ids).
    pools_partials: at several owners, each owner may sum its rows of every
      sample into partial outputs, which the replicas add
      (`tfde.routing.route_bags_to_owners`), instead of sending rows back:
      every replica holds rows of every member table, and the outputs
      are combined from the tables (`fuses_local`).
  """

  fuses_local = False
  row_space = None
  pools_partials = False

  def __init__(self, tables, num_replicas):
    self.tables = tables
    self.index = {t.name: i for i, t in enumerate(tables)}
    self.width = tables[0].embedding_dim
    self.replicated = tables[0].replicated
    self.routes_ids = tables[0].routes_ids
    self.num_shards = 1 if self.replicated else num_replicas
    # A dynamic table-wise table's ids all go to its owner (static
    # table-wise tables fuse their owner into their ids instead).
    self.owner = getattr(tables[0], "owner", None) if self.routes_ids else None

  def step(self, replica):
    """The optimizer steps applied so far, the same on every replica (the
    stamp of this group's exchanges)."""
    return self.tables[0].steps[replica].read_value()

  def fused_ids(self, features):
    """One id vector for all `features` (FlatFeatures of member tables)."""
    raise NotImplementedError

  def lookup_local(self, replica, requested, counts, training):
    """Local compute: [k, width] rows of what was routed to `replica`."""
    raise NotImplementedError

  def apply_gradient(self, replica, owned, grads, finite):
    """One optimizer step per table on its rows among `owned`, guarded by
    `finite` (table name -> scalar bool); the steps."""
    raise NotImplementedError

  def gradient_variables(self, replica):
    return [t.gradient_variable(replica) for t in self.tables]

  def device(self, replica):
    """Where this group's rows on `replica` live (None: not known), so
    that the ops can pick kernels that exist there."""
    del replica
    return None

  def gradient_slices(self, replica, owned, grads):
    """id(gradient variable) -> its IndexedSlices gradient (SOK style)."""
    raise NotImplementedError


class StaticGroup(TableGroup):
  """Static tables of one width: ids offset into one fused row space.
  Row-wise tables, table-wise ones (each whole on its owner, column
  slices included) and table-row-wise ones (rows over a few owners) share
  it (`sharding.FusedGroupLayout`)."""

  fuses_local = True

  def __init__(self, tables, num_replicas):
    super().__init__(tables, num_replicas)
    owners = [getattr(t, "owner", None) for t in tables]
    self.layout = sharding.FusedGroupLayout(
        [t.vocabulary_size for t in tables], self.num_shards,
        owners=None if self.replicated or num_replicas == 1 else owners)
    # Reduced-precision rows are read with stock ops into float32 (the
    # kernels read float32 tables), so such groups do not fuse.
    self.reduced_precision = any(t.config.dtype != "float32" for t in tables)
    self.fuses_local = not self.reduced_precision
    self.row_space = self.layout.total_rows
    # Row-wise tables only: a table-wise table's owner alone holds its rows,
    # and every other replica would send zeros. The sample travels in the
    # id's high bits (`routing.sample_key_bits`).
    self.pools_partials = (
        self.fuses_local and self.num_shards > 1 and
        all(o is None for o in self.layout.owners) and
        routing.sample_key_bits(self.row_space, self.num_shards) is not None)

  def fused_ids(self, features):
    return tf.concat([self.layout.fused_ids(self.index[f.table.name], f.ids)
                      for f in features], 0)

  def _local_tables(self, replica):
    """The tables with rows on `replica`, and their local bases."""
    on = self.layout.tables_on(0 if self.num_shards == 1 else replica)
    return [self.tables[t] for t in on], self.layout.bases_on(
        0 if self.num_shards == 1 else replica)

  def lookup_local(self, replica, requested, counts, training):
    del counts, training
    tables, bases = self._local_tables(replica)
    if not tables:  # nothing of this group lives here: nothing is routed here
      return tf.zeros([tf.size(requested), self.width])
    shards = [t.shard(replica) for t in tables]
    if self.reduced_precision:
      return ops.gather_rows_float32(shards, requested, bases)
    return ops.gather_from_tables(shards, requested, bases)

  def combine_local(self, replica, requested, inverse, batch):
    """[samples, width] outputs of the group's features as one batch
    (`batch`: row splits, weights, combiner), read straight from the
    tables without gathering the rows first."""
    splits, weights, combiner = batch
    tables, bases = self._local_tables(replica)
    return ops.combine_from_tables([t.shard(replica) for t in tables], requested,
                                   bases, inverse, splits, weights, combiner)

  def combine_each_local(self, replica, features, combiners):
    """The outputs of `features` at a group of one shard, as `combine_local`
    of every id's row, but each feature read from its own table by its own
    ids: no fused ids, one batch or split of the outputs to make (the
    forward of one replica, which needs no dedup)."""
    if self.num_shards != 1:
      raise ValueError("combine_each_local reads whole tables: one shard only")
    # One shard: each table holds all its rows, so a feature's ids are its
    # table's local rows.
    tables = {t.name: t for t in self._local_tables(replica)[0]}
    return [ops.combine_from_tables(
        [tables[f.table.name].shard(replica)], f.ids, [0],
        ops.int32_range(tf.size(f.ids, out_type=tf.int64)), f.row_splits, f.weights, combiner)
            for f, combiner in zip(features, combiners)]

  def device(self, replica):
    # A replica holding none of the group's tables (table-wise layouts)
    # updates none, but still forms gradients where its tables would be;
    # a TF1 graph's variables may name no device.
    tables, _ = self._local_tables(replica)
    held = tables[0].shard(replica).device if tables else None
    return held or self.tables[0].comm.replica_device(replica)

  def _per_table(self, replica, owned):
    """Per table with rows on `replica`: (the table, its local rows, which
    gradient rows belong to them). Only the index vectors are split; the
    optimizers read gradients in place."""
    tables, bases = self._local_tables(replica)
    if not tables:
      return []
    if len(tables) == 1:
      return [(tables[0], owned, None)]
    return [(t,) + tuple(parts) for t, parts in zip(
        tables, ops.split_rows_by_table(owned, bases, device=self.device(replica)))]

  def apply_gradient(self, replica, owned, grads, finite):
    local = self._per_table(replica, owned)
    applied = [table.apply_gradient(replica, rows, grads, grad_rows=grad_rows,
                                    finite=finite[table.name])
               for table, rows, grad_rows in local]
    # Tables held elsewhere only advance their step here, after reading
    # what the exchange brought (none of their rows; see `_nothing_from`).
    held = {id(t) for t, _, _ in local}
    elsewhere = [t for t in self.tables if id(t) not in held]
    if elsewhere:
      rows, table_grads = self._nothing_from(owned, grads)
      applied += [table.apply_gradient(replica, rows, table_grads, finite=finite[table.name])
                  for table in elsewhere]
    return applied

  def _nothing_from(self, owned, grads):
    """Empty rows and gradients for a table held elsewhere, sized from the
    exchange's results: an update or a gradient that reads them keeps that
    exchange alive on this replica (`tfde.ops.one_read_from`)."""
    no_rows = ops.one_read_from([owned, grads]) - 1
    return tf.zeros([no_rows], owned.dtype), tf.zeros([no_rows, self.width])

  def gradient_slices(self, replica, owned, grads):
    slices = {}
    for table, rows, grad_rows in self._per_table(replica, owned):
      table_grads = grads if grad_rows is None else tf.gather(grads, grad_rows)
      slices[id(table.gradient_variable(replica))] = table.gradient_slices(
          replica, rows, table_grads)
    # A table held elsewhere gets an empty gradient here: applied, it
    # advances the table's step on this replica too.
    elsewhere = [t for t in self.tables if id(t.gradient_variable(replica)) not in slices]
    if elsewhere:
      rows, table_grads = self._nothing_from(owned, grads)
      slices.update({id(t.gradient_variable(replica)): t.gradient_slices(replica, rows, table_grads)
                     for t in elsewhere})
    return slices


class DynamicGroup(TableGroup):
  """One dynamic table: ids are keys, found or created by their owner."""

  def __init__(self, tables, num_replicas):
    if len(tables) != 1:
      raise ValueError(f"dynamic tables are looked up alone, got "
                       f"{[t.name for t in tables]}")
    super().__init__(tables, num_replicas)
    self.table = tables[0]

  def fused_ids(self, features):
    return tf.concat([f.ids for f in features], 0)

  def lookup_local(self, replica, requested, counts, training):
    return self.table.lookup_local(replica, requested, counts, training)

  def apply_gradient(self, replica, owned, grads, finite):
    return [self.table.apply_gradient(replica, owned, grads,
                                      finite=finite[self.table.name])]

  def gradient_slices(self, replica, owned, grads):
    return {id(self.table.gradient_variable(replica)):
            self.table.gradient_slices(replica, owned, grads)}


class EngineGroup(TableGroup):
  """Tables living in one embedding engine (TensorFlow's TPU embedding,
  `tfde.tables.tpu`), which looks them all up and trains them in one call:
  the engine exchanges their rows itself (its exchange,
  `tfde.pipeline.exchanges.engine`, is the engine's activations forward),
  and this group's update hands the engine the output gradients (zeros for
  a table whose step is not finite)."""

  def __init__(self, tables, num_replicas):
    super().__init__(tables, num_replicas)
    self.engine = tables[0].engine

  def fused_ids(self, features):
    return None

  def apply_gradient(self, replica, owned, grads, finite):
    del replica, owned
    names, tables, grads, preserved = grads
    preserved = preserved.value
    gradients = {name: tf.where(finite[table], grad, tf.zeros_like(grad))
                 for name, table, grad in zip(names, tables, grads)}
    return [self.engine.apply_gradients(gradients, preserved)]


def _stacking_key(table):
  if table.is_dynamic:
    return (table.embedding_dim, "dynamic", table.name)  # always alone
  key = (table.embedding_dim, "replicated" if table.replicated else "sharded", "")
  # Tables of reduced-precision rows go apart: float32 groups keep the kernels.
  return key if table.config.dtype == "float32" else key + (table.config.dtype,)


def stack_tables(tables, table_stacking):
  """Lists of tables that share an exchange: "auto" (same width and
  placement), None (each alone), or a list of lists of table names (tables
  left out go alone)."""
  if table_stacking == "auto":
    by_key = collections.defaultdict(list)
    for name in sorted(tables):
      by_key[_stacking_key(tables[name])].append(tables[name])
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
    if len({_stacking_key(t) for t in members}) > 1:
      raise ValueError(f"table_stacking group {list(names)} mixes widths, "
                       "placements or row dtypes; stacked tables must share them")
    groups.append(members)
  groups.extend([tables[n]] for n in sorted(set(tables) - seen))
  return groups


def make_groups(tables, table_stacking, num_replicas):
  """The groups of `tables` (name -> Table) under `table_stacking`. Tables
  living in an engine form one group per engine (which stacks them
  itself)."""
  by_engine, others = collections.defaultdict(list), {}
  for name in sorted(tables):
    engine = getattr(tables[name], "engine", None)
    if engine is None:
      others[name] = tables[name]
    else:
      by_engine[id(engine)].append(tables[name])
  engine_groups = [EngineGroup(members, num_replicas) for members in by_engine.values()]
  return engine_groups + [
      (DynamicGroup if members[0].is_dynamic else StaticGroup)(members, num_replicas)
      for members in stack_tables(others, table_stacking if others else None)]
