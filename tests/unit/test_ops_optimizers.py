"""The sparse optimizer updates (SGD, Adagrad, row-wise Adagrad, lazy Adam,
FTRL), from
gradient rows and from bag_gradients, on the C++ kernels and on the
pure-TF twins, against the Keras formulas in numpy; malformed updates
change nothing."""

import numpy as np
import pytest
import tensorflow as tf

import tfde.ops
from tests.support import oracles
from tests.support.op_inputs import SEEDS
from tests.support.op_inputs import combine_inputs
from tests.support.op_inputs import random_bags
from tests.support.op_inputs import seeded_bags

# ------------------------------------------------------------ optimizers

OPTIMIZERS = {
    "sgd": dict(learning_rate=0.3),
    "adagrad": dict(learning_rate=0.2, initial_accumulator_value=0.1, epsilon=1e-7),
    "rowwise_adagrad": dict(learning_rate=0.2, initial_accumulator_value=0.1, epsilon=1e-8),
    "adam": dict(learning_rate=0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-7),
    "ftrl": dict(learning_rate=0.1, learning_rate_power=-0.5,
                 initial_accumulator_value=0.1, l1=0.01, l2=0.02,
                 l2_shrinkage=0.03, beta=0.1),
}


def _apply(kind, table, slots, rows, grads, step, hp):
  rows = tf.convert_to_tensor(rows)
  grads = tf.convert_to_tensor(grads, tf.float32)
  if kind == "sgd":
    return tfde.ops.sparse_apply_sgd(table, rows, grads, hp["learning_rate"])
  if kind == "adagrad":
    return tfde.ops.sparse_apply_adagrad(table, slots[0], rows, grads,
                                         hp["learning_rate"], hp["epsilon"])
  if kind == "rowwise_adagrad":
    return tfde.ops.sparse_apply_rowwise_adagrad(table, slots[0], rows, grads,
                                                 hp["learning_rate"], hp["epsilon"])
  if kind == "adam":
    return tfde.ops.sparse_apply_lazy_adam(
        table, slots[0], slots[1], rows, grads, hp["learning_rate"],
        hp["beta_1"], hp["beta_2"], hp["epsilon"], step)
  return tfde.ops.sparse_apply_ftrl(
      table, slots[0], slots[1], rows, grads, hp["learning_rate"], hp["l1"],
      hp["l2"], hp["l2_shrinkage"], hp["beta"], hp["learning_rate_power"])


def _make_slots(kind, shape, hp):
  if kind == "adagrad":
    return [tf.Variable(tf.fill(shape, hp["initial_accumulator_value"]))]
  if kind == "rowwise_adagrad":
    return [tf.Variable(tf.fill([shape[0], 1], hp["initial_accumulator_value"]))]
  if kind == "adam":
    return [tf.Variable(tf.zeros(shape)), tf.Variable(tf.zeros(shape))]
  if kind == "ftrl":
    return [tf.Variable(tf.fill(shape, hp["initial_accumulator_value"])),
            tf.Variable(tf.zeros(shape))]
  return []


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("in_function", [False, True])
def test_optimizer_matches_keras_formulas(op_backend, kind, index_dtype,
                                          in_function):
  hp = OPTIMIZERS[kind]
  rng = np.random.default_rng(7)
  shape = (50, 6)
  start = rng.normal(size=shape).astype(np.float32)
  table = tf.Variable(start)
  slots = _make_slots(kind, shape, hp)
  reference = oracles.NumpyOptimizer(kind, shape, **hp)
  want = start.astype(np.float64)
  def apply_without_result(*args):
    _apply(*args)  # a tf.function may not return an Operation

  apply = tf.function(apply_without_result) if in_function else _apply
  touched = set()
  for step in range(1, 6):
    rows = rng.choice(shape[0], size=int(rng.integers(1, 20)), replace=False)
    touched.update(rows.tolist())
    grads = rng.normal(size=(len(rows), shape[1])).astype(np.float32)
    apply(kind, table, slots, rows.astype(index_dtype), grads, step, hp)
    reference.apply(want, rows, grads)
  np.testing.assert_allclose(table.numpy(), want, rtol=2e-5, atol=2e-6)
  for slot, want_slot in zip(slots, reference.slots):
    np.testing.assert_allclose(slot.numpy(), want_slot, rtol=2e-5, atol=2e-6)
  # Rows never touched keep their values exactly (lazy semantics).
  untouched = sorted(set(range(shape[0])) - touched)
  assert untouched
  np.testing.assert_array_equal(table.numpy()[untouched], start[untouched])


def _numpy_bag_index(inverse, ids, weights, combiner):
  """Per unique row, its ids in order: (segments, bags, coefficients)."""
  coefficients, bags = [], []
  for b, bag in enumerate(ids):
    w = np.ones(len(bag)) if weights is None else np.asarray(weights[b], np.float64)
    divisor = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[combiner]
    coefficients += list(w / divisor if divisor else np.zeros_like(w))
    bags += [b] * len(bag)
  order = np.argsort(inverse, kind="stable")
  segments = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=inverse.max(
      initial=-1) + 1))])
  return segments, np.array(bags)[order], np.array(coefficients)[order]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_bag_gradients_match_numpy(op_backend, seed, combiner):
  rng, dim, vocab, ids, weights = seeded_bags(seed)
  flat, splits, w = combine_inputs(ids, weights)
  unique, inverse, _ = tfde.ops.unique_with_counts(tf.constant(flat))
  grad = rng.normal(size=(len(ids), dim)).astype(np.float32)
  bags = tfde.ops.bag_gradients(tf.constant(grad), inverse, tf.constant(splits), w,
                                tf.size(unique), combiner)
  want_segments, want_bags, want_weights = _numpy_bag_index(inverse.numpy(), ids,
                                                            weights, combiner)
  np.testing.assert_array_equal(bags.segments.numpy(), want_segments)
  np.testing.assert_array_equal(bags.bags.numpy(), want_bags)
  np.testing.assert_allclose(bags.weights.numpy(), want_weights, rtol=1e-5, atol=1e-6)
  # What the bags stand for is the combine's gradient.
  dense = np.zeros((vocab, dim))
  np.add.at(dense, unique.numpy(), tfde.ops.bag_gradients_dense(bags).numpy())
  want_grad = oracles.combine_grad_dense(vocab, grad, ids, weights, combiner)
  np.testing.assert_allclose(dense, want_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_bag_index_of_a_large_batch_matches_numpy(op_backend, combiner):
  # Past 2^17 ids the kernel counts and places them in parallel blocks
  # (GroupByRowInParallel): each row's entries must still be its ids in order.
  rng = np.random.default_rng(17)
  batch, hot, vocab = 8192, 40, 30_000  # 327,680 ids, Zipf-skewed as a real batch
  ids = (rng.zipf(1.1, size=(batch, hot)) - 1) % vocab
  weights = rng.uniform(0.5, 2.0, size=(batch, hot)).astype(np.float32)
  unique, inverse = tfde.ops.sorted_unique_in_range(tf.constant(ids.ravel()), vocab)
  grad = rng.normal(size=(batch, 8)).astype(np.float32)
  bags = tfde.ops.bag_gradients(tf.constant(grad), inverse,
                                tf.range(0, batch * hot + 1, hot, dtype=tf.int64),
                                tf.constant(weights.ravel()), tf.size(unique), combiner)
  want_segments, want_bags, want_weights = _numpy_bag_index(inverse.numpy(), list(ids),
                                                            list(weights), combiner)
  np.testing.assert_array_equal(bags.segments.numpy(), want_segments)
  np.testing.assert_array_equal(bags.bags.numpy(), want_bags)
  np.testing.assert_allclose(bags.weights.numpy(), want_weights, rtol=1e-5, atol=1e-7)
  dense = np.zeros((vocab, 8))
  np.add.at(dense, unique.numpy(), tfde.ops.bag_gradients_dense(bags).numpy())
  want_grad = oracles.combine_grad_dense(vocab, grad, list(ids), list(weights), combiner)
  np.testing.assert_allclose(dense, want_grad, rtol=1e-4, atol=1e-4)


def _apply_from_bags(kind, table, slots, rows, bag_grads, step, hp, grad_rows=None):
  scalars = {"sgd": ["learning_rate"], "adagrad": ["learning_rate", "epsilon"],
             "rowwise_adagrad": ["learning_rate", "epsilon"],
             "adam": ["learning_rate", "beta_1", "beta_2", "epsilon"],
             "ftrl": ["learning_rate", "l1", "l2", "l2_shrinkage", "beta",
                      "learning_rate_power"]}[kind]
  values = [hp[k] for k in scalars] + ([step] if kind == "adam" else [])
  return tfde.ops.sparse_apply(kind, [table] + slots, tf.convert_to_tensor(rows),
                               bag_grads, values, grad_rows)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("split_tables", [False, True])
def test_optimizer_from_bags_matches_keras_formulas(op_backend, kind, split_tables):
  """The fused backward: rows updated from bags equal the Keras formulas on
  the numpy gradient; with split_tables, two tables share one set of bags
  (grad_rows), as a fused group's tables do."""
  hp = OPTIMIZERS[kind]
  rng = np.random.default_rng(11)
  shape = (40, 5)
  starts = [rng.normal(size=shape).astype(np.float32) for _ in range(2)]
  tables = [tf.Variable(s) for s in starts]
  slots = [_make_slots(kind, shape, hp) for _ in range(2)]
  oracles_ = [oracles.NumpyOptimizer(kind, shape, **hp) for _ in range(2)]
  want = [s.astype(np.float64) for s in starts]
  for step in range(1, 5):
    # Ids of a fused row space: table 0 owns [0, 40), table 1 [40, 80).
    vocab = 2 * shape[0] if split_tables else shape[0]
    ids, weights = random_bags(rng, batch=9, vocab=vocab, max_hot=6, weighted=True)
    flat, splits, w = combine_inputs(ids, weights)
    unique, inverse, _ = tfde.ops.unique_with_counts(tf.constant(flat))
    grad = rng.normal(size=(len(ids), shape[1])).astype(np.float32)
    bags = tfde.ops.bag_gradients(tf.constant(grad), inverse, tf.constant(splits), w,
                                  tf.size(unique), "mean")
    dense = oracles.combine_grad_dense(vocab, grad, ids, weights, "mean")
    u = unique.numpy()
    for t in range(2 if split_tables else 1):
      mine = np.flatnonzero((u >= t * shape[0]) & (u < (t + 1) * shape[0]))
      rows = u[mine] - t * shape[0]
      _apply_from_bags(kind, tables[t], slots[t], rows, bags, step, hp,
                       grad_rows=tf.constant(mine, tf.int32) if split_tables else None)
      oracles_[t].apply(want[t], rows, dense[u[mine]].astype(np.float32))
  for t in range(2 if split_tables else 1):
    np.testing.assert_allclose(tables[t].numpy(), want[t], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("field,value,pattern", [
    ("bags", [0, 3, 1], r"bags\[\D*1\D*\] =\D*3\D*out of range"),
    ("bags", [0, -1, 1], r"bags\[\D*1\D*\] =\D*-1\D*out of range"),
    ("segments", [0, 2, 1, 3], r"segments must be non-decreasing"),
    ("segments", [0, 1, 2, 2], r"segments\[-1\] =\D*2\D*must equal"),
    ("weights", [1.0, 1.0], r"bag_weights has\D*2\D*elements"),
])
def test_optimizer_from_bad_bags_changes_nothing(op_backend, kind, field, value, pattern):
  hp = OPTIMIZERS[kind]
  table = tf.Variable(tf.random.normal((6, 2), seed=1))
  slots = _make_slots(kind, (6, 2), hp)
  before = [v.numpy().copy() for v in [table] + slots]
  parts = dict(output_grad=tf.ones([3, 2]), segments=tf.constant([0, 1, 2, 3], tf.int64),
               bags=tf.constant([0, 1, 2], tf.int32), weights=tf.ones([3]))
  parts[field] = tf.constant(value, parts[field].dtype)
  with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
    _apply_from_bags(kind, table, slots, np.array([4, 0, 2]), tfde.ops.BagGradients(**parts),
                     1, hp)
  for var, old in zip([table] + slots, before):
    np.testing.assert_array_equal(var.numpy(), old)


def test_lazy_adam_leaves_untouched_slots(op_backend):
  table = tf.Variable(tf.ones([4, 2]))
  m, v = tf.Variable(tf.zeros([4, 2])), tf.Variable(tf.zeros([4, 2]))
  tfde.ops.sparse_apply_lazy_adam(table, m, v, tf.constant([2]),
                                  tf.ones([1, 2]), 0.1, 0.9, 0.999, 1e-7, 1)
  assert np.count_nonzero(m.numpy().any(axis=1)) == 1
  assert m.numpy()[2].all() and v.numpy()[2].all()


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
@pytest.mark.parametrize("rows,pattern", [
    ([1, 50, 2], r"indices\[\D*1\D*\] =\D*50\D*out of range"),
    ([1, -1], r"indices\[\D*1\D*\] =\D*-1\D*out of range"),
    ([3, 4, 3], r"indices\[\D*2\D*\] =\D*3\D*repeats indices\[\D*0"),
])
def test_optimizer_bad_rows_change_nothing(op_backend, kind, rows, pattern):
  hp = OPTIMIZERS[kind]
  shape = (50, 3)
  table = tf.Variable(tf.random.normal(shape, seed=1))
  slots = _make_slots(kind, shape, hp)
  before = [v.numpy().copy() for v in [table] + slots]
  grads = np.ones((len(rows), 3), np.float32)
  with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
    _apply(kind, table, slots, np.array(rows, np.int64), grads, 1, hp)
  for var, old in zip([table] + slots, before):
    np.testing.assert_array_equal(var.numpy(), old)


@pytest.mark.parametrize("num_rows", [8, 5000])
def test_optimizer_repeated_row_in_small_and_large_tables(op_backend, num_rows):
  """The repeat check for a table near the batch's size and for one far
  larger (kernels: a bitmap of the rows, or a hash map of the indices)."""
  table = tf.Variable(tf.ones([num_rows, 2]))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"indices\[\D*3\D*\] =\D*7\D*repeats indices\[\D*1\D"):
    tfde.ops.sparse_apply_sgd(table, tf.constant([2, 7, 5, 7], tf.int64), tf.ones([4, 2]),
                              0.1)
  np.testing.assert_array_equal(table.numpy(), 1)


def test_optimizer_rejects_grad_of_wrong_shape(op_backend):
  table = tf.Variable(tf.zeros([5, 3]))
  with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
    tfde.ops.sparse_apply_sgd(table, tf.constant([0, 1]), tf.ones([3, 3]), 0.1)
  np.testing.assert_array_equal(table.numpy(), 0)


def test_optimizer_with_no_rows_of_a_shared_gradient_changes_nothing(op_backend):
  """A table of a fused group that no id touched: empty indices and
  grad_rows beside the group's whole gradient."""
  table = tf.Variable(tf.ones([5, 2]))
  tfde.ops.sparse_apply_sgd(table, tf.zeros([0], tf.int64), tf.ones([3, 2]), 0.1,
                            grad_rows=tf.zeros([0], tf.int32))
  np.testing.assert_array_equal(table.numpy(), 1)


def test_optimizer_keeps_earlier_reads(op_backend):
  """A value read before the update keeps its value (copy-on-write)."""
  table = tf.Variable(tf.zeros([3, 2]))
  before = table.read_value()
  tfde.ops.sparse_apply_sgd(table, tf.constant([1]), tf.ones([1, 2]), 1.0)
  np.testing.assert_array_equal(before.numpy(), 0)
  np.testing.assert_array_equal(table.numpy()[1], [-1, -1])


@pytest.mark.parametrize("copy_on_read", [True, False])
def test_copy_on_read_says_which_side_copies_a_shared_table(op_backend, copy_on_read):
  """True (TF's choice): after an update every whole read copies the table.
  False (tables read whole each step): reads share its buffer, and an
  update copies it only while such a read is held, which keeps its value."""
  # All on the CPU: numpy shares a CPU tensor's buffer (a read placed on a
  # GPU would copy, whatever the mode).
  with tf.device("CPU:0"):
    table = tf.Variable(tf.zeros([64, 2]))
    for step in (1, 2):
      held = table.read_value()
      tfde.ops.sparse_apply("sgd", [table], tf.constant([1]), tf.ones([1, 2]), [1.0],
                            copy_on_read=copy_on_read)
      np.testing.assert_array_equal(held.numpy()[1], [1 - step] * 2)
      np.testing.assert_array_equal(table.numpy()[1], [-step] * 2)
    # Both reads alive at once, so a freed buffer cannot come back as the other.
    first, second = table.read_value(), table.read_value()
  reads_share = np.shares_memory(np.asarray(first), np.asarray(second))
  if op_backend == tfde.ops.REFERENCE:
    # The twin's scatter ops always put the variable in copy-on-read mode.
    assert not reads_share
  else:
    assert reads_share is not copy_on_read


# ----------------------------------------------- index dtypes, never wrapped


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_update_refuses_an_int64_grad_row_past_int32(op_backend, kind):
  hp = OPTIMIZERS[kind]
  table = tf.Variable(tf.ones([4, 2]))
  slots = _make_slots(kind, (4, 2), hp)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"grad_rows\[\D*1\D*\] =\D*4294967296\D*out of range"):
    tfde.ops.sparse_apply(kind, [table] + slots, tf.constant([1, 2]), tf.ones([2, 2]),
                          [hp[k] for k in ["learning_rate", "beta_1", "beta_2", "epsilon"]
                           if k in hp] + ([1] if kind == "adam" else []),
                          grad_rows=tf.constant([0, 2**32], tf.int64))
  np.testing.assert_array_equal(table.numpy(), 1)


def test_gpu_tables_narrow_int64_grad_rows_only_after_checking_them():
  """The GPU update kernels read int32 gradient rows: int64 ones are
  checked first (eagerly and in a graph), so none wraps onto another row."""
  from tfde.ops import native  # pylint: disable=g-import-not-at-top
  grad = tf.ones([3, 2])
  narrowed = native._narrow_grad_rows(tf.constant([2, 0, 1], tf.int64), grad)  # pylint: disable=protected-access
  assert narrowed.dtype == tf.int32 and narrowed.numpy().tolist() == [2, 0, 1]
  for bad, at in (([0, 2**32], 1), ([3, 0], 0), ([1, -1], 1)):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"grad_rows\[{at}\] = {bad[at]} is out of range \[0, 3\)"):
      native._narrow_grad_rows(tf.constant(bad, tf.int64), grad)  # pylint: disable=protected-access
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"grad_rows\[{at}\]"):
      tf.function(native._narrow_grad_rows)(tf.constant(bad, tf.int64), grad)  # pylint: disable=protected-access


def test_rowwise_adagrad_refuses_a_slot_as_wide_as_the_table(op_backend):
  """A row-wise update's slot is [rows, 1]: an element-wise accumulator
  (Adagrad's, from a table switched over) is refused by name, unchanged."""
  table = tf.Variable(tf.ones([5, 3]))
  wide = tf.Variable(tf.fill([5, 3], 0.5))
  with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                     match=r"must have shape \[5,1\]"):
    tfde.ops.sparse_apply_rowwise_adagrad(table, wide, tf.constant([1]), tf.ones([1, 3]),
                                          0.1, 1e-8)
  np.testing.assert_array_equal(table.numpy(), np.ones([5, 3]))
  np.testing.assert_array_equal(wide.numpy(), np.full([5, 3], 0.5))
