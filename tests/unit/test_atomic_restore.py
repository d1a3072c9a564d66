"""Atomic loads (issue 18, point 4): restoring a TF checkpoint, a `.keras`
file or a weights file either fully succeeds or leaves every table, slot
and step as it was.

TensorFlow restores each table of a checkpoint on its own, in turn; before
the fix, a table that failed (another shape; a corrupted export of a
dynamic table) left the tables restored before it loaded and the rest not.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import sharded_harness as h
from tests.unit.test_sharded import mirrored

NAMES = ("A", "B", "C")  # TensorFlow restores them in this order


def _lookup(strategy, sizes=None):
  """Static A and C, dynamic B (each with its Adagrad slot and step)."""
  sizes = sizes or {}
  features = {}
  for name in NAMES:
    config = tfde.TableConfig(
        name=name, vocabulary_size=None if name == "B" else sizes.get(name, 10),
        embedding_dim=sizes.get(name + "_dim", 2), optimizer="adagrad",
        dynamic=tfde.DynamicConfig(admit_after=2) if name == "B" else None)
    features["f" + name] = tfde.FeatureConfig(name="f" + name, table=config)
  with strategy.scope():
    return tfde.lookup.ShardedLookup(features)


def _fill(tables, value, step):
  """Every table's rows and slots to `value`, its step to `step`; a
  dynamic table holds ids 0..5 as rows, 7 and 8 pending."""
  for table in tables.values():
    state = {k: tf.fill(tf.shape(v), tf.cast(value, v.dtype)) for k, v in table.state().items()}
    if table.is_dynamic:
      rows = tf.fill([6, table.embedding_dim], float(value))
      state.update(ids=tf.range(6, dtype=tf.int64), counts=tf.ones([6], tf.int64),
                   last_seen=tf.fill([6], tf.constant(step, tf.int64)),
                   pending_ids=tf.constant([7, 8], tf.int64),
                   pending_counts=tf.ones([2], tf.int64),
                   pending_last_seen=tf.fill([2], tf.constant(step, tf.int64)),
                   **{k: rows for k in table.state_keys()
                      if k == "table" or k.startswith("slot_")})
    state["step"] = tf.constant(step, tf.int64)
    table.load_state(state)
    assert table.step_value() == step, table.name


def _target(strategy, sizes=None):
  """A lookup at a known state, unlike the checkpoint's."""
  lookup = _lookup(strategy, sizes)
  _fill(lookup.tables, 1.0, 2)
  return lookup, h.table_states(lookup)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  source = _lookup(tf.distribute.get_strategy())
  _fill(source.tables, 7.0, 5)
  return tf.train.Checkpoint(lookup=source).write(
      str(tmp_path_factory.mktemp("atomic") / "ckpt"))


@pytest.mark.parametrize("bad", ["B_dim", "C"])
def test_a_checkpoint_with_a_table_of_another_shape_restores_no_table(checkpoint, bad):
  """Table B (dynamic, of another width) or C (static, of another
  vocabulary): the error names it, and A (restored first) is unchanged."""
  lookup, before = _target(tf.distribute.get_strategy(), {bad: 3 if bad == "B_dim" else 12})
  with pytest.raises(ValueError, match=f"table '{bad[0]}'.*shape"):
    tf.train.Checkpoint(lookup=lookup).read(checkpoint)
  h.assert_states_unchanged(before, lookup)
  good = _lookup(tf.distribute.get_strategy())  # and a good one restores all
  tf.train.Checkpoint(lookup=good).read(checkpoint).assert_consumed()
  assert {t.step_value() for t in good.tables.values()} == {5}
  np.testing.assert_array_equal(good.tables["C"].full_slot("accumulator"), np.full((10, 2), 7))


def test_a_corrupted_dynamic_export_restores_no_table_and_no_shard(tmp_path):
  """A checkpoint whose dynamic table B lists id 3 twice (as a row and as
  pending): with two replicas, B's shards were imported one by one and the
  kernel refused only the one holding id 3's pending entry; now nothing
  changes, and the error names the table and the id."""
  source = _lookup(tf.distribute.get_strategy())
  _fill(source.tables, 7.0, 5)
  table = source.tables["B"]
  state = table.state()
  table.state = lambda keys=None: dict(state, pending_ids=tf.constant([3, 8], tf.int64))
  path = tf.train.Checkpoint(lookup=source).write(str(tmp_path / "ckpt"))
  lookup, before = _target(mirrored(2))
  with pytest.raises(ValueError, match=r"table 'B': the checkpoint lists id 3 more than once"):
    tf.train.Checkpoint(lookup=lookup).read(path)
  h.assert_states_unchanged(before, lookup)


def test_a_flipped_bit_in_a_checkpoint_restores_no_table(checkpoint, tmp_path):
  """TensorFlow checks the data's checksum as it opens the checkpoint,
  before any table is written."""
  import glob  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  for f in glob.glob(checkpoint + ".*"):
    shutil.copy(f, tmp_path)
  path = str(tmp_path / checkpoint.rsplit("/", 1)[1])
  data = glob.glob(path + ".data-*")[0]
  with open(data, "r+b") as f:
    raw = bytearray(f.read())
    raw[len(raw) // 2] ^= 0x10
    f.seek(0)
    f.write(raw)
  lookup, before = _target(tf.distribute.get_strategy())
  with pytest.raises(tf.errors.OpError, match="Checksum does not match"):
    tf.train.Checkpoint(lookup=lookup).read(path)
  h.assert_states_unchanged(before, lookup)


def _model(movie_vocabulary=50):
  features = {}
  for name, vocabulary in (("item", 30), ("movie", movie_vocabulary), ("user", None)):
    config = tfde.layers.TableConfig(
        name=name, vocabulary_size=vocabulary, embedding_dim=4, optimizer="adagrad",
        dynamic=tfde.DynamicConfig(admit_after=2) if vocabulary is None else None)
    features[name] = tfde.layers.FeatureConfig(name=name, table=config)
  inputs = {k: keras.Input(shape=(), dtype="int64", name=k) for k in features}
  out = tfde.layers.DistributedEmbedding(features, name="embedding")(inputs)
  return keras.Model(inputs, keras.layers.Concatenate()(list(out.values())))


@pytest.mark.parametrize("fmt", ["keras", "weights.h5"])
def test_a_keras_file_with_a_table_of_another_shape_loads_no_table(tmp_path, fmt):
  """`load_weights` of a `.keras` or `.weights.h5` file whose second table
  (of three; one dynamic) has another shape: no table is loaded."""
  source = _model()
  _fill(source.get_layer("embedding").tables, 7.0, 5)
  path = str(tmp_path / f"m.{fmt}")
  if fmt == "keras":
    source.save(path)
  else:
    source.save_weights(path)
  target = _model(movie_vocabulary=60)
  lookup = target.get_layer("embedding")._lookup  # pylint: disable=protected-access
  _fill(lookup.tables, 1.0, 2)
  before = h.table_states(lookup)
  with pytest.raises(ValueError, match=r"table 'movie': saved shape \(50, 4\)"):
    target.load_weights(path)
  h.assert_states_unchanged(before, lookup)


def _two_layer_model(second_vocabulary=40, head_units=1):
  """Two tfde layers (each with its own tables) and a dense head."""
  layers_out, inputs = [], {}
  for layer, (name, vocabulary) in enumerate((("first", 30), ("second", second_vocabulary))):
    config = tfde.layers.TableConfig(name=name, vocabulary_size=vocabulary,
                                     embedding_dim=4, optimizer="adam")
    inputs[name] = keras.Input(shape=(), dtype="int64", name=name)
    embedding = tfde.layers.DistributedEmbedding(
        {name: tfde.layers.FeatureConfig(name=name, table=config)}, name=f"embedding_{layer}")
    layers_out.append(embedding({name: inputs[name]})[name])
  out = keras.layers.Dense(head_units, name="head")(keras.layers.Concatenate()(layers_out))
  return keras.Model(inputs, out)


def _lookups(model):
  return [model.get_layer(f"embedding_{i}")._lookup for i in range(2)]  # pylint: disable=protected-access


@pytest.mark.parametrize("fmt", ["keras", "weights.h5"])
@pytest.mark.parametrize("bad", ["second tfde layer", "dense head"])
def test_a_failed_load_changes_no_tfde_layer_of_the_model(tmp_path, fmt, bad):
  """A model with two tfde layers: a file whose second layer's table (or
  whose dense head) has another shape loads no table of either layer;
  Keras reports the failure. The same file into a model that fits loads
  every table."""
  source = _two_layer_model()
  for lookup in _lookups(source):
    _fill(lookup.tables, 7.0, 5)
  path = str(tmp_path / f"m.{fmt}")
  if fmt == "keras":
    source.save(path)
  else:
    source.save_weights(path)
  target = (_two_layer_model(second_vocabulary=60) if bad == "second tfde layer"
            else _two_layer_model(head_units=2))
  lookups = _lookups(target)
  for lookup in lookups:
    _fill(lookup.tables, 1.0, 2)
  before = [h.table_states(lookup) for lookup in lookups]
  with pytest.raises(ValueError):
    target.load_weights(path)
  for state, lookup in zip(before, lookups):
    h.assert_states_unchanged(state, lookup)
  fitting = _two_layer_model()
  fitting.load_weights(path)
  for lookup, want in zip(_lookups(fitting), _lookups(source)):
    for name, table in lookup.tables.items():
      np.testing.assert_array_equal(table.full_table(), want.tables[name].full_table())
      assert table.step_value() == 5
