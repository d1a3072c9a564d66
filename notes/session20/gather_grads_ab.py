"""The pooled exchange's backward at 2 and 4 replicas (MirroredStrategy
over logical CPUs): the output gradient tiled N times and sent with
all_to_all (before) against the communicator's all_gather, which in one
process concatenates every replica's gradient on each device (after).
Both traced in one process from the new code, the "before" step with the
old function patched in while it traces; rounds alternate. argv[1]: rounds."""
import os, resource, statistics, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
sys.path.insert(0, "/work/main/bench")
import tfde
from tfde import routing
from workload import Workload, replica_train_step

def tiled_to_owners(comm, output_grad, routed_bags):
  tiled = tf.tile(output_grad, [comm.num_replicas, 1])
  return comm.all_to_all(tiled, routed_bags.partials.reversed())

new_to_owners = routing.output_gradients_to_owners
work = Workload()
ids = work.ids(seed=0)
steps = {}
for n in (2, 4):
  for name, fn in (("before", tiled_to_owners), ("after", new_to_owners)):
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    with strategy.scope():
      lookup = tfde.lookup.ShardedLookup(work.feature_configs())
    per = work.batch // n
    def replica_slice(ctx, per=per):
      r = ctx.replica_id_in_sync_group
      return {f"f{t}": tf.constant(ids[t][r * per:(r + 1) * per]) for t in range(work.tables)}
    inputs = strategy.experimental_distribute_values_from_function(replica_slice)
    step = replica_train_step(strategy, lookup)
    routing.output_gradients_to_owners = fn
    for _ in range(3): step(inputs)
    routing.output_gradients_to_owners = new_to_owners
    steps[(n, name)] = (lambda step=step, inputs=inputs: step(inputs))
cpu = lambda: (lambda r: (r.ru_utime + r.ru_stime) * 1e3)(resource.getrusage(resource.RUSAGE_SELF))
rounds = {k: [] for k in steps}; cpus = {k: 0.0 for k in steps}
n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
for _ in range(n):
  for k, s in steps.items():
    c = cpu(); t = time.perf_counter(); s()
    rounds[k].append((time.perf_counter() - t) * 1e3); cpus[k] += cpu() - c
for k, v in rounds.items():
  print(f"{k[0]} replicas {k[1]:6s}: median {statistics.median(v):6.2f}  min {min(v):6.2f}  cpu/step {cpus[k] / n:6.2f}")
