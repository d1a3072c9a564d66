"""Defects a hostile probe found (issue 18), each kept from coming back:
non-finite gradients never reach a table, and a bad weights file changes
nothing."""

import h5py
import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import sharded_harness as h
from tests.unit.test_sharded import distribute
from tests.unit.test_sharded import make_step
from tests.unit.test_sharded import mirrored


def _poisoned_batch(num_replicas):
  """A batch whose first replica has a NaN target for feature a_dense
  (table A): the gradients of A's rows on every shard are non-finite."""
  batch = h.make_batch(0, weighted=True, seed=4, num_replicas=num_replicas)
  batch["a_dense"]["target"] = batch["a_dense"]["target"].copy()
  batch["a_dense"]["target"][0, 0] = np.nan
  return batch


def _run(strategy, lookup, batch):
  n = strategy.num_replicas_in_sync
  per = [h.replica_inputs(batch, r, n) for r in range(n)]
  step = make_step(strategy, lookup, weighted=True)
  step(*[distribute(strategy, [p[i] for p in per]) for i in range(3)])


def _state(table):
  return {k: v.numpy() for k, v in table.state().items()}


def _configs(nonfinite):
  configs = h.feature_configs("adam", variant=1)
  table = configs["a_dense"].table
  table.nonfinite = nonfinite
  return configs


@pytest.mark.parametrize("n", [1, 2])
def test_a_nan_gradient_is_an_error_naming_the_table_and_step(n):
  strategy = mirrored(n)
  with strategy.scope():
    lookup = h.sharded_lookup(_configs("error"))
  # A and B share an exchange, C (another width) has its own: no table
  # trains (B's finite gradients trained it once, the step half applied;
  # C's trained it until the step became atomic across exchanges).
  group = next(g.index for g in lookup._groups if "A" in g.index)  # pylint: disable=protected-access
  assert sorted(group) == ["A", "B"] and "C" not in group
  before = {name: _state(lookup.tables[name]) for name in ("A", "B", "C")}
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"table A: the gradient of step 1 holds NaN or Inf"):
    _run(strategy, lookup, _poisoned_batch(n))
  _assert_same(before, {name: _state(lookup.tables[name]) for name in ("A", "B", "C")})


def _ancestors(op):
  seen, todo = set(), [op]
  while todo:
    current = todo.pop()
    for parent in [t.op for t in current.inputs] + list(current.control_inputs):
      if parent not in seen:
        seen.add(parent)
        todo.append(parent)
  return seen


def test_every_update_of_a_step_waits_for_every_tables_check():
  """Structural, so independent of which op runs first: in the traced
  training step, each table's sparse update (A and B share an exchange, C
  has its own) depends on the non-finite check of every table. A check
  failing therefore leaves every table, of every exchange, unchanged."""
  strategy = mirrored(1)
  with strategy.scope():
    lookup = h.sharded_lookup(_configs("error"))
  assert len(lookup._groups) == 2  # pylint: disable=protected-access
  per = [h.replica_inputs(h.make_batch(0, weighted=True, seed=4, num_replicas=1), 0, 1)]
  step = make_step(strategy, lookup, weighted=True)
  graph = step.get_concrete_function(
      *[distribute(strategy, [p[i] for p in per]) for i in range(3)]).graph

  def message(op):
    """The constant parts of an Assert's message (a constant, a StringJoin
    of them or a StringFormat's template)."""
    parts = [t.op for t in op.inputs if t.dtype == tf.string]
    parts += [t.op for p in parts if p.type == "StringJoin" for t in p.inputs]
    return " ".join([b.decode() for p in parts if p.type == "Const"
                     for b in p.get_attr("value").string_val] +
                    [p.get_attr("template").decode() for p in parts
                     if p.type == "StringFormat"])

  checks = {}  # table -> its checks (the step's, and the table's own guard)
  for op in graph.get_operations():
    if op.type == "Assert" and "holds NaN or Inf" in message(op):
      checks.setdefault(message(op).split(":")[0].strip(), []).append(op)
  assert sorted(checks) == ["table A", "table B", "table C"], sorted(checks)
  updates = [op for op in graph.get_operations() if op.type.startswith("TfdeSparseApply")]
  assert len(updates) == 3, [op.type for op in updates]
  for update in updates:
    before = _ancestors(update)
    missing = [name for name, ops in checks.items() if not before.intersection(ops)]
    assert not missing, (update.name, missing)


def test_a_refused_step_moves_no_step_of_a_skipping_neighbour():
  """B (nonfinite="error") refuses a NaN step; A (its exchange's
  neighbour, nonfinite="skip", finite gradients) kept its rows but once
  counted the step: a control edge does not hold back a tf.cond's
  branches."""
  strategy = mirrored(2)
  with strategy.scope():
    lookup = h.sharded_lookup(_configs("skip"))
  batch = h.make_batch(0, weighted=True, seed=4, num_replicas=2)
  for feature in ("b_sparse", "b_ragged"):
    batch[feature]["target"] = np.full_like(batch[feature]["target"], np.nan)
  before = {name: _state(lookup.tables[name]) for name in ("A", "B")}
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"table B: the gradient of step 1 holds NaN or Inf"):
    _run(strategy, lookup, batch)
  _assert_same(before, {name: _state(lookup.tables[name]) for name in ("A", "B")})
  assert [int(s.numpy()) for s in lookup.tables["A"].steps.values()] == [0, 0]


@pytest.mark.parametrize("n", [1, 2])
def test_nonfinite_skip_skips_and_counts_the_update_on_every_replica(n):
  strategy = mirrored(n)
  with strategy.scope():
    lookup = h.sharded_lookup(_configs("skip"))
  before = _state(lookup.tables["A"])
  others = {name: _state(lookup.tables[name]) for name in ("B", "C")}
  _run(strategy, lookup, _poisoned_batch(n))
  _assert_same({"A": before}, {"A": _state(lookup.tables["A"])})
  assert [int(v.numpy()) for v in lookup.tables["A"].skips.values()] == [1] * n
  # The finite tables of the same step trained.
  for name, state in others.items():
    assert _state(lookup.tables[name])["step"] == state["step"] + 1
    assert not np.array_equal(_state(lookup.tables[name])["table"], state["table"])
  # The next finite step trains A again.
  _run(strategy, lookup, h.make_batch(1, weighted=True, seed=4, num_replicas=n))
  assert lookup.tables["A"].step_value() == 1
  assert not np.array_equal(lookup.tables["A"].full_table(), before["table"])


def test_a_nan_weight_in_a_dynamic_table_changes_no_row():
  config = tfde.TableConfig(name="users", vocabulary_size=None, embedding_dim=3,
                            optimizer="adagrad", initializer="uniform")
  lookup = tfde.lookup.ShardedLookup(
      {"u": tfde.FeatureConfig(name="u", table=config)})
  ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
  weights = tf.ragged.constant([[1.0, float("nan")], [1.0]])
  table = lookup.tables["users"]
  lookup({"u": ids})  # admits the ids
  before = table.export_rows()

  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(lookup({"u": ids}, {"u": weights})["u"])
    tape.gradient(loss, lookup.trainable_variables)

  with pytest.raises(tf.errors.InvalidArgumentError, match="table users"):
    step()
  after = table.export_rows()
  for key in ("ids", "table", "slot_accumulator", "step"):
    np.testing.assert_array_equal(after[key], before[key], err_msg=key)


def test_sok_explicit_apply_refuses_nan_gradients():
  var = tfde.compat.sok.Variable(np.ones((5, 2), np.float32))
  table, _ = tfde.tables.owner_of(var)
  grad = tf.IndexedSlices(tf.constant([[np.nan, 1.0]]), tf.constant([2], tf.int64),
                          tf.constant([5, 2], tf.int64))
  with pytest.raises(tf.errors.InvalidArgumentError, match="holds NaN or Inf"):
    tfde.optimizers.SGD(0.1).apply_gradients([(grad, var)])
  np.testing.assert_array_equal(table.full_table(), np.ones((5, 2)))


def test_replicas_out_of_step_are_an_error_naming_both_steps():
  strategy = mirrored(2)
  with strategy.scope():
    lookup = h.sharded_lookup(_configs("error"))
  group_table = sorted(n for n in lookup.tables if lookup.tables[n].embedding_dim == 4)[0]
  lookup.tables[group_table].steps[1].assign(5)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"(replica 1 is at step 5 but replica 0 is at step 0|"
                           r"replica 0 is at step 0 but replica 1 is at step 5): "
                           r"the workers are out of step"):
    _run(strategy, lookup, h.make_batch(0, weighted=True, seed=4, num_replicas=2))


# ------------------------------------------------------- bad weight files


def _model():
  from tests.unit import test_layers  # pylint: disable=g-import-not-at-top
  return test_layers._ranking_model(  # pylint: disable=protected-access
      user_dynamic=tfde.DynamicConfig())


def _datasets(path):
  found = {}
  with h5py.File(path, "r") as f:
    f.visititems(lambda name, obj: found.__setitem__(name.split("/")[-1], name)
                 if isinstance(obj, h5py.Dataset) else None)
  return found


def _tables(model):
  layer = model.get_layer("embedding")
  return {name: _state(t) for name, t in layer.tables.items()}


def _assert_same(a, b):
  for name in a:
    for key in a[name]:
      np.testing.assert_array_equal(a[name][key], b[name][key], err_msg=f"{name}/{key}")


def _trained_and_fresh(tmp_path):
  from tests.unit import test_layers  # pylint: disable=g-import-not-at-top
  model = _model()
  model.compile(optimizer="adam", loss="mse")
  x, y = test_layers._ranking_data(64)  # pylint: disable=protected-access
  model.fit(x, y, batch_size=32, epochs=1, verbose=0)
  path = str(tmp_path / "m.weights.h5")
  model.save_weights(path)
  return path, _model()


def test_a_flipped_bit_in_a_weights_file_is_refused_naming_the_table(tmp_path):
  path, fresh = _trained_and_fresh(tmp_path)
  with h5py.File(path, "r+") as f:
    name = _datasets(path)["movie:table"]
    data = f[name][...]
    data.view(np.uint32)[3, 1] ^= 1 << 7
    f[name][...] = data
  before = _tables(fresh)
  with pytest.raises(ValueError, match=r"table 'movie'.*checksum"):
    fresh.load_weights(path)
  _assert_same(before, _tables(fresh))


def test_a_slot_cut_short_loads_nothing(tmp_path):
  path, fresh = _trained_and_fresh(tmp_path)
  with h5py.File(path, "r+") as f:
    name = _datasets(path)["user:accumulator"]
    data = f[name][...]
    del f[name]
    f[name] = data[:-1]
  before = _tables(fresh)
  with pytest.raises(ValueError, match=r"table 'user'"):
    fresh.load_weights(path)
  _assert_same(before, _tables(fresh))


def test_weights_of_another_optimizer_still_load():
  """A file holds the slots of the optimizer it was trained with; a model
  with another optimizer loads its rows and ignores them (the checksum
  covers what was written, not what is read)."""
  def layer(optimizer):
    table = tfde.TableConfig(name="t", vocabulary_size=6, embedding_dim=2,
                             optimizer=optimizer, initializer="ones")
    return tfde.layers.DistributedEmbedding(
        {"f": tfde.FeatureConfig(name="f", table=table)})
  source, store = layer("adagrad"), {}
  source.tables["t"].load_state(dict(source.tables["t"].state(),
                                     table=tf.fill([6, 2], 3.0)))
  source.save_own_variables(store)
  target = layer("sgd")
  target.load_own_variables(store)
  np.testing.assert_array_equal(target.tables["t"].full_table(), np.full((6, 2), 3.0))


def test_a_store_collected_while_a_function_traces_is_freed_outside_it():
  """The garbage collector runs a dead store's finalizer wherever it runs:
  here inside a tf.function's trace (a strategy's replica thread traces
  too). The rows must be freed then and there, and the traced function
  must not hold a DestroyResourceOp of an unrelated store (graph-mode
  destroys inside traces once hung the suite in CI)."""
  import gc  # pylint: disable=g-import-not-at-top

  from tfde.ops import native  # pylint: disable=g-import-not-at-top
  if native.load() is None:
    pytest.skip("the kernels are not built")
  spec = tfde.tables.DynamicTable(tfde.TableConfig(
      name="d", vocabulary_size=None, embedding_dim=4, optimizer="sgd")).spec

  class Cycle:  # freed by the collector only, never by a reference count
    pass

  gc.disable()
  try:
    held = Cycle()
    held.store, held.me = native.NativeDynamicStore(spec, "collected"), held
    store_handle = held.store._handle
    del held

    @tf.function
    def traced(x):
      gc.collect()
      return x + 1

    graph = traced.get_concrete_function(tf.constant(1)).graph
  finally:
    gc.enable()
  assert "DestroyResourceOp" not in {op.type for op in graph.get_operations()}
  with pytest.raises(tf.errors.NotFoundError):
    native.load().tfde_dynamic_table_stats(store_handle)


def test_deleted_dynamic_tables_free_their_rows():
  """The kernel's hash table is a named resource, which TensorFlow keeps
  until it is destroyed: a dynamic table's rows must go with the table
  (each table here holds about 160 MB)."""
  import gc  # pylint: disable=g-import-not-at-top
  import resource  # pylint: disable=g-import-not-at-top

  def rss():
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * resource.getpagesize()

  config = tfde.TableConfig(name="d", vocabulary_size=None, embedding_dim=64,
                            optimizer="adam")
  after = []
  for _ in range(6):
    table = tfde.tables.DynamicTable(config)
    ids = tf.range(200_000, dtype=tf.int64)
    table.lookup_local(0, ids, tf.ones_like(ids), training=True)
    del table
    gc.collect()
    after.append(rss())
  assert after[-1] - after[0] < 200 * 2**20, [a // 2**20 for a in after]
