"""One column-wise table under horovodrun -np 2. argv: mode owners widths idkind(1d32|2d64) weights(0|1)"""
import os, sys
import numpy as np, tensorflow as tf
import horovod.tensorflow as hvd
import faulthandler; faulthandler.dump_traceback_later(18, exit=True)
hvd.init()
import tfde
if os.environ.get("INTER"): tf.config.threading.set_inter_op_parallelism_threads(int(os.environ["INTER"]))
rank = hvd.rank()
MODE = sys.argv[1]; owners = [int(x) for x in sys.argv[2].split(",")]; widths = [int(x) for x in sys.argv[3].split(",")]
kind = sys.argv[4]; weighted = sys.argv[5] == "1"
C = tfde.TableConfig(name="C", vocabulary_size=8, embedding_dim=sum(widths), optimizer=tfde.optimizers.SGD(learning_rate=0.5), combiner=sys.argv[6] if len(sys.argv) > 6 else "sum", seed=2)
L = tfde.planner.TableLayout
plan = tfde.planner.ShardingPlan(num_replicas=2, tables={"C": L("column_wise", owners, widths)})
lookup = tfde.lookup.ShardedLookup({"c": tfde.FeatureConfig(name="c", table=C)}, plan=plan, auto_replicate_bytes=0)
if kind == "1d32":
  ids = tf.constant([1, 3] if rank == 0 else [5, 7], tf.int32); w = tf.constant([0.5, 2.0])
else:
  ids = tf.constant([[1], [3]] if rank == 0 else [[5], [7]], tf.int64); w = tf.constant([[0.5], [2.0]])
wts = {"c": w} if weighted else None
@tf.function
def fwd(ids):
  return lookup({"c": ids}, wts)["c"]
@tf.function
def train(ids):
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(lookup({"c": ids}, wts)["c"])
  tape.gradient(loss, lookup.trainable_variables)
  return loss
if os.environ.get("GATHER"): print(f"rank {rank} full", lookup.tables["C"].full_table().sum(), flush=True)
if MODE == "eager":
  print(f"rank {rank} eager", lookup({"c": ids}, wts)["c"].numpy().sum(), flush=True)
elif MODE == "forward":
  print(f"rank {rank} fwd", fwd(ids).numpy().sum(), flush=True)
elif MODE == "eagertrain":
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(lookup({"c": ids}, wts)["c"])
  tape.gradient(loss, lookup.trainable_variables)
  print(f"rank {rank} eagertrain", loss.numpy(), flush=True)
else:
  print(f"rank {rank} train", train(ids).numpy(), flush=True)
print(f"rank {rank} done", flush=True)
os._exit(0)
