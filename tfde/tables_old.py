"""Embedding tables sharded over replicas by `id % N`.

>>> import tfde
>>> config = tfde.TableConfig(name="items", vocabulary_size=10,
...                           embedding_dim=4, optimizer="adagrad")
>>> table = tfde.tables.ShardedTable(config)   # no strategy: one shard
>>> table.num_shards, table.full_table().shape
(1, (10, 4))

A table's initial value is a function of (seed, global row) only, so the
full table is the same whatever the number of shards; optimizer slots are
sharded like the table, and each shard counts its optimizer steps.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tfde import comm as comm_lib
from tfde import initializers
from tfde import ops
from tfde import optimizers as optimizers_lib
from tfde import sharding

def _switches_optimizer(table, optimizer):
  """True when `optimizer` is of another kind than the table's (new slots
  needed), which only an untrained table allows; else adopts it as is."""
  if optimizer.kind == table.optimizer.kind:
    table.optimizer = optimizer
    return False
  if any(int(step.numpy()) for step in table.steps.values()):
    raise ValueError(f"table {table.name!r} has been trained with "
                     f"{table.optimizer.kind!r}; it cannot switch to "
                     f"{optimizer.kind!r}")
  return True


class ShardedTable(tf.Module):
  """A static table of `vocabulary_size` rows spread over the replicas.

  Replica r holds global rows r, r+N, r+2N, ... as local rows 0, 1, 2, ...
  Only the shards of replicas in this process are created here.

  With `replicated=True` every replica instead holds the whole table (one
  "shard" of V rows per replica, data parallel): its gradients are summed
  over all replicas before each replica applies the same update.

  Args:
    config: the table's `TableConfig`.
    communicator: where the shards live; default `tfde.comm.current()`,
      from the strategy scope (or Horovod) this is built in.
    replicated: keep a full copy per replica instead of sharding.
  """

  is_dynamic = False

  def __init__(self, config, communicator=None, replicated=False):
    super().__init__(name=config.name)
    if config.is_dynamic:
      raise ValueError(f"table {config.name!r} is dynamic; use DynamicTable")
    self.config = config
    self.comm = communicator or comm_lib.current()
    self.replicated = replicated
    self.num_shards = 1 if replicated else self.comm.num_replicas
    self.optimizer = config.optimizer
    self.rows_per_shard = sharding.rows_per_shard(config.vocabulary_size,
                                                  self.num_shards)
    self.shards = {}
    self.slots = {}
    self.steps = {}
    for replica in self.comm.local_replicas():
      device = self.comm.replica_device(replica)
      if replicated:
        suffix = f"replica_{replica}"
        initial = initializers.shard_value(config, 1, 0)
      else:
        suffix = f"shard_{replica}_of_{self.num_shards}"
        initial = initializers.shard_value(config, self.num_shards, replica)
      shard = comm_lib._local_variable(  # pylint: disable=protected-access
          initial, f"{config.name}/{suffix}", trainable=True, device=device)
      self.shards[replica] = shard
      optimizers_lib.register_shard(shard, self, replica)
      self.slots[replica] = self.optimizer.create_slots(
          initial.shape, name=f"{config.name}/{suffix}", device=device,
          creator=lambda value, name, d=device: comm_lib._local_variable(  # pylint: disable=protected-access
              value, name, device=d))
      self.steps[replica] = comm_lib._local_variable(  # pylint: disable=protected-access
          tf.constant(0, tf.int64), f"{config.name}/{suffix}/step", device=device)

  @property
  def name(self):
    return self.config.name

  @property
  def vocabulary_size(self):
    return self.config.vocabulary_size

  @property
  def embedding_dim(self):
    return self.config.embedding_dim

  def local_variables(self):
    """The shard variables of this process (SOK's local embedding vars)."""
    return [self.shards[r] for r in sorted(self.shards)]

  def shard(self, replica):
    return self.shards[replica]

  def use_optimizer(self, optimizer):
    """Trains with `optimizer` from now on. Another kind of optimizer (other
    slots) is accepted only before the first update, when its slots are
    created (SOK's wrappers choose a table's optimizer at first use)."""
    if not _switches_optimizer(self, optimizer):
      return
    self.optimizer = optimizer
    for replica, shard in self.shards.items():
      device = self.comm.replica_device(replica)
      self.slots[replica] = optimizer.create_slots(
          shard.shape, name=shard.name.split(":")[0], device=device,
          creator=lambda value, name, d=device: comm_lib._local_variable(  # pylint: disable=protected-access
              value, name, device=d))

  def apply_shard_update(self, replica, local_rows, grads, optimizer=None,
                         grad_rows=None):
    """Applies one optimizer step to rows of one shard (rows unique);
    grads[k], or grads[grad_rows[k]], belongs to local_rows[k].

    The step counter advances even with no rows, so every shard agrees on
    the step used by Adam's bias correction. Returns that step as a tensor
    that exists only once the update has run: callers make their results
    depend on it as data, which no graph rewrite can drop (a control
    dependency alone was seen to be pruned inside Keras's fit).
    """
    optimizer = optimizer or self.optimizer
    with tf.device(self.comm.replica_device(replica)):
      step = self.steps[replica].assign_add(1)
      with tf.control_dependencies([step]):
        update = optimizer.apply(self.shards[replica], self.slots[replica],
                                 local_rows, grads, step, grad_rows=grad_rows)
      with tf.control_dependencies([update]):
        return tf.identity(step)

  # ---- checkpoints: whole tables, independent of the replica count
  #
  # A tf.train.Checkpoint stores a table as full [V, D] tensors (table,
  # each slot) and its step, not as per-shard variables, so a checkpoint
  # written with N replicas restores with M. Built from TF ops only, so a
  # save may be traced into a function.

  def _trackable_children(self, save_type="checkpoint", **kwargs):
    # The shards are saved through _serialize_to_tensors (checkpoints); a
    # SavedModel for serving holds whole-table copies (tfde.serving).
    del save_type, kwargs
    return {}

  def _gathered(self, variables_by_replica):
    """The [V, D] table from local shard variables, as a tensor."""
    if self.replicated:
      return tf.convert_to_tensor(variables_by_replica[min(variables_by_replica)])
    # [N, rows, D], from other processes too (a collective: every process
    # saves, as MultiWorkerMirroredStrategy requires).
    shards = self.comm.gather_replica_values(
        {r: v.read_value() for r, v in variables_by_replica.items()})
    # Global row local * N + shard: interleave the shards row by row.
    full = tf.reshape(tf.transpose(shards, [1, 0, 2]),
                      [self.rows_per_shard * self.num_shards, self.embedding_dim])
    return full[:self.vocabulary_size]

  def _sharded(self, full):
    """The inverse of _gathered: one [rows_per_shard, D] tensor per shard."""
    if self.replicated:
      return {r: full for r in self.shards}
    padding = self.rows_per_shard * self.num_shards - self.vocabulary_size
    full = tf.pad(full, [[0, padding], [0, 0]])
    full = tf.reshape(full, [self.rows_per_shard, self.num_shards,
                             self.embedding_dim])
    return {r: full[:, r] for r in self.shards}

  def _slot_shards(self, slot_name):
    return {r: s[slot_name] for r, s in self.slots.items()}

  def _assign_whole(self, variables_by_replica, full):
    """Assign ops setting local shard variables from a [V, D] tensor."""
    parts = self._sharded(tf.convert_to_tensor(full, tf.float32))
    return [variables_by_replica[r].assign(parts[r]) for r in variables_by_replica]

  def _serialize_to_tensors(self):
    tensors = {"table": self._gathered(self.shards)}
    for slot in self.optimizer.slot_names:
      tensors[f"slot_{slot}"] = self._gathered(self._slot_shards(slot))
    tensors["step"] = tf.convert_to_tensor(self.steps[min(self.steps)])
    return tensors

  def _restore_from_tensors(self, restored_tensors):
    expected = (self.vocabulary_size, self.embedding_dim)
    needed = {"table", "step"} | {f"slot_{s}" for s in self.optimizer.slot_names}
    missing = sorted(needed - set(restored_tensors))
    if missing:
      raise ValueError(f"table {self.name!r}: the checkpoint lacks {missing} "
                       f"(was it trained with another optimizer than "
                       f"{self.optimizer.kind!r}?)")
    for key, value in restored_tensors.items():
      if key != "step" and tuple(value.shape) != expected:
        raise ValueError(f"table {self.name!r}: the checkpoint's {key} has "
                         f"shape {tuple(value.shape)}, the model's is {expected}")
    updates = self._assign_whole(self.shards, restored_tensors["table"])
    for slot in self.optimizer.slot_names:
      updates += self._assign_whole(self._slot_shards(slot),
                                    restored_tensors[f"slot_{slot}"])
    for step in self.steps.values():
      updates.append(step.assign(tf.cast(restored_tensors["step"], tf.int64)))
    return tf.group(updates)

  # ---- whole-table views (eager)

  def full_table(self):
    """The whole [V, D] table as a numpy array (a collective when shards
    live in other processes)."""
    return self._gathered(self.shards).numpy()

  def full_slot(self, slot_name):
    return self._gathered(self._slot_shards(slot_name)).numpy()

  def assign_full(self, values):
    """Sets the whole table from a [V, D] array (warm start)."""
    self._check_whole(values, "values")
    self._assign_whole(self.shards, values)

  def assign_full_slot(self, slot_name, values):
    """Sets one optimizer slot of the whole table from a [V, D] array."""
    self._check_whole(values, f"slot {slot_name!r}")
    self._assign_whole(self._slot_shards(slot_name), values)

  def _check_whole(self, values, what):
    shape = tuple(np.shape(values))
    expected = (self.vocabulary_size, self.embedding_dim)
    if shape != expected:
      raise ValueError(f"table {self.name!r}: {what} have shape {shape}, "
                       f"the table is {expected}")


def dynamic_spec(config):
  """The kernel-level description of a dynamic table's shards."""
  kind, a, b = initializers.per_id(config.initializer, config.embedding_dim,
                                   config.name)
  optimizer = config.optimizer
  return ops.DynamicTableSpec(
      dim=config.embedding_dim,
      slot_initial_values=tuple(float(optimizer.slot_initial_value(s))
                                for s in optimizer.slot_names),
      initializer=kind, initializer_a=float(a), initializer_b=float(b),
      seed=config.seed, admit_after=config.dynamic.admit_after,
      zeros_until_admitted=config.dynamic.unadmitted_value == "zeros")


class DynamicTable(tf.Module):
  """A table with no fixed vocabulary: a hash table per replica, holding
  the rows of the ids `id mod N` (floor) routes to it, created when an id
  is first admitted and evicted by `config.dynamic`'s rules.

  >>> import tensorflow as tf
  >>> import tfde
  >>> config = tfde.TableConfig(name="users", vocabulary_size=None,
  ...                           embedding_dim=4, optimizer="sgd",
  ...                           initializer="zeros")
  >>> table = tfde.tables.DynamicTable(config)
  >>> rows = table.lookup_shard(0, tf.constant([2**40, -7], tf.int64),
  ...                           tf.constant([1, 1], tf.int64), training=True)
  >>> table.size(), rows.shape
  (2, TensorShape([2, 4]))

  Any int64 id is a key, negative and hashed 64-bit ones included. Rows
  start at the initializer drawn per (seed, id), so contents never depend
  on the replica count or on the order ids arrive in. Memory grows with
  the live rows (`memory_bytes()`), not with the id range. Checkpoints hold
  the whole table (ids, rows, slots, sighting counts), so they restore onto
  any number of replicas.
  """

  replicated = False
  vocabulary_size = None
  is_dynamic = True

  def __init__(self, config, communicator=None):
    super().__init__(name=config.name)
    if not config.is_dynamic:
      raise ValueError(f"table {config.name!r} has a vocabulary size; use "
                       "ShardedTable")
    self.config = config
    self.comm = communicator or comm_lib.current()
    self.num_shards = self.comm.num_replicas
    self.optimizer = config.optimizer
    self.spec = dynamic_spec(config)
    self.stores = {}
    self.steps = {}
    self.gradient_variables = {}
    for replica in self.comm.local_replicas():
      device = self.comm.replica_device(replica)
      suffix = f"shard_{replica}_of_{self.num_shards}"
      self.stores[replica] = ops.dynamic_store(
          self.spec, f"{config.name}_{suffix}", device)
      self.steps[replica] = comm_lib._local_variable(  # pylint: disable=protected-access
          tf.constant(0, tf.int64), f"{config.name}/{suffix}/step", device=device)
      # A [0, D] stand-in that gradients are taken with respect to when a
      # dynamic table is trained explicitly (SOK's DynamicVariable): its
      # gradient is tf.IndexedSlices whose indices are ids, not rows.
      self.gradient_variables[replica] = comm_lib._local_variable(  # pylint: disable=protected-access
          tf.zeros([0, config.embedding_dim]), f"{config.name}/{suffix}/rows",
          trainable=True, device=device)
      optimizers_lib.register_shard(self.gradient_variables[replica], self, replica)

  @property
  def name(self):
    return self.config.name

  @property
  def embedding_dim(self):
    return self.config.embedding_dim

  def local_variables(self):
    """The shards' gradient stand-ins (see gradient_variables)."""
    return [self.gradient_variables[r] for r in sorted(self.gradient_variables)]

  def use_optimizer(self, optimizer):
    """Trains with `optimizer` from now on; another kind (other slots) only
    before the first update: rows looked up so far keep their embeddings
    and get the new optimizer's initial slots (SOK picks the optimizer at
    first use)."""
    if not _switches_optimizer(self, optimizer):
      return
    rows = self._gathered()
    self.optimizer = optimizer
    self.config = dataclasses.replace(self.config, optimizer=optimizer)
    self.spec = dynamic_spec(self.config)
    for replica in list(self.stores):
      self.stores[replica] = ops.dynamic_store(
          self.spec, f"{self.name}_shard_{replica}_of_{self.num_shards}",
          self.comm.replica_device(replica))
    self.assign_rows(rows["ids"], rows["values"][:, 0], rows["counts"],
                     rows["last_seen"], rows["pending_ids"], rows["pending_counts"],
                     rows["pending_last_seen"])

  def lookup_shard(self, replica, ids, counts, training):
    """Rows of `ids` (routed to this replica) from its shard. In training
    each id counts `counts[i]` sightings at the coming step, which may
    admit it (create its row); otherwise nothing changes."""
    return self.lookup_shard_with_addresses(replica, ids, counts, training)[0]

  def lookup_shard_with_addresses(self, replica, ids, counts, training):
    """lookup_shard's rows, and the addresses of the ids' rows after it (-1
    for ids without a row), for `apply_shard_update(..., by_address=True)`
    (mxRec's flow). Both come from one op, so the addresses see the rows
    this lookup created."""
    with tf.device(self.comm.replica_device(replica)):
      step = tf.convert_to_tensor(self.steps[replica]) + 1
      return self.stores[replica].lookup(ids, counts, step, insert=training)

  def apply_shard_update(self, replica, ids, grads, optimizer=None, grad_rows=None,
                         by_address=False):
    """One optimizer step on the rows of `ids` (unique) in one shard, then
    eviction when due. With `by_address`, `ids` are row addresses. Returns
    the step as a tensor computed after both (see
    ShardedTable.apply_shard_update)."""
    optimizer = optimizer or self.optimizer
    if optimizer.kind != self.optimizer.kind:
      raise ValueError(f"table {self.name!r} keeps slots for "
                       f"{self.optimizer.kind!r}, not {optimizer.kind!r}")
    store = self.stores[replica]
    dynamic = self.config.dynamic
    with tf.device(self.comm.replica_device(replica)):
      # After the gradients exist, hence after this step's lookups read the
      # step (a TF1 graph orders nothing else).
      with tf.control_dependencies([ids, grads]):
        step = self.steps[replica].assign_add(1)
      with tf.control_dependencies([step]):
        applied = optimizer.apply_dynamic(store, ids, grads, step, grad_rows,
                                          by_address=by_address)
      done = [applied]
      if dynamic.evicts:
        with tf.control_dependencies([applied]):
          evicted = tf.cond(
              tf.equal(step % dynamic.evict_every_steps, 0),
              lambda: tf.size(store.evict(step, dynamic.evict_after_steps or 0,
                                          dynamic.max_rows_per_shard or 0),
                              out_type=tf.int64),
              lambda: tf.constant(0, tf.int64))
        done.append(evicted)
      with tf.control_dependencies(done):
        return step + 0 * tf.add_n(done)

  # ---- whole-table views and checkpoints

  _FIELDS = ("ids", "values", "counts", "last_seen", "pending_ids",
             "pending_counts", "pending_last_seen")

  def _trackable_children(self, save_type="checkpoint", **kwargs):
    del save_type, kwargs
    return {}

  def _gathered(self):
    """Every shard's export, concatenated and sorted by id (a collective
    when shards live in other processes)."""
    parts = self.comm.concat_replica_values(
        {r: list(s.export()) for r, s in self.stores.items()})
    whole = dict(zip(self._FIELDS, parts))
    order = tf.argsort(whole["ids"], stable=True)
    pending_order = tf.argsort(whole["pending_ids"], stable=True)
    for field in self._FIELDS:
      whole[field] = tf.gather(whole[field],
                               pending_order if field.startswith("pending") else order)
    return whole

  def _serialize_to_tensors(self):
    whole = self._gathered()
    tensors = {"ids": whole["ids"], "table": whole["values"][:, 0]}
    for k, slot in enumerate(self.optimizer.slot_names):
      tensors[f"slot_{slot}"] = whole["values"][:, k + 1]
    for field in ("counts", "last_seen", "pending_ids", "pending_counts",
                  "pending_last_seen"):
      tensors[field] = whole[field]
    tensors["step"] = tf.convert_to_tensor(self.steps[min(self.steps)])
    return tensors

  def _restore_from_tensors(self, restored_tensors):
    needed = ({"ids", "table", "counts", "last_seen", "pending_ids",
               "pending_counts", "pending_last_seen", "step"} |
              {f"slot_{s}" for s in self.optimizer.slot_names})
    missing = sorted(needed - set(restored_tensors))
    if missing:
      raise ValueError(f"table {self.name!r}: the checkpoint lacks {missing} (is "
                       "it of a static table, or one trained with another "
                       f"optimizer than {self.optimizer.kind!r}?)")
    table = restored_tensors["table"]
    if table.shape.rank != 2 or table.shape[1] != self.embedding_dim:
      raise ValueError(f"table {self.name!r}: the checkpoint's rows have shape "
                       f"{tuple(table.shape)}, the model's are (None, "
                       f"{self.embedding_dim})")
    values = tf.stack([table] + [restored_tensors[f"slot_{s}"]
                                 for s in self.optimizer.slot_names], axis=1)
    return self.assign_rows(
        restored_tensors["ids"], values, restored_tensors["counts"],
        restored_tensors["last_seen"], restored_tensors["pending_ids"],
        restored_tensors["pending_counts"], restored_tensors["pending_last_seen"],
        restored_tensors["step"])

  def assign_rows(self, ids, values, counts=None, last_seen=None,
                  pending_ids=None, pending_counts=None, pending_last_seen=None,
                  step=None):
    """Replaces the whole table: rows `values` [k, slots, dim] (or [k, dim],
    slots then start at their initial values) for `ids`, each shard keeping
    the ids it owns. Used by restore and warm start."""
    ids = tf.reshape(tf.cast(ids, tf.int64), [-1])
    values = tf.convert_to_tensor(values, tf.float32)
    if values.shape.rank == 2:
      slots = [tf.fill(tf.shape(values), tf.constant(v, tf.float32))
               for v in self.spec.slot_initial_values]
      values = tf.stack([values] + slots, axis=1)
    zeros = tf.zeros_like(ids)
    counts = zeros if counts is None else tf.cast(counts, tf.int64)
    last_seen = zeros if last_seen is None else tf.cast(last_seen, tf.int64)
    empty = tf.zeros([0], tf.int64)
    pending = [empty if x is None else tf.cast(x, tf.int64)
               for x in (pending_ids, pending_counts, pending_last_seen)]
    updates = []
    for replica, store in self.stores.items():
      mine = tf.equal(tf.math.floormod(ids, self.num_shards), replica)
      pending_mine = tf.equal(tf.math.floormod(pending[0], self.num_shards), replica)
      with tf.device(self.comm.replica_device(replica)):
        updates.append(store.import_(
            tf.boolean_mask(ids, mine), tf.boolean_mask(values, mine),
            tf.boolean_mask(counts, mine), tf.boolean_mask(last_seen, mine),
            *[tf.boolean_mask(x, pending_mine) for x in pending]))
    if step is not None:
      updates += [s.assign(tf.cast(step, tf.int64)) for s in self.steps.values()]
    return tf.group(updates)

  def export_rows(self):
    """The whole table as numpy arrays sorted by id: ids, table [k, dim],
    one [k, dim] array per optimizer slot, counts, last_seen."""
    tensors = self._serialize_to_tensors()
    return {k: v.numpy() for k, v in tensors.items()}

  def size(self):
    """Live rows over all shards of this process (eager)."""
    return int(sum(int(s.stats()[0]) for s in self.stores.values()))

  def memory_bytes(self):
    """Host memory held by this process's shards (eager): grows with the
    live rows, not with the range of the ids."""
    return int(sum(int(s.stats()[2]) for s in self.stores.values()))
