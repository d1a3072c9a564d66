"""A dynamic table whole on rank 1 (table_wise), under horovodrun -np 2,
a tf.function training step. argv[1]: "alone" (the only table) or "with"
(beside a row-wise static table)."""
import os, sys
import tensorflow as tf
import horovod.tensorflow as hvd
import faulthandler; faulthandler.dump_traceback_later(25, exit=True)
hvd.init()
import tfde
rank = hvd.rank()
L = tfde.planner.TableLayout
dyn = tfde.TableConfig(name="D", vocabulary_size=None, embedding_dim=2,
                       optimizer=tfde.optimizers.SGD(learning_rate=0.5), combiner="sum")
features = {"d": tfde.FeatureConfig(name="d", table=dyn)}
layouts = {"D": L("table_wise", [1])}
if sys.argv[1] == "with":
  st = tfde.TableConfig(name="S", vocabulary_size=8, embedding_dim=2,
                        optimizer=tfde.optimizers.SGD(learning_rate=0.5), combiner="sum")
  features["s"] = tfde.FeatureConfig(name="s", table=st)
  layouts["S"] = L("row_wise", [0, 1])
lookup = tfde.lookup.ShardedLookup(features, plan=tfde.planner.ShardingPlan(2, layouts))
ids = tf.constant([[1], [3]] if rank == 0 else [[5], [7]], tf.int64)
@tf.function
def train(ids):
  with tf.GradientTape() as tape:
    out = lookup({k: ids for k in features})
    loss = tf.add_n([tf.reduce_sum(v) for v in out.values()])
  tape.gradient(loss, lookup.trainable_variables)
  return loss
print(f"rank {rank} train", train(ids).numpy(), flush=True)
hvd.allreduce(tf.constant(1.0), name="bye"); print(f"rank {rank} done", flush=True)
os._exit(0)
