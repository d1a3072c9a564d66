"""Every op, on the C++ kernels and on the pure-TF twins, against numpy."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfde.ops
from tests import oracles

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(tfde.__file__)))

SEEDS = range(12)


def _zipf_ids(rng, n, vocab, dtype=np.int64):
  return (rng.zipf(1.2, size=n) % vocab).astype(dtype)


# ---------------------------------------------------------------- unique


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_unique_matches_numpy(op_backend, seed, dtype):
  rng = np.random.default_rng(seed)
  # Sizes straddle the kernel's parallel threshold (32768).
  n = [0, 1, 17, 1000, 40000, 100000][seed % 6]
  ids = _zipf_ids(rng, n, 5000 + seed * 1000, dtype)
  unique, inverse, counts = tfde.ops.unique_with_counts(tf.constant(ids))
  want_u, want_i, want_c = oracles.unique_first_appearance(ids)
  assert unique.dtype == tf.as_dtype(dtype)
  np.testing.assert_array_equal(unique.numpy(), want_u)
  np.testing.assert_array_equal(inverse.numpy(), want_i)
  np.testing.assert_array_equal(counts.numpy(), want_c)


@pytest.mark.parametrize("ids", [
    [],
    [42],
    [9] * 50000,
    [2**62 + 3, 2**62 + 3, -(2**62), 2**62 - 1, 0, 2**62 + 3],
    list(range(70000)) + list(range(70000)),
])
def test_unique_edge_cases(op_backend, ids):
  ids = np.array(ids, np.int64)
  unique, inverse, counts = tfde.ops.unique_with_counts(tf.constant(ids, tf.int64))
  want_u, want_i, want_c = oracles.unique_first_appearance(ids)
  np.testing.assert_array_equal(unique.numpy(), want_u)
  np.testing.assert_array_equal(inverse.numpy(), want_i)
  np.testing.assert_array_equal(counts.numpy(), want_c)


def test_unique_rejects_non_vector(op_backend):
  with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                     match="vector"):
    tfde.ops.unique_with_counts(tf.zeros([2, 2], tf.int64))


# ------------------------------------------------------------- partition


def _numpy_partition(ids, n):
  shard = ids % n
  order = np.argsort(shard, kind="stable")
  local = ids[order] // n
  counts = np.bincount(shard, minlength=n)
  positions = np.empty_like(order)
  positions[order] = np.arange(len(ids))
  return local, counts, positions


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_partition_matches_numpy(op_backend, seed, dtype):
  rng = np.random.default_rng(seed)
  n_shards = [1, 2, 3, 4, 7, 8][seed % 6]
  n = [0, 1, 5, 999, 20000, 70000][seed % 6]
  ids = _zipf_ids(rng, n, 10**6, dtype)
  local, counts, positions = tfde.ops.partition_by_shard(tf.constant(ids), n_shards)
  want_local, want_counts, want_positions = _numpy_partition(ids.astype(np.int64), n_shards)
  np.testing.assert_array_equal(local.numpy(), want_local)
  np.testing.assert_array_equal(counts.numpy(), want_counts)
  np.testing.assert_array_equal(positions.numpy(), want_positions)
  # The permutation undoes the grouping.
  np.testing.assert_array_equal(
      local.numpy()[positions.numpy()] * n_shards + ids % n_shards, ids)


def test_partition_large_ids(op_backend):
  ids = np.array([2**62 + 5, 2**62, 3, 2**62 + 5], np.int64)
  local, counts, _ = tfde.ops.partition_by_shard(tf.constant(ids), 4)
  want_local, want_counts, _ = _numpy_partition(ids, 4)
  np.testing.assert_array_equal(local.numpy(), want_local)
  np.testing.assert_array_equal(counts.numpy(), want_counts)


def test_partition_dynamic_keeps_ids_and_floor_mods_negatives(op_backend):
  ids = np.array([-1, 5, -6, 4, 2**62 + 1], np.int64)
  local, counts, positions = tfde.ops.partition_by_shard(
      tf.constant(ids), 4, dynamic=True)
  shard = np.mod(ids, 4)  # numpy's % is a floor modulo
  order = np.argsort(shard, kind="stable")
  np.testing.assert_array_equal(local.numpy(), ids[order])
  np.testing.assert_array_equal(counts.numpy(), np.bincount(shard, minlength=4))
  np.testing.assert_array_equal(local.numpy()[positions.numpy()], ids)


def test_partition_rejects_negative_ids_naming_position(op_backend):
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"ids\[\D*2\D*\] =\D*-7"):
    tfde.ops.partition_by_shard(tf.constant([1, 4, -7, 2], tf.int64), 2)


@pytest.mark.parametrize("n_shards", [0, -3])
def test_partition_rejects_non_positive_shard_count(op_backend, n_shards):
  with pytest.raises(tf.errors.InvalidArgumentError, match="num_shards"):
    tfde.ops.partition_by_shard(tf.constant([1, 2], tf.int64), n_shards)


# --------------------------------------------------------------- combine


def _random_bags(rng, batch, vocab, max_hot, weighted):
  lengths = rng.integers(0, max_hot + 1, size=batch)
  ids = [list(rng.integers(0, vocab, size=k)) for k in lengths]
  weights = ([list(rng.uniform(-1.0, 2.0, size=k)) for k in lengths]
             if weighted else None)
  return ids, weights


def _combine_inputs(ids, weights):
  flat = np.array([i for bag in ids for i in bag], np.int64)
  splits = np.concatenate([[0], np.cumsum([len(b) for b in ids])]).astype(np.int64)
  w = (None if weights is None else
       tf.constant(np.array([x for bag in weights for x in bag], np.float32)))
  return flat, splits, w


def _seeded_bags(seed):
  """A case that varies with the seed: width 1 to 257, vocabularies of 1 to
  500, batches of 1 to 64, weights on odd seeds. (rng, dim, vocab, ids,
  weights)."""
  rng = np.random.default_rng(seed)
  dim = [1, 4, 16, 257][seed % 4]
  vocab = [1, 30, 500][seed % 3]
  ids, weights = _random_bags(rng, batch=[1, 7, 64][seed % 3], vocab=vocab,
                              max_hot=[1, 3, 20][seed % 3], weighted=seed % 2 == 1)
  return rng, dim, vocab, ids, weights


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_combine_and_grad_match_numpy(op_backend, seed, combiner):
  rng, dim, vocab, ids, weights = _seeded_bags(seed)
  table = rng.normal(size=(vocab, dim)).astype(np.float32)
  flat, splits, w = _combine_inputs(ids, weights)
  unique, inverse, _ = tfde.ops.unique_with_counts(tf.constant(flat))
  rows = tf.gather(table, unique)
  out = tfde.ops.embedding_combine(rows, inverse, tf.constant(splits), w, combiner)
  want = oracles.combine(table, ids, weights, combiner)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)

  grad = rng.normal(size=(len(ids), dim)).astype(np.float32)
  unique_grad = tfde.ops.embedding_combine_grad(
      tf.constant(grad), inverse, tf.constant(splits), w, tf.size(unique),
      combiner)
  dense = np.zeros((vocab, dim))
  np.add.at(dense, unique.numpy(), unique_grad.numpy())
  want_grad = oracles.combine_grad_dense(vocab, grad, ids, weights, combiner)
  np.testing.assert_allclose(dense, want_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_combine_edge_cases(op_backend, combiner):
  table = np.arange(12, dtype=np.float32).reshape(4, 3)
  # Empty sample, one id, all ids equal, zero weights (div_no_nan -> 0).
  ids = [[], [2], [1, 1, 1], [0, 3]]
  weights = [[], [0.5], [1.0, 2.0, 3.0], [0.0, 0.0]]
  for w in (None, weights):
    flat, splits, wt = _combine_inputs(ids, w)
    out = tfde.ops.embedding_combine(tf.gather(table, flat),
                                     tf.range(len(flat)), tf.constant(splits),
                                     wt, combiner)
    np.testing.assert_allclose(out.numpy(), oracles.combine(table, ids, w, combiner),
                               rtol=1e-6)
  # An empty batch.
  out = tfde.ops.embedding_combine(tf.zeros([0, 3]), tf.zeros([0], tf.int32),
                                   tf.constant([0], tf.int64), None, combiner)
  assert out.shape == (0, 3)


def test_combine_half_precision_rows(op_backend):
  table = np.random.default_rng(0).normal(size=(10, 8)).astype(np.float32)
  ids = [[1, 2], [3], [4, 4, 9]]
  flat, splits, _ = _combine_inputs(ids, None)
  for dtype in (tf.float16, tf.bfloat16):
    rows = tf.cast(tf.gather(table, flat), dtype)
    out = tfde.ops.embedding_combine(rows, tf.range(len(flat)),
                                     tf.constant(splits, tf.int32), None, "mean")
    assert out.dtype == dtype
    np.testing.assert_allclose(tf.cast(out, tf.float32).numpy(),
                               oracles.combine(table, ids, None, "mean"),
                               rtol=2e-2, atol=2e-2)


def test_combine_gradient_through_autodiff(op_backend):
  """tf.GradientTape through the op (the registered gradient for the
  kernel, autodiff for the twin) equals the numeric Jacobian."""
  rng = np.random.default_rng(3)
  rows = tf.constant(rng.normal(size=(5, 3)), tf.float64)
  rows32 = tf.cast(rows, tf.float32)
  inverse = tf.constant([0, 4, 4, 2, 1, 3])
  splits = tf.constant([0, 2, 2, 5, 6], tf.int64)
  weights = tf.constant([1.0, 0.5, 2.0, -1.0, 3.0, 0.0])

  def f(r):
    return tfde.ops.embedding_combine(r, inverse, splits, weights, "sqrtn")

  theoretical, numerical = tf.test.compute_gradient(f, [rows32], delta=1e-2)
  np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-2, atol=1e-2)


def test_combine_rejects_mismatched_weights(op_backend):
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"weights has \D*2\D* elements but there are \D*3"):
    tfde.ops.embedding_combine(tf.ones([3, 2]), [0, 1, 2],
                               tf.constant([0, 3], tf.int64),
                               tf.constant([1.0, 2.0]), "sum")


def test_combine_rejects_bad_row_splits(op_backend):
  with pytest.raises(tf.errors.InvalidArgumentError, match="row_splits"):
    tfde.ops.embedding_combine(tf.ones([3, 2]), [0, 1, 2],
                               tf.constant([0, 2], tf.int64), None, "sum")


def test_combine_rejects_out_of_range_inverse(op_backend):
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"inverse\[\D*1\D*\] =\D*5"):
    tfde.ops.embedding_combine(tf.ones([3, 2]), [0, 5, 2],
                               tf.constant([0, 3], tf.int64), None, "sum")


def test_combine_rejects_wrong_dtypes(op_backend):
  with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError,
                      tf.errors.NotFoundError)):
    tfde.ops.embedding_combine(tf.ones([3, 2], tf.float64), [0, 1, 2],
                               tf.constant([0.0, 3.0]), None, "sum")


def test_combine_rejects_unknown_combiner(op_backend):
  with pytest.raises((ValueError, TypeError, tf.errors.InvalidArgumentError),
                     match="combiner|sum, mean, sqrtn"):
    tfde.ops.embedding_combine(tf.ones([3, 2]), [0, 1, 2],
                               tf.constant([0, 3], tf.int64), None, "max")


# ------------------------------------------- a group's tables, fused rows


def _fused_group(rng, sizes, dim):
  """Tables of one width and their fused row space (table t from bases[t])."""
  tables = [rng.normal(size=(n, dim)).astype(np.float32) for n in sizes]
  bases = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
  return tables, bases, np.concatenate(tables)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gather_from_tables_matches_numpy(op_backend, seed, index_dtype):
  rng = np.random.default_rng(seed)
  tables, bases, fused = _fused_group(rng, rng.integers(1, 40, size=1 + seed % 3), 1 + seed)
  rows = rng.integers(0, len(fused), size=int(rng.integers(0, 60))).astype(index_dtype)
  got = tfde.ops.gather_from_tables([tf.Variable(t) for t in tables], rows, bases)
  np.testing.assert_array_equal(got.numpy().reshape(len(rows), -1), fused[rows])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_combine_from_tables_matches_numpy(op_backend, seed, combiner):
  """Several features of a group combine straight from its tables."""
  rng = np.random.default_rng(seed)
  dim = [1, 4, 16, 257][seed % 4]
  tables, bases, fused = _fused_group(rng, rng.integers(1, 50, size=1 + seed % 3), dim)
  features = [_random_bags(rng, batch=[1, 7, 64][(seed + f) % 3], vocab=len(fused),
                           max_hot=[1, 3, 20][seed % 3], weighted=(seed + f) % 2 == 1)
              for f in range(2)]
  flats = [_combine_inputs(ids, weights) for ids, weights in features]
  unique, inverse, _ = tfde.ops.unique_with_counts(
      tf.constant(np.concatenate([flat for flat, _, _ in flats])))
  parts = tf.split(inverse, [len(flat) for flat, _, _ in flats])
  variables = [tf.Variable(t) for t in tables]
  for (ids, weights), (_, splits, w), part in zip(features, flats, parts):
    out = tfde.ops.combine_from_tables(variables, unique, bases, part,
                                       tf.constant(splits), w, combiner)
    want = oracles.combine(fused, ids, weights, combiner)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_split_rows_by_table_matches_numpy(op_backend, seed, index_dtype):
  rng = np.random.default_rng(seed)
  sizes = rng.integers(1, 30, size=1 + seed % 4)
  bases = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
  rows = rng.integers(0, sizes.sum(), size=int(rng.integers(0, 50))).astype(index_dtype)
  parts = tfde.ops.split_rows_by_table(tf.constant(rows), bases)
  assert len(parts) == len(sizes)
  table_of = np.searchsorted(bases, rows, side="right") - 1
  for t, (local, positions) in enumerate(parts):
    want_positions = np.flatnonzero(table_of == t)
    np.testing.assert_array_equal(positions.numpy(), want_positions)
    np.testing.assert_array_equal(local.numpy(), rows[want_positions] - bases[t])


def test_split_rows_by_table_rejects_negative_rows(op_backend):
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"rows\[\D*2\D*\] =\D*-4\D*negative"):
    tfde.ops.split_rows_by_table(tf.constant([0, 5, -4], tf.int64), [0, 3])


def test_fused_tables_reject_rows_outside_every_table(op_backend):
  variables = [tf.Variable(tf.zeros([3, 2])), tf.Variable(tf.zeros([4, 2]))]
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"rows\[\D*1\D*\] =\D*7\D*outside every table"):
    tfde.ops.gather_from_tables(variables, tf.constant([6, 7], tf.int64), [0, 3])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"rows\[\D*1\D*\] =\D*-2\D*outside every table"):
    tfde.ops.combine_from_tables(variables, tf.constant([6, -2], tf.int64), [0, 3],
                                 tf.constant([0, 1]), tf.constant([0, 2], tf.int64))


# ------------------------------------------------------------ optimizers

OPTIMIZERS = {
    "sgd": dict(learning_rate=0.3),
    "adagrad": dict(learning_rate=0.2, initial_accumulator_value=0.1, epsilon=1e-7),
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
  rng, dim, vocab, ids, weights = _seeded_bags(seed)
  flat, splits, w = _combine_inputs(ids, weights)
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


def _apply_from_bags(kind, table, slots, rows, bag_grads, step, hp, grad_rows=None):
  scalars = {"sgd": ["learning_rate"], "adagrad": ["learning_rate", "epsilon"],
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
    ids, weights = _random_bags(rng, batch=9, vocab=vocab, max_hot=6, weighted=True)
    flat, splits, w = _combine_inputs(ids, weights)
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


def test_reference_backend_can_be_forced_by_environment():
  import subprocess
  import sys
  code = ("import tfde.ops; print(tfde.ops.current_backend())")
  env = dict(__import__("os").environ, TFDE_OPS="reference",
             TF_CPP_MIN_LOG_LEVEL="3")
  out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                       capture_output=True, text=True).stdout
  assert out.strip().splitlines()[-1] == "reference"


def test_missing_library_falls_back_with_one_warning(tmp_path):
  import subprocess
  import sys
  # A copy of the package without the .so: the twins must take over.
  import shutil
  import tfde
  src = __import__("os").path.dirname(tfde.__file__)
  shutil.copytree(src, tmp_path / "tfde",
                  ignore=shutil.ignore_patterns("*.so", "__pycache__"))
  code = ("import warnings, tensorflow as tf, tfde.ops\n"
          "with warnings.catch_warnings(record=True) as w:\n"
          "  warnings.simplefilter('always')\n"
          "  tfde.ops.unique_with_counts(tf.constant([1, 1]))\n"
          "  tfde.ops.unique_with_counts(tf.constant([2]))\n"
          "print(tfde.ops.current_backend(), len(w), w[0].message)\n")
  env = dict(__import__("os").environ, PYTHONPATH=str(tmp_path),
             TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("TFDE_OPS", None)
  env.pop("TFDE_OPS_LIBRARY", None)
  out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                       capture_output=True, text=True, cwd=tmp_path).stdout
  last = out.strip().splitlines()[-1]
  assert last.startswith("reference 1 "), last
  assert "does not exist" in last


# ------------------------------- calls that crashed, in a fresh process

_FRESH_PROCESS = """
import resource
import tensorflow as tf
import tfde.ops
tf.constant(0) + 1  # TensorFlow's own set-up, before any limit
if {headroom} is not None:
  status = next(l for l in open("/proc/self/status") if l.startswith("VmSize"))
  in_use = int(status.split()[1]) * 1024
  resource.setrlimit(resource.RLIMIT_AS,
                     (in_use + {headroom} * 2**30, resource.RLIM_INFINITY))
with tfde.ops.backend({backend!r}):
  for call in {calls!r}:
    try:
      result = eval(call)
      print("RESULT", tuple(result.shape) if hasattr(result, "shape") else result,
            flush=True)
    except (tf.errors.OpError, TypeError, ValueError) as e:
      message = getattr(e, "message", str(e)).strip().splitlines()[0]
      print("RAISED", type(e).__name__ + ":", message, flush=True)
"""


def _run_in_fresh_process(backend, calls, memory_headroom_gib=None):
  """Evaluates each expression of `calls` in a fresh Python on `backend`,
  so that a call that crashes fails the test instead of ending pytest.
  With `memory_headroom_gib`, the process's address space is limited to what
  TensorFlow holds plus that much, so an allocation past it fails at once
  instead of taking the machine's memory. Returns one line per call:
  "RESULT <shape>" or "RAISED <error type>: <message>"."""
  code = _FRESH_PROCESS.format(headroom=memory_headroom_gib, backend=backend, calls=calls)
  env = dict(os.environ, PYTHONPATH=_REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                        text=True, timeout=600, cwd=_REPO_ROOT)
  if proc.returncode < 0:
    pytest.fail(f"the process died of {signal.Signals(-proc.returncode).name} after "
                f"{proc.stdout.count(chr(10))} of {len(calls)} calls:\n{proc.stderr[-3000:]}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = [l for l in proc.stdout.splitlines() if l.startswith(("RESULT", "RAISED"))]
  assert len(lines) == len(calls), proc.stdout
  return lines


def test_combine_grad_of_more_rows_than_memory_is_an_error(op_backend):
  """10**9 gradient rows (16 GB) past the limit: ResourceExhausted. (The
  kernel's scratch was a std::vector of num_unique entries, whose bad_alloc
  ended the process.)"""
  call = ("tfde.ops.embedding_combine_grad(tf.ones([2, 4]), tf.constant([0, 1]), "
          "tf.constant([0, 1, 2], tf.int64), None, 10**9)")
  [line] = _run_in_fresh_process(op_backend, [call], memory_headroom_gib=4)
  assert line.startswith("RAISED ResourceExhaustedError"), line


def test_partition_into_more_shards_than_memory_is_an_error(op_backend):
  call = "tfde.ops.partition_by_shard(tf.constant([1, 2], tf.int64), 2**31 - 1)"
  [line] = _run_in_fresh_process(op_backend, [call], memory_headroom_gib=4)
  assert line.startswith("RAISED ResourceExhaustedError"), line


def test_dynamic_table_of_very_wide_rows(op_backend):
  """Rows of 2**24 floats (64 MiB): the kernel's row store allocated 4096
  rows at a time (256 GiB here) and its bad_alloc ended the process; now a
  block holds as many rows as fit 64 MiB, at least one."""
  call = ("tfde.ops.dynamic_store(tfde.ops.DynamicTableSpec(dim=2**24), 'wide').lookup("
          "tf.constant([5], tf.int64), tf.constant([1], tf.int64), 1, insert=True)[0]")
  [line] = _run_in_fresh_process(op_backend, [call], memory_headroom_gib=4)
  assert line == f"RESULT (1, {2**24})"


@pytest.mark.parametrize("dtype", ["int32", "float64"])
def test_tables_of_another_dtype_are_refused(op_backend, dtype):
  """A table must be a float32 matrix on both backends. (The twin of the
  gather read an int32 table as float32, and TensorFlow aborted.)"""
  table = f"tf.Variable(tf.ones([4, 4], tf.{dtype}))"
  calls = [f"tfde.ops.gather_from_tables([{table}], tf.constant([0], tf.int64), [0])",
           f"tfde.ops.combine_from_tables([{table}], tf.constant([0], tf.int64), [0], "
           "tf.constant([0]), tf.constant([0, 1], tf.int64))",
           f"tfde.ops.sparse_apply_sgd({table}, tf.constant([0]), tf.ones([1, 4]), 0.1)"]
  for line in _run_in_fresh_process(op_backend, calls):
    assert line.startswith("RAISED InvalidArgumentError"), line
    assert f"must be a float32 matrix, got {dtype} [4,4]" in line, line


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
