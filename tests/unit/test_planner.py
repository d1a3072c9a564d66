"""The sharding planner: its choices under memory and traffic, its errors,
its serialization, its report and the `tfde plan` command."""

import io
import json
import re
import sys

import numpy as np
import pytest
import tensorflow as tf
import yaml

import tfde
from tests.support import sharded_harness as h
from tests.unit.test_sharded import mirrored
from tfde import planner


def features(sizes, optimizer="adagrad", hotness=4, batch=1024):
  """FeatureConfigs of tables t0, t1, ... of (rows, width)."""
  return [tfde.FeatureConfig(
      name=f"f{i}", input_shape=(batch, hotness), table=tfde.TableConfig(
          name=f"t{i}", vocabulary_size=v, embedding_dim=d, optimizer=optimizer))
          for i, (v, d) in enumerate(sizes)]


def test_memory_forces_row_wise():
  # Unlimited, two replicas replicate a mid-size table (no forward exchange);
  # a budget below a whole copy leaves row-wise, balanced, within budget,
  # exchanging rows: at 4 ids a sample the partial sums' two more
  # collective rounds cost more than their bytes save (under "auto" the
  # planner estimates both and writes its choice for the lookup).
  configs = features([(20_000, 8)])
  assert planner.plan(configs, 2).tables["t0"].kind == "replicated"
  whole = 20_000 * 8 * 4 * 2  # rows and Adagrad's accumulator
  for exchange in ("rows", "auto"):
    tight = planner.plan(configs, 2, memory_per_replica_bytes=whole // 2 + 100,
                         exchange=exchange)
    layout = tight.tables["t0"]
    assert (layout.kind, layout.exchange) == ("row_wise", "rows"), exchange
    assert layout.estimate["bytes_per_replica"] == [whole // 2] * 2
    assert tight.per_replica["bytes_held"] == [whole // 2] * 2


def test_tiny_tables_are_replicated_and_large_ones_sharded():
  configs = features([(100, 8), (60, 8), (500_000, 32), (200_000, 32)])
  plan = planner.plan(configs, 4, memory_per_replica_bytes=1 << 30)
  kinds = {n: l.kind for n, l in plan.tables.items()}
  assert kinds == {"t0": "replicated", "t1": "replicated", "t2": "row_wise",
                   "t3": "row_wise"}, kinds
  # Replicating the large ones is estimated slower: all-gathers grow with N.
  everything = planner.simple_plan(configs, 4, "replicated")
  assert everything.estimated_step_seconds > plan.estimated_step_seconds


def test_wide_table_goes_column_wise_into_the_common_width():
  configs = features([(300_000, 16), (100_000, 16), (50_000, 64)])
  plan = planner.plan(configs, 4)
  wide = plan.tables["t2"]
  assert wide.kind == "column_wise" and wide.column_widths == [16] * 4
  assert sorted(wide.owners) == [0, 1, 2, 3]
  for kind in ("row_wise", "table_wise", "replicated"):
    assert (planner.simple_plan(configs, 4, kind).estimated_step_seconds >=
            plan.estimated_step_seconds), kind


def test_bytes_between_workers_are_priced_by_their_link():
  """4 replicas in 2 workers (0, 1 | 2, 3): the cross-worker share of each
  replica's exchange bytes, counted by hand, and the step estimate that
  prices them at the slower link."""
  from tfde.planner import cost as cost_lib  # pylint: disable=g-import-not-at-top
  stats = cost_lib.TableStats("t", rows=1000, width=8, slots=1, dynamic=False,
                              ids_per_sample=1.0, unique_per_replica=30.0,
                              unique_global=100.0, measured=True)
  L = planner.TableLayout
  row = 8 * 4
  # Row-wise: a replica sends 3/4 of its 30 ids (and gets rows back) and
  # serves as many: 2 x 22.5 x (8 + 32) = 1800 bytes forward, 1440 of rows
  # and gradients backward; 2 of its 3 peers are on the other worker.
  load = cost_lib.layout_load(stats, L("row_wise", [0, 1, 2, 3]), 4, per_worker=2)
  np.testing.assert_allclose(load.forward, [1800] * 4)
  np.testing.assert_allclose(load.forward_cross, [1200] * 4)
  np.testing.assert_allclose(load.backward_cross, [2 * 22.5 * row * 2 / 3] * 4)
  # Table-row-wise over worker 0 (replicas 0, 1): each replica sends each
  # owner but itself 15 ids. Replica 0 sends 15 to 1 (its worker) and
  # hears 15 from each of 1, 2, 3; 2 and 3 send 15 to each owner, across.
  load = cost_lib.layout_load(stats, L("table_row_wise", [0, 1]), 4, per_worker=2)
  ids = 15 * (8 + row)
  np.testing.assert_allclose(load.forward, [4 * ids, 4 * ids, 2 * ids, 2 * ids])
  np.testing.assert_allclose(load.forward_cross, [2 * ids] * 4)
  np.testing.assert_allclose(load.memory, [500 * 8 * 4 * 2] * 2 + [0, 0])
  # Table-wise on replica 0: replica 1 (its worker) sends nothing across;
  # 2 and 3 send their 30 ids (and get rows) across; 0 hears from both.
  load = cost_lib.layout_load(stats, L("table_wise", [0]), 4, per_worker=2)
  forward = 30 * (8 + row)
  np.testing.assert_allclose(load.forward_cross, [2 * forward, 0, forward, forward])
  np.testing.assert_allclose(load.backward_cross, [2 * 30 * row, 0, 30 * row, 30 * row])
  # One worker, or workers unknown: nothing crosses.
  for per_worker in (4, None):
    load = cost_lib.layout_load(stats, L("row_wise", [0, 1, 2, 3]), 4, per_worker)
    assert not load.forward_cross.any() and not load.backward_cross.any()
  # The estimate: a slower link between workers makes more workers slower,
  # and one worker is the same as not knowing.
  configs = features([(300_000, 16), (50_000, 64), (2_000, 16)])
  cost = planner.CostModel(bandwidth_bytes_per_s=100e9,
                           cross_worker_bandwidth_bytes_per_s=5e9)
  seconds = {w: planner.plan(configs, 8, replicas_per_worker=w, cost_model=cost)
             .estimated_step_seconds for w in (None, 8, 4, 2, 1)}
  assert seconds[None] == seconds[8] < seconds[4] < seconds[2] < seconds[1], seconds
  plan = planner.plan(configs, 8, replicas_per_worker=2, cost_model=cost)
  assert plan.replicas_per_worker == 2
  assert all(layout.estimate["cross_worker_bytes_per_step"] > 0
             for layout in plan.tables.values() if layout.kind != "replicated")
  with pytest.raises(ValueError, match="cross_worker_bandwidth_bytes_per_s"):
    planner.CostModel(cross_worker_bandwidth_bytes_per_s=0)


def test_hot_tables_spread_over_a_worker_each():
  """Two hot tables on 2 workers of 4 replicas, where each table held costs
  its replica a fixed time. Exchanging rows, spreading each table's rows
  over one worker (table-row-wise) halves the tables every replica holds
  and keeps the serving balanced; row-wise is estimated 14% slower,
  table-wise 2.8x. Exchanging partial sums (the default, 20 ids a
  sample), row-wise sends fewer bytes and is estimated faster."""
  configs = features([(1_000_000, 64), (1_000_000, 64)], optimizer="sgd",
                     hotness=20, batch=4096)
  cost = planner.CostModel(bandwidth_bytes_per_s=200e9,
                           cross_worker_bandwidth_bytes_per_s=25e9, table_overhead_s=2e-3)
  plan = planner.plan(configs, 8, replicas_per_worker=4, cost_model=cost, exchange="rows")
  assert sorted(map(tuple, (l.owners for l in plan.tables.values()))) == [
      (0, 1, 2, 3), (4, 5, 6, 7)]
  assert {l.kind for l in plan.tables.values()} == {"table_row_wise"}
  ratio = {kind: planner.simple_plan(configs, 8, kind, cost_model=cost, replicas_per_worker=4,
                                     exchange="rows").estimated_step_seconds /
           plan.estimated_step_seconds for kind in ("row_wise", "table_wise")}
  assert 1.1 < ratio["row_wise"] < 1.2 and 2.5 < ratio["table_wise"] < 3.1, ratio
  pooled = planner.plan(configs, 8, replicas_per_worker=4, cost_model=cost)
  assert {l.kind for l in pooled.tables.values()} == {"row_wise"}
  assert pooled.estimated_step_seconds < plan.estimated_step_seconds
  # Not knowing the workers, it is not a candidate; a plan of it needs them.
  for exchange in ("rows", "auto"):
    assert {l.kind for l in planner.plan(configs, 8, cost_model=cost, exchange=exchange
                                         ).tables.values()} == {"row_wise"}
  with pytest.raises(ValueError, match="replicas_per_worker"):
    planner.simple_plan(configs, 8, "table_row_wise")
  with pytest.raises(ValueError, match="must divide"):
    planner.simple_plan(configs, 8, "row_wise", replicas_per_worker=16)
  with pytest.raises(ValueError, match="distinct"):
    planner.TableLayout("table_row_wise", [1, 1])


def test_a_plan_that_cannot_fit_names_the_table_and_the_bytes_missing():
  configs = features([(1000, 8), (1_000_001, 16)], optimizer="adam")
  budget = 24 << 20
  with pytest.raises(planner.PlanError) as error:
    planner.plan(configs, 2, memory_per_replica_bytes=budget)
  # Its smallest layout is two column slices of all its rows, 8 floats wide
  # with two Adam slots (row-wise pads one row: 500_001 x 16 x 3 floats).
  need = 1_000_001 * 8 * 4 * 3
  message = str(error.value)
  assert "table 't1'" in message and f"{need - budget} bytes more" in message, message


def test_sample_inputs_give_ids_per_sample_and_unique_ratios():
  configs = features([(1000, 8)])
  ids = np.array([[1, 1, 2], [1, 3, 3], [7, 7, 7], [8, 9, 7]])
  stats = planner.table_stats(configs, 2, sample_inputs={"f0": tf.constant(ids)})
  t0 = stats["t0"]
  assert t0.measured and t0.ids_per_sample == 3
  # Replica 0 sees {1, 2, 3}, replica 1 {7, 8, 9}; 6 distinct in all.
  assert t0.unique_per_replica == 3 and t0.unique_global == 6
  ragged = tf.ragged.constant([[5], [], [5, 6]], tf.int64)
  stats = planner.table_stats(configs, 1, sample_inputs={"f0": ragged})
  assert stats["t0"].ids_per_sample == 1 and stats["t0"].unique_global == 2


def test_the_rows_only_stats_are_the_measures_under_rows():
  # plan() measures the sample inputs once and derives the rows-only
  # search's stats (cost.exchanging_rows): they must be what measuring
  # under exchange="rows" gives, for measured and declared ids.
  configs = features([(1000, 8), (64, 16), (5000, 8)])
  rng = np.random.default_rng(0)
  sample = {"f0": tf.constant(rng.integers(0, 1000, (32, 6))),
            "f1": tf.ragged.constant([[1, 2], [], [3]] * 8, tf.int64)}
  for inputs in (sample, None):
    auto = planner.table_stats(configs, 4, sample_inputs=inputs)
    assert any(t.may_pool_partials for t in auto.values())  # else nothing is checked
    assert planner.cost.exchanging_rows(auto) == planner.table_stats(
        configs, 4, sample_inputs=inputs, exchange="rows")


def test_plan_round_trips_and_is_checked():
  plan = planner.plan(features([(100, 8), (50_000, 16), (20_000, 64)]), 4)
  again = planner.ShardingPlan.from_json(plan.to_json())
  assert again == plan
  assert json.loads(plan.to_json())["tables"]["t0"]["kind"] == plan.tables["t0"].kind
  assert planner.ShardingPlan.from_config(plan.get_config()) == plan
  with pytest.raises(ValueError, match="one of"):
    planner.TableLayout("diagonal", [0])
  with pytest.raises(ValueError, match="names replicas \\[5\\]"):
    planner.ShardingPlan(2, {"t": planner.TableLayout("table_wise", [5])})
  with pytest.raises(ValueError, match="one column width per owner"):
    planner.TableLayout("column_wise", [0, 1], [4])
  with pytest.raises(ValueError, match="made for 4 replicas.*built for 1"):
    tfde.lookup.ShardedLookup(features([(100, 8), (50_000, 16), (20_000, 64)]),
                              plan=plan)


def test_a_planned_lookup_equals_the_unplanned_one():
  """The planner's plan for the harness's tables (fed a sample batch),
  applied on 4 replicas: outputs and trained tables equal the reference."""
  from tests.unit.test_sharding_kinds import planned_run
  configs = h.feature_configs("ftrl", 1)
  batches = [h.make_batch(s, weighted=True, seed=41, num_replicas=4) for s in range(3)]
  sample = {f: tf.ragged.constant(batches[0][f]["ids"], tf.int64) for f in h.FEATURES}
  # Replicating B (the largest) first would leave A too little memory for
  # even its row-wise shard: the planner keeps room for the tables to come.
  plan = planner.plan(configs, 4, sample_inputs=sample, memory_per_replica_bytes=2600,
                      cost_model=planner.CostModel(min_column_width=2))
  assert {l.kind for l in plan.tables.values()} == {"row_wise", "replicated"}
  initial, outputs, final, _, _ = planned_run(mirrored(4), configs, batches, plan)
  want_outputs, want_tables = h.reference_run(configs, initial, batches)
  for f in h.FEATURES:
    np.testing.assert_allclose(outputs[f], want_outputs[f], rtol=1e-5, atol=1e-6)
  for name in want_tables:
    np.testing.assert_allclose(final[name], want_tables[name], rtol=1e-5, atol=1e-6)


def test_keras_layer_takes_a_plan_and_saves_it():
  configs = {f.name: f for f in features([(100, 8), (3000, 8)])}
  plan = planner.ShardingPlan(1, {"t0": planner.TableLayout("table_wise", [0]),
                                  "t1": planner.TableLayout("column_wise", [0, 0],
                                                            [4, 4])})
  layer = tfde.layers.DistributedEmbedding(configs, plan=plan)
  assert isinstance(layer.tables["t1"], tfde.tables.ColumnWiseTable)
  out = layer({"f0": tf.constant([[1, 2]]), "f1": tf.constant([[3, 4]])})
  assert out["f1"].shape == (1, 8)
  np.testing.assert_allclose(
      out["f1"].numpy()[0], layer.get_embedding_tables()["t1"].numpy()[[3, 4]].mean(0),
      rtol=1e-6)
  again = tfde.layers.DistributedEmbedding.from_config(layer.get_config())
  assert again.plan == plan


def test_report_names_every_table_and_replica(capsys):
  plan = planner.plan(features([(100, 8), (50_000, 16), (20_000, 64)]), 4,
                      memory_per_replica_bytes=1 << 30)
  text = plan.report()
  assert capsys.readouterr().out.strip() == text.strip()
  for name, layout in plan.tables.items():
    assert any(line.startswith(name) and layout.kind in line for line in text.splitlines())
  assert "balance (max / mean)" in text and text.count("\n3 ") == 1


def test_plan_command_writes_text_json_and_plot(tmp_path, capsys):
  from tfde.app import cli
  out = tmp_path / "plan"
  assert cli.main(["plan", "--config", "configs/demo.yaml", "--replicas", "4",
                   "--memory-per-replica", "256MiB", "--report-dir", str(out)]) == 0
  printed = capsys.readouterr().out
  plan = planner.ShardingPlan.from_json((out / "plan.json").read_text())
  assert plan.num_replicas == 4 and plan.memory_per_replica_bytes == 256 << 20
  assert max(plan.per_replica["bytes_held"]) <= 256 << 20
  assert (out / "plan.txt").read_text().strip() in printed
  assert (out / "plan.png").stat().st_size > 1000
  # The job's sparse features, each measured on a batch of its data.
  assert sorted(plan.tables) == sorted(["site", "app", "device", "user", "ad",
                                        "history", "category", "hour"])
  assert plan.tables["history"].estimate["ids_per_sample"] > 2


def test_plan_command_without_matplotlib_writes_its_numbers(tmp_path, capsys, monkeypatch):
  from tfde.app import cli
  # None in sys.modules makes `import matplotlib` raise ImportError.
  monkeypatch.setitem(sys.modules, "matplotlib", None)
  monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
  out = tmp_path / "plan"
  assert cli.main(["plan", "--config", "configs/demo.yaml", "--replicas", "2",
                   "--report-dir", str(out)]) == 0
  assert "tfde plan: matplotlib is not installed; no plots" in capsys.readouterr().out
  assert sorted(p.name for p in out.iterdir()) == ["plan.json", "plan.txt"]
  assert planner.ShardingPlan.from_json((out / "plan.json").read_text()).num_replicas == 2


@pytest.mark.parametrize("args,message", [
    (["--memory-per-replica", "8MiB"], "table 'user' .* does not fit: .* needs {missing} bytes more"),
    (["--memory-per-replica", "lots"], "--memory-per-replica: not a size in bytes"),
    (["--replicas", "0"], "--replicas: must be >= 1")])
def test_plan_command_errors_are_one_line(tmp_path, capsys, args, message):
  from tfde.app import cli
  assert cli.main(["plan", "--config", "configs/demo.yaml", "--replicas", "4",
                   "--report-dir", str(tmp_path)] + args[:1] + args[1:]) == 2
  err = capsys.readouterr().err
  assert err.startswith("tfde: error:") and err.count("\n") == 1
  import re
  if "{missing}" in message:
    # The demo's largest table, row-wise over 4 replicas: its rows and the
    # table optimizer's slots (float32), less the 8 MiB a replica has.
    with open("configs/demo.yaml") as f:
      demo = yaml.safe_load(f)
    user, = [f for f in demo["data"]["sparse_features"] if f["name"] == "user"]
    slots = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 2}[
        demo["model"]["table_optimizer"]["kind"]]
    per_replica = user["vocabulary_size"] * demo["model"]["embedding_dim"] * 4 * (1 + slots) // 4
    message = message.format(missing=per_replica - 8 * 2**20)
  assert re.search(message, err), err


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("exchange", ["auto", "rows"])
def test_row_wise_bytes_estimate_what_the_lookup_sends(n, exchange):
  """The planner's row-wise bytes a step, fed one batch as its sample,
  against the bytes the lookup's exchanges send for that batch (counted
  by the communicator): partial sums per feature and every id (with its
  share owned elsewhere estimated as (N-1)/N), or rows of the unique ids."""
  configs = h.feature_configs("sgd")
  batch = h.make_batch(0, weighted=False, num_replicas=n)
  sample = {f: tf.ragged.constant(batch[f]["ids"], tf.int64) for f in h.FEATURES}
  plan = planner.simple_plan(configs, n, "row_wise", sample_inputs=sample,
                             exchange=exchange)
  estimate = sum(l.estimate["bytes_exchanged_per_step"] for l in plan.tables.values())
  strategy = mirrored(n)
  with strategy.scope():
    lookup = h.sharded_lookup(configs, exchange=exchange)
  assert set(lookup.exchanges().values()) == {
      "partial sums" if exchange == "auto" else "rows"}
  from tests.unit.test_sharded import distribute  # pylint: disable=g-import-not-at-top
  from tests.unit.test_sharded import make_step  # pylint: disable=g-import-not-at-top
  per = [h.replica_inputs(batch, r, n) for r in range(n)]
  lookup.comm.reset_bytes_sent()
  make_step(strategy, lookup, weighted=False)(
      distribute(strategy, [p[0] for p in per]), None,
      distribute(strategy, [p[2] for p in per]))
  sent = lookup.comm.bytes_sent()
  assert abs(estimate / sent - 1) < 0.1, (estimate, sent)


def test_the_plan_chooses_each_widths_exchange_and_the_lookup_takes_it():
  """Fed a sample, the planner gives each width's row-wise tables the
  exchange estimated faster, and a lookup under the plan takes it where
  its own rule would not: undeclared one-hot features (which the rule
  sends as partial sums) exchange rows, a width of 20 ids a sample
  partial sums; a width holding a max-norm table can only exchange rows.
  The layouts say so, round-trip, and are checked."""
  rng = np.random.default_rng(3)
  n, batch = 4, 4096

  def feature(name, rows, width, max_norm=None):
    return tfde.FeatureConfig(name=name, table=tfde.TableConfig(
        name=name, vocabulary_size=rows, embedding_dim=width, optimizer="sgd",
        max_norm=max_norm))

  configs = [feature("one_hot_a", 400_000, 8), feature("one_hot_b", 300_000, 8),
             feature("hot", 500_000, 16), feature("renormalised", 200_000, 32, 1.0)]
  hotness = {"one_hot_a": 1, "one_hot_b": 1, "hot": 20, "renormalised": 20}
  sample = {f.name: tf.constant(rng.integers(0, f.table.vocabulary_size,
                                             (batch, hotness[f.name])))
            for f in configs}
  # Too little memory to replicate the one-hot tables, and no column slices.
  budget, cost = 24_000_000, planner.CostModel(min_column_width=64)
  plan = planner.plan(configs, n, sample_inputs=sample, memory_per_replica_bytes=budget,
                      cost_model=cost)
  assert {name: (l.kind, l.exchange) for name, l in plan.tables.items()} == {
      "one_hot_a": ("row_wise", "rows"), "one_hot_b": ("row_wise", "rows"),
      "hot": ("row_wise", "partial sums"), "renormalised": ("row_wise", "rows")}, plan.tables
  assert planner.ShardingPlan.from_json(plan.to_json()) == plan
  assert "(sums)" in plan.report(file=io.StringIO())
  strategy = mirrored(n)
  with strategy.scope():
    unplanned = tfde.lookup.ShardedLookup(configs).exchanges()
    planned = tfde.lookup.ShardedLookup(configs, plan=plan)
  assert unplanned["one_hot_a"] == "partial sums"
  assert planned.exchanges() == {"one_hot_a": "rows", "one_hot_b": "rows",
                                 "hot": "partial sums", "renormalised": "rows"}
  from tests.unit.test_sharded import _exchange_scopes  # pylint: disable=g-import-not-at-top
  inputs = {f.name: tf.constant(rng.integers(0, 100, (batch // n, hotness[f.name])))
            for f in configs}
  assert _exchange_scopes(strategy, planned, inputs) == {"rows": 2, "partial_sums": 1}
  # Chosen where the choice is the planner's; refused where it cannot hold.
  with pytest.raises(ValueError, match="row_wise layouts only"):
    planner.TableLayout("table_wise", [0], exchange="rows")
  with pytest.raises(ValueError, match="must be one of"):
    planner.TableLayout("row_wise", [0, 1], exchange="sums")
  # Exchanging rows by the lookup's own choice, the plan picks no sums.
  rows_plan = planner.plan(configs, n, sample_inputs=sample, exchange="rows",
                           memory_per_replica_bytes=budget, cost_model=cost)
  assert {l.exchange for l in rows_plan.tables.values()} == {"rows"}


def test_the_exchange_chosen_is_one_the_lookups_group_can_take():
  """The choice is per exchange group as the lookup stacks tables: a
  bfloat16 table of the same width is a group of its own (it does not
  force rows onto the float32 one); a width whose rows together leave no
  room for the sample in an int64 id exchanges rows, though each table
  alone would (and the planner finds a faster layout); ids per sample
  neither measured nor declared get the lookup's rule for the group,
  written; a plan exchanging rows is followed by a lookup left at
  "auto"."""
  n, batch = 4, 4096

  def feature(name, rows, width, hot=20, dtype="float32"):
    return tfde.FeatureConfig(name=name, input_shape=(batch // n, hot),
                              table=tfde.TableConfig(name=name, vocabulary_size=rows,
                                                     embedding_dim=width, optimizer="sgd",
                                                     dtype=dtype))

  mixed = [feature("hot", 500_000, 16), feature("half", 300_000, 16, dtype="bfloat16")]
  plan = planner.plan(mixed, n, memory_per_replica_bytes=12_000_000)
  assert {t: (l.kind, l.exchange) for t, l in plan.tables.items()} == {
      "hot": ("row_wise", "partial sums"), "half": ("row_wise", "rows")}, plan.tables
  with mirrored(n).scope():
    assert tfde.lookup.ShardedLookup(mixed, plan=plan).exchanges() == {
        "hot": "partial sums", "half": "rows"}
  # 4 x 2^29 rows of width 8 at 4 replicas: 2^29 rows a replica, 29 bits
  # for the row and 4 x 2^29 = 2^31 for the sample's step; one alone fits.
  from tfde import routing  # pylint: disable=g-import-not-at-top
  huge = [feature(f"h{i}", 2**29, 8, hot=50) for i in range(4)]
  assert routing.sample_key_bits(2**29 // n, n) is not None
  assert routing.sample_key_bits(2**29, n) is None
  plan = planner.plan(huge, n)
  assert all(l.exchange != "partial sums" for l in plan.tables.values()), plan.tables
  rows_only = planner.plan(huge, n, exchange="rows")
  assert plan.estimated_step_seconds <= rows_only.estimated_step_seconds
  one = planner.plan(huge[:1], n)
  assert one.tables["h0"].exchange == "partial sums"

  # Neither measured nor declared, the plan writes the lookup's own rule
  # for the group (partial sums: undeclared), and prices that; a declared
  # one-hot table of the same width goes with its group, as in the lookup.
  def undeclared(name, rows=500_000, hot=None):
    return tfde.FeatureConfig(name=name, input_shape=None if hot is None else (None, hot),
                              table=tfde.TableConfig(name=name, vocabulary_size=rows,
                                                     embedding_dim=16, optimizer="sgd"))
  group = [undeclared("u"), undeclared("one_hot", 400_000, hot=1)]
  cost = planner.CostModel(min_column_width=64)
  plan = planner.plan(group, n, memory_per_replica_bytes=16_000_000, cost_model=cost)
  assert {t: (l.kind, l.exchange) for t, l in plan.tables.items()} == {
      "u": ("row_wise", "partial sums"), "one_hot": ("row_wise", "partial sums")}
  with mirrored(n).scope():
    assert set(tfde.lookup.ShardedLookup(group).exchanges().values()) == {"partial sums"}
  # Exchanging rows by the planner's word, a lookup left at "auto" follows.
  small = [undeclared("s", 200_000)]
  for planned in (planner.plan(small, n, exchange="rows",
                               memory_per_replica_bytes=4_000_000, cost_model=cost),
                  planner.simple_plan(small, n, "row_wise", exchange="rows")):
    assert planned.tables["s"].exchange == "rows"
    with mirrored(n).scope():
      assert tfde.lookup.ShardedLookup(small, plan=planned).exchanges() == {"s": "rows"}
      assert tfde.lookup.ShardedLookup(small).exchanges() == {"s": "partial sums"}
  # A plan written before layouts named an exchange still loads.
  old = json.loads(plan.to_json())
  del old["tables"]["u"]["exchange"]
  assert planner.ShardingPlan.from_config(old).tables["u"].exchange is None


@pytest.mark.parametrize("budget", [float("nan"), float("inf"), -1, 0, "64MiB", True])
def test_plan_refuses_a_budget_that_is_not_bytes(budget):
  """A NaN budget compares false with every size, so it used to be ignored
  (the plan came out unlimited); inf, <= 0 and non-numbers are refused too."""
  with pytest.raises(ValueError, match=r"memory_per_replica_bytes must be a finite "
                     r"number of bytes > 0.*got " + re.escape(repr(budget))):
    planner.plan(features([(1000, 8)]), 2, memory_per_replica_bytes=budget)
  with pytest.raises(ValueError, match="ShardingPlan.memory_per_replica_bytes"):
    planner.ShardingPlan(2, {"t": planner.TableLayout("table_wise", [0])},
                         memory_per_replica_bytes=budget)


@pytest.mark.parametrize("layout,message", [
    ({"kind": "table_wise", "owners": [1.7]}, r"table 't'.*owners.*ints >= 0.*1\.7"),
    ({"kind": "table_wise", "owners": [True]}, r"table 't'.*owners.*ints >= 0"),
    ({"kind": "table_wise", "owners": ["1"]}, r"table 't'.*owners.*ints >= 0"),
    ({"kind": "table_wise", "owners": 1}, r"table 't'.*owners must be a list"),
    ({"kind": "table_wise", "owners": [-1]}, r"table 't'.*owners.*ints >= 0.*-1"),
    ({"kind": "table_wise", "owners": [2]}, r"table 't' names replicas \[2\]"),
    ({"kind": "column_wise", "owners": [0, 1], "column_widths": [4.5, 3.5]},
     r"table 't'.*column widths must be ints >= 1"),
    ("table_wise", r"table 't'.s layout must be a mapping")])
def test_a_hand_edited_plan_is_refused_by_table(layout, message):
  """An owner of 1.7 once became replica 1 (int() truncates)."""
  text = json.dumps({"num_replicas": 2, "tables": {"t": layout}})
  with pytest.raises(ValueError, match=message):
    planner.ShardingPlan.from_json(text)


def test_a_plan_whose_tables_is_a_list_is_refused():
  text = json.dumps({"num_replicas": 2, "tables": [{"kind": "table_wise", "owners": [0]}]})
  with pytest.raises(ValueError, match="tables must be a mapping of table name -> "
                     "layout, got a list"):
    planner.ShardingPlan.from_json(text)
