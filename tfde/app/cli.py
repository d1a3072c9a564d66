"""The main job: `tfde train --config configs/demo.yaml`.

Builds a DLRM-style ranking model (sharded embeddings for the sparse
features, a bottom MLP for the dense ones, pairwise dot interactions and
the vectors themselves into a top MLP), trains it with N replicas (logical
CPU devices here, GPUs where present) under Keras `fit` with a progress
bar, evaluates train and eval after each epoch, and writes a report
folder: metrics.json, summary.md, PNG plots (train and eval loss and AUC
or RMSE per epoch, samples per second per step, rows held and lookups
served per shard), TensorBoard logs (`TensorBoardLog`; `--projector
TABLE` for the embedding projector) and a checkpoint with tables.json
(what `tfde inspect` reads).

    tfde train --config configs/demo.yaml [--data ratings.csv] [--report-dir D]

The default data is generated (Criteo-like, with a hidden true model);
`--data PATH` (or data.kind: movielens) trains on a MovieLens ratings CSV.

Before any work the whole config is checked against its schema
(`tfde.app.config`: types, ranges and the rules between keys), the data
file is opened and the report folder written to; any problem ends the
command with one line on stderr naming the file and the key (or the file,
line and column of a YAML error) and exit code 2:

    tfde: error: configs/x.yaml: model.bottom_mlp: must be a list of positive ints, got 8
"""

import os
import sys
import time

from tfde.app import job_checks
from tfde.app import limits
from tfde.app.config import ConfigError  # noqa: F401 (the schema, re-exported)
from tfde.app.config import DataConfig  # noqa: F401 (the schema, re-exported)
from tfde.app.config import DenseOptimizerConfig  # noqa: F401 (the schema, re-exported)
from tfde.app.config import JobConfig  # noqa: F401 (the schema, re-exported)
from tfde.app.config import ModelConfig  # noqa: F401 (the schema, re-exported)
from tfde.app.config import SparseFeatureConfig  # noqa: F401 (the schema, re-exported)
from tfde.app.config import TableOptimizerConfig  # noqa: F401 (the schema, re-exported)
from tfde.app.config import TrainingConfig  # noqa: F401 (the schema, re-exported)
from tfde.app.config import load_config  # noqa: F401 (the schema, re-exported)
from tfde.app.model import build_model
from tfde.app.model import most_ids_per_sample
from tfde.app.report import TensorBoardLog
from tfde.app.report import exchange_statistics
from tfde.app.report import save_checkpoint
from tfde.app.report import shard_stats
from tfde.app.report import write_projector
from tfde.app.report import write_report


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


def run_job(config, data_path=None, report_dir=None, verbose=1, config_file=None,
            projector=(), delta_every=0, plan_path=None):
  """Trains, evaluates and reports; returns the metrics dict.

  Raises ConfigError (naming `config_file`) if the data read turns out too
  small for the config, and data.DataError for a bad ratings file, both
  before training."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  strategy = _strategy(config.replicas)  # before TensorFlow starts its runtime
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from tfde.app import data as data_lib  # pylint: disable=g-import-not-at-top

  report_dir = report_dir or config.report_dir
  keras.utils.set_random_seed(config.seed)
  d = config.data
  batch = config.training.batch_size
  if data_path or d.kind == "movielens":
    path = data_path or d.path
    full = data_lib.movielens(path, max_samples=d.train_samples + d.eval_samples)
    source = f"MovieLens ratings from {path}"
    if full.size <= d.eval_samples:
      raise ConfigError("data.eval_samples", f"must be less than the {full.size} "
                        f"ratings in {path}, got {d.eval_samples}", file=config_file)
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
  if min(train.size, evaluation.size) < batch:
    raise ConfigError("training.batch_size", f"must be at most the {train.size} "
                      f"train and {evaluation.size} eval samples of {source}, "
                      f"got {batch}", file=config_file)
  dense = "dense" in full.features
  print(f"tfde train: {config.name}: {source}; {train.size} train / "
        f"{evaluation.size} eval samples; {strategy.num_replicas_in_sync} replicas "
        f"({', '.join(strategy.extended.worker_devices)})", flush=True)

  plan = None
  if plan_path:
    from tfde.app import plan_command  # pylint: disable=g-import-not-at-top
    plan = plan_command.load_plan(plan_path, strategy.num_replicas_in_sync,
                                  full.vocabulary)
    kinds = sorted({layout.kind for layout in plan.tables.values()})
    print(f"tfde train: tables laid out by {plan_path} ({', '.join(kinds)})",
          flush=True)
  with strategy.scope():
    # Each sparse feature's most ids a sample, from the data.
    hotness = most_ids_per_sample(full.features, full.vocabulary)
    model = build_model(config, full.vocabulary, full.task, dense, plan=plan,
                        hotness=hotness)

  unknown = sorted(set(projector) - set(full.vocabulary))
  if unknown:
    raise ConfigError("--projector", f"no table {unknown[0]!r}; the tables are "
                      f"{', '.join(sorted(full.vocabulary))}")
  history = _step_history(batch)
  eval_ds = data_lib.to_tf_dataset(evaluation, batch)
  # Per-epoch curves measured the same way on both sides: after each epoch,
  # the model as it stands is evaluated on the eval data and on an
  # eval-sized slice of the train data (not Keras's running averages,
  # which mix the whole epoch's models and restart at every epoch).
  train_probe = data_lib.to_tf_dataset(
      train.split(min(1.0, evaluation.size / train.size))[0], batch)
  tables = model.embedding.tables
  board = TensorBoardLog(os.path.join(report_dir, "tensorboard"))
  epochs = {"epoch": [], "train": [], "eval": []}
  callbacks = [history]
  if delta_every:  # a continuous job: delta checkpoints and exports (tfde/app/continuous.py)
    from tfde.app import continuous  # pylint: disable=g-import-not-at-top
    callbacks.append(continuous.delta_saver(
        model, report_dir, delta_every,
        next(iter(eval_ds))[0]))
  for epoch in range(config.training.epochs):
    # Shuffled in numpy, so the job knows each step's ids (its statistics).
    order = train.permuted(config.seed * 1000 + epoch)
    first_step = history.steps
    model.fit(data_lib.to_tf_dataset(order, batch), epochs=epoch + 1,
              initial_epoch=epoch, shuffle=False, verbose=verbose,
              callbacks=callbacks)
    epochs["epoch"].append(epoch + 1)
    epochs["train"].append(model.evaluate(train_probe, verbose=0, return_dict=True))
    epochs["eval"].append(model.evaluate(eval_ds, verbose=0, return_dict=True))
    board.steps(history, first_step,
                exchange_statistics(order, tables, batch, strategy.num_replicas_in_sync,
                                    model.embedding.exchanges()))
    board.epoch(history.steps, epochs["train"][-1], epochs["eval"][-1])
    if verbose:
      print(f"epoch {epoch + 1}: " + ", ".join(
          f"{side} {k} {v:.4f}" for side in ("train", "eval")
          for k, v in sorted(epochs[side][-1].items())), flush=True)
  board.close()
  checkpoint_dir = os.path.join(report_dir, "checkpoint")
  save_checkpoint(model, checkpoint_dir, history.steps)
  if projector:
    write_projector(os.path.join(report_dir, "tensorboard"),
                    {name: tables[name].state(keys=("table",))["table"].numpy()
                     for name in projector}, train)
  results = epochs["eval"][-1]
  scores = model.predict(eval_ds, verbose=0).ravel()
  labels = evaluation.labels[:len(scores)]
  metrics = {"name": config.name, "config": config.get_config(),
             "task": full.task, "data": source,
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
  else:
    # The RMSE of always predicting the mean train rating: what learning
    # has to beat.
    metrics["baseline_rmse"] = float(np.sqrt(np.mean(
        (labels - float(train.labels.mean())) ** 2)))
  metrics["shards"] = shard_stats(model.embedding, evaluation,
                                   strategy.num_replicas_in_sync)
  metrics["history"] = history.as_dict()
  if delta_every:
    metrics["deltas"] = callbacks[-1].records
  metrics["epochs"] = {"epoch": epochs["epoch"],
                       "train": [{k: float(v) for k, v in e.items()} for e in epochs["train"]],
                       "eval": [{k: float(v) for k, v in e.items()} for e in epochs["eval"]]}
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


def train_command(args, config=None):
  """`tfde train` once its arguments are parsed (`tfde.app.command` parses
  them, checks the job with `job_checks.train_job` before TensorFlow loads
  and passes its `config`, then loads TensorFlow quietly); returns the exit
  code."""
  from tfde.app import data as data_lib  # pylint: disable=g-import-not-at-top
  try:
    if config is None:
      config = job_checks.train_job(args)
    run_job(config, data_path=args.data, report_dir=args.report_dir,
            config_file=args.config, projector=tuple(args.projector),
            delta_every=getattr(args, "delta_every", 0),
            plan_path=getattr(args, "plan", None))
  except (ConfigError, data_lib.DataError) as e:
    print(f"tfde: error: {e}", file=sys.stderr)
    return 2
  except Exception as e:  # pylint: disable=broad-except
    # A disk that fills up mid-run (a report, a checkpoint, an export):
    # OSError from Python's writes, an OpError from TensorFlow's.
    line = limits.disk_full(e)
    if line is None:
      raise
    print(f"tfde: error: {line}", file=sys.stderr)
    return 1
  return 0


def plan_command_main(args, checked=None):
  """`tfde plan` once its arguments are parsed (`checked`: what
  `job_checks.plan_job` gave, before TensorFlow loaded); returns the exit
  code."""
  from tfde.app import data as data_lib  # pylint: disable=g-import-not-at-top
  from tfde.app import plan_command  # pylint: disable=g-import-not-at-top
  try:
    config, memory = job_checks.plan_job(args) if checked is None else checked
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    plan_command.run_plan(config, args.replicas, memory, args.report_dir,
                          args.data, config_file=args.config)
  except (ConfigError, data_lib.DataError) as e:
    print(f"tfde: error: {e}", file=sys.stderr)
    return 2
  return 0


def main(argv=None):
  """`python -m tfde.app.cli ...`, the same as the `tfde` command."""
  from tfde.app import command  # pylint: disable=g-import-not-at-top
  return command.main(argv)


if __name__ == "__main__":
  sys.exit(main())
