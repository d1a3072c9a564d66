"""`tfde train --delta-every N`: while training, every N steps a delta
checkpoint of the whole model (`tfde.checkpoint.DeltaCheckpointManager`)
and a delta export of it for serving (`tfde.serving.export_delta`: the
tables' changed rows, the dense layers whole), sizes recorded for the
report.

>>> from tfde.app import continuous
>>> continuous.summary_lines([{"step": 10, "checkpoint": "full",
...     "checkpoint_bytes": 2048, "export": "full", "export_bytes": 4096,
...     "export_rows": 0}])[-1]
'| 10 | full | 2.0 KB | full | 4.0 KB |  |'
"""

import os

# Chains of full checkpoint + deltas: one full every this many saves.
FULL_EVERY_N = 10


def _directory_bytes(path):
  return sum(os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(path) for name in names)


def delta_saver(model, report_dir, every, example_inputs):
  """A Keras callback saving a delta checkpoint of `model` and a delta
  export of it (served on inputs like `example_inputs`, one batch of the
  job's data) every `every` training steps (the first of each:
  whole) under `report_dir` (delta_checkpoints/, serving/); its `records`
  list what each wrote."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import tfde  # pylint: disable=g-import-not-at-top

  class DeltaSaver(keras.callbacks.Callback):

    def __init__(self):
      super().__init__()
      self.records = []
      self.steps = 0
      self.manager = tfde.checkpoint.DeltaCheckpointManager(
          tf.train.Checkpoint(model=model), os.path.join(report_dir, "delta_checkpoints"),
          full_every_n=FULL_EVERY_N, max_to_keep=2)
      self.manager.clear()  # a new job starts its own chains
      self.serving_dir = os.path.join(report_dir, "serving")
      self.previous_export = None

    def on_train_batch_end(self, batch, logs=None):
      self.steps += 1
      if self.steps % every:
        return
      self.manager.save(checkpoint_number=self.steps)
      link = self.manager.links()[-1]
      record = {"step": self.steps, "checkpoint": link["kind"],
                "checkpoint_bytes": link["bytes"]}
      if self.previous_export is None:
        path = os.path.join(self.serving_dir, f"full-{self.steps}")
        tfde.export_for_serving(model, path, example_inputs)
        record.update(export="full", export_bytes=_directory_bytes(path), export_rows=0)
      else:
        path = os.path.join(self.serving_dir, f"delta-{self.steps}")
        info = tfde.serving.export_delta(model, path, base=self.previous_export)
        record.update(export="delta", export_bytes=info["bytes"],
                      export_rows=info["rows"])
      self.previous_export = path
      self.records.append(record)

  return DeltaSaver()


def _size(n):
  for unit in ("B", "KB", "MB", "GB"):
    if n < 1024 or unit == "GB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024


def summary_lines(records):
  """The report's table of what each save wrote."""
  lines = ["", "| step | checkpoint | size | export | size | rows changed |",
           "|---|---|---|---|---|---|"]
  for r in records:
    rows = f"{r['export_rows']:,}" if r["export"] == "delta" else ""
    lines.append(f"| {r['step']} | {r['checkpoint']} | {_size(r['checkpoint_bytes'])} | "
                 f"{r['export']} | {_size(r['export_bytes'])} | {rows} |")
  return lines
