"""The one-replica forward's input stage, piece by piece (min and median ms)."""
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

@tf.function
def flatten(inputs):
  return [f.ids for f in lookup.flatten(inputs)]

@tf.function
def check_only(inputs):
  return [tfde.ops.check_id_range(tf.reshape(v, [-1]), work.vocab, "x") for v in inputs.values()]

@tf.function
def reshape_only(inputs):
  return [tf.reshape(v, [-1]) for v in inputs.values()]

@tf.function
def fuse(inputs):
  return group.fused_ids(lookup.flatten(inputs))

@tf.function
def splits_(inputs):
  return tfde.group_step.as_one_batch(lookup.flatten(inputs), ["sum"] * 4)[0]

@tf.function
def rng(inputs):
  f = group.fused_ids(lookup.flatten(inputs))
  return tfde.ops.int32_range(tf.size(f, out_type=tf.int64))

stages = dict(reshape=reshape_only, check=check_only, flatten=flatten, fuse=fuse, splits=splits_, fuse_range=rng)
for f in stages.values():
  for _ in range(3): f(inputs)
rounds = {k: [] for k in stages}
for _ in range(40):
  for k, f in stages.items():
    t = time.perf_counter(); r = f(inputs); tf.nest.map_structure(lambda x: x.numpy(), r)
    rounds[k].append((time.perf_counter() - t) * 1e3)
for k, v in rounds.items():
  print(f"{k:12s} median {statistics.median(v):6.3f}  min {min(v):6.3f}")
