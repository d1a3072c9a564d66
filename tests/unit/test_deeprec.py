"""DeepRec's group_embedding_lookup_sparse against tf.nn.embedding_lookup_sparse."""

import numpy as np
import pytest
import tensorflow as tf

import tfde
import tfde.ops
from tests.unit.test_sharded import mirrored

SHAPES = [(40, 4), (25, 4), (30, 3)]
COMBINERS = ["sum", "mean", "sqrtn"]


def _sparse(rng, vocab, batch=6, width=4, dtype=tf.int64):
  """A [batch, width] SparseTensor with an empty row in the middle and the
  last row non-empty (tf.nn's output stops at the last non-empty row)."""
  indices, values = [], []
  for b in range(batch):
    k = 0 if b == 2 else int(rng.integers(1, width + 1))
    for j in range(k):
      indices.append([b, j])
      values.append(int(rng.integers(0, vocab)))
  return tf.SparseTensor(tf.constant(indices, tf.int64), tf.constant(values, dtype),
                         [batch, width])


def _weights_like(rng, sp):
  return tf.SparseTensor(sp.indices, tf.constant(rng.uniform(0.1, 2.0, size=len(
      sp.values.numpy())), tf.float32), sp.dense_shape)


@pytest.mark.parametrize("weighted", [False, True])
def test_plain_variables_match_tf_nn_forward_and_gradients(weighted):
  rng = np.random.default_rng(0)
  tables = [tf.Variable(rng.normal(size=s).astype(np.float32)) for s in SHAPES]
  ids = [_sparse(rng, s[0]) for s in SHAPES]
  weights = [_weights_like(rng, sp) for sp in ids] if weighted else None
  targets = [tf.constant(rng.normal(size=(6, s[1])), tf.float32) for s in SHAPES]

  with tf.GradientTape(persistent=True) as tape:
    got = tfde.nn.group_embedding_lookup_sparse(tables, ids, COMBINERS,
                                                sp_weights=weights)
    want = [tf.nn.embedding_lookup_sparse(t, i, None if w is None else w, combiner=c)
            for t, i, w, c in zip(tables, ids, weights or [None] * 3, COMBINERS)]
    loss_got = tf.add_n([tf.reduce_sum(g * y) for g, y in zip(got, targets)])
    loss_want = tf.add_n([tf.reduce_sum(w * y) for w, y in zip(want, targets)])
  for g, w in zip(got, want):
    np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
  grads_got = tape.gradient(loss_got, tables)
  grads_want = tape.gradient(loss_want, tables)
  for g, w in zip(grads_got, grads_want):
    assert isinstance(g, tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(),
                               tf.convert_to_tensor(w).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weighted", [False, True])
def test_plain_variables_apply_max_norm_as_tf_nn(weighted):
  """max_norm per feature (None: no limit) equals tf.nn.embedding_lookup_sparse's
  forward and gradients; two features read one variable with two limits."""
  rng = np.random.default_rng(1)
  tables = [tf.Variable(rng.normal(size=s).astype(np.float32)) for s in SHAPES]
  params = tables + [tables[0]]
  ids = [_sparse(rng, s[0]) for s in SHAPES + [SHAPES[0]]]
  weights = [_weights_like(rng, sp) for sp in ids] if weighted else None
  limits = [0.5, None, 1.5, 1.0]
  combiners = COMBINERS + ["sum"]
  targets = [tf.constant(rng.normal(size=(6, p.shape[1])), tf.float32) for p in params]

  with tf.GradientTape(persistent=True) as tape:
    got = tfde.nn.group_embedding_lookup_sparse(params, ids, combiners,
                                                sp_weights=weights, max_norm=limits)
    want = [tf.nn.embedding_lookup_sparse(t, i, w, combiner=c, max_norm=m)
            for t, i, w, c, m in zip(params, ids, weights or [None] * 4, combiners,
                                     limits)]
    loss_got = tf.add_n([tf.reduce_sum(g * y) for g, y in zip(got, targets)])
    loss_want = tf.add_n([tf.reduce_sum(w * y) for w, y in zip(want, targets)])
  # The limits bite: the clipped outputs differ from unclipped ones.
  unclipped = tfde.nn.group_embedding_lookup_sparse(params, ids, combiners,
                                                    sp_weights=weights)
  assert not np.allclose(got[0].numpy(), unclipped[0].numpy())
  np.testing.assert_allclose(got[1].numpy(), unclipped[1].numpy())
  for g, w in zip(got, want):
    np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
  for g, w in zip(tape.gradient(loss_got, tables), tape.gradient(loss_want, tables)):
    np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(),
                               tf.convert_to_tensor(w).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_reduced_precision_plain_variables_combine_in_float32(dtype):
  """DeepRec's BF16 tables as plain variables: rows read in their type and
  combined in float32, as tf.nn does on the same rows in float32; the
  gradients come back in the variable's type (beside a float32 table of the
  same width, fused with it)."""
  rng = np.random.default_rng(4)
  low = tf.Variable(tf.cast(rng.normal(size=SHAPES[0]), dtype))
  full = tf.Variable(rng.normal(size=SHAPES[1]).astype(np.float32))
  ids = [_sparse(rng, SHAPES[0][0]), _sparse(rng, SHAPES[1][0])]
  as_float = tf.Variable(tf.cast(low, tf.float32))
  with tf.GradientTape(persistent=True) as tape:
    got = tfde.nn.group_embedding_lookup_sparse([low, full], ids, ["mean", "sum"])
    want = [tf.nn.embedding_lookup_sparse(as_float, ids[0], None, combiner="mean"),
            tf.nn.embedding_lookup_sparse(full, ids[1], None, combiner="sum")]
    loss_got = tf.reduce_sum(got[0]) + tf.reduce_sum(got[1])
    loss_want = tf.reduce_sum(want[0]) + tf.reduce_sum(want[1])
  assert [g.dtype for g in got] == [tf.float32, tf.float32]
  for g, w in zip(got, want):
    np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6)
  g_low, g_full = tape.gradient(loss_got, [low, full])
  w_low, w_full = tape.gradient(loss_want, [as_float, full])
  assert g_low.values.dtype == dtype
  np.testing.assert_allclose(tf.cast(tf.convert_to_tensor(g_low), tf.float32).numpy(),
                             tf.convert_to_tensor(w_low).numpy(), rtol=1e-2, atol=1e-3)
  np.testing.assert_allclose(tf.convert_to_tensor(g_full).numpy(),
                             tf.convert_to_tensor(w_full).numpy(), rtol=1e-6, atol=1e-6)


def test_max_norm_refusals_name_the_feature_and_table():
  table = tf.Variable(tf.ones([5, 2]))
  ids = [tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1])]
  for bad, pattern in ((-1.0, r"max_norm\[0\] \(params\[0\]\)"),
                       (float("nan"), r"max_norm\[0\]"),
                       ([1.0, 2.0], "one entry per feature")):
    with pytest.raises(ValueError, match=pattern):
      tfde.nn.group_embedding_lookup_sparse([table], ids, "sum", max_norm=bad)
  sharded = tfde.tables.ShardedTable(
      tfde.TableConfig(name="clipped", vocabulary_size=5, embedding_dim=2,
                       max_norm=1.0))
  with pytest.raises(ValueError, match="tfde table 'clipped'.*max_norm=1.0"):
    tfde.nn.group_embedding_lookup_sparse([sharded], ids, "sum", max_norm=2.0)


def test_is_sequence_places_each_row_as_tf_gather_does():
  """DeepRec's is_sequence: [batch, T, D], each id's row at its position,
  against tf.gather + tf.scatter_nd (forward and gradients), for sparse and
  ragged ids, with a max_norm on one feature."""
  rng = np.random.default_rng(2)
  tables = [tf.Variable(rng.normal(size=s).astype(np.float32)) for s in SHAPES[:2]]
  sparse = _sparse(rng, SHAPES[0][0])
  ragged = tf.RaggedTensor.from_row_splits(
      tf.constant([3, 1, 4, 1, 5, 9, 2, 6], tf.int64), [0, 4, 4, 7, 8])
  targets = [tf.constant(rng.normal(size=(6, 4, 4)), tf.float32),
             tf.constant(rng.normal(size=(4, 4, 4)), tf.float32)]
  with tf.GradientTape(persistent=True) as tape:
    got = tfde.nn.group_embedding_lookup_sparse(
        tables, [sparse, ragged], ["mean", "sum"], is_sequence=True,
        max_norm=[None, 1.0])
    clipped = tf.clip_by_norm(tf.gather(tables[1], ragged.flat_values), 1.0, axes=[1])
    want = [tf.scatter_nd(sparse.indices, tf.gather(tables[0], sparse.values), [6, 4, 4]),
            tf.RaggedTensor.from_row_splits(clipped, ragged.row_splits).to_tensor()]
    loss_got = tf.add_n([tf.reduce_sum(g * y) for g, y in zip(got, targets)])
    loss_want = tf.add_n([tf.reduce_sum(w * y) for w, y in zip(want, targets)])
  assert [g.shape.as_list() for g in got] == [[6, 4, 4], [4, 4, 4]]
  for g, w in zip(got, want):
    np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6)
  assert not got[0][2].numpy().any()  # the empty sample is zeros
  for g, w in zip(tape.gradient(loss_got, tables), tape.gradient(loss_want, tables)):
    np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(),
                               tf.convert_to_tensor(w).numpy(), rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match=r"sp_weights\[0\].*is_sequence"):
    tfde.nn.group_embedding_lookup_sparse(tables[:1], [sparse], ["sum"],
                                          sp_weights=[_weights_like(rng, sparse)],
                                          is_sequence=True)


def test_is_sequence_trains_tfde_tables_sparsely():
  table = tfde.tables.ShardedTable(tfde.TableConfig(
      name="history", vocabulary_size=12, embedding_dim=3, combiner="mean",
      optimizer=tfde.optimizers.SGD(learning_rate=0.5)))
  before = table.full_table()
  ids = tf.SparseTensor([[0, 0], [0, 2], [1, 1]], tf.constant([7, 2, 7], tf.int64), [2, 3])
  with tf.GradientTape() as tape:
    out = tfde.nn.group_embedding_lookup_sparse([table], [ids], ["mean"],
                                                is_sequence=True)[0]
    loss = tf.reduce_sum(out)
  tape.gradient(loss, tape.watched_variables())
  want = np.zeros((2, 3, 3), np.float32)
  want[0, 0], want[0, 2], want[1, 1] = before[7], before[2], before[7]
  np.testing.assert_allclose(out.numpy(), want)
  expected = before.copy()
  expected[7] -= 0.5 * 2  # read twice, each with gradient 1
  expected[2] -= 0.5
  np.testing.assert_allclose(table.full_table(), expected, rtol=1e-6)


def test_both_deeprec_positional_orders():
  """DeepRec's newer (sp_weights, partition_strategy, is_sequence,
  params_num_per_group, name) and older (partition_strategy, sp_weights,
  name) positional orders; tables of norm about 2, so a max_norm that
  slipped into a slot would show."""
  rng = np.random.default_rng(3)
  tables = [tf.Variable(rng.normal(size=s).astype(np.float32)) for s in SHAPES]
  ids = [_sparse(rng, s[0]) for s in SHAPES]
  weights = [_weights_like(rng, sp) for sp in ids]
  want = [tf.nn.embedding_lookup_sparse(t, i, w, combiner=c)
          for t, i, w, c in zip(tables, ids, weights, COMBINERS)]
  newer = tfde.nn.group_embedding_lookup_sparse(tables, ids, COMBINERS, weights, "mod",
                                                False, 1, "newer")
  older = tfde.nn.group_embedding_lookup_sparse(tables, ids, COMBINERS, "mod", weights,
                                                "older")
  for a, b, w in zip(newer, older, want):
    np.testing.assert_allclose(a.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  sequence = tfde.nn.group_embedding_lookup_sparse(tables[:1], ids[:1], ["sum"], None,
                                                   "mod", True)
  assert sequence[0].shape.as_list() == [6, 4, 4]


def test_ragged_inputs_newer_argument_order_and_dense_lookup():
  rng = np.random.default_rng(1)
  table = tf.Variable(rng.normal(size=(20, 3)).astype(np.float32))
  ragged = tf.ragged.constant([[1, 2], [3], [4, 5, 6]], dtype=tf.int64)
  out = tfde.nn.group_embedding_lookup_sparse(
      [table], [ragged], ["mean"], sp_weights=None, partition_strategy="mod")
  want = tf.nn.embedding_lookup_sparse(table, ragged.to_sparse(), None, combiner="mean")
  np.testing.assert_allclose(out[0].numpy(), want.numpy(), rtol=1e-6)
  dense = tfde.nn.group_embedding_lookup([table], [tf.constant([[1, 2], [3, 4]])])
  np.testing.assert_allclose(dense[0].numpy(),
                             tf.nn.embedding_lookup(table, [[1, 2], [3, 4]]).numpy())


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("n", [1, 2, 4], ids=lambda n: f"N{n}")
def test_tfde_tables_are_sharded_and_train_in_backward(n, dynamic):
  strategy = mirrored(n)
  config = tfde.TableConfig(name="items", vocabulary_size=None if dynamic else 40,
                            embedding_dim=4, initializer="uniform",
                            optimizer=tfde.optimizers.SGD(learning_rate=0.5),
                            combiner="sum")
  with strategy.scope():
    table = (tfde.tables.DynamicTable(config) if dynamic
             else tfde.tables.ShardedTable(config))

  def whole():
    if not dynamic:
      return table.full_table()
    rows = table.export_rows()
    full = tfde.ops.dynamic_initial_values(table.spec, tf.range(40, dtype=tf.int64)).numpy()
    full[rows["ids"]] = rows["table"]
    return full

  full = whole()
  ids = [tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([3, 8, 3], tf.int64), [2, 2]),
         tf.SparseTensor([[0, 0], [1, 0]], tf.constant([5, 8], tf.int64), [2, 2])]

  @tf.function
  def step():
    def replica_step():
      with tf.GradientTape() as tape:
        out = tfde.nn.group_embedding_lookup_sparse([table], [ids[0]], ["sum"])
        loss = tf.reduce_sum(out[0])
      # The group's update trigger is read under the tape: asking for the
      # watched variables' gradients runs the tables' sparse updates.
      tape.gradient(loss, tape.watched_variables())
      return out[0]
    return strategy.run(replica_step)

  outputs = strategy.experimental_local_results(step())
  want = tf.nn.embedding_lookup_sparse(full, ids[0], None, combiner="sum").numpy()
  for out in outputs:  # both replicas looked up the same batch
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
  after = whole()
  # Each replica's loss touches rows 3 (twice) and 8: SGD with lr 0.5 on the
  # gradient summed over the n replicas.
  expected = full.copy()
  expected[3] -= 0.5 * 2 * n
  expected[8] -= 0.5 * 1 * n
  np.testing.assert_allclose(after, expected, rtol=1e-6, atol=1e-6)
  if dynamic:
    np.testing.assert_array_equal(table.export_rows()["ids"], [3, 8])


def test_no_combiners_means_mean_as_in_deeprec():
  values = np.arange(20, dtype=np.float32).reshape(10, 2)
  ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([1, 3, 4], tf.int64), [2, 2])
  got = tfde.nn.group_embedding_lookup_sparse([tf.Variable(values)], [ids], None)[0]
  np.testing.assert_array_equal(
      got.numpy(), tf.nn.embedding_lookup_sparse(values, ids, None, combiner="mean").numpy())


@pytest.mark.parametrize("call,error,pattern", [
    (lambda t, i: tfde.nn.group_embedding_lookup_sparse(t, i, ["sum"], "div"),
     ValueError, "partition_strategy must be 'mod'"),
    (lambda t, i: tfde.nn.group_embedding_lookup_sparse(t, i, ["sum", "mean"]),
     ValueError, "one entry per feature"),
    (lambda t, i: tfde.nn.group_embedding_lookup_sparse(t, i, ["max"]),
     ValueError, r"combiners\[0\] must be one of"),
    (lambda t, i: tfde.nn.group_embedding_lookup_sparse(
        t, [tf.SparseTensor([[0, 0]], [1.5], [1, 1])], ["sum"]),
     TypeError, r"feature sp_ids\[0\] \(table params\[0\]\): ids must be int"),
    (lambda t, i: tfde.nn.group_embedding_lookup_sparse(
        t, [tf.SparseTensor([[0, 0]], tf.constant([99], tf.int64), [1, 1])], ["sum"]),
     tf.errors.InvalidArgumentError,
     r"feature sp_ids\[0\] \(table params\[0\]\): id 99 at position 0 is out of range"),
])
def test_bad_input_is_a_clear_error(call, error, pattern):
  table = tf.Variable(tf.zeros([10, 2]))
  ids = [tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1])]
  with pytest.raises(error, match=pattern):
    call([table], ids)
  np.testing.assert_array_equal(table.numpy(), 0)
