"""Reviewer's probe (session 26): refused calls under DTensor's default
asynchronous device and under a synchronous one
(`dtensor._reset_dtensor_device(is_async=False)` before the mesh), counting
CancelledErrors; after each, a call with valid ids and the bad call again;
at the end, whether the tables are unchanged. Results:
notes/session26/dtensor_sync_probe.txt."""
import sys, time; sys.path.insert(0, "/work/main")
import collections
import tests.conftest  # noqa
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.experimental import dtensor
import tfde.dtensor
from tests import sharded_harness as h
from tests.dtensor_worker import dense_inputs, mesh_of, pack
if 'sync' in sys.argv: dtensor._reset_dtensor_device(is_async=False)
mesh = mesh_of(4)
layer = tfde.dtensor.DistributedEmbedding(h.feature_configs("ftrl"), mesh)
before = {n: t.full_table() for n, t in layer.tables.items()}
ids, _, _ = dense_inputs(mesh, h.make_batch(0, weighted=False))
mode, rounds, fresh = sys.argv[1], int(sys.argv[2]), "fresh" in sys.argv
call = tf.function(layer)
cases = {"bad_id": dict(ids, b_sparse=pack(mesh, [[50, 1]] * h.GLOBAL_BATCH, tf.int64)),
         "uint64": dict(ids, b_sparse=pack(mesh, [[2**64 - 1, 1]] * h.GLOBAL_BATCH, tf.uint64))}
good = dict(ids, b_sparse=pack(mesh, [[49, 1]] * h.GLOBAL_BATCH, tf.int64))
def tag(e):
  return type(e).__name__[:3] + ("+" if "feature b_sparse" in e.message else "-")
def once(inputs, wait):
  sys.stderr.write('MARK call\n'); sys.stderr.flush()
  f = tf.function(layer) if fresh else call
  try:
    out = f(inputs)
    if wait: context.async_wait()
    dtensor.relayout(out["b_sparse"], dtensor.Layout.replicated(mesh, 2)).numpy()
    return "ok"
  except tf.errors.OpError as e:
    sys.stderr.write('MARK raised ' + tag(e) + '\n'); sys.stderr.flush()
    return tag(e)
seen = collections.Counter(); log = []
t0 = time.time()
for i in range(rounds):
  for case, inputs in cases.items():
    r = once(inputs, mode == "wait"); seq = [r]
    if r.startswith("Can"):
      seq.append("good:" + once(good, False))   # a valid call right after
      seq.append(once(inputs, mode == "wait"))   # then the retry
    seen[case, tuple(seq)] += 1; log.append(r[:3])
print(mode, "sync" if "sync" in sys.argv else "async", "fresh" if fresh else "reused", rounds, "rounds", round(time.time() - t0), "s")
print("".join("C" if x == "Can" else "." for x in log))
for k, v in sorted(seen.items()): print(k, v, flush=True)
print("unchanged", all(np.array_equal(before[n], t.full_table()) for n, t in layer.tables.items()))
