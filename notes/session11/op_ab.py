import os, sys, time, statistics
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/bench")
import numpy as np, tensorflow as tf, tfde, tfde.ops
from workload import parse_args
sys.argv = sys.argv[:1]
args, work = parse_args("", reps=7)
ids = work.ids(seed=0)
feats = [tf.constant(np.asarray(x).reshape(-1).astype(np.int64)) for x in ids]
uniq = [tf.constant(np.unique(np.asarray(x))) for x in ids]
stamps = [tf.Variable(tf.zeros([work.vocab], tf.int64)) for _ in range(work.tables)]
def fns(backend):
  with tfde.ops.backend(backend):
    @tf.function
    def check():
      return [tfde.ops.check_id_range(f, work.vocab, f"feature f{t} (table t{t})") for t, f in enumerate(feats)]
    @tf.function
    def stamp():
      for s, u in zip(stamps, uniq):
        tfde.ops.stamp_rows(s, u, 7)
    @tf.function
    def scatter():
      for s, u in zip(stamps, uniq):
        s.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(u), tf.constant(7, tf.int64)), u))
    check(); stamp(); scatter()
  return check, stamp, scatter
k, r = fns("kernels"), fns("reference")
res = {n: [] for n in ("check kernel", "check twin", "stamp kernel", "stamp twin", "stamp bare TF scatter")}
for _ in range(15):
  for name, fn in (("check kernel", k[0]), ("check twin", r[0]), ("stamp kernel", k[1]), ("stamp twin", r[1]), ("stamp bare TF scatter", k[2])):
    ts = []
    for _ in range(10):
      t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    res[name].append(statistics.median(ts) * 1e3)
print(f"4 features of {feats[0].shape[0]} ids; 4 tables of {work.vocab} stamps, {[int(u.shape[0]) for u in uniq]} rows each; median of 15 rounds (min):")
for n, v in res.items():
  print(f"  {n:22s} {statistics.median(v):6.2f} ms ({min(v):.2f})")
