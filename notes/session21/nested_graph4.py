import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np, tensorflow as tf, keras
import tfde
if os.environ.get("OPT"): tf.config.optimizer.set_experimental_options({os.environ["OPT"]: False})
table = tfde.TableConfig(name="t", vocabulary_size=16, embedding_dim=4,
                         optimizer=tfde.optimizers.SGD(learning_rate=0.5), combiner="sum")
inp = keras.Input(shape=(2,), dtype="int64", name="ids")
emb = tfde.layers.DistributedEmbedding({"f": tfde.FeatureConfig(name="f", table=table)})
out = keras.layers.Dense(1)(emb({"f": inp})["f"])
model = keras.Model(inp, out)
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
x = np.array([[1, 2], [3, 4], [5, 6], [7, 8]], np.int64); y = np.ones([4, 1], np.float32)
inner = tf.function(lambda d: model.train_step(d))
@tf.function
def outer(d):
  return inner(d)
cf = outer.get_concrete_function((tf.TensorSpec([4, 2], tf.int64), tf.TensorSpec([4, 1], tf.float32)))
fns = {f.name.decode() if isinstance(f.name, bytes) else f.name: f for f in cf.graph._functions.values()} if hasattr(cf.graph, "_functions") else {}
print("outer ops", sorted({op.type for op in cf.graph.get_operations()}))
gd = cf.graph.as_graph_def()
for f in gd.library.function:
  types = sorted({n.op for n in f.node_def})
  sparse = [n.name for n in f.node_def if "Sparse" in n.op or "Tfde" in n.op]
  print(f.signature.name, "control_ret", list(f.control_ret.keys())[:30], "\n   tfde/sparse ops:", [ (n.name, n.op) for n in f.node_def if n.op.startswith("Tfde") and "Apply" in n.op][:10])
t = next(iter(emb._lookup.tables.values()))
before = t.full_table().copy(); trig0 = emb._lookup.update_trigger.numpy()
r = outer((tf.constant(x), tf.constant(y)))
print("after nested: step", int(t.steps[0].numpy()), "rows changed", not np.allclose(before, t.full_table()), "trigger", trig0, emb._lookup.update_trigger.numpy(), "iterations", int(model.optimizer.iterations.numpy()))
