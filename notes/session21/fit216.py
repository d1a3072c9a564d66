"""Which part of Keras fit's train function keeps tfde's sparse updates
from running on TF 2.16? argv[1]: fit | tob | nested | nested_iter | nested_opt"""
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np, tensorflow as tf, keras
import tfde
mode = sys.argv[1]
table = tfde.TableConfig(name="t", vocabulary_size=16, embedding_dim=4,
                         optimizer=tfde.optimizers.SGD(learning_rate=0.5), combiner="sum")
inp = keras.Input(shape=(2,), dtype="int64", name="ids")
emb = tfde.layers.DistributedEmbedding({"f": tfde.FeatureConfig(name="f", table=table)})
out = keras.layers.Dense(1)(emb({"f": inp})["f"])
model = keras.Model(inp, out)
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
x = np.array([[1, 2], [3, 4], [5, 6], [7, 8]], np.int64); y = np.ones([4, 1], np.float32)
step = lambda: int(next(iter(emb._lookup.tables.values())).steps[0].numpy())
def train_step(data):
  if os.environ.get("HAND"):
    xb, yb = data
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    if os.environ.get("HAND") == "print":
      tf.print("grads", [g if g is None else tf.reduce_sum(tf.convert_to_tensor(g)) for g in grads])
    if os.environ.get("HAND") == "raw":
      for g, v in zip(grads, model.trainable_variables):
        v.assign_sub(0.1 * tf.convert_to_tensor(g))
      return loss
    model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss
  return model.train_step(data)
if os.environ.get("PREBUILD"):
  model.optimizer.build(model.trainable_variables)
if mode == "fit":
  model.fit(x, y, batch_size=4, epochs=1, verbose=0)
elif mode == "tob":
  model.train_on_batch(x, y)
else:
  inner = tf.function(train_step, reduce_retracing=True)
  ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
  if mode == "nested":
    @tf.function
    def outer(data):
      return inner(data)
    outer((tf.constant(x), tf.constant(y)))
  elif mode == "nested_iter":
    @tf.function
    def outer(it):
      return inner(it.get_next())
    outer(iter(ds))
  elif mode == "nested_opt":
    @tf.function
    def outer(it):
      return tf.experimental.Optional.from_value(inner(it.get_next()))
    o = outer(iter(ds)); o.get_value()
  elif mode == "flat_iter":
    @tf.function
    def outer(it):
      return train_step(it.get_next())
    outer(iter(ds))
dense = model.layers[-1].kernel.numpy().ravel()[:2]
print(mode, os.environ.get("HAND"), "dense", dense, "step", step(), "tf", tf.__version__, "keras", keras.__version__)
