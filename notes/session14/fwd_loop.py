"""The bench's forward (ShardedLookup, training=False, dense or ragged ids)
in a loop for `perf record`, or timed: python fwd_loop.py dense|ragged [seconds]."""
import sys, time, statistics
sys.path.insert(0, "bench")
import numpy as np, tensorflow as tf, tfde
from workload import Workload
work = Workload(); ids = work.ids(seed=0)
form = sys.argv[1]
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0
if form == "dense":
  inputs = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
else:
  inputs = {f"f{t}": tf.RaggedTensor.from_tensor(tf.constant(ids[t])) for t in range(work.tables)}
lookup = tfde.lookup.ShardedLookup(work.feature_configs())
forward = tf.function(lambda x: lookup(x, training=False))
for _ in range(5): forward(inputs)
if seconds:
  print("ready", flush=True)
  t = time.time()
  while time.time() - t < seconds: forward(inputs)["f0"].numpy()
else:
  times = []
  for _ in range(200):
    t = time.perf_counter(); forward(inputs)["f0"].numpy(); times.append((time.perf_counter() - t) * 1e3)
  print(form, "median", round(statistics.median(times), 3), "min", round(min(times), 3))
