"""tfde: TensorFlow Distributed Embeddings.

Embedding tables sharded over replicas by `id % N`, one all-to-all lookup
pipeline per step, and sparse per-table optimizers, on stock TensorFlow.
"""

__version__ = "0.1.0"

# 2.15 to 2.17: the graph-mode path (tables, ShardedLookup, the DeepRec,
# SOK and mxRec doors, checkpoints, tf.estimator); the Keras layer needs
# Keras 3 (see `tfde.layers`).
SUPPORTED_TF = ((2, 15), (2, 21))


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


def _check_tensorflow():
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
  import os  # pylint: disable=g-import-not-at-top
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


_check_tensorflow()

from tfde import comm  # noqa: E402
from tfde import config  # noqa: E402
from tfde import initializers  # noqa: E402
from tfde import keras_support  # noqa: E402
from tfde import lookup  # noqa: E402
from tfde import ops  # noqa: E402
from tfde import optimizers  # noqa: E402
from tfde import placement  # noqa: E402
from tfde import planner  # noqa: E402
from tfde import sharding  # noqa: E402
from tfde import tables  # noqa: E402
from tfde import tpu  # noqa: E402

layers = keras_support.import_layers()
from tfde import checkpoint  # noqa: E402
from tfde import feature_column  # noqa: E402
from tfde import nn  # noqa: E402
from tfde import serving  # noqa: E402
from tfde.compat import deeprec as _deeprec  # noqa: E402,F401
from tfde.compat import sok as _sok  # noqa: E402,F401
from tfde.config import DynamicConfig  # noqa: E402
from tfde.config import FeatureConfig  # noqa: E402
from tfde.config import TableConfig  # noqa: E402
from tfde.serving import export_for_serving  # noqa: E402
