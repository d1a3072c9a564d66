"""Malformed op calls, on the C++ kernels and on the pure-TF twins: index
dtypes never wrapped to int32 or truncated from floats, and the twins
refusing what the kernels refuse (ops and dynamic stores), with the same
message and no change."""

import numpy as np
import pytest
import tensorflow as tf

import tfde.ops

# ----------------------------------------------- index dtypes, never wrapped


def test_combine_refuses_an_int64_inverse_past_int32(op_backend):
  """2**32 + 1 was cast to int32 and read row 1."""
  rows = tf.constant([[1.0], [2.0]])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"inverse\[\D*1\D*\] =\D*4294967297\D*out of range"):
    tfde.ops.embedding_combine(rows, tf.constant([0, 2**32 + 1], tf.int64),
                               tf.constant([0, 2], tf.int64))


def test_int64_indices_in_range_are_accepted(op_backend):
  """Every index input takes int64 values as they are."""
  rows = tf.constant([[1.0], [2.0], [4.0]])
  splits = tf.constant([0, 2, 3], tf.int64)
  inverse = tf.constant([2, 0, 1], tf.int64)
  out = tfde.ops.embedding_combine(rows, inverse, splits)
  np.testing.assert_array_equal(out.numpy().ravel(), [5.0, 2.0])
  grad = tfde.ops.embedding_combine_grad(tf.constant([[1.0], [10.0]]), inverse, splits,
                                         None, tf.constant(3, tf.int64))
  np.testing.assert_array_equal(grad.numpy().ravel(), [1.0, 10.0, 1.0])
  bags = tfde.ops.bag_gradients(tf.constant([[1.0], [10.0]]), inverse, splits, None,
                                tf.constant(3, tf.int64))
  np.testing.assert_array_equal(tfde.ops.bag_gradients_dense(bags).numpy().ravel(),
                                [1.0, 10.0, 1.0])
  table = tf.Variable(tf.zeros([3, 1]))
  out = tfde.ops.combine_from_tables([table], tf.constant([0, 1, 2], tf.int64), [0],
                                     inverse, splits)
  np.testing.assert_array_equal(out.numpy().ravel(), [0.0, 0.0])
  tfde.ops.sparse_apply_sgd(table, tf.constant([2, 0], tf.int64), tf.constant([[1.0], [2.0]]),
                            1.0, grad_rows=tf.constant([1, 0], tf.int64))
  np.testing.assert_array_equal(table.numpy().ravel(), [-1.0, 0.0, -2.0])
  _, counts, _ = tfde.ops.partition_by_shard(tf.constant([1, 2, 3], tf.int64),
                                             tf.constant(2, tf.int64))
  np.testing.assert_array_equal(counts.numpy(), [1, 2])


def test_combine_grad_keeps_an_int64_num_unique(op_backend):
  """num_unique = 2**32 + 2 was cast to int32 and gave 2 rows."""
  grad = tfde.ops.embedding_combine_grad(tf.ones([2, 0]), tf.constant([0, 1]),
                                         tf.constant([0, 1, 2], tf.int64), None, 2**32 + 2)
  assert tuple(grad.shape) == (2**32 + 2, 0)


def test_partition_refuses_more_shards_than_int32(op_backend):
  """num_shards = 2**32 + 2 was cast to int32 and gave 2 shards."""
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"num_shards = 4294967298 is too large"):
    tfde.ops.partition_by_shard(tf.constant([1, 2, 3], tf.int64), 2**32 + 2)


@pytest.mark.parametrize("name,call", [
    ("inverse", lambda: tfde.ops.embedding_combine(
        tf.ones([2, 1]), [0.0, 1.7], tf.constant([0, 2], tf.int64))),
    ("inverse", lambda: tfde.ops.embedding_combine_grad(
        tf.ones([1, 1]), tf.constant([0.0]), tf.constant([0, 1], tf.int64), None, 1)),
    ("num_unique", lambda: tfde.ops.embedding_combine_grad(
        tf.ones([1, 1]), [0], tf.constant([0, 1], tf.int64), None, 1.0)),
    ("num_unique", lambda: tfde.ops.bag_gradients(
        tf.ones([1, 1]), [0], tf.constant([0, 1], tf.int64), None, 1.5)),
    ("num_shards", lambda: tfde.ops.partition_by_shard(tf.constant([1], tf.int64), 2.0)),
    ("ids", lambda: tfde.ops.unique_with_counts([1.0, 2.0])),
    ("ids", lambda: tfde.ops.check_id_range([1.0, 2.0], 5, "feature f (table t)")),
    ("ids", lambda: tfde.ops.sorted_unique_in_range([1.0, 2.0], 5)),
    ("rows", lambda: tfde.ops.gather_from_tables([tf.Variable(tf.ones([2, 1]))], [0.5], [0])),
    ("rows", lambda: tfde.ops.split_rows_by_table([0.5], [0])),
    ("indices", lambda: tfde.ops.sparse_apply_sgd(tf.Variable(tf.ones([2, 1])), [0.0],
                                                  tf.ones([1, 1]), 0.1)),
    ("grad_rows", lambda: tfde.ops.sparse_apply_sgd(
        tf.Variable(tf.ones([2, 1])), [0], tf.ones([1, 1]), 0.1, grad_rows=[0.0])),
    ("ids", lambda: tfde.ops.dynamic_store(tfde.ops.DynamicTableSpec(dim=1), "float_ids")
     .lookup([1.5], [1], 1, insert=True)),
])
def test_float_indices_are_a_type_error(op_backend, name, call):
  """A float index was cast (truncated): now a TypeError naming it."""
  with pytest.raises(TypeError, match=f"{name} must be an int32 or int64 tensor"):
    call()


# ------------------------------- the twins refuse what the kernels refuse


def _tables(*shapes):
  return [tf.Variable(tf.ones(shape)) for shape in shapes]


_I64 = lambda values: tf.constant(values, tf.int64)  # noqa: E731

# (what is wrong, the call, the message both backends give).
_REFUSED = [
    ("non-monotone bases", lambda: tfde.ops.split_rows_by_table(_I64([1, 7]), [5, 0]),
     r"bases must start at 0 and increase, got bases\[0\] = 5"),
    ("repeated base", lambda: tfde.ops.split_rows_by_table(_I64([1, 7]), [0, 0]),
     r"bases must start at 0 and increase, got bases\[1\] = 0"),
    ("one base for two tables",
     lambda: tfde.ops.gather_from_tables(_tables([3, 2], [3, 2]), _I64([0]), [0]),
     r"bases has 1 entries for 2 tables"),
    ("one base for two tables",
     lambda: tfde.ops.combine_from_tables(_tables([3, 2], [3, 2]), _I64([0]), [0],
                                          _I64([0]), _I64([0, 1])),
     r"bases has 1 entries for 2 tables"),
    ("tables of two widths",
     lambda: tfde.ops.gather_from_tables(_tables([3, 2], [3, 3]), _I64([0]), [0, 3]),
     r"table 1 has width 3 but table 0 has width 2"),
    ("a table short of its range",
     lambda: tfde.ops.gather_from_tables(_tables([2, 2], [3, 2]), _I64([0]), [0, 3]),
     r"table 0 has 2 rows but its range needs 3"),
    ("a row outside every table that no id reads",
     lambda: tfde.ops.combine_from_tables(_tables([3, 2]), _I64([0, 9]), [0], _I64([0]),
                                          _I64([0, 1])),
     r"rows\[1\] = 9 is outside every table"),
    ("rows not a vector",
     lambda: tfde.ops.gather_from_tables(_tables([3, 2]), _I64([[0]]), [0]),
     r"rows must be a vector, got shape \[1,1\]"),
    # A fuzz finding: the twin took an int32 gradient (empty or not).
    ("an int32 gradient of a combine",
     lambda: tfde.ops.embedding_combine_grad(tf.zeros([0, 2], tf.int32), _I64([]), _I64([0]),
                                             None, 3),
     r"int32"),
    ("rows of a combine not a matrix",
     lambda: tfde.ops.embedding_combine(tf.ones([3]), _I64([0]), _I64([0, 1])),
     r"rows must be a matrix, got shape \[3\]"),
    ("inverse not a vector",
     lambda: tfde.ops.embedding_combine(tf.ones([3, 2]), _I64([[0]]), _I64([0, 1])),
     r"inverse, row_splits and weights must be vectors, got shapes \[1,1\], \[2\], \[0\]"),
    ("weights not a vector",
     lambda: tfde.ops.embedding_combine(tf.ones([3, 2]), _I64([0]), _I64([0, 1]),
                                        tf.ones([1, 1])),
     r"must be vectors, got shapes \[1\], \[2\], \[1,1\]"),
    ("gradient rows but not samples",
     lambda: tfde.ops.embedding_combine_grad(tf.ones([3, 2]), _I64([0]), _I64([0, 1]), None, 1),
     r"grad has 3 rows but row_splits describes 1 samples"),
    ("a negative num_unique",
     lambda: tfde.ops.embedding_combine_grad(tf.ones([1, 2]), _I64([0]), _I64([0, 1]), None,
                                             -1),
     r"num_unique must be >= 0, got -1"),
    ("an unknown combiner",
     lambda: tfde.ops.bag_gradients(tf.ones([1, 2]), _I64([0]), _I64([0, 1]), None, 1, "max"),
     r"combiner|sum, mean, sqrtn"),
    ("ids not a vector", lambda: tfde.ops.partition_by_shard(_I64([[1, 2]]), 2),
     r"ids must be a vector, got shape \[1,2\]"),
    ("ids not a vector", lambda: tfde.ops.unique_with_counts(_I64([[1, 2]])),
     r"ids must be a vector, got shape \[1,2\]"),
    ("ids of a check not a vector",
     lambda: tfde.ops.check_id_range(_I64([[1, 2]]), 5, "feature f (table t)"),
     r"feature f \(table t\): ids must be a vector, got shape \[1,2\]"),
    ("ids of a sorted dedup not a vector",
     lambda: tfde.ops.sorted_unique_in_range(_I64([[1, 2]]), 5),
     r"ids must be a vector, got shape \[1,2\]"),
    ("rows of a stamp not a vector",
     lambda: tfde.ops.stamp_rows(tf.Variable(tf.zeros([3], tf.int64)), _I64([[1]]), 2),
     r"rows must be a vector, got shape \[1,1\]"),
    ("num_shards not a scalar", lambda: tfde.ops.partition_by_shard(_I64([1]), _I64([2])),
     r"num_shards must be a scalar, got shape \[1\]"),
    ("a gradient vector",
     lambda: tfde.ops.sparse_apply_sgd(*_tables([3, 2]), _I64([0]), tf.ones([2]), 0.1),
     r"grad must be a matrix, got shape \[2\]"),
    ("a gradient of another width",
     lambda: tfde.ops.sparse_apply_sgd(*_tables([3, 2]), _I64([0]), tf.ones([1, 3]), 0.1),
     r"grad has width 3 but the table has width 2"),
    ("fewer grad_rows than indices",
     lambda: tfde.ops.sparse_apply_sgd(*_tables([3, 2]), _I64([0, 1]), tf.ones([2, 2]), 0.1,
                                       grad_rows=_I64([0])),
     r"grad has 2 rows and grad_rows 1 entries but there are 2 indices"),
    ("a slot shaped unlike its table",
     lambda: tfde.ops.sparse_apply_adagrad(*_tables([3, 2], [4, 2]), _I64([0]), tf.ones([1, 2]),
                                           0.1, 1e-7),
     r"slot variable .* has shape \[4,2\] but the table has \[3,2\]"),
    ("a learning rate that is not a scalar",
     lambda: tfde.ops.sparse_apply_sgd(*_tables([3, 2]), _I64([0]), tf.ones([1, 2]),
                                       [0.1, 0.2]),
     r"learning_rate must be a scalar, got shape \[2\]"),
]


@pytest.mark.parametrize("what,call,pattern", _REFUSED, ids=[c[0] for c in _REFUSED])
def test_both_backends_refuse(op_backend, what, call, pattern):
  """Each case was refused by the kernel and accepted (or failed otherwise)
  on the twin: both give the kernel's InvalidArgumentError."""
  del what
  with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
    call()


def _dynamic_store_with_rows(slots=()):
  store = tfde.ops.dynamic_store(tfde.ops.DynamicTableSpec(dim=2, slot_initial_values=slots,
                                                           admit_after=2), "refusals")
  store.lookup(_I64([1, 2, 3, 4]), _I64([2, 2, 2, 1]), 1, insert=True)
  return store


_REFUSED_BY_STORES = [
    ("one count for three ids",
     lambda s: s.import_(_I64([1, 2, 3]), tf.ones([3, 1, 2]), _I64([1]), _I64([1, 1, 1]),
                         _I64([]), _I64([]), _I64([])),
     r"counts has 1 entries for 3 ids"),
    ("one step for three ids",
     lambda s: s.import_(_I64([1, 2, 3]), tf.ones([3, 1, 2]), _I64([1, 1, 1]), _I64([1]),
                         _I64([]), _I64([]), _I64([])),
     r"last_seen has 1 entries for 3 ids"),
    ("pending counts short",
     lambda s: s.import_(_I64([1]), tf.ones([1, 1, 2]), _I64([1]), _I64([1]), _I64([5, 6]),
                         _I64([1]), _I64([1, 1])),
     r"pending_counts has 1 entries for 2 pending ids"),
    ("ids not a vector",
     lambda s: s.import_(_I64([[1]]), tf.ones([1, 1, 2]), _I64([1]), _I64([1]), _I64([]),
                         _I64([]), _I64([])),
     r"ids must be a vector, got shape \[1,1\]"),
    ("a repeated id",
     lambda s: s.import_(_I64([1, 1]), tf.ones([2, 1, 2]), _I64([1, 1]), _I64([1, 1]),
                         _I64([]), _I64([]), _I64([])),
     r"ids\[1\] = 1 repeats ids\[0\]"),
    # Fuzz findings (issue 18): no export lists an id twice, nor an id both
    # as a row and as pending; both backends once took either.
    ("a repeated pending id",
     lambda s: s.import_(_I64([1]), tf.ones([1, 1, 2]), _I64([1]), _I64([1]), _I64([5, 6, 5]),
                         _I64([1, 1, 1]), _I64([1, 1, 1])),
     r"pending_ids\[2\] = 5 repeats pending_ids\[0\]"),
    ("a pending id that has a row",
     lambda s: s.import_(_I64([1, 7]), tf.ones([2, 1, 2]), _I64([1, 1]), _I64([1, 1]),
                         _I64([5, 7]), _I64([1, 1]), _I64([1, 1])),
     r"pending_ids\[1\] = 7 also has a row \(ids\[1\]\)"),
    ("pending counts not a vector",
     lambda s: s.import_(_I64([1]), tf.ones([1, 1, 2]), _I64([1]), _I64([1]), _I64([5]),
                         _I64([[1]]), _I64([1])),
     r"pending_counts must be a vector, got shape \[1,1\]"),
    ("counts of shape [n, 1]", lambda s: s.lookup(_I64([1, 2]), _I64([[1], [1]]), 2, True),
     r"counts must be a vector, got shape \[2,1\]"),
    ("counts short of the ids", lambda s: s.lookup(_I64([1, 2]), _I64([1]), 2, insert=True),
     r"counts has 1 entries but there are 2 ids"),
    ("a step that is not a scalar", lambda s: s.lookup(_I64([1]), _I64([1]), _I64([2]), True),
     r"step must be a scalar, got shape \[1\]"),
    ("an optimizer with other slots",
     lambda s: s.apply("adam", _I64([1]), tf.ones([1, 2]), [0.1, 0.9, 0.99, 1e-7, 1.0]),
     r"the table keeps 0 optimizer slots but this optimizer needs 2"),
    ("gradient rows but not ids", lambda s: s.apply("sgd", _I64([1, 2]), tf.ones([1, 2]), [0.1]),
     r"grad has 1 rows and grad_rows 0 entries but there are 2 ids"),
    ("a learning rate that is not a scalar",
     lambda s: s.apply("sgd", _I64([1]), tf.ones([1, 2]), [[0.1, 0.2]]),
     r"learning_rate must be a scalar, got shape \[2\]"),
    ("a repeated address",
     lambda s: s.apply("sgd", _I64([-1, 0, 0]), tf.ones([3, 2]), [0.1], by_address=True),
     r"addresses\[2\] = 0 repeats addresses\[1\]"),
    ("a step that is not a scalar", lambda s: s.evict(_I64([2]), 1, 0),
     r"step must be a scalar, got shape \[1\]"),
]


@pytest.mark.parametrize("what,call,pattern", _REFUSED_BY_STORES,
                         ids=[c[0] for c in _REFUSED_BY_STORES])
def test_both_dynamic_stores_refuse_and_change_nothing(op_backend, what, call, pattern):
  """The twin's import took 1 count for 3 ids and left the store broken
  (its next export failed); each case is refused on both backends, and the
  store exports what it held before."""
  del what
  store = _dynamic_store_with_rows()
  before = [x.numpy() for x in store.export()]
  with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
    call(store)
  for old, new in zip(before, store.export()):
    np.testing.assert_array_equal(new.numpy(), old)


def test_a_row_budget_past_int32_evicts_nothing(op_backend):
  """A fuzz finding: the twin wrapped max_rows = 2**63 - 1 into a small
  budget and evicted a row."""
  store = _dynamic_store_with_rows()
  before = [x.numpy() for x in store.export()]
  assert store.evict(_I64(9), 0, 2**63 - 1).numpy().tolist() == []
  for old, new in zip(before, store.export()):
    np.testing.assert_array_equal(new.numpy(), old)
