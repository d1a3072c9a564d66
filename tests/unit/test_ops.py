"""unique_with_counts, partition_by_shard, embedding_combine and the ops on
a group's tables (gather, combine, split rows), on the C++ kernels and on
the pure-TF twins, against numpy. The sparse optimizer updates are in
test_ops_optimizers.py, refusals of malformed calls in test_ops_refusals.py,
tests needing a fresh process in test_ops_fresh_process.py."""

import numpy as np
import pytest
import tensorflow as tf

import tfde.ops
from tests.support import oracles
from tests.support.op_inputs import SEEDS
from tests.support.op_inputs import combine_inputs
from tests.support.op_inputs import random_bags
from tests.support.op_inputs import seeded_bags


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


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_sorted_unique_in_range_matches_numpy(op_backend, seed, dtype):
  rng = np.random.default_rng(seed)
  n = [0, 1, 17, 1000, 40000, 327680][seed % 6]
  # Ranges below one bitmap word, past one worker's share of the bitmap
  # (1024 words), and so wide for the ids that the kernel sorts instead
  # (ids past int32 for int64).
  num_ids = [1, 63, 5000, 70000, 4_000_000, 2**40 if dtype == np.int64 else 2**31 - 1][
      (seed // 6 + seed) % 6]
  ids = _zipf_ids(rng, n, num_ids, dtype)
  ids[::7] = num_ids - 1  # the range's last id
  unique, inverse = tfde.ops.sorted_unique_in_range(tf.constant(ids), num_ids)
  want_u, want_i = np.unique(ids, return_inverse=True)
  assert unique.dtype == tf.as_dtype(dtype) and inverse.dtype == tf.int32
  np.testing.assert_array_equal(unique.numpy(), want_u)
  np.testing.assert_array_equal(inverse.numpy(), want_i.ravel())


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_sorted_unique_off_the_cpu_matches_numpy(dtype):
  """Where the bitmap kernel does not run (a GPU), the check, hash dedup
  and sort it is made of there, run here on their CPU kernels."""
  if not tfde.ops.kernels_available():
    pytest.skip("no op library")
  rng = np.random.default_rng(7)
  for n, num_ids in ((0, 5), (1, 1), (5000, 300), (40000, 4_000_000)):
    ids = _zipf_ids(rng, n, num_ids, dtype)
    unique, inverse = tfde.ops.native.sorted_unique_by_hashing(tf.constant(ids), num_ids)
    want_u, want_i = np.unique(ids, return_inverse=True)
    np.testing.assert_array_equal(unique.numpy(), want_u)
    np.testing.assert_array_equal(inverse.numpy(), want_i.ravel())
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 9 at position 1 is out of range"):
    tfde.ops.native.sorted_unique_by_hashing(tf.constant([1, 9], tf.int64), 5)


@pytest.mark.parametrize("bad", [-1, 100, 2**40])
def test_sorted_unique_in_range_names_the_first_id_outside(op_backend, bad):
  with tf.device("/cpu:0"):  # a GPU's ids take the hash path, worded as its check op
    _sorted_unique_refusals(bad)


def test_sorted_unique_in_range_near_int64s_end(op_backend):
  """A range within 63 of 2^63 once overflowed the bitmap's word count."""
  with tf.device("/cpu:0"):
    for num_ids in (2**63 - 2, 2**63 - 64, 2**62 + 1):
      unique, inverse = tfde.ops.sorted_unique_in_range(
          tf.constant([5, 0, 2**62, 5], tf.int64), num_ids)
      assert unique.numpy().tolist() == [0, 5, 2**62]
      assert inverse.numpy().tolist() == [1, 0, 2, 1]


def _sorted_unique_refusals(bad):
  ids = tf.constant([3, 99, bad, 0, bad], tf.int64)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=rf"ids\[2\] = {bad} is out of range \[0, 100\)"):
    tfde.ops.sorted_unique_in_range(ids, 100)
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"out of range \[0, 0\)"):
    tfde.ops.sorted_unique_in_range(tf.constant([0], tf.int64), 0)
  empty = tfde.ops.sorted_unique_in_range(tf.zeros([0], tf.int64), 0)
  assert [t.shape.as_list() for t in empty] == [[0], [0]]


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


# A power of two takes the kernel's mask and shift, 3 its divisions.
@pytest.mark.parametrize("n_shards", [3, 4])
def test_partition_dynamic_keeps_ids_and_floor_mods_negatives(op_backend, n_shards):
  ids = np.array([-1, 5, -6, 4, 2**62 + 1, -2**63, -7], np.int64)
  local, counts, positions = tfde.ops.partition_by_shard(
      tf.constant(ids), n_shards, dynamic=True)
  shard = np.mod(ids, n_shards)  # numpy's % is a floor modulo
  order = np.argsort(shard, kind="stable")
  np.testing.assert_array_equal(local.numpy(), ids[order])
  np.testing.assert_array_equal(counts.numpy(), np.bincount(shard, minlength=n_shards))
  np.testing.assert_array_equal(local.numpy()[positions.numpy()], ids)


def test_partition_rejects_negative_ids_naming_position(op_backend):
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"ids\[\D*2\D*\] =\D*-7"):
    tfde.ops.partition_by_shard(tf.constant([1, 4, -7, 2], tf.int64), 2)


@pytest.mark.parametrize("n_shards", [0, -3])
def test_partition_rejects_non_positive_shard_count(op_backend, n_shards):
  with pytest.raises(tf.errors.InvalidArgumentError, match="num_shards"):
    tfde.ops.partition_by_shard(tf.constant([1, 2], tf.int64), n_shards)


# ------------------------------------------------------------ id checks


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("seed", SEEDS)
def test_check_id_range_names_the_first_offender(op_backend, seed, dtype):
  """The first id outside [0, size) (numpy's argmax of the mask), with
  its position and the feature and table the caller names; in-range ids
  come back unchanged, in their dtype."""
  rng = np.random.default_rng(seed)
  size = int(rng.integers(1, 50))
  ids = rng.integers(0, size, int(rng.integers(1, 300)))
  out = tfde.ops.check_id_range(tf.constant(ids, dtype), size, "feature f (table t)")
  assert out.dtype == dtype
  np.testing.assert_array_equal(out.numpy(), ids)
  bad = ids.copy()
  where = rng.choice(len(bad), size=min(3, len(bad)), replace=False)
  bad[where] = rng.choice([-1, size, size + 7, -(2**20)], size=len(where))
  first = int(np.argmax((bad < 0) | (bad >= size)))
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=rf"feature f \(table t\): id {bad[first]} at position "
                           rf"{first} is out of range \[0, {size}\)"):
    tfde.ops.check_id_range(tf.constant(bad, dtype), size, "feature f (table t)")


def test_check_id_range_edges(op_backend):
  empty = tfde.ops.check_id_range(tf.zeros([0], tf.int64), 0, "feature f (table t)")
  assert empty.shape == [0]
  big = 2**40
  np.testing.assert_array_equal(
      tfde.ops.check_id_range(tf.constant([big - 1, 0], tf.int64), big, "f").numpy(),
      [big - 1, 0])
  # An int64 id past int32 is never wrapped into range.
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 4294967297 at position 1"):
    tfde.ops.check_id_range(tf.constant([1, 2**32 + 1], tf.int64), 5, "f")
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 0 at position 0"):
    tfde.ops.check_id_range(tf.constant([0], tf.int64), 0, "f")


def test_check_id_range_in_a_graph_guards_what_reads_the_ids(op_backend):
  """In a tf.function the check fails the step that reads the ids, on
  either backend (the op's output, or the twin's control dependency)."""
  @tf.function
  def total(ids):
    return tf.reduce_sum(tfde.ops.check_id_range(ids, 10, "feature f (table t)"))

  assert int(total(tf.constant([1, 2, 3], tf.int64))) == 6
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"feature f \(table t\): id 10 at position 2"):
    total(tf.constant([1, 2, 10], tf.int64))


ROW_SPLITS_ERROR = (r"feature f \(table t\): ragged ids have row splits that do not start at "
                    r"0, never decrease and end at the number of ids")


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("traced", [False, True])
def test_check_row_splits_passes_splits_and_names_the_bad(op_backend, dtype, traced):
  """Row splits pass when they start at 0, never decrease and end at the
  ids (numpy's rule for a valid RaggedTensor); otherwise an error naming
  the caller's feature and table, before what is held on the check reads
  them. The kernel also says which split is bad."""
  def checked_sum(splits, num_ids):
    check = tfde.ops.check_row_splits(splits, num_ids, "feature f (table t)")
    with tf.control_dependencies([check] if check is not None else []):
      return tf.reduce_sum(tf.identity(splits))

  run = tf.function(checked_sum) if traced else checked_sum
  rng = np.random.default_rng(7)
  for _ in range(5):
    lengths = rng.integers(0, 4, int(rng.integers(0, 20)))
    splits = np.concatenate([[0], np.cumsum(lengths)])
    assert int(run(tf.constant(splits, dtype), tf.constant(int(splits[-1]), tf.int64))) == \
        int(splits.sum())
  detail = op_backend == tfde.ops.KERNELS
  for splits, num_ids, why in (([1, 2, 3], 3, r"row_splits\[0\] = 1"),
                               ([0, 2, 1, 3], 3, r"row_splits\[2\] = 1 < row_splits\[1\] = 2"),
                               ([0, 1, 3], 2, r"row_splits\[2\] = 3 but there are 2 ids"),
                               ([0, 1], 2, r"row_splits\[1\] = 1 but there are 2 ids"),
                               ([], 0, "there are none")):
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=ROW_SPLITS_ERROR + (": " + why if detail else "")):
      run(tf.constant(splits, dtype), tf.constant(num_ids, tf.int64))


# -------------------------------------------------------- update stamps


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("seed", SEEDS)
def test_stamp_rows_matches_numpy(op_backend, seed, dtype):
  rng = np.random.default_rng(seed)
  size = int(rng.integers(1, 5000))
  before = rng.integers(0, 100, size)
  rows = rng.integers(0, size, int(rng.integers(0, 3000)))  # repeats too
  stamps = tf.Variable(before)
  tfde.ops.stamp_rows(stamps, tf.constant(rows, dtype), 123)
  expected = before.copy()
  expected[rows] = 123
  np.testing.assert_array_equal(stamps.numpy(), expected)


def test_stamp_rows_leaves_earlier_reads_and_refuses_whole(op_backend):
  """A value read before the stamps keeps its values; a row out of range
  is refused by name, and no row is stamped."""
  stamps = tf.Variable(tf.zeros([6], tf.int64))
  earlier = stamps.read_value()
  tfde.ops.stamp_rows(stamps, tf.constant([4, 0], tf.int64), 5)
  np.testing.assert_array_equal(earlier.numpy(), np.zeros(6))
  np.testing.assert_array_equal(stamps.numpy(), [5, 0, 0, 0, 5, 0])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"rows\[2\] = 6 is out of range \[0, 6\)"):
    tfde.ops.stamp_rows(stamps, tf.constant([1, 2, 6, -1], tf.int64), 9)
  np.testing.assert_array_equal(stamps.numpy(), [5, 0, 0, 0, 5, 0])

  @tf.function
  def stamp(rows):
    tfde.ops.stamp_rows(stamps, rows, 11)

  stamp(tf.constant([3], tf.int64))
  np.testing.assert_array_equal(stamps.numpy(), [5, 0, 0, 11, 5, 0])


# --------------------------------------------------------------- combine


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_combine_and_grad_match_numpy(op_backend, seed, combiner):
  rng, dim, vocab, ids, weights = seeded_bags(seed)
  table = rng.normal(size=(vocab, dim)).astype(np.float32)
  flat, splits, w = combine_inputs(ids, weights)
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
    flat, splits, wt = combine_inputs(ids, w)
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
  flat, splits, _ = combine_inputs(ids, None)
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
  features = [random_bags(rng, batch=[1, 7, 64][(seed + f) % 3], vocab=len(fused),
                          max_hot=[1, 3, 20][seed % 3], weighted=(seed + f) % 2 == 1)
              for f in range(2)]
  flats = [combine_inputs(ids, weights) for ids, weights in features]
  unique, inverse, _ = tfde.ops.unique_with_counts(
      tf.constant(np.concatenate([flat for flat, _, _ in flats])))
  parts = tf.split(inverse, [len(flat) for flat, _, _ in flats])
  variables = [tf.Variable(t) for t in tables]
  for (ids, weights), (_, splits, w), part in zip(features, flats, parts):
    out = tfde.ops.combine_from_tables(variables, unique, bases, part,
                                       tf.constant(splits), w, combiner)
    want = oracles.combine(fused, ids, weights, combiner)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)


def _combine_in_order(table, ids, weights, combiner):
  """The combine as the kernels round it: per sample, each coefficient
  (weight times the combiner's scale, in float64) rounded to float32, and
  the products added in id order in float32, each rounded (no fused
  multiply-add)."""
  out = np.zeros((len(ids), table.shape[1]), np.float32)
  for b, sample in enumerate(ids):
    w = (np.ones(len(sample)) if weights is None else
         np.asarray(weights[b], np.float32).astype(np.float64))
    total, squares = 0.0, 0.0
    for x in w:  # in order, in float64, as the kernels
      total += x
      squares += x * x
    scale = {"sum": 1.0,
             "mean": 1.0 / total if total != 0 else 0.0,
             "sqrtn": 1.0 / np.sqrt(squares) if squares != 0 else 0.0}[combiner]
    acc = np.zeros(table.shape[1], np.float32)
    for i, row in enumerate(sample):
      acc = acc + np.float32(w[i] * scale) * table[row]
    out[b] = acc
  return out


@pytest.mark.parametrize("dim", [1, 8, 16, 24, 32, 64, 128, 129])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_combine_of_every_width_rounds_as_the_sequential_sum(dim, combiner, weighted):
  """The kernels' loops for the widths they know when compiled (8 to 128,
  sums kept in registers) and the loop of any other width give the same
  bits as adding each sample's products in order in float32."""
  rng = np.random.default_rng(dim)
  # Two tables (each row resolved to its table first) and one (the rows
  # found as they are read).
  for sizes in ([40, 25], [65]):
    tables, bases, fused = _fused_group(rng, sizes, dim)
    ids, weights = random_bags(rng, batch=33, vocab=len(fused), max_hot=45,
                               weighted=weighted)
    flat, splits, w = combine_inputs(ids, weights)
    want = _combine_in_order(fused, ids, weights, combiner)
    from_tables = tfde.ops.combine_from_tables(
        [tf.Variable(t) for t in tables], tf.constant(flat), bases,
        tf.range(len(flat)), tf.constant(splits), w, combiner)
    from_rows = tfde.ops.embedding_combine(tf.constant(fused[flat]), tf.range(len(flat)),
                                           tf.constant(splits), w, combiner)
    np.testing.assert_array_equal(from_tables.numpy(), want)
    np.testing.assert_array_equal(from_rows.numpy(), want)


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


def test_the_gpu_forms_of_update_gradients_and_row_splits_match_numpy():
  """Where the tables live on a GPU, the backward forms the gradient matrix
  (the bag index is a CPU kernel) and splits rows with stock ops; by the
  device's name alone (run here on the CPU), against numpy."""
  rng = np.random.default_rng(5)
  lengths = rng.integers(0, 6, 40)
  row_splits = np.concatenate([[0], np.cumsum(lengths)])
  inverse = rng.integers(0, 30, int(lengths.sum()))
  weights = rng.uniform(0.5, 2, int(lengths.sum()))
  grad = rng.normal(size=(40, 8))
  with tfde.ops.backend(tfde.ops.KERNELS):
    bags = tfde.ops.gradients_for_update(
        tf.constant(grad, tf.float32), tf.constant(inverse, tf.int32),
        tf.constant(row_splits, tf.int64), tf.constant(weights, tf.float32), 30, "mean")
    matrix = tfde.ops.gradients_for_update(
        tf.constant(grad, tf.float32), tf.constant(inverse, tf.int32),
        tf.constant(row_splits, tf.int64), tf.constant(weights, tf.float32), 30, "mean",
        device="/job:localhost/device:GPU:0")
    rows = rng.permutation(90)[:50]
    parts = tfde.ops.split_rows_by_table(tf.constant(rows, tf.int64), [0, 20, 45],
                                         device="/device:GPU:0")
  assert isinstance(bags, tfde.ops.BagGradients) and tf.is_tensor(matrix)
  samples = [slice(row_splits[b], row_splits[b + 1]) for b in range(40)]
  want = oracles.combine_grad_dense(30, grad, [list(inverse[s]) for s in samples],
                                    [list(weights[s]) for s in samples], "mean")
  np.testing.assert_allclose(matrix.numpy(), want, rtol=1e-5, atol=1e-6)
  bounds = [0, 20, 45, 90]
  for t, (local, positions) in enumerate(parts):
    mine = np.flatnonzero((rows >= bounds[t]) & (rows < bounds[t + 1]))
    np.testing.assert_array_equal(positions.numpy(), mine)
    np.testing.assert_array_equal(local.numpy(), rows[mine] - bounds[t])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_sum_rows_by_index_matches_numpy(op_backend, seed, index_dtype):
  """The owners' gradient sum (`tf.math.unsorted_segment_sum` of rows):
  each output row the sum of the rows its index names, in order, and 0
  where none does; bit for bit, as numpy adds them one at a time."""
  rng = np.random.default_rng(seed)
  n, num = [0, 1, 300, 5000][seed], [3, 1, 50, 700][seed]
  rows = rng.normal(size=(n, 16)).astype(np.float32)
  index = rng.integers(0, max(num - 2, 1), size=n).astype(index_dtype)
  want = np.zeros((num, 16), np.float32)
  for i in range(n):
    want[index[i]] += rows[i]
  got = tfde.ops.sum_rows_by_index(tf.constant(rows), tf.constant(index), num)
  np.testing.assert_array_equal(got.numpy(), want)


def _not_the_default_backend():
  """The backend a block must ask for to change anything here, so that a
  test of blocks can fail (skips where only the twins exist)."""
  if tfde.ops.current_backend() == tfde.ops.KERNELS:
    return tfde.ops.REFERENCE
  if not tfde.ops.kernels_available():
    pytest.skip("op library unavailable: no second backend")
  return tfde.ops.KERNELS


def test_a_backend_block_holds_in_mirrored_replicas():
  """MirroredStrategy runs each replica's function in a thread of its own;
  the backend a block asks for holds there too (it was once kept per
  thread, so a "reference" block's replicas ran the kernels)."""
  name = _not_the_default_backend()
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  seen = []

  def replica_fn():
    seen.append(tfde.ops.current_backend())
    return tf.constant(0)

  with tfde.ops.backend(name):
    strategy.run(replica_fn)
    tf.function(lambda: strategy.run(replica_fn))()
  assert seen == [name] * 4


def test_backend_blocks_of_threads_may_close_in_any_order():
  """Blocks opened in two threads and closed in the order they were
  opened leave no backend behind (each removes its own, not the one it
  saw when it opened)."""
  default, name = tfde.ops.current_backend(), _not_the_default_backend()
  first, second = tfde.ops.backend(name), tfde.ops.backend(name)
  first.__enter__()
  second.__enter__()
  first.__exit__(None, None, None)
  assert tfde.ops.current_backend() == name   # second is still open
  second.__exit__(None, None, None)
  assert tfde.ops.current_backend() == default
