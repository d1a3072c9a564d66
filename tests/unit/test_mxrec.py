"""mxRec's flow (tfde.compat.mxrec) and tfde's own pipeline in TF1 graph
mode (tf.compat.v1.Session), against the numpy oracles."""

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import oracles
from tests.support import sharded_harness as h

DIM = 3
BATCH, SLOTS = 5, 2
ADAM = dict(learning_rate=0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-7)


def _ids(step):
  rng = np.random.default_rng(step)
  pool = np.array([7, -3, 2**62 + 1, 40, -2**50, 11], np.int64)
  return pool[np.minimum(rng.zipf(1.5, (BATCH, SLOTS)) - 1, len(pool) - 1)]


def _rows(sess, table):
  """A graph-mode table's export_rows()."""
  return sess.run(table.table._serialize_to_tensors())  # pylint: disable=protected-access


def _graph(mxrec, expansion=True, capacity=None):
  """The mxRec flow; returns its tensors and ops."""
  mxrec.init(use_dynamic_expansion=expansion)
  optimizer = mxrec.lazy_adam.create_hash_optimizer_by_addr(
      learning_rate=ADAM["learning_rate"], beta1=ADAM["beta_1"], beta2=ADAM["beta_2"],
      epsilon=ADAM["epsilon"])
  table = mxrec.create_table(
      key_dtype=tf.int64, dim=DIM, name="user",
      emb_initializer=tf.random_uniform_initializer(-0.5, 0.5),
      device_vocabulary_size=capacity, optimizer_list=[optimizer])
  ids = tf.compat.v1.placeholder(tf.int64, [None, SLOTS])
  target = tf.compat.v1.placeholder(tf.float32, [None, SLOTS, DIM])
  emb = mxrec.sparse_lookup(table, ids, is_train=True)
  loss = tf.reduce_sum(tf.square(emb - target))
  local = tf.compat.v1.get_collection(mxrec.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
  addresses = tf.compat.v1.get_collection(mxrec.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
  grads = tf.gradients(loss, local)
  train = optimizer.apply_gradients(list(zip(grads, addresses)))
  return dict(table=table, ids=ids, target=target, emb=emb, train=train,
              addresses=addresses[0], optimizer=optimizer)


def test_mxrec_dynamic_expansion_flow_equals_dict_oracle(op_backend):
  del op_backend
  from tfde.compat import mxrec  # pylint: disable=g-import-not-at-top
  oracle = oracles.DynamicTableOracle(DIM, "adam", ADAM, init=("uniform", -0.5, 0.5))
  with tf.Graph().as_default():
    g = _graph(mxrec)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for step in range(6):
        ids = _ids(step)
        target = np.random.default_rng(50 + step).normal(size=(BATCH, SLOTS, DIM))
        out, _ = sess.run([g["emb"], g["train"]], {g["ids"]: ids, g["target"]: target})
        want = oracle.train_step([([[int(k)] for k in ids.ravel()], None, "sum",
                                   target.reshape(-1, DIM), 1.0)])[0]
        np.testing.assert_allclose(out.reshape(-1, DIM), want, rtol=2e-5, atol=2e-6,
                                   err_msg=f"step {step}")
      rows = _rows(sess, g["table"])
  np.testing.assert_array_equal(rows["ids"], sorted(oracle.rows))
  np.testing.assert_allclose(rows["table"], [oracle.rows[k]["w"] for k in sorted(oracle.rows)],
                             rtol=2e-5, atol=2e-6)
  assert int(rows["step"]) == 6


def test_an_invalid_address_is_refused_and_changes_nothing(op_backend):
  del op_backend
  from tfde.compat import mxrec  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    g = _graph(mxrec)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      feed = {g["ids"]: _ids(0), g["target"]: np.zeros((BATCH, SLOTS, DIM))}
      sess.run(g["train"], feed)
      before = _rows(sess, g["table"])
      real = sess.run(g["addresses"], feed)
      stale = real.copy()
      stale[-1] = 10**6  # no such row
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=r"addresses\[\d+\] = 1000000 is not a row of the table"):
        sess.run(g["train"], {**feed, g["addresses"]: stale})
      after = _rows(sess, g["table"])
  np.testing.assert_array_equal(after["table"], before["table"])


def test_without_expansion_a_table_keeps_its_capacity():
  from tfde.compat import mxrec  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    g = _graph(mxrec, expansion=False, capacity=3)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for step in range(4):
        sess.run(g["train"], {g["ids"]: _ids(step),
                              g["target"]: np.zeros((BATCH, SLOTS, DIM))})
      assert len(_rows(sess, g["table"])["ids"]) == 3
  with tf.Graph().as_default():
    mxrec.init(use_dynamic_expansion=False)
    with pytest.raises(ValueError, match="device_vocabulary_size bounds the table"):
      mxrec.create_table(dim=2, name="t", optimizer_list=[
          mxrec.gradient_descent.create_hash_optimizer(learning_rate=0.1)])


def test_optimizers_take_mxrecs_defaults():
  """mxRec's documented defaults, not tfde's Keras ones: Adagrad starts its
  accumulators at 0.9 and divides by their square root (TF1's rule, no
  epsilon; one step held to numpy), LazyAdam's epsilon is 1e-8; arguments
  that change nothing here (name, use_locking) are taken; SGD by address
  decays weights in mxRec, which tfde cannot, so it is refused unless
  weight_decay=0."""
  from tfde.compat import mxrec  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    mxrec.init(use_dynamic_expansion=True)
    optimizer = mxrec.adagrad.create_hash_optimizer(learning_rate=0.1, use_locking=True,
                                                    name="Adagrad")
    table = mxrec.create_table(key_dtype=tf.int64, dim=2, name="t",
                               emb_initializer=tf.zeros_initializer(),
                               optimizer_list=[optimizer])
    emb = mxrec.sparse_lookup(table, tf.constant([[5]], tf.int64), is_train=True)
    loss = tf.reduce_sum(emb * tf.constant([[[1.0, 2.0]]]))
    local = tf.compat.v1.get_collection(mxrec.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
    addresses = tf.compat.v1.get_collection(mxrec.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
    train = optimizer.apply_gradients(list(zip(tf.gradients(loss, local), addresses)))
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(train)
      rows = _rows(sess, table)
  grad = np.array([1.0, 2.0])
  np.testing.assert_allclose(rows["table"][0], -0.1 * grad / np.sqrt(0.9 + grad**2),
                             rtol=1e-6)
  adam = mxrec.lazy_adam.create_hash_optimizer_by_address(name="LazyAdam")
  assert adam.sparse_optimizer.hyper["epsilon"] == 1e-8
  assert adam.sparse_optimizer.learning_rate == 0.001
  with pytest.raises(ValueError, match="weight_decay=0.0001: tfde's sparse optimizers "
                                       "have no weight decay"):
    mxrec.gradient_descent.create_hash_optimizer_by_addr(0.1)
  assert mxrec.gradient_descent.create_hash_optimizer_by_addr(
      0.1, weight_decay=0).sparse_optimizer.learning_rate == 0.1


def test_apply_gradients_needs_addresses_from_sparse_lookup():
  from tfde.compat import mxrec  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default():
    g = _graph(mxrec)
    with pytest.raises(ValueError, match="is not a row-address tensor from sparse_lookup"):
      g["optimizer"].apply_gradients([(tf.zeros([1, DIM]), g["addresses"] + 0)])


# ---- tfde's own pipeline in a TF1 graph (an estimator's model_fn)


def _placeholder(value):
  """A TF1 placeholder of `value`'s kind, dtype and shape but its batch
  (a ragged or sparse tensor's of its components)."""
  v1 = tf.compat.v1
  if isinstance(value, tf.RaggedTensor):
    return tf.RaggedTensor.from_row_splits(v1.placeholder(value.dtype, [None]),
                                           v1.placeholder(value.row_splits.dtype, [None]),
                                           validate=False)
  if isinstance(value, tf.SparseTensor):
    return tf.SparseTensor(v1.placeholder(tf.int64, [None, 2]),
                           v1.placeholder(value.dtype, [None]), v1.placeholder(tf.int64, [2]))
  return v1.placeholder(value.dtype, [None] + value.shape.as_list()[1:])


@pytest.mark.parametrize("kind", ["adam", "ftrl"])
def test_sharded_lookup_trains_in_a_tf1_session(op_backend, kind):
  """The pipeline in a plain TF1 graph: static tables equal the unsharded
  numpy reference, a dynamic table the dict oracle."""
  del op_backend
  steps = 4
  batches = [h.make_batch(s, weighted=True, seed=3) for s in range(steps)]
  configs = h.feature_configs(kind)
  dynamic = tfde.TableConfig(name="D", vocabulary_size=None, embedding_dim=4,
                             optimizer=h.sparse_optimizer(kind), combiner="sum",
                             initializer="uniform", dynamic=tfde.DynamicConfig(admit_after=2))
  hashed = lambda ids: ids * 7919 - 2**40  # 64-bit keys, tf or Python ints
  oracle = oracles.DynamicTableOracle(4, kind, h.numpy_optimizer(kind, (1, 4)).hp,
                                      init=("uniform", -0.05, 0.05), admit_after=2)
  fed = [h.replica_inputs(batch, 0, 1) for batch in batches]  # (inputs, weights, targets)
  with tf.Graph().as_default():
    lookup = h.sharded_lookup(dict(
        configs, d_hashed=tfde.FeatureConfig(name="d_hashed", table=dynamic)))
    static = {n: t for n, t in lookup.tables.items() if not t.is_dynamic}
    # One train op fed each batch, as an estimator's graph is run.
    placeholders = tf.nest.map_structure(_placeholder, fed[0])
    inputs, weights, targets = placeholders
    outputs = lookup(dict(inputs, d_hashed=hashed(inputs["a_dense"])), weights)
    loss = h.replica_loss(outputs, targets) + tf.reduce_sum(
        tf.square(outputs["d_hashed"] - targets["a_dense"])) / h.GLOBAL_BATCH
    train_op = tf.gradients(loss, lookup.trainable_variables)
    whole = {n: t._gathered("table") for n, t in static.items()}  # pylint: disable=protected-access
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      initial = sess.run(whole)
      for batch in fed:
        sess.run(train_op, feed_dict=dict(zip(
            tf.nest.flatten(placeholders, expand_composites=True),
            [t.numpy() for t in tf.nest.flatten(batch, expand_composites=True)])))
      final = sess.run(whole)
      rows = sess.run(lookup.tables["D"]._serialize_to_tensors())  # pylint: disable=protected-access
  _, want = h.reference_run(configs, initial, batches)
  for name in static:
    np.testing.assert_allclose(final[name], want[name], rtol=1e-5, atol=1e-6,
                               err_msg=f"table {name}")
  for batch in batches:
    oracle.train_step([([[hashed(k) for k in row] for row in batch["a_dense"]["ids"]],
                        None, "sum", batch["a_dense"]["target"], 1.0 / h.GLOBAL_BATCH)])
  ids = sorted(oracle.rows)
  np.testing.assert_array_equal(rows["ids"], ids)
  np.testing.assert_allclose(rows["table"], [oracle.rows[k]["w"] for k in ids],
                             rtol=1e-5, atol=1e-6)
