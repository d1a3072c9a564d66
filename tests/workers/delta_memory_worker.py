"""Resident memory of a dynamic table over admit/evict cycles with delta
exports (and delta checkpoints) after each (tests/unit/test_delta_memory.py).

Usage: delta_memory_worker.py DIRECTORY MODE ROWS CYCLES WARMUP
  MODE: "exports" (a delta export after each cycle) or "both" (and a delta
  checkpoint, a full one every 3).

Each cycle trains one step on ROWS new ids: the table admits them and
evicts the previous ROWS. Prints one JSON line: resident bytes and the
table's memory_bytes() after the warm-up and at the end, its rows, and the
evicted ids on record at the end.
"""

import json
import os
import shutil
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import tfde  # pylint: disable=g-import-not-at-top


def resident_bytes():
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(directory, mode, rows, cycles, warmup):
  rows, cycles, warmup = int(rows), int(cycles), int(warmup)
  config = tfde.layers.TableConfig(
      name="users", vocabulary_size=None, embedding_dim=8, optimizer="adagrad",
      dynamic=tfde.DynamicConfig(max_rows_per_shard=rows))
  layer = tfde.layers.DistributedEmbedding(
      {"f": tfde.layers.FeatureConfig(name="f", table=config)})
  table = layer.tables["users"]

  @tf.function
  def train(ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(layer({"f": ids})["f"])
    tape.gradient(loss, layer.trainable_variables)

  def cycle(k):
    train(tf.constant(np.arange(k * rows, (k + 1) * rows).reshape(-1, 1), tf.int64))

  cycle(0)
  manager = (tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(layer=layer), os.path.join(directory, "ckpt"), full_every_n=3)
      if mode == "both" else None)
  previous = os.path.join(directory, "export")
  tfde.export_for_serving(layer, previous, {"f": tf.constant([[1]], tf.int64)})
  after_warmup = table_after_warmup = None
  for k in range(1, warmup + cycles + 1):
    cycle(k)
    if manager is not None:
      manager.save()
    delta = os.path.join(directory, f"delta{k}")
    tfde.serving.export_delta(layer, delta, base=previous)
    if k > 2:   # the chain needs only the last delta
      shutil.rmtree(os.path.join(directory, f"delta{k - 2}"))
    previous = delta
    if k == warmup:
      after_warmup, table_after_warmup = resident_bytes(), table.memory_bytes()
  print("RESULT" + json.dumps({
      "after_warmup": after_warmup, "end": resident_bytes(), "rows": table.size(),
      "memory_bytes": table.memory_bytes(), "memory_bytes_after_warmup": table_after_warmup,
      "on_record": sum(int(r.size().numpy()) for r in table.evicted_at.values())}))


if __name__ == "__main__":
  main(*sys.argv[1:6])
