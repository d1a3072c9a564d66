"""Checks of a checkpoint's tables made before a restore reads anything:
a restore refused for one table (another shape, another optimizer's
slots) then changes no variable of the model, dense layers and counters
included (TensorFlow's own restore assigns each object in turn, so a check
made when a table's turn comes is too late for those restored before it).
"""

import tensorflow as tf


class _Shaped:
  """A stand-in for a checkpoint tensor that carries only its shape (what
  `Table.check_state` checks, without reading the values)."""

  def __init__(self, shape):
    self.shape = tuple(shape)


def check_tables_in_checkpoint(path, tables, table_keys):
  """Raises ValueError naming the table (and `path`) when the checkpoint at
  `path` holds a state that `tables` ({table path: table}) cannot load;
  `table_keys` maps each table path to its key in the checkpoint. Reads
  shapes only."""
  shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
  for table_path, table in tables.items():
    prefix = f"{table_keys[table_path]}/.ATTRIBUTES/"
    state = {key[len(prefix):]: _Shaped(shape) for key, shape in shapes.items()
             if key.startswith(prefix)}
    try:
      table.check_state(state)
    except ValueError as e:
      raise ValueError(f"checkpoint {path}: {e}; nothing was restored") from None


def check_during_traversal(table, walk):
  """Called from a table's `_trackable_children`: when `walk` (from
  `tf_internals.checkpoint_traversed_by_caller`: the checkpoint's path and
  the shapes of the table's state in it) says TensorFlow's restore is walking the object
  graph (`tf.train.Checkpoint.read` or `restore`, TF 2.18 to 2.21), checks
  the table against the checkpoint's shapes there. The walk visits every
  object before the restore assigns any, so a table that does not fit
  stops it with the dense variables unchanged too
  (tests/unit/test_delta_manifest.py fails should a release move this)."""
  if walk is None:
    return
  path, shapes = walk
  state = {name: _Shaped(shape) for name, shape in shapes.items()}
  try:
    table.check_state(state)
  except ValueError as e:
    raise ValueError(f"checkpoint {path}: {e}; nothing was restored") from None
