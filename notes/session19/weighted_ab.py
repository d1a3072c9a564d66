import os, sys, time, statistics
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, "/work/main/bench"); sys.path.insert(0, os.getcwd())
import numpy as np, tensorflow as tf, tfde
from workload import Workload
work = Workload(); ids = work.ids(seed=0)
lookup = tfde.lookup.ShardedLookup(work.feature_configs())
rng = np.random.default_rng(1)
dense = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
dw = {k: tf.constant(rng.uniform(0.5, 1.5, v.shape).astype(np.float32)) for k, v in dense.items()}
parts = {k: (tf.RaggedTensor.from_tensor(v).values, tf.RaggedTensor.from_tensor(v).row_splits) for k, v in dense.items()}
wparts = {k: (tf.reshape(v, [-1]), parts[k][1]) for k, v in dw.items()}
rt = lambda p: {k: tf.RaggedTensor.from_row_splits(v, s, validate=False) for k, (v, s) in p.items()}
fns = {
 "dense": (tf.function(lambda i: lookup(i, training=False)), (dense,)),
 "dense w": (tf.function(lambda i, w: lookup(i, w, training=False)), (dense, dw)),
 "parts": (tf.function(lambda p: lookup(rt(p), training=False)), (parts,)),
 "parts w": (tf.function(lambda p, q: lookup(rt(p), rt(q), training=False)), (parts, wparts)),
 "args only w": (tf.function(lambda p, q: tf.constant(0.0)), (parts, wparts)),
 "args only": (tf.function(lambda p: tf.constant(0.0)), (parts,)),
}
for f, a in fns.values():
  for _ in range(5): f(*a)
res = {k: [] for k in fns}
for r in range(int(sys.argv[1])):
  for k, (f, a) in fns.items():
    t = time.perf_counter()
    for _ in range(100): f(*a)
    res[k].append((time.perf_counter() - t) * 10)
for k, v in res.items(): print(k, "median ms %.3f min %.3f" % (statistics.median(v), min(v)))
import collections
for k in ("dense w", "parts w"):
  f, a = fns[k]
  g = f.get_concrete_function(*a).graph
  c = collections.Counter(op.type for op in g.get_operations())
  print(k, len(g.get_operations()), sorted(((t, n) for t, n in c.items() if t != "Const"), key=lambda kv: -kv[1]))
