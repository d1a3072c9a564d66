"""The CUDA launchers (kernels/cuda) against the numpy oracles.

Runs where `nvcc` and a GPU exist, with or without TensorFlow: the kernels
are built here with their C testing API (kernels/cuda/testing_api.cu.cc) and
called through ctypes, so a GPU machine without a CUDA-enabled TensorFlow
still verifies every kernel. Elsewhere the module skips with the reason.

On a GPU machine without TensorFlow:
  python3 -m pytest --noconftest -p no:cacheprovider tests/unit/test_cuda_kernels.py
"""

import ctypes
import os
import zlib

import numpy as np
import pytest

from tests.support import cuda_testing
from tests.support import oracles

NO_ERROR = (1 << 64) - 1
SUM, MEAN, SQRTN = 0, 1, 2
COMBINERS = {"sum": SUM, "mean": MEAN, "sqrtn": SQRTN}
F32, F16, BF16 = 0, 1, 2


if not os.environ.get("TFDE_CUDA_TESTING_LIBRARY") and cuda_testing.unavailable_reason():
  pytest.skip(f"CUDA kernels not tested: {cuda_testing.unavailable_reason()}",
              allow_module_level=True)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
  path = os.environ.get("TFDE_CUDA_TESTING_LIBRARY") or cuda_testing.build_testing_library(
      str(tmp_path_factory.mktemp("cuda") / "libtfde_cuda_testing.so"))
  return ctypes.CDLL(path)


def _ptr(a):
  return a.ctypes.data_as(ctypes.c_void_p) if a is not None else None


def _u64():
  return ctypes.c_ulonglong(0)


def _check(status):
  assert status == 0, f"CUDA error {status}"


def _to_bf16_bits(x):
  bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
  return rounded.astype(np.uint16)


def _from_bf16_bits(b):
  return (b.astype(np.uint32) << 16).view(np.float32)


def _rows_as(dtype_code, x):
  if dtype_code == F32:
    return np.ascontiguousarray(x, np.float32)
  if dtype_code == F16:
    return np.ascontiguousarray(x, np.float16)
  return _to_bf16_bits(x)


def _rows_back(dtype_code, x):
  return _from_bf16_bits(x) if dtype_code == BF16 else x.astype(np.float32)


def _empty_like_rows(dtype_code, shape):
  return np.zeros(shape, {F32: np.float32, F16: np.float16, BF16: np.uint16}[dtype_code])


# ---- unique ----

def _unique(lib, ids):
  ids = np.ascontiguousarray(ids)
  n = ids.size
  unique = np.zeros(max(n, 1), ids.dtype)
  inverse = np.zeros(max(n, 1), np.int32)
  counts = np.zeros(max(n, 1), np.int32)
  num = ctypes.c_int32(-1)
  _check(lib.tfde_gpu_unique_with_counts(
      ids.itemsize, _ptr(ids), ctypes.c_int64(n), _ptr(unique), _ptr(inverse),
      _ptr(counts), ctypes.byref(num)))
  k = num.value
  return unique[:k], inverse[:n], counts[:k]


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("seed", range(6))
def test_unique_random(lib, dtype, seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(1, 20000))
  ids = rng.zipf(1.2, n).astype(dtype) * (1 if seed % 2 else -3)
  unique, inverse, counts = _unique(lib, ids)
  want_u, want_inv, want_c = oracles.unique_first_appearance(ids)
  np.testing.assert_array_equal(unique, want_u)
  np.testing.assert_array_equal(inverse, want_inv)
  np.testing.assert_array_equal(counts, want_c)


@pytest.mark.parametrize("ids", [
    np.array([], np.int64), np.array([7], np.int64), np.full(3000, 42, np.int64),
    np.array([2**62, 2**62 - 1, 2**62, -(2**62), 0], np.int64),
    np.array([np.iinfo(np.int32).max, np.iinfo(np.int32).min, 0, -1], np.int32),
], ids=["empty", "one", "all_equal", "near_2^62", "int32_extremes"])
def test_unique_edge_cases(lib, ids):
  unique, inverse, counts = _unique(lib, ids)
  want_u, want_inv, want_c = oracles.unique_first_appearance(ids)
  np.testing.assert_array_equal(unique, want_u)
  np.testing.assert_array_equal(inverse, want_inv)
  np.testing.assert_array_equal(counts, want_c)


# ---- partition ----

def _partition(lib, ids, num_shards, dynamic):
  ids = np.ascontiguousarray(ids)
  n = ids.size
  local = np.zeros(max(n, 1), ids.dtype)
  counts = np.zeros(num_shards, np.int32)
  positions = np.zeros(max(n, 1), np.int32)
  bad = _u64()
  _check(lib.tfde_gpu_partition_by_shard(
      ids.itemsize, _ptr(ids), ctypes.c_int64(n), ctypes.c_int32(num_shards),
      int(dynamic), _ptr(local), _ptr(counts), _ptr(positions), ctypes.byref(bad)))
  return local[:n], counts, positions[:n], bad.value


def _partition_oracle(ids, num_shards, dynamic):
  ids = [int(x) for x in ids]
  grouped, origin = [], []
  for s in range(num_shards):
    for i, x in enumerate(ids):
      if x % num_shards == s:  # Python's % is floor modulo
        grouped.append(x if dynamic else x // num_shards)
        origin.append(i)
  positions = np.zeros(len(ids), np.int64)
  positions[origin] = np.arange(len(ids))
  counts = [sum(1 for x in ids if x % num_shards == s) for s in range(num_shards)]
  return np.array(grouped), np.array(counts), positions


@pytest.mark.parametrize("num_shards", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_partition_static(lib, num_shards, dtype):
  rng = np.random.default_rng(num_shards)
  ids = rng.integers(0, 100000, 5000).astype(dtype)
  local, counts, positions, bad = _partition(lib, ids, num_shards, dynamic=False)
  assert bad == NO_ERROR
  want_local, want_counts, want_pos = _partition_oracle(ids, num_shards, False)
  np.testing.assert_array_equal(local, want_local)
  np.testing.assert_array_equal(counts, want_counts)
  np.testing.assert_array_equal(positions, want_pos)


def test_partition_dynamic_negative_keys(lib):
  ids = np.array([-1, -4, 5, 2**62 + 3, -(2**62) - 1, 0, 7], np.int64)
  local, counts, positions, bad = _partition(lib, ids, 4, dynamic=True)
  assert bad == NO_ERROR
  want_local, want_counts, want_pos = _partition_oracle(ids, 4, True)
  np.testing.assert_array_equal(local, want_local)
  np.testing.assert_array_equal(counts, want_counts)
  np.testing.assert_array_equal(positions, want_pos)


def test_partition_static_rejects_negative_ids(lib):
  ids = np.array([3, 1, -5, 2, -7], np.int64)
  _, _, _, bad = _partition(lib, ids, 2, dynamic=False)
  assert bad == 2  # ids[2] = -5 is the first negative id


def test_partition_empty(lib):
  local, counts, positions, bad = _partition(lib, np.array([], np.int64), 3, False)
  assert bad == NO_ERROR and local.size == 0 and positions.size == 0
  np.testing.assert_array_equal(counts, [0, 0, 0])


# ---- combine and its gradient ----

def _random_bags(rng, batch, num_rows, max_len, weighted):
  lengths = rng.integers(0, max_len + 1, batch)
  lengths[0] = 0  # always one sample with no ids
  splits = np.concatenate([[0], np.cumsum(lengths)])
  n = int(splits[-1])
  inverse = rng.integers(0, num_rows, n).astype(np.int32)
  weights = rng.uniform(-1, 2, n).astype(np.float32) if weighted else None
  if weighted and n:
    weights[rng.integers(0, n)] = 0.0
  return splits, inverse, weights


def _per_sample(splits, values):
  return [list(values[splits[b]:splits[b + 1]]) for b in range(len(splits) - 1)]


def _combine(lib, rows, inverse, splits, weights, combiner, row_type, split_dtype):
  num_rows, dim = rows.shape
  batch = len(splits) - 1
  rows_dev = _rows_as(row_type, rows)
  splits = np.ascontiguousarray(splits, split_dtype)
  inverse = np.ascontiguousarray(inverse, np.int32)
  out = _empty_like_rows(row_type, (batch, dim))
  bad_split, bad_inverse = _u64(), _u64()
  _check(lib.tfde_gpu_embedding_combine(
      row_type, splits.itemsize, _ptr(rows_dev), ctypes.c_int64(num_rows),
      ctypes.c_int64(dim), _ptr(inverse), ctypes.c_int64(inverse.size), _ptr(splits),
      ctypes.c_int64(batch), _ptr(weights), COMBINERS[combiner], _ptr(out),
      ctypes.byref(bad_split), ctypes.byref(bad_inverse)))
  return _rows_back(row_type, out), bad_split.value, bad_inverse.value


def _combine_grad(lib, grad, inverse, splits, weights, combiner, num_unique, row_type,
                  split_dtype):
  batch, dim = grad.shape
  grad_dev = _rows_as(row_type, grad)
  splits = np.ascontiguousarray(splits, split_dtype)
  inverse = np.ascontiguousarray(inverse, np.int32)
  out = _empty_like_rows(row_type, (num_unique, dim))
  bad_split, bad_inverse = _u64(), _u64()
  _check(lib.tfde_gpu_embedding_combine_grad(
      row_type, splits.itemsize, _ptr(grad_dev), ctypes.c_int64(dim), _ptr(inverse),
      ctypes.c_int64(inverse.size), _ptr(splits), ctypes.c_int64(batch), _ptr(weights),
      COMBINERS[combiner], ctypes.c_int64(num_unique), _ptr(out),
      ctypes.byref(bad_split), ctypes.byref(bad_inverse)))
  return _rows_back(row_type, out), bad_split.value, bad_inverse.value


TOLERANCE = {F32: 1e-5, F16: 2e-2, BF16: 6e-2}


@pytest.mark.parametrize("row_type", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("split_dtype", [np.int32, np.int64])
def test_combine_and_grad(lib, row_type, combiner, weighted, split_dtype):
  rng = np.random.default_rng(zlib.crc32(f"{row_type}{combiner}{weighted}".encode()))
  num_rows, dim, batch = 300, 19, 64
  splits, inverse, weights = _random_bags(rng, batch, num_rows, 12, weighted)
  rows = rng.normal(size=(num_rows, dim)).astype(np.float32)
  exact_rows = _rows_back(row_type, _rows_as(row_type, rows))
  out, bad_split, bad_inverse = _combine(lib, rows, inverse, splits, weights, combiner,
                                         row_type, split_dtype)
  assert bad_split == NO_ERROR and bad_inverse == NO_ERROR
  want = oracles.combine(exact_rows, _per_sample(splits, inverse),
                         None if weights is None else _per_sample(splits, weights),
                         combiner)
  tol = TOLERANCE[row_type]
  np.testing.assert_allclose(out, want, rtol=tol, atol=tol)
  assert np.all(out[0] == 0)  # a sample with no ids gives zeros

  grad = rng.normal(size=(batch, dim)).astype(np.float32)
  exact_grad = _rows_back(row_type, _rows_as(row_type, grad))
  got, bad_split, bad_inverse = _combine_grad(lib, grad, inverse, splits, weights, combiner,
                                              num_rows, row_type, split_dtype)
  assert bad_split == NO_ERROR and bad_inverse == NO_ERROR
  want = oracles.combine_grad_dense(
      num_rows, exact_grad, _per_sample(splits, inverse),
      None if weights is None else _per_sample(splits, weights), combiner)
  np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dim", [1, 257])
def test_combine_extreme_widths(lib, dim):
  rng = np.random.default_rng(dim)
  splits, inverse, weights = _random_bags(rng, 40, 50, 30, True)
  rows = rng.normal(size=(50, dim)).astype(np.float32)
  out, _, _ = _combine(lib, rows, inverse, splits, weights, "sqrtn", F32, np.int64)
  want = oracles.combine(rows, _per_sample(splits, inverse), _per_sample(splits, weights),
                         "sqrtn")
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_combine_empty_batch(lib):
  out, bad_split, bad_inverse = _combine(
      lib, np.ones((4, 3), np.float32), np.array([], np.int32), np.array([0]), None,
      "mean", F32, np.int64)
  assert out.shape == (0, 3) and bad_split == NO_ERROR and bad_inverse == NO_ERROR


def test_combine_reports_bad_inverse_and_splits(lib):
  rows = np.ones((5, 2), np.float32)
  _, bad_split, bad_inverse = _combine(lib, rows, np.array([0, 5, 1, -1], np.int32),
                                       np.array([0, 2, 4]), None, "sum", F32, np.int64)
  assert bad_split == NO_ERROR and bad_inverse == 1
  _, bad_split, _ = _combine(lib, rows, np.array([0, 1, 1, 1], np.int32),
                             np.array([0, 3, 2, 4]), None, "sum", F32, np.int64)
  assert bad_split == 2  # splits[2] < splits[1]
  _, bad_split, _ = _combine(lib, rows, np.array([0, 1, 1, 1], np.int32),
                             np.array([0, 2, 3]), None, "sum", F32, np.int64)
  assert bad_split == 2  # splits[-1] != number of ids


def test_combine_grad_is_deterministic(lib):
  rng = np.random.default_rng(0)
  splits, inverse, weights = _random_bags(rng, 512, 7, 40, True)
  grad = rng.normal(size=(512, 33)).astype(np.float32)
  first, _, _ = _combine_grad(lib, grad, inverse, splits, weights, "mean", 7, F32, np.int64)
  for _ in range(3):
    again, _, _ = _combine_grad(lib, grad, inverse, splits, weights, "mean", 7, F32,
                                np.int64)
    np.testing.assert_array_equal(first, again)


# ---- gather ----

def _gather(lib, tables, rows):
  dim = tables[0].shape[1]
  rows = np.ascontiguousarray(rows)
  pointers = (ctypes.c_void_p * len(tables))(*[t.ctypes.data for t in tables])
  table_rows = np.array([t.shape[0] for t in tables], np.int64)
  out = np.zeros((rows.size, dim), np.float32)
  bad = _u64()
  _check(lib.tfde_gpu_gather_from_tables(
      rows.itemsize, len(tables), pointers, _ptr(table_rows), ctypes.c_int64(dim),
      _ptr(rows), ctypes.c_int64(rows.size), _ptr(out), ctypes.byref(bad)))
  return out, bad.value


@pytest.mark.parametrize("num_tables", [1, 3, 70])  # 70 > one launch's 64 tables
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_gather_from_tables(lib, num_tables, dtype):
  rng = np.random.default_rng(num_tables)
  tables = [rng.normal(size=(int(rng.integers(1, 40)), 5)).astype(np.float32)
            for _ in range(num_tables)]
  whole = np.concatenate(tables)
  rows = rng.integers(0, whole.shape[0], 3000).astype(dtype)
  out, bad = _gather(lib, tables, rows)
  assert bad == NO_ERROR
  np.testing.assert_array_equal(out, whole[rows])


def test_gather_reports_row_outside_every_table(lib):
  tables = [np.ones((3, 2), np.float32), np.ones((4, 2), np.float32)]
  _, bad = _gather(lib, tables, np.array([0, 6, 7, -1], np.int64))
  assert bad == 2


def _combine_from_tables(lib, tables, rows, inverse, splits, weights, combiner, split_dtype):
  dim = tables[0].shape[1]
  rows = np.ascontiguousarray(rows)
  splits = np.ascontiguousarray(splits, split_dtype)
  inverse = np.ascontiguousarray(inverse, np.int32)
  pointers = (ctypes.c_void_p * len(tables))(*[t.ctypes.data for t in tables])
  table_rows = np.array([t.shape[0] for t in tables], np.int64)
  out = np.zeros((len(splits) - 1, dim), np.float32)
  bad_row, bad_split, bad_inverse = _u64(), _u64(), _u64()
  _check(lib.tfde_gpu_combine_from_tables(
      rows.itemsize, splits.itemsize, len(tables), pointers, _ptr(table_rows),
      ctypes.c_int64(dim), _ptr(rows), ctypes.c_int64(rows.size), _ptr(inverse),
      ctypes.c_int64(inverse.size), _ptr(splits), ctypes.c_int64(len(splits) - 1),
      _ptr(weights), COMBINERS[combiner], _ptr(out), ctypes.byref(bad_row),
      ctypes.byref(bad_split), ctypes.byref(bad_inverse)))
  return out, bad_row.value, bad_split.value, bad_inverse.value


@pytest.mark.parametrize("num_tables,dim", [(1, 64), (3, 5), (70, 8), (70, 6)],
                         ids=["float4-loads", "odd-width", "70-tables",
                              "70-tables-odd-width"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("index_dtype,split_dtype", [(np.int64, np.int64),
                                                     (np.int32, np.int32),
                                                     (np.int64, np.int32),
                                                     (np.int32, np.int64)])
def test_combine_from_tables(lib, num_tables, dim, combiner, index_dtype, split_dtype):
  rng = np.random.default_rng(zlib.crc32(f"{num_tables}{dim}{combiner}".encode()))
  tables = [rng.normal(size=(int(rng.integers(1, 40)), dim)).astype(np.float32)
            for _ in range(num_tables)]
  whole = np.concatenate(tables)
  rows = rng.permutation(whole.shape[0])[:100].astype(index_dtype)
  splits, inverse, weights = _random_bags(rng, 64, rows.size, 12, combiner != "sum")
  out, bad_row, bad_split, bad_inverse = _combine_from_tables(
      lib, tables, rows, inverse, splits, weights, combiner, split_dtype)
  assert (bad_row, bad_split, bad_inverse) == (NO_ERROR,) * 3
  want = oracles.combine(whole, _per_sample(splits, rows[inverse]),
                         None if weights is None else _per_sample(splits, weights), combiner)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  assert np.all(out[0] == 0)  # a sample with no ids gives zeros


def test_combine_from_tables_reports_row_outside_every_table(lib):
  tables = [np.ones((3, 2), np.float32), np.ones((4, 2), np.float32)]
  _, bad_row, _, _ = _combine_from_tables(lib, tables, np.array([0, 6, 7, -1], np.int64),
                                          np.array([0, 1, 2, 3], np.int32),
                                          np.array([0, 4]), None, "sum", np.int64)
  assert bad_row == 2


# ---- sparse optimizers ----

KINDS = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 3}
HYPER = {
    "sgd": dict(learning_rate=0.1),
    "adagrad": dict(learning_rate=0.1, epsilon=1e-7, initial_accumulator_value=0.1),
    "adam": dict(learning_rate=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-7),
    "ftrl": dict(learning_rate=0.1, l1=0.01, l2=0.02, l2_shrinkage=0.003, beta=0.1,
                 learning_rate_power=-0.5, initial_accumulator_value=0.1),
}


def _apply(lib, kind, hp, step, variables, indices, grad, grad_rows=None):
  if kind == "sgd":
    hyper = [hp["learning_rate"]]
  elif kind == "adagrad":
    hyper = [hp["learning_rate"], hp["epsilon"]]
  elif kind == "adam":
    hyper = [hp["learning_rate"], hp["beta_1"], hp["beta_2"], hp["epsilon"], step]
  else:
    hyper = [hp["learning_rate"], hp["l1"], hp["l2"], hp["l2_shrinkage"], hp["beta"],
             hp["learning_rate_power"]]
  hyper = np.array(hyper, np.float32)
  num_rows, dim = variables[0].shape
  pointers = (ctypes.c_void_p * len(variables))(*[v.ctypes.data for v in variables])
  indices = np.ascontiguousarray(indices)
  grad = np.ascontiguousarray(grad, np.float32)
  grad_rows = None if grad_rows is None else np.ascontiguousarray(grad_rows, np.int32)
  bad_range, bad_repeat = _u64(), _u64()
  _check(lib.tfde_gpu_sparse_apply(
      KINDS[kind], _ptr(hyper), len(variables), pointers, ctypes.c_int64(num_rows),
      ctypes.c_int64(dim), indices.itemsize, _ptr(indices), ctypes.c_int64(indices.size),
      _ptr(grad), ctypes.c_int64(grad.shape[0]), _ptr(grad_rows), ctypes.byref(bad_range),
      ctypes.byref(bad_repeat)))
  return bad_range.value, bad_repeat.value


def _slots(kind, shape, hp):
  if kind == "sgd":
    return []
  if kind == "adagrad":
    return [np.full(shape, hp["initial_accumulator_value"], np.float32)]
  if kind == "adam":
    return [np.zeros(shape, np.float32), np.zeros(shape, np.float32)]
  return [np.full(shape, hp["initial_accumulator_value"], np.float32),
          np.zeros(shape, np.float32)]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_sparse_optimizers_match_keras_formulas(lib, kind, dtype):
  rng = np.random.default_rng(KINDS[kind])
  shape = (200, 17)
  hp = HYPER[kind]
  table = rng.normal(size=shape).astype(np.float32)
  variables = [table] + _slots(kind, shape, hp)
  reference = oracles.NumpyOptimizer(kind, shape, **hp)
  want = table.astype(np.float64)
  for step in range(1, 6):
    rows = rng.choice(shape[0], 40, replace=False).astype(dtype)
    grad = rng.normal(size=(60, shape[1])).astype(np.float32)
    grad_rows = rng.choice(60, 40, replace=False)  # gradients picked by grad_rows
    bad = _apply(lib, kind, hp, step, variables, rows, grad, grad_rows)
    assert bad == (NO_ERROR, NO_ERROR)
    reference.apply(want, rows, grad[grad_rows])
  np.testing.assert_allclose(variables[0], want, rtol=2e-5, atol=2e-5)


def test_sparse_apply_rejects_bad_rows_and_changes_nothing(lib):
  rng = np.random.default_rng(1)
  table = rng.normal(size=(10, 4)).astype(np.float32)
  m, v = np.zeros_like(table), np.zeros_like(table)
  before = [table.copy(), m.copy(), v.copy()]
  grad = np.ones((4, 4), np.float32)
  bad_range, bad_repeat = _apply(lib, "adam", HYPER["adam"], 1, [table, m, v],
                                 np.array([1, 3, 10, 2], np.int64), grad)
  assert bad_range == 2 and bad_repeat == NO_ERROR
  bad_range, bad_repeat = _apply(lib, "adam", HYPER["adam"], 1, [table, m, v],
                                 np.array([1, 3, 5, 3], np.int64), grad)
  assert bad_range == NO_ERROR
  assert bad_repeat >> 32 == 3 and bad_repeat & 0xFFFFFFFF == 1  # ids[3] repeats ids[1]
  for got, want in zip([table, m, v], before):
    np.testing.assert_array_equal(got, want)
