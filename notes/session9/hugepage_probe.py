import ctypes, time, sys, os
sys.path.insert(0, "/work/main"); sys.path.insert(0, "/work/main/bench")
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np, tensorflow as tf, tfde
from workload import Workload, lookup_steps, timed
libc = ctypes.CDLL("libc.so.6", use_errno=True)
MADV_HUGEPAGE, MADV_COLLAPSE, HUGE = 14, 25, 2 << 20
def advise(var, collapse):
  a = np.asarray(var.read_value())  # shares the buffer before any update
  start = a.__array_interface__["data"][0]; end = start + a.nbytes
  lo = (start + HUGE - 1) // HUGE * HUGE; hi = end // HUGE * HUGE
  r1 = libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), MADV_HUGEPAGE)
  r2 = libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), MADV_COLLAPSE) if collapse else 0
  return r1, r2, ctypes.get_errno()
work = Workload(); ids = work.ids(seed=0)
inputs = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
mode = sys.argv[1]
lookup = tfde.lookup.ShardedLookup(work.feature_configs())
# slots are created lazily? touch one step first only if needed
variables = [v for t in lookup.tables.values() for v in t.local_variables()]
t0 = time.perf_counter()
if mode != "none":
  res = [advise(v, mode == "collapse") for v in variables]
  print("advised", len(variables), "vars", res[:2], f"{time.perf_counter()-t0:.2f}s")
fwd, train = lookup_steps(lookup, inputs, lambda o: tf.add_n([tf.reduce_sum(v) for v in o.values()]))
print(mode, "forward", round(timed(fwd, 9), 2), "train", round(timed(train, 9), 2))
print([l for l in open("/proc/self/smaps_rollup") if "AnonHuge" in l])
