"""What `tfde train` writes: per step exchange statistics, TensorBoard
logs and the embedding projector, the checkpoint with its tables' configs,
and the report (metrics.json, summary.md, plots)."""

import json
import os

from tfde.app import plotting


def exchange_statistics(dataset, tables, batch_size, replicas, exchanges=None):
  """Per table, per step of one epoch over `dataset`: the rows the step
  touches and the bytes its exchanges move, from the batches' ids.

  The global batch splits into `replicas` consecutive slices (as a
  distributed dataset does); each replica dedups its ids. A sharded table
  sends each replica's ids owned elsewhere (id % N != replica) to their
  owner (8 bytes an id), gets their rows back and sends their gradients
  there (4 bytes a float each way). A replicated table exchanges nothing
  forward and all-gathers each replica's gradient rows (ids and rows) to
  the other replicas. A row-wise table that exchanges partial sums
  (`exchanges`: table -> kind, `DistributedEmbedding.exchanges()`; "rows"
  when not given) sends every id owned elsewhere, not deduped, with its
  coefficient (12 bytes), and each owner
  sends every other replica its samples' partial sums, which send their
  gradients back (4 bytes a float each way). Returns {table:
  {"rows_touched": [...], "bytes_exchanged": [...]}}.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  stats = {}
  per_replica = batch_size // replicas
  for name, table in tables.items():
    dim = table.embedding_dim
    touched, moved = [], []
    values, lengths = dataset.features[name]
    splits = np.concatenate([[0], np.cumsum(lengths)])
    for k in range(dataset.size // batch_size):
      ids_of = [values[splits[k * batch_size + r * per_replica]:
                       splits[k * batch_size + (r + 1) * per_replica]]
                for r in range(replicas)]
      unique = [np.unique(ids) for ids in ids_of]
      touched.append(int(np.unique(np.concatenate(unique)).size))
      pieces = _pieces(table)
      if replicas == 1:
        moved.append(0)
      elif pieces == "replicated":
        moved.append(int(sum(u.size for u in unique) * (replicas - 1) * (8 + 4 * dim)))
      elif pieces == "row_wise" and (exchanges or {}).get(name) == "partial sums":
        remote = sum(int((ids % replicas != r).sum()) for r, ids in enumerate(ids_of))
        moved.append(remote * 12 +
                     replicas * (replicas - 1) * per_replica * 2 * 4 * dim)
      elif pieces == "row_wise" or isinstance(pieces, tuple):
        # Row id on owners[id % k]: row-wise, every replica in order.
        owners = np.asarray(range(replicas) if pieces == "row_wise" else pieces)
        remote = sum(int((owners[u % len(owners)] != r).sum())
                     for r, u in enumerate(unique))
        moved.append(remote * (8 + 8 * dim))
      else:
        # Each replica sends its unique ids to every piece's owner but
        # itself, and gets the piece's columns back (and sends gradients).
        moved.append(sum(u.size * (8 + 8 * width) for r, u in enumerate(unique)
                         for owner, width in pieces if owner != r))
    stats[name] = {"rows_touched": touched, "bytes_exchanged": moved}
  return stats


def _pieces(table):
  """Where a table's rows live, as the statistics need it: "replicated",
  "row_wise" (row id on replica id % N), a tuple of k replicas (row id on
  the (id % k)-th: table-row-wise), or [(owner, width), ...]: the replicas
  holding every row's columns, a whole table-wise table as one piece, a
  column-wise table as one piece per slice (tfde.tables)."""
  if table.replicated:
    return "replicated"
  if getattr(table, "owners", None) is not None:
    return list(zip(table.owners, table.widths))
  owner = getattr(table, "owner", None)
  if isinstance(owner, tuple):
    return owner
  if owner is not None:
    return [(owner, table.embedding_dim)]
  return "row_wise"


class TensorBoardLog:
  """The job's TensorBoard scalars: per step the loss (Keras's running mean
  over the epoch so far), samples per second, and per table the rows
  touched and the bytes exchanged; per epoch the train and eval metrics.

  Written with `tf.summary.write` and the scalars plugin's metadata, what
  `tf.summary.scalar` writes, because that one needs the TensorBoard
  package installed, which viewing needs but writing does not."""

  def __init__(self, logdir):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from tensorflow.core.framework import summary_pb2  # pylint: disable=g-import-not-at-top
    self._tf = tf
    self._metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    self.logdir = logdir
    self.writer = tf.summary.create_file_writer(logdir)
    self._write_series = None

  def _scalar(self, tag, value, step):
    self._tf.summary.write(tag, self._tf.constant(value, self._tf.float32), step=step,
                           metadata=self._metadata)

  def _series(self, tag, values, first_step):
    """values[i] as tag's scalar at step first_step + i, in one traced
    loop: a Python call per scalar costs a millisecond or more each."""
    tf = self._tf
    if self._write_series is None:
      metadata = self._metadata

      @tf.function(input_signature=[tf.TensorSpec([], tf.string),
                                    tf.TensorSpec([None], tf.float32),
                                    tf.TensorSpec([], tf.int64)])
      def write_series(tag, values, first_step):
        for i in tf.range(tf.size(values, out_type=tf.int64)):
          tf.summary.write(tag, values[i], step=first_step + i, metadata=metadata)
      self._write_series = write_series
    self._write_series(tf.constant(tag), tf.constant(values, tf.float32),
                       tf.constant(first_step, tf.int64))

  def steps(self, history, first_step, table_stats):
    """The steps since `first_step` (written after the epoch, in one go)."""
    with self.writer.as_default():
      self._series("train/loss_running_mean", history.loss[first_step:], first_step + 1)
      self._series("throughput/samples_per_second",
                   history.samples_per_second[first_step:], first_step + 1)
      for name, stats in table_stats.items():
        self._series(f"tables/{name}/rows_touched_per_step", stats["rows_touched"],
                     first_step + 1)
        self._series(f"tables/{name}/bytes_exchanged_per_step",
                     stats["bytes_exchanged"], first_step + 1)
    self.writer.flush()

  def epoch(self, step, train_metrics, eval_metrics):
    with self.writer.as_default():
      for side, values in (("train", train_metrics), ("eval", eval_metrics)):
        for key, value in values.items():
          self._scalar(f"epoch/{side}_{key}", float(value), step=step)
    self.writer.flush()

  def close(self):
    self.writer.close()


def save_checkpoint(model, directory, step):
  """The trained model as a tf.train checkpoint (tables whole, whatever the
  replica count: `tfde inspect` reads it) and tables.json beside it, the
  tables' configs, which a checkpoint does not hold."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from tfde.app import inspect as inspect_lib  # pylint: disable=g-import-not-at-top
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), directory,
                                       max_to_keep=1)
  manager.save(checkpoint_number=step)
  configs = {name: table.config.get_config()
             for name, table in model.embedding.tables.items()}
  with open(os.path.join(directory, inspect_lib.TABLE_CONFIGS_FILE), "w") as f:
    json.dump(configs, f, indent=2, default=str)


PROJECTOR_ROWS = 10_000


def write_projector(logdir, rows_by_table, train):
  """Tables for TensorBoard's embedding projector: of each, the
  PROJECTOR_ROWS rows most looked up in training (the projector's PCA and
  t-SNE are for thousands of points; rare rows are mostly their initial
  noise), in one checkpoint, with a metadata TSV per table (id, lookups)
  and projector_config.pbtxt (the plugin's format, written as text: no
  TensorBoard package is needed to write it). Returns the config's path."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  os.makedirs(logdir, exist_ok=True)
  variables, entries = {}, []
  for name, rows in sorted(rows_by_table.items()):
    values, _ = train.features[name]
    counts = np.bincount(values, minlength=rows.shape[0])
    ids = np.argsort(-counts, kind="stable")[:PROJECTOR_ROWS]
    ids = ids[counts[ids] > 0]
    variables[name] = tf.Variable(rows[ids], name=f"{name}_projector")
    metadata = f"projector_{name}.tsv"
    with open(os.path.join(logdir, metadata), "w") as f:
      f.write("id\tlookups\n")
      f.writelines(f"{i}\t{counts[i]}\n" for i in ids)
    entries.append(f'embeddings {{\n  tensor_name: "{name}/.ATTRIBUTES/VARIABLE_VALUE"\n'
                   f'  metadata_path: "{metadata}"\n}}\n')
    print(f"tfde train: projector: table {name}, its {len(ids):,} most looked-up rows")
  prefix = tf.train.Checkpoint(**variables).write(os.path.join(logdir, "projector"))
  config_path = os.path.join(logdir, "projector_config.pbtxt")
  with open(config_path, "w") as f:
    f.write(f'model_checkpoint_path: "{os.path.basename(prefix)}"\n' + "".join(entries))
  return config_path


def shard_stats(layer, dataset, replicas):
  """Rows held and lookups served per shard, over the eval data. A column
  slice counts as its share of the width: a replica holding half of each
  row of a table of V rows holds V / 2 rows' worth."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  held = np.zeros(replicas, np.float64)
  lookups = np.zeros(replicas, np.int64)
  tables = {}
  for name, table in layer.tables.items():
    values, _ = dataset.features[name]
    pieces = _pieces(table)
    if pieces == "replicated":
      held += table.vocabulary_size
      per_shard = np.full(replicas, len(values) // replicas)
    elif pieces == "row_wise" or isinstance(pieces, tuple):
      # Row id on owners[id % k]: row-wise, every replica in order.
      owners = tuple(range(replicas)) if pieces == "row_wise" else pieces
      k = len(owners)
      per_shard = np.zeros(replicas, np.int64)
      by_position = np.bincount(values % k, minlength=k)
      for position, owner in enumerate(owners):
        held[owner] += len(range(position, table.vocabulary_size, k))
        per_shard[owner] += by_position[position]
    else:
      per_shard = np.zeros(replicas, np.int64)
      for owner, width in pieces:
        held[owner] += table.vocabulary_size * width / table.embedding_dim
        per_shard[owner] += len(values)
    lookups += per_shard
    tables[name] = {"replicated": pieces == "replicated",
                    "kind": pieces if isinstance(pieces, str) else
                            "table_row_wise" if isinstance(pieces, tuple) else
                            ("table_wise" if len(pieces) == 1 else "column_wise"),
                    "lookups_per_shard": per_shard.tolist()}
  rows_held = [int(h) if float(h).is_integer() else float(h) for h in held]
  return {"rows_held": rows_held, "lookups": lookups.tolist(), "tables": tables}


def write_report(report_dir, config, metrics):
  os.makedirs(report_dir, exist_ok=True)
  with open(os.path.join(report_dir, "metrics.json"), "w") as f:
    json.dump(metrics, f, indent=2)
  plots = _plots(report_dir, metrics)
  lines = [f"# tfde train: {config.name}", "",
           f"- data: {metrics['data']}",
           f"- replicas: {metrics['replicas']} (TensorFlow {metrics['tensorflow']})",
           f"- training: {metrics['steps']} steps of {config.training.batch_size} "
           f"samples, {metrics['seconds']:.1f} s, median "
           f"{metrics['samples_per_second_median']:,.0f} samples/s", "",
           "| metric | value |", "|---|---|"]
  for k, v in metrics["eval"].items():
    lines.append(f"| eval {k} | {v:.4f} |")
  if "eval_auc" in metrics:
    lines.append(f"| eval AUC (recomputed) | {metrics['eval_auc']:.4f} |")
    lines.append(f"| AUC of the hidden true model | {metrics['oracle_auc']:.4f} |")
    lines.append(f"| gap to the true model | {metrics['oracle_auc'] - metrics['eval_auc']:.4f} |")
  if "baseline_rmse" in metrics:
    lines.append(f"| RMSE of predicting the mean train rating | {metrics['baseline_rmse']:.4f} |")
  shards = metrics["shards"]
  lines += ["", "| shard | rows held | lookups (eval) |", "|---|---|---|"]
  for r, (h, l) in enumerate(zip(shards["rows_held"], shards["lookups"])):
    lines.append(f"| {r} | {h:,} | {l:,} |" if isinstance(h, int) else
                 f"| {r} | {h:,.1f} | {l:,} |")
  if metrics.get("deltas"):
    from tfde.app import continuous  # pylint: disable=g-import-not-at-top
    lines += continuous.summary_lines(metrics["deltas"])
  lines += [""] + [f"![{p}]({p})" for p in plots]
  with open(os.path.join(report_dir, "summary.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print(f"tfde train: report written to {report_dir}/ "
        f"(metrics.json, summary.md, {', '.join(plots)})")


def _plots(report_dir, metrics):
  plt = plotting.pyplot("tfde train")
  if plt is None:
    return []
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  h = metrics["history"]
  e = metrics["epochs"]
  written = []
  metric_name = "auc" if metrics["task"] == "ctr" else "rmse"
  label = {"auc": "AUC (area under the ROC curve, 0.5 = chance)",
           "rmse": "RMSE (rating stars)"}[metric_name]
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  for ax, key, title, ylabel in (
      (axes[0], "loss", "loss", "binary cross-entropy (nats)" if metric_name == "auc"
       else "mean squared error (stars²)"),
      (axes[1], metric_name, metric_name.upper(), label)):
    for side, style in (("train", "o-"), ("eval", "s-")):
      ax.plot(e["epoch"], [v[key] for v in e[side]], style, label=side)
    if key == "auc" and "oracle_auc" in metrics:
      ax.axhline(metrics["oracle_auc"], color="gray", linestyle="--",
                 label="hidden true model (eval)")
    ax.set(title=f"{title} after each epoch", xlabel="epoch", ylabel=ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(report_dir, "training.png"), dpi=90)
  written.append("training.png")
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(range(1, len(h["samples_per_second"]) + 1), h["samples_per_second"])
  ax.set(title="training throughput", xlabel="training step",
         ylabel="samples / second (all replicas)")
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  fig.tight_layout()
  fig.savefig(os.path.join(report_dir, "throughput.png"), dpi=90)
  written.append("throughput.png")
  shards = metrics["shards"]
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  count = len(shards["rows_held"])
  axes[0].bar(range(count), shards["rows_held"])
  axes[0].set(title="rows held per shard", xlabel="shard (replica)",
              ylabel="table rows (all tables)")
  axes[1].bar(range(count), shards["lookups"], color="tab:orange")
  axes[1].set(title="lookups served per shard (eval data)", xlabel="shard (replica)",
              ylabel="ids looked up")
  for ax in axes:
    ax.set_xticks(range(count))
  fig.tight_layout()
  fig.savefig(os.path.join(report_dir, "shards.png"), dpi=90)
  written.append("shards.png")
  plt.close("all")
  return written
