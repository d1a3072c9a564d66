import sys, time, statistics
sys.path.insert(0, "/work/main/bench")
import numpy as np, torch
from workload import Workload
work = Workload(); ids = work.ids(seed=0)
bags = [torch.nn.EmbeddingBag(work.vocab, work.dim, mode="sum") for _ in range(work.tables)]
xs = [torch.from_numpy(i) for i in ids]
with torch.no_grad():
  for _ in range(3): [b(x) for b, x in zip(bags, xs)]
  ts = []
  for _ in range(int(sys.argv[1])):
    t = time.perf_counter(); [b(x) for b, x in zip(bags, xs)]; ts.append((time.perf_counter() - t) * 1e3)
print("torch median %.2f min %.2f threads %d" % (statistics.median(ts), min(ts), torch.get_num_threads()))
