import os, sys, time, statistics
sys.path.insert(0, "/work/main/bench")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf, numpy as np
from workload import Workload
work = Workload(); ids = work.ids(seed=0)
tables = [tf.Variable(tf.random.uniform([work.vocab, work.dim])) for _ in range(work.tables)]
flat = [tf.constant(i.reshape(-1)) for i in ids]
rng = np.random.default_rng(1)
lengths = [rng.integers(1, 40, size=4096) for _ in ids]
rag = [tf.constant(np.concatenate([i, i[:, ::-1]], 1)[np.arange(40)[None, :] < n[:, None]]) for i, n in zip(ids, lengths)]
seg = [tf.constant(np.repeat(np.arange(4096), n)) for n in lengths]
def dense(g):
  return tf.function(lambda xs: [tf.reduce_sum(tf.reshape(g(t, x), [4096, 20, 64]), 1) for t, x in zip(tables, xs)])
def ragged(g):
  return tf.function(lambda xs, ss: [tf.math.segment_sum(g(t, x), s) for t, x, s in zip(tables, xs, ss)])
gather = lambda t, x: tf.gather(t, x)
gnd = lambda t, x: tf.gather_nd(t, x[:, None])
fns = {"dense gather": (dense(gather), (flat,)), "dense gather_nd": (dense(gnd), (flat,)),
       "ragged gather": (ragged(gather), (rag, seg)), "ragged gather_nd": (ragged(gnd), (rag, seg)),
       "gather alone": (tf.function(lambda xs: [tf.gather(t, x)[0] for t, x in zip(tables, xs)]), (flat,)),
       "gather_nd alone": (tf.function(lambda xs: [tf.gather_nd(t, x[:, None])[0] for t, x in zip(tables, xs)]), (flat,))}
for a, b in (("dense gather", "dense gather_nd"), ("ragged gather", "ragged gather_nd")):
  x = fns[a][0](*fns[a][1]); y = fns[b][0](*fns[b][1])
  print(a, b, "maxdiff", max(float(tf.reduce_max(tf.abs(p - q))) for p, q in zip(x, y)))
for f, args in fns.values():
  for _ in range(3): f(*args)
res = {k: [] for k in fns}
for _ in range(int(sys.argv[1])):
  for k, (f, args) in fns.items():
    t = time.perf_counter(); [o.numpy() for o in f(*args)]; res[k].append((time.perf_counter() - t) * 1e3)
for k, v in res.items(): print(k, "median %.2f min %.2f" % (statistics.median(v), min(v)))
