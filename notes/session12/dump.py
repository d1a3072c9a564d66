import sys; sys.path.insert(0, "/work/main/bench"); sys.argv=sys.argv[:1]
import numpy as np
from workload import parse_args
args, work = parse_args("", reps=7)
ids = work.ids(seed=0)
rows = []
for t, x in enumerate(ids):
  x = np.asarray(x).reshape(-1)
  _, first = np.unique(x, return_index=True)
  u = x[np.sort(first)]  # first-occurrence order
  rows.append(u.astype(np.int64) + t * work.vocab)
np.concatenate(rows).astype(np.int64).tofile("rows.bin")
print(sum(len(r) for r in rows))
