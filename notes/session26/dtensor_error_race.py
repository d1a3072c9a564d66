"""How often a refused id under DTensor surfaces as an unnamed
CancelledError instead of the check's named InvalidArgumentError (the
race behind session 25's three setup errors in tests/test_dtensor.py),
and whether any named error is still pending after one (it never was).
Run beside five busy loops on the 2-core host:

  for i in 1 2 3 4 5; do timeout 500 sh -c 'while :; do :; done' & done
  .venv/bin/python notes/session26/dtensor_error_race.py 150

Prints (case, errors in the order raised) and a count; "+" means the
message names "feature b_sparse", "-" that it does not.
"""
import sys; sys.path.insert(0, "/work/main")
import collections
import tests.conftest  # noqa
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.experimental import dtensor
import tfde.dtensor
from tests import sharded_harness as h
from tests.dtensor_worker import dense_inputs, mesh_of, pack
mesh = mesh_of(4)
layer = tfde.dtensor.DistributedEmbedding(h.feature_configs("ftrl"), mesh)
ids, _, _ = dense_inputs(mesh, h.make_batch(0, weighted=False))
call = tf.function(layer)
cases = {"bad_id": dict(ids, b_sparse=pack(mesh, [[50, 1]] * h.GLOBAL_BATCH, tf.int64)),
         "uint64": dict(ids, b_sparse=pack(mesh, [[2**64 - 1, 1]] * h.GLOBAL_BATCH, tf.uint64))}
seen = collections.Counter()
probe = pack(mesh, [[1]] * h.GLOBAL_BATCH, tf.int64)
for i in range(int(sys.argv[1])):
  for case, inputs in cases.items():
    errors = []
    try:
      out = call(inputs)
      dtensor.relayout(out["b_sparse"], dtensor.Layout.replicated(mesh, 2)).numpy()
    except tf.errors.OpError as e:
      errors.append(e)
    for e in errors:
      if "feature b_sparse" not in e.message: print("MSG", e.message[:900].replace("\n", " | "))
    for _ in range(6):
      try:
        context.async_wait()
        dtensor.relayout(probe, dtensor.Layout.replicated(mesh, 2)).numpy()
        break
      except tf.errors.OpError as e:
        errors.append(e)
    seen[case, tuple(type(e).__name__[:3] + ("+" if "feature b_sparse" in e.message else "-") for e in errors)] += 1
for k, v in sorted(seen.items()): print(k, v)
