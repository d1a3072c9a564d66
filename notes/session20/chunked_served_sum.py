"""The export's gather and sum, whole against the batch cut into chunks
whose gathered rows fit the L2 cache (stock ops, unrolled in the graph)."""
import os, sys, time, statistics
sys.path.insert(0, "/work/main/bench")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
from workload import Workload
work = Workload(); ids = work.ids(seed=0)
tables = [tf.Variable(tf.random.uniform([work.vocab, work.dim])) for _ in range(work.tables)]
inputs = [tf.constant(i) for i in ids]

def whole(xs):
  return [tf.reduce_sum(tf.gather_nd(t, x[..., None]), 1) for t, x in zip(tables, xs)]

def chunked(n):
  def f(xs):
    out = []
    for t, x in zip(tables, xs):
      parts = tf.split(x, n, axis=0)
      out.append(tf.concat([tf.reduce_sum(tf.gather_nd(t, p[..., None]), 1) for p in parts], 0))
    return out
  return f

def mapped(n, par):
  def f(xs):
    out = []
    for t, x in zip(tables, xs):
      c = tf.reshape(x, [n, -1, x.shape[1]])
      r = tf.map_fn(lambda p: tf.reduce_sum(tf.gather_nd(t, p[..., None]), 1), c,
                    fn_output_signature=tf.float32, parallel_iterations=par)
      out.append(tf.reshape(r, [-1, work.dim]))
    return out
  return f

def columns(xs):
  return [tf.add_n([tf.gather_nd(t, x[:, k, None]) for k in range(x.shape[1])]) for t, x in zip(tables, xs)]

def transposed(xs):
  return [tf.reduce_sum(tf.gather_nd(t, tf.transpose(x)[..., None]), 0) for t, x in zip(tables, xs)]

fns = {"whole": tf.function(whole), "columns add_n": tf.function(columns),
       "transposed sum": tf.function(transposed)}
for n in (8, 64):
  fns[f"split {n}"] = tf.function(chunked(n))
for n in ():
  fns[f"map_fn {n}"] = tf.function(mapped(n, 2))
want = fns["whole"](inputs)
for k, f in fns.items():
  got = f(inputs)
  print(k, "maxdiff", max(float(tf.reduce_max(tf.abs(a-b))) for a, b in zip(want, got)))
for f in fns.values():
  for _ in range(3): f(inputs)
res = {k: [] for k in fns}
for _ in range(int(sys.argv[1])):
  for k, f in fns.items():
    t = time.perf_counter(); [o.numpy() for o in f(inputs)]; res[k].append((time.perf_counter() - t) * 1e3)
for k, v in res.items(): print(k, "median %.2f min %.2f" % (statistics.median(v), min(v)))
