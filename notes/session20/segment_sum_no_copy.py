"""tf.sparse.segment_sum on the table read with read_value_no_copy (no
copy-on-read), against the export's gather_nd and reduce_sum; ms for the
bench's 4 tables, alternating rounds."""
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

def seg(read):
  def f(t, x):
    flat = tf.reshape(x, [-1])
    s = tf.repeat(tf.range(tf.shape(x)[0]), tf.shape(x)[1])
    return tf.sparse.segment_sum(read(t), flat, s, num_segments=tf.shape(x)[0])
  return f

variants = {"gather_nd+sum": gather_sum,
            "segment_sum read_value": seg(lambda t: t.read_value()),
            "segment_sum no_copy": seg(lambda t: t.read_value_no_copy()),
            "segment_sum var": seg(lambda t: t)}
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
for k, v in rounds.items(): print(f"{k:25s} median {statistics.median(v):6.2f} min {min(v):6.2f}")
