"""argv[2] (default 2) replicas (MirroredStrategy over logical CPUs) of the bench's lazy-Adam
step in a loop, for perf: prints "go" then runs argv[1] seconds."""
import os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
sys.path.insert(0, "bench")
import tfde
from workload import Workload, replica_train_step
work = Workload(); ids = work.ids(seed=0)
R = int(sys.argv[2]) if len(sys.argv) > 2 else 2
strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(R)])
with strategy.scope():
  lookup = tfde.lookup.ShardedLookup(work.feature_configs())
per = work.batch // R
inputs = strategy.experimental_distribute_values_from_function(
    lambda ctx: {f"f{t}": tf.constant(ids[t][ctx.replica_id_in_sync_group * per:
                                              (ctx.replica_id_in_sync_group + 1) * per])
                 for t in range(work.tables)})
step = replica_train_step(strategy, lookup)
for _ in range(5): step(inputs)
print("go", flush=True)
end = time.time() + float(sys.argv[1]); n = 0; t0 = time.perf_counter()
while time.time() < end:
  step(inputs); n += 1
print(f"{n} steps, {(time.perf_counter() - t0) / n * 1e3:.2f} ms/step")
