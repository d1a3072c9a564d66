"""Table-row-wise tables: a static table's rows spread over a few replicas
(its owners, typically one worker's devices), row `i` on
`owners[i % k]` at local row `i // k`; the other replicas hold none of it
and send its ids there. With every replica an owner it is a row-wise table;
with one, a table-wise one.

>>> import tfde
>>> config = tfde.TableConfig(name="items", vocabulary_size=10,
...                           embedding_dim=4, optimizer="adagrad")
>>> table = tfde.tables.TableRowWiseTable(config, owners=[0])   # 1 replica
>>> table.owner, table.full_table().shape, sorted(table.state())
((0,), (10, 4), ['slot_accumulator', 'step', 'table'])

Its state is the same whole table as every other kind's, so checkpoints
move between kinds, owners and replica counts. Every replica keeps the
step counter (its group's exchange stamp, Adam's bias correction). Its ids
travel with its group's, fused to their owners
(`sharding.FusedGroupLayout` with a list of owners), so it shares one
exchange with the row-wise and table-wise tables of its width. Dynamic
tables are not split this way (a dynamic table's ids go to `id % N`, or
whole to one owner: `DynamicTableWiseTable`).
"""

import numpy as np
import tensorflow as tf

from tfde import initializers
from tfde import ops
from tfde import sharding
from tfde.tables import base
from tfde.tables import sharded
from tfde.tables import table_wise


def check_owners(config, owners, communicator):
  n = communicator.num_replicas
  if (not owners or len(set(owners)) != len(owners) or
      any(not isinstance(o, (int, np.integer)) or isinstance(o, bool) or not 0 <= o < n
          for o in owners)):
    raise ValueError(f"table {config.name!r}: owners must be distinct replicas "
                     f"in [0, {n}), got {owners!r}")


class TableRowWiseTable(table_wise.OwnedRows, sharded.ShardedTable):
  """A static table whose rows are spread over the replicas `owners`.

  Args:
    config: the table's `TableConfig` (static).
    owners: the replicas holding its rows, in order: row i lives on
      owners[i % len(owners)].
    communicator: as `ShardedTable`'s.

  Attributes:
    owner: the owners, as a tuple (a table-wise table's `owner` is one
      replica; groups fuse either, `tfde.groups.StaticGroup`).
  """

  def __init__(self, config, owners, communicator=None):
    if config.is_dynamic:
      raise ValueError(f"table {config.name!r} is dynamic; table_row_wise applies "
                       "to static tables (use row_wise or table_wise)")
    base.Table.__init__(self, config, communicator)
    owners = list(owners)
    check_owners(config, owners, self.comm)
    owners = [int(o) for o in owners]
    self.owner = tuple(owners)
    self.replicated = False
    self.num_shards = self.comm.num_replicas
    self._split = len(owners)
    self.rows_per_shard = sharding.rows_per_shard(config.vocabulary_size, self._split)
    self._make_owned_shards("table_row_wise", lambda replica: initializers.shard_value(
        config, self._split, self.owner.index(replica)))

  def holds_rows(self, replica):
    return replica in self.owner

  def _rounding(self, replica, rows):
    if self.config.dtype == "float32":
      return None
    seed, k, position = self.config.seed, self._split, self.owner.index(replica)

    def noise_of(indices, step):
      global_rows = tf.cast(indices, tf.int64) * k + position
      return ops.rounding_noise(seed, step, global_rows, self.embedding_dim)
    return noise_of

  # ---- whole-table state: the owners' shards interleaved

  def _gathered(self, key):
    variables_by_replica, width = self._variables(key), self.state_width(key)
    # The owners' shards, in replica order, from every process (a
    # collective); the others send nothing.
    parts = {r: [variables_by_replica[r].read_value() if r in variables_by_replica
                 else tf.zeros([0, width], self.state_dtype(key))]
             for r in self.comm.local_replicas()}
    by_replica = tf.reshape(self.comm.concat_replica_values(parts)[0],
                            [self._split, self.rows_per_shard, width])
    in_replica_order = sorted(self.owner)
    shards = tf.gather(by_replica, [in_replica_order.index(o) for o in self.owner])
    full = tf.reshape(tf.transpose(shards, [1, 0, 2]),
                      [self.rows_per_shard * self._split, width])
    return full[:self.vocabulary_size]

  def _sharded(self, full):
    padding = self.rows_per_shard * self._split - self.vocabulary_size
    full = tf.reshape(tf.pad(full, [[0, padding], [0, 0]]),
                      [self.rows_per_shard, self._split, -1])
    return {r: full[:, self.owner.index(r)] for r in self.shards}

  def _global_ids(self, replica, local):
    return local * self._split + self.owner.index(replica)

  def _local_rows(self, replica, ids):
    mine = tf.equal(ids % self._split, self.owner.index(replica))
    return mine, tf.boolean_mask(ids, mine) // self._split
