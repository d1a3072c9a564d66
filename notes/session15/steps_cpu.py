"""The bench's SGD, Adagrad and row-wise Adagrad steps, alternating in one
process: median wall ms per step over rounds, and the process's CPU ms (user +
system, both threads) per step over all rounds. CPU time is less disturbed
than wall time by other tenants of a shared host. argv[1]: rounds."""
import resource, statistics, sys, time
sys.path.insert(0, "bench")
import tensorflow as tf
import tfde
from workload import Workload, lookup_steps
from ops_bench import with_optimizer

work = Workload()
inputs, loss_of = work.feed(seed=0)
steps = {}
for name, opt in (("SGD", tfde.optimizers.SGD(0.01)), ("Adagrad", tfde.optimizers.Adagrad(0.01)),
                  ("row-wise Adagrad", tfde.optimizers.RowwiseAdagrad(0.01, epsilon=1e-7))):
  lookup = tfde.lookup.ShardedLookup(with_optimizer(work.feature_configs(), opt))
  steps[name] = (lookup, lookup_steps(lookup, inputs, loss_of)[1])
for _, s in steps.values():
  for _ in range(3): s()
cpu = lambda: (lambda r: (r.ru_utime + r.ru_stime) * 1e3)(resource.getrusage(resource.RUSAGE_SELF))
rounds = {k: [] for k in steps}
cpus = {k: 0.0 for k in steps}
n = int(sys.argv[1]) if len(sys.argv) > 1 else 15
for _ in range(n):
  for k, (_, s) in steps.items():
    c = cpu(); t = time.perf_counter(); s().numpy()
    rounds[k].append((time.perf_counter() - t) * 1e3); cpus[k] += cpu() - c
for k, v in rounds.items():
  print(f"{k:17s} median {statistics.median(v):6.2f}  min {min(v):6.2f}  cpu/step {cpus[k] / n:6.2f}")
