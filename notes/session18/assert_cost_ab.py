"""What the checks' message ops cost the 4-replica lazy-Adam step: the same
step traced with the messages formatted every step (as shipped) and with
a constant message, alternating in one process (ms per step)."""
import os, statistics, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
sys.path.insert(0, "bench")
import tfde
from tfde.ops import checks
from workload import Workload, replica_train_step

work = Workload(); ids = work.ids(seed=0)
R = int(sys.argv[2]) if len(sys.argv) > 2 else 4
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(R)])
per = work.batch // R
inputs = strategy.experimental_distribute_values_from_function(
    lambda ctx: {f"f{t}": tf.constant(ids[t][ctx.replica_id_in_sync_group * per:
                                              (ctx.replica_id_in_sync_group + 1) * per])
                 for t in range(work.tables)})
steps = {}
real = checks.message
for name in ("formatted", "constant"):
  checks.message = real if name == "formatted" else (lambda parts: tf.constant("check failed"))
  with strategy.scope():
    lookup = tfde.lookup.ShardedLookup(work.feature_configs())
  step = replica_train_step(strategy, lookup)
  step.get_concrete_function(inputs)
  steps[name] = (lambda step=step: step(inputs))
  for _ in range(3): steps[name]()
checks.message = real
times = {k: [] for k in steps}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
  for k, s in steps.items():
    t = time.perf_counter(); s(); times[k].append((time.perf_counter() - t) * 1e3)
for k, v in times.items():
  print(f"{R} replicas, {k:10s}: median {statistics.median(v):6.2f}  min {min(v):6.2f}")
