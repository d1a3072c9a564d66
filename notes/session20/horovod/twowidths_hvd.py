"""Two tables of widths 1 and 2 under horovodrun -np 2, layout per argv[1]:
row (row_wise both), tw (table_wise on owners 0 and 1)."""
import os, sys
import numpy as np, tensorflow as tf
import horovod.tensorflow as hvd
import faulthandler; faulthandler.dump_traceback_later(25, exit=True)
hvd.init()
import tfde
rank = hvd.rank()
L = tfde.planner.TableLayout
def cfg(name, dim): return tfde.TableConfig(name=name, vocabulary_size=8, embedding_dim=dim, optimizer=tfde.optimizers.SGD(learning_rate=0.5), combiner="sum", seed=2)
tables = {"A": cfg("A", 1), "B": cfg("B", 1 if sys.argv[1] == "tw1" else (3 if sys.argv[1] == "one" else 2))}
layouts = {"row": {"A": L("row_wise", [0, 1]), "B": L("row_wise", [0, 1])},
           "tw": {"A": L("table_wise", [0]), "B": L("table_wise", [1])},
           "one": {"A": L("table_wise", [0]), "B": L("row_wise", [0, 1])},
           "tw1": {"A": L("table_wise", [0]), "B": L("table_wise", [1])}}[sys.argv[1]]
plan = tfde.planner.ShardingPlan(num_replicas=2, tables=layouts)
lookup = tfde.lookup.ShardedLookup({"a": tfde.FeatureConfig(name="a", table=tables["A"]), "b": tfde.FeatureConfig(name="b", table=tables["B"])}, plan=plan, auto_replicate_bytes=0)
ids = tf.constant([[1], [3]] if rank == 0 else [[5], [7]], tf.int64)
@tf.function
def train(ids):
  with tf.GradientTape() as tape:
    out = lookup({"a": ids, "b": ids})
    loss = tf.reduce_sum(out["a"]) + tf.reduce_sum(out["b"])
  tape.gradient(loss, lookup.trainable_variables)
  return loss
print(f"rank {rank} train", train(ids).numpy(), flush=True)
os._exit(0)
