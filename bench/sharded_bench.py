"""Sharded benchmark: the op benchmark's workload trained with N = 1, 2, 4
replicas (MirroredStrategy over logical CPU devices of this machine).

Data (printed): 4 tables of 1,000,000 x 64 float32 with lazy Adam, global
batch 4096 split over the replicas, 20 ids per sample per table, Zipf(1.05),
sum combiner.

Then the same global batch on 2 worker processes of this machine (one
replica each): MultiWorkerMirroredStrategy (TF_CONFIG on 127.0.0.1) and
Horovod (`horovodrun -np 2 --gloo` in the Horovod environment, `make
hvd-env`, with tfde as installed there; skipped, and said so, where that
environment is missing); `--no-processes` leaves them out.

Each N > 1 and each runtime runs both exchanges of `ShardedLookup`:
"auto" (the default: each owner sums its rows of every sample, and the
replicas add the owners' partial sums) and "rows" (each replica's unique
ids out, their rows back, their gradients out).

Reports per N and exchange: training step time (median; the in-process
runs are timed in interleaved rounds, one step of each in turn) and its
ratio to the one-replica step (the median of the rounds' ratios), bytes
exchanged per step as counted by the communicator (what is sent to another
replica), for "rows" the bytes the same step would exchange without dedup (every id occurrence routed on its
own: the dedup's saving), and the balance of the shards: rows held and
rows served per shard per step. Writes bench/results/sharded_bench.png
(step time and bytes per N, rows served per shard). `--quick` shrinks the
tables and batch.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

MAX_REPLICAS = 4
# A worker process (--worker) is one replica on its own CPU.
if "--worker" not in sys.argv:
  _cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
      _cpu, [tf.config.LogicalDeviceConfiguration()] * MAX_REPLICAS)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from workload import parse_args  # noqa: E402  (bench/ is the script's dir)
from workload import replica_train_step  # noqa: E402  (bench/ is the script's dir)
from workload import timed  # noqa: E402  (bench/ is the script's dir)

import tfde  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def time_steps(strategy, lookup, inputs, reps):
  """(median ms, bytes this process sent) of a lazy-Adam training step of
  `lookup` on `inputs` under `strategy` (the tables' optimizers run in the
  backward); every process of a multi-process run calls it in step."""
  step, sent = warmed_step(strategy, lookup, inputs)
  return timed(step, reps, warmup=0), sent


def warmed_step(strategy, lookup, inputs):
  """(a step of `lookup` on `inputs` under `strategy`, traced and run
  twice; the bytes this process sent in the second run)."""
  step = replica_train_step(strategy, lookup)
  step(inputs)
  lookup.comm.reset_bytes_sent()
  step(inputs)
  return (lambda: step(inputs)), lookup.comm.bytes_sent()


def build(num_replicas, work, ids, exchange):
  """A warmed training step on `num_replicas` replicas (MirroredStrategy
  over logical CPUs) and what it exchanges: dict(n, exchange, step, bytes,
  no_dedup, served, rows_held)."""
  tables, batch = work.tables, work.batch
  per = batch // num_replicas
  strategy = tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(num_replicas)])
  with strategy.scope():
    lookup = tfde.lookup.ShardedLookup(work.feature_configs(), exchange=exchange)

  def replica_slice(ctx):
    r = ctx.replica_id_in_sync_group
    return {f"f{t}": tf.constant(ids[t][r * per:(r + 1) * per]) for t in range(tables)}

  inputs = strategy.experimental_distribute_values_from_function(replica_slice)
  step, bytes_per_step = warmed_step(strategy, lookup, inputs)
  no_dedup, served = no_dedup_bytes(work, ids, num_replicas)
  rows_held = [int(s.shape[0]) for s in lookup.tables["t0"].local_variables()]
  return dict(n=num_replicas, exchange=exchange, step=step,
              bytes=bytes_per_step, no_dedup=no_dedup, served=served.tolist(),
              rows_held=rows_held)


def time_interleaved(runs, reps):
  """Each run's median step ms (its "ms"), and its "ratio": the median over
  rounds of its step over the one-replica step of the same round (the
  first run's). Every round times one step of each run in turn, so that a slower or busier
  spell of the machine falls on every run alike rather than on whichever
  ran then (timed one run after another, the 4-replica ratio of three runs
  on one quiet host was 1.23, 1.33 and 1.20)."""
  times = [[] for _ in runs]
  for k in range(reps):
    # Each round starts at another run, so none always follows the same one.
    for i in [(k + j) % len(runs) for j in range(len(runs))]:
      start = time.perf_counter()
      runs[i]["step"]()
      times[i].append((time.perf_counter() - start) * 1e3)
  one = times[0]
  for r, ms in zip(runs, times):
    r["ms"] = float(np.median(ms))
    r["ratio"] = float(np.median(np.array(ms) / np.array(one)))
    del r["step"]


def no_dedup_bytes(work, ids, num_replicas):
  """Bytes the step would exchange without dedup: every id occurrence on a
  replica whose owner is another replica travels on its own (id out, row
  back, gradient out); and the unique rows each shard serves."""
  per = work.batch // num_replicas
  total, served = 0, np.zeros(num_replicas)
  for t in range(work.tables):
    for r in range(num_replicas):
      local = ids[t][r * per:(r + 1) * per].ravel()
      owner = local % num_replicas
      total += int(np.sum(owner != r)) * (8 + 2 * work.dim * 4)
      served += np.bincount(np.unique(local) % num_replicas, minlength=num_replicas)
  return total, served


def worker_main(args, work, ids):
  """One worker process of `run_processes`: its replica's share of the
  global batch, timed in step with the other worker; writes its step time
  and the bytes it sent to --worker-out."""
  if args.worker == "mwms":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank, n = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync
  else:
    import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
    hvd.init()
    strategy, rank, n = tf.distribute.get_strategy(), hvd.rank(), hvd.size()
  with strategy.scope():
    lookup = tfde.lookup.ShardedLookup(work.feature_configs(), exchange=args.exchange)
  per = work.batch // n
  inputs = {f"f{t}": tf.constant(ids[t][rank * per:(rank + 1) * per])
            for t in range(work.tables)}

  ms, sent = time_steps(strategy, lookup, inputs, args.reps)
  with open(os.path.join(args.worker_out, f"worker_{rank}.json"), "w") as f:
    json.dump(dict(ms=ms, bytes=sent, n=n), f)


def wait_all(procs, timeout=1800):
  """The exit codes of `procs` (each in a session of its own, or a plain
  worker), waiting at most `timeout` seconds in all; when one fails or
  time runs out, the rest (and their process groups) are killed rather
  than left waiting on a dead peer."""
  deadline = time.monotonic() + timeout
  codes = [None] * len(procs)
  try:
    while None in codes and time.monotonic() < deadline:
      for i, p in enumerate(procs):
        codes[i] = p.poll()
      if any(c not in (None, 0) for c in codes):
        break
      time.sleep(0.5)
  finally:
    for i, p in enumerate(procs):
      if p.poll() is None:
        try:
          os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
          p.kill()
        p.wait()
        codes[i] = "killed"
  return codes


def run_processes(mode, args, work, ids, exchange):
  """2 worker processes under `mode` ("mwms" or "horovod") exchanging as
  `exchange` says: dict(n, ms:
  worker 0's median step, bytes: both workers' sent bytes a step), or a
  string saying why it did not run."""
  here = os.path.dirname(os.path.abspath(__file__))
  out = tempfile.mkdtemp()
  try:
    argv_tail = ["--worker", mode, "--worker-out", out, "--reps", str(args.reps),
                 "--exchange", exchange] + (["--quick"] if args.quick else [])
    if mode == "mwms":
      sockets = [socket.socket() for _ in range(2)]
      for sock in sockets:
        sock.bind(("127.0.0.1", 0))
      cluster = {"worker": [f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]}
      for sock in sockets:
        sock.close()
      procs = [subprocess.Popen(
          [sys.executable, os.path.abspath(__file__)] + argv_tail,
          env=dict(os.environ, TF_CONFIG=json.dumps(
              {"cluster": cluster, "task": {"type": "worker", "index": i}})))
               for i in range(2)]
      codes = wait_all(procs)
    else:
      venv = os.environ.get("TFDE_HOROVOD_VENV",
                            os.path.join(os.path.dirname(here), ".venv-hvd"))
      horovodrun = os.path.join(venv, "bin", "horovodrun")
      if not os.path.exists(horovodrun):
        return f"no {horovodrun} (make hvd-env)"
      # This checkout's tfde on the op library compiled against that
      # environment's TensorFlow (tools/envs.py ops hvd).
      repo = os.path.dirname(here)
      library = os.environ.get("TFDE_HOROVOD_OPS_LIBRARY",
                               os.path.join(repo, "build", "ops", "hvd", "_tfde_ops.so"))
      env = dict(os.environ, PYTHONPATH=repo, TFDE_OPS_LIBRARY=library,
                 PATH=os.path.join(venv, "bin") + os.pathsep + os.environ["PATH"])
      # A session of its own: horovodrun and the ranks it starts go together.
      codes = wait_all([subprocess.Popen(
          [horovodrun, "-np", "2", "--gloo", "-H", "localhost:2",
           os.path.join(venv, "bin", "python"), os.path.join(here, "sharded_bench.py")]
          + argv_tail, env=env, cwd=out, start_new_session=True)])
    if any(codes):
      return f"a worker failed: exit codes {codes}"
    workers = []
    for i in range(2):
      with open(os.path.join(out, f"worker_{i}.json")) as f:
        workers.append(json.load(f))
    return dict(n=2, ms=workers[0]["ms"], bytes=sum(w["bytes"] for w in workers))
  finally:
    shutil.rmtree(out, ignore_errors=True)


def plot(results, path):
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    print("matplotlib missing: no plot")
    return
  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  one = [r for r in results if r["n"] == 1]
  ns = sorted({r["n"] for r in results})
  for exchange, style in (("auto", "o-"), ("rows", "s-")):
    runs = one + [r for r in results if r["n"] > 1 and r["exchange"] == exchange]
    label = "partial sums (auto)" if exchange == "auto" else "rows of unique ids"
    axes[0].plot([r["n"] for r in runs], [r["ms"] for r in runs], style, label=label)
    axes[1].plot([r["n"] for r in runs], [r["bytes"] / 1e6 for r in runs], style,
                 label=label)
  axes[0].plot(ns, [one[0]["ms"] * 1.25] * len(ns), ":", color="gray",
               label="1.25x one replica")
  axes[0].set(title="training step (lazy Adam)", xlabel="replicas", ylabel="ms",
              xticks=ns, ylim=(0, None))
  axes[0].legend()
  rows = one + [r for r in results if r["n"] > 1 and r["exchange"] == "rows"]
  axes[1].plot([r["n"] for r in rows], [r["no_dedup"] / 1e6 for r in rows], "^--",
               label="rows, no dedup")
  axes[1].set(title="bytes exchanged per step", xlabel="replicas", ylabel="MB",
              xticks=ns)
  axes[1].legend()
  last = results[-1]
  axes[2].bar(range(last["n"]), last["served"])
  axes[2].set(title=f"rows served per shard per step (N={last['n']})",
              xlabel="shard", ylabel="rows", xticks=range(last["n"]))
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=100)
  print(f"wrote {path}")


def main():
  args, work = parse_args(__doc__, reps=5, extra=[
      ("--no-processes", dict(action="store_true",
                              help="leave out the 2-worker-process runs")),
      ("--worker", dict(default=None, choices=["mwms", "horovod"],
                        help="(internal) one worker process of that runtime")),
      ("--worker-out", dict(default=None, help="(internal) where a worker writes")),
      ("--exchange", dict(default="auto", choices=["auto", "rows"],
                          help="(internal) a worker's exchange"))])
  ids = work.ids(seed=0)
  if args.worker:
    worker_main(args, work, ids)
    return
  print(f"data: {work.describe()} (global batch, split over the replicas); "
        f"TF {tf.__version__}, {os.cpu_count()} cores, replicas are logical "
        f"CPU devices of one process; median of {args.reps} rounds, one step of "
        "each run in turn")
  results = [build(n, work, ids, exchange) for n, exchange in
             ((1, "auto"), (2, "auto"), (2, "rows"), (4, "auto"), (4, "rows"))]
  time_interleaved(results, args.reps)
  for r in results:
    n, exchange = r["n"], r["exchange"]
    balance = max(r["served"]) / (sum(r["served"]) / n)
    saving = "" if exchange == "auto" or n == 1 else (
        f" (no dedup {r['no_dedup'] / 1e6:6.2f} MB, "
        f"{r['no_dedup'] / max(r['bytes'], 1):5.1f}x more)")
    print(f"N={n}{'' if n == 1 else ', exchange ' + repr(exchange)}: step "
          f"{r['ms']:7.1f} ms ({r['ratio']:.2f}x one replica) | exchanged "
          f"{r['bytes'] / 1e6:6.2f} MB/step{saving} | rows held per shard "
          f"{r['rows_held']} | rows served per shard {[int(x) for x in r['served']]} "
          f"(max/mean {balance:.2f})")
  if not args.no_processes:
    one = results[0]["ms"]
    no_dedup, _ = no_dedup_bytes(work, ids, 2)
    for mode, label in (("mwms", "MultiWorkerMirroredStrategy"), ("horovod", "Horovod (Gloo)")):
      for exchange in ("auto", "rows"):
        r = run_processes(mode, args, work, ids, exchange)
        if isinstance(r, str):
          print(f"2 processes, {label}, exchange {exchange!r}: skipped: {r}")
          continue
        saving = "" if exchange == "auto" else (
            f" (no dedup {no_dedup / 1e6:6.2f} MB, {no_dedup / max(r['bytes'], 1):5.1f}x more)")
        print(f"2 processes, {label}, exchange {exchange!r}: step {r['ms']:7.1f} ms "
              f"({r['ms'] / one:.2f}x the one-replica step) | exchanged "
              f"{r['bytes'] / 1e6:6.2f} MB/step{saving}")
  plot(results, os.path.join(RESULTS, "sharded_bench.png"))


if __name__ == "__main__":
  main()
