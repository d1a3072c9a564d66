"""Table-wise tables: the whole table on one replica (its owner), static or
dynamic; the other replicas hold none of its rows and send it their ids.

>>> import tfde
>>> config = tfde.TableConfig(name="items", vocabulary_size=10,
...                           embedding_dim=4, optimizer="adagrad")
>>> table = tfde.tables.TableWiseTable(config, owner=0)   # no strategy: 1 replica
>>> table.owner, table.full_table().shape, sorted(table.state())
(0, (10, 4), ['slot_accumulator', 'step', 'table'])

Its state is the same whole table as a row-wise table's (rows, slots,
step), so a checkpoint moves between kinds, owners and replica counts.
Every replica keeps the step counter (the stamp of its group's exchanges,
and Adam's bias correction), advanced each step whether or not it holds
rows. A table-wise table's ids travel with its group's (`tfde.groups`):
in a static group they are fused ids whose owner is the table's
(`sharding.FusedGroupLayout`), so it shares one exchange with row-wise
tables of its width.
"""

import tensorflow as tf

from tfde import comm as comm_lib
from tfde import initializers
from tfde import ops
from tfde.tables import base
from tfde.tables import dynamic
from tfde.tables import sharded


def check_owner(config, owner, communicator):
  if (not isinstance(owner, int) or isinstance(owner, bool) or
      not 0 <= owner < communicator.num_replicas):
    raise ValueError(f"table {config.name!r}: owner must be a replica in "
                     f"[0, {communicator.num_replicas}), got {owner!r}")


class OwnedRows:
  """What a static table whose rows only some replicas hold does on the
  others (`holds_rows` says which): nothing is routed there, so a lookup
  reads zeros; an update only advances the step (the owners' step, Adam's
  bias correction); its gradient variable is a [0, D] stand-in, whose
  empty gradient, applied, advances the step as every replica must
  (explicit, SOK-style training). Mixed into
  `TableWiseTable` and `tfde.tables.TableRowWiseTable` before
  `ShardedTable`."""

  def _make_owned_shards(self, kind, initial_of):
    """Rows, slots and row stamps on the local replicas holding rows
    (`initial_of(replica)`: their initial rows); a step counter on every
    local replica."""
    self.shards, self.slots, self.updated_at, self.stand_ins = {}, {}, {}, {}
    for replica in self.comm.local_replicas():
      suffix = f"replica_{replica}_{kind}"
      if self.holds_rows(replica):
        self.shards[replica] = self._own(comm_lib.local_variable(
            tf.cast(initial_of(replica), self.config.dtype), f"{self.name}/{suffix}",
            trainable=True, device=self.comm.replica_device(replica)), replica)
        self.slots[replica] = self._new_slots(replica, self.optimizer)
        self._new_updated_at(replica, suffix)
      else:
        self.stand_ins[replica] = self._own(comm_lib.local_variable(
            tf.zeros([0, self.embedding_dim]), f"{self.name}/{suffix}/no_rows",
            trainable=True, device=self.comm.replica_device(replica)), replica)
      self._new_step_variable(replica, suffix)

  def lookup_local(self, replica, requested, counts, training):
    if not self.holds_rows(replica):
      return tf.zeros([tf.size(requested), self.embedding_dim])
    return super().lookup_local(replica, requested, counts, training)

  def apply_gradient(self, replica, rows, grads, optimizer=None, grad_rows=None,
                     finite=None):
    if self.holds_rows(replica):
      return super().apply_gradient(replica, rows, grads, optimizer, grad_rows,
                                    finite)
    return self.advance_step_without_rows(replica, rows, grads, optimizer, finite)

  def gradient_variable(self, replica):
    return self.shards[replica] if self.holds_rows(replica) else self.stand_ins[replica]


class TableWiseTable(OwnedRows, sharded.ShardedTable):
  """A static table held whole by replica `owner`.

  Args:
    config: the table's `TableConfig`.
    owner: the replica that holds it.
    communicator: as `ShardedTable`'s.
    initial_value: optional [V, D] initial rows (a column slice of a wider
      table, `tfde.tables.ColumnWiseTable`); default the config's
      initializer, the same rows a row-wise table starts with.
  """

  owner = None

  def __init__(self, config, owner, communicator=None, initial_value=None):
    if config.is_dynamic:
      raise ValueError(f"table {config.name!r} is dynamic; use "
                       "DynamicTableWiseTable")
    base.Table.__init__(self, config, communicator)
    check_owner(config, owner, self.comm)
    self.owner = owner
    self.replicated = False
    self.num_shards = self.comm.num_replicas
    self.rows_per_shard = config.vocabulary_size
    self._make_owned_shards("table_wise", lambda replica: (
        initializers.shard_value(config, 1, 0) if initial_value is None
        else initial_value))

  def holds_rows(self, replica):
    return replica == self.owner

  def _rounding(self, replica, rows):
    # Local rows are global rows here: the rounding noise of a
    # reduced-precision row is the row-wise table's.
    if self.config.dtype == "float32":
      return None
    seed = self.config.seed

    def noise_of(indices, step):
      return ops.rounding_noise(seed, step, tf.cast(indices, tf.int64),
                                self.embedding_dim)
    return noise_of

  def _gathered(self, key):
    # The owner's [V, width]; other replicas contribute nothing (a
    # collective when the owner lives in another process).
    variables_by_replica = self._variables(key)
    parts = {r: [variables_by_replica[r].read_value() if r in variables_by_replica
                 else tf.zeros([0, self.state_width(key)], self.state_dtype(key))]
             for r in self.comm.local_replicas()}
    if self.comm.num_replicas == 1:
      return parts[self.owner][0]
    # Every process gathers, the owner's too: a process holding only the
    # owner must still join the collective the others run.
    return self.comm.concat_replica_values(parts)[0]

  def _sharded(self, full):
    return {r: full for r in self.shards}

  def _global_ids(self, replica, local):
    return local  # the owner's rows are the global rows

  def _local_rows(self, replica, ids):
    return tf.ones_like(ids, tf.bool), ids

  def _variables(self, key):
    if key == "table":
      return self.shards
    slot = key[len(base.SLOT_PREFIX):]
    return {r: s[slot] for r, s in self.slots.items()}

  def _load_state(self, state, source):
    self.check_state(state, source)
    self._replaced()
    updates = [s.assign(tf.cast(state["step"], tf.int64)) for s in self.steps.values()]
    for key in self.state_keys():
      if key != "step":
        updates += self._assign_whole(self._variables(key), state[key])
    return tf.group(updates)


class DynamicTableWiseTable(dynamic.DynamicTable):
  """A dynamic table whose hash table lives on replica `owner` only; every
  id is routed there (`tfde.groups.DynamicGroup` with an owner)."""

  def __init__(self, config, owner, communicator=None):
    communicator = communicator or comm_lib.current()
    check_owner(config, owner, communicator)
    self.owner = owner
    super().__init__(config, communicator)

  def holds_rows(self, replica):
    return replica == self.owner

  def owned_mask(self, ids, replica):
    return tf.fill(tf.shape(ids), replica == self.owner)

  def lookup_with_addresses(self, replica, ids, counts, training):
    if replica != self.owner:
      size = tf.size(ids)
      return (tf.zeros([size, self.embedding_dim]),
              tf.fill([size], tf.constant(-1, tf.int64)))
    return super().lookup_with_addresses(replica, ids, counts, training)

  def apply_gradient(self, replica, rows, grads, optimizer=None, grad_rows=None,
                     by_address=False, finite=None):
    if replica == self.owner:
      return super().apply_gradient(replica, rows, grads, optimizer, grad_rows,
                                    by_address, finite)
    return self.advance_step_without_rows(replica, rows, grads, optimizer, finite)
