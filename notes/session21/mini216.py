"""TF 2.16: a side effect in a custom gradient's backward, under a nested tf.function."""
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf, keras
counter = tf.Variable(0, dtype=tf.int64)
trigger = tf.Variable(0.0)
w = tf.Variable([1.0, 2.0])
opt = keras.optimizers.SGD(0.1) if sys.argv[1] == "keras" else None

def lookup(trigger_value):
  @tf.custom_gradient
  def f(t):
    def grad_fn(g, variables=None):
      done = counter.assign_add(1)
      return tf.zeros_like(t) * tf.cast(done, t.dtype), [None] * len(variables or [])
    return w * 1.0, grad_fn
  return f(trigger_value)

def step():
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(lookup(trigger))
  grads = tape.gradient(loss, [trigger])
  if opt is not None:
    opt.apply_gradients(zip(grads, [trigger]))
  else:
    trigger.assign_sub(0.1 * grads[0])
  return loss
inner = tf.function(step)
@tf.function
def outer():
  return inner()
(outer if sys.argv[2] == "nested" else inner)()
print(sys.argv[1:], "counter", int(counter.numpy()), tf.__version__, keras.__version__)
