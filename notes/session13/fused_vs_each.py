"""One combine op over the group's 4 tables (fused ids) against one op per
feature from its own table, alternating in one process; ms."""
import statistics, sys, time
sys.path.insert(0, "bench")
import tensorflow as tf
import tfde
from workload import Workload

work = Workload()
lookup = tfde.lookup.ShardedLookup(work.feature_configs())
ids = work.ids(seed=0)
inputs = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
group = lookup._groups[0]
flat = lookup.flatten(inputs)
fused = group.fused_ids(flat)
splits, weights, combiner = tfde.group_step.as_one_batch(flat, ["sum"] * len(flat))
flat_ids = [tf.constant(f.ids) for f in flat]
fsplits = [tf.constant(f.row_splits) for f in flat]

@tf.function
def fused_op(fused, splits):
  return group.combine_local(0, fused, tfde.ops.int32_range(tf.size(fused, out_type=tf.int64)),
                             (splits, None, "sum"))

@tf.function
def each_op(flat_ids, fsplits):
  fs = [tfde.inputs.FlatFeature(f.name, f.table, i, s, None, None, None)
        for f, i, s in zip(flat, flat_ids, fsplits)]
  return group.combine_each_local(0, fs, ["sum"] * len(fs))

@tf.function
def each_op_chained(flat_ids, fsplits):
  out, prev = [], []
  for f, i, s in zip(flat, flat_ids, fsplits):
    with tf.control_dependencies(prev):
      o = group.combine_each_local(0, [tfde.inputs.FlatFeature(f.name, f.table, i, s, None, None, None)], ["sum"])[0]
    out.append(o); prev = [o]
  return out

stages = {"fused (1 op)": lambda: fused_op(fused, splits),
          "each (4 ops)": lambda: each_op(flat_ids, fsplits),
          "each, in sequence": lambda: each_op_chained(flat_ids, fsplits)}
for f in stages.values():
  for _ in range(3): f()
rounds = {k: [] for k in stages}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 40):
  for k, f in stages.items():
    t = time.perf_counter(); r = f(); tf.nest.map_structure(lambda x: x.numpy(), r)
    rounds[k].append((time.perf_counter() - t) * 1e3)
for k, v in rounds.items():
  print(f"{k:20s} median {statistics.median(v):6.2f}  min {min(v):6.2f}")
