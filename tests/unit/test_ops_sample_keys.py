"""The pooled exchange's key ops (`tfde.ops.sample_keys`,
`split_sample_keys`), on the C++ kernels and on the pure-TF twins, against
numpy: the keys of ragged batches, the ids and row splits of keys in
increasing sample, and what each refuses, naming the position."""

import numpy as np
import pytest
import tensorflow as tf

import tfde.ops
from tests.support.op_inputs import SEEDS


def _ragged(rng, samples, vocab):
  lengths = rng.integers(0, 6, size=samples)
  lengths[rng.random(samples) < 0.2] = 0  # empty samples among the others
  splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
  return rng.integers(0, vocab, size=int(splits[-1])).astype(np.int64), splits


@pytest.mark.parametrize("seed", SEEDS)
def test_sample_keys_match_numpy(op_backend, seed):
  rng = np.random.default_rng(seed)
  samples = [1, 3, 64, 2000, 0, 17][seed % 6]
  bits, shards = int(rng.integers(1, 29)), [1, 2, 3, 4, 8][seed % 5]
  stride = shards << bits
  ids, splits = _ragged(rng, samples, stride)
  first = int(rng.integers(0, 5000))
  keys = tfde.ops.sample_keys(tf.constant(ids), tf.constant(splits), first, stride)
  sample = np.repeat(np.arange(samples), np.diff(splits))
  np.testing.assert_array_equal(keys.numpy(), (sample + first) * stride + ids)


@pytest.mark.parametrize("seed", SEEDS)
def test_split_sample_keys_match_numpy(op_backend, seed):
  """Keys as an owner receives them: increasing sample, any ids below
  2^bits, samples with no key (first, last and between) among them."""
  rng = np.random.default_rng(seed)
  num_samples = [1, 5, 300, 4096, 2, 9][seed % 6]
  bits = int(rng.integers(0, 40))
  n = int(rng.integers(0, 3 * num_samples + 2))
  sample = np.sort(rng.integers(0, num_samples, size=n))
  ids = rng.integers(0, 2**bits, size=n)
  keys = (sample << bits) + ids
  got_ids, got_splits = tfde.ops.split_sample_keys(tf.constant(keys, tf.int64),
                                                   num_samples, bits)
  np.testing.assert_array_equal(got_ids.numpy(), ids)
  np.testing.assert_array_equal(
      got_splits.numpy(), np.searchsorted(sample, np.arange(num_samples + 1)))


def test_keys_round_trip_through_a_partition(op_backend):
  """What the exchange does with them: keys of a batch, partitioned by
  owner (`id % N`), split back into each owner's rows and samples."""
  rng = np.random.default_rng(7)
  shards, bits = 4, 10
  ids, splits = _ragged(rng, 50, 1000)
  keys = tfde.ops.sample_keys(tf.constant(ids), tf.constant(splits), 0, shards << bits)
  local, counts, _ = tfde.ops.partition_by_shard(keys, shards)
  start = 0
  sample = np.repeat(np.arange(50), np.diff(splits))
  for owner, count in enumerate(counts.numpy()):
    rows, row_splits = tfde.ops.split_sample_keys(local[start:start + count], 50, bits)
    mine = ids % shards == owner
    np.testing.assert_array_equal(rows.numpy(), ids[mine] // shards)
    np.testing.assert_array_equal(row_splits.numpy(),
                                  np.searchsorted(sample[mine], np.arange(51)))
    start += count


# TfdeCheckRowSplits' error and its twin's, for the input "row_splits"
# (the kernel names the bad split too: test_ops.py's row-splits tests).
_BAD_SPLITS = (r"row_splits: ragged ids have row splits that do not start at 0, never "
               r"decrease and end at the number of ids")


@pytest.mark.parametrize("ids, splits, first, stride, match", [
    ([1, 9, 2], [0, 2, 3], 0, 8, r"ids\[\D*1\D*\] = \D*9 is not in \[0, stride = \D*8"),
    ([1, -1], [0, 2], 0, 8, r"ids\[\D*1\D*\] = \D*-1 is not in"),
    ([1, 2], [0, 1], 0, 8, _BAD_SPLITS),
    ([1, 2], [1, 2], 0, 8, _BAD_SPLITS),
    ([1, 2, 3], [0, 2, 1, 3], 0, 8, _BAD_SPLITS),
    ([1, 2], [], 0, 8, _BAD_SPLITS),
    ([1], [0, 1], -1, 8, "first_sample must be >= 0"),
    ([1], [0, 1], 0, 0, "stride must be positive"),
    ([1], [0, 1], 2**40, 2**30, "pass the largest int64"),
])
def test_sample_keys_refuse_what_they_cannot_key(op_backend, ids, splits, first, stride, match):
  with pytest.raises(tf.errors.InvalidArgumentError, match=match):
    tfde.ops.sample_keys(tf.constant(ids, tf.int64), tf.constant(splits, tf.int64),
                         first, stride)


@pytest.mark.parametrize("keys, num_samples, match", [
    ([4, -3], 4, r"keys\[\D*1\D*\] = \D*-3 is negative"),
    ([4, 17], 4, r"keys\[\D*1\D*\] = \D*17 is of sample 4, not below num_samples = \D*4"),
    ([4, 9, 5], 4, r"keys\[\D*2\D*\] = \D*5 is of sample 1, below the sample of the key "
                   "before it: keys must be in increasing sample"),
    # Several faults: the first key with any, and its first fault.
    ([9, 5, -1], 4, r"keys\[\D*1\D*\] = \D*5 is of sample 1, below"),
    ([17, -3], 4, r"keys\[\D*0\D*\] = \D*17 is of sample 4, not below num_samples = \D*4"),
    ([], -1, "num_samples must be in"),
])
def test_split_sample_keys_refuse_keys_out_of_order_or_range(op_backend, keys, num_samples,
                                                             match):
  with pytest.raises(tf.errors.InvalidArgumentError, match=match):
    tfde.ops.split_sample_keys(tf.constant(keys, tf.int64), num_samples, bits=2)


def test_split_sample_keys_in_a_graph_take_a_tensor_sample_count(op_backend):
  @tf.function
  def split(keys, num_samples):
    return tfde.ops.split_sample_keys(keys, num_samples, bits=2)

  ids, splits = split(tf.constant([5, 13], tf.int64), tf.constant(4, tf.int64))
  assert ids.numpy().tolist() == [1, 1]
  assert splits.numpy().tolist() == [0, 0, 1, 1, 2]


def test_sample_keys_take_int32_counts_and_ids(op_backend):
  """As the pipeline passes them: int32 sample counts and offsets."""
  keys = tfde.ops.sample_keys(tf.constant([3, 1], tf.int32), tf.constant([0, 1, 2], tf.int64),
                              tf.constant(2, tf.int32), tf.constant(4, tf.int32))
  assert keys.dtype == tf.int64 and keys.numpy().tolist() == [11, 13]
  ids, splits = tfde.ops.split_sample_keys(keys, tf.constant(4, tf.int32), bits=2)
  assert ids.numpy().tolist() == [3, 1] and splits.numpy().tolist() == [0, 0, 0, 1, 2]


def test_key_ops_refuse_float_indices(op_backend):
  """Never a cast: a float id would be truncated into another row."""
  with pytest.raises(TypeError, match="ids must be an int32 or int64"):
    tfde.ops.sample_keys(tf.constant([1.7]), tf.constant([0, 1], tf.int64), 0, 4)
  with pytest.raises(TypeError, match="keys must be an int32 or int64"):
    tfde.ops.split_sample_keys(tf.constant([1.0]), 4, bits=2)


def test_key_ops_refuse_non_scalar_counts(op_backend):
  with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="first_sample must be"):
    tfde.ops.sample_keys(tf.constant([1], tf.int64), tf.constant([0, 1], tf.int64),
                         tf.constant([0, 0], tf.int64), 4)
  with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="num_samples must be"):
    tfde.ops.split_sample_keys(tf.constant([1], tf.int64), tf.constant([4, 4], tf.int64), 2)


def test_off_the_cpu_forms_match_numpy():
  """What a GPU runs (no kernel there, and no Asserts waiting for the
  host): the stock-op forms, run here on their CPU kernels, on valid
  input, against numpy."""
  from tfde.ops import sample_keys_twin  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(3)
  for samples, bits in ((0, 3), (1, 0), (40, 7), (2000, 20)):
    ids, splits = _ragged(rng, samples, 2**bits)
    keys = sample_keys_twin.keys_of_samples(tf.constant(ids), tf.constant(splits),
                                            tf.constant(5, tf.int64),
                                            tf.constant(2**bits, tf.int64))
    sample = np.repeat(np.arange(samples), np.diff(splits))
    np.testing.assert_array_equal(keys.numpy(), ((sample + 5) << bits) + ids)
    got_ids, got_splits = sample_keys_twin.ids_and_splits_of_keys(
        keys, tf.constant(samples + 5, tf.int64), bits)
    np.testing.assert_array_equal(got_ids.numpy(), ids)
    np.testing.assert_array_equal(got_splits.numpy(),
                                  np.searchsorted(sample + 5, np.arange(samples + 6)))
