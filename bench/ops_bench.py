"""Op benchmark: tfde's lookup and lazy-Adam training step, on the C++
kernels and on the pure-TF twins, against tf.nn.embedding_lookup_sparse +
keras.optimizers.Adam, measured in one run on this machine.

Data (stated in the output): 4 tables of 1,000,000 x 64 float32, batch
4096, 20 ids per sample per table, ids Zipf(1.05) folded into the
vocabulary, sum combiner. `--quick` shrinks tables and batch for a smoke run.

The peers (torch EmbeddingBag, FBGEMM TBE CPU; bench/peers_bench.py in
their own environment) are timed in `--peer-rounds` rounds, each followed
by tfde's forward and SGD, Adagrad, row-wise Adagrad and lazy-Adam steps
on the same ids; the ratios are of the medians over the rounds. After
them, tfde's first SGD, lazy-Adam and row-wise Adagrad steps are
cross-checked against theirs from the same tables (`step_cross_check`;
tests/unit/test_peers.py holds it in make test).

The training-step ratio against tf.nn + Keras Adam is printed twice: from
the medians above, and as the median of `--rounds` rounds that alternate
the two steps (5 tfde steps, then one Keras step), so that a slow spell of
a shared machine weighs on both sides alike.

Effective GB/s counts the bytes a lookup must move, the same for every
system: forward = unique rows read + ids' rows combined + outputs written;
a training step adds the output gradients read, the row gradients written,
and for Adam the table, m and v rows read and written. The step is also
timed on dynamic tables (bench/dynamic_bench.py), which keep a row's slots
beside it.

At one replica the kernels fuse the stages around the local compute
(tfde/lookup.py): the forward combines each id's row straight from its
table, and each optimizer sums a row's gradient from the output gradient as
it applies it. Neither the gathered rows nor a [rows, dim] gradient (52 MB
each here) is written, which matters on this machine: TF's CPU allocator
hands buffers that large back to the kernel, and each fresh 4 KiB page then
costs about 1.7 us to fault in again.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from workload import lookup_steps  # noqa: E402  (bench/ is the script's dir)
from workload import parse_args  # noqa: E402  (bench/ is the script's dir)
from workload import timed  # noqa: E402  (bench/ is the script's dir)

import tfde  # noqa: E402
import tfde.ops  # noqa: E402
from tfde.pipeline import batches  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# The peers' environment (torch CPU, fbgemm-gpu-cpu matched to it): `make peers-env`.
PEERS_PYTHON = os.environ.get(
    "TFDE_PEERS_PYTHON", os.path.join(os.path.dirname(HERE), ".venv-peers", "bin", "python"))


def run_peers(*argv, timeout=600):
  """bench/peers_bench.py in the peers' environment; its stdout, or None
  (with the reason printed) where that environment is missing or fails."""
  if not os.path.exists(PEERS_PYTHON):
    print(f"peers skipped: no {PEERS_PYTHON} (make peers-env)")
    return None
  # TFDE_PEERS_THREADS sets the peers' OpenMP threads: on a shared
  # machine their spinning threads can slow them tenfold.
  env = dict(os.environ)
  if os.environ.get("TFDE_PEERS_THREADS"):
    env["OMP_NUM_THREADS"] = os.environ["TFDE_PEERS_THREADS"]
  done = subprocess.run([PEERS_PYTHON, os.path.join(HERE, "peers_bench.py"), *argv],
                        capture_output=True, text=True, timeout=timeout, check=False,
                        env=env)
  if done.returncode:
    print(f"peers failed: {done.stderr[-2000:]}")
    return None
  return done.stdout


def with_optimizer(configs, optimizer):
  import dataclasses  # pylint: disable=g-import-not-at-top
  return {k: dataclasses.replace(f, table=dataclasses.replace(f.table, optimizer=optimizer))
          for k, f in configs.items()}


def step_cross_check(tmp, optimizer):
  """tfde's step-1 deltas of the touched rows against the peers' (torch for
  SGD and lazy Adam; FBGEMM for SGD and row-wise Adagrad, its CPU TBE
  having no Adam; torch has no row-wise Adagrad), from the same tables,
  ids, output gradients and learning rate, for "sgd", lazy "adam" or
  "rowwise_adagrad" (small tables: the check is of the computation, not
  its speed). Prints and returns {peer: (touched rows, max |delta
  difference|, largest |delta|)}, or None where the peers' environment is
  missing."""
  vocab, dim, batch, hot, num = 1000, 8, 64, 5, 2
  lr = 0.1 if optimizer == "sgd" else 0.01
  beta_1, beta_2, epsilon = 0.9, 0.999, 1e-7
  rng = np.random.default_rng(3)
  ids = [((rng.zipf(1.05, (batch, hot)) - 1) % vocab).astype(np.int64) for _ in range(num)]
  targets = [rng.normal(size=(batch, dim)).astype(np.float32) for _ in range(num)]
  hyper = {"sgd": {}, "adam": dict(beta_1=beta_1, beta_2=beta_2, epsilon=epsilon),
           "rowwise_adagrad": dict(epsilon=epsilon)}[optimizer]
  ours = tfde.optimizers.get(dict(kind=optimizer, learning_rate=lr, **hyper))
  configs = {f"f{t}": tfde.FeatureConfig(name=f"f{t}", table=tfde.TableConfig(
      name=f"t{t}", vocabulary_size=vocab, embedding_dim=dim,
      optimizer=ours, combiner="sum", initializer="uniform", seed=t)) for t in range(num)}
  lookup = tfde.lookup.ShardedLookup(configs)
  before = lookup.table_values()
  with tf.GradientTape() as tape:
    out = lookup({f"f{t}": tf.constant(ids[t]) for t in range(num)})
    loss = tf.add_n([tf.reduce_sum(out[f"f{t}"] * targets[t]) for t in range(num)])
  tape.gradient(loss, lookup.trainable_variables)
  after = lookup.table_values()
  case, result = os.path.join(tmp, "case.npz"), os.path.join(tmp, "after.npz")
  np.savez(case, tables=num, lr=lr, optimizer=optimizer, beta_1=beta_1, beta_2=beta_2,
           epsilon=epsilon,
           **{f"table_{t}": before[f"t{t}"] for t in range(num)},
           **{f"ids_{t}": ids[t] for t in range(num)},
           **{f"target_{t}": targets[t] for t in range(num)})
  if run_peers("step", case, result) is None:
    return None
  peers = np.load(result)
  label = {"sgd": "SGD", "adam": "lazy Adam", "rowwise_adagrad": "row-wise Adagrad"}[optimizer]
  lacks = {("adam", "fbgemm"): "no Adam on its CPU",
           ("rowwise_adagrad", "torch"): "no row-wise Adagrad in torch"}
  found = {}
  for peer in ("torch", "fbgemm"):
    if f"{peer}_0" not in peers:
      print(f"{label} step-1 cross-check vs {peer}: skipped "
            f"({lacks.get((optimizer, peer), 'not installed')})")
      continue
    worst, largest, rows = 0.0, 0.0, 0
    for t in range(num):
      touched = np.unique(ids[t])
      delta = (after[f"t{t}"] - before[f"t{t}"])[touched]
      theirs = (peers[f"{peer}_{t}"] - before[f"t{t}"])[touched]
      worst = max(worst, float(np.max(np.abs(delta - theirs))))
      largest = max(largest, float(np.max(np.abs(theirs))))
      untouched = np.setdiff1d(np.arange(vocab), touched)
      assert np.array_equal(after[f"t{t}"][untouched], before[f"t{t}"][untouched])
      assert np.array_equal(peers[f"{peer}_{t}"][untouched], before[f"t{t}"][untouched])
      rows += len(touched)
    status = "agree" if worst <= 1e-5 else "DIFFER"
    print(f"{label} step-1 cross-check vs {peer}: {rows} touched rows, max |delta "
          f"difference| {worst:.2e} (largest |delta| {largest:.2e}; {status})")
    found[peer] = (rows, worst, largest)
  return found


def profile(work, args):
  """Per-stage split of one step at one replica (tf.function timings of the
  stages on their own, same data), and a tf.profiler trace of a few steps."""
  lookup = tfde.lookup.ShardedLookup(work.feature_configs())
  ids = work.ids(seed=0)
  inputs = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
  group = lookup._groups[0]  # pylint: disable=protected-access
  flat = lookup.flatten(inputs)
  fused = group.fused_ids(flat)
  splits, weights, combiner = batches.as_one_batch(flat, ["sum"] * len(flat))
  grad = tf.ones([int(splits.shape[0]) - 1, work.dim])

  @tf.function
  def flatten_only():
    return group.fused_ids(lookup.flatten(inputs))

  @tf.function
  def dedup():  # the backward's, in row order
    return tfde.ops.sorted_unique_in_range(fused, group.layout.total_rows)

  @tf.function
  def combine():  # the forward's: each feature from its own table
    return group.combine_each_local(0, flat, ["sum"] * len(flat))

  unique, inverse = tfde.ops.sorted_unique_in_range(fused, group.layout.total_rows)

  @tf.function
  def dedup_then_combine():
    # The one-replica forward before it skipped the dedup, for comparison.
    u, inv, _ = tfde.ops.unique_with_counts(fused)
    return group.combine_local(0, u, inv, (splits, weights, combiner))

  @tf.function
  def bag_index():
    bags = tfde.ops.bag_gradients(grad, inverse, splits, weights, tf.size(unique), combiner)
    return bags.segments, bags.bags

  forward, train = lookup_steps(
      lookup, inputs, lambda out: tf.add_n([tf.reduce_sum(v) for v in out.values()]))

  stages = {"flatten + fuse ids": flatten_only, "dedup (sorted_unique_in_range)": dedup,
            "combine each feature from its table": combine,
            "dedup + combine from the unique rows (the old forward)": dedup_then_combine,
            "bag gradient index": bag_index,
            "forward (whole)": forward, "lazy Adam step (whole)": train}
  # Interleaved: one run of each stage per round, so that a slow spell of
  # a shared machine falls on every stage alike; medians over the rounds.
  for fn in stages.values():
    timed(fn, 1)
  rounds = {name: [] for name in stages}
  for _ in range(args.reps):
    for name, fn in stages.items():
      rounds[name].append(timed(fn, 1, warmup=0))
  times = {name: statistics.median(ms) for name, ms in rounds.items()}
  times["Adam apply + rest (step - forward - dedup - bag index)"] = (
      times["lazy Adam step (whole)"] - times["forward (whole)"]
      - times["dedup (sorted_unique_in_range)"] - times["bag gradient index"])
  print(f"profile of one step ({work.describe()}), median ms of {args.reps} "
        "interleaved rounds:")
  for name, ms in times.items():
    print(f"  {name:56s} {ms:8.2f}")
  logdir = os.path.join(tempfile.gettempdir(), "tfde_ops_profile")
  tf.profiler.experimental.start(logdir)
  for _ in range(3):
    train()
  tf.profiler.experimental.stop()
  print(f"tf.profiler trace of 3 steps: {logdir} (TensorBoard's profile tab)")


def main():
  args, work = parse_args(__doc__, reps=7, extra=[
      ("--rounds", dict(type=int, default=5,
                        help="alternating rounds of the tfde and Keras Adam steps")),
      ("--peer-rounds", dict(type=int, default=3,
                             help="rounds of the peers alternating with tfde's timings")),
      ("--profile", dict(action="store_true",
                         help="only the per-stage split of one step, and a trace")),
      ("--no-peers", dict(action="store_true",
                          help="skip torch and FBGEMM (bench/peers_bench.py)"))])
  if args.profile:
    profile(work, args)
    return
  tables, vocab, dim, batch, hot = (work.tables, work.vocab, work.dim,
                                    work.batch, work.hot)
  ids = work.ids(seed=0)
  unique = [len(np.unique(x)) for x in ids]
  print(f"data: {work.describe()}; unique ids per table {unique}; "
        f"TF {tf.__version__}, {os.cpu_count()} cores; median of {args.reps}")

  fwd_bytes, train_bytes = work.moved_bytes(unique)
  inputs, loss_of = work.feed(seed=0)
  results = {}

  # tfde, both backends: the real pipeline (ShardedLookup, one replica).
  for backend in (tfde.ops.KERNELS, tfde.ops.REFERENCE):
    with tfde.ops.backend(backend):
      lookup = tfde.lookup.ShardedLookup(work.feature_configs())
      forward, train = lookup_steps(lookup, inputs, loss_of)

      results[f"tfde {backend} forward"] = timed(forward, args.reps)
      results[f"tfde {backend} train (lazy Adam)"] = timed(train, args.reps)
      if backend == tfde.ops.KERNELS:
        kernel_train, kernel_forward = train, forward
      if backend != tfde.ops.KERNELS:
        del lookup  # the kernels' tables stay for the interleaved rounds

  # The peers' optimizers on tfde, for the ratios against FBGEMM and torch
  # (their tables kept for the rounds with the peers).
  compared = {"forward": kernel_forward, "lazy Adam step": kernel_train}
  with tfde.ops.backend(tfde.ops.KERNELS):
    for name, optimizer in (("SGD", tfde.optimizers.SGD(learning_rate=0.01)),
                            ("Adagrad", tfde.optimizers.Adagrad(learning_rate=0.01)),
                            ("row-wise Adagrad", tfde.optimizers.RowwiseAdagrad(
                                learning_rate=0.01, epsilon=1e-7))):
      lookup = tfde.lookup.ShardedLookup(with_optimizer(work.feature_configs(), optimizer))
      _, train_other = lookup_steps(lookup, inputs, loss_of)
      results[f"tfde kernels train ({name})"] = timed(train_other, args.reps)
      compared[f"{name} step"] = train_other

  # The peers, in their own environment, on the same ids, in rounds that
  # alternate with tfde's timings of the compared steps: a slow spell of
  # this shared machine (which has moved a peer's median fourfold between
  # runs) then falls on both sides. Medians over the rounds.
  peers, peer_rounds, tfde_rounds = {}, [], {name: [] for name in compared}
  if not args.no_peers:
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "ids.npz")
      np.savez(path, tables=tables, vocab=vocab, dim=dim,
               **{f"ids_{t}": ids[t] for t in range(tables)})
      for _ in range(args.peer_rounds):
        out = run_peers("time", path, str(args.reps))
        if not out:
          break
        peer_rounds.append(json.loads(out.strip().splitlines()[-1]))
        with tfde.ops.backend(tfde.ops.KERNELS):
          for name, fn in compared.items():
            tfde_rounds[name].append(timed(fn, args.reps))
      step_cross_check(tmp, "sgd")
      step_cross_check(tmp, "adam")
      step_cross_check(tmp, "rowwise_adagrad")
    if peer_rounds:
      peers = {name: statistics.median(r[name] for r in peer_rounds)
               for name in peer_rounds[0]}
      for name, ms in tfde_rounds.items():
        results[f"tfde kernels {name}, rounds with the peers"] = statistics.median(ms)

  # The same step on dynamic tables (ids hashed to 64-bit keys; rows made as
  # they arrive, slots beside each row).
  from dynamic_bench import train_step_ms  # pylint: disable=g-import-not-at-top
  with tfde.ops.backend(tfde.ops.KERNELS):
    results["tfde kernels train, dynamic tables"] = train_step_ms(work, True, args.reps)[0]

  # Baseline: tf.nn.embedding_lookup_sparse, Keras Adam / SGD.
  import keras  # pylint: disable=g-import-not-at-top
  variables = [tf.Variable(tf.random.uniform((vocab, dim), -0.05, 0.05, seed=t))
               for t in range(tables)]
  sparse = []
  for t in range(tables):
    idx = np.stack(np.meshgrid(np.arange(batch), np.arange(hot), indexing="ij"), -1)
    sparse.append(tf.SparseTensor(idx.reshape(-1, 2), ids[t].reshape(-1),
                                  [batch, hot]))

  def baseline_outputs():
    return {f"f{t}": tf.nn.embedding_lookup_sparse(variables[t], sparse[t], None,
                                                   combiner="sum")
            for t in range(tables)}

  baseline_forward = tf.function(baseline_outputs)
  for name, optimizer in (("Adam", keras.optimizers.Adam(0.001)),
                          ("SGD", keras.optimizers.SGD(0.01))):
    optimizer.build(variables)

    @tf.function
    def baseline_train(optimizer=optimizer):
      with tf.GradientTape() as tape:
        loss = loss_of(baseline_outputs())
      grads = tape.gradient(loss, variables)
      optimizer.apply(grads, variables)
      return loss

    results[f"tf.nn + Keras {name} train"] = timed(
        baseline_train, max(3, args.reps // 2) if name == "Adam" else args.reps,
        warmup=1)
    if name == "Adam":
      adam_train = baseline_train
  # The target ratio again, from rounds that alternate the two steps, so a
  # slow spell of this shared machine falls on both.
  round_ratios = []
  with tfde.ops.backend(tfde.ops.KERNELS):
    for _ in range(args.rounds):
      tfde_ms = timed(kernel_train, 5, warmup=1)
      round_ratios.append(timed(adam_train, 1, warmup=0) / tfde_ms)
  results["tf.nn forward"] = timed(baseline_forward, args.reps)

  print(f"{'system':36s} {'ms':>9s} {'GB/s':>7s}")
  for name, ms in list(results.items()) + list(peers.items()):
    moved = train_bytes if ("train" in name or "step" in name) else fwd_bytes
    print(f"{name:36s} {ms:9.1f} {moved / ms / 1e6:7.2f}")
  k_fwd, r_fwd = results["tfde kernels forward"], results["tfde reference forward"]
  k_train = results["tfde kernels train (lazy Adam)"]
  print("ratios:")
  print(f"  kernel forward vs twin forward:          {r_fwd / k_fwd:6.2f}x faster "
        "(target >= 2x)")
  print(f"  kernel forward vs tf.nn forward:         "
        f"{results['tf.nn forward'] / k_fwd:6.2f}x faster")
  print(f"  kernel train vs tf.nn + Keras Adam:      "
        f"{results['tf.nn + Keras Adam train'] / k_train:6.2f}x faster (target >= 20x)")
  label = f"the same, alternating ({args.rounds} rounds):"
  print(f"  {label:41s}{statistics.median(round_ratios):6.2f}x faster (median; "
        f"min {min(round_ratios):.2f}x, max {max(round_ratios):.2f}x)")
  print(f"  kernel train vs tf.nn + Keras SGD:       "
        f"{results['tf.nn + Keras SGD train'] / k_train:6.2f}x faster")
  print(f"  kernel train vs twin train:              "
        f"{results['tfde reference train (lazy Adam)'] / k_train:6.2f}x faster")
  if peers:
    print(f"peers (same ids, {len(peer_rounds)} rounds alternating with tfde's timings; "
          "medians over the rounds; ratio = tfde ms / peer ms, < 1: tfde faster; "
          "in brackets the lowest and highest ratio of one round):")
    pairs = [("forward", "torch EmbeddingBag forward"),
             ("forward", "FBGEMM TBE forward"),
             ("SGD step", "torch EmbeddingBag + SGD step"),
             ("SGD step", "FBGEMM TBE EXACT_SGD step"),
             ("Adagrad step", "FBGEMM TBE EXACT_ROWWISE_ADAGRAD step"),
             ("row-wise Adagrad step", "FBGEMM TBE EXACT_ROWWISE_ADAGRAD step"),
             ("lazy Adam step", "FBGEMM TBE EXACT_ROWWISE_ADAGRAD step")]
    for what, peer in pairs:
      if peer in peers:
        ours = statistics.median(tfde_rounds[what])
        each = [t / r[peer] for t, r in zip(tfde_rounds[what], peer_rounds)]
        print(f"  tfde {what:21s} {ours:8.1f} ms vs {peer:40s} {peers[peer]:8.1f} ms: "
              f"{ours / peers[peer]:5.2f} [{min(each):.2f}, {max(each):.2f}]")
  print(f"  dynamic-table train vs tf.nn + Keras Adam: "
        f"{results['tf.nn + Keras Adam train'] / results['tfde kernels train, dynamic tables']:6.2f}x faster")


if __name__ == "__main__":
  main()
