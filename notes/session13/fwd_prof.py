"""Where the one-replica forward's time goes: stages timed alone, interleaved."""
import statistics, sys, time
sys.path.insert(0, "bench")
import numpy as np
import tensorflow as tf
import tfde
from workload import Workload, lookup_steps

work = Workload()
lookup = tfde.lookup.ShardedLookup(work.feature_configs())
ids = work.ids(seed=0)
inputs = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
group = lookup._groups[0]
flat = lookup.flatten(inputs)
fused = group.fused_ids(flat)
splits, weights, combiner = tfde.group_step.as_one_batch(flat, ["sum"] * len(flat))
inv = tf.range(tf.size(fused, out_type=tf.int32))
tables, bases = group._local_tables(0)
shards = [t.shard(0) for t in tables]

@tf.function
def flatten_fuse(inputs):
  flat = lookup.flatten(inputs)
  return group.fused_ids(flat), tfde.group_step.as_one_batch(flat, ["sum"] * len(flat))[0]

@tf.function
def combine(fused, inv, splits):
  return tfde.ops.combine_from_tables(shards, fused, bases, inv, splits, None, "sum")

@tf.function
def gather_sum(fused):
  return tf.reduce_sum(tf.reshape(tfde.ops.gather_from_tables(shards, fused, bases), [-1, 20, 64]), 1)

forward, _ = lookup_steps(lookup, inputs, None)
stages = {"flatten+fuse+splits": lambda: flatten_fuse(inputs),
          "combine_from_tables op": lambda: combine(fused, inv, splits),
          "gather_from_tables + reduce": lambda: gather_sum(fused),
          "forward whole": forward}
for f in stages.values():
  for _ in range(3): f()
rounds = {k: [] for k in stages}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 30):
  for k, f in stages.items():
    t = time.perf_counter(); r = f(); tf.nest.map_structure(lambda x: x.numpy(), r)
    rounds[k].append((time.perf_counter() - t) * 1e3)
for k, v in rounds.items():
  print(f"{k:32s} median {statistics.median(v):6.2f}  min {min(v):6.2f}")
