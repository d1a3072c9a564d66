"""Static tables: `vocabulary_size` rows sharded over the replicas by
`id % N`, or replicated whole on each.

>>> import tfde
>>> config = tfde.TableConfig(name="items", vocabulary_size=10,
...                           embedding_dim=4, optimizer="adagrad")
>>> table = tfde.tables.ShardedTable(config)   # no strategy: one shard
>>> table.num_shards, table.full_table().shape
(1, (10, 4))

A table's initial value is a function of (seed, global row) only, so the
full table is the same whatever the number of shards; optimizer slots are
sharded like the table, and each shard counts its optimizer steps and
records the step each of its rows was last updated at (`changes_since`).
"""

import numpy as np
import tensorflow as tf

from tfde import comm as comm_lib
from tfde import initializers
from tfde import ops
from tfde import sharding
from tfde.tables import base


class ShardedTable(base.Table):
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

  def __init__(self, config, communicator=None, replicated=False):
    if config.is_dynamic:
      raise ValueError(f"table {config.name!r} is dynamic; use DynamicTable")
    super().__init__(config, communicator)
    self.replicated = replicated
    self.num_shards = 1 if replicated else self.comm.num_replicas
    self.rows_per_shard = sharding.rows_per_shard(config.vocabulary_size,
                                                  self.num_shards)
    self.shards = {}
    self.slots = {}
    self.updated_at = {}
    for replica in self.comm.local_replicas():
      if replicated:
        suffix = f"replica_{replica}"
        initial = initializers.shard_value(config, 1, 0)
      else:
        suffix = f"shard_{replica}_of_{self.num_shards}"
        initial = initializers.shard_value(config, self.num_shards, replica)
      self.shards[replica] = self._own(comm_lib.local_variable(
          tf.cast(initial, config.dtype), f"{config.name}/{suffix}", trainable=True,
          device=self.comm.replica_device(replica)), replica)
      self.slots[replica] = self._new_slots(replica, self.optimizer)
      self._new_step_variable(replica, suffix)
      self._new_updated_at(replica, suffix)

  def _new_slots(self, replica, optimizer):
    device = self.comm.replica_device(replica)
    shard = self.shards[replica]
    return optimizer.create_slots(
        shard.shape, name=shard.name.split(":")[0], device=device,
        creator=lambda value, name: comm_lib.local_variable(value, name, device=device))

  def shard(self, replica):
    return self.shards[replica]

  def use_optimizer(self, optimizer):
    if not base.switches_optimizer(self, optimizer):
      return
    self.optimizer = optimizer
    for replica in self.shards:
      self.slots[replica] = self._new_slots(replica, optimizer)
    self.advise_memory()

  # ---- the pipeline's side

  def lookup_local(self, replica, requested, counts, training):
    del counts, training
    if self.config.dtype != "float32":
      return ops.gather_rows_float32([self.shards[replica]], requested, [0])
    return ops.gather_from_tables([self.shards[replica]], requested, [0])

  def _rounding(self, replica, rows):
    """For reduced-precision rows: the noise of each updated row's
    stochastic rounding, from its global row (so alike for any N)."""
    if self.config.dtype == "float32":
      return None
    seed = self.config.seed

    def noise_of(indices, step):
      global_rows = tf.cast(indices, tf.int64)
      if not self.replicated:
        global_rows = global_rows * self.num_shards + replica
      return ops.rounding_noise(seed, step, global_rows, self.embedding_dim)
    return noise_of

  def _count_saturation(self, replica):
    """An update that saturated a reduced-precision row (a finite value
    beyond the row type's range) counts in `skipped_updates`, as a skipped
    non-finite update does."""
    def count(flag):
      return self.skips[replica].assign_add(tf.cast(flag, tf.int64))
    return count

  def apply_gradient(self, replica, rows, grads, optimizer=None, grad_rows=None,
                     finite=None):
    # The step counter advances even with no rows, so every shard agrees on
    # the step used by Adam's bias correction.
    optimizer = self.update_optimizer(optimizer)

    def apply():
      # After the rows exist, hence after this step's lookups read the step
      # for their exchange's stamp (a TF1 graph orders nothing else).
      with tf.control_dependencies([rows]):
        step = self.steps[replica].assign_add(1)
      with tf.control_dependencies([step]):
        update = optimizer.apply(self.shards[replica], self.slots[replica],
                                 rows, grads, step, grad_rows=grad_rows,
                                 rounding=self._rounding(replica, rows),
                                 on_saturate=self._count_saturation(replica))
        touched = ops.stamp_rows(self.updated_at[replica], rows, step)
      with tf.control_dependencies([update, touched]):
        return tf.identity(step)

    with tf.device(self.comm.replica_device(replica)):
      return self.guard_nonfinite(replica, finite, apply)

  def gradient_variable(self, replica):
    return self.shards[replica]

  # ---- whole-table state: [V, D] tensors from the shards, and back

  def _gathered(self, key):
    """The whole [V, state_width(key)] tensor of state key `key` (the
    table, or a slot) from the local shard variables."""
    variables_by_replica = self._variables(key)
    if self.replicated:
      return tf.convert_to_tensor(variables_by_replica[min(variables_by_replica)])
    # [N, rows, width], from other processes too (a collective: every
    # process saves, as MultiWorkerMirroredStrategy requires).
    shards = self.comm.gather_replica_values(
        {r: v.read_value() for r, v in variables_by_replica.items()})
    # Global row local * N + shard: interleave the shards row by row.
    full = tf.reshape(tf.transpose(shards, [1, 0, 2]),
                      [self.rows_per_shard * self.num_shards, self.state_width(key)])
    return full[:self.vocabulary_size]

  def _sharded(self, full):
    """The inverse of _gathered: one [rows_per_shard, D] tensor per shard."""
    if self.replicated:
      return {r: full for r in self.shards}
    padding = self.rows_per_shard * self.num_shards - self.vocabulary_size
    full = tf.pad(full, [[0, padding], [0, 0]])
    full = tf.reshape(full, [self.rows_per_shard, self.num_shards, -1])
    return {r: full[:, r] for r in self.shards}

  def _variables(self, key):
    """replica -> the variable holding state key `key` there."""
    if key == "table":
      return self.shards
    slot = key[len(base.SLOT_PREFIX):]
    return {r: s[slot] for r, s in self.slots.items()}

  def state(self, keys=None):
    tensors = {key: self._gathered(key)
               for key in keys or self.state_keys() if key != "step"}
    if keys is None or "step" in keys:
      tensors["step"] = tf.convert_to_tensor(self.steps[min(self.steps)])
    return tensors

  def check_state(self, state, source="checkpoint"):
    super().check_state(state, source)
    for key in self.state_keys():
      if key != "step":
        self._check_shape(state, key, (self.vocabulary_size, self.state_width(key)),
                          source)

  def _load_state(self, state, source):
    self.check_state(state, source)
    self._replaced()
    updates = []
    for key in self.state_keys():
      if key == "step":
        updates += [s.assign(tf.cast(state["step"], tf.int64))
                    for s in self.steps.values()]
      else:
        updates += self._assign_whole(self._variables(key), state[key])
    return tf.group(updates)

  def _assign_whole(self, variables_by_replica, full):
    """Assign ops setting local shard variables from a [V, D] tensor."""
    # In each variable's type: float32 rows restore into a bfloat16 table
    # (rounded to nearest) and back (exactly).
    parts = self._sharded(tf.cast(tf.convert_to_tensor(full), tf.float32))
    return [variables_by_replica[r].assign(tf.cast(parts[r], variables_by_replica[r].dtype))
            for r in variables_by_replica]

  # ---- changes since a mark

  def _new_updated_at(self, replica, suffix):
    # The step of each local row's last update (0: not since built): 8
    # bytes a row, one scatter of the step's rows per update.
    self.updated_at[replica] = comm_lib.local_variable(
        tf.zeros([self.shards[replica].shape[0]], tf.int64),
        f"{self.name}/{suffix}/updated_at", device=self.comm.replica_device(replica))

  def _global_ids(self, replica, local):
    """Global ids of `replica`'s local rows `local` that it reports as
    changed (one copy of a replicated table's)."""
    if self.replicated:
      return local if replica == 0 else local[:0]
    return local * self.num_shards + replica

  def _local_rows(self, replica, ids):
    """(which of global `ids` `replica` holds, their local rows there)."""
    if self.replicated:
      return tf.ones_like(ids, tf.bool), ids
    mine = tf.equal(ids % self.num_shards, replica)
    return mine, tf.boolean_mask(ids, mine) // self.num_shards

  def _changes_since_step(self, step):
    keys = [k for k in self.state_keys() if k != "step"]
    parts = {}
    for replica in self.comm.local_replicas():
      with tf.device(self.comm.replica_device(replica)):
        if replica in self.updated_at:
          local = tf.reshape(tf.where(self.updated_at[replica] > step), [-1])
          ids = self._global_ids(replica, local)
          local = local[:tf.size(ids)]
          # Reduced-precision rows travel as float32 (exactly).
          parts[replica] = [ids] + [
              tf.cast(tf.gather(self._variables(key)[replica], local), tf.float32)
              for key in keys]
        else:  # a replica holding none of this table's rows
          parts[replica] = [tf.zeros([0], tf.int64)] + [
              tf.zeros([0, self.state_width(key)]) for key in keys]
    gathered = [p.numpy() for p in self.comm.concat_replica_values(parts)]
    order = np.argsort(gathered[0], kind="stable")
    changes = {key: part[order]
               for key, part in zip([base.CHANGED_IDS] + keys, gathered)}
    changes["step"] = np.asarray(self.step_value(), np.int64)
    return changes

  def check_changes(self, changes, source="delta"):
    super().check_changes(changes, source)
    ids = np.asarray(changes[base.CHANGED_IDS])
    bad = ids[(ids < 0) | (ids >= self.vocabulary_size)]
    if bad.size:
      raise ValueError(f"table {self.name!r}: the {source} holds id {bad[0]}, "
                       f"outside the table's {self.vocabulary_size} rows")

  def apply_changes(self, changes):
    self.check_changes(changes)
    ids = tf.convert_to_tensor(np.asarray(changes[base.CHANGED_IDS], np.int64))
    for replica in self.shards:
      with tf.device(self.comm.replica_device(replica)):
        mine, local = self._local_rows(replica, ids)
        for key in self.state_keys():
          if key != "step":
            variable = self._variables(key)[replica]
            rows = tf.boolean_mask(tf.convert_to_tensor(changes[key]), mine)
            variable.scatter_update(tf.IndexedSlices(tf.cast(rows, variable.dtype), local))
    for step in self.steps.values():
      step.assign(int(changes["step"]))
    self._replaced()

  # ---- whole-table views (eager)

  def full_table(self):
    """The whole [V, D] table as a numpy array (a collective when shards
    live in other processes)."""
    return self._gathered("table").numpy()

  def full_slot(self, slot_name):
    return self._gathered(base.SLOT_PREFIX + slot_name).numpy()
