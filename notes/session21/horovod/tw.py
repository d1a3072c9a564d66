"""Two tables of widths 1 and 2 under horovodrun -np 2, layout per argv[1]:
row (row_wise both), tw (table_wise on owners 0 and 1)."""
import os, sys
import numpy as np, tensorflow as tf
import horovod.tensorflow as hvd
import faulthandler; faulthandler.dump_traceback_later(int(os.environ.get("HANG_S", "25")) - 5 * int(os.environ.get("HOROVOD_RANK", "0")), exit=True)
hvd.init()
if os.environ.get("NO_DEP_OPT"): tf.config.optimizer.set_experimental_options({"dependency_optimization": False})
if os.environ.get("NO_GRAPPLER"): tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
import tfde
_real = hvd.alltoall
def traced_alltoall(tensor, splits=None, name=None, ignore_name_scope=False):
  with tf.control_dependencies([tf.print("rank", hvd.rank(), "enter", name, tf.shape(tensor), splits, output_stream=sys.stderr)]):
    tensor = tf.identity(tensor)
  out, rs = _real(tensor, splits=splits, name=name, ignore_name_scope=ignore_name_scope)
  with tf.control_dependencies([tf.print("rank", hvd.rank(), "exit", name, tf.shape(out), rs, output_stream=sys.stderr)]):
    return tf.identity(out), tf.identity(rs)
if os.environ.get("TRACE_A2A"): hvd.alltoall = traced_alltoall
rank = hvd.rank()
L = tfde.planner.TableLayout
def cfg(name, dim): return tfde.TableConfig(name=name, vocabulary_size=8, embedding_dim=dim, optimizer=tfde.optimizers.SGD(learning_rate=0.5), combiner="sum", seed=2)
tables = {"A": cfg("A", 1), "B": cfg("B", 1 if sys.argv[1] == "tw1" else (3 if sys.argv[1] == "one" else 2))}
layouts = {"row": {"A": L("row_wise", [0, 1]), "B": L("row_wise", [0, 1])},
           "tw": {"A": L("table_wise", [0]), "B": L("table_wise", [1])},
           "one": {"A": L("table_wise", [0]), "B": L("row_wise", [0, 1])},
           "tw1": {"A": L("table_wise", [0]), "B": L("table_wise", [1])}}[sys.argv[1]]
tfde.comm.HorovodCommunicator.groups_without_rows_refused = None
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
