"""How table rows start: the rows drawn for what a config's initializer
means (`tfde.initializer_configs` translates what a user may pass).

>>> import keras, tensorflow as tf
>>> from tfde import initializers
>>> type(initializers.resolve("zeros", "t")).__name__
'Zeros'
>>> type(initializers.resolve(tf.compat.v1.truncated_normal_initializer(), "t")).__name__
'TruncatedNormal'
>>> initializers.per_id(keras.initializers.RandomUniform(-1.0, 1.0), 4, "t")
('uniform', -1.0, 1.0)

Static tables draw their rows in chunks of `CHUNK_ROWS` global rows, each
a function of (seed, chunk) only, so a table is the same whatever its
replica count (`shard_value`). Dynamic tables draw each row from (seed,
id) in their kernel, which reproduces a few distributions (`per_id`).
Each takes an initializer as a config keeps it, or the Keras one it means.
"""

import numpy as np
import tensorflow as tf

from tfde import initializer_configs
from tfde import sharding

# Rows generated per random draw when initialising: the values of a chunk
# depend only on (seed, chunk index), never on the shard count.
CHUNK_ROWS = 65536

# The truncated normal's stddev over the untruncated one's (Keras's
# constant for truncating at two standard deviations).
_TRUNCATED_STDDEV = 0.87962566103423978


# Old import paths of what a config checks (`tfde.initializer_configs`).
default = initializer_configs.default
is_array = initializer_configs.is_array
resolve = initializer_configs.resolve


def _chunk_values(initializer, chunk, rows, dim, vocabulary_size, seed):
  """Initial values of global rows [chunk*K, chunk*K + rows), or None for
  an initializer that cannot be drawn chunk by chunk."""
  import keras  # pylint: disable=g-import-not-at-top
  init = keras.initializers
  shape = (rows, dim)
  stateless_seed = tf.constant([seed, chunk], tf.int64)
  cfg = initializer.get_config() if hasattr(initializer, "get_config") else {}
  if isinstance(initializer, init.Zeros):
    return tf.zeros(shape)
  if isinstance(initializer, init.Ones):
    return tf.ones(shape)
  if isinstance(initializer, init.Constant):
    return tf.fill(shape, tf.constant(cfg["value"], tf.float32))
  if isinstance(initializer, init.TruncatedNormal):
    return cfg["mean"] + cfg["stddev"] * tf.random.stateless_truncated_normal(
        shape, stateless_seed)
  if isinstance(initializer, init.RandomNormal):
    return cfg["mean"] + cfg["stddev"] * tf.random.stateless_normal(
        shape, stateless_seed)
  if isinstance(initializer, init.RandomUniform):
    return tf.random.stateless_uniform(shape, stateless_seed, cfg["minval"],
                                       cfg["maxval"])
  if isinstance(initializer, init.VarianceScaling):
    # Keras's fans for a [V, D] matrix: fan_in = V, fan_out = D.
    fan_in, fan_out = float(vocabulary_size), float(dim)
    fan = {"fan_in": fan_in, "fan_out": fan_out,
           "fan_avg": (fan_in + fan_out) / 2.0}[initializer.mode]
    scale = initializer.scale / max(1.0, fan)
    distribution = initializer.distribution
    if distribution == "truncated_normal":
      return (np.sqrt(scale) / _TRUNCATED_STDDEV *
              tf.random.stateless_truncated_normal(shape, stateless_seed))
    if distribution == "untruncated_normal":
      return np.sqrt(scale) * tf.random.stateless_normal(shape, stateless_seed)
    limit = np.sqrt(3.0 * scale)
    return tf.random.stateless_uniform(shape, stateless_seed, -limit, limit)
  return None


def shard_value(config, num_shards, shard):
  """[ceil(V/N), D] initial rows of one shard of a static table (padding
  rows are zero)."""
  vocab, dim = config.vocabulary_size, config.embedding_dim
  per_shard = sharding.rows_per_shard(vocab, num_shards)
  initializer = config.keras_initializer()
  if is_array(initializer):
    full = np.asarray(initializer, np.float32)
    return sharding.shard_table(full, num_shards)[shard]
  pieces = []
  for chunk, start in enumerate(range(0, vocab, CHUNK_ROWS)):
    rows = min(CHUNK_ROWS, vocab - start)
    values = _chunk_values(initializer, chunk, rows, dim, vocab, config.seed)
    if values is None:
      # An initializer tfde cannot reproduce row by row: draw the whole
      # table once (it must be deterministic for the table to be
      # independent of N) and keep this shard's rows.
      full = tf.convert_to_tensor(initializer(shape=(vocab, dim), dtype="float32"))
      pieces = [full[shard::num_shards]]
      break
    first = (shard - start) % num_shards
    pieces.append(tf.cast(values, tf.float32)[first::num_shards])
  value = tf.concat(pieces, 0)
  return tf.pad(value, [[0, per_shard - tf.shape(value)[0]], [0, 0]])


def of_width(initializer, dim, table_name):
  """`initializer` as one that does not read the row width from the shape
  it is called with: a fan_out VarianceScaling (the default) becomes the
  distribution it draws at width `dim`. For engines that pad rows (TPU
  embedding pads widths to multiples of 8), whose padded width would
  otherwise scale the rows.

  >>> type(of_width(default(), 16, "t")).__name__
  'TruncatedNormal'
  """
  import keras  # pylint: disable=g-import-not-at-top
  init = keras.initializers
  initializer = resolve(initializer, table_name, dim)
  if not (isinstance(initializer, init.VarianceScaling) and initializer.mode == "fan_out"):
    return initializer
  kind, a, b = per_id(initializer, dim, table_name)
  return {"truncated_normal": lambda: init.TruncatedNormal(a, b),
          "normal": lambda: init.RandomNormal(a, b),
          "uniform": lambda: init.RandomUniform(a, b)}[kind]()


def per_id(initializer, dim, table_name):
  """(kind, a, b) of an initializer a dynamic table draws per id in its
  kernel: zeros, constant, uniform, normal, truncated normal, and variance
  scaling by fan_out (the row width; fan_in would need the vocabulary
  size, which a dynamic table does not have)."""
  import keras  # pylint: disable=g-import-not-at-top
  init = keras.initializers
  initializer = resolve(initializer, table_name, dim)
  cfg = initializer.get_config() if hasattr(initializer, "get_config") else {}
  if isinstance(initializer, init.Zeros):
    return "zeros", 0.0, 0.0
  if isinstance(initializer, init.Ones):
    return "constant", 1.0, 0.0
  if isinstance(initializer, init.Constant):
    return "constant", float(cfg["value"]), 0.0
  if isinstance(initializer, init.TruncatedNormal):
    return "truncated_normal", cfg["mean"], cfg["stddev"]
  if isinstance(initializer, init.RandomNormal):
    return "normal", cfg["mean"], cfg["stddev"]
  if isinstance(initializer, init.RandomUniform):
    return "uniform", cfg["minval"], cfg["maxval"]
  # Glorot, He and Lecun initializers are VarianceScaling subclasses whose
  # configs omit mode and distribution: read the attributes.
  if isinstance(initializer, init.VarianceScaling) and initializer.mode == "fan_out":
    scale = initializer.scale / max(1.0, float(dim))
    if initializer.distribution == "truncated_normal":
      return "truncated_normal", 0.0, float(np.sqrt(scale) / _TRUNCATED_STDDEV)
    if initializer.distribution == "untruncated_normal":
      return "normal", 0.0, float(np.sqrt(scale))
    limit = float(np.sqrt(3.0 * scale))
    return "uniform", -limit, limit
  raise ValueError(
      f"table {table_name!r} is dynamic, and its initializer "
      f"{type(initializer).__name__} cannot be drawn per id; use Zeros, Ones, "
      "Constant, RandomUniform, RandomNormal, TruncatedNormal or "
      "VarianceScaling(mode='fan_out')")
