"""Consumers of a dynamic table's changes (a DeltaCheckpointManager, each
serving export chain) keep their own marks on its record of evicted ids:
one does not forget for another, one can be dropped, and the record is
bounded so that a consumer that stops asking is refused by name, not
answered short, and pins no memory."""

import numpy as np
import pytest
import tensorflow as tf

import tfde


def _layer(limit=None):
  config = tfde.layers.TableConfig(
      name="users", vocabulary_size=None, embedding_dim=2, optimizer="sgd",
      dynamic=tfde.DynamicConfig(max_rows_per_shard=4, **(
          {} if limit is None else {"eviction_record_limit": limit})))
  return tfde.layers.DistributedEmbedding(
      {"f": tfde.layers.FeatureConfig(name="f", table=config)})


def _train(layer, step):
  ids = tf.constant([[10 * step + k for k in range(4)]], tf.int64)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(layer({"f": ids})["f"])
  tape.gradient(loss, layer.trainable_variables)


def _recorded(table):
  return sum(int(r.size().numpy()) for r in table.evicted_at.values())


def test_checkpoint_deltas_and_export_deltas_run_together(tmp_path):
  """The issue's run: a delta checkpoint at each step (full every 3) and a
  delta export after each; the export after the manager's next full save
  used to be refused ("the record starts at step 4")."""
  layer = _layer()
  table = layer.tables["users"]
  _train(layer, 0)
  manager = tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(layer=layer), tmp_path / "ckpt", full_every_n=3)
  tfde.export_for_serving(layer, str(tmp_path / "export0"), {"f": tf.constant([[1]], tf.int64)})
  previous = tmp_path / "export0"
  removed = []
  for step in range(1, 8):
    _train(layer, step)
    manager.save()
    info = tfde.serving.export_delta(layer, str(tmp_path / f"delta{step}"), base=previous)
    previous = tmp_path / f"delta{step}"
    removed.append(np.asarray(tf.io.parse_tensor(
        tf.io.read_file(str(previous / "t0.removed")), tf.int64)))
    assert info["rows"] == 4
  # Each delta names the four ids the step evicted: those of the step before.
  assert [sorted(r.tolist()) for r in removed] == [
      [10 * (s - 1) + k for k in range(4)] for s in range(1, 8)]
  assert [link["kind"] for link in manager.links()][-4:] == ["full", "delta", "delta", "full"]
  # Both consumers took their changes: nothing older is kept.
  assert _recorded(table) == 0


def test_a_dropped_consumer_keeps_nothing_and_a_lagging_one_is_bounded(tmp_path):
  layer = _layer(limit=6)
  table = layer.tables["users"]
  _train(layer, 0)
  manager = tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(layer=layer), tmp_path / "ckpt", full_every_n=100)
  tfde.export_for_serving(layer, str(tmp_path / "export"), {"f": tf.constant([[1]], tf.int64)})
  manager.save()
  _train(layer, 1)
  manager.save()
  # The export chain has not come back: the record keeps its 4 evictions.
  assert _recorded(table) == 4
  for step in range(2, 6):
    _train(layer, step)
    manager.save()
  # ... but no more than the bound (the checkpoint manager's deltas still work).
  assert _recorded(table) <= 6
  with pytest.raises(ValueError, match=r"table 'users' \(consumer 'serving export chain "
                                       r".*passed its bound of 6 ids.*eviction_record_limit"
                                       r".*save it whole"):
    tfde.serving.export_delta(layer, str(tmp_path / "late"), base=tmp_path / "export")
  tfde.serving.drop_delta_chain(layer, tmp_path / "export")
  manager.release()
  _train(layer, 6)
  assert _recorded(table) == 0 and table.consumers == {}


def test_a_manager_past_the_bound_saves_a_full_checkpoint(tmp_path, caplog):
  """The manager is the lagging consumer: its delta cannot be said, so it
  saves whole (warning why) and the chain restores the live state."""
  layer = _layer(limit=6)
  _train(layer, 0)
  manager = tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(layer=layer), tmp_path / "ckpt", full_every_n=100)
  manager.save()
  for step in range(1, 4):      # 12 evictions since the manager's mark
    _train(layer, step)
  with caplog.at_level("WARNING"):
    manager.save()
  assert "passed its bound of 6 ids" in caplog.text
  assert [link["kind"] for link in manager.links()] == ["full", "full"]
  want = layer.tables["users"].export_rows()
  restored = _layer(limit=6)
  tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(layer=restored), tmp_path / "ckpt").restore()
  got = restored.tables["users"].export_rows()
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)
