import sys, time, collections
sys.argv = ["x"]
from tests import dtensor_worker as w
import tensorflow as tf
counts = collections.Counter()
t0 = time.time()
n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
for i in range(int(__import__("os").environ.get("N", "20"))):
  try:
    r = w.layout_case()
    counts["ok" if r["bad_id_error"] and "b_sparse" in r["bad_id_error"] and r["unchanged"] else "bad:" + str(r["bad_id_error"])[:80]] += 1
  except Exception as e:
    counts[type(e).__name__ + ":" + str(e)[:1500]] += 1
print(dict(counts), round(time.time() - t0, 1), "s", flush=True)
