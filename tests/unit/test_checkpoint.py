"""Checkpoints that survive a change of replica count, warm starts, and
checkpoints from another config."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import sharded_harness as h
from tests.unit.test_sharded import distribute
from tests.unit.test_sharded import mirrored

STEPS_BEFORE, STEPS_AFTER = 3, 5


def _train(strategy, lookup, batches):
  n = strategy.num_replicas_in_sync

  @tf.function
  def step(inputs, weights, targets):
    def replica_step(inputs, weights, targets):
      with tf.GradientTape() as tape:
        loss = h.replica_loss(lookup(inputs, weights), targets)
      tape.gradient(loss, lookup.trainable_variables)
    strategy.run(replica_step, args=(inputs, weights, targets))

  for batch in batches:
    per = [h.replica_inputs(batch, r, n) for r in range(n)]
    step(*[distribute(strategy, [p[i] for p in per]) for i in range(3)])


def _lookup(strategy, kind="adam"):
  configs = h.feature_configs(kind, variant=1, placements={"B": "default_device"})
  with strategy.scope():
    return h.sharded_lookup(configs), configs


@pytest.mark.parametrize("kind,restore_n", [("adam", 1), ("adam", 2), ("adam", 4),
                                            ("rowwise_adagrad", 1),
                                            ("rowwise_adagrad", 4)])
def test_checkpoint_restores_with_another_replica_count(tmp_path, kind, restore_n):
  """Written with 2 replicas, restored with 1, 2 or 4: tables, slots (row-wise
  Adagrad's [V, 1] too) and step equal exactly; training on equals the
  numpy reference of a run that never stopped."""
  source = mirrored(2)
  lookup, configs = _lookup(source, kind)
  initial = lookup.table_values()
  batches = [h.make_batch(s, weighted=True, seed=8, num_replicas=4)
             for s in range(STEPS_BEFORE + STEPS_AFTER)]
  _train(source, lookup, batches[:STEPS_BEFORE])
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(lookup=lookup),
                                       tmp_path, max_to_keep=2)
  path = manager.save()

  target = mirrored(restore_n)
  restored, _ = _lookup(target, kind)
  tf.train.Checkpoint(lookup=restored).restore(
      tf.train.latest_checkpoint(tmp_path)).assert_consumed()
  for name, table in lookup.tables.items():
    other = restored.tables[name]
    np.testing.assert_array_equal(other.full_table(), table.full_table())
    for slot in table.optimizer.slot_names:
      np.testing.assert_array_equal(other.full_slot(slot), table.full_slot(slot))
    assert {int(s.numpy()) for s in other.steps.values()} == {STEPS_BEFORE}
  assert path.endswith("ckpt-1")

  _train(target, restored, batches[STEPS_BEFORE:])
  _, want = h.reference_run(configs, initial, batches)
  for name, table in restored.tables.items():
    np.testing.assert_allclose(table.full_table(), want[name], rtol=1e-5,
                               atol=1e-6, err_msg=f"table {name}")


def test_checkpoint_of_another_config_is_refused_naming_the_table(tmp_path):
  lookup, _ = _lookup(mirrored(2))
  path = tf.train.Checkpoint(lookup=lookup).write(str(tmp_path / "c"))
  table = tfde.TableConfig(name="A", vocabulary_size=40, embedding_dim=4,
                           optimizer=h.sparse_optimizer("adam"))
  other = h.sharded_lookup({"f": tfde.FeatureConfig(name="f", table=table)})
  before = other.table_values()
  with pytest.raises(ValueError, match=r"table 'A': the checkpoint's \w+ has "
                                       r"shape \(37, 4\), the model's is \(40, 4\)"):
    tf.train.Checkpoint(lookup=other).read(path)
  np.testing.assert_array_equal(other.table_values()["A"], before["A"])
  sgd = tfde.TableConfig(name="A", vocabulary_size=37, embedding_dim=4,
                         optimizer="adagrad")
  other = h.sharded_lookup({"f": tfde.FeatureConfig(name="f", table=sgd)})
  # Refused before TensorFlow reads anything, naming the table's missing slot.
  with pytest.raises(ValueError, match=r"table 'A': the checkpoint lacks "
                                       r"\['slot_accumulator'\].*nothing was restored"):
    tf.train.Checkpoint(lookup=other).read(path)


def test_keras_model_checkpoint_across_replica_counts(tmp_path):
  from tests.unit import test_layers
  x, y = test_layers._ranking_data(512)  # pylint: disable=protected-access
  with mirrored(2).scope():
    model = test_layers._ranking_model()  # pylint: disable=protected-access
    model.compile(optimizer="adam", loss="mse")
  model.fit(x, y, batch_size=128, epochs=1, verbose=0)
  want = model.predict(x, batch_size=128, verbose=0)
  path = tf.train.Checkpoint(model=model).write(str(tmp_path / "k"))
  with mirrored(4).scope():
    other = test_layers._ranking_model()  # pylint: disable=protected-access
  tf.train.Checkpoint(model=other).read(path).assert_existing_objects_matched()
  np.testing.assert_allclose(other.predict(x, batch_size=128, verbose=0), want,
                             rtol=1e-5, atol=1e-6)


def test_warm_start_from_numpy_keras_embedding_and_variable(tmp_path):
  table = tfde.TableConfig(name="t", vocabulary_size=30, embedding_dim=3)
  lookup = h.sharded_lookup({"f": tfde.FeatureConfig(name="f", table=table)})
  target = lookup.tables["t"]
  values = np.random.default_rng(0).normal(size=(30, 3)).astype(np.float32)
  tfde.checkpoint.warm_start(target, values)
  np.testing.assert_array_equal(target.full_table(), values)

  embedding = keras.layers.Embedding(30, 3)
  embedding.build((None,))
  embedding.embeddings.assign(values * 2)
  path = tf.train.Checkpoint(embedding=embedding).write(str(tmp_path / "e"))
  tfde.checkpoint.warm_start(target, path)
  np.testing.assert_array_equal(target.full_table(), values * 2)

  variable = tf.Variable(values * 3)
  path = tf.train.Checkpoint(v=variable, other=tf.Variable(tf.zeros([4]))).write(
      str(tmp_path / "v"))
  tfde.checkpoint.warm_start(target, path, variable_name="v/.ATTRIBUTES/VARIABLE_VALUE")
  np.testing.assert_array_equal(target.full_table(), values * 3)
  with pytest.raises(ValueError, match=r"table 't': 'other/.ATTRIBUTES/"
                                       r"VARIABLE_VALUE' has shape \(4,\)"):
    tfde.checkpoint.warm_start(target, path,
                               variable_name="other/.ATTRIBUTES/VARIABLE_VALUE")
  np.testing.assert_array_equal(target.full_table(), values * 3)
