"""One worker of a multi-process dynamic-table run (launched by
tests/test_multiprocess.py): the harness of tests/dynamic_harness.py under
MultiWorkerMirroredStrategy (--mode mwms, TF_CONFIG set) or Horovod (--mode
horovod, under horovodrun). Writes this worker's outputs of every step and
the whole table (gathered from every worker) to OUT/dynamic_{rank}.npz."""

import argparse
import os
import pickle
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--mode", choices=["mwms", "horovod"], required=True)
  parser.add_argument("--optimizer", default="adam")
  parser.add_argument("--batches", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--checkpoint", help="write a checkpoint here at the end")
  parser.add_argument("--checkpoint-dir", help="save after every step here")
  parser.add_argument("--die-at-step", type=int, default=-1,
                      help="exit abruptly before this (0-based) step")
  parser.add_argument("--resume", action="store_true",
                      help="restore the latest checkpoint and go on from it")
  args = parser.parse_args()

  if args.mode == "mwms":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = strategy.cluster_resolver.task_id
    num_replicas = strategy.num_replicas_in_sync
  else:
    import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
    hvd.init()
    strategy = tf.distribute.get_strategy()
    rank, num_replicas = hvd.rank(), hvd.size()

  import tfde  # pylint: disable=g-import-not-at-top
  from tests import dynamic_harness as d  # pylint: disable=g-import-not-at-top

  configs = d.feature_configs(d.table_config(args.optimizer, admit_after=2,
                                             evict_after_steps=4))
  with strategy.scope():
    lookup = tfde.lookup.ShardedLookup(configs)
  assert lookup.comm.num_replicas == num_replicas

  def replica_step(inputs, weights, targets):
    with tf.GradientTape() as tape:
      outputs = lookup(inputs, weights)
      loss = tf.add_n([tf.reduce_sum(tf.square(outputs[f] - targets[f]))
                       for f in outputs]) / d.GLOBAL_BATCH
    tape.gradient(loss, lookup.trainable_variables)
    return outputs

  @tf.function(reduce_retracing=True)
  def step(inputs, weights, targets):
    return strategy.run(replica_step, args=(inputs, weights, targets))

  with open(args.batches, "rb") as f:
    batches = pickle.load(f)
  result = {}
  manager, start = None, 0
  if args.checkpoint_dir:
    # As multiprocess_worker: the chief's checkpoint is the real one.
    directory = args.checkpoint_dir if rank == 0 else os.path.join(
        args.checkpoint_dir, f"worker_{rank}_temp")
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(lookup=lookup),
                                         directory, max_to_keep=2)
    if args.resume:
      latest = tf.train.latest_checkpoint(args.checkpoint_dir)
      tf.train.Checkpoint(lookup=lookup).restore(latest).assert_consumed()
      start = int(lookup.tables["users"].steps[rank].numpy())
      print(f"worker {rank} resumed from {latest} at step {start}", flush=True)
  for index, batch in enumerate(batches):
    if index < start:
      continue
    if index == args.die_at_step:
      print(f"worker {rank} dies before step {index}", flush=True)
      os._exit(3)
    if args.mode == "mwms":
      local = [d.replica_inputs(batch, r, num_replicas) for r in range(num_replicas)]
      dist = [strategy.experimental_distribute_values_from_function(
          lambda ctx, i=i: local[ctx.replica_id_in_sync_group][i]) for i in range(3)]
      outputs = strategy.experimental_local_results(step(*dist))[0]
    else:
      outputs = step(*d.replica_inputs(batch, rank, num_replicas))
    for f in ("clicks", "pair"):
      result[f"output/{index}/{f}"] = outputs[f].numpy()
    if manager is not None:
      manager.save()
  if args.checkpoint:
    # Every worker saves (a collective); the chief's copy is the real one.
    path = args.checkpoint if rank == 0 else f"{args.checkpoint}_worker_{rank}"
    tf.train.Checkpoint(lookup=lookup).write(path)
  # Every worker takes part in gathering the whole table.
  for key, value in lookup.tables["users"].export_rows().items():
    result[f"table/{key}"] = value
  result["backend"] = np.array(tfde.ops.current_backend())
  result["tf_version"] = np.array(tf.__version__)
  np.savez(os.path.join(args.out, f"dynamic_{rank}.npz"), **result)
  print(f"worker {rank}/{num_replicas} done", flush=True)
  sys.stdout.flush()
  os._exit(0)  # see multiprocess_worker.py


if __name__ == "__main__":
  main()
