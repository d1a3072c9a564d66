"""Delta checkpoints (tfde.checkpoint.DeltaCheckpointManager): chains of a
full checkpoint and deltas restore exactly the state a full checkpoint of
the same step holds (the trained tables' own state, and the numpy oracles),
for static (sharded, replicated) and dynamic tables with admission and
eviction, onto another replica count; broken links are named and skipped."""

import json
import logging
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import sharded_harness as h
from tests.unit import test_checkpoint
from tests.unit import test_dynamic_tables as dyn
from tests.unit.test_sharded import distribute
from tests.unit.test_sharded import mirrored
from tfde.saving import delta_checkpoint

STEPS = 5


def _states(lookup):
  """Each table's whole state, as a full checkpoint writes it."""
  return {name: {k: v.numpy() for k, v in t.state().items()}
          for name, t in lookup.tables.items()}


def _assert_states_equal(got, want):
  assert sorted(got) == sorted(want)
  for name in want:
    assert sorted(got[name]) == sorted(want[name]), name
    for key in want[name]:
      np.testing.assert_array_equal(got[name][key], want[name][key],
                                    err_msg=f"table {name}: {key}")


def _trainer(strategy, lookup):
  """One traced step of the harness's loss for `lookup` (reused: tracing
  per call would dominate these tests)."""
  n = strategy.num_replicas_in_sync

  @tf.function
  def step(inputs, weights, targets):
    def replica_step(inputs, weights, targets):
      with tf.GradientTape() as tape:
        loss = h.replica_loss(lookup(inputs, weights), targets)
      tape.gradient(loss, lookup.trainable_variables)
    strategy.run(replica_step, args=(inputs, weights, targets))

  def train(batch):
    per = [h.replica_inputs(batch, r, n) for r in range(n)]
    step(*[distribute(strategy, [p[i] for p in per]) for i in range(3)])
  return train


class StaticRun:
  """2 replicas, tables sharded (A, C) and replicated (B), Adam, a save
  after each step in chains of 3: full, delta, delta, full, delta. Each
  test gets its own copy of the directory (`copy_to`)."""

  def __init__(self, directory):
    (self.lookup, self.manager, self.saved, self.configs, self.initial,
     self.batches) = _static_run(directory)
    self.directory = directory

  def copy_to(self, directory):
    shutil.copytree(self.directory, directory, dirs_exist_ok=True)
    return tfde.checkpoint.DeltaCheckpointManager(tf.train.Checkpoint(), directory)


@pytest.fixture(scope="module")
def static_run(tmp_path_factory):
  return StaticRun(tmp_path_factory.mktemp("static_chain"))


def _static_run(tmp_path, full_every_n=3):
  source = mirrored(2)
  lookup, configs = test_checkpoint._lookup(source)  # pylint: disable=protected-access
  assert lookup.tables["B"].replicated and not lookup.tables["A"].replicated
  initial = lookup.table_values()
  batches = [h.make_batch(s, weighted=True, seed=8, num_replicas=4) for s in range(STEPS)]
  counter = tf.Variable(0)
  manager = tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(lookup=lookup, counter=counter), tmp_path,
      full_every_n=full_every_n, max_to_keep=3)
  saved = []
  train = _trainer(source, lookup)
  for batch in batches:
    train(batch)
    counter.assign_add(1)
    manager.save()
    saved.append(_states(lookup))
  return lookup, manager, saved, configs, initial, batches


def _restore_into(strategy, tmp_path, **kwargs):
  lookup, _ = test_checkpoint._lookup(strategy)  # pylint: disable=protected-access
  counter = tf.Variable(-1)
  manager = tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(lookup=lookup, counter=counter), tmp_path, **kwargs)
  return lookup, counter, manager, manager.restore()


@pytest.mark.parametrize("restore_n", [1, 4])
def test_static_chain_restores_the_full_state_on_another_replica_count(
    tmp_path, restore_n, static_run):
  lookup, saved, configs, initial, batches = (
      static_run.lookup, static_run.saved, static_run.configs, static_run.initial,
      static_run.batches)
  manager = static_run.copy_to(tmp_path)
  kinds = [link["kind"] for link in manager.links()]
  assert kinds == ["full", "delta", "delta", "full", "delta"]
  # The last delta holds exactly the rows the last batch touched.
  with np.load(manager.latest_checkpoint + ".tables.npz") as delta:
    for name in lookup.tables:
      touched = {i for f, (t, _) in h.FEATURES.items() if t == name
                 for sample in batches[-1][f]["ids"] for i in sample}
      np.testing.assert_array_equal(delta[f"lookup/tables/{name}|ids"], sorted(touched))

  restored, counter, _, path = _restore_into(mirrored(restore_n), tmp_path,
                                             full_every_n=3)
  assert path == manager.latest_checkpoint and path.endswith("ckpt-5")
  assert int(counter.numpy()) == STEPS
  _assert_states_equal(_states(restored), saved[-1])
  # And the numpy reference of the same training.
  _, want = h.reference_run(configs, initial, batches)
  for name, table in restored.tables.items():
    np.testing.assert_allclose(table.full_table(), want[name], rtol=1e-5, atol=1e-6)


def test_chain_continues_after_restore_and_is_exact(tmp_path, static_run):
  """Restored at link 2 of its chain of 3, training on and saving a delta
  again gives the state of a run that never stopped."""
  batches = static_run.batches
  static_run.copy_to(tmp_path)
  strategy = mirrored(2)
  restored, _, again, path = _restore_into(strategy, tmp_path, full_every_n=3)
  assert path.endswith("ckpt-5")
  _trainer(strategy, restored)(batches[0])
  assert again.save().endswith("ckpt-6")
  assert again.links()[-1]["kind"] == "delta"
  want = _states(restored)
  fresh, _, _, path = _restore_into(mirrored(1), tmp_path, full_every_n=3)
  assert path.endswith("ckpt-6")
  _assert_states_equal(_states(fresh), want)


def _corrupt(path):
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0xFF
  open(path, "wb").write(bytes(data))


def test_broken_links_are_named_and_the_last_complete_state_restored(
    tmp_path, caplog, static_run):
  saved = static_run.saved
  links = static_run.copy_to(tmp_path).links()
  # The newest chain's full checkpoint is corrupted, and the third link of
  # the chain before it is gone: the second link's state comes back.
  data = [n for n in links[3]["files"] if ".data-" in n][0]
  _corrupt(os.path.join(tmp_path, data))
  os.remove(os.path.join(tmp_path, links[2]["prefix"] + ".index"))
  with caplog.at_level(logging.WARNING, logger="tfde.saving.delta_checkpoint"):
    restored, counter, _, path = _restore_into(mirrored(1), tmp_path)
  messages = " ".join(r.getMessage() for r in caplog.records)
  assert f"{links[3]['prefix']} (full) is unusable: its file {data} fails its CRC-32" \
      in messages
  assert f"{links[2]['prefix']} (delta) is unusable: its file " \
      f"{links[2]['prefix']}.index is missing; restoring {links[1]['prefix']}" in messages
  assert path.endswith(links[1]["prefix"])
  assert int(counter.numpy()) == 2
  _assert_states_equal(_states(restored), saved[1])


def test_corrupted_delta_rows_fall_back(tmp_path, caplog, static_run):
  saved = static_run.saved
  last = static_run.copy_to(tmp_path).links()[-1]
  _corrupt(os.path.join(tmp_path, last["prefix"] + ".tables.npz"))
  with caplog.at_level(logging.WARNING, logger="tfde.saving.delta_checkpoint"):
    restored, _, again, path = _restore_into(mirrored(2), tmp_path)
  assert "ckpt-5.tables.npz fails its CRC-32 check" in caplog.text
  assert path.endswith("ckpt-4")
  _assert_states_equal(_states(restored), saved[3])
  assert [l["prefix"] for l in again.links()][-1] == "ckpt-4"  # ckpt-5 dropped


@pytest.mark.parametrize("restore_n", [1, 4])
def test_dynamic_chain_with_admission_and_eviction(tmp_path, restore_n):
  """A dynamic table admitting after 2 sightings and evicting after 3
  unseen steps: the chain restores the trained table exactly (rows, slots,
  counts, pending ids), which equals the dict oracle."""
  dynamic = dict(admit_after=2, evict_after_steps=3)
  configs = dyn.feature_configs(dyn.table_config("adagrad", **dynamic))
  trainer = dyn.Trainer(mirrored(2), configs)
  oracle = dyn.oracle_for("adagrad", **dynamic)
  manager = tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(lookup=trainer.lookup), tmp_path, full_every_n=8)
  evicted = 0
  for step in range(8):
    batch = dyn.make_batch(step)
    trainer(batch)
    dyn.oracle_step(oracle, batch)
    manager.save()
    if step:
      evicted += len(np.load(os.path.join(tmp_path, manager.links()[-1]["prefix"]
                                          + ".tables.npz"))["lookup/tables/users|removed_ids"])
  assert evicted > 0  # the chain did carry evictions
  want = _states(trainer.lookup)
  restored = dyn.Trainer(mirrored(restore_n), configs)
  tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(lookup=restored.lookup), tmp_path).restore()
  _assert_states_equal(_states(restored.lookup), want)
  dyn.assert_table_equals_oracle(restored.table, oracle)


def test_changes_since_a_mark_of_another_lineage_are_refused():
  cfg = tfde.TableConfig(name="t", vocabulary_size=8, embedding_dim=2)
  table = tfde.tables.ShardedTable(cfg)
  mark = table.mark()
  table.load_state(table.state())
  with pytest.raises(ValueError, match="table 't' was built, loaded or replaced"):
    table.changes_since(mark)
  with pytest.raises(ValueError, match="full_every_n must be a positive integer"):
    tfde.checkpoint.DeltaCheckpointManager(tf.train.Checkpoint(), "/tmp/x",
                                           full_every_n=0)


def _train_rows(table, rows, seed):
  """One optimizer step of every part of `table` holding rows, on global
  rows `rows`, eagerly."""
  grads = np.random.default_rng(seed).normal(size=(len(rows), 8)).astype(np.float32)
  parts = getattr(table, "slices", [table])
  start = 0
  for part in parts:
    width = part.embedding_dim
    for replica in sorted(part.steps):
      if replica not in part.shards:
        part.apply_gradient(replica, tf.constant([], tf.int64), tf.zeros([0, width]))
        continue
      mine, local = part._local_rows(replica, tf.constant(rows, tf.int64))  # pylint: disable=protected-access
      part.apply_gradient(replica, local,
                          tf.boolean_mask(grads[:, start:start + width], mine))
    start += width


@pytest.mark.parametrize("kind", ["row_wise", "replicated", "table_wise",
                                  "column_wise", "bfloat16"])
def test_every_static_kind_reports_its_changed_rows(kind):
  """Built with 2 replicas, trained on some rows: the changes since a mark
  are exactly those rows, and applied to the state at the mark in a
  one-replica row-wise table they give the trained state."""
  cfg = tfde.TableConfig(name="t", vocabulary_size=11, embedding_dim=8,
                         optimizer="adam", seed=5,
                         dtype="bfloat16" if kind == "bfloat16" else "float32")
  with mirrored(2).scope():
    if kind == "table_wise":
      table = tfde.tables.TableWiseTable(cfg, owner=1)
    elif kind == "column_wise":
      table = tfde.tables.ColumnWiseTable(cfg, owners=[1, 0], widths=[3, 5])
    else:
      table = tfde.tables.ShardedTable(cfg, replicated=kind == "replicated")
  _train_rows(table, [0, 4, 9], seed=1)
  at_mark = {k: v.numpy() for k, v in table.state().items()}
  mark = table.mark()
  _train_rows(table, [1, 4, 10], seed=2)
  changes = table.changes_since(mark)
  np.testing.assert_array_equal(changes["ids"], [1, 4, 10])
  assert int(changes["step"]) == 2
  target = tfde.tables.ShardedTable(cfg)
  target.load_state(at_mark)
  target.apply_changes(changes)
  want = {k: v.numpy() for k, v in table.state().items()}
  _assert_states_equal({"t": {k: v.numpy() for k, v in target.state().items()}},
                       {"t": want})


def test_the_contracts_default_reports_every_row_and_applies_them():
  """A kind keeping no record of updates (the contract's default, e.g.
  DTensor tables) reports every row: a superset that still restores
  exactly."""
  cfg = tfde.TableConfig(name="t", vocabulary_size=7, embedding_dim=8,
                         optimizer="adagrad", seed=2)
  table = tfde.tables.ShardedTable(cfg)
  _train_rows(table, [2, 5], seed=3)
  changes = tfde.tables.Table._changes_since_step(table, 0)  # pylint: disable=protected-access
  np.testing.assert_array_equal(changes["ids"], np.arange(7))
  target = tfde.tables.ShardedTable(cfg)
  tfde.tables.Table.apply_changes(target, changes)
  _assert_states_equal({"t": {k: v.numpy() for k, v in target.state().items()}},
                       {"t": {k: v.numpy() for k, v in table.state().items()}})


def test_evicted_ids_are_kept_only_while_someone_asks_for_changes():
  """An evicting dynamic table keeps no record of what it evicts until its
  first mark (memory stays bounded: bench/memory_bench.py); from a mark on
  `changes_since` reports the evicted ids; after `forget_changes_before` a
  mark older than the record is refused by name, not answered short."""
  config = tfde.TableConfig(
      name="budget", vocabulary_size=None, embedding_dim=2, optimizer="sgd",
      dynamic=tfde.DynamicConfig(max_rows_per_shard=3))
  lookup = tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=config)})
  table = lookup.tables["budget"]

  def train(ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(lookup({"f": tf.constant([ids], tf.int64)})["f"])
    tape.gradient(loss, lookup.trainable_variables)

  def recorded():
    return sum(int(t.size().numpy()) for t in table.evicted_at.values())

  for first in range(0, 30, 3):   # ten steps of three new ids: 27 evicted
    train([first, first + 1, first + 2])
  assert table.size() == 3 and recorded() == 0
  mark = table.mark()
  train([100, 101, 102])           # evicts 27, 28 and 29
  changes = table.changes_since(mark)
  assert sorted(changes["removed_ids"].tolist()) == [27, 28, 29]
  assert recorded() == 3
  later = table.mark()
  table.forget_changes_before(later.step)
  assert recorded() == 0
  with pytest.raises(ValueError, match="table 'budget'.*not on record.*save it whole"):
    table.changes_since(mark)
  train([200, 201, 202])
  assert sorted(table.changes_since(later)["removed_ids"].tolist()) == [100, 101, 102]


def test_a_rollback_forgets_the_evictions_of_the_contents_it_replaced(tmp_path):
  """Restoring an older link (a rollback) brings back ids evicted since it
  was written: the next delta must not report them removed, the chain
  restores what the live table holds, and a mark taken after a plain
  `tf.train.Checkpoint` rollback answers for its changes (the record of
  evictions restarts with the replaced contents)."""
  config = tfde.TableConfig(
      name="budget", vocabulary_size=None, embedding_dim=2, optimizer="sgd",
      dynamic=tfde.DynamicConfig(max_rows_per_shard=3))

  def build():
    return tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=config)})

  lookup = build()
  table = lookup.tables["budget"]

  def train(ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(lookup({"f": tf.constant([ids], tf.int64)})["f"])
    tape.gradient(loss, lookup.trainable_variables)

  manager = tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(lookup=lookup), tmp_path / "chain", full_every_n=8)
  train([1, 2, 3])
  first = manager.save()
  plain = tf.train.Checkpoint(lookup=lookup).write(str(tmp_path / "plain"))
  train([4, 5, 6])                 # evicts 1, 2 and 3
  manager.save()
  manager.restore(save_path=first)
  assert table.export_rows()["ids"].tolist() == [1, 2, 3]
  train([1])
  last = manager.save()
  removed = np.load(last + ".tables.npz")["lookup/tables/budget|removed_ids"]
  assert removed.tolist() == []
  restored = build()
  tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(lookup=restored), tmp_path / "chain").restore()
  _assert_states_equal(_states(restored), _states(lookup))

  train([7, 8])                    # evicts 2 and 3 (1 was seen last)
  tf.train.Checkpoint(lookup=lookup).read(plain).assert_consumed()
  mark = table.mark()
  train([9])                       # evicts 1
  changes = table.changes_since(mark)
  assert changes["removed_ids"].tolist() == [1]
  assert changes["ids"].tolist() == [9]


@pytest.mark.parametrize("chain", ["full", "full and delta"])
def test_a_chain_of_another_model_is_refused_before_any_table_changes(tmp_path, chain):
  """A chain written by a model with table A only, restored into one with
  tables A and B: refused naming B, with A as it was (the full link is not
  read first). A delta whose rows have another width is refused the same
  way, naming its link and table."""
  def build(names, dim=2):
    return tfde.lookup.ShardedLookup({n.lower(): tfde.FeatureConfig(
        name=n.lower(), table=tfde.TableConfig(name=n, vocabulary_size=20, embedding_dim=dim,
                                               optimizer="adagrad")) for n in names})

  def train(lookup, seed):
    ids = np.random.default_rng(seed).integers(0, 20, (4, 2))
    with tf.GradientTape() as tape:
      loss = tf.add_n([tf.reduce_sum(o) for o in
                       lookup({f: tf.constant(ids) for f in lookup.feature_configs}).values()])
    tape.gradient(loss, lookup.trainable_variables)

  written = build(["A"])
  manager = tfde.checkpoint.DeltaCheckpointManager(
      tf.train.Checkpoint(lookup=written), tmp_path, full_every_n=5)
  train(written, 0)
  manager.save()
  if chain == "full and delta":
    train(written, 1)
    manager.save()
  other = build(["A", "B"])
  train(other, 7)
  before = h.table_states(other)
  with pytest.raises(ValueError, match=r"lacks the tables \['lookup/tables/B'\] of the "
                                       r"model .*nothing was restored"):
    tfde.checkpoint.DeltaCheckpointManager(tf.train.Checkpoint(lookup=other), tmp_path).restore()
  h.assert_states_unchanged(before, other)
  if chain == "full and delta":
    target = build(["A"])
    train(target, 3)
    link = manager.links()[-1]["prefix"]
    path = os.path.join(tmp_path, link + ".tables.npz")
    with np.load(path) as arrays:
      changed = dict(arrays)
    changed["lookup/tables/A|table"] = np.zeros([len(changed["lookup/tables/A|ids"]), 3])
    np.savez(path, **changed)
    manifest = json.loads(open(os.path.join(tmp_path, "delta_checkpoints.json")).read())
    entry = manifest["links"][-1]["files"][link + ".tables.npz"]
    entry[:] = [os.path.getsize(path), delta_checkpoint.file_crc32(path)]
    open(os.path.join(tmp_path, "delta_checkpoints.json"), "w").write(json.dumps(manifest))
    before = h.table_states(target)
    with pytest.raises(ValueError, match=f"{link}: table 'A'"):
      tfde.checkpoint.DeltaCheckpointManager(tf.train.Checkpoint(lookup=target), tmp_path).restore()
    h.assert_states_unchanged(before, target)
