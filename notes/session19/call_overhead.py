import os, time, statistics
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf, numpy as np
ids = np.random.randint(0, 1000, size=(4096, 20)).astype(np.int64)
dense = {f"f{t}": tf.constant(ids) for t in range(4)}
ragged = {f"f{t}": tf.RaggedTensor.from_tensor(tf.constant(ids)) for t in range(4)}
f = tf.function(lambda i: tf.constant(0))
g = tf.function(lambda i: {k: tf.size(v.values if isinstance(v, tf.RaggedTensor) else v) for k, v in i.items()})
for name, fn in (("empty", f), ("sizes", g)):
  for kind, x in (("dense", dense), ("ragged", ragged)):
    for _ in range(20): fn(x)
    ts = []
    for _ in range(2000):
      t = time.perf_counter(); fn(x); ts.append(time.perf_counter() - t)
    print(name, kind, "median us %.1f" % (statistics.median(ts) * 1e6))
