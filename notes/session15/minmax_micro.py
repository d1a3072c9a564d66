"""The id range check alone: TfdeCheckIdRange-style pass through
sorted_unique_in_range's FindOutOfRange, timed on the bench's 327,680 int64 ids
(4 tables' ids fused into a 4M-row space); median of 200 calls."""
import statistics, sys, time
sys.path.insert(0, "bench")
import numpy as np
import tensorflow as tf
from tfde.ops import native
from workload import Workload
w = Workload()
ids = np.concatenate([i.ravel() + t * w.vocab for t, i in enumerate(w.ids(0))])
ids = tf.constant(ids)
f = tf.function(lambda x: native.sorted_unique_in_range(x, 4 * w.vocab))
for _ in range(10): f(ids)
ts = []
for _ in range(200):
  t = time.perf_counter(); f(ids)[0].numpy(); ts.append((time.perf_counter() - t) * 1e3)
print(f"sorted_unique_in_range median {statistics.median(ts):.3f} ms")
