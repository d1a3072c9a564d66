"""MirroredStrategy over N logical CPUs, the bench's workload and lazy Adam:
the owners' dedup in row order (TfdeSortedUniqueInRange over the owner's
local rows) against first-appearance order (TfdeUniqueWithCounts), now that
the owners sum their gradients with ops.sum_rows_by_index; traced in one
process, timed alternately (session 12's notes/session12/owner_ab.py, where
a dense unsorted_segment_sum made row order slower)."""
import os, sys, statistics
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, "/work/main/bench"); n = int(sys.argv[1]) if len(sys.argv) > 1 else 2
sys.argv = sys.argv[:1]
import sharded_bench  # noqa: F401  (4 logical CPUs)
import tensorflow as tf, tfde
from tfde import routing, ops
from workload import parse_args, timed
args, work = parse_args("", reps=5)
ids = work.ids(seed=0)
per = work.batch // n
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
with strategy.scope():
  lookup = tfde.lookup.ShardedLookup(work.feature_configs())
local_rows = work.tables * work.vocab // n
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
first_step = make_step()
kept = ops.unique_with_counts
def in_row_order(x):
  if x.dtype == tf.int64 and x.shape.rank == 1:
    u, inv = ops.sorted_unique_in_range(x, local_rows)
    return u, inv, None
  return kept(x)
import types
routing.ops = types.SimpleNamespace(**{k: getattr(ops, k) for k in dir(ops) if not k.startswith("__")})
routing.ops.unique_with_counts = in_row_order
sorted_step = make_step()
routing.ops = ops
r = {"row order": [], "first-appearance": []}
for _ in range(8):
  r["row order"].append(timed(sorted_step, 3, warmup=1))
  r["first-appearance"].append(timed(first_step, 3, warmup=1))
print(f"N={n}: " + ", ".join(f"{k} {statistics.median(v):.1f} ms (min {min(v):.1f})" for k, v in r.items()), flush=True)
