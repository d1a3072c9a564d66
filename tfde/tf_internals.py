"""Every private TensorFlow and Keras API tfde uses, and nothing else.

TensorFlow's `tensorflow.python` modules, Keras's `keras.src` and the
`_pywrap` bindings may change in any release; tfde reaches them only
through this module, each use named with what it is for and the versions
it was checked on, so that a new release is checked here in one place
(`tests/unit/test_private_apis.py` fails on a use anywhere else). The
lanes: the main suite runs TF 2.21 (Keras 3.15.1); `make test-tf215`
(Keras 2), `test-tf216` and `test-tf217` (Keras 3.15.1) rerun the Keras
layer and graph-mode modules (docs/testing.md). "Checked on TF 2.15-2.21"
means a test of every lane reaches the code; otherwise the range says
which lanes do.

>>> import tensorflow as tf
>>> from tfde import tf_internals
>>> tf_internals.tape_records(tf.constant(1.0))
False
>>> v = tf_internals.local_variable(tf.zeros([2]), name="v", device="/cpu:0")
>>> v.shape, v.trainable
(TensorShape([2]), False)
"""

import sys

import tensorflow as tf
from tensorflow.python.distribute import values as _distribute_values
from tensorflow.python.eager import context as _context
from tensorflow.python.eager import record as _record
from tensorflow.python.eager import tape as _tape
from tensorflow.python.framework import func_graph as _func_graph
from tensorflow.python.ops import control_flow_util as _control_flow_util
from tensorflow.python.ops import resource_variable_ops as _resource_variable_ops
from tensorflow.python.training.saving import saveable_object as _saveable_object
from tensorflow.python.util import nest as _nest

# --- Variables and the tape ---------------------------------------------


def local_variable(initial_value, name, device=None, trainable=False, shape=None):
  """A resource variable of this process only, built outside any
  strategy's variable creator (a shard, a counter, a twin's storage must
  not become a mirrored variable; `tf.Variable` would go through the
  creator). `ResourceVariable`; checked on TF 2.15-2.21."""
  with tf.init_scope(), tf.device(device):
    return _resource_variable_ops.ResourceVariable(
        initial_value, name=name, trainable=trainable,
        shape=None if shape is None else tf.TensorShape(shape))


def variable_over_handle(handle, shape, dtype, name):
  """A plain resource variable over an existing handle (one device's
  component of a DTensor variable, from `dtensor.unpack`), so tfde's ops
  update it in place; the handle gets the shape and dtype data a
  variable's handle carries. `BaseResourceVariable(handle=...)` and the
  handle's `_handle_data` (`cpp_shape_inference_pb2`); checked on TF 2.21
  (tfde.dtensor needs tf_keras, which only the main suite has)."""
  from tensorflow.python.framework import cpp_shape_inference_pb2  # pylint: disable=g-import-not-at-top
  data = cpp_shape_inference_pb2.CppShapeInferenceResult.HandleData()
  data.is_set = True
  data.shape_and_type.append(
      cpp_shape_inference_pb2.CppShapeInferenceResult.HandleShapeAndType(
          shape=tf.TensorShape(shape).as_proto(), dtype=dtype.as_datatype_enum))
  handle._handle_data = data  # pylint: disable=protected-access
  with tf.device(handle.device):
    return _resource_variable_ops.BaseResourceVariable(
        trainable=False, shape=tf.TensorShape(shape), dtype=dtype,
        handle=handle, handle_name=name, unique_id=f"{name}_{id(handle)}",
        in_graph_mode=False)


def mark_variable_read(variable):
  """Tells the tapes recording now that `variable` was read: the kernels
  read variables through their handles, which no tape sees.
  `tape.variable_accessed`; checked on TF 2.15-2.21."""
  _tape.variable_accessed(variable)


def tape_records(tensor):
  """Whether a tape records `tensor` now (eagerly, or while tracing a
  tf.function). `record.should_record_backprop`; checked on TF 2.15-2.21."""
  return _record.should_record_backprop([tf.convert_to_tensor(tensor)])


def building_function_graph():
  """Whether the default graph is a tf.function's (not a TF1 graph).
  `func_graph.FuncGraph`; checked on TF 2.15-2.21."""
  return isinstance(tf.compat.v1.get_default_graph(), _func_graph.FuncGraph)


def in_xla_context():
  """Whether ops built now go into an XLA computation (a TPU program, a
  jit_compile function), where a device scope for host-only ops must not
  be set. `control_flow_util.GraphOrParentsInXlaContext`; checked on TF
  2.15-2.21."""
  return _control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def eager_mode():
  """A context running its ops eagerly even inside a graph or a trace (a
  resource freed from a garbage-collector callback, which may run in any
  thread). `context.eager_mode`; checked on TF 2.15-2.21."""
  return _context.eager_mode()


# --- Distribution and checkpoints ---------------------------------------


def per_replica(values):
  """A `PerReplica` of one value per local replica, as a strategy's
  `run` returns, built from tensors the communicator made itself.
  `distribute.values.PerReplica`; checked on TF 2.16-2.21 (the 2.15 lane
  runs no MirroredStrategy test)."""
  return _distribute_values.PerReplica(values)


# A TF1 saver's saveable (tf.compat.v1.train.Saver, an estimator's
# scaffold): a table saved whole through SaveSpecs of its state.
# `saveable_object.SaveableObject`, `SaveSpec`; checked on TF 2.15-2.21.
SaveableObject = _saveable_object.SaveableObject
SaveSpec = _saveable_object.SaveSpec


def checkpoint_keys(root):
  """{id(object): its path in checkpoint keys} for every object that
  `root`'s checkpoints hold, as TensorFlow's saver names them (escaped
  names, its own traversal). `checkpoint.graph_view.ObjectGraphView`,
  `trackable_utils.object_path_to_string`; checked on TF 2.21 (delta
  checkpoints run in the main suite only)."""
  from tensorflow.python.checkpoint import graph_view  # pylint: disable=g-import-not-at-top
  from tensorflow.python.trackable import trackable_utils  # pylint: disable=g-import-not-at-top
  node_paths = graph_view.ObjectGraphView(root).breadth_first_traversal()[1]
  return {id(obj): trackable_utils.object_path_to_string(path)
          for obj, path in node_paths.items()}


def sparse_core_layout_stacker(**kwargs):
  """TensorFlow's SparseCore table stacker (`SparseCoreLayoutStacker`),
  the one TPUEmbedding v3 uses, so tfde stacks tables as TensorFlow would.
  `tpu._pywrap_sparse_core_layout`; checked on TF 2.21 (tests/unit/test_tpu.py
  runs in the main suite only)."""
  from tensorflow.python.tpu import _pywrap_sparse_core_layout  # pylint: disable=g-import-not-at-top
  return _pywrap_sparse_core_layout.SparseCoreLayoutStacker(**kwargs)


# --- Feature columns -----------------------------------------------------


def feature_column_classes():
  """(EmbeddingColumn, its sequence categorical column classes v2 and v1):
  a grouped embedding column is an `EmbeddingColumn`, which sequence
  columns cannot be. `feature_column_v2.EmbeddingColumn`,
  `SequenceCategoricalColumn`, `feature_column._SequenceCategoricalColumn`;
  checked on TF 2.15-2.21."""
  from tensorflow.python.feature_column import feature_column as v1  # pylint: disable=g-import-not-at-top
  from tensorflow.python.feature_column import feature_column_v2 as v2  # pylint: disable=g-import-not-at-top
  return v2.EmbeddingColumn, (v2.SequenceCategoricalColumn, v1._SequenceCategoricalColumn)  # pylint: disable=protected-access


# --- Structures -------------------------------------------------------------


def flatten_up_to(shallow, structure):
  """`structure` flattened down to the leaves of `shallow` (whose leaves
  may be structures in `structure`); raises ValueError or TypeError when
  it does not have `shallow`'s structure. `util.nest.flatten_up_to` (tf.nest
  has no public form); checked on TF 2.16-2.21 (the Keras layer)."""
  return _nest.flatten_up_to(shallow, structure)


# --- Keras 3 --------------------------------------------------------------


def in_keras_stateless_scope():
  """Whether Keras runs the layer in a `keras.StatelessScope` (its
  symbolic build), where no variable may be written.
  `keras.src.backend.common.stateless_scope.in_stateless_scope` (Keras
  exports the scope, not the question); checked on Keras 3.15.1, TF
  2.16-2.21."""
  from keras.src.backend.common.stateless_scope import in_stateless_scope  # pylint: disable=g-import-not-at-top
  return in_stateless_scope()


def keras_tensorflow_trainer():
  """Keras's TensorFlow trainer module (`TensorFlowTrainer`,
  `reduce_per_replica`), which tfde.compat.keras_multiworker patches for
  MultiWorkerMirroredStrategy, or None where Keras has none.
  `keras.src.backend.tensorflow.trainer`; checked on Keras 3.15.1 with TF
  2.21 (the multi-worker tests run in the main suite only)."""
  try:
    from keras.src.backend.tensorflow import trainer  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return trainer


# --- Savers' frames -------------------------------------------------------
# TensorFlow's and Keras's savers hand an object its own part of a restore
# only; what tfde checks across the whole restore (every table before the
# first is written) is read from the saver's frame. Where a release moves
# it, these return None and the tables' own checks decide (a table refused
# then leaves those restored before it loaded).


def _frame_of_caller(depth):
  # depth 1: the function calling the function that calls this one.
  return sys._getframe(depth + 2)  # pylint: disable=protected-access


def restore_being_read():
  """(saver, {checkpoint key: {slice: tensor}}, {(key, slice): restore
  function}) of the eager `tf.train.Checkpoint` restore running now, read
  in any caller's frame, or None outside one. The locals of
  `MultiDeviceSaver.restore`'s `restore_fn` and its `_keys_to_restore_fn`;
  checked on TF 2.21, matching TF 2.18-2.21's code (on 2.15-2.17, None:
  tests/unit/test_atomic_restore.py runs in the main suite only)."""
  frame = _frame_of_caller(1)
  while frame is not None and not (frame.f_code.co_name == "restore_fn" and
                                   "restored_tensor_dict" in frame.f_code.co_varnames):
    frame = frame.f_back
  if frame is None:
    return None
  saver = frame.f_locals.get("self")
  restored = frame.f_locals.get("restored_tensor_dict")
  owners = getattr(saver, "_keys_to_restore_fn", None)
  if not isinstance(restored, dict) or not isinstance(owners, dict):
    return None
  return saver, restored, owners


def restore_owner(restore_fn):
  """The object whose restore function `restore_fn` is: its `__self__`, or
  (the legacy saveable path tf.train.Checkpoint takes for some objects)
  the trackable a `SaveableCompatibilityConverter` wraps. `obj._trackable`;
  checked on TF 2.21."""
  owner = getattr(restore_fn, "__self__", None)
  return owner, getattr(getattr(owner, "obj", None), "_trackable", None)


def checkpoint_traversed_by_caller():
  """(checkpoint path, {attribute name: its shape in the checkpoint}) of
  the object whose `_trackable_children` TensorFlow's restore is asking
  now while it walks the object graph (before it assigns anything), or
  None when the caller of that method is not the walk. The shapes are read
  once per restore (kept on its coordinator). The local
  `checkpoint_position` of `restore._queue_children_for_restoration`;
  checked on TF 2.21, matching TF 2.18-2.21's code
  (tests/unit/test_checkpoint.py and test_delta_manifest.py, the main
  suite)."""
  frame = _frame_of_caller(1)
  if frame is None or frame.f_code.co_name != "_queue_children_for_restoration":
    return None
  position = frame.f_locals.get("checkpoint_position")
  attributes = getattr(getattr(position, "object_proto", None), "attributes", None)
  path = getattr(getattr(position, "checkpoint", None), "save_path_string", None)
  if not attributes or not isinstance(path, str):
    return None
  coordinator = position.checkpoint
  shapes = getattr(coordinator, "_tfde_shapes", None)
  if shapes is None:
    shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    coordinator._tfde_shapes = shapes  # pylint: disable=protected-access
  return path, {a.name: shapes[a.checkpoint_key] for a in attributes
                if a.checkpoint_key in shapes}


def keras_load_outcome():
  """(whether another object's load failed, whether failures are only
  warnings) of the Keras weights load closing its store now, read in the
  frame of its caller's caller (Keras's saving_lib calling the store's
  `close`), or (False, False) where that frame holds neither. The locals
  `failed_saveables` and `skip_mismatch` of `saving_lib.load_weights_only`;
  checked on Keras 3.15.1, TF 2.16-2.21 (test_layers.py's weight loads on
  the 2.16 and 2.17 lanes; test_atomic_restore.py, the main suite)."""
  caller = _frame_of_caller(1).f_locals
  return bool(caller.get("failed_saveables")), bool(caller.get("skip_mismatch"))
