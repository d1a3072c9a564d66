"""Table-wise and column-wise tables (and plans mixing every kind) under
MirroredStrategy (N logical CPUs, N in {1, 2, 4}) against the unsharded
numpy reference of tests/support/sharded_harness.py: forward, explicit gradients
and K steps of every optimizer; dynamic table-wise tables against the
dynamic table oracle; checkpoints moving between plans."""

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import sharded_harness as h
from tests.unit.test_sharded import ATOL
from tests.unit.test_sharded import RTOL
from tests.unit.test_sharded import assert_explicit_training_equals_reference
from tests.unit.test_sharded import distribute
from tests.unit.test_sharded import make_step
from tests.unit.test_sharded import mirrored

STEPS = 3


def make_plan(name, n):
  return tfde.planner.ShardingPlan(num_replicas=n, tables=h.layouts(name, n))


def planned_run(strategy, configs, batches, plan, train_in_backward=True):
  n = strategy.num_replicas_in_sync
  with strategy.scope():
    lookup = tfde.lookup.ShardedLookup(configs, plan=plan,
                                       train_in_backward=train_in_backward)
  initial = {name: t.full_table() for name, t in lookup.tables.items()}
  step = make_step(strategy, lookup, weighted=True)
  first_outputs, all_grads = None, []
  for batch in batches:
    per = [h.replica_inputs(batch, r, n) for r in range(n)]
    outputs, grads = step(distribute(strategy, [p[0] for p in per]),
                          distribute(strategy, [p[1] for p in per]),
                          distribute(strategy, [p[2] for p in per]))
    all_grads.append(grads)
    if first_outputs is None:
      local = strategy.experimental_local_results(outputs)
      first_outputs = {f: np.concatenate([o[f].numpy() for o in local])
                       for f in h.FEATURES}
  final = {name: t.full_table() for name, t in lookup.tables.items()}
  return initial, first_outputs, final, all_grads, lookup


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"N{n}")
def strategy(request):
  return mirrored(request.param)


# Every optimizer for each new kind; the plan mixing every kind with Adam
# (the step-dependent rule), to keep the suite's time.
@pytest.mark.parametrize("kind,layout", [
    (k, layout) for layout in ("table_wise", "column_wise", "table_row_wise")
    for k in ("sgd", "adagrad", "adam", "ftrl")] + [("adam", "mixed")] + [
        ("rowwise_adagrad", layout) for layout in ("table_wise", "table_row_wise")])
def test_training_equals_unsharded_reference(strategy, kind, layout):
  n = strategy.num_replicas_in_sync
  variant = h.variant_of(kind)
  configs = h.feature_configs(kind, variant)
  batches = [h.make_batch(s, weighted=True, seed=variant + 20, num_replicas=n)
             for s in range(STEPS)]
  plan = make_plan(layout, n)
  initial, outputs, final, _, lookup = planned_run(strategy, configs, batches, plan)
  # The initial tables are the unsharded ones, whatever the layout.
  with mirrored(1).scope():
    plain = h.sharded_lookup(h.feature_configs(kind, variant))
  for name, table in plain.tables.items():
    np.testing.assert_array_equal(initial[name], table.full_table())
  want_outputs, want_tables = h.reference_run(configs, initial, batches)
  for f in h.FEATURES:
    np.testing.assert_allclose(outputs[f], want_outputs[f], rtol=RTOL, atol=ATOL,
                               err_msg=f"feature {f}")
  for name in want_tables:
    np.testing.assert_allclose(final[name], want_tables[name], rtol=RTOL,
                               atol=ATOL, err_msg=f"table {name}")
    assert not np.allclose(final[name], initial[name])
    assert lookup.tables[name].step_value() == STEPS
  # Where the rows live: a table-wise table only on its owner.
  for name, layout_ in plan.tables.items():
    table = lookup.tables[name]
    if layout_.kind == "table_wise":
      assert sorted(table.shards) == layout_.owners
      assert table.shards[layout_.owners[0]].shape == (table.vocabulary_size, 4)
    if layout_.kind == "column_wise":
      for s, owner, width in zip(table.slices, layout_.owners, layout_.column_widths):
        assert sorted(s.shards) == [owner] and s.shards[owner].shape[1] == width
    if layout_.kind == "table_row_wise":
      # Row i on owners[i % k] at local row i // k, nowhere else.
      k = len(layout_.owners)
      assert sorted(table.shards) == sorted(layout_.owners)
      for position, owner in enumerate(layout_.owners):
        rows = final[name][position::k]
        np.testing.assert_array_equal(table.shards[owner].numpy()[:len(rows)], rows)


def test_rowwise_adagrad_keeps_whole_rows_so_column_wise_refuses_it():
  """Row-wise Adagrad's accumulator spans a whole row, which no column
  slice holds: a column-wise plan is refused naming the table, a table
  switched to it is refused unchanged, and the planner never proposes it."""
  configs = h.feature_configs("rowwise_adagrad", 1)
  with pytest.raises(ValueError, match="table 'A' trains with 'rowwise_adagrad'.*"
                                       "column_wise does not apply"):
    h.sharded_lookup(configs, plan=make_plan("column_wise", 1))
  column_wise = h.sharded_lookup(h.feature_configs("adagrad", 1),
                                 plan=make_plan("column_wise", 1))
  table = column_wise.tables["A"]
  with pytest.raises(ValueError, match="table 'A': 'rowwise_adagrad' keeps one slot "
                                       "value per row, and a column-wise"):
    table.use_optimizer(tfde.optimizers.RowwiseAdagrad())
  assert table.optimizer.kind == "adagrad"
  assert all(s.optimizer.kind == "adagrad" for s in table.slices)
  # The planner's doctest splits t2 by columns under Adagrad; not under
  # row-wise Adagrad.
  sizes = [(50, 8), (200_000, 16), (30_000, 64), (1000, 16)]
  def kinds(optimizer):
    tables = [tfde.TableConfig(name=f"t{i}", vocabulary_size=v, embedding_dim=d,
                               optimizer=optimizer) for i, (v, d) in enumerate(sizes)]
    features = [tfde.FeatureConfig(name=f"f{i}", table=t, input_shape=(1024, 4))
                for i, t in enumerate(tables)]
    plan = tfde.planner.plan(features, num_replicas=4, memory_per_replica_bytes=64 << 20)
    return {name: layout.kind for name, layout in plan.tables.items()}
  assert kinds("adagrad")["t2"] == "column_wise"
  assert "column_wise" not in kinds("rowwise_adagrad").values()


# ---- dynamic tables: table-wise (column-wise and replicated do not apply)


# Every optimizer on 4 replicas; Adam (step-dependent) on 1 and 2 too.
@pytest.mark.parametrize("kind,n", [(k, 4) for k in ("sgd", "adagrad", "adam", "ftrl")] +
                         [("adam", 1), ("adam", 2)])
def test_dynamic_table_wise_equals_dict_oracle(n, kind):
  from tests.support import dynamic_harness as dh
  from tests.unit.test_dynamic_tables import Trainer
  from tests.unit.test_dynamic_tables import assert_table_equals_oracle
  dynamic = dict(admit_after=2, evict_after_steps=4)
  plan = tfde.planner.ShardingPlan(
      num_replicas=n, tables={"users": tfde.planner.TableLayout("table_wise", [n - 1])})
  trainer = Trainer(mirrored(n), dh.feature_configs(dh.table_config(kind, **dynamic)),
                    plan=plan)
  assert sorted(trainer.table.stores) == [n - 1]
  oracle = dh.oracle_for(kind, **dynamic)
  for step in range(6):
    batch = dh.make_batch(step)
    got = trainer(batch)
    want = dh.oracle_step(oracle, batch)
    for f in got:
      np.testing.assert_allclose(got[f], want[f], rtol=dh.RTOL, atol=dh.ATOL,
                                 err_msg=f"step {step} feature {f}")
  assert_table_equals_oracle(trainer.table, oracle)
  assert len(oracle.rows) > 5 and oracle.pending
  assert trainer.table.step_value() == 6


@pytest.mark.parametrize("kind", ["column_wise", "replicated"])
def test_dynamic_tables_refuse_column_wise_and_replicated(kind):
  from tests.support import dynamic_harness as dh
  layout = tfde.planner.TableLayout(kind, [0], [dh.DIM] if kind == "column_wise" else None)
  plan = tfde.planner.ShardingPlan(num_replicas=1, tables={"users": layout})
  with pytest.raises(ValueError, match="'users' is dynamic; .*applies to static"):
    tfde.lookup.ShardedLookup(dh.feature_configs(dh.table_config("sgd")), plan=plan)


# ---- checkpoints hold whole tables: they move between plans and replica counts


def test_checkpoint_moves_between_plans_and_replica_counts(tmp_path):
  kind = "adam"
  configs = h.feature_configs(kind, 2)
  batches = [h.make_batch(s, weighted=True, seed=31, num_replicas=4) for s in range(4)]
  first = make_plan("mixed", 2)
  initial, _, _, _, lookup = planned_run(mirrored(2), configs, batches[:2], first)
  saved = {n: t.state() for n, t in lookup.tables.items()}
  path = tf.train.Checkpoint(lookup=lookup).write(str(tmp_path / "ckpt"))
  _, want_tables = h.reference_run(configs, initial, batches)
  # Every table under another kind, on 4 replicas; and under no plan on 1.
  L = tfde.planner.TableLayout
  second = tfde.planner.ShardingPlan(num_replicas=4, tables={
      "A": L("column_wise", [3, 1], [3, 1]), "B": L("table_row_wise", [3, 2]),
      "C": L("table_wise", [2])})
  for strategy, plan in ((mirrored(4), second), (mirrored(1), None)):
    n = strategy.num_replicas_in_sync
    with strategy.scope():
      restored = tfde.lookup.ShardedLookup(h.feature_configs(kind, 2), plan=plan,
                                           auto_replicate_bytes=0)
    tf.train.Checkpoint(lookup=restored).read(path).assert_consumed()
    for name, table in restored.tables.items():
      for key, value in table.state().items():
        np.testing.assert_array_equal(value.numpy(), saved[name][key].numpy(),
                                      err_msg=f"{name} {key}")
    # Training on equals training that never stopped.
    step = make_step(strategy, restored, weighted=True)
    for batch in batches[2:]:
      per = [h.replica_inputs(batch, r, n) for r in range(n)]
      step(*[distribute(strategy, [p[i] for p in per]) for i in range(3)])
    for name, want in want_tables.items():
      np.testing.assert_allclose(restored.tables[name].full_table(), want,
                                 rtol=RTOL, atol=ATOL, err_msg=f"table {name}")


def test_table_wise_reduced_precision_rows_train_as_row_wise_ones():
  """bfloat16 rows round each update stochastically per global row: a
  table-wise table on replica 1 ends where the row-wise table does."""
  n = 2
  configs = h.feature_configs("adagrad", 1)
  for cfg in configs.values():
    cfg.table.dtype = "bfloat16"
  batches = [h.make_batch(s, weighted=True, seed=51, num_replicas=n) for s in range(3)]
  L = tfde.planner.TableLayout
  finals = []
  for kinds in ({"A": L("table_wise", [1]), "B": L("table_wise", [0]),
                 "C": L("table_wise", [1])},
                {"A": L("row_wise", [0, 1]), "B": L("row_wise", [0, 1]),
                 "C": L("row_wise", [0, 1])}):
    plan = tfde.planner.ShardingPlan(num_replicas=n, tables=kinds)
    _, _, final, _, lookup = planned_run(mirrored(n), configs, batches, plan)
    assert lookup.tables["A"].shards[1].dtype == tf.bfloat16
    finals.append(final)
  for name in finals[0]:
    np.testing.assert_array_equal(finals[0][name], finals[1][name], err_msg=name)


@pytest.mark.parametrize("field,value,reason", [
    ("max_norm", 1.0, "a row's norm spans all its columns"),
    ("dtype", "float16", "stochastic rounding is drawn per row and column"),
    ("optimizer", tfde.optimizers.SGD(learning_rate=0.1, clipnorm=1.0),
     "a row's gradient norm spans all its columns")])
def test_column_wise_refuses_tables_it_cannot_slice_exactly(field, value, reason):
  config = tfde.TableConfig(name="w", vocabulary_size=10, embedding_dim=4,
                            **{field: value})
  plan = tfde.planner.ShardingPlan(1, {"w": tfde.planner.TableLayout(
      "column_wise", [0, 0], [2, 2])})
  with pytest.raises(ValueError, match=f"'w' .*column_wise does not apply .*{reason}"):
    tfde.lookup.ShardedLookup([tfde.FeatureConfig(name="f", table=config)], plan=plan)
  # The planner never proposes it for such a table.
  configs = [tfde.FeatureConfig(name="f", table=tfde.TableConfig(
      name="w", vocabulary_size=50_000, embedding_dim=64, **{field: value}))]
  layouts = [tfde.planner.plan(configs, 4).tables["w"].kind]
  assert "column_wise" not in layouts


def test_a_column_wise_table_refuses_to_switch_to_clipnorm():
  """clipnorm scales each row's whole gradient; no column slice sees it,
  so a column-wise table switched to it is refused, unchanged."""
  lookup = h.sharded_lookup(h.feature_configs("sgd", 1), plan=make_plan("column_wise", 1))
  table = lookup.tables["A"]
  before = table.optimizer
  with pytest.raises(ValueError, match="table 'A': clipnorm clips each row's whole "
                                       "gradient, and a column-wise"):
    table.use_optimizer(tfde.optimizers.SGD(learning_rate=0.1, clipnorm=1.0))
  assert table.optimizer is before and all(s.optimizer is before for s in table.slices)
  # Nor through an explicit update of a slice's variable.
  variable = table.local_variables()[0]
  rows = table.slices[0].full_table().copy()
  with pytest.raises(ValueError, match="table 'A_columns_0_2': clipnorm clips each row's "
                                       "whole gradient, and a column-wise"):
    tfde.optimizers.SGD(learning_rate=0.1, clipnorm=1.0).apply_gradients([(tf.IndexedSlices(
        tf.ones([1, 2]), tf.constant([0], tf.int64), tf.constant([37, 2], tf.int64)), variable)])
  np.testing.assert_array_equal(table.slices[0].full_table(), rows)
  table.use_optimizer(tfde.optimizers.SGD(learning_rate=0.1, clipvalue=1.0))
  assert all(s.optimizer.clipvalue == 1.0 for s in table.slices)


@pytest.mark.parametrize("owners", [
    [None, None, 1], [None, None, [2, 3]], [[1, 0], None, 3, None],
    [2, [0, 1, 2, 3], None, [3], None]])
def test_fused_ids_give_every_row_its_own_slot(owners):
  """FusedGroupLayout: every (table, id) of the group lands on a distinct
  (owner, fused local row), on a replica that holds the table, inside that
  table's rows there ([base, base + rows_per_shard)); row-wise tables
  first, at the same bases everywhere."""
  n = 4
  sizes = [7, 10, 5, 9, 3][:len(owners)]
  layout = tfde.sharding.FusedGroupLayout(sizes, n, owners=owners)
  seen = set()
  for t, size in enumerate(sizes):
    fused = layout.fused_ids(t, np.arange(size, dtype=np.int64))
    for i, f in enumerate(fused.tolist()):
      replica, local = f % n, f // n
      o = owners[t]
      want = (i % n if o is None else o if isinstance(o, int) else o[i % len(o)])
      assert replica == want, (t, i)
      position = layout.tables_on(replica).index(t)
      base = layout.bases_on(replica)[position]
      assert base <= local < base + layout.rows_per_shard[t], (t, i, local)
      assert (replica, local) not in seen, (t, i)
      seen.add((replica, local))
  shared = [t for t, o in enumerate(owners) if o is None]
  for replica in range(n):
    assert layout.tables_on(replica)[:len(shared)] == shared
    assert layout.bases_on(replica)[:len(shared)] == layout.bases_on(0)[:len(shared)]


def test_an_update_with_another_kind_of_optimizer_is_refused_on_every_replica():
  """A table-wise table (owner 1 of 2) and a dynamic one: a replica holding
  none of its rows refuses an update of another optimizer kind by name, as
  the owner does, before any step advances."""
  from tests.support import dynamic_harness as dh
  with mirrored(2).scope():
    static = tfde.tables.TableWiseTable(tfde.TableConfig(
        name="t", vocabulary_size=6, embedding_dim=2, optimizer="adagrad"), owner=1)
    dynamic = tfde.tables.DynamicTableWiseTable(dh.table_config("adagrad"), owner=1)
  for table in (static, dynamic):
    for replica in (0, 1):
      with pytest.raises(ValueError, match=f"table '{table.name}' keeps slots for "
                                           "'adagrad', not 'sgd'"):
        table.apply_gradient(replica, tf.constant([1], tf.int64), tf.ones([1, table.embedding_dim]),
                             optimizer=tfde.optimizers.SGD())
    assert {int(s.numpy()) for s in table.steps.values()} == {0}


@pytest.mark.parametrize("layout", ["table_wise", "column_wise", "table_row_wise", "mixed"])
def test_explicit_gradients_apply_as_the_reference(strategy, layout):
  """train_in_backward=False (SOK style) with tables held by some replicas
  only: each replica's IndexedSlices for the variables it holds, applied
  by a tfde sparse optimizer over K steps, equal the numpy reference."""
  n = strategy.num_replicas_in_sync
  configs = h.feature_configs("adam", variant=1)
  batches = [h.make_batch(s, weighted=True, seed=3, num_replicas=n) for s in range(STEPS)]
  with strategy.scope():
    lookup = tfde.lookup.ShardedLookup(configs, plan=make_plan(layout, n),
                                       train_in_backward=False)
  assert_explicit_training_equals_reference(strategy, lookup, configs, batches, "adam")
