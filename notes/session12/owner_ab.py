"""MirroredStrategy over N logical CPUs, the bench's workload and lazy Adam:
the owners' dedup of the rows asked for in row order (StaticGroup's
TfdeSortedUniqueInRange) against first-appearance order (the base
TableGroup's TfdeUniqueWithCounts), traced in one process, timed alternately."""
import os, sys, time, statistics
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, "/work/main/bench"); n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
sys.argv = sys.argv[:1]
import sharded_bench  # noqa: F401  (4 logical CPUs)
import tensorflow as tf, tfde
from tfde import groups
from workload import parse_args, timed
args, work = parse_args("", reps=5)
ids = work.ids(seed=0)
per = work.batch // n
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
with strategy.scope():
  lookup = tfde.lookup.ShardedLookup(work.feature_configs())
def replica_slice(ctx):
  r = ctx.replica_id_in_sync_group
  return {f"f{t}": tf.constant(ids[t][r * per:(r + 1) * per]) for t in range(work.tables)}
inputs = strategy.experimental_distribute_values_from_function(replica_slice)
def make_step():
  @tf.function
  def step(inputs):
    def replica_step(inputs):
      with tf.GradientTape() as tape:
        out = lookup(inputs)
        loss = tf.add_n([tf.reduce_sum(o) for o in out.values()])
      tape.gradient(loss, lookup.trainable_variables)
    strategy.run(replica_step, args=(inputs,))
  step(inputs)
  return lambda: step(inputs)
sorted_step = make_step()
kept = groups.StaticGroup.unique_requests
groups.StaticGroup.unique_requests = groups.TableGroup.unique_requests
first_step = make_step()
groups.StaticGroup.unique_requests = kept
r = {"sorted": [], "first-appearance": []}
for _ in range(8):
  r["sorted"].append(timed(sorted_step, 3, warmup=1))
  r["first-appearance"].append(timed(first_step, 3, warmup=1))
print(f"N={n}: " + ", ".join(f"{k} {statistics.median(v):.1f} ms (min {min(v):.1f})" for k, v in r.items()), flush=True)
