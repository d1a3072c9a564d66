"""What every multi-process test worker does alike (tests/*_worker.py):
start under MultiWorkerMirroredStrategy or Horovod, run a per-replica step
on its slice of a global batch, checkpoint after every step and resume, die
on purpose, and hand its results back. Imports nothing of tfde, so it runs
against whichever tfde the worker's environment has installed."""

import argparse
import os
import pickle
import sys

import numpy as np
import tensorflow as tf


def parser(description):
  """The arguments every training worker takes."""
  p = argparse.ArgumentParser(description=description)
  p.add_argument("--mode", choices=["mwms", "horovod"], required=True)
  p.add_argument("--optimizer", default="adam")
  p.add_argument("--batches", required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--checkpoint-dir", help="save after every step here")
  p.add_argument("--die-at-step", type=int, default=-1,
                 help="exit abruptly before this (0-based) step")
  p.add_argument("--resume", action="store_true",
                 help="restore the latest checkpoint and go on from it")
  p.add_argument("--checkpoint", help="write a checkpoint here at the end")
  p.add_argument("--delta-dir", help="a DeltaCheckpointManager saves here after "
                 "every step")
  p.add_argument("--delta-full-every", type=int, default=5,
                 help="the delta manager's full_every_n")
  p.add_argument("--bad-checkpoint", help="before training, restore this checkpoint "
                 "(one of its tables has another shape): it must fail and change "
                 "no table")
  p.add_argument("--exchange", default="auto", choices=["auto", "rows"],
                 help="the lookup's exchange of row-wise tables")
  p.add_argument("--uneven", action="store_true",
                 help="replicas take slices of 1 : 2 : ... of the global batch "
                 "(sharded_harness.replica_bounds), not equal ones")
  p.add_argument("--layouts", choices=["table_wise", "column_wise", "table_row_wise",
                                      "mixed"],
                 help="lay the tables out by this plan of the harness's "
                 "(sharded_harness.layouts) instead of row-wise")
  p.add_argument("--beside-row-wise", action="store_true",
                 help="also train a second, row-wise lookup of the same tables "
                 "in its own tf.function, step for step (its collectives "
                 "interleave with the first's)")
  p.add_argument("--out-of-step-at", type=int, default=-1,
                 help="before this (0-based) step, worker 1 counts one step "
                      "more, as a worker that went on after a failed step")
  return p


def data_and_out_args():
  """The arguments of a worker that reads its data from one file the
  parent wrote and writes its results to one folder."""
  p = argparse.ArgumentParser()
  p.add_argument("--data", required=True)
  p.add_argument("--out", required=True)
  return p.parse_args()


def start(mode):
  """(strategy, rank, number of replicas) of this process."""
  if mode == "mwms":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    return strategy, strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync
  import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
  hvd.init()
  return tf.distribute.get_strategy(), hvd.rank(), hvd.size()


def load_batches(path):
  with open(path, "rb") as f:
    return pickle.load(f)


def distributed_step(strategy, replica_step):
  """A tf.function running `replica_step(*inputs)` on every replica."""
  @tf.function(reduce_retracing=True)
  def step(*inputs):
    return strategy.run(replica_step, args=inputs)
  return step


def harness_training_step(strategy, lookup):
  """The sharded harness's training step of `lookup` (its loss, the
  tables' own optimizers applied in the backward) as a distributed step;
  returns the replicas' losses."""
  from tests.support import sharded_harness as h  # pylint: disable=g-import-not-at-top

  def replica_step(inputs, weights, targets):
    with tf.GradientTape() as tape:
      loss = h.replica_loss(lookup(inputs, weights), targets)
    tape.gradient(loss, lookup.trainable_variables)
    return loss

  return distributed_step(strategy, replica_step)


def run_step(step, strategy, mode, inputs_of, rank, num_replicas):
  """This process's outputs of one step; `inputs_of(replica)` is a
  replica's tuple of inputs."""
  if mode == "horovod":
    return step(*inputs_of(rank))
  local = [inputs_of(r) for r in range(num_replicas)]
  count = len(local[0])
  dist = [strategy.experimental_distribute_values_from_function(
      lambda ctx, i=i: local[ctx.replica_id_in_sync_group][i]) for i in range(count)]
  return strategy.experimental_local_results(step(*dist))[0]


def checkpointing(args, lookup, rank, step_of):
  """(CheckpointManager or None, the step to start from). The chief
  writes the real checkpoint, other workers theirs aside
  (MultiWorkerMirroredStrategy's convention); all must save."""
  if not args.checkpoint_dir:
    return None, 0
  directory = args.checkpoint_dir if rank == 0 else os.path.join(
      args.checkpoint_dir, f"worker_{rank}_temp")
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(lookup=lookup), directory,
                                       max_to_keep=2)
  if not args.resume:
    return manager, 0
  latest = tf.train.latest_checkpoint(args.checkpoint_dir)
  tf.train.Checkpoint(lookup=lookup).restore(latest).assert_consumed()
  start_step = step_of(lookup)
  print(f"worker {rank} resumed from {latest} at step {start_step}", flush=True)
  return manager, start_step


def delta_checkpointing(args, lookup, rank):
  """A DeltaCheckpointManager saving the model's chains, or None. The chief
  writes the real directory, other workers theirs aside (each process
  saves: the changes are gathered by a collective)."""
  if not args.delta_dir:
    return None
  import tfde  # pylint: disable=g-import-not-at-top
  directory = args.delta_dir if rank == 0 else f"{args.delta_dir}_worker_{rank}"
  return tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(lookup=lookup), directory,
      full_every_n=args.delta_full_every, max_to_keep=1)


def refused_restore(args, lookup):
  """With --bad-checkpoint: restores it (under the worker's strategy) and
  returns {"bad_restore_error": the error, "bad_restore_changed": whether
  any table's state changed}; else {}."""
  if not args.bad_checkpoint:
    return {}
  before = {n: {k: v.numpy() for k, v in t.state().items()}
            for n, t in lookup.tables.items()}
  error = ""
  try:
    tf.train.Checkpoint(lookup=lookup).read(args.bad_checkpoint)
  except (ValueError, tf.errors.OpError) as e:
    error = f"{type(e).__name__}: {e}"
  changed = any(not np.array_equal(v.numpy(), before[n][k])
                for n, t in lookup.tables.items() for k, v in t.state().items())
  return {"bad_restore_error": np.array(error), "bad_restore_changed": np.array(changed)}


def write_checkpoint(args, lookup, rank):
  """The end state as one tf.train checkpoint at args.checkpoint (every
  worker writes, a collective; the chief's copy is the real one)."""
  if args.checkpoint:
    path = args.checkpoint if rank == 0 else f"{args.checkpoint}_worker_{rank}"
    tf.train.Checkpoint(lookup=lookup).write(path)


def die_if_asked(args, index, rank):
  if index == args.die_at_step:
    print(f"worker {rank} dies before step {index}", flush=True)
    os._exit(3)


def finish(out_dir, prefix, rank, result, message=""):
  """Writes OUT/{prefix}_{rank}.npz and exits at once: the collective
  executor of MultiWorkerMirroredStrategy may block interpreter shutdown
  while its peer is already gone; the results are written."""
  np.savez(os.path.join(out_dir, f"{prefix}_{rank}.npz"), **result)
  print(f"{prefix} worker {rank} done {message}", flush=True)
  sys.stdout.flush()
  os._exit(0)
