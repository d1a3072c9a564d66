"""A DeltaCheckpointManager's record of links is checked against their
files (numbers increase, steps agree and do not go back; a swapped or
truncated record is rebuilt from the files), restore never deletes what it
restored, and a restore refused for a table changes no variable at all."""

import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf

import tfde


def _model(vocabulary=30):
  cfg = tfde.TableConfig(name="t", vocabulary_size=vocabulary, embedding_dim=2,
                         optimizer="adagrad")
  lookup = tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=cfg)})
  counter = tf.Variable(0, dtype=tf.int64)
  return lookup, counter, tf.train.Checkpoint(lookup=lookup, counter=counter)


def _train(lookup, counter, seed):
  ids = np.random.default_rng(seed).integers(0, 30, (4, 3))
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(lookup({"f": tf.constant(ids)})["f"])
  tape.gradient(loss, lookup.trainable_variables)
  counter.assign_add(1)


def _rows(lookup):
  return {k: v.numpy() for k, v in lookup.tables["t"].state().items()}


def _chain(directory, saves=3, numbers=None):
  """Trains and saves `saves` times (full, then deltas); the states after each."""
  lookup, counter, checkpoint = _model()
  manager = tfde.checkpoint.DeltaCheckpointManager(checkpoint, directory, full_every_n=10)
  states = []
  for k in range(saves):
    _train(lookup, counter, k)
    manager.save(checkpoint_number=None if numbers is None else numbers[k])
    states.append((_rows(lookup), int(counter.numpy())))
  return manager, states


def _assert_restores(directory, state):
  lookup, counter, checkpoint = _model()
  assert tfde.checkpoint.DeltaCheckpointManager(checkpoint, directory).restore()
  rows, count = state
  for key, value in rows.items():
    np.testing.assert_array_equal(_rows(lookup)[key], value, err_msg=key)
  assert int(counter.numpy()) == count


def test_a_checkpoint_number_that_does_not_increase_is_refused(tmp_path):
  manager, states = _chain(tmp_path, saves=1, numbers=[100])
  with pytest.raises(ValueError, match="checkpoint number 50 does not increase.*link 100"):
    manager.save(checkpoint_number=50)
  _assert_restores(tmp_path, states[-1])
  _assert_restores(tmp_path, states[-1])   # the restore deleted nothing
  assert [l["number"] for l in manager.links()] == [100]


def test_swapped_links_in_the_record_are_rebuilt_from_the_files(tmp_path, caplog):
  _, states = _chain(tmp_path)
  path = tmp_path / "delta_checkpoints.json"
  manifest = json.loads(path.read_text())
  links = manifest["links"]
  links[1], links[2] = links[2], links[1]
  path.write_text(json.dumps(manifest))
  files = sorted(os.listdir(tmp_path))
  with caplog.at_level(logging.WARNING):
    _assert_restores(tmp_path, states[-1])
  assert "delta_checkpoints.json" in caplog.text and "rebuilding" in caplog.text
  assert sorted(os.listdir(tmp_path)) == files   # no link deleted
  _assert_restores(tmp_path, states[-1])


def test_an_entry_whose_steps_disagree_with_its_files_is_not_trusted(tmp_path, caplog):
  _, states = _chain(tmp_path)
  path = tmp_path / "delta_checkpoints.json"
  manifest = json.loads(path.read_text())
  # Link 2's entry now claims link 3's prefix and files: restoring "up to
  # link 2" would apply link 3's rows.
  manifest["links"][1]["prefix"], manifest["links"][2]["prefix"] = (
      manifest["links"][2]["prefix"], manifest["links"][1]["prefix"])
  manifest["links"][1]["files"], manifest["links"][2]["files"] = (
      manifest["links"][2]["files"], manifest["links"][1]["files"])
  path.write_text(json.dumps(manifest))
  with caplog.at_level(logging.WARNING):
    _assert_restores(tmp_path, states[-1])
  assert "says it holds the steps" in caplog.text


def test_a_truncated_record_is_named_and_rebuilt(tmp_path, caplog):
  _, states = _chain(tmp_path)
  path = tmp_path / "delta_checkpoints.json"
  path.write_text(path.read_text()[:100])
  with caplog.at_level(logging.WARNING):
    _assert_restores(tmp_path, states[-1])
  assert f"{path} cannot be read" in caplog.text
  json.loads(path.read_text())    # rewritten whole


def test_a_refused_restore_changes_no_variable(tmp_path):
  _chain(tmp_path)
  lookup, counter, checkpoint = _model(vocabulary=40)
  _train(lookup, counter, 9)
  before = (_rows(lookup), int(counter.numpy()))
  with pytest.raises(ValueError, match=r"table 't'.*shape"):
    tfde.checkpoint.DeltaCheckpointManager(checkpoint, tmp_path).restore()
  for key, value in before[0].items():
    np.testing.assert_array_equal(_rows(lookup)[key], value, err_msg=key)
  assert int(counter.numpy()) == before[1]


def test_a_refused_plain_checkpoint_read_changes_no_variable(tmp_path):
  """tf.train.Checkpoint.read alike: the dense counter stays as it was."""
  lookup, counter, checkpoint = _model()
  _train(lookup, counter, 0)
  path = checkpoint.write(str(tmp_path / "plain"))
  lookup, counter, checkpoint = _model(vocabulary=40)
  _train(lookup, counter, 1)
  counter.assign(7)
  before = _rows(lookup)
  with pytest.raises(ValueError, match=r"table 't'.*shape"):
    checkpoint.read(path)
  for key, value in before.items():
    np.testing.assert_array_equal(_rows(lookup)[key], value, err_msg=key)
  assert int(counter.numpy()) == 7


def test_another_models_restore_of_a_truncated_record_loses_nothing(tmp_path):
  """A model with other tables reads none of the links: its restore is
  refused by name and leaves the record as it was, so the model the
  chain belongs to still restores it."""
  manager, states = _chain(str(tmp_path), saves=3)
  del manager
  path = os.path.join(str(tmp_path), "delta_checkpoints.json")
  text = open(path).read()
  open(path, "w").write(text[:len(text) // 2])
  other = tfde.TableConfig(name="other", vocabulary_size=30, embedding_dim=2,
                           optimizer="adagrad")
  lookup = tfde.lookup.ShardedLookup({"g": tfde.FeatureConfig(name="g", table=other)})
  checkpoint = tf.train.Checkpoint(lookup=lookup, counter=tf.Variable(0, dtype=tf.int64))
  with pytest.raises(ValueError, match="reads with this model's tables"):
    tfde.checkpoint.DeltaCheckpointManager(checkpoint, str(tmp_path)).restore()
  assert open(path).read() == text[:len(text) // 2]
  _assert_restores(str(tmp_path), states[-1])
