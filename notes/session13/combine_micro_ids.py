import numpy as np, sys
sys.path.insert(0, "/work/main/bench")
from workload import Workload
w = Workload()
ids = w.ids(seed=0)
fused = np.concatenate([ids[t].reshape(-1) + t * w.vocab for t in range(w.tables)]).astype(np.int64)
fused.tofile("ids.bin")
print(fused.size)
