import os, sys, time, statistics
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/bench"); sys.argv = sys.argv[:1]
import numpy as np, tensorflow as tf, tfde
from tfde.ops import reference
from tfde import inputs as inputs_lib
from workload import parse_args, timed
args, work = parse_args("", reps=7)
ids = work.ids(seed=0)
tables = [tf.Variable(tf.random.uniform([work.vocab, work.dim])) for _ in range(work.tables)]
x = [tf.constant(i) for i in ids]
def current(x):
  out = []
  for t, i in zip(tables, x):
    f_ids, splits, w = inputs_lib.flatten_feature("f", "t", i, None)
    f_ids = inputs_lib.check_id_range(f_ids, work.vocab, "f", "t")
    rows = tf.gather(t, f_ids)
    out.append(reference.embedding_combine(rows, tf.range(tf.size(f_ids)), splits, None, "sum"))
  return out
def gather_only(x):
  out = []
  for t, i in zip(tables, x):
    f_ids, splits, w = inputs_lib.flatten_feature("f", "t", i, None)
    out.append(tf.gather(t, f_ids))
  return out
def check_only(x):
  out = []
  for t, i in zip(tables, x):
    f_ids, splits, w = inputs_lib.flatten_feature("f", "t", i, None)
    out.append(inputs_lib.check_id_range(f_ids, work.vocab, "f", "t"))
  return out
def segsum(x):
  out = []
  for t, i in zip(tables, x):
    f_ids, splits, w = inputs_lib.flatten_feature("f", "t", i, None)
    f_ids = inputs_lib.check_id_range(f_ids, work.vocab, "f", "t")
    rows = tf.gather(t, f_ids)
    seg = tf.ragged.row_splits_to_segment_ids(splits, out_type=tf.int32)
    out.append(tf.math.unsorted_segment_sum(rows, seg, tf.size(splits) - 1))
  return out
def sorted_segsum(x):
  out = []
  for t, i in zip(tables, x):
    f_ids, splits, w = inputs_lib.flatten_feature("f", "t", i, None)
    f_ids = inputs_lib.check_id_range(f_ids, work.vocab, "f", "t")
    rows = tf.gather(t, f_ids)
    seg = tf.ragged.row_splits_to_segment_ids(splits, out_type=tf.int32)
    out.append(tf.reduce_sum(tf.reshape(rows, [-1, 20, 64]), 1))
  return out
def sparse_segment(x):
  out = []
  for t, i in zip(tables, x):
    f_ids, splits, w = inputs_lib.flatten_feature("f", "t", i, None)
    f_ids = inputs_lib.check_id_range(f_ids, work.vocab, "f", "t")
    seg = tf.ragged.row_splits_to_segment_ids(splits, out_type=tf.int32)
    out.append(tf.sparse.segment_sum(t, f_ids, seg, num_segments=tf.size(splits) - 1))
  return out
def new_served(x):
  out = []
  for t, i in zip(tables, x):
    f_ids, splits, w = inputs_lib.flatten_feature("f", "t", i, None)
    f_ids = inputs_lib.check_id_range(f_ids, work.vocab, "f", "t")
    rows = tf.gather(t, f_ids)
    out.append(inputs_lib.combine_served_rows(rows, splits, None, "sum", hotness=20))
  return out
def lookup_sparse(x):
  out = []
  for t, i in zip(tables, x):
    sp = tf.sparse.from_dense(i + 1)
    sp = tf.SparseTensor(sp.indices, sp.values - 1, sp.dense_shape)
    out.append(tf.nn.embedding_lookup_sparse(t, sp, None, combiner="sum"))
  return out
fns = {n: tf.function(f) for n, f in [("current", current), ("gather only", gather_only), ("check only", check_only), ("unsorted segsum", segsum), ("dense reshape+reduce", sorted_segsum), ("tf.nn lookup_sparse", lookup_sparse), ("sparse_segment_sum", sparse_segment), ("served now", new_served)]}
ref = fns["current"](x)
for n, f in fns.items():
  if n in ("unsorted segsum", "dense reshape+reduce", "tf.nn lookup_sparse", "sparse_segment_sum", "served now"):
    got = f(x); print(n, "max diff", max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(got, ref)))
r = {n: [] for n in fns}
for _ in range(5):
  for n, f in fns.items(): r[n].append(timed(lambda: f(x), 5))
for n, v in r.items(): print(f"{n}: {statistics.median(v):.1f} ms")
