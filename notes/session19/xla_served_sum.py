import os, sys, time, statistics
sys.path.insert(0, "/work/main/bench")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
from workload import Workload
work = Workload(); ids = work.ids(seed=0)
tables = [tf.Variable(tf.random.uniform([work.vocab, work.dim])) for _ in range(work.tables)]
inputs = [tf.constant(i) for i in ids]
body = lambda xs: [tf.reduce_sum(tf.gather(t, x), 1) for t, x in zip(tables, xs)]
def i32(xs): return [tf.reduce_sum(tf.gather(t, tf.cast(x, tf.int32)), 1) for t, x in zip(tables, xs)]
def dot(xs): return [tf.einsum("bkd,k->bd", tf.gather(t, x), tf.ones([x.shape[1]])) for t, x in zip(tables, xs)]
def unrolled(xs):
  out = []
  for t, x in zip(tables, xs):
    g = tf.gather(t, x)
    acc = g[:, 0]
    for k in range(1, x.shape[1]): acc = acc + g[:, k]
    out.append(acc)
  return out
fns = {"stock": tf.function(body), "xla": tf.function(body, jit_compile=True),
       "xla i32": tf.function(i32, jit_compile=True), "xla dot": tf.function(dot, jit_compile=True),
       "xla unrolled": tf.function(unrolled, jit_compile=True)}
want = fns["stock"](inputs)
for k, f in fns.items():
  got = f(inputs)
  print(k, "maxdiff", max(float(tf.reduce_max(tf.abs(a-b))) for a, b in zip(want, got)))
for f in fns.values():
  for _ in range(3): f(inputs)
res = {k: [] for k in fns}; cpu = {k: 0.0 for k in fns}
for _ in range(int(sys.argv[1])):
  for k, f in fns.items():
    c = time.process_time(); t = time.perf_counter(); [o.numpy() for o in f(inputs)]; res[k].append((time.perf_counter() - t) * 1e3); cpu[k] += time.process_time() - c
for k, v in res.items(): print(k, "median %.2f min %.2f cpu/call %.2f" % (statistics.median(v), min(v), cpu[k] / len(v) * 1e3))
