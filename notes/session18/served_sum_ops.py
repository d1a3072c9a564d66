"""The export's dense sum in stock ops: gather then reduce_sum (today's
export) against tf.sparse.segment_sum reading the table in place, and
tf.nn.embedding_lookup_sparse; alternating rounds, ms for 4 tables."""
import statistics, sys, time
sys.path.insert(0, "bench")
import numpy as np
import tensorflow as tf
from workload import Workload

work = Workload()
ids = work.ids(seed=0)
tables = [tf.Variable(tf.random.uniform([work.vocab, work.dim])) for _ in range(work.tables)]
inputs = [tf.constant(i) for i in ids]

def gather_sum(table, x):
  return tf.reduce_sum(tf.gather(table, x), 1)

def segment(table, x):
  flat = tf.reshape(x, [-1])
  seg = tf.repeat(tf.range(tf.shape(x)[0]), tf.shape(x)[1])
  return tf.sparse.segment_sum(table, flat, seg, num_segments=tf.shape(x)[0])

def segment_mean(table, x):
  flat = tf.reshape(x, [-1])
  seg = tf.repeat(tf.range(tf.shape(x)[0]), tf.shape(x)[1])
  return tf.sparse.segment_mean(table, flat, seg, num_segments=tf.shape(x)[0])

def sparse_matmul(table, x):
  b = tf.shape(x, out_type=tf.int64)[0]
  flat = tf.reshape(x, [-1])
  rows = tf.repeat(tf.range(b), tf.shape(x, out_type=tf.int64)[1])
  sp = tf.SparseTensor(tf.stack([rows, flat], 1), tf.ones_like(flat, tf.float32),
                       tf.stack([b, tf.shape(table, out_type=tf.int64)[0]]))
  return tf.sparse.sparse_dense_matmul(sp, table)

def gather_only(table, x):
  return tf.gather(table, x)[:, 0]

def per_column(table, x):
  return tf.add_n([tf.gather(table, x[:, j]) for j in range(x.shape[1])])

variants = {"sparse_dense_matmul": sparse_matmul, "gather only": gather_only, "per column": per_column, "gather+sum": gather_sum, "sparse_segment_sum": segment, "sparse_segment_mean": segment_mean}
fns = {name: tf.function(lambda xs, v=v: [v(t, x) for t, x in zip(tables, xs)])
       for name, v in variants.items()}
want = fns["gather+sum"](inputs)
got = fns["sparse_segment_sum"](inputs)
got2 = fns["sparse_dense_matmul"](inputs)
print("max diff mm", max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(got2, want)))
print("max diff", max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(got, want)))
for f in fns.values():
  for _ in range(3): f(inputs)
rounds = {k: [] for k in fns}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
  for k, f in fns.items():
    t = time.perf_counter(); [o.numpy() for o in f(inputs)]
    rounds[k].append((time.perf_counter() - t) * 1e3)
for k, v in rounds.items():
  print(f"{k:20s} median {statistics.median(v):6.2f}  min {min(v):6.2f}")
