import os, sys, time, statistics
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, "/work/main/bench"); sys.path.insert(0, os.getcwd())
import tensorflow as tf, tfde
from workload import Workload
work = Workload(); ids = work.ids(seed=0)
lookup = tfde.lookup.ShardedLookup(work.feature_configs())
dense = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
ragged = {k: tf.RaggedTensor.from_tensor(v) for k, v in dense.items()}
parts = {k: (v.values, v.row_splits) for k, v in ragged.items()}
fa = tf.function(lambda i: lookup(i, training=False))
fb = tf.function(lambda i: lookup(i, training=False))
fc = tf.function(lambda p: lookup({k: tf.RaggedTensor.from_row_splits(v, s, validate=False) for k, (v, s) in p.items()}, training=False))
fns = {"dense": (fa, dense), "ragged": (fb, ragged), "parts": (fc, parts)}
for f, x in fns.values():
  for _ in range(5): f(x)
res = {k: [] for k in fns}
for r in range(int(sys.argv[1])):
  for k, (f, x) in fns.items():
    t = time.perf_counter()
    for _ in range(100): f(x)
    res[k].append((time.perf_counter() - t) * 10)
for k, v in res.items(): print(k, "median ms %.3f min %.3f" % (statistics.median(v), min(v)))
