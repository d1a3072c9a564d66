"""`tfde inspect`: what a checkpoint or SavedModel holds, table by table.

Reads the files only (`tf.train.load_checkpoint`), with no model, strategy
or op library: a table's checkpoint keys hold its whole state whatever the
replica count that wrote it (`tfde.tables.base.Table.state`), so a
checkpoint of 1, 2 or 4 replicas reads the same way.

>>> import numpy as np
>>> summary = TableSummary(name="t", path="m/tables/t", dynamic=False,
...     rows=np.ones((4, 2), np.float32), slots={}, step=3)
>>> summary.optimizer, summary.row_bytes, [float(x) for x in summary.norms]
('sgd', 32, [1.4142135381698608, 1.4142135381698608, 1.4142135381698608, 1.4142135381698608])

A table in a training checkpoint is the set of keys
`<owner>/tables/<name>/.ATTRIBUTES/<state key>` (state keys: `table`,
`slot_<name>` per optimizer slot, `step`, and for dynamic tables `ids`,
`counts`, `last_seen` and the pending ids). A SavedModel from
`tfde.export_for_serving` holds each table whole for serving, without
slots or step: a layer's under `<owner>/_serving_tables/<name>/...`, a
Keras model's under `tables/<layer>/<name>/...`. A delta export
(`tfde.serving.export_delta`, a folder with tfde_delta.json and VERSION)
holds per table its changed rows, their ids and the ids it deletes.
"""

import dataclasses
import json
import os
import re
import sys
from typing import Dict
from typing import Optional

import numpy as np

from tfde.app import plotting

# Slots -> the sparse optimizer that keeps them (tfde.optimizers).
OPTIMIZER_BY_SLOTS = {(): "sgd", ("accumulator",): "adagrad",
                      ("row_accumulator",): "rowwise_adagrad", ("m", "v"): "adam",
                      ("accumulator", "linear"): "ftrl"}
_TRAINING_KEY = re.compile(r"^(?P<path>.*/tables/(?P<name>[^/]+))/\.ATTRIBUTES/(?P<key>\w+)$")
_SERVING_KEY = re.compile(r"^(?P<path>.*/_serving_tables/(?P<name>[^/]+))(?P<dynamic>/rows)?"
                          r"/\.ATTRIBUTES/VARIABLE_VALUE$")
# Exports since delta serving: table i of the export's order, its name in
# assets.extra/tfde_delta.json ("layer/table"); a dynamic table's ids are
# its MutableHashTable's keys.
_ORDERED_KEY = re.compile(r"^(?P<path>ordered_tables/(?P<index>\d+))(?P<dynamic>/rows)?"
                          r"/\.ATTRIBUTES/VARIABLE_VALUE$")
# A Keras model's export: the served tables under the export's `tables`
# attribute, by embedding layer (`tfde.serving._Served`), the layer's own
# `_serving_tables` being the model's.
_MODEL_EXPORT_KEY = re.compile(r"^(?P<path>tables/(?P<layer>[^/]+)/(?P<name>[^/]+))"
                               r"(?P<dynamic>/rows)?/\.ATTRIBUTES/VARIABLE_VALUE$")
_DELTA_INFO = "tfde_delta.json"
_EXPORT_INFO = os.path.join("assets.extra", _DELTA_INFO)
TABLE_CONFIGS_FILE = "tables.json"   # written beside a checkpoint by `tfde train`


class InspectError(ValueError):
  """A path that is not a readable checkpoint or SavedModel (one line)."""


@dataclasses.dataclass
class TableSummary:
  """One table as stored.

  Attributes:
    name: The table's name.
    path: Its object path in the checkpoint.
    dynamic: Whether it is a dynamic (hash) table.
    rows: [rows, dim] the stored rows (live rows of a dynamic table).
    slots: slot name -> [rows, dim] optimizer slot.
    step: Optimizer steps applied, or None (a serving export has none).
    ids: A dynamic table's ids (row i is id ids[i]), or None.
    counts: A dynamic table's sighting counts per row, or None.
    config: The table's config as `tfde train` recorded it, or None.
    removed: In a delta export, the ids it deletes (None elsewhere); its
      `rows` are then the changed rows, of ids `ids`.
  """
  name: str
  path: str
  dynamic: bool
  rows: np.ndarray
  slots: Dict[str, np.ndarray]
  step: Optional[int]
  ids: Optional[np.ndarray] = None
  counts: Optional[np.ndarray] = None
  config: Optional[dict] = None
  removed: Optional[np.ndarray] = None

  @property
  def optimizer(self):
    if self.step is None:
      return None
    return OPTIMIZER_BY_SLOTS.get(tuple(sorted(self.slots)), "unknown")

  @property
  def row_bytes(self):
    return int(self.rows.nbytes)

  @property
  def slot_bytes(self):
    return int(sum(s.nbytes for s in self.slots.values()))

  @property
  def norms(self):
    return np.linalg.norm(self.rows.astype(np.float64), axis=1).astype(np.float32)

  def hot(self, k):
    """The k most frequent (id, count) pairs, or None without counts."""
    if self.counts is None:
      return None
    order = np.argsort(-self.counts, kind="stable")[:k]
    return [(int(self.ids[i]), int(self.counts[i])) for i in order]


def _resolve(path):
  """(checkpoint prefix, "checkpoint" | "savedmodel") for a user's path."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if os.path.isdir(path):
    if (os.path.exists(os.path.join(path, _DELTA_INFO)) and
        os.path.exists(os.path.join(path, "VERSION"))):
      return path, "delta export"
    if os.path.exists(os.path.join(path, "saved_model.pb")):
      return os.path.join(path, "variables", "variables"), "savedmodel"
    latest = tf.train.latest_checkpoint(path)
    if latest is not None:
      return latest, "checkpoint"
    # No 'checkpoint' state file (tf.train.Checkpoint.write writes none):
    # the folder's only checkpoint prefix, if it has one.
    prefixes = sorted(f[:-len(".index")] for f in os.listdir(path)
                      if f.endswith(".index"))
    if len(prefixes) == 1:
      return os.path.join(path, prefixes[0]), "checkpoint"
    if prefixes:
      raise InspectError(f"{path}: several checkpoints ({', '.join(prefixes)}); "
                         "name one, e.g. " + os.path.join(path, prefixes[-1]))
    raise InspectError(f"{path}: no checkpoint (no .index file) and no "
                       "saved_model.pb in this folder")
  if tf.io.gfile.exists(path + ".index"):
    return path, "checkpoint"
  raise InspectError(f"{path}: not a checkpoint prefix ({path}.index is missing), "
                     "a checkpoint folder or a SavedModel folder")


def read_tables(path):
  """[TableSummary] of every tfde table in a checkpoint or SavedModel."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  prefix, kind = _resolve(path)
  if kind == "delta export":
    return kind, _delta_tables(path)
  try:
    reader = tf.train.load_checkpoint(prefix)
  except (tf.errors.OpError, ValueError) as e:
    raise InspectError(f"{path}: cannot read the checkpoint: "
                       f"{str(e).splitlines()[0]}") from None
  keys = reader.get_variable_to_shape_map()
  configs = _table_configs(prefix)
  tables, model_tables = {}, {}
  for key in sorted(keys):
    match = _TRAINING_KEY.match(key)
    if match:
      entry = tables.setdefault(match["path"], {"name": match["name"], "keys": {}})
      entry["keys"][match["key"]] = key
      continue
    match = _SERVING_KEY.match(key)
    if match:
      # A dynamic table's ids are its MutableHashTable's keys (delta serving).
      ids_key = f"{match['path']}/index/.ATTRIBUTES/table-keys"
      tables[match["path"]] = {"name": match["name"], "serving": key,
                               "dynamic": bool(match["dynamic"]),
                               "ids": ids_key if ids_key in keys else None}
      continue
    match = _ORDERED_KEY.match(key) if kind == "savedmodel" else None
    if match:
      index = int(match["index"])
      names = _export_table_names(path)
      name = names[index].split("/")[-1] if index < len(names) else f"table_{index}"
      ids_key = f"{match['path']}/index/.ATTRIBUTES/table-keys"
      tables[match["path"]] = {"name": name, "serving": key,
                               "dynamic": bool(match["dynamic"]),
                               "ids": ids_key if ids_key in keys else None}
      continue
    match = _MODEL_EXPORT_KEY.match(key) if kind == "savedmodel" else None
    if match:
      ids_key = f"{match['path']}/index/.ATTRIBUTES/table-keys"
      model_tables[match["path"]] = {"name": match["name"], "serving": key,
                                     "dynamic": bool(match["dynamic"]),
                                     "ids": ids_key if ids_key in keys else None}
  # A layer's export holds its tables under the layer's path; the
  # export's `tables` then are the same variables, saved once.
  if not tables:
    tables = model_tables
  try:
    summaries = _summaries(reader, tables, configs)
  except (tf.errors.OpError, ValueError, IndexError) as e:
    # The index lists the tables; their data files are read only now.
    raise InspectError(f"{path}: cannot read the checkpoint's tables: "
                       f"{str(e).splitlines()[0]}") from None
  if not summaries:
    raise InspectError(f"{path}: holds no tfde table ({len(keys)} variables, none "
                       "under .../tables/<name>/, .../_serving_tables/<name>/, "
                       "tables/<layer>/<name>/ or ordered_tables/<i>/)")
  return kind, summaries


def _summaries(reader, tables, configs):
  """[TableSummary] of `tables` ({path: the keys read_tables found})."""
  summaries = []
  for table_path, entry in tables.items():
    name = entry["name"]
    if "serving" in entry:
      rows, ids = reader.get_tensor(entry["serving"]), None
      if entry.get("ids"):
        # The hash map's keys and values: id ids[i] is served row
        # values[i] (rows are appended as deltas add ids; the map's order
        # is its own), so the rows are taken in the ids' order.
        ids = reader.get_tensor(entry["ids"])
        rows = rows[reader.get_tensor(entry["ids"][:-len("keys")] + "values")]
      summaries.append(TableSummary(
          name, table_path, entry["dynamic"], rows,
          {}, None, ids=ids, config=configs.get(name)))
      continue
    stored = entry["keys"]
    if "table" not in stored:
      continue
    value = lambda k, stored=stored: reader.get_tensor(stored[k])  # noqa: E731
    slots = {k[len("slot_"):]: value(k) for k in stored if k.startswith("slot_")}
    dynamic = "ids" in stored
    summaries.append(TableSummary(
        name, table_path, dynamic, value("table"), slots,
        int(value("step")) if "step" in stored else None,
        ids=value("ids") if dynamic else None,
        counts=value("counts") if "counts" in stored else None,
        config=configs.get(name)))
  return summaries


def _delta_tables(path):
  """[TableSummary] of a delta export (`tfde.serving.export_delta`): per
  table its changed rows, their ids and the ids it deletes."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    with open(os.path.join(path, _DELTA_INFO), encoding="utf-8") as f:
      names = list(json.load(f)["tables"])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise InspectError(f"{path}: cannot read the delta's {_DELTA_INFO}: {e}") from None

  def read(name, dtype):
    try:
      return tf.io.parse_tensor(tf.io.read_file(os.path.join(path, name)), dtype).numpy()
    except (tf.errors.OpError, ValueError) as e:
      raise InspectError(f"{path}: cannot read the delta's {name}: "
                         f"{str(e).strip().splitlines()[0]}") from None

  summaries = []
  for i, full_name in enumerate(names):
    summaries.append(TableSummary(
        full_name.split("/")[-1], f"{full_name} (t{i}.*)", False,
        read(f"t{i}.rows", tf.float32), {}, None, ids=read(f"t{i}.ids", tf.int64),
        removed=read(f"t{i}.removed", tf.int64)))
  if not summaries:
    raise InspectError(f"{path}: a delta export of no tfde table")
  return summaries


def _export_table_names(path):
  """["layer/table", ...] of a serving export, in its tables' order."""
  try:
    with open(os.path.join(path, _EXPORT_INFO), encoding="utf-8") as f:
      return list(json.load(f).get("tables", []))
  except (OSError, ValueError):
    return []


def _table_configs(prefix):
  """name -> TableConfig dict from the tables.json `tfde train` writes
  beside its checkpoints (the checkpoint itself holds state, not configs)."""
  path = os.path.join(os.path.dirname(prefix), TABLE_CONFIGS_FILE)
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}


def _size(n):
  for unit in ("B", "KiB", "MiB", "GiB"):
    if n < 1024 or unit == "GiB":
      return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
    n /= 1024


def describe(summary, hot=0):
  """The lines `tfde inspect` prints for one table."""
  rows, dim = summary.rows.shape
  kind = "dynamic" if summary.dynamic else "static"
  if summary.removed is not None:
    return [f"table {summary.name} (delta; {summary.path})",
            f"  changed rows: {rows:,} x {dim} ({summary.rows.dtype})",
            f"  bytes: rows {_size(summary.row_bytes)}, ids "
            f"{_size(summary.ids.nbytes)}",
            f"  removed ids: {len(summary.removed):,}"] + (
                ["  hot ids: not kept (a serving export keeps no counts)"] if hot else [])
  lines = [f"table {summary.name} ({kind}; {summary.path})"]
  config = summary.config or {}
  shown = {k: config[k] for k in ("vocabulary_size", "embedding_dim", "combiner",
                                  "placement", "optimizer") if k in config}
  if shown:
    lines.append("  config: " + ", ".join(f"{k}={_short(v)}" for k, v in shown.items()))
  what = "live rows" if summary.dynamic else "rows"
  lines.append(f"  {what}: {rows:,} x {dim} ({summary.rows.dtype})")
  slot_names = ", ".join(sorted(summary.slots)) or "none"
  lines.append(f"  bytes: rows {_size(summary.row_bytes)}, slots "
               f"{_size(summary.slot_bytes)} ({slot_names})")
  if summary.step is None:
    lines.append("  optimizer: none stored (a serving export)")
  else:
    lines.append(f"  optimizer: {summary.optimizer}, step {summary.step:,}")
  if rows:
    norms = summary.norms
    q = np.percentile(norms, [0, 10, 50, 90, 99, 100])
    lines.append("  row norms: min {:.4g}  p10 {:.4g}  p50 {:.4g}  p90 {:.4g}  "
                 "p99 {:.4g}  max {:.4g}  (mean {:.4g}; {:,} zero rows)".format(
                     *q, float(norms.mean()), int((norms == 0).sum())))
  if hot:
    pairs = summary.hot(hot)
    if pairs is None and summary.step is None:
      lines.append("  hot ids: not kept (a serving export keeps no counts)")
    elif pairs is None:
      lines.append(f"  hot ids: not kept ({kind} tables keep no counts)")
    else:
      lines.append("  hot ids (id: sightings): " +
                   ", ".join(f"{i}: {c:,}" for i, c in pairs))
  return lines


def _short(value):
  if isinstance(value, dict):
    inner = value.get("config", value)
    kind = value.get("class_name") or value.get("kind") or ""
    lr = inner.get("learning_rate") if isinstance(inner, dict) else None
    return f"{kind}(lr={lr})" if lr is not None else str(kind or value)
  return str(value)


def write_plots(summaries, directory):
  """Row-norm histograms of every table and the sighting counts of the
  tables that keep them (rank vs count, log-log); returns the files."""
  plt = plotting.pyplot("tfde inspect")
  if plt is None:
    return []
  os.makedirs(directory, exist_ok=True)
  written = []
  fig, axes = plt.subplots(len(summaries), 1, figsize=(7, 2.6 * len(summaries)),
                           squeeze=False)
  for ax, s in zip(axes[:, 0], summaries):
    ax.hist(s.norms, bins=60, color="tab:blue")
    ax.set(title=f"table {s.name}: L2 norm of each row ({s.rows.shape[0]:,} rows)",
           xlabel="row norm (L2, embedding units)", ylabel="rows")
  fig.tight_layout()
  path = os.path.join(directory, "row_norms.png")
  fig.savefig(path, dpi=90)
  written.append(path)
  counted = [s for s in summaries if s.counts is not None and len(s.counts)]
  if counted:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in counted:
      ranked = np.sort(s.counts)[::-1]
      ax.loglog(np.arange(1, len(ranked) + 1), ranked, label=s.name)
    ax.set(title="id frequency (dynamic tables)", xlabel="id rank (most seen first)",
           ylabel="sightings (training lookups)")
    ax.legend()
    fig.tight_layout()
    path = os.path.join(directory, "id_frequency.png")
    fig.savefig(path, dpi=90)
    written.append(path)
  plt.close("all")
  return written


def inspect_command(args):
  """`tfde inspect` once its arguments are parsed; returns the exit code."""
  if args.hot < 0:
    print(f"tfde: error: --hot: must be >= 0, got {args.hot}", file=sys.stderr)
    return 2
  try:
    kind, summaries = read_tables(args.path)
  except InspectError as e:
    print(f"tfde: error: {e}", file=sys.stderr)
    return 2
  total = sum(s.row_bytes + s.slot_bytes for s in summaries)
  print(f"{args.path}: {kind}, {len(summaries)} tables, {_size(total)} of rows and slots")
  for s in summaries:
    print("\n".join(describe(s, args.hot)))
  if args.plot:
    files = write_plots(summaries, args.plot)
    if files:
      print(f"plots: {', '.join(files)}")
  return 0
