"""The export's dense sum in stock ops: one gather then a sum, against the
batch cut in chunks whose gathered rows stay in cache (alternating, ms)."""
import statistics, sys, time
sys.path.insert(0, "bench")
import numpy as np
import tensorflow as tf
from workload import Workload

work = Workload()
ids = work.ids(seed=0)
tables = [tf.Variable(tf.random.uniform([work.vocab, work.dim])) for _ in range(work.tables)]
inputs = [tf.constant(i) for i in ids]
import os
if os.environ.get("ADVISE"):
  import tfde
  print("advised", [int(x) for x in tfde.ops.advise_huge_pages(tables)])

def one_pass(table, x):
  return tf.reduce_sum(tf.gather(table, x), 1)

def chunked(k):
  def f(table, x):
    return tf.concat([tf.reduce_sum(tf.gather(table, c), 1) for c in tf.split(x, k)], 0)
  return f

variants = {"one pass": one_pass, **{f"chunks {k}": chunked(k) for k in (4, 8, 16, 32, 64)}}
fns = {name: tf.function(lambda xs, v=v: [v(t, x) for t, x in zip(tables, xs)])
       for name, v in variants.items()}
want = fns["one pass"](inputs)
for name, f in fns.items():
  got = f(inputs)
  assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(got, want)), name
  for _ in range(3): f(inputs)
rounds = {k: [] for k in fns}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
  for k, f in fns.items():
    t = time.perf_counter(); [o.numpy() for o in f(inputs)]
    rounds[k].append((time.perf_counter() - t) * 1e3)
for k, v in rounds.items():
  print(f"{k:10s} median {statistics.median(v):6.2f}  min {min(v):6.2f}")
if os.environ.get("XLA"):
  fx = tf.function(lambda xs: [one_pass(t, x) for t, x in zip(tables, xs)], jit_compile=True)
  got = fx(inputs)
  print("xla equal", all(np.allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-5) for a, b in zip(got, want)),
        "bit-equal", all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(got, want)))
  ts = []
  for _ in range(20):
    t = time.perf_counter(); [o.numpy() for o in fx(inputs)]; ts.append((time.perf_counter() - t) * 1e3)
  print(f"xla median {statistics.median(ts):.2f} min {min(ts):.2f}")
