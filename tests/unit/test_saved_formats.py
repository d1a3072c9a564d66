"""Files saved by earlier versions still load, and tables go with their
owners.

tests/data holds a tf.train.Checkpoint and a .keras model written by the
code before the table contract (commit a55b608, with
tests/data/make_legacy_files.py), and what their tables held then
(legacy_expected.npz); tests/data/5249aa3 the same files written by the
code before the exchanges became types. The oracle here is those saved
arrays, not the current code.
"""

import gc
import importlib.util
import os
import subprocess
import sys
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfde
import tfde.layers  # noqa: F401  (registers the layer with Keras, as a loader of .keras files must)
from tests.unit.test_sharded import mirrored

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data")


def _load_generator():
  spec = importlib.util.spec_from_file_location(
      "make_legacy_files", os.path.join(DATA, "make_legacy_files.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_configs = _load_generator().configs


# Where each format's files lie, and the lookup arguments that wrote its
# checkpoint: sharded, as the writer's default then, for a55b608's.
FORMATS = {"a55b608": (DATA, {"auto_replicate_bytes": 0}),
           "5249aa3": (os.path.join(DATA, "5249aa3"), {})}


def _expected(prefix, data=DATA):
  saved = np.load(os.path.join(data, "legacy_expected.npz"))
  out = {}
  for key in saved.files:
    if key.startswith(prefix + "/") and key.count("/") == 2:
      _, table, field = key.split("/")
      out.setdefault(table, {})[field] = saved[key]
  return out


def _assert_tables(tables, expected):
  for name, fields in expected.items():
    table = tables[name]
    if table.is_dynamic:
      rows = table.export_rows()
      for field, value in fields.items():
        np.testing.assert_array_equal(rows[field], value, err_msg=f"{name}/{field}")
    else:
      np.testing.assert_array_equal(table.full_table(), fields["table"])
      for slot in table.optimizer.slot_names:
        np.testing.assert_array_equal(table.full_slot(slot), fields[f"slot_{slot}"])


@pytest.mark.parametrize("version", sorted(FORMATS))
@pytest.mark.parametrize("n", [1, 2])
def test_legacy_checkpoint_restores(n, version):
  data, lookup_args = FORMATS[version]
  with mirrored(n).scope():
    lookup = tfde.lookup.ShardedLookup(_configs(), **lookup_args)
  tf.train.Checkpoint(lookup=lookup).read(
      os.path.join(data, "legacy_ckpt", "ckpt")).assert_consumed()
  _assert_tables(lookup.tables, _expected("ckpt", data))
  assert lookup.tables["items"].step_value() == 2


@pytest.mark.parametrize("version", sorted(FORMATS))
def test_legacy_keras_model_loads(version):
  data, _ = FORMATS[version]
  model = keras.models.load_model(os.path.join(data, "legacy_model.keras"))
  layer = model.get_layer("embedding")
  _assert_tables(layer.tables, _expected("keras", data))
  saved = np.load(os.path.join(data, "legacy_expected.npz"))
  x = {"item": tf.constant([[1, 2], [3, 39], [2, 2], [5, 0]]),
       "user": tf.constant([[10**12, 7], [7, 7], [-3, 7], [10**12, 8]], tf.int64)}
  np.testing.assert_allclose(model.predict(x, verbose=0), saved["keras/prediction"],
                             rtol=1e-6, atol=1e-6)


def test_a_deleted_layer_frees_its_tables():
  """Nothing outside a layer keeps its tables: no registry of owners."""
  layer = tfde.layers.DistributedEmbedding(_configs())
  layer({"item": tf.constant([[1, 2]]), "user": tf.constant([[5, 6]], tf.int64)})
  refs = [weakref.ref(t) for t in layer.tables.values()]
  refs += [weakref.ref(v) for t in layer.tables.values() for v in t.local_variables()]
  del layer
  gc.collect()
  assert [r() for r in refs] == [None] * len(refs)


def test_sok_variable_keeps_its_table_until_dropped():
  import tfde.compat.sok as sok  # pylint: disable=g-import-not-at-top
  variable = sok.Variable(np.ones((6, 2), np.float32))
  gc.collect()
  table = tfde.tables.owner_of(variable)[0]
  assert table.full_table().shape == (6, 2)
  ref = weakref.ref(table)
  del table, variable
  gc.collect()
  assert ref() is None


def test_importing_tfde_leaves_keras_unpatched():
  """Keras's trainer is changed only where a tfde layer needs it (built
  under MultiWorkerMirroredStrategy), never by an import."""
  code = (
      "from keras.src.backend.tensorflow import trainer\n"
      "build = trainer.TensorFlowTrainer._maybe_symbolic_build\n"
      "reduce = trainer.reduce_per_replica\n"
      "import tfde, tfde.layers, tfde.compat.sok\n"
      "tfde.layers.DistributedEmbedding({'f': tfde.FeatureConfig(name='f', "
      "table=tfde.TableConfig(name='t', vocabulary_size=4, embedding_dim=2))})\n"
      "assert trainer.TensorFlowTrainer._maybe_symbolic_build is build\n"
      "assert trainer.reduce_per_replica is reduce\n")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
