"""The twin of a dynamic table shard (kernels/dynamic_table.h and its ops): stock
TF hash tables and variables with the kernel resource's behaviour.

>>> import tensorflow as tf
>>> from tfde.ops.types import DynamicTableSpec
>>> from tfde.ops.dynamic_store_twin import DynamicStoreTwin
>>> store = DynamicStoreTwin(DynamicTableSpec(dim=2), "doc")
>>> rows, addresses = store.lookup(tf.constant([5, 9], tf.int64),
...                                tf.constant([1, 1], tf.int64), 1, insert=True)
>>> addresses.numpy().tolist(), int(store.stats()[0])
([0, 1], 2)
"""

import tensorflow as tf

from tfde import tf_internals
from tfde.ops.checks import assert_that
from tfde.ops.checks import check
from tfde.ops.checks import check_rank
from tfde.ops.checks import check_update_inputs
from tfde.ops.checks import dim
from tfde.ops.checks import equal
from tfde.ops.checks import first_index_where
from tfde.ops.checks import first_offender
from tfde.ops.checks import first_repeat
from tfde.ops.checks import index_tensor
from tfde.ops.checks import num_elements
from tfde.ops.checks import shape_parts
from tfde.ops.reference import NUM_SLOTS
from tfde.ops.reference import ROW_UPDATES
from tfde.ops.reference import check_dynamic_update_kind
from tfde.ops.reference import dynamic_initial_values
from tfde.ops.reference import embeddings_or_default
from tfde.ops.reference import scalar_checks
from tfde.ops.reference import select_rows


def _check_unique_ids(ids, what="ids", advice="; sum the gradients of an id before "
                      "applying them"):
  repeat, earlier = first_repeat(ids)
  return assert_that(tf.equal(tf.size(repeat), 0), f"{what}[", repeat, "] = ",
                     tf.gather(ids, repeat), f" repeats {what}[", tf.gather(earlier, repeat),
                     "]" + advice)


def _check_pending_ids(ids, pending_ids):
  """The kernel's CheckImportIds past the rows' own repeats: a pending id
  is no row's id and appears once (an export lists each id once)."""
  both = tf.concat([ids, pending_ids], 0)
  n, k = tf.size(both), tf.size(ids)
  _, inverse = tf.unique(both, out_idx=tf.int32)
  positions = tf.range(n)
  earlier = tf.gather(tf.math.unsorted_segment_min(positions, inverse, n), inverse)
  repeat = first_index_where((earlier != positions) & (positions >= k))
  at = tf.gather(earlier, repeat)  # where the pending id appeared first
  none = tf.equal(tf.size(repeat), 0)
  place, pending_id = repeat - tf.cast(k, tf.int64), tf.gather(both, repeat)
  return [
      assert_that(none | tf.reduce_all(at >= k), "pending_ids[", place, "] = ", pending_id,
                  " also has a row (ids[", at, "]); an id is either a row or pending"),
      assert_that(none | tf.reduce_all(at < k), "pending_ids[", place, "] = ", pending_id,
                  " repeats pending_ids[", at - k, "]")]


def _int64(value, name):
  """An integer input, widened to int64 (a float is a TypeError)."""
  return tf.cast(index_tensor(value, name), tf.int64)


def _find(table, keys):
  """A tf.lookup table's values for keys, as a vector of known rank."""
  return tf.reshape(table.lookup(keys), [-1])


def _ops_of(updates):
  """The ops of variable and table updates. A graph-mode assign returns a
  lazy read whose graph element is a read, not the assign: depending on it
  does not order later reads after the write."""
  if tf.executing_eagerly():
    return []  # eager ops run in program order
  return [u if isinstance(u, tf.Operation) else u.op for u in updates
          if u is not None]



class DynamicStoreTwin:
  """A dynamic table shard of stock TF: `tf.lookup` hash tables from id to
  row and from id to pending sightings, and variables of rows kept compact
  (eviction rebuilds them). Same behaviour as the kernel's resource.
  """

  _count = 0

  def __init__(self, spec, name, device=None):
    self.spec = spec
    s, d = spec.num_slots, spec.dim
    # Unique names: a TF1 graph shares a hash table by node name.
    DynamicStoreTwin._count += 1
    name = f"{name}_{DynamicStoreTwin._count}"
    with tf.device(device):
      self._index = tf.lookup.experimental.MutableHashTable(
          tf.int64, tf.int64, default_value=-1, name=f"{name}_index")
      self._pending_count = tf.lookup.experimental.MutableHashTable(
          tf.int64, tf.int64, default_value=0, name=f"{name}_pending_count")
      self._pending_last = tf.lookup.experimental.MutableHashTable(
          tf.int64, tf.int64, default_value=-1, name=f"{name}_pending_last")
      # Outside any strategy's variable creator: a shard's storage must not
      # become a mirrored variable.
      self._values = tf_internals.local_variable(tf.zeros([0, s, d]), f"{name}_values",
                                                 device, shape=[None, s, d])
      self._keys, self._counts, self._last = [
          tf_internals.local_variable(tf.zeros([0], tf.int64), f"{name}_{what}", device,
                                      shape=[None])
          for what in ("keys", "counts", "last_seen")]

  def _new_rows(self, ids):
    """[k, slots, dim]: initial embeddings and slot values of new rows."""
    init = dynamic_initial_values(self.spec, ids)
    slots = [tf.fill(tf.shape(init), tf.constant(v, tf.float32))
             for v in self.spec.slot_initial_values]
    return tf.stack([init] + slots, axis=1)

  def _embeddings_of(self, ids):
    return embeddings_or_default(self.spec, ids, _find(self._index, ids),
                                 self._values[:, 0])

  def lookup(self, ids, counts, step, insert):
    """(rows of `ids`, the addresses of their rows after the lookup, -1 for
    ids without a row). With `insert`, each id counts `counts[i]` sightings
    at `step` and may be admitted."""
    ids = tf.reshape(_int64(ids, "ids"), [-1])
    step = _int64(step, "step")
    checks = check_rank(step, 0, "step")
    if not insert:
      with tf.control_dependencies(checks):
        return self._embeddings_of(ids), _find(self._index, ids)
    counts = tf.zeros([0], tf.int64) if counts is None else _int64(counts, "counts")
    checks += check_rank(counts, 1, "counts")
    checks += check(equal(num_elements(counts), dim(ids, 0)), "counts has ",
                    num_elements(counts), " entries but there are ", dim(ids, 0), " ids")
    with tf.control_dependencies(checks):
      unique, inverse = tf.unique(ids, out_idx=tf.int32)
      seen_now = tf.math.unsorted_segment_sum(counts, inverse,
                                              tf.size(unique))
    rows = _find(self._index, unique)
    present = rows >= 0
    known_rows = tf.boolean_mask(rows, present)
    updates = [
        self._counts.scatter_add(tf.IndexedSlices(tf.boolean_mask(seen_now, present),
                                                  known_rows)),
        self._last.scatter_max(tf.IndexedSlices(
            tf.fill(tf.shape(known_rows), step), known_rows)),
    ]
    new_ids = tf.boolean_mask(unique, ~present)
    seen = _find(self._pending_count, new_ids) + tf.boolean_mask(seen_now, ~present)
    admit = seen >= self.spec.admit_after
    admitted, admitted_seen = tf.boolean_mask(new_ids, admit), tf.boolean_mask(seen, admit)
    waiting, waiting_seen = tf.boolean_mask(new_ids, ~admit), tf.boolean_mask(seen, ~admit)
    with tf.control_dependencies(_ops_of(updates)):
      # One read of the ids: the new rows' numbers and the grown id list
      # must agree (a TF1 graph could run a second read after the write).
      keys = tf.convert_to_tensor(self._keys)
      base = tf.shape(keys, out_type=tf.int64)[0]
      k = tf.size(admitted, out_type=tf.int64)
      updates += [
          self._values.assign(tf.concat([self._values, self._new_rows(admitted)], 0)),
          self._keys.assign(tf.concat([keys, admitted], 0)),
          self._counts.assign(tf.concat([self._counts, admitted_seen], 0)),
          self._last.assign(tf.concat([self._last, tf.fill([k], step)], 0)),
          self._index.insert(admitted, base + tf.range(k, dtype=tf.int64)),
          self._pending_count.remove(admitted),
          self._pending_last.remove(admitted),
          self._pending_count.insert(waiting, waiting_seen),
          self._pending_last.insert(waiting, tf.fill(tf.shape(waiting), step)),
      ]
    with tf.control_dependencies(_ops_of(updates)):
      return self._embeddings_of(ids), _find(self._index, ids)

  def apply(self, kind, ids, grad, scalars, grad_rows=None, by_address=False):
    """Applies `kind`'s update to the rows of `ids` (unique); ids without a
    row are skipped. With `by_address`, `ids` are row addresses: -1 is
    skipped, any other must be a live row. Returns how many rows changed."""
    check_dynamic_update_kind(kind)
    ids = tf.reshape(_int64(ids, "ids"), [-1])
    grad = tf.cast(grad, tf.float32)
    if grad_rows is not None:
      grad_rows = index_tensor(grad_rows, "grad_rows")
    # The kernel's order: the scalars, the inputs' shapes, then the table.
    checks = scalar_checks(kind, scalars)
    checks += check_update_inputs(ids, grad, grad_rows, "ids")
    with tf.control_dependencies(checks):
      grad = select_rows(grad, grad_rows, tf.size(ids))
    slots = NUM_SLOTS[kind]
    checks += check(self.spec.num_slots - 1 == slots,
                    f"the table keeps {self.spec.num_slots - 1} optimizer slots but this "
                    f"optimizer needs {slots}")
    checks += check(equal(dim(grad, 1), self.spec.dim), "grad has width ", dim(grad, 1),
                    f" but the table has width {self.spec.dim}")
    # In a TF1 graph nothing orders variable reads: read the table only
    # once the ids (which may come from this step's lookup) exist.
    with tf.control_dependencies(checks + [ids, grad]):
      return self._apply(kind, ids, grad, scalars, by_address)

  def _apply(self, kind, ids, grad, scalars, by_address):
    checks = []
    if by_address:
      size = tf.shape(self._keys, out_type=tf.int64)[0]
      has_row = tf.not_equal(ids, -1)
      # Ids without a row (-1) never repeat: each stands in as its own
      # negative number, so a repeat is named by its place in `ids`.
      distinct = tf.where(has_row, ids, -2 - tf.range(tf.size(ids, out_type=tf.int64)))
      checks.append(_check_unique_ids(distinct, "addresses"))
      none, i, value = first_offender(has_row & ((ids < 0) | (ids >= size)), ids)
      checks.append(assert_that(
          none, "addresses[", i, "] = ", value,
          " is not a row of the table (addresses come from this step's lookup; "
          "-1 marks an id without a row)"))
    else:
      checks.append(_check_unique_ids(ids))
    with tf.control_dependencies(checks):
      rows = ids if by_address else _find(self._index, ids)
      present = rows >= 0
      rows = tf.boolean_mask(rows, present)
      current = tf.gather(self._values, rows)
      new = ROW_UPDATES[kind]([current[:, s] for s in range(self.spec.num_slots)],
                              tf.boolean_mask(grad, present), *scalars)
      update = self._values.scatter_nd_update(rows[:, None], tf.stack(new, axis=1))
    with tf.control_dependencies(_ops_of([update])):
      return tf.size(rows, out_type=tf.int64)

  def export(self, seen_after=None):
    """Every row sorted by id (with `seen_after`, only the rows last seen
    after that step), and the pending ids whole."""
    order = tf.argsort(self._keys, stable=True)
    if seen_after is not None:
      seen_after = _int64(seen_after, "seen_after")
      checks = check_rank(seen_after, 0, "seen_after")
      with tf.control_dependencies(checks):
        # As the kernel: the lowest int64 keeps every row.
        keep = tf.logical_or(tf.gather(self._last, order) > seen_after,
                             tf.equal(seen_after, tf.int64.min))
        order = tf.boolean_mask(order, keep)
    pending_ids, pending_counts = [tf.reshape(x, [-1]) for x in
                                   self._pending_count.export()]
    pending_order = tf.argsort(pending_ids, stable=True)
    pending_ids = tf.gather(pending_ids, pending_order)
    return (tf.gather(self._keys, order), tf.gather(self._values, order),
            tf.gather(self._counts, order), tf.gather(self._last, order),
            pending_ids, tf.gather(pending_counts, pending_order),
            _find(self._pending_last, pending_ids))

  def import_(self, ids, values, counts, last_seen, pending_ids, pending_counts,
              pending_last_seen):
    """Replaces the contents with an export's, all checked first, as the
    kernel does: nothing is written when any check fails."""
    ids = _int64(ids, "ids")
    values = tf.cast(values, tf.float32)
    counts, last_seen = _int64(counts, "counts"), _int64(last_seen, "last_seen")
    pending_ids = _int64(pending_ids, "pending_ids")
    pending_counts = _int64(pending_counts, "pending_counts")
    pending_last_seen = _int64(pending_last_seen, "pending_last_seen")
    checks = check_rank(ids, 1, "ids")
    k = dim(ids, 0)
    want = [k, self.spec.num_slots, self.spec.dim]
    if values.shape.is_fully_defined() and isinstance(k, int):
      fits = values.shape.as_list() == want
    else:
      fits = tf.logical_and(tf.equal(tf.rank(values), 3), tf.reduce_all(tf.equal(
          tf.shape(values, out_type=tf.int64), tf.cast(tf.stack(want), tf.int64))))
    checks += check(fits, "values have shape ", *shape_parts(values),
                    " but the table needs [", k, f", {self.spec.num_slots}, "
                    f"{self.spec.dim}] (ids, slots, dim)")
    for what, t in [("counts", counts), ("last_seen", last_seen), ("pending_ids", pending_ids),
                    ("pending_counts", pending_counts),
                    ("pending_last_seen", pending_last_seen)]:
      checks += check_rank(t, 1, what)
    for what, t, total, of in [("counts", counts, k, "ids"), ("last_seen", last_seen, k, "ids"),
                               ("pending_counts", pending_counts, dim(pending_ids, 0),
                                "pending ids"),
                               ("pending_last_seen", pending_last_seen, dim(pending_ids, 0),
                                "pending ids")]:
      checks += check(equal(num_elements(t), total), f"{what} has ", num_elements(t),
                      " entries for ", total, f" {of}")
    checks.append(_check_unique_ids(ids, advice=""))
    checks += _check_pending_ids(ids, pending_ids)
    with tf.control_dependencies(checks):
      clear = [self._index.remove(self._index.export()[0]),
               self._pending_count.remove(self._pending_count.export()[0]),
               self._pending_last.remove(self._pending_last.export()[0])]
    with tf.control_dependencies(_ops_of(clear)):
      return tf.group(
          self._values.assign(values), self._keys.assign(ids),
          self._counts.assign(counts), self._last.assign(last_seen),
          self._index.insert(ids, tf.range(tf.size(ids, out_type=tf.int64))),
          self._pending_count.insert(pending_ids, pending_counts),
          self._pending_last.insert(pending_ids, pending_last_seen))

  def evict(self, step, max_unseen_steps, max_rows):
    """The kernel's eviction rules; returns the evicted ids, sorted."""
    step = _int64(step, "step")
    with tf.control_dependencies(check_rank(step, 0, "step")):
      step = tf.identity(step)
    # Each variable read once, before any write (see lookup).
    keys, last = tf.convert_to_tensor(self._keys), tf.convert_to_tensor(self._last)
    counts, values = tf.convert_to_tensor(self._counts), tf.convert_to_tensor(self._values)
    n = tf.shape(keys)[0]
    evict = tf.zeros([n], tf.bool)
    if max_unseen_steps > 0:
      evict = step - last >= max_unseen_steps
    if max_rows > 0:
      kept = tf.cast(tf.reshape(tf.where(~evict), [-1]), tf.int32)
      # Coldest first: fewest sightings, then least recent, then smallest id.
      order = tf.gather(kept, tf.argsort(tf.gather(keys, kept), stable=True))
      order = tf.gather(order, tf.argsort(tf.gather(last, order), stable=True))
      order = tf.gather(order, tf.argsort(tf.gather(counts, order), stable=True))
      # In int64: a budget past int32 (2**63 - 1: no budget at all) must
      # not wrap into a small one.
      excess = tf.maximum(tf.size(kept, out_type=tf.int64) - max_rows, 0)
      victims = order[:excess]
      evict = evict | tf.scatter_nd(victims[:, None], tf.ones_like(victims, tf.bool), [n])
    keep = tf.reshape(tf.where(~evict), [-1])
    evicted = tf.sort(tf.boolean_mask(keys, evict))
    kept_keys = tf.gather(keys, keep)
    updates = [self._index.remove(evicted)]
    with tf.control_dependencies(_ops_of(updates)):
      updates += [
          self._index.insert(kept_keys, tf.range(tf.size(keep, out_type=tf.int64))),
          self._values.assign(tf.gather(values, keep)),
          self._counts.assign(tf.gather(counts, keep)),
          self._last.assign(tf.gather(last, keep)),
          self._keys.assign(kept_keys)]
    if max_unseen_steps > 0:
      pending_ids = tf.reshape(self._pending_count.export()[0], [-1])
      stale = tf.boolean_mask(
          pending_ids, step - _find(self._pending_last, pending_ids) >= max_unseen_steps)
      updates += [self._pending_count.remove(stale), self._pending_last.remove(stale)]
    with tf.control_dependencies(_ops_of(updates)):
      return tf.identity(evicted)

  def stats(self):
    """[live rows, ids pending admission, estimated bytes held]."""
    size = tf.shape(self._keys, out_type=tf.int64)[0]
    pending = self._pending_count.size()
    row_bytes = 4 * self.spec.num_slots * self.spec.dim + 3 * 8
    # The hash tables' entries, at about 48 bytes each.
    return tf.stack([size, pending, size * (row_bytes + 48) + 2 * pending * 48])
