import os, sys, time, statistics, dataclasses
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/bench")
import tensorflow as tf, tfde, tfde.ops
from tfde.ops import native
from workload import lookup_steps, parse_args, timed
sys.argv = sys.argv[:1]
args, work = parse_args("", reps=7)
cfgs = {k: dataclasses.replace(v, table=dataclasses.replace(v.table, optimizer=tfde.optimizers.SGD(learning_rate=0.1))) for k, v in work.feature_configs().items()}
lookup = tfde.lookup.ShardedLookup(cfgs)
ids = work.ids(seed=0)
inputs = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
loss = lambda out: tf.add_n([tf.reduce_sum(v) for v in out.values()])
_, with_op = lookup_steps(lookup, inputs, loss); with_op()
kernel = native.stamp_rows
native.stamp_rows = lambda s, r, step: s.scatter_update(tf.IndexedSlices(tf.fill(tf.shape(r), tf.cast(step, tf.int64)), r))
_, with_scatter = lookup_steps(lookup, inputs, loss); with_scatter()
native.stamp_rows = kernel
r = {"SGD step, stamps by TfdeStampRows": [], "SGD step, stamps by TF scatter": []}
for _ in range(12):
  r["SGD step, stamps by TfdeStampRows"].append(timed(with_op, 5, warmup=1))
  r["SGD step, stamps by TF scatter"].append(timed(with_scatter, 5, warmup=1))
for k, v in r.items(): print(f"{k}: median {statistics.median(v):.2f} ms, min {min(v):.2f} (12 alternating rounds of 5)")
