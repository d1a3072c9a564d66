"""Dynamic tables: no fixed vocabulary; a hash table per replica holding
the rows of the ids `id mod N` (floor) routes to it.

>>> import tensorflow as tf
>>> import tfde
>>> config = tfde.TableConfig(name="users", vocabulary_size=None,
...                           embedding_dim=4, optimizer="sgd",
...                           initializer="zeros")
>>> table = tfde.tables.DynamicTable(config)
>>> rows = table.lookup_local(0, tf.constant([2**40, -7], tf.int64),
...                           tf.constant([1, 1], tf.int64), training=True)
>>> table.size(), rows.shape
(2, TensorShape([2, 4]))
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tfde import comm as comm_lib
from tfde import initializers
from tfde import ops
from tfde import optimizers
from tfde.tables import base

# The whole-table state beyond rows, slots and step: per row its id,
# sighting count and last step seen; per pending id (not yet admitted) the
# same three.
ROW_FIELDS = ("ids", "counts", "last_seen")
PENDING_FIELDS = ("pending_ids", "pending_counts", "pending_last_seen")
# In `changes_since`: the ids evicted since the mark that hold no row now.
REMOVED_IDS = "removed_ids"


def dynamic_spec(config):
  """The kernel-level description of a dynamic table's shards."""
  kind, a, b = initializers.per_id(config.keras_initializer(), config.embedding_dim,
                                   config.name)
  optimizer = optimizers.get(config.optimizer, config.name)
  return ops.DynamicTableSpec(
      dim=config.embedding_dim,
      slot_initial_values=tuple(float(optimizer.slot_initial_value(s))
                                for s in optimizer.slot_names),
      initializer=kind, initializer_a=float(a), initializer_b=float(b),
      seed=config.seed, admit_after=config.dynamic.admit_after,
      zeros_until_admitted=config.dynamic.unadmitted_value == "zeros")


class DynamicTable(base.Table):
  """A table created row by row as ids are admitted, evicted by
  `config.dynamic`'s rules.

  Any int64 id is a key, negative and hashed 64-bit ones included. Rows
  start at the initializer drawn per (seed, id), so contents never depend
  on the replica count or on the order ids arrive in. Memory grows with
  the live rows (`memory_bytes()`), not with the id range. Its state holds
  the whole table (ids, rows, slots, sighting counts, pending ids), so it
  restores onto any number of replicas.
  """

  row_wise_slots_refused = "a dynamic table keeps each slot as wide as a row"

  is_dynamic = True
  routes_ids = True

  def __init__(self, config, communicator=None):
    if not config.is_dynamic:
      raise ValueError(f"table {config.name!r} has a vocabulary size; use "
                       "ShardedTable")
    super().__init__(config, communicator)
    self.num_shards = self.comm.num_replicas
    self.spec = dynamic_spec(config)
    self.stores = {}
    self.gradient_variables = {}
    self.evicted_at = {}
    self.evictions_recorded_from = {}
    self.evictions_trimmed_to = {}
    # consumer name -> the step from which it will still ask for changes
    # (`mark`, `forget_changes_before`); process-local, like the marks.
    self.consumers = {}
    for replica in self.comm.local_replicas():
      suffix = f"shard_{replica}_of_{self.num_shards}"
      if self.holds_rows(replica):
        self.stores[replica] = self._new_store(replica)
        # id -> the step it was evicted at, for `changes_since`; rows changed
        # since a step are known from the store's last_seen (every update
        # follows a training lookup of the row at the same step).
        with tf.device(self.comm.replica_device(replica)):
          self.evicted_at[replica] = tf.lookup.experimental.MutableHashTable(
              tf.int64, tf.int64, default_value=-1,
              name=f"{self.name}_{suffix}_evicted_at")
        # The step from which evictions are on record; -1 until the first
        # mark, so a table no one asks for its changes keeps no record (it
        # would grow by an entry per eviction).
        self.evictions_recorded_from[replica] = comm_lib.local_variable(
            tf.constant(-1, tf.int64), f"{self.name}/{suffix}/evictions_recorded_from",
            device=self.comm.replica_device(replica))
        # The step up to which the bound last dropped evictions (-1: never):
        # a consumer refused below it is told why.
        self.evictions_trimmed_to[replica] = comm_lib.local_variable(
            tf.constant(-1, tf.int64), f"{self.name}/{suffix}/evictions_trimmed_to",
            device=self.comm.replica_device(replica))
      self._new_step_variable(replica, suffix)
      # A [0, D] stand-in that gradients are taken with respect to when a
      # dynamic table is trained explicitly (SOK's DynamicVariable): its
      # gradient is tf.IndexedSlices whose indices are ids, not rows.
      self.gradient_variables[replica] = self._own(comm_lib.local_variable(
          tf.zeros([0, config.embedding_dim]), f"{config.name}/{suffix}/rows",
          trainable=True, device=self.comm.replica_device(replica)), replica)

  def _new_store(self, replica):
    return ops.dynamic_store(self.spec,
                             f"{self.name}_shard_{replica}_of_{self.num_shards}",
                             self.comm.replica_device(replica))

  def holds_rows(self, replica):
    """Whether `replica` keeps rows of this table (every replica does;
    a table-wise table's owner only)."""
    del replica
    return True

  def owned_mask(self, ids, replica):
    """Which of `ids` `replica` owns (`id mod N`)."""
    return tf.equal(tf.math.floormod(ids, self.num_shards), replica)

  def use_optimizer(self, optimizer):
    """Rows looked up so far keep their embeddings and get the new
    optimizer's initial slots."""
    if not base.switches_optimizer(self, optimizer):
      return
    rows = self._gathered()
    self.optimizer = optimizer
    self.config = dataclasses.replace(self.config, optimizer=optimizer)
    self.spec = dynamic_spec(self.config)
    for replica in list(self.stores):
      self.stores[replica] = self._new_store(replica)
    self.assign_rows(rows["ids"], rows["values"][:, 0], rows["counts"],
                     rows["last_seen"], rows["pending_ids"], rows["pending_counts"],
                     rows["pending_last_seen"])

  # ---- the pipeline's side

  def check_ids(self, ids, feature_name):
    del feature_name
    return ids  # any int64 id is a key

  def refuses_ids(self, ids):
    del ids
    return None

  def lookup_local(self, replica, requested, counts, training):
    """In training each id counts `counts[i]` sightings at the coming step,
    which may admit it (create its row); otherwise nothing changes."""
    return self.lookup_with_addresses(replica, requested, counts, training)[0]

  def lookup_with_addresses(self, replica, ids, counts, training):
    """lookup_local's rows, and the addresses of the ids' rows after it (-1
    for ids without a row), for `apply_gradient(..., by_address=True)`
    (mxRec's flow). Both come from one op, so the addresses see the rows
    this lookup created."""
    with tf.device(self.comm.replica_device(replica)):
      step = tf.convert_to_tensor(self.steps[replica]) + 1
      return self.stores[replica].lookup(ids, counts, step, insert=training)

  def apply_gradient(self, replica, rows, grads, optimizer=None, grad_rows=None,
                     by_address=False, finite=None):
    """`rows` are ids (or, `by_address`, row addresses); ids without a row
    are skipped. Eviction runs after the update when due."""
    optimizer = self.update_optimizer(optimizer)
    store = self.stores[replica]
    dynamic = self.config.dynamic

    def apply():
      # After the gradients exist, hence after this step's lookups read the
      # step (a TF1 graph orders nothing else).
      with tf.control_dependencies([rows, grads]):
        step = self.steps[replica].assign_add(1)
      with tf.control_dependencies([step]):
        applied = optimizer.apply_dynamic(store, rows, grads, step, grad_rows,
                                          by_address=by_address)
      done = [applied]
      if dynamic.evicts:
        def evict():
          ids = store.evict(step, dynamic.evict_after_steps or 0,
                            dynamic.max_rows_per_shard or 0)
          recording = self.evictions_recorded_from[replica].read_value() >= 0
          noted = tf.cond(
              recording,
              lambda: self.evicted_at[replica].insert(ids, tf.fill(tf.shape(ids), step)),
              tf.no_op)
          with tf.control_dependencies([noted]):
            bounded = self._bound_record(replica)
          with tf.control_dependencies([bounded]):
            return tf.size(ids, out_type=tf.int64)

        with tf.control_dependencies([applied]):
          evicted = tf.cond(tf.equal(step % dynamic.evict_every_steps, 0), evict,
                            lambda: tf.constant(0, tf.int64))
        done.append(evicted)
      with tf.control_dependencies(done):
        return step + ops.zero_from(tf.add_n(done))

    with tf.device(self.comm.replica_device(replica)):
      return self.guard_nonfinite(replica, finite, apply)

  def _bound_record(self, replica):
    """An op keeping `replica`'s record of evictions within
    `eviction_record_limit`: past it, the oldest steps' ids are dropped and
    the record starts after them."""
    record = self.evicted_at[replica]
    limit = self.config.dynamic.eviction_record_limit

    def trim():
      ids, steps = record.export()
      ids, steps = tf.reshape(ids, [-1]), tf.reshape(steps, [-1])
      cutoff = tf.sort(steps)[tf.size(steps, out_type=tf.int64) - limit]
      removed = record.remove(tf.boolean_mask(ids, steps <= cutoff))
      with tf.control_dependencies([removed]):
        recorded_from = self.evictions_recorded_from[replica]
        return tf.group(
            recorded_from.assign(tf.maximum(recorded_from.read_value(), cutoff)),
            self.evictions_trimmed_to[replica].assign(cutoff))

    return tf.cond(record.size() > limit, trim, tf.no_op)

  def gradient_variable(self, replica):
    return self.gradient_variables[replica]

  def gradient_slices(self, replica, rows, grads):
    # Indexed by id: the dense shape only has to hold any int64 id.
    return tf.IndexedSlices(grads, rows,
                            tf.constant([2**62, self.embedding_dim], tf.int64))

  # ---- whole-table state

  def _gathered(self, seen_after=None):
    """Every shard's export (with `seen_after`, only its rows last seen
    after that step), concatenated and sorted by id (a collective when
    shards live in other processes)."""
    fields = ("ids", "values", "counts", "last_seen") + PENDING_FIELDS
    parts = self.comm.concat_replica_values(
        {r: list(self.stores[r].export(seen_after)) if r in self.stores
            else self._no_rows()
         for r in self.comm.local_replicas()})
    whole = dict(zip(fields, parts))
    order = tf.argsort(whole["ids"], stable=True)
    pending_order = tf.argsort(whole["pending_ids"], stable=True)
    for field in fields:
      whole[field] = tf.gather(whole[field],
                               pending_order if field.startswith("pending") else order)
    return whole

  def _no_rows(self):
    """An empty export, for a replica that holds no rows."""
    empty = tf.zeros([0], tf.int64)
    values = tf.zeros([0, 1 + len(self.optimizer.slot_names), self.embedding_dim])
    return [empty, values, empty, empty, empty, empty, empty]

  def state_keys(self):
    return list(ROW_FIELDS) + super().state_keys() + list(PENDING_FIELDS)

  def state(self, keys=None):
    return self._state(keys)

  def _state(self, keys=None, seen_after=None):
    whole = self._gathered(seen_after)
    tensors = {"table": whole["values"][:, 0]}
    for k, slot in enumerate(self.optimizer.slot_names):
      tensors[base.SLOT_PREFIX + slot] = whole["values"][:, k + 1]
    for field in ROW_FIELDS + PENDING_FIELDS:
      tensors[field] = whole[field]
    tensors["step"] = tf.convert_to_tensor(self.steps[min(self.steps)])
    return {key: tensors[key] for key in keys or self.state_keys()}

  def check_state(self, state, source="checkpoint"):
    super().check_state(state, source)
    self._check_shape(state, "table", (None, self.embedding_dim), source)
    rows = state["table"].shape[0]
    for key in self.state_keys():
      if key.startswith(base.SLOT_PREFIX):
        self._check_shape(state, key, (rows, self.embedding_dim), source)
      elif key in ROW_FIELDS:
        self._check_shape(state, key, (rows,), source)
    pending = state["pending_ids"].shape[0]
    for key in PENDING_FIELDS:
      self._check_shape(state, key, (pending,), source)
    self._check_ids_once(state, source)

  def _check_ids_once(self, state, source):
    """An export lists each id once, as a row or pending, never both (the
    kernel refuses anything else, shard by shard: checked here first, so a
    bad state changes no shard). Values known now only (eager)."""
    ids, pending = state["ids"], state["pending_ids"]
    if not all(isinstance(x, np.ndarray) or hasattr(x, "numpy") for x in (ids, pending)):
      return
    both = np.concatenate([np.asarray(ids), np.asarray(pending)]).astype(np.int64)
    values, counts = np.unique(both, return_counts=True)
    if (counts > 1).any():
      raise ValueError(f"table {self.name!r}: the {source} lists id "
                       f"{int(values[counts > 1][0])} more than once (as rows or "
                       "pending ids); it is corrupted, and nothing was loaded")

  def _load_state(self, state, source):
    self.check_state(state, source)
    values = tf.stack([tf.convert_to_tensor(state["table"], tf.float32)] +
                      [tf.convert_to_tensor(state[base.SLOT_PREFIX + s], tf.float32)
                       for s in self.optimizer.slot_names], axis=1)
    return self.assign_rows(
        state["ids"], values, state["counts"], state["last_seen"],
        state["pending_ids"], state["pending_counts"], state["pending_last_seen"],
        state["step"])

  def assign_rows(self, ids, values, counts=None, last_seen=None,
                  pending_ids=None, pending_counts=None, pending_last_seen=None,
                  step=None):
    """Replaces the whole table: rows `values` [k, slots, dim] (or [k, dim],
    slots then start at their initial values) for `ids`, each shard keeping
    the ids it owns. Used by load_state and warm start."""
    ids = tf.reshape(tf.cast(ids, tf.int64), [-1])
    values = tf.convert_to_tensor(values, tf.float32)
    if values.shape.rank == 2:
      slots = [tf.fill(tf.shape(values), tf.constant(v, tf.float32))
               for v in self.spec.slot_initial_values]
      values = tf.stack([values] + slots, axis=1)
    self._replaced()
    # The record of evictions speaks of the contents replaced: kept, an id
    # evicted from them would be reported removed from these (a rollback
    # to a state that holds it again). The next mark starts a new record.
    updates = self._forget_evictions()
    zeros = tf.zeros_like(ids)
    counts = zeros if counts is None else tf.cast(counts, tf.int64)
    last_seen = zeros if last_seen is None else tf.cast(last_seen, tf.int64)
    empty = tf.zeros([0], tf.int64)
    pending = [empty if x is None else tf.cast(x, tf.int64)
               for x in (pending_ids, pending_counts, pending_last_seen)]
    for replica, store in self.stores.items():
      mine = self.owned_mask(ids, replica)
      pending_mine = self.owned_mask(pending[0], replica)
      with tf.device(self.comm.replica_device(replica)):
        updates.append(store.import_(
            tf.boolean_mask(ids, mine), tf.boolean_mask(values, mine),
            tf.boolean_mask(counts, mine), tf.boolean_mask(last_seen, mine),
            *[tf.boolean_mask(x, pending_mine) for x in pending]))
    if step is not None:
      updates += [s.assign(tf.cast(step, tf.int64)) for s in self.steps.values()]
    return tf.group(updates)

  # ---- changes since a mark

  def change_keys(self):
    return super().change_keys() + [REMOVED_IDS]

  def _forget_evictions(self):
    """[ops] emptying the record of evicted ids and stopping it until the
    next mark (its consumers' marks speak of other contents)."""
    self.consumers = {}
    ops = []
    for replica, evicted_at in self.evicted_at.items():
      ids, _ = evicted_at.export()
      ops += [evicted_at.remove(tf.reshape(ids, [-1])),
              self.evictions_recorded_from[replica].assign(-1),
              self.evictions_trimmed_to[replica].assign(-1)]
    return ops

  def mark(self, consumer=None):
    """As every table's; the first mark (the first after the contents were
    replaced, or after every consumer was dropped) also starts the record
    of evicted ids (`changes_since` reports them), which until then is not
    kept. A consumer new to the table needs the record from this step."""
    mark = super().mark()
    for recorded_from in self.evictions_recorded_from.values():
      if recorded_from.numpy() < 0:
        recorded_from.assign(mark.step)
    self.consumers.setdefault(consumer or "", mark.step)
    return mark

  def forget_changes_before(self, step, consumer=None):
    """`consumer` asks for no changes before `step` (eager): the record
    drops the ids evicted at or before the oldest step any consumer still
    needs; older marks are then refused by name. From the first mark on,
    the record grows by an entry an eviction until its consumers move on
    (`DeltaCheckpointManager` at each save, an export chain at each delta)
    or it reaches `DynamicConfig.eviction_record_limit`."""
    name = consumer or ""
    self.consumers[name] = max(int(step), self.consumers.get(name, int(step)))
    self._trim_to_consumers()

  def drop_consumer(self, consumer):
    """`consumer` asks for no more changes (eager); with no consumer left
    the record is emptied and stopped until the next mark."""
    self.consumers.pop(consumer or "", None)
    self._trim_to_consumers()

  def _trim_to_consumers(self):
    if not self.consumers:
      self._forget_evictions()
      return
    floor = min(self.consumers.values())
    for replica, evicted_at in self.evicted_at.items():
      ids, steps = evicted_at.export()
      evicted_at.remove(tf.boolean_mask(tf.reshape(ids, [-1]),
                                        tf.reshape(steps, [-1]) <= floor))
      recorded_from = self.evictions_recorded_from[replica]
      if 0 <= recorded_from.numpy() < floor:
        recorded_from.assign(floor)

  def changes_since(self, mark, consumer=None):
    if mark is not None and mark.lineage == self.lineage:
      self._check_eviction_record(mark.step, consumer)
    return super().changes_since(mark, consumer)

  def _check_eviction_record(self, step, consumer=None):
    who = f" (consumer {consumer!r})" if consumer else ""
    for replica, recorded_from in self.evictions_recorded_from.items():
      start = int(recorded_from.numpy())
      if start < 0 or start > step:
        trimmed = int(self.evictions_trimmed_to[replica].numpy())
        if start < 0:
          kept = "no mark was taken before it, so no evictions are on record"
        elif trimmed >= step:
          kept = (f"the record starts at step {start}: it passed its bound of "
                  f"{self.config.dynamic.eviction_record_limit} ids a shard "
                  "(DynamicConfig.eviction_record_limit) while this consumer lagged")
        else:
          kept = (f"the record starts at step {start}: older evictions were forgotten "
                  "(forget_changes_before: every consumer on record had moved past them)")
        raise ValueError(
            f"table {self.name!r}{who}: the ids evicted since step {step} are not on "
            f"record ({kept}); its changes since are unknown; save it whole "
            "(a full checkpoint or export)")

  def _changes_since_step(self, step):
    self._check_eviction_record(step)
    # The stores export only the rows last seen after the step (every
    # update of a row looks it up, which sets last_seen): the delta's size
    # and time follow the rows changed, not the live rows.
    changed = {k: v.numpy() for k, v in self._state(seen_after=step).items()}
    changes = {key: changed[key] for key in ROW_FIELDS}
    changes["table"] = changed["table"]
    for slot in self.optimizer.slot_names:
      changes[base.SLOT_PREFIX + slot] = changed[base.SLOT_PREFIX + slot]
    parts = {}
    for replica in self.comm.local_replicas():
      if replica not in self.evicted_at:  # holds none of the table's rows
        parts[replica] = [tf.zeros([0], tf.int64)]
        continue
      ids, steps = self.evicted_at[replica].export()
      parts[replica] = [tf.boolean_mask(tf.reshape(ids, [-1]),
                                        tf.reshape(steps, [-1]) > step)]
    evicted = self.comm.concat_replica_values(parts)[0].numpy()
    # An id evicted and admitted again since is live, and was seen since.
    changes[REMOVED_IDS] = np.setdiff1d(evicted, changed["ids"])
    # Pending ids are few and carry no rows: whole, they also say which
    # ones expired or were admitted.
    for key in PENDING_FIELDS + ("step",):
      changes[key] = changed[key]
    return changes

  def check_changes(self, changes, source="delta"):
    super().check_changes(changes, source)
    rows = changes[base.CHANGED_IDS].shape[0]
    for key in ROW_FIELDS:
      self._check_shape(changes, key, (rows,), "checkpoint")
    self._check_shape(changes, REMOVED_IDS, (None,), "checkpoint")
    for key in PENDING_FIELDS:
      self._check_shape(changes, key, (changes["pending_ids"].shape[0],), "checkpoint")

  def apply_changes(self, changes):
    self.check_changes(changes)
    self.load_state(merge_changes(self.export_rows(), changes))

  # ---- views (eager)

  def export_rows(self):
    """The whole state as numpy arrays sorted by id: ids, table [k, dim],
    one `slot_<name>` [k, dim] array per optimizer slot, counts, last_seen,
    the pending ids' fields and the step."""
    return {k: v.numpy() for k, v in self.state().items()}

  def size(self):
    """Live rows over all shards of this process (eager)."""
    return int(sum(int(s.stats()[0]) for s in self.stores.values()))

  def memory_bytes(self):
    """Host memory held by this process's shards (eager): grows with the
    live rows, not with the range of the ids."""
    return int(sum(int(s.stats()[2]) for s in self.stores.values()))


def merge_changes(state, changes):
  """A dynamic table's whole state (dict of numpy arrays, `state()`) with
  `changes` (`changes_since`) applied: rows of removed or changed ids
  replaced by the changed rows, pending ids and step taken whole.

  >>> import numpy as np
  >>> state = {"ids": np.array([1, 5]), "table": np.array([[1.], [5.]]),
  ...          "counts": np.array([1, 1]), "last_seen": np.array([1, 1]),
  ...          "pending_ids": np.array([7]), "pending_counts": np.array([1]),
  ...          "pending_last_seen": np.array([1]), "step": np.array(1)}
  >>> changes = {"ids": np.array([3, 5]), "table": np.array([[3.], [6.]]),
  ...            "counts": np.array([2, 2]), "last_seen": np.array([2, 2]),
  ...            "removed_ids": np.array([1]), "pending_ids": np.array([], int),
  ...            "pending_counts": np.array([], int),
  ...            "pending_last_seen": np.array([], int), "step": np.array(2)}
  >>> merged = merge_changes(state, changes)
  >>> merged["ids"].tolist(), merged["table"][:, 0].tolist()
  ([3, 5], [3.0, 6.0])
  """
  ids = np.asarray(state[base.CHANGED_IDS])
  kept = ~np.isin(ids, np.concatenate([np.asarray(changes[REMOVED_IDS], np.int64),
                                       np.asarray(changes[base.CHANGED_IDS], np.int64)]))
  merged = {}
  row_keys = [k for k in state if k not in PENDING_FIELDS and k != "step"]
  for key in row_keys:
    merged[key] = np.concatenate([np.asarray(state[key])[kept],
                                  np.asarray(changes[key], np.asarray(state[key]).dtype)])
  order = np.argsort(merged[base.CHANGED_IDS], kind="stable")
  merged = {key: value[order] for key, value in merged.items()}
  for key in PENDING_FIELDS + ("step",):
    merged[key] = np.asarray(changes[key])
  return merged
