"""Forward benchmark: tfde's one-replica lookup against torch
`nn.EmbeddingBag` for every combiner (sum, mean, sqrtn), with and without
per-id weights, on dense and ragged ids; and the exported serving model
(stock TF ops only) of the unweighted forms.

Data (printed): bench/workload.py's 4 tables of 1,000,000 x 64 float32 and
its Zipf(1.05) ids, batch 4096. Dense: 20 ids per sample per table. Ragged:
the first n ids of each of those rows, n uniform in [1, 39] (20 on
average). Weights: uniform in [0.5, 1.5). Each system is timed on the same
ids (median of --reps calls after 2 warm-ups, in --rounds rounds of tfde's
timings then torch's; the medians over the rounds, and each round's
ratio range):

  ShardedLookup   `tfde.lookup.ShardedLookup`, training=False and True
  layer           the Keras layer `tfde.layers.DistributedEmbedding`, the same
  ..., RaggedTensor arguments
                  (ragged forms) the lookup, training=False, called with
                  `tf.RaggedTensor` arguments; the other systems take each
                  ragged input's values and row splits, as torch takes
                  values and offsets, and rebuild it in the function
                  (what a tf.data iterator read inside the function, or
                  Keras `fit`, hands the layer)
  dispatch alone  (ragged forms) an empty `tf.function` called with the same
                  `tf.RaggedTensor` arguments: what TensorFlow's call costs
                  before any lookup
  export          `tfde.export_for_serving` of the layer, loaded back with
                  `tf.saved_model.load` (serves without tfde's ops), its
                  `serve` function; unweighted forms only (the layer's
                  export takes the ids alone)
  torch           `nn.EmbeddingBag` (bench/peers_bench.py variants, in the
                  peers' environment)

Prints one table, the ratios to torch (< 1: tfde faster), and writes
bench/results/forward_bench.png (`--quick`, which shrinks the tables and
batch, writes forward_bench_quick.png).
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ops_bench import run_peers  # noqa: E402  (bench/ is the script's dir)
from workload import parse_args  # noqa: E402
from workload import timed  # noqa: E402

import tfde  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
COMBINERS = ("sum", "mean", "sqrtn")
RAGGED_ARGUMENTS = "ShardedLookup training=False, RaggedTensor arguments"


def forms(work, seed=0):
  """Per table: dense ids [batch, hot] and weights; the ragged ids (values,
  row lengths) and weights made from them."""
  rng = np.random.default_rng(seed + 1)
  out = []
  for ids in work.ids(seed):
    lengths = rng.integers(1, 2 * work.hot, size=work.batch)
    keep = np.arange(work.hot * 2)[None, :] < lengths[:, None]
    wide = np.concatenate([ids, ids[:, ::-1]], 1)  # rows of up to 2 * hot ids
    values = wide[keep]
    out.append(dict(dense=ids, dense_w=rng.uniform(0.5, 1.5, ids.shape).astype(np.float32),
                    values=values, lengths=lengths.astype(np.int64),
                    values_w=rng.uniform(0.5, 1.5, values.shape).astype(np.float32)))
  return out


def configs(work, combiner):
  return {name: tfde.FeatureConfig(name=name, table=tfde.TableConfig(
      name=f.table.name, vocabulary_size=f.table.vocabulary_size,
      embedding_dim=f.table.embedding_dim, optimizer=f.table.optimizer,
      combiner=combiner, initializer=f.table.initializer, seed=f.table.seed))
          for name, f in work.feature_configs().items()}


def tf_inputs(data, form, weighted):
  """(ids, weights or None) by feature name, dense or ragged tensors."""
  ids, weights = {}, {}
  for t, d in enumerate(data):
    if form == "dense":
      ids[f"f{t}"] = tf.constant(d["dense"])
      weights[f"f{t}"] = tf.constant(d["dense_w"])
    else:
      ids[f"f{t}"] = tf.RaggedTensor.from_row_lengths(d["values"], d["lengths"])
      weights[f"f{t}"] = tf.RaggedTensor.from_row_lengths(d["values_w"], d["lengths"])
  return ids, (weights if weighted else None)


def as_arguments(values):
  """`values` (a dict of tensors, or None) with each RaggedTensor as its
  (values, row splits): plain tensors, as torch's forward takes values and
  offsets."""
  if values is None:
    return None
  return {k: (v.values, v.row_splits) if isinstance(v, tf.RaggedTensor) else v
          for k, v in values.items()}


def from_arguments(values):
  """`as_arguments` undone inside a function: RaggedTensors again, built
  without checks, as a tf.data iterator hands them over."""
  if values is None:
    return None
  return {k: tf.RaggedTensor.from_row_splits(*v, validate=False) if isinstance(v, tuple) else v
          for k, v in values.items()}


def time_tfde(work, data, reps, export_dir):
  """{variant: {system: ms}} for tfde's systems."""
  results = {}
  for combiner in COMBINERS:
    layer = tfde.layers.DistributedEmbedding(configs(work, combiner))
    lookup = layer._lookup  # pylint: disable=protected-access  (the layer's own tables)
    for form in ("dense", "ragged"):
      for weighted in (False, True):
        ids, weights = tf_inputs(data, form, weighted)
        variant = f"{form} {combiner}{' weighted' if weighted else ''}"
        row = results.setdefault(variant, {})
        # The inputs are arguments, as a real input arrives; a ragged one
        # as its tensors (as_arguments), whose call costs what a dense
        # one's does. With RaggedTensor arguments TensorFlow's call itself
        # costs more, whatever the function runs: timed apart below.
        args = (as_arguments(ids), as_arguments(weights))
        for training in (False, True):
          for system, module in (("ShardedLookup", lookup), ("layer", layer)):
            fn = tf.function(lambda i, w, module=module, training=training: module(
                from_arguments(i), from_arguments(w), training=training))
            row[f"{system} training={training}"] = timed(lambda fn=fn: fn(*args), reps)
        if form == "ragged":
          fn = tf.function(lambda i, w: lookup(i, w, training=False))
          row[RAGGED_ARGUMENTS] = timed(
              lambda fn=fn: fn(ids, weights), reps)
          fn = tf.function(lambda i, w: tf.constant(0.0))
          row["dispatch alone"] = timed(lambda fn=fn: fn(ids, weights), reps)
        if not weighted:
          path = os.path.join(export_dir, "export")
          tfde.export_for_serving(layer, path, ids)
          served = tf.saved_model.load(path)
          row["export"] = timed(lambda served=served, ids=ids: served.serve(ids), reps)
          del served
          shutil.rmtree(path)
        print(f"  {variant}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()),
              flush=True)
    layer = lookup = None  # frees them before the next table (closures above read them)
  return results


def time_torch(work, data, reps, tmp):
  path = os.path.join(tmp, "forms.npz")
  arrays = {f"{k}_{t}": v for t, d in enumerate(data) for k, v in d.items()}
  np.savez(path, tables=work.tables, vocab=work.vocab, dim=work.dim, **arrays)
  out = run_peers("variants", path, str(reps))
  return json.loads(out.strip().splitlines()[-1]) if out else {}


def short(system):
  """A column's heading: `system` in 15 characters."""
  if system == RAGGED_ARGUMENTS:
    return "lookup RT args"
  return system.replace("ShardedLookup", "lookup").replace("training=", "tr=")


def plot(results, torch, path):
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    print("matplotlib missing: no plot")
    return
  variants = list(results)
  systems = ["ShardedLookup training=False", "layer training=False", RAGGED_ARGUMENTS,
             "export"]
  fig, ax = plt.subplots(figsize=(14, 4.5))
  width = 0.8 / (len(systems) + 1)
  x = np.arange(len(variants))
  for k, system in enumerate(systems):
    ax.bar(x + k * width, [results[v].get(system, np.nan) for v in variants], width,
           label=f"tfde {short(system)}")
  ax.bar(x + len(systems) * width, [torch.get(v, np.nan) for v in variants], width,
         label="torch EmbeddingBag")
  ax.set_xticks(x + 0.4 - width / 2, variants, rotation=30, ha="right")
  ax.set(ylabel="ms per forward (4 tables, batch 4096)", title="forward, one replica")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path)
  print(f"wrote {path}")


def run_tfde_round(work, data, args):
  """One round of tfde's timings, written as JSON to --tfde-round: in a
  process of its own, as one process kept the layers' memory after them."""
  with tempfile.TemporaryDirectory() as tmp:
    results = time_tfde(work, data, args.reps, tmp)
  with open(args.tfde_round, "w") as f:
    json.dump(results, f)


def main():
  args, work = parse_args(__doc__, reps=15, extra=[
      ("--rounds", dict(type=int, default=3,
                        help="rounds of tfde's timings then torch's; medians over them")),
      ("--tfde-round", dict(default=None,
                            help="(internal) time tfde once and write the results here"))])
  data = forms(work)
  if args.tfde_round:
    return run_tfde_round(work, data, args)
  print(f"data: {work.tables} tables of {work.vocab:,} x {work.dim} float32, batch "
        f"{work.batch}, Zipf({work.alpha}) ids; dense {work.hot} ids per sample, ragged "
        f"{np.mean([d['lengths'].mean() for d in data]):.1f} on average; TF "
        f"{tf.__version__}, {os.cpu_count()} cores; median of {args.reps}", flush=True)
  # Rounds of tfde's timings then torch's: a slow spell of this shared
  # machine then falls on both sides; medians over the rounds.
  # Each round's tfde timings run in a process of their own
  # (run_tfde_round), whose exit returns every table it made.
  tfde_rounds, torch_rounds = [], []
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(args.rounds):
      print(f"round {r + 1} of {args.rounds}", flush=True)
      path = os.path.join(tmp, f"tfde_round_{r}.json")
      subprocess.run([sys.executable, os.path.abspath(__file__), "--tfde-round", path,
                      "--reps", str(args.reps)] + (["--quick"] if args.quick else []),
                     check=True)
      with open(path) as f:
        tfde_rounds.append(json.load(f))
      torch_rounds.append(time_torch(work, data, args.reps, tmp))
  results = {variant: {system: statistics.median(r[variant][system] for r in tfde_rounds)
                       for system in row}
             for variant, row in tfde_rounds[0].items()}
  torch = {variant: statistics.median(r[variant] for r in torch_rounds)
           for variant in torch_rounds[0]} if all(torch_rounds) else {}
  systems = list(dict.fromkeys(s for row in results.values() for s in row))
  print(f"medians of {args.rounds} rounds; ratios with, in brackets, the lowest and highest "
        "of one round")
  print(f"{'variant':<22}" + "".join(f"{short(s):>16}" for s in systems) +
        f"{'torch':>8}   ratios to torch (lookup tr=False, layer tr=False, export; "
        "lookup tr=False with RaggedTensor arguments)")
  for variant, row in results.items():
    t = torch.get(variant)

    def ratio(system, row=row, t=t, variant=variant):
      if not t or system not in row:
        return "-"
      each = [a[variant][system] / b[variant] for a, b in zip(tfde_rounds, torch_rounds)]
      return f"{row[system] / t:.2f} [{min(each):.2f}, {max(each):.2f}]"

    ratios = ", ".join(ratio(s) for s in ("ShardedLookup training=False",
                                          "layer training=False", "export"))
    if RAGGED_ARGUMENTS in row:
      ratios += "; " + ratio(RAGGED_ARGUMENTS)
    print(f"{variant:<22}" + "".join(f"{row[s]:>16.1f}" if s in row else f"{'-':>16}"
                                     for s in systems) +
          f"{t if t else float('nan'):>8.1f}   {ratios}")
  os.makedirs(RESULTS, exist_ok=True)
  name = "forward_bench_quick.png" if args.quick else "forward_bench.png"
  plot(results, torch, os.path.join(RESULTS, name))


if __name__ == "__main__":
  main()
