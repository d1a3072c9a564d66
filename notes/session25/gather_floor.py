import sys, time, numpy as np
V, D, B, L = 1_000_000, 64, 4096, 20
rng = np.random.default_rng(0)
tab = rng.standard_normal((V, D), dtype=np.float32)
ids = ((rng.zipf(1.05, size=(B * L)) - 1) % V).astype(np.int64)
def timed(f, reps=31):
  f(); f()
  ts = []
  for _ in range(reps):
    t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
  return np.median(ts) * 1e3
if sys.argv[1] == "torch":
  import torch
  T = torch.from_numpy(tab); I = torch.from_numpy(ids)
  off = torch.arange(0, B * L, L)
  bag = torch.nn.EmbeddingBag.from_pretrained(T, mode="sum")
  print("torch index_select", timed(lambda: torch.index_select(T, 0, I)))
  print("torch embbag", timed(lambda: bag(I, off)))
  torch.set_num_threads(1)
  print("torch index_select 1 thread", timed(lambda: torch.index_select(T, 0, I)))
  print("torch embbag 1 thread", timed(lambda: bag(I, off)))
else:
  print("numpy take", timed(lambda: np.take(tab, ids, axis=0)))
  import tensorflow as tf
  if sys.argv[1] == "tf1": tf.config.threading.set_intra_op_parallelism_threads(1)
  v = tf.Variable(tab); i = tf.constant(ids)
  g = tf.function(lambda: tf.gather_nd(v, i[:, None]))
  g2 = tf.function(lambda: tf.gather(v, i))
  g3 = tf.function(lambda: tf.reduce_sum(tf.reshape(tf.gather_nd(v, i[:, None]), [B, L, D]), 1))
  print(sys.argv[1], "gather_nd", timed(lambda: g().numpy()))
  print(sys.argv[1], "gather", timed(lambda: g2().numpy()))
  print(sys.argv[1], "gather_nd+sum", timed(lambda: g3().numpy()))
