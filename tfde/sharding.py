"""Where a table's rows live: row `id` of a table sharded over N replicas is
on replica `id % N`, at local row `id // N`.

Every shard allocates `rows_per_shard(V, N) = ceil(V / N)` rows, so shards
are interchangeable in shape; the last rows of some shards are padding
(global row >= V) that no valid id reaches.

>>> from tfde import sharding
>>> sharding.rows_per_shard(10, 4)
3
>>> sharding.global_rows(10, 4, shard=2).tolist()
[2, 6]
>>> sharding.owner_and_local_row(7, 4)
(3, 1)
"""

import numpy as np


def rows_per_shard(vocabulary_size, num_shards):
  if num_shards <= 0:
    raise ValueError(f"num_shards must be positive, got {num_shards}")
  return -(-vocabulary_size // num_shards)


def global_rows(vocabulary_size, num_shards, shard):
  """The global rows held by `shard`, in local-row order."""
  return np.arange(shard, vocabulary_size, num_shards, dtype=np.int64)


def owner_and_local_row(global_row, num_shards):
  return global_row % num_shards, global_row // num_shards


def shard_table(full, num_shards):
  """Splits a [V, D] array into N padded [ceil(V/N), D] shards."""
  full = np.asarray(full)
  per_shard = rows_per_shard(full.shape[0], num_shards)
  shards = []
  for shard in range(num_shards):
    rows = full[shard::num_shards]
    padded = np.zeros((per_shard,) + full.shape[1:], full.dtype)
    padded[:len(rows)] = rows
    shards.append(padded)
  return shards


def unshard_table(shards, vocabulary_size):
  """Inverse of `shard_table`: N shards back to the [V, D] table."""
  num_shards = len(shards)
  first = np.asarray(shards[0])
  full = np.zeros((vocabulary_size,) + first.shape[1:], first.dtype)
  for shard, values in enumerate(shards):
    rows = global_rows(vocabulary_size, num_shards, shard)
    full[rows] = np.asarray(values)[:len(rows)]
  return full


class FusedGroupLayout:
  """Tables of one width that share an exchange.

  A row-wise table t's local rows occupy [base[t], base[t] +
  rows_per_shard[t]) of a fused local row space. Its id `i` is sent as the
  fused id `i + N * base[t]`: the fused id has the same owner (`% N`) and
  its quotient `// N` is the fused local row, so one partition serves all.

  A table with an owner (`owners[t]`, table-wise: the whole table on one
  replica) holds all its V rows on that replica only: id `i` is sent as
  `(base + i) * N + owner`, whose owner is `owner` and whose quotient is
  its local row there. A table with several owners (`owners[t]` a list of
  k replicas, table-row-wise: its rows spread over one worker's replicas)
  holds row `i` on `owners[t][i % k]` at local row `i // k`, sent as
  `(base on that owner + i // k) * N + that owner`. Row-wise tables come
  first, at the same bases on every replica; each replica's owned tables
  follow at bases of its own (`bases_on(replica)`), so no replica reserves
  rows it does not hold.

  >>> layout = FusedGroupLayout([10, 4], 2, owners=[None, 1])
  >>> layout.fused_ids(0, np.array([3])), layout.fused_ids(1, np.array([2]))
  (array([3]), array([15]))
  >>> layout.tables_on(0), layout.tables_on(1), layout.bases_on(1)
  ([0], [0, 1], [0, 5])
  >>> two_shared = FusedGroupLayout([10, 4, 5], 2, owners=[None, None, [1]])
  >>> two_shared.id_offset(1), two_shared.bases_on(0), two_shared.bases_on(1)
  (10, [0, 5], [0, 5, 7])
  >>> split = FusedGroupLayout([6, 5], 4, owners=[[2, 3], 3])
  >>> split.fused_ids(0, np.array([0, 1, 4, 5])).tolist()   # local rows 0, 0, 2, 2
  [2, 3, 10, 11]
  >>> split.tables_on(3), split.bases_on(3), split.fused_ids(1, np.array([0])).tolist()
  ([0, 1], [0, 3], [15])
  """

  def __init__(self, vocabulary_sizes, num_shards, owners=None):
    self.num_shards = num_shards
    owners = [o if o is None or isinstance(o, (int, np.integer)) else [int(x) for x in o]
              for o in (owners or [None] * len(vocabulary_sizes))]
    self.owners = owners
    self.rows_per_shard = [
        rows_per_shard(v, num_shards) if o is None else
        v if isinstance(o, (int, np.integer)) else rows_per_shard(v, len(o))
        for v, o in zip(vocabulary_sizes, owners)]
    if all(o is None for o in owners):
      self.base = np.concatenate([[0], np.cumsum(self.rows_per_shard)[:-1]]).astype(np.int64)
      self.total_rows = int(sum(self.rows_per_shard))
      self._on = {r: list(range(len(owners))) for r in range(num_shards)}
      self._bases = {r: [int(b) for b in self.base] for r in range(num_shards)}
      return
    shared = [t for t, o in enumerate(owners) if o is None]
    shared_rows = int(sum(self.rows_per_shard[t] for t in shared))
    self.base = np.zeros(len(owners), np.int64)
    # (table, owner) -> the table's local base there, for tables with owners.
    self._owned_base = {}
    self._on, self._bases = {}, {}
    for replica in range(num_shards):
      on = shared + [t for t, o in enumerate(owners) if self._holds(o, replica)]
      self._on[replica] = on
      self._bases[replica] = []
      start = 0
      for t in on:
        if owners[t] is None or isinstance(owners[t], (int, np.integer)):
          # Row-wise tables come first, at the same bases everywhere; a
          # table-wise table's base is its one owner's.
          self.base[t] = start
        if owners[t] is not None:
          self._owned_base[(t, replica)] = start
        self._bases[replica].append(start)
        start += self.rows_per_shard[t]
    self.total_rows = max(
        [sum(self.rows_per_shard[t] for t in on) for on in self._on.values()] +
        [shared_rows])

  @staticmethod
  def _holds(owner, replica):
    if owner is None or isinstance(owner, (int, np.integer)):
      return owner == replica
    return replica in owner

  def id_offset(self, table_index):
    """The offset of a row-wise table's ids (fused id = id + offset)."""
    if self.owners[table_index] is not None:
      raise ValueError("a table with an owner is fused by fused_ids")
    return int(self.base[table_index]) * self.num_shards

  def fused_ids(self, table_index, ids):
    """Table `table_index`'s ids as fused ids (tensors or numpy arrays)."""
    owner = self.owners[table_index]
    if owner is None:
      return ids + self.id_offset(table_index)
    if isinstance(owner, (int, np.integer)):
      return ids * self.num_shards + (int(self.base[table_index]) * self.num_shards +
                                      owner)
    k = len(owner)
    # Per position in the owners' list: the owner, and its fused offset.
    offsets = [self._owned_base[(table_index, o)] * self.num_shards + o for o in owner]
    if isinstance(ids, np.ndarray):
      return (ids // k) * self.num_shards + np.asarray(offsets, ids.dtype)[ids % k]
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return ((ids // k) * self.num_shards +
            tf.gather(tf.constant(offsets, ids.dtype), ids % k))

  def tables_on(self, replica):
    """Indices of the tables with rows on `replica`, in local row order."""
    return self._on[replica]

  def bases_on(self, replica):
    """The local bases of `tables_on(replica)`."""
    return self._bases[replica]
