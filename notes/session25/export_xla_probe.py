import time, numpy as np, tensorflow as tf
V, D, B, L, T = 1_000_000, 64, 4096, 20, 4
rng = np.random.default_rng(0)
tables = [tf.Variable(rng.standard_normal((V, D), dtype=np.float32)) for _ in range(T)]
ids = [tf.constant((rng.zipf(1.05, size=(B, L)) - 1) % V, tf.int64) for _ in range(T)]
def timed(f, reps=21):
  f(); f()
  ts = []
  for _ in range(reps):
    t = time.perf_counter(); r = f(); _ = [x.numpy() for x in r]; ts.append(time.perf_counter() - t)
  return np.median(ts) * 1e3
def body():
  return [tf.reduce_sum(tf.gather(t, i), 1) for t, i in zip(tables, ids)]
plain = tf.function(lambda: [tf.reduce_sum(tf.gather_nd(t, i[:, :, None]), 1) for t, i in zip(tables, ids)])
xla = tf.function(body, jit_compile=True)
ref = plain()
print("max diff", max(float(tf.reduce_max(tf.abs(a - b))) for a, b in zip(ref, xla())))
for r in range(2):
  print("gather_nd+sum", round(timed(plain), 2), "xla", round(timed(xla), 2), flush=True)
