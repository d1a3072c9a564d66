"""Checkpoints and warm starts.

tfde tables save through the standard machinery (`tf.train.Checkpoint`,
`tf.train.CheckpointManager`, Keras `save_weights` / `model.save`) as whole
[V, D] tables plus their optimizer slots and step, so a checkpoint written
with N replicas restores with M:

>>> import tensorflow as tf, tfde
>>> cfg = tfde.TableConfig(name="t", vocabulary_size=10, embedding_dim=2)
>>> lookup = tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=cfg)})
>>> path = tf.train.Checkpoint(lookup=lookup).write("/tmp/tfde_doc/ckpt")

`DeltaCheckpointManager` (tfde/saving/delta_checkpoint.py) writes a full
checkpoint every n saves and only the changed rows in between.

Warm starts load a table from a numpy array, or from a variable in a
checkpoint of a plain `keras.layers.Embedding` or `tf.Variable`:

>>> import numpy as np
>>> tfde.checkpoint.warm_start(lookup.tables["t"], np.ones((10, 2)))
>>> float(lookup.tables["t"].full_table().sum())
20.0
"""

import numpy as np
import tensorflow as tf

from tfde.saving.delta_checkpoint import DeltaCheckpointManager  # noqa: F401 (public)


def _resolve(path):
  if tf.io.gfile.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if latest is None:
      raise ValueError(f"no checkpoint in {path}")
    return latest
  return path


def warm_start(table, source, variable_name=None):
  """Sets a table's rows from `source`, keeping its optimizer slots.

  Args:
    table: a static table (`tfde.tables.ShardedTable`).
    source: a [V, D] array, or the path of a checkpoint holding a variable
      of that shape (a `keras.layers.Embedding`'s `embeddings`, a
      `tf.Variable`, ...).
    variable_name: the variable in that checkpoint; may be omitted when
      exactly one variable there has the table's shape.
  """
  if table.is_dynamic:
    raise ValueError(f"table {table.name!r} is dynamic: warm-start it with "
                     "DynamicTable.assign_rows(ids, rows)")
  expected = (table.vocabulary_size, table.embedding_dim)
  if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
    path = _resolve(str(source))
    candidates = [(n, tuple(s)) for n, s in tf.train.list_variables(path)]
    if variable_name is None:
      matching = [n for n, s in candidates if s == expected and
                  "OPTIMIZER_SLOT" not in n and "/m/" not in n]
      if len(matching) != 1:
        raise ValueError(
            f"table {table.name!r}: {len(matching)} variables of shape "
            f"{expected} in {path} ({matching}); name one with variable_name")
      variable_name = matching[0]
    shapes = dict(candidates)
    if variable_name not in shapes:
      raise ValueError(f"table {table.name!r}: no variable {variable_name!r} in "
                       f"{path}")
    if shapes[variable_name] != expected:
      raise ValueError(f"table {table.name!r}: {variable_name!r} has shape "
                       f"{shapes[variable_name]}, the table is {expected}")
    source = tf.train.load_variable(path, variable_name)
  source = np.asarray(source, np.float32)
  dtype = tf.as_dtype(table.config.dtype)
  if dtype != tf.float32:
    over = np.argwhere(np.isfinite(source) & (np.abs(source) > float(dtype.max)))
    if over.size:
      row, column = over[0]
      raise ValueError(
          f"table {table.name!r}: warm_start value {source[row, column]!r} at row "
          f"{row}, column {column} is beyond the largest finite {dtype.name} "
          f"({float(dtype.max)!r}) and would be stored as inf; {len(over)} "
          "value(s) are; scale or clip them first")
  # Through the table's whole state: its slots and step stay as they are.
  state = table.state()
  state["table"] = tf.convert_to_tensor(source)
  table.load_state(state, source="saved")


def restore_tables(tables, path):
  """Restores `tables` (a dict of name -> table, e.g. a layer's `tables`)
  from a `tf.train.Checkpoint` written with tables of other row types.

  A checkpoint keeps rows in their table's type (bfloat16 rows as
  bfloat16); `tf.train.Checkpoint.read` restores only into tables of that
  type. This reads each table's state (found by its name under any object
  path) whatever its type and loads it: bfloat16 or float16 rows into a
  float32 table exactly, float32 rows into a reduced-precision table
  rounded to nearest. Every table is checked before any is written.

  >>> import tensorflow as tf, tfde
  >>> half = tfde.TableConfig(name="u", vocabulary_size=4, embedding_dim=2,
  ...                         dtype="bfloat16")
  >>> saved = tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=half)})
  >>> path = tf.train.Checkpoint(lookup=saved).write("/tmp/tfde_doc/half")
  >>> full = tfde.TableConfig(name="u", vocabulary_size=4, embedding_dim=2)
  >>> lookup = tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=full)})
  >>> restore_tables(lookup.tables, path)
  >>> bool((lookup.tables["u"].full_table() == saved.tables["u"].full_table()).all())
  True
  """
  path = _resolve(str(path))
  reader = tf.train.load_checkpoint(path)
  names = list(reader.get_variable_to_shape_map())
  states = {}
  for table_name, table in tables.items():
    state = {}
    for key in table.state_keys():
      suffix = f"/{table_name}/.ATTRIBUTES/{key}"
      found = [n for n in names if n.endswith(suffix)]
      if len(found) > 1:
        raise ValueError(f"table {table_name!r}: {len(found)} tables of that name "
                         f"in {path} ({found})")
      if found:
        state[key] = reader.get_tensor(found[0])
    table.check_state(state, source="checkpoint")
    states[table_name] = state
  for table_name, table in tables.items():
    table.load_state(states[table_name], source="checkpoint")
