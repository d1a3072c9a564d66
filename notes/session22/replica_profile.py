"""Per-op-type time of the sharded bench's training step at 1 and N
replicas (step stats of the traced step: each node's wall time summed by op
type, so time on both cores adds up; ops under 1 ms in all are summed as
"rest"). Alternates the two steps, `rounds` times each.

  python notes/session22/replica_profile.py N [exchange] [rounds]
"""
import collections, os, sys, statistics, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
n_max = int(sys.argv[1]); exchange = sys.argv[2] if len(sys.argv) > 2 else "auto"
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
sys.argv = sys.argv[:1]
import tensorflow as tf
here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
sys.path.insert(0, root); sys.path.insert(0, os.path.join(root, "bench"))
import sharded_bench as sb  # sets up 4 logical CPUs
import tfde
from workload import Workload, replica_train_step
from tensorflow.python.eager import context

work = Workload(); ids = work.ids(seed=0)

def build(n):
  per = work.batch // n
  strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
  with strategy.scope():
    lookup = tfde.lookup.ShardedLookup(work.feature_configs(), exchange=exchange)
  def replica_slice(ctx):
    r = ctx.replica_id_in_sync_group
    return {f"f{t}": tf.constant(ids[t][r * per:(r + 1) * per]) for t in range(work.tables)}
  inputs = strategy.experimental_distribute_values_from_function(replica_slice)
  step = replica_train_step(strategy, lookup)
  step(inputs); step(inputs)
  return lambda: step(inputs)

steps = {1: build(1), n_max: build(n_max)}
walls = {n: [] for n in steps}
for _ in range(rounds):
  for n, f in steps.items():
    t = time.perf_counter(); f(); walls[n].append((time.perf_counter() - t) * 1e3)

import glob, tempfile
from tensorflow.tsl.profiler.protobuf import xplane_pb2

def traced(f, traced_steps=3):
  """Summed ms per op type of one step: kernel events ("name:Type") of every
  host thread in a tf.profiler trace of `traced_steps` steps."""
  logdir = tempfile.mkdtemp()
  tf.profiler.experimental.start(logdir)
  for _ in range(traced_steps):
    f()
  tf.profiler.experimental.stop()
  space = xplane_pb2.XSpace()
  space.ParseFromString(open(glob.glob(logdir + "/**/*.xplane.pb", recursive=True)[0], "rb").read())
  out = collections.Counter()
  for plane in space.planes:
    names = {k: v.name for k, v in plane.event_metadata.items()}
    for line in plane.lines:
      for ev in line.events:
        name = names.get(ev.metadata_id, "")
        if ":" in name and "::" not in name and "__inference" not in name:
          kind = name.rsplit(":", 1)[1]
          out[kind] += ev.duration_ps / 1e9 / traced_steps
          out["#" + kind] += 1 / traced_steps
          if os.environ.get("NODES") and kind in os.environ["NODES"].split(","):
            out["@" + name] += ev.duration_ps / 1e9 / traced_steps
  return out

by_type = {n: traced(f) for n, f in steps.items()}
ms = {n: statistics.median(w) for n, w in walls.items()}
print(f"wall ms (untraced, median of {rounds}): " + ", ".join(f"N={n} {ms[n]:.1f}" for n in ms)
      + f"; ratio {ms[n_max] / ms[1]:.2f}")
for n, c in by_type.items():
  nodes = sorted(((k[1:], v) for k, v in c.items() if k.startswith("@")), key=lambda kv: -kv[1])
  for k, v in nodes[:40]:
    print(f"N={n} {v:7.3f} ms  {k}")
by_type = {n: collections.Counter({k: v for k, v in c.items() if not k.startswith("@")}) for n, c in by_type.items()}
counts = {n: {k[1:]: v for k, v in c.items() if k.startswith("#")} for n, c in by_type.items()}
by_type = {n: collections.Counter({k: v for k, v in c.items() if not k.startswith("#")}) for n, c in by_type.items()}
tot = {n: sum(c.values()) for n, c in by_type.items()}
print(f"summed node ms per traced step: " + ", ".join(f"N={n} {tot[n]:.1f}" for n in tot))
keys = sorted(set(by_type[1]) | set(by_type[n_max]), key=lambda k: -(by_type[n_max][k] - by_type[1][k]))
rest = [0.0, 0.0]
print(f"{'op':40s} {'N=1':>8s} {'N=' + str(n_max):>8s} {'diff':>8s}   ops per step")
for k in keys:
  a, b = by_type[1][k], by_type[n_max][k]
  if max(a, b) < (0.0 if os.environ.get("ALL") else 1.0):
    rest[0] += a; rest[1] += b; continue
  print(f"{k:40s} {a:8.2f} {b:8.2f} {b - a:+8.2f}   {counts[1].get(k, 0):.0f} / {counts[n_max].get(k, 0):.0f}")
small = [sum(v for k, v in counts[n].items() if max(by_type[1][k], by_type[n_max][k]) < 1.0) for n in (1, n_max)]
print(f"{'rest':40s} {rest[0]:8.2f} {rest[1]:8.2f} {rest[1] - rest[0]:+8.2f}   {small[0]:.0f} / {small[1]:.0f}")
