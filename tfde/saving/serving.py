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

Delta exports update a served model without a full export or reload:
`export_delta(model, path, base=previous)` writes the rows changed since
`previous` (an export or a delta), the ids to delete, and the model's other
variables whole; the export's own `apply_delta(delta_dir)` function (stock
TF: a serving process without tfde calls it on the loaded model, then
serves the new rows) or `tfde.serving.apply_delta(exported_dir, delta_dir)`
(which also rewrites the export's variables) applies it. A delta
directory holds:

- `VERSION`: int64 [2], the version it applies to and the one it makes
  (each export and delta draws one; a served model applies only the delta
  made for its version, so a missing or reordered link is refused);
- per table i (in the export's order), `t<i>.ids` int64 [k] (global ids),
  `t<i>.rows` float32 [k, D] (their rows), `t<i>.removed` int64 [r] (ids to
  delete: dynamic tables' evictions);
- per other variable j of the model, `v<j>`: its whole value;
- `FINGERPRINTS`: int64 [n], `tf.fingerprint` (farmhash64) of each file
  above in that order, checked before anything is applied;
- `delta.json`: for tfde (the versions, table names, marks, sizes).

Every file but `delta.json` is one serialized `TensorProto`
(`tf.io.serialize_tensor`), read with `tf.io.read_file` and
`tf.io.parse_tensor`. A dynamic table's served rows grow by appending
(a deleted id's row stays unused until the next full export).
"""

import itertools
import json
import os
import random
import re
import shutil

import tensorflow as tf

from tfde import atomic_files
from tfde import layers as layers_lib
from tfde.ops import reference


def _spec(value, name=None):
  if isinstance(value, tf.RaggedTensor):
    return tf.RaggedTensorSpec([None, None], value.dtype, ragged_rank=1,
                               row_splits_dtype=value.row_splits.dtype)
  if isinstance(value, tf.SparseTensor):
    return tf.SparseTensorSpec([None, value.shape[1]], value.dtype)
  value = tf.convert_to_tensor(value)
  return tf.TensorSpec([None] + value.shape.as_list()[1:], value.dtype, name=name)


def _signature(example_inputs):
  """The specs of `example_inputs`, a dense tensor's named after its path
  in the inputs (a feature's name), so that `serving_default` takes
  {"user_id": ..., "movie_id": ...}, not {"inputs": ..., "inputs_1": ...}.

  >>> _signature({"user": tf.constant([[1]]), "movie": tf.constant([[2]])})["user"].name
  'user'
  """
  def named(value, path):
    if isinstance(value, dict):
      return type(value)((k, named(v, path + [str(k)])) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
      return type(value)(named(v, path + [str(i)]) for i, v in enumerate(value))
    # Signature names: letters, digits and _ . - / (TensorFlow's rule).
    name = re.sub(r"[^A-Za-z0-9_.\-/]", "_", "/".join(path)) or "inputs"
    return _spec(value, re.sub(r"^[^A-Za-z0-9.]", "x", name))

  return named(example_inputs, [])


# Ids of int32 and int64 are both ids (training takes either), so `serve`
# takes each id input in either dtype, in any mix across features: one
# function per mix, 2**k for k id inputs, each calling one graph of the
# model (`export_for_serving` says which). Mixes are made for at most this
# many id inputs (16 functions); beyond it the export serves the example's
# dtypes, all int32 and all int64.
MAX_MIXED_ID_INPUTS = 4


def _id_dtype_mixes(signature):
  """The specs of every int32 / int64 mix of `signature`'s id inputs other
  than its own (see MAX_MIXED_ID_INPUTS)."""
  flat = tf.nest.flatten(signature, expand_composites=False)
  ids = [i for i, spec in enumerate(flat) if spec.dtype in (tf.int32, tf.int64)]
  if len(ids) <= MAX_MIXED_ID_INPUTS:
    choices = itertools.product((False, True), repeat=len(ids))
  else:  # all int64 (swap the int32 ones), all int32 (swap the int64 ones)
    choices = [tuple(flat[i].dtype == want for i in ids) for want in (tf.int32, tf.int64)]
  mixes = []
  for swap in choices:
    if not any(swap):
      continue
    new = list(flat)
    for i, swapped in zip(ids, swap):
      if swapped:
        new[i] = _other_index_dtype(flat[i])
    mixes.append(tf.nest.pack_sequence_as(signature, new))
  return mixes


def _other_index_dtype(spec):
  """`spec` with int32 values as int64 and int64 as int32; others as they are.

  >>> _other_index_dtype(tf.TensorSpec([None, 2], tf.int64)).dtype.name
  'int32'
  """
  swapped = {tf.int32: tf.int64, tf.int64: tf.int32}.get(spec.dtype)
  if swapped is None:
    return spec
  if isinstance(spec, tf.RaggedTensorSpec):
    return tf.RaggedTensorSpec(spec.shape, swapped, ragged_rank=spec.ragged_rank,
                               row_splits_dtype=spec.row_splits_dtype)
  if isinstance(spec, tf.SparseTensorSpec):
    return tf.SparseTensorSpec(spec.shape, swapped)
  return tf.TensorSpec(spec.shape, swapped, name=spec.name)


def _dtypes(structure):
  """The dtypes of a structure of tensors or specs (a ragged or sparse
  one's values'), in order.

  >>> _dtypes({"a": tf.TensorSpec([None], tf.int32), "b": tf.constant([1.0])})
  (tf.int32, tf.float32)
  """
  return tuple(x.dtype for x in tf.nest.flatten(structure))


def _widened(inputs):
  """`inputs` with int32 ids (dense values, a ragged or sparse input's
  values) cast to int64, which holds every int32 id exactly.

  >>> _widened({"a": tf.ragged.constant([[1], []], tf.int32)})["a"].values.dtype.name
  'int64'
  """
  def widened(value):
    if value.dtype != tf.int32:
      return value
    if isinstance(value, tf.RaggedTensor):
      return value.with_values(tf.cast(value.values, tf.int64))
    if isinstance(value, tf.SparseTensor):
      return tf.SparseTensor(value.indices, tf.cast(value.values, tf.int64), value.dense_shape)
    return tf.cast(value, tf.int64)

  return tf.nest.map_structure(widened, inputs, expand_composites=False)


def _embedding_layers(model_or_layer):
  if isinstance(model_or_layer, layers_lib.DistributedEmbedding):
    return [model_or_layer]
  found = [layer for layer in model_or_layer._flatten_layers()  # pylint: disable=protected-access
           if isinstance(layer, layers_lib.DistributedEmbedding)]
  if not found:
    raise ValueError(f"{model_or_layer.name} holds no DistributedEmbedding")
  return found


class DynamicServingTable(tf.Module):
  """A dynamic table for serving: its rows as a [K, D] variable and a
  `tf.lookup.experimental.MutableHashTable` from id to row (so deltas can
  add and delete ids), stock TF only."""

  def __init__(self, table, name):
    super().__init__(name=name)
    state = table.state(keys=("ids", "table"))
    self.rows = tf.Variable(state["table"], trainable=False, name=f"{name}_rows",
                            shape=tf.TensorShape([None, table.embedding_dim]))
    self.index = tf.lookup.experimental.MutableHashTable(
        tf.int64, tf.int64, default_value=-1, name=f"{name}_index")
    self.index.insert(state["ids"], tf.range(tf.size(state["ids"], out_type=tf.int64)))
    self._spec = table.spec

  def lookup(self, ids):
    """[n, D] rows of `ids`; unknown ids as described in
    export_for_serving."""
    ids = tf.cast(ids, tf.int64)
    rows = tf.reshape(self.index.lookup(ids), tf.shape(ids))
    return reference.embeddings_or_default(self._spec, ids, rows,
                                           tf.convert_to_tensor(self.rows))

  def apply_changes(self, ids, rows, removed):
    """Deletes `removed`, overwrites the rows of known `ids` and appends
    the others (stock ops; runs in the served model)."""
    self.index.remove(removed)
    addresses = tf.reshape(self.index.lookup(ids), [-1])
    known = addresses >= 0
    self.rows.scatter_nd_update(tf.boolean_mask(addresses, known)[:, None],
                                tf.boolean_mask(rows, known))
    new = tf.boolean_mask(ids, ~known)
    start = tf.shape(self.rows, out_type=tf.int64)[0]
    self.rows.assign(tf.concat([self.rows, tf.boolean_mask(rows, ~known)], 0))
    self.index.insert(new, start + tf.range(tf.size(new, out_type=tf.int64)))


DELTA_INFO = "tfde_delta.json"  # in an export's assets.extra/ and as delta.json


def _new_version():
  return random.SystemRandom().getrandbits(62)


def _dense_variables(model_or_layer):
  """The model's variables other than tables (tf.Variables), in a fixed
  order: a delta carries them whole."""
  found = []
  for v in model_or_layer.variables:
    v = getattr(v, "value", v) if not isinstance(v, tf.Variable) else v
    if isinstance(v, tf.Variable):
      found.append(v)
  return found


def _table_entries(embedding_layers, tables):
  """[(layer name, table name, live table, served table)] in export order."""
  return [(layer.name, name, table, tables[layer.name][name])
          for layer in embedding_layers for name, table in sorted(layer.tables.items())]


def _read(directory, name, dtype, shape):
  content = tf.io.read_file(tf.strings.join([directory, "/" + name]))
  return content, tf.ensure_shape(tf.io.parse_tensor(content, dtype), shape)


class _Untracked:
  """Holds a value out of the object graph: what it holds is saved under
  its own path (the tables, the model's variables), and a second path
  would rename their checkpoint keys."""

  def __init__(self, value):
    self.value = value


class _Served(tf.Module):
  """What the SavedModel holds: the model, its whole tables, the version
  of their contents and the function applying a delta."""

  def __init__(self, model, tables, entries, dense, version):
    super().__init__()
    self.model = model
    self.tables = tables
    self._dense = _Untracked(list(dense))
    self.delta_version = tf.Variable(tf.constant(version, tf.int64), trainable=False,
                                     name="delta_version")
    # The served tables in the delta files' order (not the live tables:
    # the export holds stock TF objects only).
    self._ordered_tables = _Untracked([served for _, _, _, served in entries])

  @tf.function(input_signature=[tf.TensorSpec([], tf.string)])
  def apply_delta(self, delta_dir):
    """Applies the delta in `delta_dir` (see the module doc); fails, having
    changed nothing, when a file is missing or fails its fingerprint, or
    the delta was made for another version."""
    contents, parsed = [], []

    def read(name, dtype, shape):
      content, value = _read(delta_dir, name, dtype, shape)
      contents.append(content)
      parsed.append(value)
      return value

    versions = read("VERSION", tf.int64, [2])
    tables = []
    for i, served in enumerate(self._ordered_tables.value):
      width = (served.rows if isinstance(served, tf.Module) else served).shape[1]
      tables.append((served, read(f"t{i}.ids", tf.int64, [None]),
                     read(f"t{i}.rows", tf.float32, [None, width]),
                     read(f"t{i}.removed", tf.int64, [None])))
    dense = [read(f"v{j}", v.dtype, v.shape) for j, v in enumerate(self._dense.value)]
    _, expected = _read(delta_dir, "FINGERPRINTS", tf.int64, [len(contents)])
    found = tf.reshape(tf.bitcast(tf.fingerprint(tf.stack(contents)), tf.int64), [-1])
    checks = [
        tf.debugging.assert_equal(found, expected, message=(
            "the delta's files fail their fingerprints (a file is corrupted); "
            "nothing was applied")),
        tf.debugging.assert_equal(versions[0], self.delta_version, message=(
            "the delta was made for another version of the model (a delta of "
            "the chain is missing or out of order); nothing was applied"))]
    with tf.control_dependencies(checks):
      for served, ids, rows, removed in tables:
        if isinstance(served, DynamicServingTable):
          served.apply_changes(ids, rows, removed)
        else:
          served.scatter_nd_update(ids[:, None], tf.cast(rows, served.dtype))
      for variable, value in zip(self._dense.value, dense):
        variable.assign(value)
      self.delta_version.assign(versions[1])
    return versions[1]


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
  signature = _signature(example_inputs)

  entries = _table_entries(embedding_layers, tables)
  version = _new_version()
  try:
    for layer in embedding_layers:
      layer.serve_from(tables[layer.name])
    served = _Served(model_or_layer, tables, entries,
                     _dense_variables(model_or_layer), version)

    @tf.function
    def model_graph(inputs):
      return model_or_layer(inputs, training=False)

    # Ids are values: a mix is served by the model traced once with its
    # int32 ids widened to int64, each mix's function casting and calling
    # that graph, so the SavedModel holds it twice (that graph and the one
    # tf.saved_model.save traces again), not once per mix and signature (17
    # for 4 features: an export 3.5 times slower and its file 4 times larger
    # here). The example's own dtypes are the model's as it trained (a
    # model may compute in its ids' dtype): traced as they are where the
    # widening would change them, as is a mix the model refuses widened.
    direct = {_dtypes(signature)} if tf.int32 in _dtypes(signature) else set()

    @tf.function
    def serve(inputs):
      if _dtypes(inputs) in direct:
        return model_or_layer(inputs, training=False)
      return model_graph(_widened(inputs))

    def traced(spec):
      try:
        return serve.get_concrete_function(spec)
      except (TypeError, ValueError):
        if _dtypes(spec) in direct:
          raise
        direct.add(_dtypes(spec))
        return serve.get_concrete_function(spec)

    concrete = traced(signature)
    # Training takes int32 and int64 ids alike, so `serve` takes either
    # for each id input where the model traces with it (the signature
    # keeps the example's dtypes).
    for mix in _id_dtype_mixes(signature):
      try:
        traced(mix)
      except (TypeError, ValueError):
        pass  # a model that refuses a mix serves without it
    served.serve = serve
    tf.saved_model.save(served, path, signatures={"serving_default": concrete})
  finally:
    for layer in embedding_layers:
      layer.serve_from(None)
  _write_info(os.path.join(path, "assets.extra"), version, entries, chain=version)


def _consumer(chain):
  """The name an export chain's marks are taken under (Table.mark)."""
  return f"serving export chain {chain}"


def _write_info(directory, version, entries, chain, **extra):
  tf.io.gfile.makedirs(directory)
  marks = {}
  for layer, name, table, _ in entries:
    mark = table.mark(_consumer(chain))
    # The chain's next delta is taken from this one: it asks for nothing
    # older (other chains and checkpoint managers keep what they need).
    table.forget_changes_before(mark.step, _consumer(chain))
    marks[f"{layer}/{name}"] = mark.to_config()
  info = dict(version=version, chain=chain,
              tables=[f"{layer}/{name}" for layer, name, _, _ in entries],
              marks=marks, **extra)
  with tf.io.gfile.GFile(os.path.join(directory, DELTA_INFO), "w") as f:
    f.write(json.dumps(info, indent=1))
  return info


def _read_info(path):
  for candidate in (os.path.join(path, DELTA_INFO),
                    os.path.join(path, "assets.extra", DELTA_INFO)):
    if tf.io.gfile.exists(candidate):
      with tf.io.gfile.GFile(candidate) as f:
        return json.load(f)
  raise ValueError(f"{path} is neither a tfde export nor a delta (no {DELTA_INFO})")


def export_delta(model_or_layer, path, base):
  """Writes to `path` what changed in `model_or_layer`'s tables since
  `base` (the directory of an export or delta of this model, in this
  process: its marks say where each table stood), and the model's other
  variables whole. Returns the delta's info (versions, table names,
  bytes). Raises ValueError naming a table loaded or replaced since `base`
  (only a full export describes it then).

  >>> import tensorflow as tf, tfde
  >>> table = tfde.layers.TableConfig(name="t", vocabulary_size=20, embedding_dim=4)
  >>> layer = tfde.layers.DistributedEmbedding(
  ...     {"f": tfde.layers.FeatureConfig(name="f", table=table)})
  >>> tfde.export_for_serving(layer, "/tmp/tfde_doc/base", {"f": tf.constant([[1]])})
  >>> _ = layer.tables["t"].apply_gradient(0, tf.constant([5]), tf.ones([1, 4]))
  >>> tfde.serving.export_delta(layer, "/tmp/tfde_doc/delta1", base="/tmp/tfde_doc/base")["rows"]
  1
  >>> served = tf.saved_model.load("/tmp/tfde_doc/base")
  >>> _ = served.apply_delta("/tmp/tfde_doc/delta1")
  >>> bool(tf.reduce_all(served.serve({"f": tf.constant([[5]])})["f"] ==
  ...                    layer({"f": tf.constant([[5]])})["f"]))
  True
  """
  base_info = _read_info(str(base))
  embedding_layers = _embedding_layers(model_or_layer)
  entries = [(layer.name, name, table, None) for layer in embedding_layers
             for name, table in sorted(layer.tables.items())]
  names = [f"{layer}/{name}" for layer, name, _, _ in entries]
  if names != base_info["tables"]:
    raise ValueError(f"{base} holds the tables {base_info['tables']}, the model "
                     f"{names}")
  from tfde.tables import base as tables_base  # pylint: disable=g-import-not-at-top
  chain = base_info.get("chain", base_info["version"])
  files, rows_written = [], 0
  changes = []
  for (layer, name, table, _), key in zip(entries, names):
    mark = tables_base.ChangeMark.from_config(base_info["marks"][key])
    if mark.lineage != table.lineage:
      raise ValueError(f"table {name!r} of layer {layer!r} was loaded or replaced "
                       f"after {base} was written: export it whole "
                       "(export_for_serving)")
    changes.append(table.changes_since(mark, _consumer(chain)))
  tf.io.gfile.makedirs(str(path))
  version = _new_version()
  files.append(("VERSION", tf.constant([base_info["version"], version], tf.int64)))
  for i, c in enumerate(changes):
    files += [(f"t{i}.ids", tf.constant(c["ids"], tf.int64)),
              (f"t{i}.rows", tf.constant(c["table"], tf.float32)),
              (f"t{i}.removed", tf.constant(c.get("removed_ids", []), tf.int64))]
    rows_written += len(c["ids"])
  files += [(f"v{j}", tf.convert_to_tensor(v))
            for j, v in enumerate(_dense_variables(model_or_layer))]
  contents = [tf.io.serialize_tensor(value) for _, value in files]
  fingerprints = tf.reshape(tf.bitcast(tf.fingerprint(tf.stack(contents)), tf.int64), [-1])
  sizes = 0
  for (name, _), content in zip(files + [("FINGERPRINTS", None)],
                                contents + [tf.io.serialize_tensor(fingerprints)]):
    tf.io.write_file(os.path.join(str(path), name), content)
    sizes += len(content.numpy())
  return _write_info(str(path), version, entries, chain, base_version=base_info["version"],
                     rows=rows_written, bytes=sizes)


def drop_delta_chain(model_or_layer, path):
  """The export chain of `path` (an export or one of its deltas) will take
  no more deltas: what only it kept of the tables' record of evictions is
  dropped (its next `export_delta` is refused; export whole)."""
  info = _read_info(str(path))
  for layer in _embedding_layers(model_or_layer):
    for table in layer.tables.values():
      table.drop_consumer(_consumer(info.get("chain", info["version"])))


def apply_delta(exported_dir, delta_dir):
  """Applies the delta in `delta_dir` to the export in `exported_dir` on
  disk (its variables are rewritten), with stock TF only: what a serving
  process does, then writes back. Returns the export's new version.

  Atomic on a local file system: the new version is written beside the
  export, synced, then exchanged with it in one rename (Linux), so a kill
  at any moment leaves the old version or the new one, whole, and a load
  that starts before the exchange finds the old files, one after it the
  new. (A load still running across the exchange reads files by path and
  may see both: a server loads after it learns of the new version, as it
  would from a new version directory.) Remote paths (gs://, ...) are
  rewritten in place.
  """
  exported_dir, delta_dir = str(exported_dir), str(delta_dir)
  remote = "://" in exported_dir
  # A link to the export is followed: the directories exchanged are the
  # export's own, and the link stays.
  target = exported_dir if remote else os.path.realpath(exported_dir)
  parent, name = os.path.split(target)
  stale = f".{name}.applying-"
  if not remote:   # what a killed apply left beside the export
    atomic_files.recover(target, parent, stale)
    atomic_files.remove_stale(parent, stale)
  served = tf.saved_model.load(exported_dir)
  version = int(served.apply_delta(tf.constant(delta_dir)).numpy())
  info = os.path.join(delta_dir, DELTA_INFO)
  if remote:
    _write_version(served, exported_dir, info)
    return version
  staging = os.path.join(parent, f"{stale}{os.getpid()}")
  shutil.copytree(target, staging, ignore=lambda d, names: (
      ["variables"] if os.path.abspath(d) == target else []))
  _write_version(served, staging, info)
  atomic_files.replace_directory(staging, target)
  return version


def _write_version(served, directory, info):
  tf.train.Checkpoint(served).write(os.path.join(directory, "variables", "variables"))
  if tf.io.gfile.exists(info):
    tf.io.gfile.makedirs(os.path.join(directory, "assets.extra"))
    tf.io.gfile.copy(info, os.path.join(directory, "assets.extra", DELTA_INFO),
                     overwrite=True)
