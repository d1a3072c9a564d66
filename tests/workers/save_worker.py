"""A worker that saves checkpoints in a loop until it is killed (launched by
tests/unit/test_crash_safe_saves.py).

  --mode local    one process, no strategy.
  --mode mwms     TF_CONFIG is set; MultiWorkerMirroredStrategy.

Before save k every table holds k everywhere (static rows and slots,
dynamic rows and slots, step k), so a checkpoint restores to one k
throughout exactly when it is complete. Prints "saved k" after each save.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

STATIC_ROWS = 100_000
WIDTH = 16
DYNAMIC_IDS = 20_000


def configs():
  import tfde  # pylint: disable=g-import-not-at-top
  static = tfde.TableConfig(name="static", vocabulary_size=STATIC_ROWS,
                            embedding_dim=WIDTH, optimizer="adam")
  dynamic = tfde.TableConfig(name="dynamic", vocabulary_size=None,
                             embedding_dim=WIDTH, optimizer="adagrad")
  return {"s": tfde.FeatureConfig(name="s", table=static),
          "d": tfde.FeatureConfig(name="d", table=dynamic)}


def fill(table, k):
  """Every row, slot and the step of `table` set to k."""
  k = float(k)
  if table.is_dynamic:
    ids = tf.range(DYNAMIC_IDS, dtype=tf.int64) * 7919 - 10**6
    slots = 1 + len(table.optimizer.slot_names)
    table.assign_rows(ids, tf.fill([DYNAMIC_IDS, slots, WIDTH], k), step=int(k))
    return
  state = table.state(keys=["step"])
  state.update({key: tf.fill([STATIC_ROWS, WIDTH], k)
                for key in table.state_keys() if key != "step"})
  state["step"] = tf.constant(int(k), tf.int64)
  table.load_state(state)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--mode", choices=["local", "mwms"], required=True)
  parser.add_argument("--dir", required=True)
  args = parser.parse_args()
  import tfde  # pylint: disable=g-import-not-at-top
  strategy = (tf.distribute.MultiWorkerMirroredStrategy() if args.mode == "mwms"
              else tf.distribute.get_strategy())
  rank = strategy.cluster_resolver.task_id if args.mode == "mwms" else 0
  with strategy.scope():
    lookup = tfde.lookup.ShardedLookup(configs(), auto_replicate_bytes=0)
  # The chief writes the real checkpoint, other workers theirs aside.
  directory = args.dir if rank == 0 else os.path.join(args.dir, f"worker_{rank}_temp")
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(lookup=lookup),
                                       directory, max_to_keep=3)
  k = 0
  while True:
    k += 1
    for table in lookup.tables.values():
      fill(table, k)
    manager.save()
    print(f"saved {k}", flush=True)


if __name__ == "__main__":
  main()
