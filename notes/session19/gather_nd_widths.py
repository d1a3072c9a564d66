import os, time, statistics
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf, numpy as np
rng = np.random.default_rng(0)
for dim, vocab in ((4, 1000000), (16, 1000000), (64, 100000), (128, 200000), (256, 100000)):
  t = tf.Variable(tf.random.uniform([vocab, dim]))
  ids = tf.constant((rng.zipf(1.05, 327680) - 1) % vocab)
  g = tf.function(lambda x: tf.gather(t, x)); n = tf.function(lambda x: tf.gather_nd(t, x[:, None]))
  assert bool(tf.reduce_all(g(ids) == n(ids)))
  res = {"gather": [], "gather_nd": []}
  for _ in range(3): g(ids); n(ids)
  for _ in range(15):
    for k, f in (("gather", g), ("gather_nd", n)):
      s = time.perf_counter(); f(ids).numpy(); res[k].append((time.perf_counter() - s) * 1e3)
  print(dim, vocab, {k: round(statistics.median(v), 2) for k, v in res.items()})
