"""The one-replica forward on dense ids against the same ids as ragged rows
of 20 (and against an empty function taking them), alternating; ms."""
import statistics, sys, time
sys.path.insert(0, "bench")
import tensorflow as tf
import tfde
from workload import Workload

work = Workload()
lookup = tfde.lookup.ShardedLookup(work.feature_configs())
ids = work.ids(seed=0)
dense = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
ragged = {k: tf.RaggedTensor.from_uniform_row_length(tf.reshape(v, [-1]), work.hot)
          for k, v in dense.items()}
ragged = {k: tf.RaggedTensor.from_row_splits(v.values, v.row_splits) for k, v in ragged.items()}
fwd = tf.function(lambda i: lookup(i, training=False))
empty = tf.function(lambda i: tf.constant(0.0))
stages = {"dense": lambda: fwd(dense), "ragged": lambda: fwd(ragged),
          "empty call, dense": lambda: empty(dense), "empty call, ragged": lambda: empty(ragged)}
for f in stages.values():
  for _ in range(3): f()
rounds = {k: [] for k in stages}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 40):
  for k, f in stages.items():
    t = time.perf_counter(); r = f(); tf.nest.map_structure(lambda x: x.numpy(), r)
    rounds[k].append((time.perf_counter() - t) * 1e3)
for k, v in rounds.items():
  print(f"{k:20s} median {statistics.median(v):6.2f}  min {min(v):6.2f}")
