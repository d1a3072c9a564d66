"""The table contract: what every kind of table does for the pipeline, the
savers and the doors.

>>> import tfde
>>> config = tfde.TableConfig(name="items", vocabulary_size=10,
...                           embedding_dim=4, optimizer="adagrad")
>>> table = tfde.tables.ShardedTable(config)
>>> sorted(table.state())
['slot_accumulator', 'step', 'table']
>>> tfde.tables.owner_of(table.local_variables()[0]) == (table, 0)
True

A table kind (static sharded, replicated, dynamic; engines to come) is one
class implementing this contract:

- routing: `routes_ids` (True: ids travel to their owner `id % N` as keys;
  False: as local rows `id // N`) and `num_shards`;
- local compute: `lookup_local(replica, requested, counts, training)`,
  the rows of the ids or rows routed to one of this process's replicas;
- apply: `apply_gradient(replica, rows, grads, ...)`, one optimizer step
  on the rows a step touched;
- explicit gradients (SOK style): `gradient_variable(replica)` and
  `gradient_slices(replica, rows, grads)`;
- whole-table state: `state()` and `load_state(state)` (a kind implements
  `_load_state`; `load_state` wraps it), tensors of the whole table (rows,
  each optimizer slot as `slot_<name>`, the step, and kind-specific fields) independent of the replica count. Checkpoints,
  Keras saving, warm starts, resharding and serving go through them, so a
  new field is written once, in the table kind;
- changes since a mark (delta checkpoints and exports): `mark()`, then
  `changes_since(mark)`, the rows updated since (with their slots and
  counters) and, for dynamic tables, the ids evicted since, by global id, so
  independent of the replica count; `apply_changes(changes)` writes them
  back (onto any replica count).

Ownership lives on the variables: each variable a table hands out
(`local_variables()`) names its table and replica (`tfde.tables.owner_of`), so
nothing outside the table keeps it alive or looks it up.
"""

import contextlib
import dataclasses
import random
import threading
import zlib

import numpy as np
import tensorflow as tf

from tfde import comm as comm_lib
from tfde import ops
from tfde import optimizers
from tfde import tf_internals
from tfde.ops import checks
from tfde.tables import restore_checks
from tfde.tables import tpu as tpu_tables

SLOT_PREFIX = "slot_"
# The key of the global ids of a delta's rows (`Table.changes_since`).
CHANGED_IDS = "ids"


@dataclasses.dataclass(frozen=True)
class ChangeMark:
  """Where a table stood when a delta's consumer last took it in.

  Attributes:
    lineage: a number drawn afresh whenever the table's contents are
      replaced wholesale (built, `load_state`, `apply_changes`): changes are
      only known relative to the same lineage.
    step: the table's optimizer step at the mark; rows updated by a later
      step are the changes since.
  """

  lineage: int
  step: int

  def to_config(self):
    return {"lineage": self.lineage, "step": self.step}

  @classmethod
  def from_config(cls, config):
    return cls(int(config["lineage"]), int(config["step"]))


_LEFT_OUT = threading.local()


@contextlib.contextmanager
def tables_left_out():
  """Within it, checkpoints write and restore no table tensors: the rest
  of a model, for a delta link whose tables are saved as changes."""
  # Nested uses keep the outer one's setting when they end.
  previous = _tables_left_out()
  _LEFT_OUT.active = True
  try:
    yield
  finally:
    _LEFT_OUT.active = previous


def _tables_left_out():
  return getattr(_LEFT_OUT, "active", False)


def _new_lineage():
  return random.SystemRandom().getrandbits(62)


def state_checksum(state):
  """CRC-32 of a state's keys and arrays (dict of numpy arrays), for files
  that carry no checksum of their own (HDF5 weight files)."""
  crc = 0
  for key in sorted(state):
    crc = zlib.crc32(key.encode(), crc)
    crc = zlib.crc32(np.ascontiguousarray(state[key]), crc)
  return crc


def check_slot_layout(table, optimizer):
  """Raises ValueError when `table`'s kind cannot keep `optimizer`'s slots
  (a row-wise optimizer's one value per row needs whole rows) or clip its
  rows' gradients by their whole norm."""
  why = table.row_wise_slots_refused
  if optimizer.slot_width is not None and why:
    raise ValueError(f"table {table.name!r}: {optimizer.kind!r} keeps one slot value "
                     f"per row, and {why}")
  why = table.row_norms_refused
  if optimizer.clipnorm is not None and why:
    raise ValueError(f"table {table.name!r}: clipnorm clips each row's whole "
                     f"gradient, and {why}")


def check_switch(table, optimizer):
  """Raises ValueError naming the table when it cannot train with
  `optimizer` from now on (changes nothing): slots it cannot keep, or
  another kind's after it has trained."""
  check_slot_layout(table, optimizer)
  if optimizer.kind != table.optimizer.kind and any(
      int(step.numpy()) for step in table.steps.values()):
    raise ValueError(f"table {table.name!r} has been trained with "
                     f"{table.optimizer.kind!r}; it cannot switch to "
                     f"{optimizer.kind!r}")


def switches_optimizer(table, optimizer):
  """True when `optimizer` is of another kind than the table's (new slots
  needed), which only an untrained table allows; else adopts it as is."""
  check_switch(table, optimizer)
  if optimizer.kind == table.optimizer.kind:
    table.optimizer = optimizer
    return False
  return True


class Table(tf.Module):
  """Base class of the table kinds (see the module doc).

  Attributes:
    config: the table's `TableConfig`.
    comm: the communicator of the strategy it was built under.
    num_shards: replicas its rows are spread over (1 when replicated).
    optimizer: its sparse optimizer (`tfde.optimizers`).
    steps: replica -> int64 step variable (optimizer steps applied).
  """

  # Why this kind cannot keep a row-wise optimizer's [rows, 1] slots, or
  # take a row's gradient norm over all its columns (clipnorm) (None: it
  # can).
  row_wise_slots_refused = None
  row_norms_refused = None

  def update_optimizer(self, optimizer=None):
    """The optimizer an update given `optimizer` applies (None: the
    table's); a ValueError naming the table, before anything changes, when
    its kind is not the one whose slots the table keeps."""
    optimizer = optimizer or self.optimizer
    if optimizer.kind != self.optimizer.kind:
      raise ValueError(f"table {self.name!r} keeps slots for "
                       f"{self.optimizer.kind!r}, not {optimizer.kind!r}")
    # An optimizer handed to an update (explicit training) is held to what
    # the table's kind can apply, as a configured one is.
    check_slot_layout(self, optimizer)
    return optimizer

  is_dynamic = False
  replicated = False
  routes_ids = False

  def __init__(self, config, communicator=None):
    super().__init__(name=config.name)
    self.config = config
    self.comm = communicator or comm_lib.current()
    tpu_tables.refuse_outside_engine(config, self.comm)
    self.optimizer = optimizers.get(config.optimizer, config.name)
    self.steps = {}
    self.skips = {}
    self.lineage = _new_lineage()

  @property
  def name(self):
    return self.config.name

  @property
  def embedding_dim(self):
    return self.config.embedding_dim

  @property
  def vocabulary_size(self):
    return self.config.vocabulary_size

  def _new_step_variable(self, replica, suffix):
    device = self.comm.replica_device(replica)
    self.steps[replica] = comm_lib.local_variable(
        tf.constant(0, tf.int64), f"{self.name}/{suffix}/step", device=device)
    self.skips[replica] = comm_lib.local_variable(
        tf.constant(0, tf.int64), f"{self.name}/{suffix}/nonfinite_skips",
        device=device)

  def guard_nonfinite(self, replica, finite, apply):
    """Runs `apply()` (an update returning the new step) when `finite` (a
    scalar bool, the same on every replica) holds. Otherwise, as
    `config.nonfinite` says: an error naming the table and step before
    anything is written, or the update skipped and counted (returning the
    unchanged step)."""
    if finite is None:
      return apply()
    if self.config.nonfinite == "skip":
      def skip():
        with tf.control_dependencies([self.skips[replica].assign_add(1)]):
          return tf.identity(self.steps[replica].read_value())
      return tf.cond(finite, apply, skip)
    with tf.control_dependencies(self.nonfinite_checks(replica, finite)):
      return apply()

  def advance_step_without_rows(self, replica, rows, grads, optimizer=None, finite=None):
    """The update on a replica that holds none of this table's rows (the
    table-wise kinds'): the optimizer checked as the holders check it, and
    the step advanced, as every replica's must be. The increment is read
    from the exchanged `rows` and `grads` (`tfde.ops.one_read_from`): under
    Horovod a control edge alone would let Grappler drop the exchange."""
    self.update_optimizer(optimizer)

    def apply():
      return self.steps[replica].assign_add(ops.one_read_from([rows, grads]))

    with tf.device(self.comm.replica_device(replica)):
      return self.guard_nonfinite(replica, finite, apply)

  def nonfinite_checks(self, replica, finite):
    """[] for a table that skips non-finite updates, else [an assertion
    that `finite` holds, naming the table and step]: the pipeline runs it
    before any table of the step is updated."""
    if finite is None or self.config.nonfinite == "skip":
      return []
    return [checks.assert_that(
        finite, f"table {self.name}: the gradient of step ",
        tf.convert_to_tensor(self.steps[replica]) + 1,
        " holds NaN or Inf; no row or slot of it (nor of any other table "
        "in the step) was updated "
        "(TableConfig(nonfinite='skip') skips such updates instead)")]

  def skipped_updates(self):
    """Updates skipped for non-finite gradients (eager; nonfinite='skip'),
    plus, for bfloat16/float16 rows, updates that saturated a row value
    beyond the row type's range (counted by the shard holding the row; the
    largest count of this process's shards)."""
    return max(int(s.numpy()) for s in self.skips.values())

  # ---- ownership

  def _own(self, variable, replica):
    # A strong reference: a variable handed out (sok.Variable) keeps its
    # table alive, and the cycle goes with the last outside reference.
    setattr(variable, optimizers.OWNER_ATTRIBUTE, (self, replica))
    return variable


  # ---- the pipeline's side

  # Whether the lookup hands this table's features to its engine as given
  # (`tfde.inputs.flat_feature`), not as flat checked ids: an engine's
  # tables (`tpu.TPUTable`).
  takes_inputs_as_given = False

  def check_ids(self, ids, feature_name):
    """`ids` (int64) of a feature, checked as this table takes them: an
    error naming the feature and table for one it cannot hold."""
    return ops.check_id_range(ids, self.vocabulary_size,
                              checks.describe_feature(feature_name, self.name))

  def refuses_ids(self, ids):
    """A bool scalar: whether `check_ids` refuses `ids`, without raising
    (so that every worker learns of it before any raises); None for a
    table that refuses no id."""
    ids = tf.convert_to_tensor(ids, tf.int64)
    return tf.reduce_any((ids < 0) | (ids >= self.vocabulary_size))

  def lookup_local(self, replica, requested, counts, training):
    """[k, dim] rows of `requested` (local rows, or ids when `routes_ids`),
    routed to `replica`; `counts` are their sightings in this batch (for
    tables that count them)."""
    raise NotImplementedError

  def apply_gradient(self, replica, rows, grads, optimizer=None, grad_rows=None,
                     finite=None):
    """One optimizer step on `rows` (unique) of `replica`'s shard:
    grads[k] (or grads[grad_rows[k]]) is row k's gradient, a matrix or a
    `tfde.ops.BagGradients`; `finite` (optional scalar bool) says whether
    the step's gradients are finite (see `guard_nonfinite`). Returns the
    new step as a tensor that exists only once the update has run: callers
    make their results depend on it as data, which no graph rewrite can
    drop."""
    raise NotImplementedError

  def gradient_variable(self, replica):
    """The variable explicit (SOK-style) gradients are taken against."""
    raise NotImplementedError

  def gradient_slices(self, replica, rows, grads):
    """`grads` of `rows` as the `tf.IndexedSlices` gradient of
    `gradient_variable(replica)`."""
    variable = self.gradient_variable(replica)
    return tf.IndexedSlices(grads, rows, tf.shape(variable, out_type=tf.int64))

  def local_variables(self):
    """This process's gradient variables, in replica order (SOK's local
    embedding variables)."""
    return [self.gradient_variable(r) for r in sorted(self.steps)]

  def use_optimizer(self, optimizer):
    """Trains with `optimizer` from now on; another kind (other slots) only
    before the first update (SOK's wrappers choose at first use)."""
    raise NotImplementedError

  # ---- whole-table state

  def state_keys(self):
    """The keys of `state()`."""
    return (["table"] + [SLOT_PREFIX + s for s in self.optimizer.slot_names] +
            ["step"])

  def state_width(self, key):
    """The columns of state key `key` (not "step"): a row's, or 1 for the
    slots of a row-wise optimizer (`tfde.optimizers.RowwiseAdagrad`)."""
    if key.startswith(SLOT_PREFIX) and self.optimizer.slot_width is not None:
      return self.optimizer.slot_width
    return self.embedding_dim

  def state_dtype(self, key):
    """The type state key `key` is kept in: rows in the table's type,
    slots in float32."""
    return self.config.dtype if key == "table" else tf.float32

  def state(self, keys=None):
    """dict of key -> tensor: the whole table, whatever the replica count
    (a collective when shards live in other processes); `keys` limits it to
    some of `state_keys()`. TF ops only, so it may be traced."""
    raise NotImplementedError

  def check_state(self, state, source="checkpoint"):
    """Raises ValueError naming the table when `state` (dict of arrays or
    tensors, from a "checkpoint" or "saved" weights) cannot be loaded;
    changes nothing."""
    missing = sorted(set(self.state_keys()) - set(state))
    if missing:
      raise ValueError(f"table {self.name!r}: the {source} lacks {missing} "
                       f"(was it of another table kind, or trained with another "
                       f"optimizer than {self.optimizer.kind!r}?)")
    self._check_shape(state, "step", (), source)

  def _check_shape(self, state, key, expected, source):
    shape = tuple(state[key].shape)
    fits = len(shape) == len(expected) and all(
        e is None or s == e for s, e in zip(shape, expected))
    if fits:
      return
    if source == "checkpoint":
      raise ValueError(f"table {self.name!r}: the checkpoint's {key} has shape "
                       f"{shape}, the model's is {expected}")
    raise ValueError(f"table {self.name!r}: saved shape {shape} differs from "
                     f"the model's {expected} ({key})")

  def load_state(self, state, source="checkpoint"):
    """Replaces the whole table with `state` (see `state()`); returns the
    op (eagerly, it has run). Checks everything before writing anything
    (`source` names where the state came from in those errors)."""
    loaded = self._load_state(state, source)
    # A load gives the variables new buffers (an assign adopts the restored
    # tensor's), which the advice on the old ones does not cover.
    self.advise_memory()
    return loaded

  def _load_state(self, state, source):
    """The kind's `load_state`."""
    raise NotImplementedError

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    if "load_state" in cls.__dict__:
      raise TypeError(f"{cls.__name__} overrides load_state; a table kind implements "
                      "_load_state, which load_state wraps")

  def advise_memory(self):
    """Asks the OS for huge pages under this table's large CPU buffers (its
    rows and slots; `tfde.ops.advise_huge_pages`): `make_table` calls it
    once they exist, `load_state` after replacing them, `use_optimizer`
    after making new slots. Eagerly only: a TF1 graph's buffers exist only
    once its initializers run, and there a restore's op runs before the
    variables it leaves out are initialized (graph_saving). Returns the
    op's (advised, collapsed) bytes."""
    return ops.advise_huge_pages(self.variables if tf.executing_eagerly() else [])

  def step_value(self):
    """The number of optimizer steps applied (eager)."""
    return int(self.steps[min(self.steps)].numpy())

  # ---- changes since a mark (delta checkpoints and exports)
  #
  # Each kind records, as it trains, when each row last changed (static
  # tables: the step of its last update, per shard; dynamic tables: the
  # step each row was last seen, kept by the store, and the step each
  # evicted id left). A consumer (a `DeltaCheckpointManager`, an export
  # chain of `tfde.serving.export_delta`) takes marks under its own name and
  # says, with `forget_changes_before`, from which step on it will still
  # ask; the record keeps what the oldest consumer on record needs, so
  # consumers do not forget for one another. `drop_consumer` lets one go;
  # a dynamic table's record is bounded (`DynamicConfig.eviction_record_limit`)
  # so that a consumer that never returns cannot pin memory: its next
  # delta is then refused by name, asking for a full save or export.

  def mark(self, consumer=None):
    """The table's `ChangeMark` now (eager), taken for `consumer` (a name;
    None: the anonymous consumer)."""
    del consumer
    return ChangeMark(self.lineage, self.step_value())

  def _replaced(self):
    # The contents were replaced wholesale: no earlier mark describes them.
    self.lineage = _new_lineage()

  def forget_changes_before(self, step, consumer=None):
    """`consumer` will ask for no changes before `step`: the table may drop
    what it keeps only for such questions once no other consumer needs it
    (a dynamic table's evicted ids); that consumer's `changes_since` of an
    older mark is then refused by name. Nothing to drop here."""
    del step, consumer

  def drop_consumer(self, consumer):
    """`consumer` will ask for no more changes: what only it needed is
    dropped. Nothing to drop here."""
    del consumer

  def change_keys(self):
    """The keys of `changes_since`'s dict."""
    return [CHANGED_IDS] + self.state_keys()

  def changes_since(self, mark, consumer=None):
    """dict of numpy arrays: what changed since `mark` (eager; a collective
    when shards live in other processes). `ids` [k] (sorted global ids) and
    one [k, ...] array per row field of `state()` (rows, slots, counters)
    for the rows updated since, plus `step`; dynamic tables add the ids
    evicted since (`removed_ids`) and their pending ids whole. A superset of
    the changed rows may come back, never a subset. Raises ValueError
    naming the table when `mark` is of another lineage (the table was
    loaded or replaced since: only a full state describes it), or, for a
    dynamic table, when `consumer`'s mark is older than the record of
    evictions it kept (the error names the consumer)."""
    del consumer
    if mark is None or mark.lineage != self.lineage:
      raise ValueError(f"table {self.name!r} was built, loaded or replaced "
                       "after the mark: its changes since are unknown; save "
                       "it whole")
    return self._changes_since_step(mark.step)

  def _changes_since_step(self, step):
    # A static kind that keeps no record of its updates reports every row:
    # a superset, always correct, as large as a full save.
    del step
    if self.is_dynamic:
      raise NotImplementedError(f"table {self.name!r}: {type(self).__name__} "
                                "cannot report its changes")
    changes = {k: np.asarray(v.numpy(), np.float32) if k != "step" else v.numpy()
               for k, v in self.state().items()}
    changes[CHANGED_IDS] = np.arange(self.vocabulary_size, dtype=np.int64)
    return changes

  def check_changes(self, changes, source="delta"):
    """Raises ValueError naming the table when `changes` (from
    `changes_since`, maybe of another replica count) cannot be applied."""
    missing = sorted(set(self.change_keys()) - set(changes))
    if missing:
      raise ValueError(f"table {self.name!r}: the {source} lacks {missing}")
    self._check_shape(changes, "step", (), "checkpoint")
    rows = changes[CHANGED_IDS].shape[0]
    self._check_shape(changes, CHANGED_IDS, (rows,), "checkpoint")
    for key in self.state_keys():
      if key == "table" or key.startswith(SLOT_PREFIX):
        self._check_shape(changes, key, (rows, self.state_width(key)), "checkpoint")

  def apply_changes(self, changes):
    """Writes `changes` (see `changes_since`) into the table: afterwards it
    holds what the table they were taken from held at their step, given
    that it held that table's state at the mark they were taken since.
    Checks everything first; eager."""
    # Through the whole state, for kinds without a cheaper way.
    self.check_changes(changes)
    state = {k: v.numpy() for k, v in self.state().items()}
    ids = np.asarray(changes[CHANGED_IDS], np.int64)
    for key in self.state_keys():
      if key != "step":
        state[key] = np.array(state[key])
        state[key][ids] = np.asarray(changes[key]).astype(state[key].dtype)
    state["step"] = np.asarray(changes["step"])
    self.load_state(state)
    self._replaced()

  # Checkpoints hold the whole-table state, so a checkpoint written with N
  # replicas restores with M.

  def _trackable_children(self, save_type="checkpoint", **kwargs):
    # Saved through _serialize_to_tensors; a SavedModel for serving holds
    # whole-table copies (tfde.serving).
    del save_type, kwargs
    if not _tables_left_out():
      restore_checks.check_during_traversal(self, tf_internals.checkpoint_traversed_by_caller())
    return {}

  def _serialize_to_tensors(self):
    return {} if _tables_left_out() else self.state()

  def _restore_from_tensors(self, restored_tensors):
    if _tables_left_out():
      return tf.no_op()
    # TensorFlow restores each table on its own, in turn: every table of
    # this restore is checked before the first writes anything, so that a
    # bad one (another shape, a corrupted export) leaves them all as they
    # were.
    check_tables_of_this_restore()
    return self.load_state(restored_tensors)


def check_tables_of_this_restore():
  """Runs `check_state` on every table that the eager `tf.train.Checkpoint`
  restore now running is about to restore, once per restore (nothing
  outside one).

  TensorFlow reads every tensor of a restore first (one RestoreV2 per
  task), then calls each object's `_restore_from_tensors` in turn with its
  own tensors only; no hook sees them all. They are read from the saver's
  frame (`tf_internals.restore_being_read`, TF 2.18 to 2.21).
  tests/unit/test_atomic_restore.py fails should a TensorFlow release move
  them, rather than let a restore load part of a checkpoint silently.
  """
  if not tf.executing_eagerly():
    return
  restore = tf_internals.restore_being_read()
  if restore is None:
    return
  saver, restored, owners = restore
  # A restore is known by the ids of its dict and of every tensor in it: a
  # freed dict's id alone can come back for a later restore, whose tables
  # would then go unchecked; holding the dicts would keep their tensors alive.
  signature = (id(restored),) + tuple(
      id(tensor) for by_slice in restored.values() for tensor in by_slice.values())
  checked = saver.__dict__.setdefault("_tfde_checked_restores", [])
  if signature in checked:
    return
  states = {}
  for key, by_slice in restored.items():
    for slice_spec, tensor in by_slice.items():
      table = _table_of(owners.get((key, slice_spec)))
      if table is not None and not slice_spec:
        local_name = key.rpartition("/.ATTRIBUTES/")[2]
        states.setdefault(id(table), (table, {}))[1][local_name] = tensor
  for table, state in states.values():
    table.check_state(state)
  checked.append(signature)
  del checked[:-4]


def _table_of(restore_fn):
  """The table a restore function of TensorFlow's saver restores, if any:
  the table's own method, or (through the legacy saveable path that
  tf.train.Checkpoint takes) a converter of the saveable of one."""
  for owner in tf_internals.restore_owner(restore_fn):
    if isinstance(owner, Table):
      return owner
  return None
