"""tfde.feature_column.group_embedding_column_scope against the same
columns made outside the scope, in a TF1 graph (what input_layer builds)."""

import numpy as np
import pytest
import tensorflow as tf

import tfde

BATCH = 6


def _columns(rng, scoped, max_norm=None):
  """Three embedding columns: two of width 4 (fused), one of width 3, over
  identity, hashed and weighted categorical columns, all three combiners;
  `max_norm` on the first and last (rows drawn with norms about 2)."""
  fc = tf.feature_column
  tables = {"user": rng.normal(size=(30, 4)), "item": rng.normal(size=(40, 4)),
            "tag": rng.normal(size=(20, 3))}
  init = {k: tf.compat.v1.constant_initializer(v) for k, v in tables.items()}

  def make():
    return [
        fc.embedding_column(fc.categorical_column_with_identity("user", 30), 4,
                            combiner="mean", initializer=init["user"],
                            max_norm=max_norm),
        fc.embedding_column(fc.categorical_column_with_hash_bucket("item", 40, tf.int64),
                            4, combiner="sum", initializer=init["item"]),
        fc.embedding_column(fc.weighted_categorical_column(
            fc.categorical_column_with_identity("tag", 20), "tag_weight"), 3,
                            combiner="sqrtn", initializer=init["tag"],
                            max_norm=max_norm and 2 * max_norm),
    ]

  if not scoped:
    return make()
  with tfde.feature_column.group_embedding_column_scope(name="ads"):
    return make()


def _features(rng):
  def sparse(vocab, weights=False):
    idx, vals, ws = [], [], []
    for b in range(BATCH):
      for k in range(int(rng.integers(0, 4))):
        idx.append([b, k])
        vals.append(int(rng.integers(0, vocab)))
        ws.append(float(rng.uniform(-0.5, 2.0)))  # some weights <= 0
    idx = np.array(idx, np.int64).reshape(-1, 2)
    st = tf.SparseTensor(idx, tf.constant(vals, tf.int64, shape=[len(vals)]), [BATCH, 4])
    wt = tf.SparseTensor(idx, tf.constant(ws, tf.float32, shape=[len(ws)]), [BATCH, 4])
    return st, wt
  user, _ = sparse(30)
  item, _ = sparse(1000)
  tag, tag_weight = sparse(20, weights=True)
  return {"user": user, "item": item, "tag": tag, "tag_weight": tag_weight}


@pytest.mark.parametrize("seed,max_norm", [(0, None), (1, None), (2, None), (3, 1.0)])
def test_grouped_columns_equal_plain_columns(op_backend, seed, max_norm):
  with tf.Graph().as_default() as graph:
    rng = np.random.default_rng(seed)
    features = _features(rng)
    plain = _columns(np.random.default_rng(100 + seed), scoped=False, max_norm=max_norm)
    grouped = _columns(np.random.default_rng(100 + seed), scoped=True, max_norm=max_norm)
    assert [tfde.feature_column.group_of(c) for c in grouped] == ["ads"] * 3
    assert tfde.feature_column.group_of(plain[0]) is None
    with tf.compat.v1.variable_scope("plain"):
      want = tf.compat.v1.feature_column.input_layer(features, plain)
    with tf.compat.v1.variable_scope("grouped"):
      got = tf.compat.v1.feature_column.input_layer(features, grouped)
    target = tf.constant(np.random.default_rng(seed).normal(size=(BATCH, 11)), tf.float32)
    grads = {}
    for name, out in (("plain", want), ("grouped", got)):
      variables = tf.compat.v1.get_collection(
          tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, scope=name)
      assert len(variables) == 3, variables
      g = tf.gradients(tf.reduce_sum(out * target), variables)
      grads[name] = {v.shape.as_list()[0] * 10 + v.shape.as_list()[1]:
                     tf.convert_to_tensor(x) for v, x in zip(variables, g)}
    # Width-4 columns share one dedup (the DeepRec door fuses a width).
    if op_backend == tfde.ops.KERNELS:
      uniques = [op for op in graph.get_operations()
                 if op.type == "TfdeUniqueWithCounts" and op.name.startswith("grouped/")]
      assert len(uniques) == 2, [op.name for op in uniques]  # widths 4 and 3
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      w, g, gp, gg = sess.run([want, got, grads["plain"], grads["grouped"]])
  np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  for key in gp:
    np.testing.assert_allclose(gg[key], gp[key], rtol=1e-5, atol=1e-6)


def test_scope_restores_embedding_column_and_refuses_ckpt_to_load_from():
  original = tf.feature_column.embedding_column
  with tfde.feature_column.group_embedding_column_scope():
    assert tf.feature_column.embedding_column is not original
    with pytest.raises(ValueError, match="ckpt_to_load_from is not supported"):
      tf.feature_column.embedding_column(
          tf.feature_column.categorical_column_with_identity("u", 5), 2,
          ckpt_to_load_from="/nowhere", tensor_name_in_ckpt="t")
  assert tf.feature_column.embedding_column is original
  with pytest.raises(RuntimeError):
    with tfde.feature_column.group_embedding_column_scope():
      raise RuntimeError("inside")
  assert tf.feature_column.embedding_column is original


def test_grouped_columns_train_with_a_tf1_optimizer():
  with tf.Graph().as_default():
    rng = np.random.default_rng(5)
    features = _features(rng)
    grouped = _columns(rng, scoped=True)
    out = tf.compat.v1.feature_column.input_layer(features, grouped)
    loss = tf.reduce_mean(tf.square(out - 1.0))
    train = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      first = sess.run(loss)
      for _ in range(20):
        sess.run(train)
      assert sess.run(loss) < 0.5 * first
