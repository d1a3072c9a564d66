"""DeepRec's `group_embedding_column_scope` on stock TensorFlow.

Embedding columns made inside the scope are looked up together when
`tf.compat.v1.feature_column.input_layer` builds them: one dedup and one
fused gather per embedding width (tfde's DeepRec door,
`tfde.nn.group_embedding_lookup_sparse`), with the results of the same
columns made outside the scope.

>>> import tensorflow as tf
>>> import tfde
>>> with tfde.feature_column.group_embedding_column_scope(name="ads"):
...   user = tf.feature_column.embedding_column(
...       tf.feature_column.categorical_column_with_identity("user", 100), 4)
...   item = tf.feature_column.embedding_column(
...       tf.feature_column.categorical_column_with_identity("item", 50), 4)
>>> tfde.feature_column.group_of(user)
'ads'
>>> with tf.Graph().as_default():
...   features = {
...       "user": tf.SparseTensor([[0, 0], [1, 0]], tf.constant([3, 7], tf.int64), [2, 1]),
...       "item": tf.SparseTensor([[0, 0], [1, 1]], tf.constant([1, 2], tf.int64), [2, 2])}
...   dense = tf.compat.v1.feature_column.input_layer(features, [user, item])
>>> dense.shape.as_list()
[2, 8]

What differs from DeepRec, and why:
- The scope works by having `tf.feature_column.embedding_column` (and its
  `tf.compat.v1` spelling) return a grouped column while it is open; other
  threads building columns at the same time would see it too.
- A grouped column's variable is `.../<group>/<column name>/embedding_weights`
  under the variable scope where the group is first built (input_layer's
  scope for its first grouped column), not `.../<column name>/embedding_weights`.
- Columns with `ckpt_to_load_from`, and sequence columns, are refused
  inside the scope (the fused lookup does not implement them); `max_norm`
  is applied as `embedding_column` applies it.
As `safe_embedding_lookup_sparse` does for plain columns, negative ids and
ids with weights <= 0 are dropped, and samples without ids give zeros.
"""

import contextlib
import itertools
import threading
import weakref

import tensorflow as tf

from tfde import tf_internals
from tfde.compat import deeprec

_lock = threading.Lock()
_active = []  # open scopes, innermost last
_group_names = itertools.count()


class _Group:
  """The columns of one scope, and their fused results per input builder."""

  def __init__(self, name):
    self.name = name
    self.columns = []
    # id(builder) -> (weak builder, {column name: dense tensor}): input_layer
    # makes one builder per call, and the group is built once per builder.
    self._cache = {}

  def results_for(self, builder):
    entry = self._cache.get(id(builder))
    if entry is None or entry[0]() is not builder:
      return None
    return entry[1]

  def store(self, builder, results):
    self._cache = {k: v for k, v in self._cache.items() if v[0]() is not None}
    self._cache[id(builder)] = (weakref.ref(builder), results)


_EmbeddingColumn, _SEQUENCE_COLUMNS = tf_internals.feature_column_classes()


class GroupedEmbeddingColumn(_EmbeddingColumn):
  """An `EmbeddingColumn` whose lookup is fused with its group's."""

  def _get_dense_tensor(self, inputs, weight_collections=None, trainable=None):
    group = self._tfde_group
    results = group.results_for(inputs)
    if results is None or self.name not in results:
      results = _lookup_group(group, inputs, weight_collections, trainable)
      group.store(inputs, results)
    if self.name not in results:
      raise ValueError(f"embedding column {self.name} of group {group.name}: "
                       "its feature is missing from the input_layer features")
    return results[self.name]


def group_of(column):
  """The group name of a column made in a scope, or None."""
  group = getattr(column, "_tfde_group", None)
  return None if group is None else group.name


def _available(column, builder):
  features = getattr(builder, "_features", None)
  if features is None:
    return True
  return all(key in features
             for key in column.categorical_column._parse_example_spec)  # pylint: disable=protected-access


def _valid_entries(ids, weights):
  """Drops negative ids and weights <= 0, as safe_embedding_lookup_sparse."""
  keep = ids.values >= 0
  if weights is not None:
    keep = tf.logical_and(keep, weights.values > 0)
    weights = tf.sparse.retain(weights, keep)
  return tf.sparse.retain(ids, keep), weights


def _lookup_group(group, builder, weight_collections, trainable):
  """Builds every available column of `group` for `builder`: variables made
  as EmbeddingColumn makes them, then one fused lookup."""
  members = [c for c in group.columns if _available(c, builder)]
  if weight_collections and tf.compat.v1.GraphKeys.GLOBAL_VARIABLES not in weight_collections:
    weight_collections = list(weight_collections) + [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES]
  variables, sp_ids, sp_weights, combiners = [], [], [], []
  with tf.compat.v1.variable_scope(group.name, reuse=tf.compat.v1.AUTO_REUSE):
    for column in members:
      pair = column.categorical_column._get_sparse_tensors(  # pylint: disable=protected-access
          builder, weight_collections, trainable)
      ids = tf.cast(pair.id_tensor, tf.int64)
      if ids.shape.rank not in (None, 2):
        raise ValueError(f"embedding column {column.name}: grouped columns take "
                         f"[batch, k] ids, got rank {ids.shape.rank}")
      ids, weights = _valid_entries(ids, pair.weight_tensor)
      with tf.compat.v1.variable_scope(column.name):
        variables.append(tf.compat.v1.get_variable(
            "embedding_weights",
            shape=(column.categorical_column._num_buckets, column.dimension),  # pylint: disable=protected-access
            dtype=tf.float32, initializer=column.initializer,
            trainable=column.trainable and trainable is not False,
            collections=weight_collections))
      sp_ids.append(ids)
      sp_weights.append(weights)
      combiners.append(column.combiner)
  outputs = deeprec.group_embedding_lookup_sparse(
      variables, sp_ids, combiners, sp_weights=sp_weights,
      name=f"{group.name}_lookup", max_norm=[c.max_norm for c in members])
  return {c.name: out for c, out in zip(members, outputs)}


def _grouped_embedding_column(original):
  """Wraps tf.feature_column.embedding_column while a scope is open."""

  def embedding_column(categorical_column, dimension, *args, **kwargs):
    column = original(categorical_column, dimension, *args, **kwargs)
    with _lock:
      group = _active[-1] if _active else None
    if group is None:
      return column
    if column.ckpt_to_load_from is not None:
      raise ValueError(f"embedding column {column.name} in group {group.name}: "
                       "ckpt_to_load_from is not supported by grouped lookups")
    if isinstance(column.categorical_column, _SEQUENCE_COLUMNS):
      raise ValueError(f"embedding column {column.name} in group {group.name}: "
                       "sequence columns cannot be grouped")
    grouped = GroupedEmbeddingColumn(*column)
    object.__setattr__(grouped, "_tfde_group", group)
    group.columns.append(grouped)
    return grouped

  embedding_column.__doc__ = original.__doc__
  return embedding_column


_NAMESPACES = (tf.feature_column, tf.compat.v1.feature_column,
               tf.compat.v2.feature_column)


@contextlib.contextmanager
def group_embedding_column_scope(name=None):
  """Groups the embedding columns made inside it (see the module doc).

  Args:
    name: the group's name; by default group_embedding_<n>.
  """
  group = _Group(name or f"group_embedding_{next(_group_names)}")
  with _lock:
    outermost = not _active
    _active.append(group)
    if outermost:
      saved = [(ns, ns.embedding_column) for ns in _NAMESPACES]
      for ns, original in saved:
        ns.embedding_column = _grouped_embedding_column(original)
      _group_embedding_column_scope_saved[:] = saved
  try:
    yield group
  finally:
    with _lock:
      _active.pop()
      if not _active:
        for ns, original in _group_embedding_column_scope_saved:
          ns.embedding_column = original
        _group_embedding_column_scope_saved[:] = []


_group_embedding_column_scope_saved = []
