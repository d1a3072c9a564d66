import sys, time, numpy as np
V, D, B, L = 1_000_000, 64, 4096, 20
rng = np.random.default_rng(0)
tab = rng.standard_normal((V, D), dtype=np.float32)
ids = ((rng.zipf(1.05, size=(B, L)) - 1) % V).astype(np.int64)
def timed(f, reps=41):
  f(); f()
  ts = []
  for _ in range(reps):
    t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
  return np.median(ts) * 1e3
import tensorflow as tf
v = tf.Variable(tab); i = tf.constant(ids)
def base():
  return tf.reduce_sum(tf.gather_nd(v, i[:, :, None]), 1)
def chain(c):
  def f():
    acc = None
    for l0 in range(0, L, c):
      part = tf.reduce_sum(tf.gather_nd(v, i[:, l0:l0 + c, None]), 1)
      acc = part if acc is None else acc + part
    return acc
  return f
def bchunk(k):
  def f():
    return tf.concat([tf.reduce_sum(tf.gather_nd(v, p[:, :, None]), 1) for p in tf.split(i, k)], 0)
  return f
def sss():
  seg = tf.repeat(tf.range(B, dtype=tf.int32), L)
  return tf.sparse.segment_sum(v, tf.reshape(i, [-1]), seg)
fs = [("base", base), ("chain1", chain(1)), ("chain5", chain(5)), ("bchunk4", bchunk(4)), ("bchunk16", bchunk(16)), ("bchunk64", bchunk(64)), ("sss", sss)]
ref = tf.function(base)().numpy()
for r in range(2):
  for n, f in fs:
    g = tf.function(f)
    assert np.allclose(g().numpy(), ref, atol=1e-4)
    print(n, round(timed(lambda: g().numpy()), 2), flush=True)
