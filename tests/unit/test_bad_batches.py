"""Malformed batches: a clear error naming the feature and table, eagerly
and in a graph, at one replica and two, and no table changed; never a
silent wrong result. (Out-of-range ids and mismatched weights shapes have
their own tests in test_layers.py, test_row_features.py and
test_forward_dedup.py.)"""

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import sharded_harness as h
from tests.unit.test_sharded import distribute
from tests.unit.test_sharded import mirrored


def _two_tables(**lookup_kwargs):
  sgd = tfde.optimizers.SGD(learning_rate=0.5)
  return tfde.lookup.ShardedLookup(
      {"a": tfde.FeatureConfig(name="a", table=tfde.TableConfig(
          name="t1", vocabulary_size=10, embedding_dim=4, optimizer=sgd, combiner="mean")),
       "b": tfde.FeatureConfig(name="b", table=tfde.TableConfig(
           name="t2", vocabulary_size=20, embedding_dim=4, optimizer=sgd))},
      **lookup_kwargs)


def _train_step(lookup):
  def step(a, b):
    with tf.GradientTape() as tape:
      out = lookup({"a": a, "b": b}, training=True)
      loss = tf.reduce_sum(out["a"]) + tf.reduce_sum(out["b"])
    tape.gradient(loss, lookup.trainable_variables)
    return out["a"]
  return step


def _refused_unchanged(lookup, pattern, step, *args):
  """`step(*args)` raises InvalidArgumentError matching `pattern`, and no
  table, slot or step of `lookup` changed."""
  before = h.table_states(lookup)
  with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
    step(*args)
  h.assert_states_unchanged(before, lookup)


def _unchecked_ragged(values, splits):
  return tf.RaggedTensor.from_row_splits(tf.constant(values, tf.int64),
                                         tf.constant(splits, tf.int64), validate=False)


BAD_SPLITS = {
    "not starting at 0": ([1, 2, 3], [1, 2, 3]),
    "decreasing": ([1, 2, 3], [0, 2, 1, 3]),
    "ending past the ids": ([1, 2], [0, 1, 3]),
    "ending before the ids": ([1, 2, 3], [0, 1, 2]),
}
SPLITS_ERROR = (r"feature a \(table t1\): ragged ids have row splits that do not start at 0, "
                r"never decrease and end at the number of ids")


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("case", sorted(BAD_SPLITS))
def test_malformed_row_splits_are_refused_at_one_replica(case, traced):
  lookup = _two_tables()
  step = _train_step(lookup)
  _refused_unchanged(lookup, SPLITS_ERROR, tf.function(step) if traced else step,
                     _unchecked_ragged(*BAD_SPLITS[case]), tf.constant([[1, 2], [3, 4]], tf.int64))


@pytest.mark.parametrize("exchange", ["auto", "rows"])
def test_malformed_row_splits_on_one_of_two_replicas_are_refused(exchange):
  # Sharded tables (nothing replicated), both tables in one exchange
  # group: the partial sums' exchange used to read samples from such
  # splits and return a wrong output without an error.
  strategy = mirrored(2)
  with strategy.scope():
    lookup = _two_tables(auto_replicate_bytes=0, exchange=exchange)
  before = h.table_states(lookup)
  step = _train_step(lookup)
  bad = _unchecked_ragged(*BAD_SPLITS["not starting at 0"])
  good = tf.ragged.constant([[1, 2], [3]], tf.int64)
  dense = tf.constant([[1, 2], [3, 4]], tf.int64)
  for run in (lambda *a: strategy.run(step, args=a),
              tf.function(lambda *a: strategy.run(step, args=a))):
    with pytest.raises(tf.errors.InvalidArgumentError, match=SPLITS_ERROR):
      run(distribute(strategy, [bad, good]), distribute(strategy, [dense, dense]))
    h.assert_states_unchanged(before, lookup)
  # And the next good step runs.
  run(distribute(strategy, [good, good]), distribute(strategy, [dense, dense]))
  assert not np.array_equal(h.table_states(lookup)["t1"]["table"], before["t1"]["table"])


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("indices", [[[0, 0], [2, 0]], [[-1, 0], [1, 0]], [[0, 0], [1, 2]]],
                         ids=["row past the batch", "negative row", "column past the shape"])
def test_sparse_ids_outside_their_dense_shape_are_refused(indices, traced):
  lookup = _two_tables()
  step = _train_step(lookup)
  sparse = tf.SparseTensor(tf.constant(indices, tf.int64), tf.constant([1, 2], tf.int64), [2, 2])
  _refused_unchanged(lookup, r"feature a \(table t1\): sparse ids have an index outside their "
                     r"dense shape", tf.function(step) if traced else step,
                     sparse, tf.constant([[1, 2], [3, 4]], tf.int64))


def _dynamic_and_static():
  return tfde.lookup.ShardedLookup(
      {"user": tfde.FeatureConfig(name="user", table=tfde.TableConfig(
          name="users", vocabulary_size=None, embedding_dim=4, optimizer="sgd",
          dynamic=tfde.DynamicConfig())),
       "item": tfde.FeatureConfig(name="item", table=tfde.TableConfig(
           name="items", vocabulary_size=20, embedding_dim=4, optimizer="sgd"))})


@pytest.mark.parametrize("bad_item", ["out of range", "malformed splits"])
def test_a_failed_graph_step_admits_no_id_into_a_dynamic_table(bad_item):
  # The dynamic table admits ids as its forward reads them; in a graph
  # that read must wait for every feature's checks, or a step refused for
  # another feature has already counted and admitted its ids.
  lookup = _dynamic_and_static()
  before = h.table_states(lookup)

  @tf.function
  def step(user, item):
    with tf.GradientTape() as tape:
      out = lookup({"user": user, "item": item}, training=True)
      loss = tf.reduce_sum(out["user"]) + tf.reduce_sum(out["item"])
    tape.gradient(loss, lookup.trainable_variables)

  if bad_item == "out of range":
    item, error = tf.ragged.constant([[1], [25]], tf.int64), "id 25 at position 1"
  else:
    item, error = _unchecked_ragged([1, 2], [1, 2, 2]), "ragged ids have row splits"
  users = tf.ragged.constant([[7], [8]], tf.int64)
  for _ in range(3):  # admit_after would count each failed step's sightings
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"feature item \(table items\): {error}"):
      step(users, item)
  h.assert_states_unchanged(before, lookup)
  assert h.table_states(lookup)["users"]["ids"].size == 0
  step(users, tf.ragged.constant([[1], [2]], tf.int64))
  assert sorted(h.table_states(lookup)["users"]["ids"].tolist()) == [7, 8]


@pytest.mark.parametrize("bad_weights", ["other row lengths", "values past their splits"])
def test_a_failed_graph_step_of_one_feature_admits_no_id(bad_weights):
  # One feature alone: its ids wait for its own weights' check too.
  lookup = tfde.lookup.ShardedLookup({"user": tfde.FeatureConfig(
      name="user", table=tfde.TableConfig(name="users", vocabulary_size=None, embedding_dim=4,
                                          optimizer="sgd", dynamic=tfde.DynamicConfig()))})

  @tf.function
  def step(user, weights):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(lookup({"user": user}, {"user": weights}, training=True)["user"])
    tape.gradient(loss, lookup.trainable_variables)

  users = tf.ragged.constant([[7, 9], [8]], tf.int64)
  if bad_weights == "other row lengths":
    weights = tf.ragged.constant([[1.0], [2.0, 3.0]])
  else:  # four values, but splits that say three
    weights = tf.RaggedTensor.from_row_splits(tf.constant([1.0, 2.0, 3.0, 4.0]),
                                              tf.constant([0, 2, 3], tf.int64), validate=False)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"feature user \(table users\): weights do not have the same row "
                           r"lengths as the ids"):
    step(users, weights)
  assert h.table_states(lookup)["users"]["ids"].size == 0


@pytest.mark.parametrize("replicas", [1, 2])
def test_ragged_weights_with_values_past_their_splits_are_named(replicas):
  strategy = mirrored(replicas)
  with strategy.scope():
    lookup = _two_tables(auto_replicate_bytes=0)
  before = h.table_states(lookup)
  ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
  weights = tf.RaggedTensor.from_row_splits(tf.constant([1.0, 2.0, 3.0, 4.0]),
                                            tf.constant([0, 2, 3], tf.int64), validate=False)
  dense = tf.constant([[1, 2], [3, 4]], tf.int64)

  def step(a, w, b):
    with tf.GradientTape() as tape:
      out = lookup({"a": a, "b": b}, {"a": w}, training=True)
      loss = tf.reduce_sum(out["a"]) + tf.reduce_sum(out["b"])
    tape.gradient(loss, lookup.trainable_variables)

  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"feature a \(table t1\): weights do not have the same row lengths"):
    tf.function(lambda *a: strategy.run(step, args=a))(
        *[distribute(strategy, [x] * replicas) for x in (ids, weights, dense)])
  h.assert_states_unchanged(before, lookup)


@pytest.mark.parametrize("kind", ["dense", "ragged", "sparse"])
def test_weights_of_any_float_or_integer_dtype_count_as_float32(kind):
  lookup = _two_tables()
  ids = np.array([[1, 2], [3, 4]])
  rows = lookup.table_values()["t1"]

  def as_kind(x):  # every [b, j] present, the sparse ones too (a 0 weight stays)
    x = tf.constant(x)
    if kind == "ragged":
      return tf.RaggedTensor.from_tensor(x)
    if kind == "sparse":
      return tf.SparseTensor([[b, j] for b in range(2) for j in range(2)],
                             tf.reshape(x, [-1]), [2, 2])
    return x

  def mean(weights):  # the mean combiner of table t1, in numpy
    w = np.asarray(weights, np.float64)
    return (w[..., None] * rows[ids]).sum(1) / w.sum(1)[:, None]

  for dtype, given in ((np.float64, [[1.0, 3.0], [2.0, 4.0]]),
                       (np.float16, [[1.0, 3.0], [2.0, 4.0]]),
                       (np.int32, [[1, 3], [2, 4]]), (np.int64, [[1, 3], [2, 4]]),
                       (np.bool_, [[True, False], [True, True]])):  # a 0/1 mask
    weights = np.array(given, dtype)
    for call in (lookup, tf.function(lookup)):
      got = call({"a": as_kind(ids), "b": as_kind(ids)}, {"a": as_kind(weights)})["a"]
      np.testing.assert_allclose(got.numpy(), mean(weights), rtol=1e-5, atol=1e-7,
                                 err_msg=str(dtype))
    if kind == "dense":  # numpy weights straight in, traced too
      got = tf.function(lookup)({"a": ids, "b": ids}, {"a": weights})["a"]
      np.testing.assert_allclose(got.numpy(), mean(weights), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["dense", "ragged", "sparse"])
def test_weights_of_another_dtype_or_structure_name_the_feature(kind):
  lookup = _two_tables()
  ids = tf.constant([[1, 2], [3, 4]], tf.int64)
  strings = tf.constant([["x", "y"], ["z", "w"]])
  as_kind = {"dense": lambda x: x, "ragged": tf.RaggedTensor.from_tensor,
             "sparse": tf.sparse.from_dense}[kind]
  for call in (lookup, tf.function(lookup)):
    with pytest.raises(TypeError,
                       match=r"feature a \(table t1\): weights must be floats, integers or "
                             r"booleans, got string"):
      call({"a": as_kind(ids), "b": ids}, {"a": as_kind(strings)})
  if kind == "ragged":
    nested = tf.RaggedTensor.from_row_splits(
        tf.ragged.constant([[1.0], [2.0], [3.0], [4.0]]), tf.constant([0, 2, 4], tf.int64))
    with pytest.raises(ValueError, match=r"feature a \(table t1\): ragged weights must be "
                                         r"\[batch, \(hotness\)\]"):
      lookup({"a": as_kind(ids), "b": ids}, {"a": nested})
  if kind == "sparse":
    rank3 = tf.SparseTensor([[0, 0, 0], [1, 1, 0]], [1.0, 2.0], [2, 2, 1])
    with pytest.raises(ValueError, match=r"feature a \(table t1\): sparse weights must be "
                                         r"\[batch, hotness\]"):
      lookup({"a": as_kind(ids), "b": ids}, {"a": rank3})


def test_weights_not_a_dict_and_a_feature_given_as_none_are_named():
  lookup = _two_tables()
  ids = tf.constant([[1, 2], [3, 4]], tf.int64)
  with pytest.raises(TypeError, match="weights must be a dict of feature name -> weights, "
                                      "got list"):
    lookup({"a": ids, "b": ids}, [tf.ones([2, 2])])
  with pytest.raises(ValueError, match=r"feature a \(table t1\) is missing from the inputs"):
    lookup({"a": None, "b": ids})


@pytest.mark.parametrize("traced", [False, True])
def test_uint64_ids_of_2_to_the_63_or_more_are_named_as_given(traced):
  """They wrap to negative int64 ids, which the range check showed wrapped:
  now refused as given, naming the feature and table; nothing changes."""
  lookup = _two_tables()
  step = _train_step(lookup)
  _refused_unchanged(lookup, r"feature a \(table t1\): id 9223372036854775813 at position 3 "
                     r"is out of range: the ids of a table are below 2\^63",
                     tf.function(step) if traced else step,
                     tf.constant([[1, 2], [3, 2**63 + 5]], tf.uint64),
                     tf.constant([[1], [2]], tf.int64))
  # In range, uint64 ids are the int64 ones.
  ids, other = [[1, 9], [3, 0]], tf.constant([[1], [2]], tf.int64)
  np.testing.assert_array_equal(
      lookup({"a": tf.constant(ids, tf.uint64), "b": other}, training=False)["a"],
      lookup({"a": tf.constant(ids, tf.int64), "b": other}, training=False)["a"])


def _sparse_weighted_step(lookup):
  """A training step of feature a as sparse ids and weights (their own
  indices each), b as dense ids."""
  def step(ids_indices, ids, weights_indices, weights):
    with tf.GradientTape() as tape:
      out = lookup({"a": tf.SparseTensor(ids_indices, ids, [2, 2]),
                    "b": tf.constant([[1], [2]], tf.int64)},
                   weights={"a": tf.SparseTensor(weights_indices, weights, [2, 2])},
                   training=True)
    tape.gradient(tf.reduce_sum(out["a"]), lookup.trainable_variables)
  return step


@pytest.mark.parametrize("traced", [False, True])
def test_sparse_weights_outside_their_dense_shape_are_named(traced):
  lookup = _two_tables()
  step = _sparse_weighted_step(lookup)
  _refused_unchanged(lookup, r"feature a \(table t1\): sparse weights have an index outside "
                     r"their dense shape", tf.function(step) if traced else step,
                     tf.constant([[0, 0], [1, 0]], tf.int64), tf.constant([1, 2], tf.int64),
                     tf.constant([[0, 0], [5, 0]], tf.int64), tf.constant([0.5, 2.0]))


@pytest.mark.parametrize("of", ["ids", "weights"])
def test_sparse_inputs_with_fewer_values_than_indices_are_named(of):
  """TensorFlow's SparseReorder refused them naming no feature (known only
  when the step runs: traced with unknown shapes)."""
  lookup = _two_tables()
  indices, values = tf.TensorSpec([None, 2], tf.int64), tf.TensorSpec([None])
  step = tf.function(_sparse_weighted_step(lookup), input_signature=[
      indices, tf.TensorSpec([None], tf.int64), indices, values])
  ids, weights = [1, 2], [0.5, 2.0]
  if of == "ids":
    ids = ids[:1]
  else:
    weights = weights[:1]
  both = tf.constant([[0, 0], [1, 0]], tf.int64)
  _refused_unchanged(lookup, fr"feature a \(table t1\): sparse {of} have 2 indices but 1 values",
                     step, both, tf.constant(ids, tf.int64), both, tf.constant(weights))
