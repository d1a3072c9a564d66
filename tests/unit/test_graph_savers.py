"""tfde tables in TF1 savers: tf.compat.v1.train.Saver and
MonitoredTrainingSession (CheckpointSaverHook, StopAtStepHook), stopped and
restarted, against the numpy oracle (tests/support/estimator_model.py). Runs on
every supported TensorFlow (no tf.estimator needed)."""

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import estimator_model as m

STEPS = 4


def _train(checkpoint_dir, first_step, last_step, whole_tables_only=False):
  """A fresh graph trained by MonitoredTrainingSession from `first_step`'s
  batch until the global step is `last_step` (StopAtStepHook), restoring
  from and saving to `checkpoint_dir` (CheckpointSaverHook)."""
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    features, labels = tf.compat.v1.data.make_one_shot_iterator(
        m.input_fn(first_step, last_step - first_step)()).get_next()
    _, train_op = m.loss_and_train_op(features, labels)
    scaffold = tf.compat.v1.train.Scaffold(
        saver=tfde.tables.graph_saving.saver() if whole_tables_only else None)
    with tf.compat.v1.train.MonitoredTrainingSession(
        checkpoint_dir=str(checkpoint_dir), save_checkpoint_steps=1000,
        save_summaries_steps=None, log_step_count_steps=None, scaffold=scaffold,
        hooks=[tf.compat.v1.train.StopAtStepHook(last_step=last_step)]) as sess:
      while not sess.should_stop():
        sess.run(train_op)


def _oracle():
  oracle = m.Oracle()
  for step in range(STEPS):
    oracle.train(step)
  return oracle


def test_monitored_session_restarts_to_the_same_tables(tmp_path):
  """Two steps, stop, two more from the checkpoint: static and dynamic
  tables with their slots, counts and pending ids equal 4 oracle steps."""
  _train(tmp_path, 0, 2)
  _train(tmp_path, 2, STEPS)
  oracle = _oracle()
  m.assert_tables_equal_oracle(m.checkpoint_tables(str(tmp_path)), oracle, STEPS)
  np.testing.assert_allclose(tf.train.load_variable(str(tmp_path), "w"), oracle.w,
                             rtol=1e-5, atol=1e-6)


def test_whole_table_saver_holds_no_per_replica_variables(tmp_path):
  """graph_saving.saver(): the checkpoint holds each table whole (no
  `<table>/shard_i_of_N` variables), so it restores onto any replica count;
  restarting from it continues to the oracle's tables."""
  _train(tmp_path, 0, 2, whole_tables_only=True)
  keys = tf.train.load_checkpoint(str(tmp_path)).get_variable_to_shape_map()
  assert not [k for k in keys if "shard_" in k or k.startswith(("user/", "item/"))], keys
  _train(tmp_path, 2, STEPS, whole_tables_only=True)
  m.assert_tables_equal_oracle(m.checkpoint_tables(str(tmp_path)), _oracle(), STEPS)


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_a_plain_saver_restores_a_table_whole(tmp_path, optimizer):
  """tf.compat.v1.train.Saver in a bare Session: restore brings back rows
  (and a row-wise Adagrad's [V, 1] accumulators) changed after the save."""
  with tf.Graph().as_default():
    table = tfde.tables.make_table(tfde.TableConfig(
        name="t", vocabulary_size=6, embedding_dim=2, optimizer=tfde.optimizers.get(
            {"kind": optimizer, "learning_rate": 0.1, "initial_accumulator_value": 0.5}
            if optimizer != "sgd" else optimizer),
        initializer=np.arange(12.0).reshape(6, 2)))
    saver = tfde.tables.graph_saving.saver()
    state = table.state()
    change = table.load_state({k: v * 0 for k, v in state.items()})
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      path = saver.save(sess, str(tmp_path / "ckpt"))
      sess.run(change)
      np.testing.assert_array_equal(sess.run(state["table"]), np.zeros((6, 2)))
      saver.restore(sess, path)
      np.testing.assert_array_equal(sess.run(state["table"]), np.arange(12.0).reshape(6, 2))
      if optimizer != "sgd":
        np.testing.assert_array_equal(sess.run(state["slot_row_accumulator"]),
                                      np.full((6, 1), 0.5))
