"""tw.py's plans in a TF1 graph (tf.compat.v1.Session) under horovodrun -np 2."""
import os, sys
import numpy as np, tensorflow as tf
import horovod.tensorflow as hvd
import faulthandler; faulthandler.dump_traceback_later(40, exit=True)
hvd.init()
tf.compat.v1.disable_eager_execution()
import tfde
rank = hvd.rank()
L = tfde.planner.TableLayout
def cfg(name, dim): return tfde.TableConfig(name=name, vocabulary_size=8, embedding_dim=dim, optimizer=tfde.optimizers.SGD(learning_rate=0.5), combiner="sum", seed=2)
tables = {"A": cfg("A", 1), "B": cfg("B", 3 if sys.argv[1] == "one" else 2)}
layouts = {"tw": {"A": L("table_wise", [0]), "B": L("table_wise", [1])},
           "one": {"A": L("table_wise", [0]), "B": L("row_wise", [0, 1])}, "rw": None}[sys.argv[1]]
lookup = tfde.lookup.ShardedLookup({"a": tfde.FeatureConfig(name="a", table=tables["A"]), "b": tfde.FeatureConfig(name="b", table=tables["B"])}, auto_replicate_bytes=0)
ids = tf.constant([[1], [3]] if rank == 0 else [[5], [7]], tf.int64)
out = lookup({"a": ids, "b": ids})
loss = tf.reduce_sum(out["a"]) + tf.reduce_sum(out["b"])
grads = tf.gradients(loss, lookup.trainable_variables)
train = tf.group([g for g in grads if g is not None])
with tf.compat.v1.Session() as sess:
  sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
  for _ in range(3):
    sess.run(train); l = 0
  steps = sess.run({n: t.steps[rank] for n, t in lookup.tables.items()})
print(f"rank {rank} TF1 {sys.argv[1]} loss {l} steps {steps}", flush=True)
os._exit(0)
