"""GPU benchmark inside TensorFlow: tfde's lookup and training steps with the
tables on a GPU (the real pipeline, `ShardedLookup`, under no strategy and
MirroredStrategy over the GPU), against tf.nn.embedding_lookup_sparse and,
in a subprocess of the same run on the same GPU, torch `nn.EmbeddingBag`
(FBGEMM TBE too where `fbgemm_gpu` imports there).

Data (stated in the output): 4 tables of 1,000,000 x 64 float32, 20 ids per
sample per table, sum combiner; the benchmarks' batch of 4,096 with
Zipf(1.05) ids (bench/workload.py), and a batch of 65,536 with Zipf and
with uniform ids, which is large enough for the lookup to be bound by the
GPU's memory rather than by launches. Times are the mean of `--reps` steps
issued back to back and synchronised once (the GPU's throughput), after
warm-up steps. Effective GB/s counts the bytes ops_bench counts (unique
rows read, every id's row combined, outputs written; a lazy-Adam step adds
the gradients and the table, m and v rows); the fraction of HBM is against
the device-to-device copy torch measures in the same run (bytes read and
written), and against the card's nominal bandwidth where it is known.

  TF_FORCE_GPU_ALLOW_GROWTH=true python bench/gpu_bench.py [--quick] [--reps 50]
"""

import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from workload import Workload  # noqa: E402  (bench/ is the script's dir)
from workload import lookup_steps  # noqa: E402  (bench/ is the script's dir)

# TFDE_GPU_BENCH_AS=CPU: a dry run of this script's logic on a CPU.
DEVICE_TYPE = os.environ.get("TFDE_GPU_BENCH_AS", "GPU")
# Nominal HBM bandwidth (GB/s) of the cards this has run on.
NOMINAL_GBPS = {"H100 80GB HBM3": 3350, "H100 PCIe": 2000, "H200": 4800, "A100-SXM4-80GB": 2039}


def mean_ms(fn, reps, sync, warmup=3):
  """Milliseconds per call of `fn` over `reps` calls issued back to back,
  `sync(output)` waiting for the device once at the end (after warm-up)."""
  for _ in range(warmup):
    out = fn()
  sync(out)
  start = time.perf_counter()
  for _ in range(reps):
    out = fn()
  sync(out)
  return (time.perf_counter() - start) / reps * 1e3


def tf_sync(out):
  """Waits for the device: reads one element of the first output back."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  np.asarray(tf.nest.flatten(out)[0][:1])


def workloads(quick):
  if quick:
    base = Workload.quick()
    return [("quick, Zipf", base, base.ids(seed=0))]
  base, big = Workload(), Workload(batch=65_536)
  rng = np.random.default_rng(7)
  uniform = [rng.integers(0, big.vocab, (big.batch, big.hot)).astype(np.int64)
             for _ in range(big.tables)]
  return [("batch 4096, Zipf(1.05)", base, base.ids(seed=0)),
          ("batch 65536, Zipf(1.05)", big, big.ids(seed=0)),
          ("batch 65536, uniform", big, uniform)]


# ---- torch on the same GPU (run as a subprocess: `gpu_bench.py --torch`)

def torch_side(path, reps):
  import torch  # pylint: disable=g-import-not-at-top
  data = np.load(path)
  num_tables, vocab, dim = int(data["tables"]), int(data["vocab"]), int(data["dim"])
  cuda = torch.cuda.is_available()
  dev = torch.device("cuda" if cuda else "cpu")   # cpu: a dry run only
  sync = torch.cuda.synchronize if cuda else (lambda: None)
  out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0) if cuda else "cpu"}

  def torch_ms(fn):
    return mean_ms(fn, reps, lambda _: sync(), warmup=5)

  # The copy bandwidth this card reaches (bytes read and written).
  x = torch.empty(1 << (30 if cuda else 24), dtype=torch.uint8, device=dev)
  y = torch.empty_like(x)
  out["copy GB/s"] = 2 * x.numel() / torch_ms(lambda: y.copy_(x)) / 1e6
  x = y = None  # frees the buffers (the lambda above reads them)
  for w in range(int(data["workloads"])):
    ids = [torch.from_numpy(data[f"ids_{w}_{t}"]).to(dev) for t in range(num_tables)]
    batch = ids[0].shape[0]
    gen = torch.Generator(device=dev).manual_seed(0)
    bags = [torch.nn.EmbeddingBag(vocab, dim, mode="sum", sparse=True, device=dev)
            for _ in ids]
    targets = [torch.randn(batch, dim, generator=gen, device=dev) for _ in ids]
    res = {}

    def forward():
      with torch.no_grad():
        return [b(x) for b, x in zip(bags, ids)]

    res["torch EmbeddingBag forward"] = torch_ms(forward)
    for name, opt in (("SGD", torch.optim.SGD([b.weight for b in bags], lr=0.01)),
                      ("SparseAdam", torch.optim.SparseAdam([b.weight for b in bags],
                                                            lr=0.001))):
      def step(opt=opt):
        opt.zero_grad(set_to_none=True)
        loss = sum((b(x) * y).sum() for b, x, y in zip(bags, ids, targets))
        loss.backward()
        opt.step()
      res[f"torch EmbeddingBag + {name} step"] = torch_ms(step)
    try:
      import fbgemm_gpu  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
      res["FBGEMM"] = "importable but not timed here"
    except ImportError as e:
      out.setdefault("fbgemm_gpu", f"not importable: {e}")
    out[str(w)] = res
    bags = ids = targets = None  # frees them (closures above read them)
    if cuda:
      torch.cuda.empty_cache()
  print(json.dumps(out))


# ---- tfde and tf.nn inside TensorFlow

def main():
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--reps", type=int, default=50)
  parser.add_argument("--torch", help=argparse.SUPPRESS)
  parser.add_argument("--no-torch", action="store_true")
  parser.add_argument("--profile", action="store_true",
                      help="only the per-stage split of one step at batch 65,536 "
                      "(uniform ids), and the ops a tf.profiler trace spends it in")
  args = parser.parse_args()
  if args.torch:
    torch_side(args.torch, args.reps)
    return
  if args.profile:
    profile(args)
    return

  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import tfde  # pylint: disable=g-import-not-at-top
  import tfde.ops  # pylint: disable=g-import-not-at-top
  gpus = tf.config.list_logical_devices(DEVICE_TYPE)
  if not gpus:
    sys.exit(f"gpu_bench: TensorFlow {tf.__version__} sees no GPU "
             f"(built with CUDA: {tf.test.is_built_with_cuda()})")
  if not tfde.ops.kernels_available():
    sys.exit(f"gpu_bench: tfde's op library did not load: {tfde.ops.native.load_error()}")
  from ops_bench import with_optimizer  # pylint: disable=g-import-not-at-top
  gpu = tf.config.experimental.get_device_details(
      tf.config.list_physical_devices(DEVICE_TYPE)[0]).get("device_name", DEVICE_TYPE)
  cases = workloads(args.quick)
  print(f"device: {gpu}; TensorFlow {tf.__version__} (CUDA "
        f"{tf.sysconfig.get_build_info().get('cuda_version')}); mean of {args.reps} steps")

  peers = {}
  if not args.no_torch:
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "ids.npz")
      work = cases[0][1]
      np.savez(path, tables=work.tables, vocab=work.vocab, dim=work.dim,
               workloads=len(cases),
               **{f"ids_{w}_{t}": ids[t] for w, (_, _, ids) in enumerate(cases)
                  for t in range(work.tables)})
      run = subprocess.run([sys.executable, __file__, "--torch", path, "--reps",
                            str(args.reps)], capture_output=True, text=True, timeout=900)
      if run.returncode:
        print(f"torch skipped: {run.stderr.strip().splitlines()[-1:]}")
      else:
        peers = json.loads(run.stdout.strip().splitlines()[-1])

  def tf_ms(fn):
    return mean_ms(fn, args.reps, tf_sync)

  copy = peers.get("copy GB/s")
  nominal = next((v for k, v in NOMINAL_GBPS.items() if k in gpu), None)
  for w, (label, work, ids) in enumerate(cases):
    unique = [len(np.unique(x)) for x in ids]
    fwd_bytes, train_bytes = work.moved_bytes(unique)
    described = work.describe()
    if "uniform" in label:
      described = described.replace(f"Zipf({work.alpha})", "uniform ids")
    print(f"\n== {label}: {described}; unique ids per table {unique}")
    results = {}
    with tf.device(gpus[0].name):
      inputs = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
      rng = np.random.default_rng(1)
      targets = {f"f{t}": tf.constant(rng.normal(size=(work.batch, work.dim)), tf.float32)
                 for t in range(work.tables)}

    def loss_of(outputs):
      return tf.add_n([tf.reduce_sum(outputs[k] * targets[k]) for k in outputs])

    for name, optimizer in (("lazy Adam", tfde.optimizers.Adam(learning_rate=0.001)),
                            ("SGD", tfde.optimizers.SGD(learning_rate=0.01)),
                            ("Adagrad", tfde.optimizers.Adagrad(learning_rate=0.01))):
      configs = with_optimizer(work.feature_configs(), optimizer)
      with tf.device(gpus[0].name):
        lookup = tfde.lookup.ShardedLookup(configs)
      assert DEVICE_TYPE in lookup.tables["t0"].shards[0].device
      forward, train = lookup_steps(lookup, inputs, loss_of)

      if name == "lazy Adam":
        results["tfde forward"] = tf_ms(forward)
      results[f"tfde {name} step"] = tf_ms(train)
      del lookup, forward, train

    strategy = tf.distribute.MirroredStrategy([gpus[0].name])
    with strategy.scope():
      lookup = tfde.lookup.ShardedLookup(work.feature_configs())

      forward, train = lookup_steps(lookup, inputs, loss_of)
    results["tfde forward, MirroredStrategy"] = tf_ms(
        tf.function(lambda: strategy.run(forward)))
    results["tfde lazy Adam step, MirroredStrategy"] = tf_ms(
        tf.function(lambda: strategy.run(train)))
    del lookup

    with tf.device(gpus[0].name):
      tables = [tf.Variable(tf.random.uniform((work.vocab, work.dim), -0.05, 0.05))
                for _ in range(work.tables)]
      sparse = [tf.sparse.from_dense(tf.constant(ids[t]) + 1) for t in range(work.tables)]
      sparse = [tf.SparseTensor(s.indices, s.values - 1, s.dense_shape) for s in sparse]
    results["tf.nn.embedding_lookup_sparse forward"] = tf_ms(tf.function(
        lambda: [tf.nn.embedding_lookup_sparse(tables[t], sparse[t], None, combiner="sum")
                 for t in range(work.tables)]))
    tables = None  # frees them (closures above read them)
    results.update({k: v for k, v in peers.get(str(w), {}).items()
                    if isinstance(v, float)})

    print(f"{'system':42s} {'ms':>8s} {'GB/s':>8s} {'% copy':>7s} {'% HBM':>6s}")
    for name, ms in results.items():
      moved = train_bytes if "step" in name else fwd_bytes
      gbps = moved / ms / 1e6
      of_copy = f"{100 * gbps / copy:6.1f}%" if copy else "   n/a"
      of_nominal = f"{100 * gbps / nominal:5.1f}%" if nominal else "  n/a"
      print(f"{name:42s} {ms:8.3f} {gbps:8.1f} {of_copy:>7s} {of_nominal:>6s}")
    torch_fwd = results.get("torch EmbeddingBag forward")
    if torch_fwd:
      print(f"tfde forward / torch EmbeddingBag forward: {results['tfde forward'] / torch_fwd:.2f}"
            f"; tfde SGD step / torch SGD step: "
            f"{results['tfde SGD step'] / results['torch EmbeddingBag + SGD step']:.2f}"
            f"; tfde lazy Adam / torch SparseAdam: "
            f"{results['tfde lazy Adam step'] / results['torch EmbeddingBag + SparseAdam step']:.2f}")
  print(f"\ncopy bandwidth (torch, same run): {copy and round(copy)} GB/s; nominal "
        f"{nominal} GB/s; torch {peers.get('torch')}; FBGEMM: {peers.get('fbgemm_gpu', 'n/a')}")


def profile(args):
  """Per-stage GPU times of one training step (each stage a tf.function of
  its own, synchronised), then the host's and the GPU's busiest ops in
  tf.profiler traces of 3 forwards and of 3 training steps."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import tfde  # pylint: disable=g-import-not-at-top
  from tfde.pipeline import batches  # pylint: disable=g-import-not-at-top
  device = tf.config.list_logical_devices(DEVICE_TYPE)[0].name
  label, work, ids = workloads(args.quick)[-1]
  with tf.device(device):
    lookup = tfde.lookup.ShardedLookup(work.feature_configs())
    inputs = {f"f{t}": tf.constant(ids[t]) for t in range(work.tables)}
    group = lookup._groups[0]  # pylint: disable=protected-access
    fused = group.fused_ids(lookup.flatten(inputs))
    splits, weights, combiner = batches.as_one_batch(
        lookup.flatten(inputs), ["sum"] * work.tables)
    grad = tf.ones([int(splits.shape[0]) - 1, work.dim])
    unique, inverse, _ = tfde.ops.unique_with_counts(fused)

  forward, train = lookup_steps(
      lookup, inputs, lambda out: tf.add_n([tf.reduce_sum(v) for v in out.values()]))

  def update_gradients():
    # The form the backward hands the optimizer here: on a GPU the gradient
    # matrix (the combine gradient's kernel), on a CPU bags.
    g = tfde.ops.gradients_for_update(grad, inverse, splits, weights, tf.size(unique),
                                      combiner, device=device)
    return g.segments if isinstance(g, tfde.ops.BagGradients) else g

  def unchecked_forward():
    # Diagnostic only: the forward with the per-feature id checks (an
    # Assert each, so a host round trip) taken out, to show what they cost.
    checked = tfde.inputs.check_id_range
    tfde.inputs.check_id_range = lambda ids, *unused: ids
    try:
      return lookup(inputs)
    finally:
      tfde.inputs.check_id_range = checked

  stages = {
      "flatten + fuse ids": lambda: group.fused_ids(lookup.flatten(inputs)),
      "combine from tables (the op alone)": lambda: group.combine_local(
          0, fused, tfde.ops.int32_range(tf.size(fused, out_type=tf.int64)),
          (splits, weights, combiner)),
      "forward without the id checks (diagnostic)": unchecked_forward,
      "dedup (unique_with_counts)": lambda: tfde.ops.unique_with_counts(fused),
      "update gradients (the backward's form here)": update_gradients,
      "forward (whole)": forward,
      "lazy Adam step (whole)": train,
  }
  print(f"profile ({label}: {work.describe()}), mean ms of {args.reps}:")
  for name, fn in stages.items():
    with tf.device(device):
      print(f"  {name:44s} {mean_ms(tf.function(fn), args.reps, tf_sync):9.3f}",
            flush=True)
  for name, fn in (("forward", forward), ("lazy Adam step", train)):
    logdir = tempfile.mkdtemp(prefix="tfde_gpu_profile")
    with tf.device(device):
      tf_sync(fn())
      tf.profiler.experimental.start(logdir)
      for _ in range(3):
        out = fn()
      tf_sync(out)
      tf.profiler.experimental.stop()
    print(f"\n{name}: a tf.profiler trace of 3 runs")
    summarize_trace(logdir)


def summarize_trace(logdir, top=22):
  """The busiest event names of each plane of a tf.profiler trace (host
  threads: ops as TensorFlow ran them; GPU streams: kernels and copies)."""
  import collections  # pylint: disable=g-import-not-at-top
  import glob  # pylint: disable=g-import-not-at-top

  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
  if not paths:
    print(f"no trace written under {logdir}")
    return
  space = xplane_pb2.XSpace()
  with open(paths[0], "rb") as f:
    space.ParseFromString(f.read())
  for plane in space.planes:
    totals, counts = collections.Counter(), collections.Counter()
    for line in plane.lines:
      if plane.name.startswith("/host") and "python" in line.name.lower():
        continue
      for event in line.events:
        name = plane.event_metadata[event.metadata_id].name[:90]
        totals[name] += event.duration_ps / 1e9
        counts[name] += 1
    if not totals:
      continue
    print(f"trace plane {plane.name} ({len(plane.lines)} lines), ms over 3 runs:")
    for name, ms in totals.most_common(top):
      print(f"  {ms:9.3f} {counts[name]:6d}x  {name}")
    if plane.name.startswith("/device"):
      summarize_copies(plane)


def _stats(plane, event):
  """An XEvent's stats as {name: value}."""
  out = {}
  for stat in event.stats:
    name = plane.stat_metadata[stat.metadata_id].name
    kind = stat.WhichOneof("value")
    value = getattr(stat, kind) if kind else None
    if kind == "ref_value":
      value = plane.stat_metadata[value].name
    out[name] = value
  return out


def summarize_copies(plane, top=12):
  """The device plane's copies by the TensorFlow op that asked for them:
  how many and their time (where a step's host round trips and transfers
  come from)."""
  import collections  # pylint: disable=g-import-not-at-top
  copies = collections.defaultdict(lambda: [0, 0.0])
  for line in plane.lines:
    for event in line.events:
      name = plane.event_metadata[event.metadata_id].name
      if not name.startswith("Memcpy"):
        continue
      key = (name, str(_stats(plane, event).get("tf_op", "?"))[:70])
      copies[key][0] += 1
      copies[key][1] += event.duration_ps / 1e9
  if copies:
    print("  copies by TensorFlow op (count, ms):")
    for (name, op), (n, ms) in sorted(copies.items(), key=lambda kv: -kv[1][1])[:top]:
      print(f"    {name:10s} {n:4d}x {ms:8.3f} ms  {op}")


if __name__ == "__main__":
  main()
