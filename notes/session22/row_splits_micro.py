"""Row splits of sorted sample ids (the pooled exchange's owner side) and
segment ids of row splits (its sender side), in stock-op forms; median
microseconds over 200 calls at the 4-replica bench's sizes (82k ids per
owner, 16k bags)."""
import os, time, statistics
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np, tensorflow as tf
rng = np.random.default_rng(0)
total = 16384
sample = np.sort(rng.integers(0, total, 81920)).astype(np.int32)
lengths = np.full(4096, 20); splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
s_t, sp_t = tf.constant(sample), tf.constant(splits)

@tf.function
def bincount_cumsum(sample):
  return tf.concat([tf.zeros([1], tf.int64), tf.cast(tf.cumsum(tf.math.bincount(
      sample, minlength=total, maxlength=total, dtype=tf.int32)), tf.int64)], 0)
@tf.function
def searchsorted(sample):
  return tf.searchsorted(sample, tf.range(total + 1, dtype=tf.int32), out_type=tf.int64)
@tf.function
def seg_ragged(splits):
  return tf.ragged.row_splits_to_segment_ids(splits, out_type=tf.int64)
@tf.function
def seg_searchsorted(splits):
  n = splits[-1]
  return tf.searchsorted(splits[1:], tf.range(n), side="right")
@tf.function
def seg_cumsum_scatter(splits):
  n = splits[-1]
  marks = tf.scatter_nd(splits[1:-1, None], tf.ones_like(splits[1:-1]), [n])
  return tf.cumsum(marks)

a, b = bincount_cumsum(s_t).numpy(), searchsorted(s_t).numpy()
assert (a == b).all()
c, d, e = seg_ragged(sp_t).numpy(), seg_searchsorted(sp_t).numpy(), seg_cumsum_scatter(sp_t).numpy()
assert (c == d).all() and (c == e).all(), (c[:30], d[:30], e[:30])
for name, f, x in (("bincount+cumsum", bincount_cumsum, s_t), ("searchsorted", searchsorted, s_t),
                   ("row_splits_to_segment_ids", seg_ragged, sp_t),
                   ("segment ids by searchsorted", seg_searchsorted, sp_t),
                   ("segment ids by scatter+cumsum", seg_cumsum_scatter, sp_t)):
  for _ in range(20): f(x)
  ts = []
  for _ in range(200):
    t = time.perf_counter(); f(x); ts.append(time.perf_counter() - t)
  print(f"{name:32s} {statistics.median(ts) * 1e6:8.1f} us")
@tf.function
def nothing(x):
  return tf.identity(x)
@tf.function
def bincount_only(sample):
  return tf.math.bincount(sample, minlength=total, maxlength=total, dtype=tf.int32)
@tf.function
def cumsum_only(sample):
  return tf.cumsum(sample[:total + 1])
for name, f, x in (("identity (call overhead)", nothing, s_t), ("bincount", bincount_only, s_t), ("cumsum 16k", cumsum_only, s_t)):
  for _ in range(20): f(x)
  ts = []
  for _ in range(200):
    t = time.perf_counter(); f(x); ts.append(time.perf_counter() - t)
  print(f"{name:32s} {statistics.median(ts) * 1e6:8.1f} us")
