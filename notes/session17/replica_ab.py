"""One, two and four replicas (MirroredStrategy over logical CPUs) of the bench's
lazy-Adam training step, alternating in one process: median wall ms per step
and CPU ms per step. argv[1]: rounds."""
import os, resource, statistics, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
sys.path.insert(0, "bench")
import tfde
from workload import Workload, replica_train_step

work = Workload()
ids = work.ids(seed=0)
steps = {}
for n in (1, 2, 4):
  strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
  with strategy.scope():
    lookup = tfde.lookup.ShardedLookup(work.feature_configs())
  per = work.batch // n
  def replica_slice(ctx, per=per):
    r = ctx.replica_id_in_sync_group
    return {f"f{t}": tf.constant(ids[t][r * per:(r + 1) * per]) for t in range(work.tables)}
  inputs = strategy.experimental_distribute_values_from_function(replica_slice)
  step = replica_train_step(strategy, lookup)
  steps[n] = (lambda step=step, inputs=inputs: step(inputs))
for s in steps.values():
  for _ in range(3): s()
cpu = lambda: (lambda r: (r.ru_utime + r.ru_stime) * 1e3)(resource.getrusage(resource.RUSAGE_SELF))
rounds = {k: [] for k in steps}; cpus = {k: 0.0 for k in steps}
n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
for _ in range(n):
  for k, s in steps.items():
    c = cpu(); t = time.perf_counter(); s()
    rounds[k].append((time.perf_counter() - t) * 1e3); cpus[k] += cpu() - c
for k, v in rounds.items():
  print(f"{k} replica(s): median {statistics.median(v):6.2f}  min {min(v):6.2f}  cpu/step {cpus[k] / n:6.2f}")
for k in (2, 4):
  print(f"{k} replicas: ratio of medians {statistics.median(rounds[k]) / statistics.median(rounds[1]):.2f}")
