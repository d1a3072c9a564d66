"""Op types in the bench's training step graph at 1 and 4 replicas
(MirroredStrategy over logical CPUs), after grappler is not applied:
the traced graph's non-constant ops, nested functions included."""
import collections, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
sys.path.insert(0, "bench")
import tfde
from workload import Workload, replica_train_step
work = Workload(vocab=1000, batch=64)
ids = work.ids(seed=0)

def count(graph_def):
  c = collections.Counter(n.op for n in graph_def.node)
  for f in graph_def.library.function:
    c.update(n.op for n in f.node_def)
  return c

res = {}
for n in (1, 4):
  strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
  with strategy.scope():
    lookup = tfde.lookup.ShardedLookup(work.feature_configs())
  per = work.batch // n
  def replica_slice(ctx, per=per):
    r = ctx.replica_id_in_sync_group
    return {f"f{t}": tf.constant(ids[t][r * per:(r + 1) * per]) for t in range(work.tables)}
  inputs = strategy.experimental_distribute_values_from_function(replica_slice)
  step = replica_train_step(strategy, lookup)
  g = step.get_concrete_function(inputs).graph.as_graph_def()
  res[n] = count(g)
skip = {"Const", "NoOp", "Identity"}
print("total non-const:", {n: sum(v for k, v in c.items() if k not in skip) for n, c in res.items()})
keys = sorted(set(res[1]) | set(res[4]), key=lambda k: -(res[4][k] - 4 * res[1][k]))
for k in keys:
  print(f"{k:40s} {res[1][k]:5d} {res[4][k]:5d}  extra over 4x1: {res[4][k] - 4 * res[1][k]}")
