"""tfde inside a CUDA-enabled TensorFlow: every op with a GPU kernel runs on
the GPU and equals its pure-TF twin there, and the sharded pipeline trains
GPU-held tables to the unsharded numpy reference, under no strategy and
under MirroredStrategy over the GPUs (tests/conftest.py splits each GPU into
two logical ones, so N = 2 runs on a one-GPU machine).

Skips where TensorFlow sees no GPU. `TFDE_GPU_TEST_AS=CPU` runs the same
checks on logical CPUs: a dry run of this file's logic on a machine without
a GPU, which verifies nothing about GPUs.

  TF_FORCE_GPU_ALLOW_GROWTH=true python -m pytest tests/unit/test_gpu.py
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import tfde
import tfde.ops
from tests.support import oracles
from tests.support import sharded_harness as h
from tests.unit.test_sharded import sharded_run

DEVICE_TYPE = os.environ.get("TFDE_GPU_TEST_AS", "GPU")
DEVICES = [d.name for d in tf.config.list_logical_devices(DEVICE_TYPE)]
if not DEVICES:
  pytest.skip(f"TensorFlow {tf.__version__} sees no GPU "
              f"(built with CUDA: {tf.test.is_built_with_cuda()})",
              allow_module_level=True)
if not tfde.ops.kernels_available():
  pytest.fail(f"tfde's op library did not load: {tfde.ops.native.load_error()}",
              pytrace=False)
DEVICE = DEVICES[0]
RTOL, ATOL = 1e-5, 1e-6


def _ran_here(*tensors):
  for t in tf.nest.flatten(tensors):
    assert f"{DEVICE_TYPE}:0" in t.device, f"ran on {t.device}, not {DEVICE}"


def _both(fn):
  """fn() on the kernels and on the twins, on the device; the kernels'
  outputs must have been computed there (eager placement falls back to the
  CPU, silently, where no kernel of the device's type exists)."""
  with tf.device(DEVICE):
    with tfde.ops.backend(tfde.ops.KERNELS):
      got = fn()
    _ran_here(got)
    with tfde.ops.backend(tfde.ops.REFERENCE):
      want = fn()
  return got, want


def _assert_equal(got, want):
  for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
    np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64),
                               rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_unique_and_partition_run_on_the_device(dtype):
  rng = np.random.default_rng(0)
  ids = tf.constant(rng.zipf(1.2, 5000) % 3000, dtype)
  _assert_equal(*_both(lambda: tfde.ops.unique_with_counts(ids)))
  for shards in (1, 2, 4):
    _assert_equal(*_both(lambda: tfde.ops.partition_by_shard(ids, shards)))


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_combine_and_its_gradient_run_on_the_device(dtype, combiner, weighted):
  rng = np.random.default_rng(1)
  lengths = rng.integers(0, 9, 300)  # empty samples too
  row_splits = tf.constant(np.concatenate([[0], np.cumsum(lengths)]), tf.int64)
  n = int(lengths.sum())
  inverse = tf.constant(rng.integers(0, 70, n), tf.int32)
  rows = tf.constant(rng.normal(size=(70, 24)), dtype)
  weights = tf.constant(rng.uniform(0.5, 2, n), tf.float32) if weighted else None
  grad = tf.constant(rng.normal(size=(300, 24)), dtype)
  tol = dict(rtol=RTOL, atol=ATOL) if dtype == tf.float32 else dict(rtol=2e-2, atol=2e-2)
  got, want = _both(lambda: tfde.ops.embedding_combine(rows, inverse, row_splits, weights,
                                                       combiner))
  np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), **tol)
  # The numpy oracle too: the twin is a second spec, not the only one.
  ids = [list(np.asarray(inverse)[row_splits[b]:row_splits[b + 1]]) for b in range(300)]
  ws = None if weights is None else [
      list(np.asarray(weights)[row_splits[b]:row_splits[b + 1]]) for b in range(300)]
  np.testing.assert_allclose(
      np.asarray(got, np.float64),
      oracles.combine(np.asarray(tf.cast(rows, tf.float32), np.float64), ids, ws, combiner),
      **tol)
  got, want = _both(lambda: tfde.ops.embedding_combine_grad(
      grad, inverse, row_splits, weights, 70, combiner))
  np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), **tol)


def test_gather_from_tables_runs_on_the_device():
  rng = np.random.default_rng(2)
  with tf.device(DEVICE):
    tables = [tf.Variable(rng.normal(size=(v, 8)).astype(np.float32)) for v in (40, 7, 90)]
  bases = [0, 40, 47]
  rows = tf.constant(rng.integers(0, 137, 400), tf.int64)
  got, want = _both(lambda: tfde.ops.gather_from_tables(tables, rows, bases))
  _assert_equal(got, want)
  full = np.concatenate([t.numpy() for t in tables])
  np.testing.assert_array_equal(got.numpy(), full[rows.numpy()])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("sizes,dim", [((40, 7, 90), 64), ((13, 1, 30), 6),
                                        ((3,) * 70, 8), ((3,) * 70, 6)],
                         ids=["vector-loads", "odd-width", "70-tables",
                              "70-tables-odd-width"])
def test_combine_from_tables_runs_on_the_device(combiner, weighted, sizes, dim):
  """The fused forward reads each id's row straight from its table on
  the GPU: float4 loads at width 64, one float at a time at width 6, and
  over 64 tables in several launches that add up."""
  rng = np.random.default_rng(3)
  with tf.device(DEVICE):
    tables = [tf.Variable(rng.normal(size=(v, dim)).astype(np.float32)) for v in sizes]
  bases = np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()
  total = int(sum(sizes))
  lengths = rng.integers(0, 9, 200)  # empty samples too
  row_splits = tf.constant(np.concatenate([[0], np.cumsum(lengths)]), tf.int64)
  n = int(lengths.sum())
  rows = tf.constant(rng.permutation(total)[:min(total, 150)], tf.int64)
  inverse = tf.constant(rng.integers(0, rows.shape[0], n), tf.int32)
  weights = tf.constant(rng.uniform(0.5, 2, n), tf.float32) if weighted else None
  got, want = _both(lambda: tfde.ops.combine_from_tables(tables, rows, bases, inverse,
                                                         row_splits, weights, combiner))
  _assert_equal(got, want)
  # The op itself, as the pipeline calls it (an int32 inverse), has a GPU
  # kernel: not gather-then-combine, not a silent fallback to the CPU.
  with tf.device(DEVICE):
    direct = tfde.ops.native.load().tfde_combine_from_tables(
        [t.handle for t in tables], rows, inverse, row_splits,
        tf.zeros([0]) if weights is None else weights, bases=bases, combiner=combiner)
  _ran_here(direct)
  full = np.concatenate([t.numpy() for t in tables]).astype(np.float64)
  read = rows.numpy()[inverse.numpy()]
  splits = row_splits.numpy()
  ids = [list(read[splits[b]:splits[b + 1]]) for b in range(200)]
  ws = None if weights is None else [
      list(weights.numpy()[splits[b]:splits[b + 1]]) for b in range(200)]
  want = oracles.combine(full, ids, ws, combiner)
  for out in (got, direct):
    np.testing.assert_allclose(out.numpy(), want, rtol=RTOL, atol=1e-5)


def test_combine_from_tables_refuses_a_row_outside_the_tables_on_the_device():
  with tf.device(DEVICE):
    tables = [tf.Variable(tf.zeros([3, 4])), tf.Variable(tf.zeros([4, 4]))]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"rows\[\D*1\D*\] =\D*7\D*outside every table"):
      tfde.ops.combine_from_tables(tables, tf.constant([6, 7], tf.int64), [0, 3],
                                   tf.constant([0, 1], tf.int32),
                                   tf.constant([0, 2], tf.int64))


SCALARS = {"sgd": [0.3], "adagrad": [0.3, 1e-7], "adam": [0.05, 0.8, 0.95, 1e-7, 3],
           "ftrl": [0.2, 0.001, 0.01, 0.002, 0.1, -0.5]}
SLOTS = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 2}


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam", "ftrl"])
@pytest.mark.parametrize("index_dtype", [tf.int32, tf.int64])
def test_sparse_updates_run_on_the_device(kind, index_dtype):
  rng = np.random.default_rng(3)
  start = [rng.normal(size=(500, 16)).astype(np.float32)]
  start += [rng.uniform(0.1, 1, size=(500, 16)).astype(np.float32)
            for _ in range(SLOTS[kind])]
  indices = tf.constant(rng.permutation(500)[:180], index_dtype)
  grad = tf.constant(rng.normal(size=(180, 16)), tf.float32)
  finals = {}
  for backend in (tfde.ops.KERNELS, tfde.ops.REFERENCE):
    with tf.device(DEVICE):
      variables = [tf.Variable(x) for x in start]
    _ran_here([v.handle for v in variables])
    with tf.device(DEVICE), tfde.ops.backend(backend):
      tfde.ops.sparse_apply(kind, variables, indices, grad, SCALARS[kind])
    finals[backend] = [v.numpy() for v in variables]
  for got, want in zip(finals[tfde.ops.KERNELS], finals[tfde.ops.REFERENCE]):
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
  untouched = np.setdiff1d(np.arange(500), indices.numpy())
  np.testing.assert_array_equal(finals[tfde.ops.KERNELS][0][untouched], start[0][untouched])
  assert not np.allclose(finals[tfde.ops.KERNELS][0], start[0])


def _mirrored(n):
  if len(DEVICES) < n:
    pytest.skip(f"{len(DEVICES)} logical {DEVICE_TYPE}s here, {n} asked")
  return tf.distribute.MirroredStrategy(DEVICES[:n])


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam", "ftrl", "rowwise_adagrad"])
@pytest.mark.parametrize("runtime", ["none", "mirrored1", "mirrored2"])
def test_training_equals_unsharded_reference(runtime, kind, weighted):
  """The harness of tests/unit/test_sharded.py (three tables, five features of
  every input kind, 10 steps) with the tables on the device."""
  strategy = (tf.distribute.get_strategy() if runtime == "none"
              else _mirrored(int(runtime[-1])))
  variant = h.variant_of(kind)
  configs = h.feature_configs(kind, variant)
  n = strategy.num_replicas_in_sync
  batches = [h.make_batch(s, weighted, seed=variant, num_replicas=n) for s in range(10)]
  with tf.device(DEVICE) if runtime == "none" else strategy.scope():
    initial, outputs, final, _, lookup = sharded_run(strategy, configs, batches, weighted)
  for name, table in lookup.tables.items():
    for replica in range(n):
      device = table.shards[replica].device
      assert f"{DEVICE_TYPE}:{replica}" in device, (name, device)
  want_outputs, want_tables = h.reference_run(configs, initial, batches)
  for f in h.FEATURES:
    np.testing.assert_allclose(outputs[f], want_outputs[f], rtol=RTOL, atol=ATOL,
                               err_msg=f"feature {f}")
  for name in want_tables:
    np.testing.assert_allclose(final[name], want_tables[name], rtol=RTOL, atol=ATOL,
                               err_msg=f"table {name}")
    assert not np.allclose(final[name], initial[name])


def test_the_one_replica_step_needs_no_cpu_kernel():
  """With soft placement off, every op of a forward and training step
  pinned to the device must have a kernel there: nothing falls back to the
  CPU implicitly (the dense, int64 ids of the benchmarks). The input
  checks' message strings are built on the CPU on purpose (string ops
  have no GPU kernels), and the Asserts read them from host memory."""
  rng = np.random.default_rng(4)
  configs = {f"f{t}": tfde.FeatureConfig(name=f"f{t}", table=tfde.TableConfig(
      name=f"t{t}", vocabulary_size=1000, embedding_dim=16, combiner="sum",
      optimizer=tfde.optimizers.Adam(learning_rate=0.01))) for t in range(2)}
  ids = {f: tf.constant(rng.integers(0, 1000, (64, 5)), tf.int64) for f in configs}
  with tf.device(DEVICE):
    lookup = tfde.lookup.ShardedLookup(configs)

  @tf.function
  def step():
    with tf.device(DEVICE):
      with tf.GradientTape() as tape:
        outputs = lookup(ids)
        loss = tf.add_n([tf.reduce_sum(o * o) for o in outputs.values()])
      tape.gradient(loss, lookup.trainable_variables)
      return outputs

  before = {n: t.full_table() for n, t in lookup.tables.items()}
  soft = tf.config.get_soft_device_placement()
  tf.config.set_soft_device_placement(False)
  try:
    outputs = step()
  finally:
    tf.config.set_soft_device_placement(soft)
  _ran_here(outputs)
  for f, cfg in configs.items():
    want = oracles.combine(before[cfg.table.name].astype(np.float64),
                           ids[f].numpy().tolist(), None, "sum")
    np.testing.assert_allclose(outputs[f].numpy(), want, rtol=RTOL, atol=ATOL)
    assert not np.allclose(lookup.tables[cfg.table.name].full_table(), before[cfg.table.name])
