"""The one-replica forward against its combines alone (per feature, from
their tables), alternating; ms."""
import statistics, sys, time
sys.path.insert(0, "bench")
import tensorflow as tf
import tfde
from workload import Workload, lookup_steps

work = Workload()
lookup = tfde.lookup.ShardedLookup(work.feature_configs())
ids = work.ids(seed=0)
inputs = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
flat = lookup.flatten(inputs)
shards = [lookup.tables[f"t{t}"].shard(0) for t in range(work.tables)]
flat_ids = [tf.constant(f.ids) for f in flat]
splits = [tf.constant(f.row_splits) for f in flat]

@tf.function
def combines(flat_ids, splits):
  return [tfde.ops.combine_from_tables([s], i, [0], tfde.ops.int32_range(tf.size(i, out_type=tf.int64)), sp, None, "sum")
          for s, i, sp in zip(shards, flat_ids, splits)]

@tf.function
def checks_and_combines(inputs):
  out = []
  for s, (k, v) in zip(shards, inputs.items()):
    i = tfde.ops.check_id_range(tf.reshape(v, [-1]), work.vocab, k)
    sp = tf.range(0, tf.size(i, out_type=tf.int64) + 1, 20)
    out.append(tfde.ops.combine_from_tables([s], i, [0], tfde.ops.int32_range(tf.size(i, out_type=tf.int64)), sp, None, "sum"))
  return out

forward, _ = lookup_steps(lookup, inputs, None)
stages = {"combines alone": lambda: combines(flat_ids, splits),
          "checks + combines": lambda: checks_and_combines(inputs),
          "forward whole": forward}
for f in stages.values():
  for _ in range(3): f()
rounds = {k: [] for k in stages}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 40):
  for k, f in stages.items():
    t = time.perf_counter(); r = f(); tf.nest.map_structure(lambda x: x.numpy(), r)
    rounds[k].append((time.perf_counter() - t) * 1e3)
for k, v in rounds.items():
  print(f"{k:20s} median {statistics.median(v):6.2f}  min {min(v):6.2f}")
