"""The export's stock-op sum (gather_nd + reduce_sum) against
tf.sparse.sparse_dense_matmul of the batch's [batch, vocab] sparse counts
by the table, the table read without a copy (session 18 measured the
matmul at 77 to 91 ms, which may have included copy-on-read); ms for the
bench's 4 tables, alternating rounds.  python sparse_matmul_export.py ROUNDS"""
import os, statistics, sys, time
sys.path.insert(0, "/work/main/bench")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
from workload import Workload
work = Workload(); ids = work.ids(seed=0)
tables = [tf.Variable(tf.random.uniform([work.vocab, work.dim])) for _ in range(work.tables)]
inputs = [tf.constant(i) for i in ids]

def gather_sum(t, x):
  return tf.reduce_sum(tf.gather_nd(t, x[..., None]), 1)

def matmul(read):
  def f(t, x):
    batch, hot = tf.shape(x, out_type=tf.int64)[0], tf.shape(x, out_type=tf.int64)[1]
    rows = tf.repeat(tf.range(batch), hot)
    sp = tf.SparseTensor(tf.stack([rows, tf.reshape(x, [-1])], 1),
                         tf.ones([batch * hot]), [batch, work.vocab])
    return tf.sparse.sparse_dense_matmul(sp, read(t))
  return f

variants = {"gather_nd+sum": gather_sum,
            "sparse_dense_matmul no_copy": matmul(lambda t: t.read_value_no_copy()),
            "sparse_dense_matmul var": matmul(lambda t: t)}
fns = {k: tf.function(lambda xs, v=v: [v(t, x) for t, x in zip(tables, xs)]) for k, v in variants.items()}
want = fns["gather_nd+sum"](inputs)
for k, f in fns.items():
  print(k, "maxdiff", max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(f(inputs), want)))
for f in fns.values():
  for _ in range(3): f(inputs)
rounds = {k: [] for k in fns}
for _ in range(int(sys.argv[1])):
  for k, f in fns.items():
    t = time.perf_counter(); [o.numpy() for o in f(inputs)]; rounds[k].append((time.perf_counter() - t) * 1e3)
for k, v in rounds.items(): print(f"{k:30s} median {statistics.median(v):6.2f} min {min(v):6.2f}")
