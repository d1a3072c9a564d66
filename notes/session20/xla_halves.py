"""The export's dense gather and sum as XLA computations: one per table
(session 19: 6.7 ms), against the batch cut into parts, each part its own
jit-compiled function, so that TensorFlow's executor runs them on both
cores. ms for the bench's 4 tables, alternating rounds; torch in
../session19/torch_sum.py."""
import os, statistics, sys, time
sys.path.insert(0, "/work/main/bench")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
from workload import Workload
work = Workload(); ids = work.ids(seed=0)
tables = [tf.Variable(tf.random.uniform([work.vocab, work.dim])) for _ in range(work.tables)]
inputs = [tf.constant(i) for i in ids]

gather_sum = lambda t, x: tf.reduce_sum(tf.gather(t, x), 1)
xla_one = tf.function(gather_sum, jit_compile=True)

def stock(xs):
  return [tf.reduce_sum(tf.gather_nd(t, x[..., None]), 1) for t, x in zip(tables, xs)]

def xla_whole(xs):
  return [xla_one(t, x) for t, x in zip(tables, xs)]

def xla_parts(n):
  def f(xs):
    return [tf.concat([xla_one(t, p) for p in tf.split(x, n)], 0) for t, x in zip(tables, xs)]
  return f

fns = {"stock gather_nd+sum": tf.function(stock), "xla per table": tf.function(xla_whole)}
for n in (2, 4, 8):
  fns[f"xla {n} parts"] = tf.function(xla_parts(n))
want = fns["stock gather_nd+sum"](inputs)
for k, f in fns.items():
  print(k, "maxdiff", max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(f(inputs), want)))
for f in fns.values():
  for _ in range(3): f(inputs)
rounds = {k: [] for k in fns}
for _ in range(int(sys.argv[1])):
  for k, f in fns.items():
    t = time.perf_counter(); [o.numpy() for o in f(inputs)]; rounds[k].append((time.perf_counter() - t) * 1e3)
for k, v in rounds.items(): print(f"{k:22s} median {statistics.median(v):6.2f} min {min(v):6.2f}")
