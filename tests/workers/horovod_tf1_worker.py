"""One rank of a 2-rank `horovodrun` job training sharding plans in a TF1
graph (`tf.compat.v1.Session`), where a rank holds none of an exchange
group's rows (launched by tests/distributed/test_horovod_plans.py).

  "table_wise": A (1 wide) whole on rank 0, B (2 wide) whole on rank 1;
  "beside_row_wise": A whole on rank 0, B (3 wide) row-wise on both.

Each plan's lookup is probed (every id of the vocabulary, one per sample)
before and after `--steps` SGD steps of the sum of its outputs (the train
op fetched alone), and the probes are written to OUT/tf1_{plan}_{rank}.npz
for the parent to check against numpy. In TF1 graphs Horovod's collectives take their splits
through a stateful identity (`tfde/comm/horovod.py`), which the 2-rank
runs of TF2 functions do not exercise.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

VOCAB, LEARNING_RATE = 8, 0.5
# The ids each rank trains on (one per sample), for both features.
BATCHES = {0: [1, 3, 1], 1: [5, 7, 3]}


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--plan", choices=["table_wise", "beside_row_wise"], required=True)
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--out", required=True)
  args = p.parse_args()

  import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
  hvd.init()
  tf.compat.v1.disable_eager_execution()
  import tfde  # pylint: disable=g-import-not-at-top
  rank = hvd.rank()
  layout = tfde.planner.TableLayout
  widths = {"A": 1, "B": 2 if args.plan == "table_wise" else 3}
  tables = {n: tfde.TableConfig(name=n, vocabulary_size=VOCAB, embedding_dim=d,
                                optimizer=tfde.optimizers.SGD(learning_rate=LEARNING_RATE),
                                combiner="sum", seed=2) for n, d in widths.items()}
  layouts = {"A": layout("table_wise", [0]),
             "B": layout("table_wise", [1]) if args.plan == "table_wise"
             else layout("row_wise", [0, 1])}
  lookup = tfde.lookup.ShardedLookup(
      {"a": tfde.FeatureConfig(name="a", table=tables["A"]),
       "b": tfde.FeatureConfig(name="b", table=tables["B"])},
      plan=tfde.planner.ShardingPlan(2, layouts), auto_replicate_bytes=0)

  ids = tf.constant([[i] for i in BATCHES[rank]], tf.int64)
  out = lookup({"a": ids, "b": ids})
  loss = tf.reduce_sum(out["a"]) + tf.reduce_sum(out["b"])
  train = tf.group([g for g in tf.gradients(loss, lookup.trainable_variables)
                    if g is not None])
  every_id = tf.constant([[i] for i in range(VOCAB)], tf.int64)
  probe = lookup({"a": every_id, "b": every_id}, training=False)
  with tf.compat.v1.Session() as sess:
    sess.run([tf.compat.v1.global_variables_initializer(),
              tf.compat.v1.local_variables_initializer()])
    before = sess.run(probe)
    for _ in range(args.steps):
      # The train op alone, which reaches no forward output: this hung
      # where a rank holds none of a group's rows (the session skipped an
      # exchange its fetches did not reach, which the peer waited in;
      # it once hung so). Estimators fetch the loss too.
      sess.run(train)
    after = sess.run(probe)
  np.savez(os.path.join(args.out, f"tf1_{args.plan}_{rank}.npz"),
           **{f"before/{f}": v for f, v in before.items()},
           **{f"after/{f}": v for f, v in after.items()})
  print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
  main()
