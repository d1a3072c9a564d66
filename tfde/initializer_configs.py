"""A table's initializer as given: what a user may pass for
`TableConfig.initializer`, and the Keras initializer it means.

>>> import tensorflow as tf
>>> from tfde import initializer_configs
>>> type(initializer_configs.resolve("zeros", "t")).__name__
'Zeros'
>>> type(initializer_configs.resolve(tf.compat.v1.truncated_normal_initializer(), "t")).__name__
'TruncatedNormal'

Configs keep what was given and check it here; the tables' layer
(`tfde.initializers`) draws the rows of what it means. The doors' own
spellings (TF v1 initializers for mxRec, SOK's "random" and numbers)
become Keras initializers in `resolve`.
"""

import numpy as np

from tfde import tf_version


def default():
  """keras-rs's default, as its code has it: `VarianceScaling(mode=
  "fan_out")`, a normal truncated at two deviations whose rows' standard
  deviation is 1/sqrt(width) (its docstring's TruncatedNormal of that
  stddev would give 0.88 of it).

  >>> round(float(np.std(default()(shape=(20000, 16)))), 2)
  0.25
  """
  return tf_version.keras().initializers.VarianceScaling(mode="fan_out")


def is_array(initializer):
  """Whether `initializer` is a table's whole initial value (an array)."""
  if isinstance(initializer, np.ndarray):
    return True
  tf_version.check_tensorflow()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.is_tensor(initializer)


# TF initializers (v2 classes and v1 function names) that have a Keras
# twin: the Keras class and the config fields it takes.
_TF_TO_KERAS = {
    "Zeros": ("Zeros", ()), "zeros_initializer": ("Zeros", ()),
    "Ones": ("Ones", ()), "ones_initializer": ("Ones", ()),
    "Constant": ("Constant", ("value",)), "constant_initializer": ("Constant", ("value",)),
    "RandomUniform": ("RandomUniform", ("minval", "maxval")),
    "random_uniform_initializer": ("RandomUniform", ("minval", "maxval")),
    "RandomNormal": ("RandomNormal", ("mean", "stddev")),
    "random_normal_initializer": ("RandomNormal", ("mean", "stddev")),
    "TruncatedNormal": ("TruncatedNormal", ("mean", "stddev")),
    "truncated_normal_initializer": ("TruncatedNormal", ("mean", "stddev")),
}


def resolve(initializer, table_name, embedding_dim=None):
  """A Keras initializer from what a user may pass for a table.

  Accepts None (the default, which needs `embedding_dim`), a Keras
  initializer, its name or config dict, a TF initializer, any callable
  `f(shape, dtype)`, SOK's
  "random" (uniform in [-0.05, 0.05]), a number (a constant), or a [V, D]
  array (kept as is: a static table's whole initial value).
  """
  init = tf_version.keras().initializers
  if initializer is None:
    return default()
  if is_array(initializer):
    return initializer
  if isinstance(initializer, init.Initializer):
    return initializer
  if isinstance(initializer, (int, float)) and not isinstance(initializer, bool):
    return init.Constant(float(initializer))
  if initializer == "random":
    return init.RandomUniform(-0.05, 0.05)
  if isinstance(initializer, (str, dict)):
    try:
      return init.get(initializer)
    except ValueError as e:
      raise ValueError(f"table {table_name!r}: unknown initializer "
                       f"{initializer!r}") from e
  kind = type(initializer).__name__
  if kind in _TF_TO_KERAS and hasattr(initializer, "get_config"):
    keras_kind, fields = _TF_TO_KERAS[kind]
    cfg = initializer.get_config()
    return getattr(init, keras_kind)(**{k: float(np.asarray(cfg[k])) for k in fields})
  if callable(initializer):
    return initializer  # drawn for the whole table at once (shard_value)
  raise ValueError(f"table {table_name!r}: initializer {kind} cannot be used "
                   "for a table; pass a Keras initializer")
