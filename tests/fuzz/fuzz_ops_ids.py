"""Fuzz cases of the id ops: unique_with_counts, partition_by_shard,
check_id_range, sorted_unique_in_range, and the pooled exchange's
sample_keys and split_sample_keys."""

import numpy as np

from tests.fuzz.fuzz_oracle import I32_MAX
from tests.fuzz.fuzz_oracle import I64_MAX
from tests.fuzz.fuzz_oracle import I64_MIN
from tests.fuzz.fuzz_oracle import WRAP
from tests.fuzz.fuzz_oracle import Op
from tests.fuzz.fuzz_oracle import _check_bytes
from tests.fuzz.fuzz_oracle import _int_scalar
from tests.fuzz.fuzz_oracle import _int_vector
from tests.fuzz.fuzz_oracle import _pick
from tests.fuzz.fuzz_oracle import _refuse_if
from tests.fuzz.fuzz_oracle import _set
from tests.fuzz.fuzz_oracle import _t
from tests.support import oracles


def _id_mutation(make, note, keep_int32=False):
  """A mutation setting one id to make(rng, inp); the ids widen to int64,
  or with `keep_int32` stay int32 where the value fits (the kernels'
  int32 path)."""
  def mutate(rng, inp):
    if inp["ids"].size == 0:
      return False
    i = _pick(rng, inp["ids"])
    value = make(rng, inp)
    fits = keep_int32 and inp["ids"].dtype == np.int32 and -2**31 <= value < 2**31
    ids = inp["ids"].astype(np.int32 if fits else np.int64)
    ids[i] = value
    return _set(inp, "ids", ids, f"[{i}] = {ids[i]} {note}")
  return mutate


def _ids_shape_and_dtype_mutations():
  return {
      "ids_rank2": ("rank", lambda rng, inp: inp["ids"].size > 0 and _set(
          inp, "ids", inp["ids"].reshape(1, -1), "with shape [1, n]")),
      "ids_float": ("dtype", lambda rng, inp: _set(inp, "ids", inp["ids"] + 0.5,
                                                   "float64 + 0.5")),
      "ids_empty": ("empty", lambda rng, inp: _set(inp, "ids", inp["ids"][:0], "empty")),
  }


def _range_mutations(bound, at_name, at_note, zero_name):
  """Mutations of ids that must lie in [0, inp[bound]): one id below it,
  at its end, past int32 or at int64's extremes (int32 ids stay int32
  where the value fits: the kernels' int32 path), a bound of 0, and the
  ids' shape and dtype."""
  def _id(make, note):
    return _id_mutation(make, note, keep_int32=True)
  return {
      "negative_id": ("negative", _id(lambda rng, inp: -int(rng.integers(1, 100)), "")),
      at_name: ("value", _id(lambda rng, inp: inp[bound], at_note)),
      "id_past_int32": ("extreme", _id(lambda rng, inp: WRAP + 1, "")),
      "id_int64_max": ("extreme", _id(lambda rng, inp: I64_MAX, "")),
      "id_int64_min": ("extreme", _id(lambda rng, inp: I64_MIN, "")),
      zero_name: ("value", lambda rng, inp: _set(inp, bound, 0, "= 0")),
      **_ids_shape_and_dtype_mutations(),
  }


# ---- unique_with_counts


class Unique(Op):
  name = "unique_with_counts"

  def valid(self, rng):
    n = int(rng.integers(0, 30))
    dtype = rng.choice([np.int32, np.int64])
    return dict(ids=rng.integers(-5, 12, size=n).astype(dtype))

  def _extremes(rng, inp):
    ids = np.concatenate([inp["ids"].astype(np.int64),
                          [I64_MAX, I64_MIN, WRAP + 1, 1, -1, I64_MAX]])
    return _set(inp, "ids", rng.permutation(ids), "with int64 extremes")

  MUTATIONS = {
      "rank0": ("rank", lambda rng, inp: _set(inp, "ids", np.array(7, inp["ids"].dtype),
                                             "a scalar")),
      "rank2": ("rank", lambda rng, inp: inp["ids"].size > 0 and _set(
          inp, "ids", inp["ids"].reshape(-1, 1), "with shape [n, 1]")),
      "float_ids": ("dtype", lambda rng, inp: _set(inp, "ids", inp["ids"] + 0.5,
                                                   "float64 + 0.5")),
      "bool_ids": ("dtype", lambda rng, inp: _set(inp, "ids", inp["ids"] > 0, "bool")),
      "empty": ("empty", lambda rng, inp: _set(inp, "ids", inp["ids"][:0], "empty")),
      "int64_extremes": ("extreme", _extremes),
  }

  def oracle(self, inp):
    _int_vector(inp["ids"], "ids")
    return dict(result=list(oracles.unique_first_appearance(inp["ids"])))

  def call(self, inp, ctx, tf, tfde):
    return [x.numpy() for x in tfde.ops.unique_with_counts(_t(tf, inp["ids"]))]


# ---- partition_by_shard


class Partition(Op):
  name = "partition_by_shard"

  def valid(self, rng):
    dynamic = bool(rng.integers(0, 2))
    n = int(rng.integers(0, 30))
    lo = -50 if dynamic else 0
    ids = rng.integers(lo, 1000, size=n).astype(rng.choice([np.int32, np.int64]))
    return dict(ids=ids, num_shards=int(rng.integers(1, 9)), dynamic=dynamic)

  def _shards(value):
    return lambda rng, inp: _set(inp, "num_shards", value, f"= {value}")

  MUTATIONS = {
      "num_shards_0": ("value", _shards(0)),
      "num_shards_negative": ("negative", _shards(-3)),
      "num_shards_wraps_int32": ("extreme", _shards(WRAP + 2)),
      "num_shards_2**31": ("extreme", _shards(2**31)),
      "num_shards_int32_max": ("huge", _shards(I32_MAX)),
      "num_shards_1e12": ("huge", _shards(10**12)),
      "num_shards_int64_min": ("extreme", _shards(I64_MIN)),
      "num_shards_vector": ("rank", lambda rng, inp: _set(inp, "num_shards",
                                                          np.array([2], np.int32), "[2]")),
      "num_shards_float": ("dtype", _shards(2.5)),
      "negative_id": ("negative", _id_mutation(
          lambda rng, inp: -int(rng.integers(1, 100)), "")),
      "id_int64_max": ("extreme", _id_mutation(lambda rng, inp: I64_MAX, "")),
      "id_int64_min": ("extreme", _id_mutation(lambda rng, inp: I64_MIN, "")),
      **_ids_shape_and_dtype_mutations(),
  }

  def oracle(self, inp):
    ids = inp["ids"]
    _int_vector(ids, "ids")
    n = _int_scalar(inp["num_shards"], "num_shards", 1, I32_MAX)
    _check_bytes(4 * n, "shard_counts")
    ids64 = ids.astype(object)  # exact floor division and modulo
    if not inp["dynamic"]:
      _refuse_if(bool((ids < 0).any()), "negative id of a static table")
    shard = np.array([int(x) % n for x in ids64], np.int64)
    order = np.argsort(shard, kind="stable")
    local = ids[order] if inp["dynamic"] else np.array(
        [int(x) // n for x in ids64[order]], np.int64)
    counts = np.bincount(shard, minlength=n)
    positions = np.empty_like(order)
    positions[order] = np.arange(len(ids))
    return dict(result=[local, counts, positions])

  def call(self, inp, ctx, tf, tfde):
    out = tfde.ops.partition_by_shard(_t(tf, inp["ids"]), inp["num_shards"],
                                      dynamic=inp["dynamic"])
    return [x.numpy() for x in out]


# ---- check_id_range


class CheckIdRange(Op):
  name = "check_id_range"

  def valid(self, rng):
    size = int(rng.integers(1, 40))
    n = int(rng.integers(0, 30))
    ids = rng.integers(0, size, size=n).astype(rng.choice([np.int32, np.int64]))
    return dict(ids=ids, vocabulary_size=size)

  MUTATIONS = _range_mutations("vocabulary_size", "id_at_size", "(the size)", "vocabulary_0")

  def oracle(self, inp):
    ids = inp["ids"]
    _int_vector(ids, "ids")
    size = inp["vocabulary_size"]
    _refuse_if(bool(((ids < 0) | (ids >= size)).any()), "an id out of range")
    return dict(result=[ids])

  def call(self, inp, ctx, tf, tfde):
    return [tfde.ops.check_id_range(_t(tf, inp["ids"]), inp["vocabulary_size"],
                                    "feature f (table t)").numpy()]


# ---- sorted_unique_in_range


class SortedUniqueInRange(Op):
  name = "sorted_unique_in_range"

  def valid(self, rng):
    # Ranges of one bitmap word up to ones the kernel sorts instead.
    num_ids = int(rng.choice([1, 40, 5000, 2**20]))
    n = int(rng.integers(0, 30))
    ids = rng.integers(0, min(num_ids, 40), size=n).astype(rng.choice([np.int32, np.int64]))
    return dict(ids=ids, num_ids=num_ids)

  MUTATIONS = {
      **_range_mutations("num_ids", "id_at_range", "(the range's end)", "range_0"),
      "id_last_of_range": ("value", _id_mutation(lambda rng, inp: inp["num_ids"] - 1,
                                                 "(the range's last)", keep_int32=True)),
  }

  def oracle(self, inp):
    ids = inp["ids"]
    _int_vector(ids, "ids")
    _refuse_if(bool(((ids < 0) | (ids >= inp["num_ids"])).any()), "an id out of range")
    unique, inverse = np.unique(ids, return_inverse=True)
    return dict(result=[unique, inverse.ravel().astype(np.int32)])

  def call(self, inp, ctx, tf, tfde):
    return [x.numpy() for x in tfde.ops.sorted_unique_in_range(_t(tf, inp["ids"]),
                                                               inp["num_ids"])]


# ---- sample_keys and split_sample_keys (the pooled exchange's keys)


def _splits_mutation(change, note):
  def mutate(rng, inp):
    splits = inp["row_splits"].copy()
    return change(rng, splits) and _set(inp, "row_splits", splits, note)
  return mutate


def _swap_two(rng, splits):
  if splits.size < 3 or splits[1] == splits[2]:
    return False
  splits[1], splits[2] = splits[2], splits[1]
  return True


def _end_short(rng, splits):
  if splits[-1] == 0:
    return False
  splits[-1] -= 1
  return True


def _start_at_1(rng, splits):
  if splits.size < 2:
    return False
  splits[0] = 1
  return True


class SampleKeys(Op):
  name = "sample_keys"

  def valid(self, rng):
    lengths = rng.integers(0, 4, size=int(rng.integers(0, 8)))
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    stride = int(rng.choice([1, 4, 2**20, 2**40]))
    return dict(ids=rng.integers(0, stride, size=int(splits[-1])).astype(np.int64),
                row_splits=splits, first_sample=int(rng.integers(0, 100)), stride=stride)

  MUTATIONS = {
      "id_at_stride": ("value", _id_mutation(lambda rng, inp: inp["stride"], "(the stride)")),
      "negative_id": ("negative", _id_mutation(lambda rng, inp: -1, "")),
      "id_int64_max": ("extreme", _id_mutation(lambda rng, inp: I64_MAX, "")),
      "splits_decrease": ("value", _splits_mutation(_swap_two, "with two splits swapped")),
      "splits_end_short": ("value", _splits_mutation(_end_short, "ending short")),
      "splits_start_1": ("value", _splits_mutation(_start_at_1, "starting at 1")),
      "splits_empty": ("empty", lambda rng, inp: _set(inp, "row_splits",
                                                      inp["row_splits"][:0], "empty")),
      "first_sample_negative": ("negative", lambda rng, inp: _set(inp, "first_sample", -1,
                                                                  "= -1")),
      "first_sample_vector": ("rank", lambda rng, inp: _set(
          inp, "first_sample", np.array([0], np.int64), "[0]")),
      "stride_0": ("value", lambda rng, inp: _set(inp, "stride", 0, "= 0")),
      "keys_overflow": ("extreme", lambda rng, inp: _set(inp, "first_sample", I64_MAX // 2,
                                                         "= int64 max / 2")),
      **_ids_shape_and_dtype_mutations(),
  }

  def oracle(self, inp):
    ids, splits = inp["ids"], inp["row_splits"]
    _int_vector(ids, "ids")
    _int_vector(splits, "row_splits")
    first = _int_scalar(inp["first_sample"], "first_sample", 0)
    stride = _int_scalar(inp["stride"], "stride", 1)
    _refuse_if(splits.size == 0, "no row splits")
    _refuse_if(splits[0] != 0 or splits[-1] != ids.size or bool((np.diff(splits) < 0).any()),
               "row splits not a batch's over the ids")
    samples = splits.size - 1
    _refuse_if(samples > 0 and (samples + first) * stride - 1 > I64_MAX, "keys past int64")
    _refuse_if(bool(((ids < 0) | (ids >= stride)).any()), "an id not in [0, stride)")
    sample = np.repeat(np.arange(samples), np.diff(splits))
    keys = [(int(s) + first) * stride + int(i) for s, i in zip(sample, ids)]
    return dict(result=[np.array(keys, np.int64)])

  def call(self, inp, ctx, tf, tfde):
    return [tfde.ops.sample_keys(_t(tf, inp["ids"]), _t(tf, inp["row_splits"]),
                                 _t(tf, inp["first_sample"]), inp["stride"]).numpy()]


class SplitSampleKeys(Op):
  name = "split_sample_keys"

  def valid(self, rng):
    num_samples, bits = int(rng.integers(0, 10)), int(rng.choice([0, 2, 20, 40]))
    n = int(rng.integers(0, 20)) if num_samples else 0
    sample = np.sort(rng.integers(0, max(num_samples, 1), size=n))
    keys = (sample << bits) + rng.integers(0, 2**bits, size=n)
    return dict(keys=keys.astype(np.int64), num_samples=num_samples, bits=bits)

  def _key(make, note):
    def mutate(rng, inp):
      if inp["keys"].size == 0:
        return False
      keys = inp["keys"].copy()
      i = _pick(rng, keys)
      keys[i] = make(inp)
      return _set(inp, "keys", keys, f"[{i}] = {keys[i]} {note}")
    return mutate

  def _reversed(rng, inp):
    keys = inp["keys"]
    if len(set((keys >> inp["bits"]).tolist())) < 2:
      return False
    return _set(inp, "keys", keys[::-1].copy(), "reversed")

  MUTATIONS = {
      "negative_key": ("negative", _key(lambda inp: -1, "")),
      "key_past_samples": ("value", _key(lambda inp: inp["num_samples"] << inp["bits"],
                                         "(sample num_samples)")),
      "key_int64_max": ("extreme", _key(lambda inp: I64_MAX, "")),
      "keys_out_of_order": ("value", _reversed),
      "num_samples_negative": ("negative", lambda rng, inp: _set(inp, "num_samples", -1,
                                                                 "= -1")),
      "num_samples_vector": ("rank", lambda rng, inp: _set(
          inp, "num_samples", np.array([3], np.int64), "[3]")),
      "keys_float": ("dtype", lambda rng, inp: _set(inp, "keys", inp["keys"] + 0.5,
                                                    "float64 + 0.5")),
      "keys_rank2": ("rank", lambda rng, inp: inp["keys"].size > 0 and _set(
          inp, "keys", inp["keys"].reshape(1, -1), "with shape [1, n]")),
  }

  def oracle(self, inp):
    keys, bits = inp["keys"], inp["bits"]
    _int_vector(keys, "keys")
    num = _int_scalar(inp["num_samples"], "num_samples", 0, I64_MAX - 1)
    _check_bytes(8 * (num + 1), "row_splits")
    previous = 0
    for k in keys.tolist():
      _refuse_if(k < 0, "a negative key")
      _refuse_if(k >> bits >= num, "a key's sample past num_samples")
      _refuse_if(k >> bits < previous, "keys not in increasing sample")
      previous = k >> bits
    sample = keys >> bits
    return dict(result=[keys & ((1 << bits) - 1),
                        np.searchsorted(sample, np.arange(num + 1)).astype(np.int64)])

  def call(self, inp, ctx, tf, tfde):
    return [x.numpy() for x in tfde.ops.split_sample_keys(
        _t(tf, inp["keys"]), _t(tf, inp["num_samples"]), inp["bits"])]
