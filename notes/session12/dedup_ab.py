"""The one-replica training step with the backward's dedup by
TfdeSortedUniqueInRange (rows in increasing order) against
TfdeUniqueWithCounts (first-appearance order), traced in one process and
timed alternately: medians of 12 rounds of 5 steps."""
import os, sys, time, statistics, dataclasses
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/bench")
import tensorflow as tf, tfde, tfde.ops
from tfde import group_step
from workload import lookup_steps, parse_args, timed
sys.argv = sys.argv[:1]
args, work = parse_args("", reps=7)
ids = work.ids(seed=0)
inputs = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
loss = lambda out: tf.add_n([tf.reduce_sum(v) for v in out.values()])
first_order = lambda ids, num_ids: tfde.ops.unique_with_counts(ids)[:2]
for name, opt in (("lazy Adam", None), ("SGD", tfde.optimizers.SGD(learning_rate=0.1)),
                  ("Adagrad", tfde.optimizers.Adagrad(learning_rate=0.01))):
  cfgs = work.feature_configs()
  if opt is not None:
    cfgs = {k: dataclasses.replace(v, table=dataclasses.replace(v.table, optimizer=opt))
            for k, v in cfgs.items()}
  lookup = tfde.lookup.ShardedLookup(cfgs)
  _, sorted_step = lookup_steps(lookup, inputs, loss); sorted_step()
  kernel = group_step.ops.sorted_unique_in_range
  group_step.ops.sorted_unique_in_range = first_order
  _, first_step = lookup_steps(lookup, inputs, loss); first_step()
  group_step.ops.sorted_unique_in_range = kernel
  r = {"sorted dedup": [], "first-appearance dedup": []}
  for _ in range(12):
    r["sorted dedup"].append(timed(sorted_step, 5, warmup=1))
    r["first-appearance dedup"].append(timed(first_step, 5, warmup=1))
  print(name + ": " + ", ".join(f"{k} {statistics.median(v):.2f} ms (min {min(v):.2f})"
                                for k, v in r.items()), flush=True)
  del lookup
