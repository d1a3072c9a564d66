"""Export for serving without tfde.

>>> import tensorflow as tf, tfde
>>> table = tfde.layers.TableConfig(name="t", vocabulary_size=20, embedding_dim=4)
>>> layer = tfde.layers.DistributedEmbedding(
...     {"f": tfde.layers.FeatureConfig(name="f", table=table)})
>>> tfde.export_for_serving(layer, "/tmp/tfde_doc/served",
...                         {"f": tf.constant([[1, 2], [3, 4]])})
>>> served = tf.saved_model.load("/tmp/tfde_doc/served")
>>> served.serve({"f": tf.constant([[1, 2]])})["f"].shape
TensorShape([1, 4])

The SavedModel holds every table whole, as a plain variable, and looks
rows up with stock TensorFlow ops (gather and segment sums: the pure-TF
twins of tfde's ops), so it loads and serves in a process where tfde and
its op library are absent, on any number of devices. Out-of-range ids fail
with the same error naming the feature and table as in training.
"""

import tensorflow as tf

from tfde import layers as layers_lib
from tfde.ops import reference


def _spec(value):
  if isinstance(value, tf.RaggedTensor):
    return tf.RaggedTensorSpec([None, None], value.dtype, ragged_rank=1,
                               row_splits_dtype=value.row_splits.dtype)
  if isinstance(value, tf.SparseTensor):
    return tf.SparseTensorSpec([None, value.shape[1]], value.dtype)
  value = tf.convert_to_tensor(value)
  return tf.TensorSpec([None] + value.shape.as_list()[1:], value.dtype)


def _embedding_layers(model_or_layer):
  if isinstance(model_or_layer, layers_lib.DistributedEmbedding):
    return [model_or_layer]
  found = [layer for layer in model_or_layer._flatten_layers()  # pylint: disable=protected-access
           if isinstance(layer, layers_lib.DistributedEmbedding)]
  if not found:
    raise ValueError(f"{model_or_layer.name} holds no DistributedEmbedding")
  return found


class DynamicServingTable(tf.Module):
  """A dynamic table frozen for serving: its rows as a [K, D] variable and a
  `tf.lookup.StaticHashTable` from id to row, stock TF only."""

  def __init__(self, table, name):
    super().__init__(name=name)
    state = table.state(keys=("ids", "table"))
    self.rows = tf.Variable(state["table"], trainable=False, name=f"{name}_rows")
    self.index = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            state["ids"], tf.range(tf.size(state["ids"], out_type=tf.int64))),
        default_value=-1, name=f"{name}_index")
    self._spec = table.spec

  def lookup(self, ids):
    """[n, D] rows of `ids`; unknown ids as described in
    export_for_serving."""
    ids = tf.cast(ids, tf.int64)
    return reference.embeddings_or_default(self._spec, ids, self.index.lookup(ids),
                                           tf.convert_to_tensor(self.rows))


class _Served(tf.Module):
  """What the SavedModel holds: the model and its whole tables."""

  def __init__(self, model, tables):
    super().__init__()
    self.model = model
    self.tables = tables


def export_for_serving(model_or_layer, path, example_inputs):
  """Writes a SavedModel of `model_or_layer` (a Keras model containing
  DistributedEmbedding layers, or such a layer) to `path`.

  Args:
    model_or_layer: the trained model or layer.
    path: the SavedModel directory.
    example_inputs: one batch of the model's inputs (dense, ragged or sparse
      features in the model's input structure); it fixes the signature, with
      the batch dimension left free.

  The export has one function, `serve(inputs)`, returning what the model
  returns. A dynamic table is exported as its rows and an id-to-row hash
  map (`DynamicServingTable`); ids it does not hold get what an inference
  lookup gives them in training (`DynamicConfig.unadmitted_value`): zeros,
  or the initial value the id would start with, computed with stock ops.
  """
  embedding_layers = _embedding_layers(model_or_layer)
  tables = {}
  for layer in embedding_layers:
    full = {}
    for name, table in layer.tables.items():
      with tf.init_scope():
        if table.is_dynamic:
          full[name] = DynamicServingTable(table, f"{layer.name}_{name}")
        else:
          full[name] = tf.Variable(table.state(keys=("table",))["table"], trainable=False,
                                   name=f"{layer.name}_{name}")
    tables[layer.name] = full
  signature = tf.nest.map_structure(_spec, example_inputs)

  try:
    for layer in embedding_layers:
      layer.serve_from(tables[layer.name])
    served = _Served(model_or_layer, tables)

    @tf.function(input_signature=[signature])
    def serve(inputs):
      outputs = model_or_layer(inputs, training=False)
      return outputs

    concrete = serve.get_concrete_function()
    served.serve = serve
    tf.saved_model.save(served, path, signatures={"serving_default": concrete})
  finally:
    for layer in embedding_layers:
      layer.serve_from(None)
