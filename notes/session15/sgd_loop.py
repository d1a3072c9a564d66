"""The bench's SGD (argv[2] "sgd", the default) or row-wise Adagrad ("rowwise")
step in a loop, for perf: prints "go" then runs argv[1] seconds."""
import sys, time
sys.path.insert(0, "bench")
import tensorflow as tf
import tfde
from workload import Workload, lookup_steps
from ops_bench import with_optimizer

work = Workload()
inputs, loss_of = work.feed(seed=0)
opt = {"sgd": tfde.optimizers.SGD(0.01),
       "rowwise": tfde.optimizers.RowwiseAdagrad(0.01, epsilon=1e-7),
       }[sys.argv[2] if len(sys.argv) > 2 else "sgd"]
lookup = tfde.lookup.ShardedLookup(with_optimizer(work.feature_configs(), opt))
step = lookup_steps(lookup, inputs, loss_of)[1]
for _ in range(5): step()
print("go", flush=True)
end = time.time() + float(sys.argv[1]); n = 0
t0 = time.perf_counter()
while time.time() < end:
  step().numpy(); n += 1
print(f"{n} steps, {(time.perf_counter()-t0)/n*1e3:.2f} ms/step")
