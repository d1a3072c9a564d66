"""Trace the 'tw' training step as rank R of 2 with a stand-in Horovod that
records each collective's name, dtype and shape; print the record."""
import sys, types
import tensorflow as tf
rank = int(sys.argv[2])
log = []
recorded = []
hvd = types.ModuleType("horovod.tensorflow")
hvd.is_initialized = lambda: True
hvd.size = lambda: 2
hvd.rank = lambda: rank
def alltoall(tensor, splits=None, name=None, ignore_name_scope=False):
  log.append(("alltoall", name, tensor.dtype.name, str(tensor.shape)))
  out = tf.identity(tensor, name="fake_" + name); recorded.append(out)
  return out, tf.identity(splits)
def allgather(tensor, name=None):
  log.append(("allgather", name, tensor.dtype.name, str(tensor.shape)))
  out = tf.concat([tensor, tensor], 0); recorded.append(out); return out
hvd.alltoall = alltoall; hvd.allgather = allgather
sys.modules["horovod"] = types.ModuleType("horovod"); sys.modules["horovod.tensorflow"] = hvd
import tfde
tfde.comm.Communicator.groups_without_rows_refused = None
tfde.comm.HorovodCommunicator.groups_without_rows_refused = None
L = tfde.planner.TableLayout
def cfg(name, dim): return tfde.TableConfig(name=name, vocabulary_size=8, embedding_dim=dim, optimizer=tfde.optimizers.SGD(learning_rate=0.5), combiner="sum", seed=2)
kind = sys.argv[1]
tables = {"A": cfg("A", 1), "B": cfg("B", 1 if kind == "tw1" else (3 if kind == "one" else 2))}
layouts = {"row": {"A": L("row_wise", [0, 1]), "B": L("row_wise", [0, 1])},
           "tw": {"A": L("table_wise", [0]), "B": L("table_wise", [1])},
           "one": {"A": L("table_wise", [0]), "B": L("row_wise", [0, 1])},
           "tw1": {"A": L("table_wise", [0]), "B": L("table_wise", [1])}}[kind]
plan = tfde.planner.ShardingPlan(num_replicas=2, tables=layouts)
lookup = tfde.lookup.ShardedLookup({"a": tfde.FeatureConfig(name="a", table=tables["A"]), "b": tfde.FeatureConfig(name="b", table=tables["B"])}, plan=plan, auto_replicate_bytes=0)
@tf.function
def train(ids):
  with tf.GradientTape() as tape:
    out = lookup({"a": ids, "b": ids})
    loss = tf.reduce_sum(out["a"]) + tf.reduce_sum(out["b"])
  tape.gradient(loss, lookup.trainable_variables)
  return loss
g = train.get_concrete_function(tf.TensorSpec([2, 1], tf.int64)).graph
for l in log: print(*l)
# the collective ops' control/data predecessors: print which collectives each waits on
ops = {op.name: op for op in g.get_operations()}
# Which recorded collectives reach the function's outputs or its control outputs?
outs = [t.op for t in g.outputs] + list(g.control_outputs)
seen, stack = set(), list(outs)
while stack:
  op = stack.pop()
  if op.name in seen: continue
  seen.add(op.name)
  stack += [t.op for t in op.inputs] + list(op.control_inputs)
for l, t in zip(log, recorded):
  print(l[1], "reached" if t.op.name in seen else "NOT REACHED (pruned)")
def ancestors(op):
  seen, stack = set(), [t.op for t in op.inputs] + list(op.control_inputs)
  while stack:
    o = stack.pop()
    if o.name in seen: continue
    seen.add(o.name)
    stack += [t.op for t in o.inputs] + list(o.control_inputs)
  return seen
names = {t.op.name: l[1].split("_")[-1] for l, t in zip(log, recorded)}
for l, t in zip(log, recorded):
  a = ancestors(t.op)
  print(l[1].split("_")[-1], "after", sorted(names[n] for n in a if n in names))
