"""tfde: TensorFlow Distributed Embeddings.

Embedding tables sharded over replicas by `id % N`, one all-to-all lookup
pipeline per step, and sparse per-table optimizers, on stock TensorFlow.

>>> import tfde
>>> table = tfde.TableConfig(name="movie", vocabulary_size=100, embedding_dim=8)
>>> table.name, "lookup" in dir(tfde)
('movie', True)

`import tfde` reads this file only: each submodule (`tfde.lookup`,
`tfde.layers`, ...) and each name below loads on its first use, and
TensorFlow's version is checked then (`tfde.tf_version`), so the `tfde`
command answers `--help` without TensorFlow.
"""

import importlib
import importlib.util

from tfde.tf_version import SUPPORTED_TF  # noqa: F401 (public)
from tfde.tf_version import tensorflow_mismatch  # noqa: F401 (public)

__version__ = "0.1.0"

# The submodules `import tfde` used to load, now loaded on first use.
_SUBMODULES = ("checkpoint", "comm", "config", "feature_column", "initializers",
               "keras_support", "layers", "lookup", "nn", "ops", "optimizers",
               "placement", "planner", "saving", "serving", "sharding", "tables", "tpu")
# Submodules that moved, still answering by their old attribute names.
_MOVED = {"checkpoint": "saving.checkpoint", "delta_checkpoint": "saving.delta_checkpoint",
          "delta_manifest": "saving.delta_manifest", "serving": "saving.serving"}
# Submodules that load without TensorFlow (the configs as data, the
# command's schema): no version check, so that `tfde train` can refuse a
# bad config before TensorFlow loads. Each imports TensorFlow itself where
# a use needs it.
_WITHOUT_TENSORFLOW = ("app", "config", "hyperparameters", "initializer_configs",
                       "optimizer_configs")
# {name: the submodule that defines it}
_NAMES = {"DynamicConfig": "config", "FeatureConfig": "config", "TableConfig": "config",
          "export_for_serving": "serving"}

__all__ = sorted(_SUBMODULES + tuple(_NAMES) + ("SUPPORTED_TF", "tensorflow_mismatch"))


def _is_submodule(name):
  # Private names are left to the import system (`from tfde import
  # _build_info` asks for the attribute before importing the module).
  return (not name.startswith("_") and
          importlib.util.find_spec(f"{__name__}.{name}") is not None)


def __getattr__(name):
  if name in _NAMES:
    value = getattr(__getattr__(_NAMES[name]), name)
  elif name in _SUBMODULES or name in _MOVED or _is_submodule(name):
    if name not in _WITHOUT_TENSORFLOW:
      from tfde import tf_version  # pylint: disable=g-import-not-at-top
      tf_version.check_tensorflow()
    if name in _MOVED:
      value = importlib.import_module(f"{__name__}.{_MOVED[name]}")
    elif name == "layers":
      # Without Keras 3, a stand-in whose every use says what is needed.
      value = importlib.import_module(f"{__name__}.keras_support").import_layers()
    else:
      value = importlib.import_module(f"{__name__}.{name}")
  else:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))
