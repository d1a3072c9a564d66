"""Whole tables in TF1 savers (`tf.compat.v1.train.Saver`, the estimator's
and `MonitoredTrainingSession`'s checkpoints).

>>> import tensorflow as tf, tfde
>>> with tf.Graph().as_default():
...   table = tfde.tables.make_table(
...       tfde.TableConfig(name="t", vocabulary_size=6, embedding_dim=2))
...   saveables = tf.compat.v1.get_collection(
...       tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
>>> [s.name for s in saveables]
['tfde_tables/t']

A table made while a TF1 graph is being built (an estimator's `model_fn`,
a graph for `tf.compat.v1.Session`) adds one saveable to the graph's
SAVEABLE_OBJECTS collection: its whole-table `state()` (rows, slots, step;
a dynamic table's ids, counts and pending ids too) under
`tfde_tables/<table>/<key>`. Every default `Saver` (the estimator's,
`MonitoredTrainingSession`'s `CheckpointSaverHook`'s) saves and restores
it, so a dynamic table, which is not a variable, is in the checkpoint.

In one process its per-replica variables stay in GLOBAL_VARIABLES, so
`global_variables_initializer()` initializes them, and a default `Saver`
saves them too; their names hold the replica count
(`<table>/shard_0_of_2`), so such a checkpoint restores onto the same
count only. `saver()` leaves them out: its checkpoints hold whole tables
only and restore onto any replica count (pass it as the `Scaffold`'s
saver; a table's non-finite skip counts and a dynamic table's record of
evictions for `changes_since` deltas then restart empty).

Under Horovod (shards in other processes) saving is a collective: every
rank must save. The per-rank variables are then rank-local
(`_keep_rank_local`): out of GLOBAL_VARIABLES, so Horovod's broadcast of
the global variables leaves them alone, and initialized by
`local_variables_initializer()`; the default Saver holds whole tables only.
"""

import contextlib

import tensorflow as tf

from tfde import tf_internals
from tfde.comm.base import in_tf1_graph

PREFIX = "tfde_tables/"
COLLECTION = "tfde_table_variables"
RANK_LOCAL = "tfde_rank_local_variables"


class WholeTableSaveable(tf_internals.SaveableObject):
  """A table's whole state as one SaveableObject (one spec per key)."""

  def __init__(self, table, initialize_rest=False):
    self.table = table
    self.initialize_rest = initialize_rest
    name = f"{PREFIX}{table.name}/"
    # A graph's collections are exported by name (a SavedModel's MetaGraph),
    # and loading looks each name up: name the saveable after an op.
    marker = tf.no_op(name=f"{PREFIX}{table.name}")
    state = table.state()
    self._keys = list(state)
    # Rows and slots are [rows, dim] (a row-wise optimizer's slots [rows,
    # 1]); a dynamic table's row count is known only when it runs.
    self._shapes = {k: v.shape.merge_with([None, table.state_width(k)])
                    if v.shape.rank == 2 else v.shape for k, v in state.items()}
    specs = [tf_internals.SaveSpec(v, "", name + k) for k, v in state.items()]
    super().__init__(table, specs, marker.name)

  def restore(self, restored_tensors, restored_shapes):
    del restored_shapes
    state = {}
    for key, tensor in zip(self._keys, restored_tensors):
      # A restored tensor's shape is unknown; the saved one's rank and known
      # dims let the table's checks run (a mismatch fails at run time).
      tensor = tf.identity(tensor)
      tensor.set_shape(self._shapes[key])
      state[key] = tensor
    load = self.table.load_state(state)
    if not self.initialize_rest:
      return load
    # A whole-table saver does not hold the variables outside the state
    # (non-finite skip counters, a dynamic table's [0, dim] gradient
    # stand-in): they start afresh.
    with tf.control_dependencies([load]):
      return tf.group([_initialize_if_needed(v) for v in self.table.variables])


def _initialize_if_needed(variable):
  return tf.cond(variable.is_initialized(), tf.no_op,
                 lambda: tf.group(variable.assign(variable.initial_value)))


def register(table):
  """Adds `table`'s whole-table saveable to the graph being built (TF1
  graphs only; eagerly, `tf.train.Checkpoint` saves tables as they are)."""
  if not in_tf1_graph():
    return table
  graph = tf.compat.v1.get_default_graph()
  # What the table made that savers would hold per replica: its variables,
  # and saveables of its own (a dynamic table's evicted-at hash maps).
  members = {id(v) for v in vars(table).values()}
  members |= {id(x) for v in vars(table).values() if isinstance(v, dict)
              for x in v.values()}
  for saveable in graph.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS):
    # (A lookup table's saveable has the table as its `op`.)
    if id(saveable) in members or id(getattr(saveable, "op", None)) in members:
      graph.add_to_collection(COLLECTION, saveable)
  graph.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS,
                          WholeTableSaveable(table))
  for variable in table.variables:
    graph.add_to_collection(COLLECTION, variable)
  if len(table.comm.local_replicas()) < table.comm.num_replicas:
    _keep_rank_local(graph, table)
  return table


def _keep_rank_local(graph, table):
  """When other processes hold some of the shards (Horovod ranks), the
  table's per-rank variables and saveables are rank-local state, which
  Horovod keeps out of GLOBAL_VARIABLES (as its own local gradient
  counters): `hvd.broadcast_global_variables` and
  `BroadcastGlobalVariablesHook` then leave them alone (their names differ
  per rank, and rank 0's rows are not rank 1's), and the default Saver
  holds whole tables only, so its checkpoints restore onto any rank count.

  One local variable per table (`tfde_table_ready/<table>`) initializes
  them where they are not yet: `local_variables_initializer()`, which
  estimators and `MonitoredTrainingSession` run after a restore (a
  restored table is kept) and a plain session runs beside
  `global_variables_initializer()`."""
  for variable in table.variables:
    graph.add_to_collection(RANK_LOCAL, variable)
  mine = {id(v) for v in table.variables}
  rank_local = mine | {id(x) for x in graph.get_collection(COLLECTION)}
  for key in (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
              tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS):
    kept = graph.get_collection_ref(key)
    kept[:] = [x for x in kept if id(x) not in rank_local]
  initialize = tf.group([_initialize_if_needed(v) for v in table.variables])
  with tf.control_dependencies([initialize]):
    ready = tf.constant(1, tf.int64)
  tf.compat.v1.Variable(ready, name=f"tfde_table_ready/{table.name}", trainable=False,
                        use_resource=True,
                        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])


@contextlib.contextmanager
def custom_gradients_see_rank_local_variables():
  """In a TF1 graph, `tf.custom_gradient` finds the variables its function
  reads by name in GLOBAL_VARIABLES, and refuses a function reading others:
  the rank-local variables (`_keep_rank_local`) join that collection while
  a lookup builds its gradient, and leave it again. Elsewhere a no-op."""
  if not in_tf1_graph():
    yield
    return
  graph = tf.compat.v1.get_default_graph()
  hidden = graph.get_collection(RANK_LOCAL)
  global_variables = graph.get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
  global_variables.extend(hidden)
  try:
    yield
  finally:
    ids = {id(v) for v in hidden}
    global_variables[:] = [v for v in global_variables if id(v) not in ids]


def saver(**kwargs):
  """A `tf.compat.v1.train.Saver` over the graph's global variables and
  saveables, less the tables' per-replica variables: whole tables only, so
  its checkpoints restore onto any replica count. `kwargs` go to the Saver
  (`var_list` is computed here)."""
  graph = tf.compat.v1.get_default_graph()
  mine = {id(v) for v in graph.get_collection(COLLECTION)}
  var_list = [v for v in tf.compat.v1.global_variables() if id(v) not in mine]
  for saveable in graph.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS):
    if id(saveable) in mine:
      continue
    if isinstance(saveable, WholeTableSaveable):
      saveable = WholeTableSaveable(saveable.table, initialize_rest=True)
    var_list.append(saveable)
  kwargs.setdefault("sharded", True)
  kwargs.setdefault("allow_empty", True)
  return tf.compat.v1.train.Saver(var_list=var_list, **kwargs)
