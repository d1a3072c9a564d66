"""The main job: `tfde train --config configs/demo.yaml`.

Builds a DLRM-style ranking model (sharded embeddings for the sparse
features, a bottom MLP for the dense ones, pairwise dot interactions, a top
MLP), trains it with N replicas (logical CPU devices here, GPUs where
present) under Keras `fit` with a progress bar, evaluates it, and writes a
report folder: metrics.json, summary.md and PNG plots (loss and AUC or RMSE
per step, samples per second, rows held and lookups served per shard).

    tfde train --config configs/demo.yaml [--data ratings.csv] [--report-dir D]

The default data is generated (Criteo-like, with a hidden true model);
`--data PATH` (or data.kind: movielens) trains on a MovieLens ratings CSV.
"""

import argparse
import dataclasses
import json
import os
import sys
import time
import typing
from typing import List, Optional

import yaml

# ---------------------------------------------------------------- config


class ConfigError(ValueError):
  """A bad job config; the message names the offending key."""


def _build(cls, raw, where):
  """A config dataclass from a dict, rejecting unknown and missing keys."""
  if not isinstance(raw, dict):
    raise ConfigError(f"{where or 'config'}: expected a mapping, got {raw!r}")
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(raw) - set(fields))
  if unknown:
    prefix = f"{where}." if where else ""
    raise ConfigError(f"unknown key '{prefix}{unknown[0]}' (known keys: "
                      f"{', '.join(sorted(fields))})")
  kwargs = {}
  hints = typing.get_type_hints(cls)
  for name, field in fields.items():
    key = f"{where}.{name}" if where else name
    if name not in raw:
      if (field.default is dataclasses.MISSING and
          field.default_factory is dataclasses.MISSING):
        raise ConfigError(f"missing key '{key}'")
      continue
    value = raw[name]
    hint = hints[name]
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
      value = _build(hint, value, key)
    elif origin in (list, List) and args and dataclasses.is_dataclass(args[0]):
      if not isinstance(value, list):
        raise ConfigError(f"'{key}' must be a list")
      value = [_build(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    kwargs[name] = value
  try:
    return cls(**kwargs)
  except ConfigError as e:
    raise ConfigError(f"{where + ': ' if where else ''}{e}") from None


def _positive(where, name, value, allow_zero=False):
  ok = isinstance(value, int) and not isinstance(value, bool) and (
      value >= 0 if allow_zero else value > 0)
  if not ok:
    raise ConfigError(f"'{where}{name}' must be a {'non-negative' if allow_zero else 'positive'} "
                      f"int, got {value!r}")


@dataclasses.dataclass
class SparseFeatureConfig:
  """A categorical feature: name, vocabulary size, max ids per sample."""
  name: str
  vocabulary_size: int
  hotness: int = 1

  def __post_init__(self):
    _positive("", "vocabulary_size", self.vocabulary_size)
    _positive("", "hotness", self.hotness)


@dataclasses.dataclass
class DataConfig:
  """kind: synthetic (generated) or movielens (a ratings CSV at path)."""
  kind: str = "synthetic"
  path: Optional[str] = None
  train_samples: int = 100000
  eval_samples: int = 20000
  dense_features: int = 13
  zipf_alpha: float = 1.1
  sparse_features: List[SparseFeatureConfig] = dataclasses.field(default_factory=list)

  def __post_init__(self):
    if self.kind not in ("synthetic", "movielens"):
      raise ConfigError(f"'data.kind' must be synthetic or movielens, got {self.kind!r}")
    if self.kind == "movielens" and not self.path:
      raise ConfigError("'data.path' is required when data.kind is movielens")
    _positive("data.", "train_samples", self.train_samples)
    _positive("data.", "eval_samples", self.eval_samples)
    _positive("data.", "dense_features", self.dense_features, allow_zero=True)
    if not (isinstance(self.zipf_alpha, (int, float)) and self.zipf_alpha > 1):
      raise ConfigError(f"'data.zipf_alpha' must be > 1, got {self.zipf_alpha!r}")
    if self.kind == "synthetic" and not self.sparse_features:
      raise ConfigError("'data.sparse_features' must list at least one feature")


@dataclasses.dataclass
class OptimizerConfig:
  kind: str
  learning_rate: float

  def __post_init__(self):
    if not (isinstance(self.learning_rate, (int, float)) and self.learning_rate > 0):
      raise ConfigError(f"learning_rate must be positive, got {self.learning_rate!r}")


@dataclasses.dataclass
class ModelConfig:
  embedding_dim: int = 16
  combiner: str = "mean"
  bottom_mlp: List[int] = dataclasses.field(default_factory=lambda: [64, 16])
  top_mlp: List[int] = dataclasses.field(default_factory=lambda: [128, 64])
  table_optimizer: OptimizerConfig = dataclasses.field(
      default_factory=lambda: OptimizerConfig("adagrad", 0.05))
  dense_optimizer: OptimizerConfig = dataclasses.field(
      default_factory=lambda: OptimizerConfig("adam", 0.001))

  def __post_init__(self):
    _positive("model.", "embedding_dim", self.embedding_dim)
    for name in ("bottom_mlp", "top_mlp"):
      for units in getattr(self, name):
        _positive("model.", name, units)
    if self.bottom_mlp and self.bottom_mlp[-1] != self.embedding_dim:
      raise ConfigError(f"'model.bottom_mlp' must end in embedding_dim "
                        f"({self.embedding_dim}) for the dot interaction, got "
                        f"{self.bottom_mlp}")


@dataclasses.dataclass
class TrainingConfig:
  batch_size: int = 1024
  epochs: int = 1

  def __post_init__(self):
    _positive("training.", "batch_size", self.batch_size)
    _positive("training.", "epochs", self.epochs)


@dataclasses.dataclass
class JobConfig:
  """A training job. Every field is checked; unknown keys are errors."""
  name: str
  data: DataConfig
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  training: TrainingConfig = dataclasses.field(default_factory=TrainingConfig)
  replicas: int = 1
  seed: int = 0
  report_dir: str = "reports/job"

  def __post_init__(self):
    _positive("", "replicas", self.replicas)


def load_config(path):
  try:
    with open(path) as f:
      raw = yaml.safe_load(f)
  except OSError as e:
    raise ConfigError(f"cannot read {path}: {e}") from e
  try:
    return _build(JobConfig, raw or {}, "")
  except ConfigError as e:
    raise ConfigError(f"{path}: {e}") from None


# ----------------------------------------------------------------- model


def build_model(config, vocabulary, task, dense_features):
  """The DLRM-style model, built in the current strategy's scope."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tfde  # pylint: disable=g-import-not-at-top
  from tfde.app import data as data_lib  # pylint: disable=g-import-not-at-top

  m = config.model
  table_optimizer = tfde.optimizers.get(m.table_optimizer.kind)
  table_optimizer = type(table_optimizer)(learning_rate=m.table_optimizer.learning_rate)
  features = {
      name: tfde.layers.FeatureConfig(
          name=name, table=tfde.layers.TableConfig(
              name=name, vocabulary_size=vocab, embedding_dim=m.embedding_dim,
              optimizer=table_optimizer, combiner=m.combiner,
              seed=config.seed + i))
      for i, (name, vocab) in enumerate(sorted(vocabulary.items()))}

  class RankingModel(keras.Model):
    """Embeddings + bottom MLP -> pairwise dots -> top MLP."""

    def __init__(self):
      super().__init__()
      self.embedding = tfde.layers.DistributedEmbedding(features, name="embedding")
      self.bottom = (keras.Sequential([keras.layers.Dense(u, activation="relu")
                                       for u in m.bottom_mlp])
                     if dense_features else None)
      self.top = keras.Sequential(
          [keras.layers.Dense(u, activation="relu") for u in m.top_mlp] +
          [keras.layers.Dense(1, activation="sigmoid" if task == "ctr" else None)])

    def call(self, x):
      # Multi-hot features as ragged ids: their padding never reaches a table.
      emb = self.embedding(data_lib.embedding_inputs(x, features))
      vectors = [emb[k] for k in sorted(features)]
      if self.bottom is not None:
        vectors.append(self.bottom(x["dense"]))
      count = len(vectors)
      stacked = tf.stack(vectors, axis=1)                  # [B, F, D]
      dots = tf.matmul(stacked, stacked, transpose_b=True)  # [B, F, F]
      # Each pair once (i < j), at fixed positions so the width is static.
      pairs = [i * count + j for i in range(count) for j in range(i + 1, count)]
      pairs = tf.gather(tf.reshape(dots, [-1, count * count]), pairs, axis=1)
      return self.top(tf.concat([vectors[-1], pairs], axis=1))

  model = RankingModel()
  dense_cls = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD,
               "adagrad": keras.optimizers.Adagrad}
  if m.dense_optimizer.kind not in dense_cls:
    raise ConfigError(f"'model.dense_optimizer.kind' must be one of "
                      f"{sorted(dense_cls)}, got {m.dense_optimizer.kind!r}")
  if task == "ctr":
    loss, metrics = "binary_crossentropy", [keras.metrics.AUC(name="auc")]
  else:
    loss, metrics = "mse", [keras.metrics.RootMeanSquaredError(name="rmse")]
  model.compile(optimizer=dense_cls[m.dense_optimizer.kind](m.dense_optimizer.learning_rate),
                loss=loss, metrics=metrics)
  return model


# ------------------------------------------------------------------ job


def _strategy(replicas):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  gpus = tf.config.list_physical_devices("GPU")
  if gpus:
    devices = [f"/gpu:{i}" for i in range(min(replicas, len(gpus)))]
  else:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    devices = [f"/cpu:{i}" for i in range(replicas)]
  return tf.distribute.MirroredStrategy(devices)


def run_job(config, data_path=None, report_dir=None, verbose=1):
  """Trains, evaluates and reports; returns the metrics dict."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  strategy = _strategy(config.replicas)  # before TensorFlow starts its runtime
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfde.app import data as data_lib  # pylint: disable=g-import-not-at-top

  report_dir = report_dir or config.report_dir
  keras.utils.set_random_seed(config.seed)
  d = config.data
  if data_path or d.kind == "movielens":
    full = data_lib.movielens(data_path or d.path,
                              max_samples=d.train_samples + d.eval_samples)
    source = f"MovieLens ratings from {data_path or d.path}"
  else:
    spec = data_lib.SyntheticSpec(
        sparse=[data_lib.SparseFeature(f.name, f.vocabulary_size, f.hotness)
                for f in d.sparse_features],
        dense_features=d.dense_features, samples=d.train_samples + d.eval_samples,
        zipf_alpha=d.zipf_alpha)
    full = data_lib.synthetic(spec, seed=config.seed)
    source = (f"generated Criteo-like data ({len(d.sparse_features)} sparse, "
              f"{d.dense_features} dense features, Zipf({d.zipf_alpha}))")
  train, evaluation = full.split(1.0 - d.eval_samples / full.size)
  dense = "dense" in full.features
  batch = config.training.batch_size
  print(f"tfde train: {config.name}: {source}; {train.size} train / "
        f"{evaluation.size} eval samples; {strategy.num_replicas_in_sync} replicas "
        f"({', '.join(strategy.extended.worker_devices)})", flush=True)

  with strategy.scope():
    model = build_model(config, full.vocabulary, full.task, dense)

  history = _step_history(batch)
  model.fit(data_lib.to_tf_dataset(train, batch, shuffle_seed=config.seed),
            epochs=config.training.epochs, verbose=verbose, callbacks=[history])
  eval_ds = data_lib.to_tf_dataset(evaluation, batch)
  results = model.evaluate(eval_ds, verbose=0, return_dict=True)
  scores = model.predict(eval_ds, verbose=0).ravel()
  labels = evaluation.labels[:len(scores)]
  metrics = {"name": config.name, "task": full.task, "data": source,
             "replicas": strategy.num_replicas_in_sync,
             "tensorflow": tf.__version__, "train_samples": train.size,
             "eval_samples": len(scores),
             "eval": {k: float(v) for k, v in results.items()},
             "steps": history.steps, "seconds": history.total_seconds,
             "samples_per_second_median": float(np.median(history.samples_per_second[1:]
                                                          or history.samples_per_second))}
  if full.task == "ctr":
    metrics["eval_auc"] = data_lib.auc(labels, scores)
    metrics["oracle_auc"] = data_lib.auc(labels, evaluation.oracle_scores[:len(scores)])
    metrics["eval_positive_rate"] = float(labels.mean())
  metrics["shards"] = _shard_stats(model.embedding, evaluation,
                                   strategy.num_replicas_in_sync)
  metrics["history"] = history.as_dict()
  write_report(report_dir, config, metrics)
  return metrics


def _step_history(batch_size):
  """A Keras callback collecting per-step loss, metric and throughput.
  (Built on demand: this module imports Keras only when a job runs, after
  the replicas' devices are configured.)"""
  import keras  # pylint: disable=g-import-not-at-top

  class StepHistory(keras.callbacks.Callback):

    def __init__(self):
      super().__init__()
      self.loss, self.metric, self.samples_per_second = [], [], []
      self.metric_name = None
      self.total_seconds = 0.0
      self._start = None

    def on_train_batch_begin(self, batch, logs=None):
      self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
      elapsed = time.perf_counter() - self._start
      self.total_seconds += elapsed
      logs = logs or {}
      self.loss.append(float(logs.get("loss", float("nan"))))
      self.metric_name = next((k for k in logs if k in ("auc", "rmse")), None)
      self.metric.append(float(logs[self.metric_name]) if self.metric_name
                         else float("nan"))
      self.samples_per_second.append(batch_size / max(elapsed, 1e-9))

    @property
    def steps(self):
      return len(self.loss)

    def as_dict(self):
      return {"loss": self.loss, "metric_name": self.metric_name,
              "metric": self.metric, "samples_per_second": self.samples_per_second}

  return StepHistory()


def _shard_stats(layer, dataset, replicas):
  """Rows held and lookups served per shard, over the eval data."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  held = np.zeros(replicas, np.int64)
  lookups = np.zeros(replicas, np.int64)
  tables = {}
  for name, table in layer.tables.items():
    values, _ = dataset.features[name]
    if table.replicated:
      held += table.vocabulary_size
      per_shard = np.full(replicas, len(values) // replicas)
    else:
      held += [len(range(r, table.vocabulary_size, replicas)) for r in range(replicas)]
      per_shard = np.bincount(values % replicas, minlength=replicas)
    lookups += per_shard
    tables[name] = {"replicated": table.replicated,
                    "lookups_per_shard": per_shard.tolist()}
  return {"rows_held": held.tolist(), "lookups": lookups.tolist(), "tables": tables}


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
  shards = metrics["shards"]
  lines += ["", "| shard | rows held | lookups (eval) |", "|---|---|---|"]
  for r, (h, l) in enumerate(zip(shards["rows_held"], shards["lookups"])):
    lines.append(f"| {r} | {h:,} | {l:,} |")
  lines += [""] + [f"![{p}]({p})" for p in plots]
  with open(os.path.join(report_dir, "summary.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print(f"tfde train: report written to {report_dir}/ "
        f"(metrics.json, summary.md, {', '.join(plots)})")


def _plots(report_dir, metrics):
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    print("tfde train: matplotlib is not installed; no plots")
    return []
  h = metrics["history"]
  written = []
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  axes[0].plot(h["loss"])
  axes[0].set(title="training loss", xlabel="step")
  axes[1].plot(h["metric"], color="tab:green")
  axes[1].set(title=f"training {h['metric_name'] or 'metric'} (running)", xlabel="step")
  fig.tight_layout()
  fig.savefig(os.path.join(report_dir, "training.png"), dpi=90)
  written.append("training.png")
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(h["samples_per_second"])
  ax.set(title="throughput", xlabel="step", ylabel="samples / s")
  fig.tight_layout()
  fig.savefig(os.path.join(report_dir, "throughput.png"), dpi=90)
  written.append("throughput.png")
  shards = metrics["shards"]
  fig, axes = plt.subplots(1, 2, figsize=(10, 4))
  axes[0].bar(range(len(shards["rows_held"])), shards["rows_held"])
  axes[0].set(title="rows held per shard", xlabel="shard")
  axes[1].bar(range(len(shards["lookups"])), shards["lookups"], color="tab:orange")
  axes[1].set(title="lookups per shard (eval data)", xlabel="shard")
  fig.tight_layout()
  fig.savefig(os.path.join(report_dir, "shards.png"), dpi=90)
  written.append("shards.png")
  plt.close("all")
  return written


def main(argv=None):
  parser = argparse.ArgumentParser(prog="tfde", description="tfde: TensorFlow "
                                   "Distributed Embeddings")
  sub = parser.add_subparsers(dest="command", required=True)
  train = sub.add_parser("train", help="train a ranking model from a config")
  train.add_argument("--config", required=True, help="a YAML job config")
  train.add_argument("--data", help="a MovieLens ratings.csv instead of "
                     "generated data")
  train.add_argument("--report-dir", help="where to write the report")
  args = parser.parse_args(argv)
  try:
    config = load_config(args.config)
  except ConfigError as e:
    print(f"tfde: error: {e}", file=sys.stderr)
    return 2
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  run_job(config, data_path=args.data, report_dir=args.report_dir)
  return 0


if __name__ == "__main__":
  sys.exit(main())
