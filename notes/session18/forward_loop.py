"""The one-replica forward (dense sum, or ragged with RAGGED=1) in a loop
for perf: python forward_loop.py SECONDS."""
import sys, time, os
sys.path.insert(0, "bench")
import tensorflow as tf
import tfde
from workload import Workload, lookup_steps

work = Workload()
lookup = tfde.lookup.ShardedLookup(work.feature_configs())
ids = work.ids(seed=0)
if os.environ.get("RAGGED"):
  inputs = {f"f{t}": tf.RaggedTensor.from_tensor(tf.constant(ids[t])) for t in range(work.tables)}
else:
  inputs = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
forward, _ = lookup_steps(lookup, inputs, None)
for _ in range(5): forward()
print("pid", os.getpid(), flush=True)
end = time.time() + float(sys.argv[1]); n = 0; t0 = time.perf_counter()
while time.time() < end:
  forward(); n += 1
print("steps", n, "ms/step", (time.perf_counter() - t0) * 1e3 / n)
