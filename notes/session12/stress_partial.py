import os, sys, time, collections
from tests import dtensor_worker as w
import tensorflow as tf, numpy as np
from tensorflow.experimental import dtensor
import tfde
h = w.h
mesh = w.mesh_of(4)
configs = h.feature_configs("ftrl")
layer = tfde.dtensor.DistributedEmbedding(configs, mesh)
fn = tf.function(layer)
counts = collections.Counter()
t0 = time.time()
for i in range(int(os.environ.get("N", "20"))):
  ids, weights, _ = w.dense_inputs(mesh, h.make_batch(0, weighted=False))
  rows = [[1, 1]] * h.GLOBAL_BATCH
  rows[(i * 7) % h.GLOBAL_BATCH] = [50, 1]
  ids["b_sparse"] = w.pack(mesh, rows, tf.int64)
  try:
    out = fn(ids)
    dtensor.relayout(out["b_sparse"], dtensor.Layout.replicated(mesh, 2)).numpy()
    counts["none"] += 1
  except Exception as e:
    counts[type(e).__name__ + (":named" if "b_sparse" in str(e) else ":" + str(e)[:200])] += 1
    print(i, type(e).__name__, "b_sparse" in str(e), flush=True)
print(dict(counts), round(time.time() - t0, 1), "s", flush=True)
