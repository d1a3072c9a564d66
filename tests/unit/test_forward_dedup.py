"""Where the dedup runs and in which order: the one-replica forward skips
it, a gradient still gets it; at several replicas the forward and the
owners dedup rows in increasing order where that is cheap, and the owners
apply what they receive as bags.

Equivalence of the outputs, gradients and updates with the unsharded
oracle is the business of test_sharded.py / test_layers.py; here the
traced graphs, the dedup's order, and one step against numpy."""

import numpy as np
import pytest
import tensorflow as tf

import tfde


def _lookup(optimizer="sgd"):
  table = tfde.TableConfig(name="t", vocabulary_size=50, embedding_dim=4,
                           optimizer=optimizer, combiner="mean")
  return tfde.lookup.ShardedLookup(
      {"a": tfde.FeatureConfig(name="a", table=table),
       "b": tfde.FeatureConfig(name="b", table=table)})


def _op_types(concrete):
  return set(_op_type_list(concrete))


def _op_type_list(concrete):
  """The type of every op of the traced graph and its functions (a
  tf.cond's branches among them), repeats included."""
  types = [op.type for op in concrete.graph.get_operations()]
  for f in concrete.graph._functions.values():  # pylint: disable=protected-access
    types += [node.op for node in f.definition.node_def]
  return types


INPUTS = {"a": tf.constant([[1, 2, 2], [3, 3, 1]]),
          "b": tf.ragged.constant([[5], [], [7, 7, 1]])}


def test_forward_at_one_replica_runs_no_unique():
  lookup = _lookup()
  for training in (False, True):
    forward = tf.function(lambda training=training: lookup(INPUTS, training=training))
    types = _op_types(forward.get_concrete_function())
    assert not any("Unique" in t for t in types), (training, sorted(types))


def test_training_step_dedups_and_updates_each_row_once():
  lookup = _lookup()
  before = lookup.table_values()["t"]

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      out = lookup(INPUTS)
      loss = tf.reduce_sum(out["a"]) + tf.reduce_sum(out["b"])
    tape.gradient(loss, lookup.trainable_variables)

  assert any("Unique" in t for t in _op_types(step.get_concrete_function()))
  step()
  delta = lookup.table_values()["t"] - before
  # mean combiner, SGD lr 0.01 (the string's default): each id's gradient
  # is the sum over its samples of 1/len(sample), once per row even where
  # an id repeats.
  expected = np.zeros(50)
  for sample in [[1, 2, 2], [3, 3, 1], [5], [7, 7, 1]]:
    for i in sample:
      expected[i] += 1.0 / len(sample)
  lr = 0.01
  np.testing.assert_allclose(delta, -lr * expected[:, None] * np.ones((1, 4)),
                             rtol=1e-5, atol=1e-7)


def test_each_feature_is_checked_by_one_op_and_bad_ids_name_it():
  """The pipeline checks each feature's ids with TfdeCheckIdRange (one
  scan), not the twin's mask, minimum and Assert; an id out of range still
  fails the step naming the feature and its table."""
  if not tfde.ops.kernels_available():
    pytest.skip("the op library is unavailable: the twins' check runs")
  lookup = _lookup()
  forward = tf.function(lambda inputs: lookup(inputs))
  graph = forward.get_concrete_function(
      {k: tf.type_spec_from_value(v) for k, v in INPUTS.items()}).graph
  checks = [op for op in graph.get_operations() if op.type == "TfdeCheckIdRange"]
  assert sorted(op.get_attr("what").decode() for op in checks) == [
      "feature a (table t)", "feature b (table t)"]
  # The twin's check is a minimum over masked positions, one per feature.
  assert "Min" not in {op.type for op in graph.get_operations()}
  bad = dict(INPUTS, b=tf.ragged.constant([[5], [], [7, 50, 1]]))
  try:
    forward(bad)
  except tf.errors.InvalidArgumentError as e:
    assert "feature b (table t): id 50 at position 2 is out of range [0, 50)" in e.message
  else:
    raise AssertionError("an id past the vocabulary was looked up")


@pytest.mark.parametrize("exchange", ["rows", "auto"])
def test_owners_dedup_in_row_order_and_apply_bags(op_backend, exchange):
  """At two replicas exchanging rows, the forward dedups each replica's ids
  in row order (a bitmap, `TfdeSortedUniqueInRange`), and each owner
  dedups what it is sent the same way (or by hashing, chosen at run time
  for requests of unknown count: both ops are in the graph) and applies
  the received gradients as bags (`TfdeBagGradientIndex`, on the kernels;
  the twins sum them into a matrix). Exchanging partial sums (the default),
  no replica gathers rows: each owner combines its rows of both replicas'
  samples from its shard and, once per row, dedups them and applies the
  bags of the global batch's output gradient. Either way a row both
  replicas read is updated once, with the sum of their gradients (Adagrad,
  whose step follows the gradient's size, against numpy), and the replicas'
  batches differ in size."""
  from tests.support import sharded_harness as h  # pylint: disable=g-import-not-at-top
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  table = tfde.TableConfig(name="t", vocabulary_size=12, embedding_dim=3,
                           optimizer=h.sparse_optimizer("adagrad"), combiner="sum")
  with strategy.scope():
    lookup = h.sharded_lookup({"a": tfde.FeatureConfig(name="a", table=table)},
                              exchange=exchange)
  before = lookup.table_values()["t"]
  # Rows 1, 4 and 7 are read by both replicas, row 4 twice by replica 1.
  ids = [np.array([[1, 4], [7, 2]]), np.array([[4, 4], [1, 7], [9, 1]])]
  # Small gradients, so that Adagrad's step (lr * g / sqrt(0.1 + g * g))
  # follows their size: a wrong sum moves it.
  scale = [np.array([[0.01], [0.02]]), np.array([[0.03], [0.05], [0.07]])]

  def replica_step():
    r = tf.distribute.get_replica_context().replica_id_in_sync_group
    inputs = tf.gather(tf.ragged.constant([ids[0].tolist(), ids[1].tolist()],
                                          dtype=tf.int64), r).to_tensor()
    weights = tf.gather(tf.ragged.constant([scale[0].tolist(), scale[1].tolist()]), r)
    with tf.GradientTape() as tape:
      out = lookup({"a": inputs})["a"]
      loss = tf.reduce_sum(out * weights.to_tensor())
    tape.gradient(loss, lookup.trainable_variables)

  step = tf.function(lambda: strategy.run(replica_step))
  types = _op_type_list(step.get_concrete_function())
  if op_backend == tfde.ops.KERNELS and exchange == "rows":
    # Per replica, one in the forward and one at the owner.
    assert types.count("TfdeSortedUniqueInRange") >= 4, sorted(set(types))
    assert "TfdeBagGradientIndex" in types, sorted(set(types))
  elif op_backend == tfde.ops.KERNELS:
    # Per replica, one at the owner, before its update; no rows gathered.
    assert types.count("TfdeSortedUniqueInRange") == 2, sorted(set(types))
    assert types.count("TfdeCombineFromTables") == 2, sorted(set(types))
    assert "TfdeGatherFromTables" not in types, sorted(set(types))
    assert "TfdeBagGradientIndex" in types, sorted(set(types))
  step()

  # Each id's gradient: the sum of its samples' scales, every row once.
  grad = np.zeros(12)
  for replica_ids, replica_scale in zip(ids, scale):
    for sample, s in zip(replica_ids, replica_scale[:, 0]):
      for i in sample:
        grad[i] += s
  rows = np.flatnonzero(grad)
  expected = before.copy()
  optimizer = h.numpy_optimizer("adagrad", expected.shape)
  optimizer.apply(expected, rows, grad[rows, None] * np.ones((1, 3)))
  np.testing.assert_allclose(lookup.table_values()["t"], expected, rtol=1e-5, atol=1e-6)


def test_unique_rows_in_row_order_only_where_the_bitmap_is_cheap(op_backend):
  del op_backend
  rows = tf.constant([9, 2, 9, 5, 2], tf.int64)

  def run(row_space, static=True, device=None):
    if static:
      unique, inverse = tfde.ops.unique_rows(rows, row_space, device)
    else:  # the count known only at run time: a tf.cond picks the branch
      unique, inverse = tf.function(
          lambda r: tfde.ops.unique_rows(r, row_space),
          input_signature=[tf.TensorSpec([None], tf.int64)])(rows)
    return unique.numpy().tolist(), inverse.numpy().tolist()

  in_order = ([2, 5, 9], [2, 0, 2, 1, 0])
  first_seen = ([9, 2, 5], [0, 1, 0, 2, 1])
  for static in (True, False):
    assert run(10, static) == in_order             # 5 requests >= 10 / 32
    assert run(32 * 5, static) == in_order
    assert run(32 * 5 + 1, static) == first_seen   # a wider row space: hashing
  assert run(10, device="/device:GPU:0") == first_seen   # a GPU's updates read a matrix
  with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
    tfde.ops.unique_rows(tf.constant([3, 12], tf.int64), 10)
