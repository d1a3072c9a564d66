"""Planner benchmark: many tables of mixed sizes, widths and hotness,
trained on 2 and 4 replicas (MirroredStrategy over logical CPU devices of
this machine) under the planner's layout and under the simple ones: every
table row-wise, every table table-wise (owners balanced by the planner's
estimate, largest first), every table replicated (where memory allows).

Data (printed): `--tables` tables (default 48) with vocabularies
log-uniform from 100 to `--max-rows` (default 200,000), widths 8 to 64,
1 to 30 ids per sample (ragged, Zipf(1.1) ids scattered over the
vocabulary), Adagrad, sum combiner; global batch 1024.

`--workers 2` also runs 2 replicas as 2 worker processes
(MultiWorkerMirroredStrategy over 127.0.0.1, one replica each, this
script started once per worker), the same layouts timed the same way.

Reports per N and layout: training step time (median of `--reps`, the layouts' steps timed in turns), bytes
sent to other replicas per step (the communicator's count), rows + slots
held per replica (max and balance = max / mean), the planner's estimated
step, and the kinds used. Writes bench/results/planner_bench.png and
bench/results/planner_bench.json. `--quick`: 16 tables up to 20,000 rows.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

MAX_REPLICAS = 4
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * MAX_REPLICAS)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from workload import replica_train_step  # noqa: E402  (bench/ is the script's directory)

import tfde  # noqa: E402
from tfde import planner  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
BATCH = 1024
WIDTHS = (8, 16, 32, 64)


def workload(num_tables, max_rows, seed=0):
  """(feature configs, global batch of ragged ids per feature)."""
  rng = np.random.default_rng(seed)
  configs, ids = [], {}
  for t in range(num_tables):
    rows = int(np.exp(rng.uniform(np.log(100), np.log(max_rows))))
    width = int(rng.choice(WIDTHS))
    pooling = int(rng.integers(1, 31)) if t % 3 else 1
    name = f"t{t:02d}"
    configs.append(tfde.FeatureConfig(name=f"f{t:02d}", table=tfde.TableConfig(
        name=name, vocabulary_size=rows, embedding_dim=width, combiner="sum",
        optimizer=tfde.optimizers.Adagrad(learning_rate=0.01), seed=t)))
    lengths = rng.integers(1, pooling + 1, size=BATCH)
    ranks = (rng.zipf(1.1, size=int(lengths.sum())) - 1) % rows
    values = rng.permutation(rows)[ranks].astype(np.int64)
    ids[f"f{t:02d}"] = (values, lengths)
  return configs, ids


def ragged(values, lengths):
  return tf.RaggedTensor.from_row_lengths(values, lengths.astype(np.int64))


def replica_batches(ids, n):
  per = BATCH // n
  out = []
  for r in range(n):
    batch = {}
    for f, (values, lengths) in ids.items():
      splits = np.concatenate([[0], np.cumsum(lengths)])
      lo, hi = splits[r * per], splits[(r + 1) * per]
      batch[f] = ragged(values[lo:hi], lengths[r * per:(r + 1) * per])
    out.append(batch)
  return out


def held_bytes(lookup, n):
  """Bytes of rows and slots each replica holds, read off the variables."""
  held = np.zeros(n)
  for table in lookup.tables.values():
    for part in getattr(table, "slices", [table]):
      for r, shard in part.shards.items():
        count = int(np.prod(shard.shape))
        held[r] += count * 4 * (1 + len(part.slots[r]))
  return held


def build(n, configs, ids, plan, strategy=None):
  """(lookup, step function, its distributed inputs) for one layout; by
  default on n logical CPUs of this process."""
  strategy = strategy or tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
  with strategy.scope():
    lookup = tfde.lookup.ShardedLookup(configs, plan=plan)
  per = replica_batches(ids, n)
  inputs = strategy.experimental_distribute_values_from_function(
      lambda ctx: per[ctx.replica_id_in_sync_group])

  return lookup, replica_train_step(strategy, lookup), inputs


def run_all(n, configs, ids, layouts, reps, strategy=None):
  """Every layout's figures; the steps are timed in turns (one step of
  each layout per round), so a load change on this shared machine hits
  every layout alike."""
  built = {name: build(n, configs, ids, plan, strategy) for name, plan in layouts.items()}
  results = {}
  for name, (lookup, step, inputs) in built.items():
    step(inputs)
    lookup.comm.reset_bytes_sent()
    step(inputs)
    held = held_bytes(lookup, n)
    kinds = {}
    for layout in layouts[name].tables.values():
      kinds[layout.kind] = kinds.get(layout.kind, 0) + 1
    results[name] = dict(
        bytes_sent=int(lookup.comm.bytes_sent()), held=held.tolist(),
        held_max=int(held.max()),
        held_balance=planner.balance(held),
        estimated_ms=layouts[name].estimated_step_seconds * 1e3, kinds=kinds,
        groups=len(lookup._groups), times=[])  # pylint: disable=protected-access
  for _ in range(reps):
    for name, (_, step, inputs) in built.items():
      start = time.perf_counter()
      step(inputs)
      results[name]["times"].append(time.perf_counter() - start)
  for r in results.values():
    r["ms"] = float(np.median(r.pop("times")) * 1e3)
  return results


def plans(configs, ids, n, memory):
  sample = {f: ragged(v, l) for f, (v, l) in ids.items()}
  # The replicas are logical CPUs sharing this machine's cores.
  cost = planner.CostModel.logical_cpus(os.cpu_count())
  out = {"planner": planner.plan(configs, n, memory_per_replica_bytes=memory,
                                 sample_inputs=sample, cost_model=cost)}
  for kind in ("row_wise", "table_wise", "replicated"):
    simple = planner.simple_plan(configs, n, kind, sample_inputs=sample,
                                 cost_model=cost)
    if memory is None or max(simple.per_replica["bytes_held"]) <= memory:
      out["all " + kind] = simple
  # Row-wise exchanging rows, where "all row_wise" takes the lookup's rule
  # (partial sums for these undeclared features).
  rows = planner.simple_plan(configs, n, "row_wise", sample_inputs=sample,
                             cost_model=cost, exchange="rows")
  if "all row_wise" in out and n > 1:
    out["all row_wise, rows"] = rows
  return out


def plot(results, path):
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    print("matplotlib missing: no plot")
    return
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
  ns = list(dict.fromkeys(r["setting"] for r in results))
  names = list(dict.fromkeys(r["layout"] for r in results))
  width = 0.8 / len(names)
  for k, name in enumerate(names):
    rows = {r["setting"]: r for r in results if r["layout"] == name}
    xs = [i + k * width for i, n in enumerate(ns) if n in rows]
    for ax, key, scale in ((axes[0], "ms", 1), (axes[1], "bytes_sent", 1e-6),
                           (axes[2], "held_max", 2**-20)):
      ax.bar(xs, [rows[n][key] * scale for n in ns if n in rows], width, label=name)
  for ax, title, unit in ((axes[0], "training step (median)", "ms"),
                          (axes[1], "bytes sent to other replicas per step", "MB"),
                          (axes[2], "rows + slots held, fullest replica", "MiB")):
    ax.set(title=title, ylabel=unit, xticks=[i + 0.4 - width / 2 for i in range(len(ns))],
           xticklabels=ns)
  axes[0].legend()
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=100)
  print(f"wrote {path}")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--tables", type=int, default=48)
  parser.add_argument("--max-rows", type=int, default=200_000)
  parser.add_argument("--reps", type=int, default=15)
  parser.add_argument("--replicas", type=int, nargs="+", default=[2, 4])
  parser.add_argument("--memory-per-replica", type=int, default=None,
                      help="bytes per replica for the planner (default: none)")
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--workers", type=int, choices=[0, 2], default=0,
                      help="also run 2 replicas as 2 worker processes")
  parser.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
  parser.add_argument("--worker-out", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker_index is not None:
    return worker_main(args)
  if args.quick:
    args.tables, args.max_rows, args.reps = 16, 20_000, 7
  configs, ids = workload(args.tables, args.max_rows)
  total = sum(c.table.vocabulary_size * c.table.embedding_dim * 8 for c in configs)
  print(f"data: {args.tables} tables, {min(c.table.vocabulary_size for c in configs)} "
        f"to {max(c.table.vocabulary_size for c in configs)} rows, widths "
        f"{sorted({c.table.embedding_dim for c in configs})}, 1-30 ids per sample, "
        f"Zipf(1.1); Adagrad ({total / 2**20:.0f} MiB of rows + slots in all); "
        f"global batch {BATCH}; TF {tf.__version__}, {os.cpu_count()} cores, "
        f"replicas are logical CPU devices of one process; median of {args.reps}")
  results = []
  for n in args.replicas:
    for name, r in run_all(n, configs, ids, plans(configs, ids, n, args.memory_per_replica),
                           args.reps).items():
      r.update(n=n, layout=name, setting=f"{n} replicas")
      results.append(r)
      report(r)
  if args.workers:
    for r in run_workers(args):
      results.append(r)
      report(r)
  os.makedirs(RESULTS, exist_ok=True)
  with open(os.path.join(RESULTS, "planner_bench.json"), "w") as f:
    json.dump(results, f, indent=1)
  plot(results, os.path.join(RESULTS, "planner_bench.png"))


def report(r):
  print(f"{r['setting']:<18} {r['layout']:<15} step {r['ms']:8.1f} ms  "
        f"sent {r['bytes_sent'] / 1e6:7.2f} MB"
        f"  held max {r['held_max'] / 2**20:7.1f} MiB (balance {r['held_balance']:.2f})"
        f"  est. {r['estimated_ms']:.2f} ms  groups {r['groups']}  {r['kinds']}",
        flush=True)


def run_workers(args):
  """This script once per worker (TF_CONFIG on 127.0.0.1): worker 0's
  times, and the bytes sent and held of every worker together."""
  import socket  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  sockets = [socket.socket() for _ in range(args.workers)]
  for sock in sockets:
    sock.bind(("127.0.0.1", 0))
  cluster = {"worker": [f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]}
  for sock in sockets:
    sock.close()
  out = tempfile.mkdtemp()
  argv = [sys.executable, os.path.abspath(__file__), "--tables", str(args.tables),
          "--max-rows", str(args.max_rows), "--reps", str(args.reps), "--worker-out", out]
  if args.memory_per_replica:
    argv += ["--memory-per-replica", str(args.memory_per_replica)]
  procs = [subprocess.Popen(argv + ["--worker-index", str(i)], env=dict(
      os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {
          "type": "worker", "index": i}}))) for i in range(args.workers)]
  codes = [p.wait(timeout=3600) for p in procs]
  if any(codes):
    raise SystemExit(f"a worker failed: exit codes {codes}")
  per_worker = []
  for i in range(args.workers):
    with open(os.path.join(out, f"worker_{i}.json")) as f:
      per_worker.append(json.load(f))
  results = per_worker[0]
  for k, r in enumerate(results):
    # Each worker counted its own replica's bytes and rows.
    held = np.sum([w[k]["held"] for w in per_worker], axis=0)
    r.update(held=held.tolist(), held_max=int(held.max()),
             held_balance=planner.balance(held),
             bytes_sent=int(sum(w[k]["bytes_sent"] for w in per_worker)))
  return results


def worker_main(args):
  """One worker of `--workers`: the layouts for 2 replicas, one here."""
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  n = strategy.num_replicas_in_sync
  configs, ids = workload(args.tables, args.max_rows)
  results = []
  for name, r in run_all(n, configs, ids, plans(configs, ids, n, args.memory_per_replica),
                         args.reps, strategy).items():
    r.update(n=n, layout=name, setting=f"{n} worker processes")
    results.append(r)
  with open(os.path.join(args.worker_out, f"worker_{args.worker_index}.json"), "w") as f:
    json.dump(results, f)


if __name__ == "__main__":
  main()
