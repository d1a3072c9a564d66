"""Sharded benchmark: the op benchmark's workload trained with N = 1, 2, 4
replicas (MirroredStrategy over logical CPU devices of this machine).

Data (printed): 4 tables of 1,000,000 x 64 float32 with lazy Adam, global
batch 4096 split over the replicas, 20 ids per sample per table, Zipf(1.05),
sum combiner.

Reports per N: training step time (median), bytes exchanged per step as
counted by the communicator (ids out, rows back, gradients out, sent to
another replica), the bytes the same step would exchange without dedup
(every id occurrence routed on its own), and the balance of the shards:
rows held and rows served per shard per step. Writes
bench/results/sharded_bench.png (step time and bytes per N, rows served
per shard). `--quick` shrinks the tables and batch.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

MAX_REPLICAS = 4
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * MAX_REPLICAS)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tfde  # noqa: E402
from workload import parse_args, timed  # noqa: E402  (bench/ is the script's dir)

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def run(num_replicas, work, ids, reps):
  tables, dim, batch = work.tables, work.dim, work.batch
  per = batch // num_replicas
  strategy = tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(num_replicas)])
  with strategy.scope():
    lookup = tfde.lookup.ShardedLookup(work.feature_configs())

  def replica_slice(ctx):
    r = ctx.replica_id_in_sync_group
    return {f"f{t}": tf.constant(ids[t][r * per:(r + 1) * per]) for t in range(tables)}

  inputs = strategy.experimental_distribute_values_from_function(replica_slice)

  @tf.function
  def step(inputs):
    def replica_step(inputs):
      with tf.GradientTape() as tape:
        out = lookup(inputs)
        loss = tf.add_n([tf.reduce_sum(o) for o in out.values()])
      tape.gradient(loss, lookup.trainable_variables)
    strategy.run(replica_step, args=(inputs,))

  step(inputs)
  lookup.comm.reset_bytes_sent()
  step(inputs)
  bytes_per_step = lookup.comm.bytes_sent()
  ms = timed(lambda: step(inputs), reps, warmup=0)

  # Without dedup: every id occurrence on a replica whose owner is another
  # replica travels on its own (id out, row back, gradient out).
  no_dedup = 0
  served = np.zeros(num_replicas)
  for t in range(tables):
    for r in range(num_replicas):
      local = ids[t][r * per:(r + 1) * per].ravel()
      owner = local % num_replicas
      no_dedup += int(np.sum(owner != r)) * (8 + 2 * dim * 4)
      served += np.bincount(np.unique(local) % num_replicas, minlength=num_replicas)
  rows_held = [int(s.shape[0]) for s in lookup.tables["t0"].local_variables()]
  return dict(n=num_replicas, ms=ms,
              bytes=bytes_per_step, no_dedup=no_dedup, served=served.tolist(),
              rows_held=rows_held)


def plot(results, path):
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    print("matplotlib missing: no plot")
    return
  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  ns = [r["n"] for r in results]
  axes[0].plot(ns, [r["ms"] for r in results], "o-")
  axes[0].set(title="training step (lazy Adam)", xlabel="replicas", ylabel="ms",
              xticks=ns)
  axes[1].plot(ns, [r["bytes"] / 1e6 for r in results], "o-", label="tfde (dedup)")
  axes[1].plot(ns, [r["no_dedup"] / 1e6 for r in results], "s--", label="no dedup")
  axes[1].set(title="bytes exchanged per step", xlabel="replicas", ylabel="MB",
              xticks=ns)
  axes[1].legend()
  last = results[-1]
  axes[2].bar(range(last["n"]), last["served"])
  axes[2].set(title=f"rows served per shard per step (N={last['n']})",
              xlabel="shard", ylabel="rows", xticks=range(last["n"]))
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=100)
  print(f"wrote {path}")


def main():
  args, work = parse_args(__doc__, reps=5)
  ids = work.ids(seed=0)
  print(f"data: {work.describe()} (global batch, split over the replicas); "
        f"TF {tf.__version__}, {os.cpu_count()} cores, replicas are logical "
        f"CPU devices of one process; median of {args.reps}")
  results = []
  for n in (1, 2, 4):
    r = run(n, work, ids, args.reps)
    results.append(r)
    balance = max(r["served"]) / (sum(r["served"]) / n)
    print(f"N={n}: step {r['ms']:7.1f} ms | exchanged {r['bytes'] / 1e6:6.2f} MB/step "
          f"(no dedup {r['no_dedup'] / 1e6:6.2f} MB, "
          f"{r['no_dedup'] / max(r['bytes'], 1):5.1f}x more) | rows held per shard "
          f"{r['rows_held']} | rows served per shard {[int(x) for x in r['served']]} "
          f"(max/mean {balance:.2f})")
  plot(results, os.path.join(RESULTS, "sharded_bench.png"))


if __name__ == "__main__":
  main()
