"""`tfde plan --config configs/demo.yaml`: the sharding plan of a job's
tables (`tfde.planner`), written as text, JSON and a plot.

    tfde plan --config configs/demo.yaml [--replicas 4]
              [--memory-per-replica 64MiB] [--report-dir D]

The tables are the job's (one per sparse feature, the model's width and
table optimizer); ids per sample and unique ids per replica are measured
on one global batch of the job's data. Writes plan.txt (the report),
plan.json (the plan, `ShardingPlan.from_json` reads it back) and plan.png
(bytes held and exchanged per replica, tables per kind).

>>> parse_bytes("64MiB"), parse_bytes("1.5GB"), parse_bytes("4096")
(67108864, 1500000000, 4096)
"""

import os

from tfde.app import plotting
from tfde.app.config import ConfigError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text):
  """'64MiB', '1.5GB', '4096' -> bytes (int); ValueError otherwise."""
  value = str(text).strip().lower().replace(" ", "")
  number = value.rstrip("kmgtib")
  unit = value[len(number):]
  try:
    result = int(float(number) * _UNITS[unit])
  except (KeyError, ValueError, OverflowError):  # OverflowError: "inf"
    raise ValueError(f"not a size in bytes: {text!r} (e.g. 4096, 64MiB, "
                     "1.5GB)") from None
  if result <= 0:
    raise ValueError(f"a size in bytes must be positive, got {text!r}")
  return result


def job_features(config, data_path=None):
  """(feature configs, one global batch of their ids) of a job config."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from tfde.app import data as data_lib  # pylint: disable=g-import-not-at-top
  from tfde.app import model  # pylint: disable=g-import-not-at-top
  d = config.data
  batch = config.training.batch_size
  if data_path or d.kind == "movielens":
    sample = data_lib.movielens(data_path or d.path, max_samples=batch)
  else:
    sample = data_lib.synthetic(data_lib.SyntheticSpec(
        sparse=[data_lib.SparseFeature(f.name, f.vocabulary_size, f.hotness)
                for f in d.sparse_features],
        dense_features=0, samples=batch, zipf_alpha=d.zipf_alpha), seed=config.seed)
  # Declared as `tfde train` declares them (there the most over the
  # whole data, here over this batch): the layer picks its exchange by
  # them, and the planner estimates it.
  by_name = model.feature_configs(config, sample.vocabulary, model.most_ids_per_sample(
      sample.features, sample.vocabulary))
  features, inputs = [by_name[name] for name in sorted(by_name)], {}
  for name in sorted(by_name):
    value = sample.features[name]
    if isinstance(value, tuple):
      values, lengths = value
      inputs[name] = tf.RaggedTensor.from_row_lengths(
          np.asarray(values, np.int64), np.asarray(lengths, np.int64))
    else:
      inputs[name] = tf.constant(np.asarray(value, np.int64))
  return features, inputs


def run_plan(config, replicas=None, memory_per_replica_bytes=None, report_dir=None,
             data_path=None, config_file=None):
  """Plans the job's tables, prints the report and writes the files;
  returns the plan. A plan that cannot fit raises ConfigError naming the
  memory option."""
  from tfde import planner  # pylint: disable=g-import-not-at-top
  replicas = replicas or config.replicas
  report_dir = report_dir or config.report_dir
  features, sample = job_features(config, data_path)
  try:
    plan = planner.plan(features, replicas,
                        memory_per_replica_bytes=memory_per_replica_bytes,
                        sample_inputs=sample)
  except planner.PlanError as e:
    raise ConfigError("--memory-per-replica", str(e), file=config_file) from None
  os.makedirs(report_dir, exist_ok=True)
  text = plan.report()
  with open(os.path.join(report_dir, "plan.txt"), "w") as f:
    f.write(text + "\n")
  with open(os.path.join(report_dir, "plan.json"), "w") as f:
    f.write(plan.to_json())
  written = ["plan.txt", "plan.json"] + plot_plan(plan, report_dir)
  print(f"tfde plan: wrote {report_dir}/ ({', '.join(written)})")
  return plan


def load_plan(path, replicas, tables):
  """The plan in `path` (a `tfde plan` plan.json), checked against the job
  it is to lay out: its replica count and its tables, each with a layout.
  Raises ConfigError naming `--plan`."""
  from tfde import planner  # pylint: disable=g-import-not-at-top
  try:
    with open(path) as f:
      plan = planner.ShardingPlan.from_json(f.read())
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConfigError("--plan", f"{path} is not a tfde plan (plan.json of "
                      f"`tfde plan`): {e}") from None
  if plan.num_replicas != replicas:
    raise ConfigError("--plan", f"{path} lays the tables out over "
                      f"{plan.num_replicas} replicas, but the job runs on "
                      f"{replicas} (the config's replicas)")
  for name in sorted(tables):
    if name not in plan.tables:
      raise ConfigError("--plan", f"{path} has no layout for table {name!r}; it "
                        f"lays out {', '.join(sorted(plan.tables))}")
  unknown = sorted(set(plan.tables) - set(tables))
  if unknown:
    raise ConfigError("--plan", f"{path} lays out table {unknown[0]!r}, which the "
                      f"job does not have; its tables: {', '.join(sorted(tables))}")
  return plan


def plot_plan(plan, report_dir):
  """plan.png: bytes held and exchanged per replica, tables per kind."""
  plt = plotting.pyplot("tfde plan")
  if plt is None:
    return []
  p = plan.per_replica
  replicas = range(plan.num_replicas)
  fig, axes = plt.subplots(1, 3, figsize=(14, 4))
  axes[0].bar(replicas, [b / 2**20 for b in p["bytes_held"]])
  axes[0].set(title="rows + slots held per replica", xlabel="replica", ylabel="MiB")
  if plan.memory_per_replica_bytes:
    axes[0].axhline(plan.memory_per_replica_bytes / 2**20, color="red", ls="--",
                    label="budget")
    axes[0].legend()
  axes[1].bar(replicas, [b / 2**20 for b in p["bytes_exchanged"]], color="tab:orange")
  axes[1].set(title="bytes exchanged per step (est.)", xlabel="replica", ylabel="MiB")
  kinds = {}
  for layout in plan.tables.values():
    kinds[layout.kind] = kinds.get(layout.kind, 0) + 1
  axes[2].bar(list(kinds), list(kinds.values()), color="tab:green")
  axes[2].set(title="tables per kind")
  fig.tight_layout()
  fig.savefig(os.path.join(report_dir, "plan.png"), dpi=90)
  plt.close(fig)
  return ["plan.png"]
