import os, sys
from tests import dtensor_worker as w
import tensorflow as tf
from tensorflow.experimental import dtensor
import tfde
h = w.h
mesh = w.mesh_of(4)
layer = tfde.dtensor.DistributedEmbedding(h.feature_configs("ftrl"), mesh)
ids, weights, _ = w.dense_inputs(mesh, h.make_batch(0, weighted=False))
rows = [[1, 1]] * h.GLOBAL_BATCH
rows[int(sys.argv[1])] = [50, 1]
ids["b_sparse"] = w.pack(mesh, rows, tf.int64)
out = tf.function(layer)(ids)
res = []
try:
  parts = dtensor.unpack(out["b_sparse"])
except Exception as e:
  print("unpack failed", type(e).__name__, "b_sparse" in str(e)); sys.exit()
for p in parts:
  try:
    p.numpy(); res.append("ok")
  except Exception as e:
    res.append(type(e).__name__ + str("b_sparse" in str(e)))
print(res)
