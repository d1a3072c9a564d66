"""Which TensorFlow tfde runs on, checked before its op library loads.

Standard library only until `check_tensorflow()` runs: `import tfde` and
the `tfde` command's help import none of it.

>>> tensorflow_mismatch("2.21.0", "2.21.1") is None
True
>>> SUPPORTED_TF
((2, 15), (2, 21))
"""

import os

# 2.15 to 2.17: the graph-mode path (tables, ShardedLookup, the DeepRec,
# SOK and mxRec doors, checkpoints, tf.estimator); the Keras layer needs
# Keras 3 (see `tfde.layers`).
SUPPORTED_TF = ((2, 15), (2, 21))

_checked = False


def tensorflow_mismatch(installed, built):
  """The message refusing TensorFlow `installed` for an op library
  compiled against `built` (both "X.Y.Z"), or None when their minor
  versions agree (TensorFlow's C++ ABI holds within a minor version only).

  >>> tensorflow_mismatch("2.21.0", "2.21.1") is None
  True
  >>> print(tensorflow_mismatch("2.20.0", "2.21.0"))  # doctest: +ELLIPSIS
  tfde's op library was compiled against TensorFlow 2.21.0, but TensorFlow 2.20.0 is installed...
  """
  if installed.split(".")[:2] == built.split(".")[:2]:
    return None
  minor = ".".join(built.split(".")[:2])
  return (f"tfde's op library was compiled against TensorFlow {built}, but "
          f"TensorFlow {installed} is installed; the library loads only in the "
          f"TensorFlow minor version it was built for. Fix: install that one "
          f"(`pip install 'tensorflow-cpu=={minor}.*'`, or tensorflow=={minor}.* "
          f"for GPUs, or `pip install 'tfde[cpu]'`), or rebuild tfde against "
          f"yours (`pip install --no-build-isolation --no-binary tfde tfde`, or "
          f"`pip wheel --no-build-isolation .` in its source).")


def check_tensorflow():
  """Imports TensorFlow and raises ImportError saying what to install when
  it is missing, outside `SUPPORTED_TF`, or of another minor version than
  the wheel's op library was built against. Once per process; the ops
  package calls it before loading the op library, and `tfde`'s lazy
  attributes before the first submodule loads."""
  global _checked
  if _checked:
    return
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        "tfde needs TensorFlow 2.15 to 2.21. Install one of tensorflow, "
        "tensorflow-cpu or tensorflow-tpu, e.g. `pip install "
        "'tensorflow-cpu>=2.15,<2.22'` (or `pip install tfde[cpu]`).") from e
  try:
    # Written by setup.py's build_ext: the TensorFlow the op library was
    # compiled against (absent in a source checkout built in place).
    from tfde import _build_info  # pylint: disable=g-import-not-at-top
  except ImportError:
    _build_info = None
  # The build info describes tfde/ops/_tfde_ops.so; $TFDE_OPS_LIBRARY names
  # another library (the TF 2.15 lane's, a Bazel build).
  if _build_info is not None and not os.environ.get("TFDE_OPS_LIBRARY"):
    problem = tensorflow_mismatch(tf.__version__, _build_info.TENSORFLOW_VERSION)
    if problem:
      raise ImportError(problem)
  version = tuple(int(p) for p in tf.__version__.split(".")[:2])
  low, high = SUPPORTED_TF
  if not low <= version <= high:
    raise ImportError(
        f"tfde supports TensorFlow {low[0]}.{low[1]} to {high[0]}.{high[1]}; "
        f"found {tf.__version__}.")
  _checked = True


def keras():
  """Keras, once TensorFlow's version is checked (`check_tensorflow`): for
  the modules that load without TensorFlow (the configs are data), so that
  their first use needing Keras gets tfde's error, not Keras's."""
  check_tensorflow()
  import keras as keras_module  # pylint: disable=g-import-not-at-top
  return keras_module
