"""SOK's v2 API (tfde.compat.sok) against tf.nn and numpy oracles."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfde.compat.sok as sok
from tests.support import oracles
from tests.unit.test_sharded import mirrored
from tfde import optimizers as tfde_optimizers


def _sparse(ids_per_row, width=4):
  indices = [[b, j] for b, row in enumerate(ids_per_row) for j in range(len(row))]
  values = [x for row in ids_per_row for x in row]
  return tf.SparseTensor(tf.constant(indices, tf.int64), tf.constant(values, tf.int64),
                         [len(ids_per_row), width])


def test_lookup_sparse_matches_tf_nn():
  sok.init()
  rng = np.random.default_rng(0)
  a_values = rng.normal(size=(30, 4)).astype(np.float32)
  b_values = rng.normal(size=(20, 4)).astype(np.float32)
  a, b = sok.Variable(a_values), sok.Variable(b_values)
  ids_a = _sparse([[1, 2], [3], [4, 4, 5]])
  ids_b = _sparse([[7], [8, 9], [10]])
  weights_b = tf.SparseTensor(ids_b.indices, tf.constant([0.5, 2.0, 1.0, 3.0]),
                              ids_b.dense_shape)
  out = sok.lookup_sparse([a, b], [ids_a, ids_b], sp_weights=[None, weights_b],
                          combiners=["mean", "sqrtn"])
  np.testing.assert_allclose(
      out[0].numpy(), tf.nn.embedding_lookup_sparse(a_values, ids_a, None,
                                                    combiner="mean").numpy(), rtol=1e-6)
  np.testing.assert_allclose(
      out[1].numpy(), tf.nn.embedding_lookup_sparse(b_values, ids_b, weights_b,
                                                    combiner="sqrtn").numpy(), rtol=1e-6)


def test_lookup_sparse_defaults_and_single_forms_are_soks():
  """SOK's defaults: no combiners means "mean" for every lookup; one
  variable and one SparseTensor (not lists) give one tensor, and a single
  combiner may be a string."""
  sok.init()
  values = np.arange(20, dtype=np.float32).reshape(10, 2)
  v = sok.Variable(values)
  ids = _sparse([[1, 3], [4]], width=2)
  want_mean = tf.nn.embedding_lookup_sparse(values, ids, None, combiner="mean").numpy()
  np.testing.assert_array_equal(sok.lookup_sparse([v], [ids])[0].numpy(), want_mean)
  single = sok.lookup_sparse(v, ids, combiners="sum")
  assert tf.is_tensor(single)
  np.testing.assert_array_equal(
      single.numpy(), tf.nn.embedding_lookup_sparse(values, ids, None, combiner="sum").numpy())
  np.testing.assert_array_equal(sok.lookup_sparse(v, ids).numpy(), want_mean)


def test_wrapped_keras_adam_is_lazy_adam_on_touched_rows():
  rng = np.random.default_rng(1)
  start = rng.normal(size=(12, 3)).astype(np.float32)
  v = sok.Variable(start)
  dense = tf.Variable(tf.ones([3, 1]))
  wrapper = sok.OptimizerWrapper(keras.optimizers.Adam(learning_rate=0.1))
  reference = oracles.NumpyOptimizer("adam", start.shape, learning_rate=0.1)
  want = start.astype(np.float64)
  batches = [[[1, 2], [2]], [[5], [1, 7]], [[2], [2, 2]]]
  for batch in batches:
    ids = _sparse(batch)
    with tf.GradientTape() as tape:
      emb = sok.lookup_sparse([v], [ids], combiners=["sum"])[0]
      loss = tf.reduce_sum(emb @ dense)
    sok_vars, others = sok.split_embedding_variable_from_others([v, dense])
    assert sok_vars == [v] and others == [dense]
    grads = tape.gradient(loss, sok_vars)
    assert isinstance(grads[0], tf.IndexedSlices)
    wrapper.apply_gradients(zip(grads, sok_vars))
    counts = {}
    for row in batch:
      for i in row:
        counts[i] = counts.get(i, 0) + 1
    rows = sorted(counts)
    reference.apply(want, rows, [np.full(3, counts[r], np.float64) for r in rows])
  np.testing.assert_allclose(v.numpy(), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(v.numpy()[[0, 3, 4, 6, 8]], start[[0, 3, 4, 6, 8]])


def test_sok_errors():
  with pytest.raises(ValueError, match="mode must be 'distributed'"):
    sok.Variable(np.zeros((4, 2), np.float32), mode="localized")
  with pytest.raises(ValueError, match="comm_tool must be"):
    sok.init(comm_tool="mpi")
  v = sok.Variable(np.zeros((4, 2), np.float32))
  with pytest.raises(ValueError, match="one entry per feature"):
    sok.lookup_sparse([v], [_sparse([[1]]), _sparse([[2]])])
  with pytest.raises(ValueError, match="is not a sok.Variable"):
    sok.lookup_sparse([tf.Variable(tf.zeros([4, 2]))], [_sparse([[1]])])
  with mirrored(2).scope():
    with pytest.raises(ValueError, match="one shard per process"):
      sok.Variable(np.zeros((4, 2), np.float32))


# ---- DynamicVariable and SOK v1


def test_dynamic_variable_trains_like_the_dict_oracle():
  sok.init()
  dv = sok.DynamicVariable(dimension=3, initializer=keras.initializers.RandomUniform(-0.5, 0.5))
  optimizer = sok.OptimizerWrapper(keras.optimizers.Adam(learning_rate=0.05))
  hp = dict(learning_rate=0.05, beta_1=0.9, beta_2=0.999, epsilon=1e-7)
  table = sok._table_of(dv)  # pylint: disable=protected-access
  oracle = oracles.DynamicTableOracle(3, "adam", hp, init=("uniform", -0.5, 0.5),
                                      seed=table.config.seed)
  rng = np.random.default_rng(3)
  for step in range(5):
    rows = [[int(x) for x in rng.choice([-2**40, 5, 9, 2**62, -1], 2)] for _ in range(4)]
    target = rng.normal(size=(4, 3)).astype(np.float32)
    with tf.GradientTape() as tape:
      out = sok.lookup_sparse([dv], [_sparse(rows)], combiners=["mean"])[0]
      loss = tf.reduce_sum(tf.square(out - target))
    grads = tape.gradient(loss, [dv])
    assert isinstance(grads[0], tf.IndexedSlices)
    optimizer.apply_gradients(zip(grads, [dv]))
    want = oracle.train_step([(rows, None, "mean", target, 1.0)])[0]
    np.testing.assert_allclose(out.numpy(), want, rtol=2e-5, atol=2e-6, err_msg=f"step {step}")
  exported = table.export_rows()
  np.testing.assert_array_equal(exported["ids"], sorted(oracle.rows))
  np.testing.assert_allclose(exported["table"], [oracle.rows[k]["w"] for k in sorted(oracle.rows)],
                             rtol=2e-5, atol=2e-6)




@pytest.mark.parametrize("use_hashtable", [False, True], ids=["static", "hashtable"])
def test_v1_distributed_embedding_combines_each_slot(use_hashtable):
  sok.Init(global_batch_size=3)
  layer = sok.DistributedEmbedding("mean", max_vocabulary_size_per_gpu=50,
                                   embedding_vec_size=4, slot_num=2, max_nnz=3,
                                   use_hashtable=use_hashtable,
                                   embedding_initializer=keras.initializers.RandomUniform(-1, 1))
  # batch 3 x slot_num 2 = 6 rows of up to 3 ids.
  rows = [[1, 2], [3], [], [4, 4, 5], [6], [7, 8, 9]]
  out = layer(_sparse(rows, width=3))
  assert out.shape == (3, 2, 4)
  table = layer.table
  if use_hashtable:
    exported = table.export_rows()
    values = dict(zip(exported["ids"].tolist(), exported["table"]))
    full = np.array([values.get(i, np.zeros(4)) for i in range(10)])
    assert sorted(values) == list(range(1, 10))  # every id seen got a row
  else:
    full = table.full_table()[:10]
  want = oracles.combine(full, rows, None, "mean").reshape(3, 2, 4)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
  # The table's variables are the layer's weights, as in SOK.
  embedding_vars, others = sok.split_embedding_variable_from_others(
      layer.trainable_weights + [tf.Variable(1.0)])
  assert embedding_vars == table.local_variables() and len(others) == 1


def test_v1_training_loop_with_split_and_sok_adam():
  sok.Init(global_batch_size=2)
  layer = sok.All2AllDenseEmbedding(max_vocabulary_size_per_gpu=20, embedding_vec_size=2,
                                    slot_num=2, nnz_per_slot=1, use_hashtable=False,
                                    embedding_initializer=keras.initializers.Constant(0.5))
  emb_opt = sok.optimizers.Adam(learning_rate=0.1)
  ids = tf.constant([[[1], [2]], [[3], [1]]], tf.int64)
  losses = []
  for _ in range(10):
    with tf.GradientTape() as tape:
      out = layer(ids)
      loss = tf.reduce_sum(tf.square(out - 2.0))
    emb_vars, _ = sok.split_embedding_variable_from_others(layer.trainable_weights)
    grads = tape.gradient(loss, emb_vars)
    emb_opt.apply_gradients(zip(grads, emb_vars))
    losses.append(float(loss))
  assert out.shape == (2, 2, 1, 2)
  assert losses[-1] < 0.2 * losses[0], losses
  full = layer.table.full_table()
  np.testing.assert_array_equal(full[[0, 4, 5]], 0.5)  # untouched rows
  dynamic = sok.All2AllDenseEmbedding(20, 2, slot_num=1, nnz_per_slot=1, dynamic_input=True)
  assert dynamic(tf.constant([2**50, -9], tf.int64)).shape == (2, 2)


def test_a_refused_optimizer_switches_no_table():
  """The wrapper checks every table before it switches any: row-wise
  Adagrad, which a dynamic variable cannot keep, is refused by name and the
  static variable beside it keeps its optimizer."""
  static = sok.Variable(np.zeros((4, 2), np.float32))
  dynamic = sok.DynamicVariable(dimension=2)
  kinds = [sok._table_of(v).optimizer.kind for v in (static, dynamic)]  # pylint: disable=protected-access
  wrapper = sok.OptimizerWrapper(tfde_optimizers.RowwiseAdagrad())
  grads = [tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0], tf.int64)) for _ in range(2)]
  with pytest.raises(ValueError, match="'rowwise_adagrad' keeps one slot value per row, "
                                       "and a dynamic table"):
    wrapper.apply_gradients(zip(grads, [static, dynamic]))
  assert [sok._table_of(v).optimizer.kind for v in (static, dynamic)] == kinds  # pylint: disable=protected-access
