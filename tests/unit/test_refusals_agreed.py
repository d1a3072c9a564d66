"""Stage 0 under worker processes (`inputs.flat_features` with a
communicator's `gather_flags`): each replica's refusal of every feature's
input is computed without raising and exchanged before any check raises.

A stand-in exchange plays the second replica: it records what this one
sent and answers with the peer's flags. The oracle of what is refused is
stage 0 itself without the exchange (`gather_flags=None`): with it, a
replica refuses exactly those inputs, with the same error, once it has
sent its flags; the real two-process runs are in
tests/distributed/test_multiprocess_reliability.py."""

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.unit.test_bad_batches import _unchecked_ragged
from tfde import input_checks
from tfde import inputs as inputs_lib

# Feature a's (ids, weights), by what is wrong with them, and the code of
# its refusal (inputs._REFUSED: 1 the input, 2 an id). Feature a's table
# holds 10 rows.
BAD = {
    "splits not starting at 0": (1, lambda: (_unchecked_ragged([1, 2, 3], [1, 2, 3]), None)),
    "splits decreasing": (1, lambda: (_unchecked_ragged([1, 2, 3], [0, 2, 1, 3]), None)),
    "splits past the ids": (1, lambda: (_unchecked_ragged([1, 2], [0, 1, 3]), None)),
    "ragged weights of other row lengths": (1, lambda: (
        tf.ragged.constant([[1, 2], [3]], tf.int64), tf.ragged.constant([[1.0], [2.0, 3.0]]))),
    "sparse index outside the shape": (1, lambda: (tf.SparseTensor(
        [[0, 0], [2, 0]], tf.constant([1, 2], tf.int64), [2, 2]), None)),
    "sparse weights of other indices": (1, lambda: (
        tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 2], tf.int64), [2, 2]),
        tf.SparseTensor([[0, 0], [1, 1]], [1.0, 2.0], [2, 2]))),
    "dense weights of another shape": (1, lambda: (
        tf.constant([[1, 2], [3, 4]], tf.int64), tf.constant([[1.0], [2.0]]))),
    # Counted in int32 positions, 2^32 + 6 would wrap to 6 samples.
    "a sparse batch of 2^32 + 6 samples": (1, lambda: (tf.SparseTensor(
        [[0, 0], [5, 1]], tf.constant([1, 2], tf.int64), [2**32 + 6, 2]), None)),
    # Refused as given, before it is an int64 id.
    "a uint64 id of 2^63": (1, lambda: (tf.constant([[1, 2**63]], tf.uint64), None)),
    "an id past the table": (2, lambda: (tf.constant([[1, 10], [3, 4]], tf.int64), None)),
    "a negative id, ragged": (2, lambda: (tf.ragged.constant([[1, -1], [3]], tf.int64), None)),
}


def _lookup(kind="pooled", length=2):
  """Feature a on table t1: 10 rows, pooled; "sequence": `length` ids a
  sample; "dynamic": a dynamic table (string keys). Feature b on t2, 20
  rows."""
  a = tfde.FeatureConfig(name="a", table=tfde.TableConfig(
      name="t1", vocabulary_size=None if kind == "dynamic" else 10, embedding_dim=4,
      combiner="mean"), max_sequence_length=length if kind == "sequence" else None)
  b = tfde.FeatureConfig(name="b", table=tfde.TableConfig(
      name="t2", vocabulary_size=20, embedding_dim=4))
  return tfde.lookup.ShardedLookup({"a": a, "b": b})


class StandIn:
  """The exchange of a replica and its peer (replica 1): records the flags
  this replica sent, in a variable, so a graph shows whether they were
  sent before its checks raised."""

  def __init__(self, peer_flags=(0, 0)):
    self.sent = tf.Variable([-1, -1], dtype=tf.int32)
    self.peer = tf.constant(peer_flags, tf.int32)

  def __call__(self, flags):
    with tf.control_dependencies([self.sent.assign(flags)]):
      return tf.stack([tf.identity(flags), self.peer])


def _stage0(lookup, ids, weights, gather_flags, traced):
  good_b = tf.constant([[1, 2], [3, 4]], tf.int64)

  def run(ids, weights):
    given_weights = {} if weights is None else {"a": weights}
    flat = inputs_lib.flat_features(lookup.feature_configs, lookup.tables,
                                    {"a": ids, "b": good_b}, given_weights, gather_flags)
    return [(f.ids, f.row_splits, f.weights) for f in flat]

  return (tf.function(run) if traced else run)(ids, weights)


def _error(fn):
  """The line of `fn()`'s error that names a table (a graph's error adds
  where its op was built)."""
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    fn()
  message = raised.value.message
  return next((line.strip() for line in message.split("\n") if "(table" in line), message)


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("case", sorted(BAD))
def test_a_refused_input_is_sent_then_raised_with_its_own_error(case, traced):
  lookup = _lookup()
  code, make = BAD[case]
  ids, weights = make()
  alone = _error(lambda: _stage0(lookup, ids, weights, None, traced))
  assert "feature a (table t1)" in alone, alone
  exchange = StandIn()
  agreed = _error(lambda: _stage0(lookup, ids, weights, exchange, traced))
  # The same error as without the exchange, raised after the flags went.
  assert agreed == alone
  assert exchange.sent.numpy().tolist() == [code, 0]


@pytest.mark.parametrize("weighted", [False, True])
def test_sparse_ids_with_fewer_values_than_indices_are_sent_then_raised(weighted):
  """Known only when the step runs (traced with unknown shapes): a
  SparseTensor of known shapes refuses them as it is made. With good
  weights, the ids' own refusal keeps their indices unsorted (sorting
  them fails naming nothing)."""
  lookup = _lookup()
  exchange = StandIn()
  indices = tf.constant([[0, 0], [1, 0]], tf.int64)
  weights = tf.SparseTensor(indices, [1.0, 2.0], [2, 2]) if weighted else None

  @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int64),
                                tf.TensorSpec([None], tf.int64)])
  def run(indices, values):
    return _stage0(lookup, tf.SparseTensor(indices, values, [2, 2]), weights, exchange, False)

  message = _error(lambda: run(indices, tf.constant([1], tf.int64)))
  assert "feature a (table t1): sparse ids have 2 indices but 1 values" in message, message
  assert exchange.sent.numpy().tolist() == [1, 0]


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("kind", ["dense", "ragged", "sparse"])
def test_a_sequence_of_more_than_2_31_positions_is_sent_then_raised(kind, traced):
  """2 samples of max_sequence_length 2^30: 2^31 positions, past the
  int32 counts that make its splits (wrapped: an unnamed bincount error)."""
  lookup = _lookup("sequence", length=2**30)
  ids = {"dense": tf.constant([[1, 2], [3, 4]], tf.int64),
         "ragged": tf.ragged.constant([[1, 2], [3]], tf.int64),
         "sparse": tf.SparseTensor([[0, 0], [1, 1]], tf.constant([1, 2], tf.int64),
                                   [2, 2])}[kind]
  alone = _error(lambda: _stage0(lookup, ids, None, None, traced))
  assert ("feature a (table t1): a batch of 2 samples of max_sequence_length "
          "1073741824 holds more than 2147483647 positions") in alone, alone
  exchange = StandIn()
  assert _error(lambda: _stage0(lookup, ids, None, exchange, traced)) == alone
  assert exchange.sent.numpy().tolist() == [1, 0]


def test_a_sparse_input_of_another_rank_is_refused_as_it_is_built():
  """Before any exchange, naming the feature, as without one (its batch,
  dense_shape[0], is not read)."""
  lookup = _lookup("sequence")
  scalar = tf.SparseTensor(tf.zeros([1, 0], tf.int64), tf.constant([1], tf.int64),
                           tf.zeros([0], tf.int64))
  for exchange in (None, StandIn()):
    with pytest.raises(ValueError, match=r"feature a \(table t1\): sparse ids must be "
                                         r"\[batch, hotness\], got shape \(\)"):
      _stage0(lookup, scalar, None, exchange, False)


@pytest.mark.parametrize("batch, per_sample, countable", [
    (2**31 - 1, 1, True), (2**31, 1, False), (0, 1, True), (-1, 1, False),
    ((2**31 - 1) // 3, 3, True), ((2**31 - 1) // 3 + 1, 3, False),
    (0, 2**40, True), (1, 2**40, False), (2**62, 2**30, False)])
def test_countable_batches_are_those_of_at_most_2_31_minus_1_positions(
    batch, per_sample, countable):
  """Python's exact product against the check, which forms none (2^62 *
  2^30 would wrap in int64)."""
  assert (0 <= batch and batch * per_sample <= 2**31 - 1) == countable
  got = input_checks.counts_fit(tf.constant(batch, tf.int64), per_sample)
  assert bool(got) == countable


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("peer, what", [((1, 0), "the input of feature a (table t1)"),
                                        ((0, 2), "an id of feature b (table t2)")])
def test_a_peers_refusal_fails_a_good_replica_naming_it(peer, what, traced):
  lookup = _lookup()
  ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
  message = _error(lambda: _stage0(lookup, ids, None, StandIn(peer), traced))
  assert (f"replica 1 refused {what} (its error names it), so the step of this "
          "replica is refused too") in message, message


# Feature a's table kind, and (ids, weights) that stage 0 takes.
GOOD = {
    "ragged, weighted": ("pooled", lambda: (
        tf.ragged.constant([[1, 2], [3]], tf.int64), tf.ragged.constant([[0.5, 2.0], [1.0]]))),
    "ragged of int32 splits": ("pooled", lambda: (tf.RaggedTensor.from_row_splits(
        tf.constant([1, 2, 3]), tf.constant([0, 2, 3], tf.int32)), None)),
    "ragged, no ids": ("pooled", lambda: (tf.RaggedTensor.from_row_splits(
        tf.zeros([0], tf.int64), tf.constant([0, 0, 0], tf.int64)), None)),
    "sparse weights in another index order": ("pooled", lambda: (
        tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 2], tf.int64), [2, 2]),
        tf.SparseTensor([[1, 0], [0, 0]], [2.0, 1.0], [2, 2]))),
    "dense of rank 1, weighted": ("pooled", lambda: (
        tf.constant([1, 2], tf.int64), tf.constant([0.5, 2.0]))),
    "uint64 in range": ("pooled", lambda: (tf.constant([[1, 9]], tf.uint64), None)),
    # 2 ids a sample: the id past the table is truncated, never looked up.
    "sequence, an id past the table truncated": ("sequence", lambda: (
        tf.ragged.constant([[1, 2, 11], [3]], tf.int64), None)),
    "dynamic, string keys": ("dynamic", lambda: (
        tf.ragged.constant([["x", "y"], ["z"]]), tf.ragged.constant([[0.5, 2.0], [1.0]]))),
}


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("case", sorted(GOOD))
def test_good_inputs_flatten_as_without_the_exchange(case, traced):
  kind, make = GOOD[case]
  lookup = _lookup(kind)
  ids, weights = make()
  exchange = StandIn()
  agreed = _stage0(lookup, ids, weights, exchange, traced)
  alone = _stage0(lookup, ids, weights, None, traced)
  for got, want in zip(tf.nest.flatten(agreed), tf.nest.flatten(alone)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert exchange.sent.numpy().tolist() == [0, 0]
  if kind == "sequence":
    assert agreed[0][0].numpy().tolist() == [1, 2, 3]


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("kind, ids", [
    ("sequence", lambda: _unchecked_ragged([1, 2, 11], [0, 3, 2])),
    ("dynamic", lambda: tf.RaggedTensor.from_row_splits(
        tf.constant(["x", "y"]), tf.constant([0, 1, 3], tf.int64), validate=False))])
def test_malformed_splits_of_sequence_and_dynamic_features_are_sent(kind, ids, traced):
  """A sequence feature is flattened for its ids only when well formed; a
  dynamic table refuses no id, but its input can be malformed."""
  lookup = _lookup(kind)
  alone = _error(lambda: _stage0(lookup, ids(), None, None, traced))
  exchange = StandIn()
  assert _error(lambda: _stage0(lookup, ids(), None, exchange, traced)) == alone
  assert "feature a (table t1): ragged ids have row splits" in alone, alone
  assert exchange.sent.numpy().tolist() == [1, 0]


def test_a_weights_dict_holding_none_is_taken():
  lookup = _lookup()
  exchange = StandIn()
  flat = inputs_lib.flat_features(
      lookup.feature_configs, lookup.tables,
      {"a": tf.constant([[1, 2]], tf.int64), "b": tf.constant([[3]], tf.int64)},
      {"a": None}, exchange)
  assert flat[0].weights is None and exchange.sent.numpy().tolist() == [0, 0]
