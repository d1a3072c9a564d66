"""bench/sharded_bench.py's step (MirroredStrategy over N logical CPUs, N from $N, default 2), run
for 12 s after 5 warm-ups; prints the mean ms. Used with perf record -p PID for the
N = 2 profile and, one process per build, for the owners-sum before/after figures
(replica_step_loop.txt)."""
import sys, time, os
sys.argv = [sys.argv[0]]
sys.path.insert(0, "/work/main/bench")
import sharded_bench as sb
import tensorflow as tf, tfde
from workload import Workload
work = Workload()
ids = work.ids(seed=0)
n = int(os.environ.get("N", "2"))
per = work.batch // n
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
with strategy.scope():
  lookup = tfde.lookup.ShardedLookup(work.feature_configs())
def replica_slice(ctx):
  r = ctx.replica_id_in_sync_group
  return {f"f{t}": tf.constant(ids[t][r * per:(r + 1) * per]) for t in range(work.tables)}
inputs = strategy.experimental_distribute_values_from_function(replica_slice)
@tf.function
def step(inputs):
  def replica_step(inputs):
    with tf.GradientTape() as tape:
      out = lookup(inputs)
      loss = tf.add_n([tf.reduce_sum(o) for o in out.values()])
    tape.gradient(loss, lookup.trainable_variables)
  strategy.run(replica_step, args=(inputs,))
for _ in range(5): step(inputs)
print("go", flush=True)
t = time.time(); k = 0
while time.time() - t < 12: step(inputs); k += 1
print("ms", (time.time() - t) / k * 1e3, flush=True)
