"""Sharded tables under MirroredStrategy (N logical CPUs, N in {1, 2, 4})
against the unsharded numpy reference of tests/support/sharded_harness.py."""

import collections
import dataclasses
import re

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import sharded_harness as h

STEPS = 10
RTOL = 1e-5
ATOL = 1e-6


def mirrored(num_replicas):
  return tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(num_replicas)])


def distribute(strategy, per_replica):
  return strategy.experimental_distribute_values_from_function(
      lambda ctx: per_replica[ctx.replica_id_in_sync_group])


def make_step(strategy, lookup, weighted, use_function=True):
  def replica_step(inputs, weights, targets):
    with tf.GradientTape() as tape:
      outputs = lookup(inputs, weights)
      loss = h.replica_loss(outputs, targets)
    grads = tape.gradient(loss, lookup.trainable_variables)
    return outputs, grads

  def step(inputs, weights, targets):
    args = (inputs, weights if weighted else None, targets)
    return strategy.run(replica_step, args=args)

  return tf.function(step, reduce_retracing=True) if use_function else step


def sharded_run(strategy, configs, batches, weighted, use_function=True,
                train_in_backward=True, exchange="auto", bounds=None):
  """Trains on `batches` (each replica's slice within `bounds`, equal
  slices when None); returns initial tables, first outputs, final tables,
  the per-step gradients (explicit mode) and the lookup."""
  n = strategy.num_replicas_in_sync
  with strategy.scope():
    lookup = h.sharded_lookup(configs, train_in_backward=train_in_backward,
                              exchange=exchange)
  initial = {name: t.full_table() for name, t in lookup.tables.items()}
  step = make_step(strategy, lookup, weighted, use_function)
  first_outputs, all_grads = None, []
  for batch in batches:
    per = [h.replica_inputs(batch, r, n, bounds) for r in range(n)]
    inputs = distribute(strategy, [p[0] for p in per])
    weights = distribute(strategy, [p[1] for p in per]) if weighted else None
    targets = distribute(strategy, [p[2] for p in per])
    outputs, grads = step(inputs, weights, targets)
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


def test_initial_table_is_independent_of_replica_count():
  values = []
  for n in (1, 2, 4):
    with mirrored(n).scope():
      lookup = h.sharded_lookup(h.feature_configs("sgd"))
    values.append({k: t.full_table() for k, t in lookup.tables.items()})
  for other in values[1:]:
    for name in values[0]:
      np.testing.assert_array_equal(values[0][name], other[name])
  assert np.std(values[0]["A"]) > 0.1  # really random, not zeros


def test_shards_hold_mod_n_rows(strategy):
  n = strategy.num_replicas_in_sync
  with strategy.scope():
    lookup = h.sharded_lookup(h.feature_configs("sgd"))
  table = lookup.tables["B"]
  # The one-replica table is a single plain variable: the whole table.
  with mirrored(1).scope():
    whole = h.sharded_lookup(h.feature_configs("sgd"))
  full = whole.tables["B"].shards[0].numpy()
  for replica, shard in table.shards.items():
    assert shard.shape == (-(-50 // n), 4)
    rows = np.arange(replica, 50, n)
    np.testing.assert_array_equal(shard.numpy()[:len(rows)], full[rows])
    assert shard.device.endswith(f"CPU:{replica}")


# Both exchanges of row-wise groups: each owner's partial sums of every
# sample (the default), and the rows of each replica's unique ids.
EXCHANGES = pytest.mark.parametrize("exchange", ["auto", "rows"])


@EXCHANGES
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam", "ftrl", "rowwise_adagrad"])
def test_training_equals_unsharded_reference(strategy, kind, weighted, exchange):
  variant = h.variant_of(kind)
  configs = h.feature_configs(kind, variant)
  n = strategy.num_replicas_in_sync
  batches = [h.make_batch(s, weighted, seed=variant, num_replicas=n)
             for s in range(STEPS)]
  initial, outputs, final, _, lookup = sharded_run(strategy, configs, batches,
                                                   weighted, exchange=exchange)
  want_outputs, want_tables = h.reference_run(configs, initial, batches)
  for f in h.FEATURES:
    np.testing.assert_allclose(outputs[f], want_outputs[f], rtol=RTOL, atol=ATOL,
                               err_msg=f"feature {f}")
  for name in want_tables:
    np.testing.assert_allclose(final[name], want_tables[name], rtol=RTOL,
                               atol=ATOL, err_msg=f"table {name}")
    assert not np.allclose(final[name], initial[name])
    # One optimizer step per training step, however many features share it.
    for step in lookup.tables[name].steps.values():
      assert int(step.numpy()) == STEPS


def test_exchanges_say_which_tables_pool(strategy):
  """Row-wise tables of pooled features exchange partial sums; a group with
  a max-norm table (rows renormalised where they are combined) exchanges
  rows, for every table of its width; one replica exchanges nothing."""
  n = strategy.num_replicas_in_sync
  configs = h.feature_configs("sgd")
  with strategy.scope():
    auto = h.sharded_lookup(configs).exchanges()
    rows = h.sharded_lookup(configs, exchange="rows").exchanges()
    a = dataclasses.replace(configs["a_dense"].table, max_norm=1.0)
    renormalised = h.sharded_lookup({
        f: dataclasses.replace(c, table=a) if c.table.name == "A" else c
        for f, c in configs.items()}).exchanges()
  if n == 1:
    assert auto == rows == renormalised == {"A": "none", "B": "none", "C": "none"}
    return
  assert auto == {"A": "partial sums", "B": "partial sums", "C": "partial sums"}
  assert rows == {"A": "rows", "B": "rows", "C": "rows"}
  assert renormalised == {"A": "rows", "B": "rows", "C": "partial sums"}


def _exchange_scopes(strategy, lookup, inputs):
  """Per exchange kind, the name scopes of that exchange in one replica's
  traced forward (one scope per group taking it)."""
  graph = tf.function(lambda: strategy.run(lambda: lookup(inputs))
                      ).get_concrete_function().graph
  scopes = collections.defaultdict(set)
  for op in graph.get_operations():
    if op.name.startswith("replica_"):
      continue  # the other replicas' copies of the same step
    match = re.search(r"(partial_sums|rows)_exchange(_\d+)?/", op.name)
    if match:
      scopes[match.group(1)].add(op.name[:match.end()])
  return {kind: len(names) for kind, names in scopes.items()}


def test_the_exchange_built_is_the_one_reported(strategy):
  """The graph a lookup builds takes, per group, the exchange `exchanges()`
  reports: the group of tables A and B (width 4) exchanges rows once A has
  a max norm, or at few declared ids per sample; C (width 3) partial sums."""
  n = strategy.num_replicas_in_sync
  configs = h.feature_configs("sgd")
  a = dataclasses.replace(configs["a_dense"].table, max_norm=1.0)
  cases = {
      "auto": {},
      "rows": dict(exchange="rows"),
      "max norm": dict(configs={f: dataclasses.replace(c, table=a) if c.table.name == "A"
                                else c for f, c in configs.items()}),
      # The most ids a sample each feature of A and B has (3.75 on
      # average, under 2N).
      "few declared": dict(configs={
          f: dataclasses.replace(c, input_shape=(None, 3 if f == "a_dense" else 4))
          if c.table.name != "C" else c for f, c in configs.items()}),
  }
  inputs = h.replica_inputs(h.make_batch(0, weighted=False, num_replicas=n), 0, n)[0]
  for case, kwargs in cases.items():
    with strategy.scope():
      lookup = h.sharded_lookup(kwargs.get("configs", configs),
                                exchange=kwargs.get("exchange", "auto"))
    reported = lookup.exchanges()
    width_of = {"A": 4, "B": 4, "C": 3}
    want = collections.Counter()
    for width in set(width_of.values()):
      kinds = {reported[t] for t in width_of if width_of[t] == width}
      assert len(kinds) == 1, (case, reported)  # a group takes one exchange
      kind = kinds.pop()
      if kind != "none":
        want["partial_sums" if kind == "partial sums" else "rows"] += 1
    assert _exchange_scopes(strategy, lookup, inputs) == dict(want), (case, reported)
    if n > 1 and case == "auto":
      assert want == {"partial_sums": 2}
    if n > 1 and case in ("max norm", "few declared"):
      assert want == {"partial_sums": 1, "rows": 1}


def test_auto_keeps_rows_for_few_declared_ids_per_sample(strategy):
  """Where every feature of a group declares its ids per sample
  (`input_shape`), "auto" exchanges partial sums only for 2N or more a
  sample on average; undeclared, always."""
  n = strategy.num_replicas_in_sync
  configs = h.feature_configs("sgd")

  def declared(hotness):
    return {f: dataclasses.replace(c, input_shape=(None, hotness[f]))
            if f in hotness else c for f, c in configs.items()}

  with strategy.scope():
    few = h.sharded_lookup(declared({f: 2 * n - 1 for f in configs})).exchanges()
    enough = h.sharded_lookup(declared({f: 2 * n for f in configs})).exchanges()
    part = h.sharded_lookup(declared({"a_dense": 1})).exchanges()
  if n == 1:
    assert set(few.values()) == set(enough.values()) == set(part.values()) == {"none"}
    return
  assert few == {"A": "rows", "B": "rows", "C": "rows"}
  assert enough == part == {"A": "partial sums", "B": "partial sums", "C": "partial sums"}


@EXCHANGES
@pytest.mark.parametrize("first_empty", [False, True], ids=["growing", "first_empty"])
def test_replicas_with_batches_of_other_sizes_equal_reference(strategy, exchange,
                                                              first_empty):
  """Slices of 1 : 2 (: 3 : 4) of the global batch, or the first replica
  with no samples at all, every combiner, mixed in one group, with
  weights: each replica's samples keep their place in the owners' partial
  sums, forward and backward."""
  n = strategy.num_replicas_in_sync
  configs = h.feature_configs("adagrad", variant=1)
  bounds = h.replica_bounds(n, uneven=True)
  assert n == 1 or len({b - a for a, b in zip(bounds, bounds[1:])}) == n
  if first_empty:
    bounds = [0] + bounds[1:] if n == 1 else [0, 0] + bounds[2:]
  batches = [h.make_batch(s, weighted=True, seed=9, num_replicas=n) for s in range(3)]
  initial, outputs, final, _, _ = sharded_run(strategy, configs, batches, weighted=True,
                                              exchange=exchange, bounds=bounds)
  want_outputs, want_tables = h.reference_run(configs, initial, batches)
  for f in h.FEATURES:
    np.testing.assert_allclose(outputs[f], want_outputs[f], rtol=RTOL, atol=ATOL,
                               err_msg=f"feature {f}")
  for name in want_tables:
    np.testing.assert_allclose(final[name], want_tables[name], rtol=RTOL, atol=ATOL,
                               err_msg=f"table {name}")


@EXCHANGES
def test_explicit_gradients_equal_reference(strategy, exchange):
  """train_in_backward=False: IndexedSlices on the local shards, equal to
  the reference gradient of the global loss; the tables do not move."""
  configs = h.feature_configs("sgd", variant=1)
  n = strategy.num_replicas_in_sync
  batches = [h.make_batch(0, weighted=True, seed=5, num_replicas=n)]
  initial, _, final, grads, lookup = sharded_run(
      strategy, configs, batches, weighted=True, train_in_backward=False,
      exchange=exchange)
  for name in initial:
    np.testing.assert_array_equal(final[name], initial[name])
  # Reference gradient: one SGD step with learning rate 1 is -gradient.
  batch = batches[0]
  want = {}
  for f, cfg in configs.items():
    t = cfg.table.name
    out = h.oracles.combine(initial[t], batch[f]["ids"], batch[f]["weights"],
                            cfg.table.combiner)
    d_out = 2.0 * (out - batch[f]["target"]) / h.GLOBAL_BATCH
    want[t] = want.get(t, 0) + h.oracles.combine_grad_dense(
        initial[t].shape[0], d_out, batch[f]["ids"], batch[f]["weights"],
        cfg.table.combiner)
  step_grads = grads[0]
  variables = lookup.trainable_variables
  assert variables[0] is lookup.update_trigger
  for name, table in lookup.tables.items():
    shards = [None] * n
    for replica in range(n):
      shards[replica] = np.zeros(table.shards[replica].shape)
    for replica in range(n):
      local = strategy.experimental_local_results(step_grads)[replica]
      # Gradients come back for [trigger] + shard variables in order.
      for var, grad in zip(variables[1:], local[1:]):
        if var is table.shards[replica] and grad is not None:
          np.add.at(shards[replica], grad.indices.numpy(), grad.values.numpy())
    got = tfde.sharding.unshard_table(shards, table.vocabulary_size)
    np.testing.assert_allclose(got, want[name], rtol=RTOL, atol=ATOL,
                               err_msg=f"table {name}")


def test_replica_without_ids_and_eager_mode():
  strategy = mirrored(4)
  configs = h.feature_configs("adam", variant=2)
  batches = [h.make_batch(s, weighted=True, seed=9, empty_replica=1,
                          num_replicas=4) for s in range(3)]
  initial, outputs, final, _, _ = sharded_run(strategy, configs, batches,
                                              weighted=True, use_function=False)
  want_outputs, want_tables = h.reference_run(configs, initial, batches)
  for f in h.FEATURES:
    np.testing.assert_allclose(outputs[f], want_outputs[f], rtol=RTOL, atol=ATOL)
  for name in want_tables:
    np.testing.assert_allclose(final[name], want_tables[name], rtol=RTOL,
                               atol=ATOL)


@pytest.mark.parametrize("backend", [tfde.ops.KERNELS, tfde.ops.REFERENCE])
def test_table_of_a_group_without_ids_this_step(backend):
  """Two tables travel together; one gets no ids in a step (a ragged feature
  whose samples are all empty): the other trains, it stays as it was."""
  if backend == tfde.ops.KERNELS and not tfde.ops.kernels_available():
    pytest.skip("op library unavailable")
  with tfde.ops.backend(backend):
    configs = {n: tfde.FeatureConfig(name=n, table=tfde.TableConfig(
        name="t" + n, vocabulary_size=10, embedding_dim=4, combiner="sum",
        optimizer=tfde.optimizers.SGD(learning_rate=0.1))) for n in ("a", "b")}
    lookup = h.sharded_lookup(configs)
    before = {n: lookup.tables["t" + n].shard(0).numpy().copy() for n in ("a", "b")}
    with tf.GradientTape() as tape:
      out = lookup({"a": tf.constant([[1, 2], [3, 1]], tf.int64),
                    "b": tf.ragged.constant([[], []], tf.int64)})
      loss = tf.reduce_sum(out["a"]) + tf.reduce_sum(out["b"])
    tape.gradient(loss, lookup.trainable_variables)
  np.testing.assert_array_equal(out["b"].numpy(), 0)
  want = before["a"].copy()
  for row, count in ((1, 2), (2, 1), (3, 1)):
    want[row] -= 0.1 * count
  np.testing.assert_allclose(lookup.tables["ta"].shard(0).numpy(), want, rtol=1e-6)
  np.testing.assert_array_equal(lookup.tables["tb"].shard(0).numpy(), before["b"])


@EXCHANGES
@pytest.mark.parametrize("variant", [0, 1])
def test_bytes_are_counted(strategy, exchange, variant):
  # Variant 1 makes table C (a width of its own) an unweighted sum.
  n = strategy.num_replicas_in_sync
  configs = h.feature_configs("sgd", variant)
  combiners_of_width = {}
  for f, (table, _) in h.FEATURES.items():
    combiners_of_width.setdefault(h.TABLES[table][1], set()).add(configs[f].table.combiner)
  with strategy.scope():
    lookup = h.sharded_lookup(configs, exchange=exchange)
  lookup.comm.reset_bytes_sent()
  batch = h.make_batch(0, weighted=False, num_replicas=n)
  per = [h.replica_inputs(batch, r, n) for r in range(n)]
  step = make_step(strategy, lookup, weighted=False)
  step(distribute(strategy, [p[0] for p in per]), None,
       distribute(strategy, [p[2] for p in per]))
  sent = lookup.comm.bytes_sent()
  want = 0
  per_sample = h.GLOBAL_BATCH // n
  for replica in range(n):
    rows = slice(replica * per_sample, (replica + 1) * per_sample)
    if exchange == "rows":
      # Each replica sends every distinct (table, id) of its slice owned
      # by another replica once: its id out (8 bytes), the row back and
      # the gradient out (4 * width bytes each).
      distinct = {(table, i) for f, (table, _) in h.FEATURES.items()
                  for sample in batch[f]["ids"][rows] for i in sample}
      for table, i in distinct:
        if i % n != replica:
          want += 8 + 2 * 4 * h.TABLES[table][1]
      continue
    # Pooled: every id of its slice owned by another replica, as often as
    # it occurs, with its sample (8 bytes) and its coefficient (4), but
    # none in a group of tables of one width that are all unweighted sums
    # (one process: each owner knows they are ones); then, per feature,
    # the owner's partial sums of each other replica's samples back, and
    # this replica's output gradient to each other owner (4 * width bytes
    # a sample each).
    for f, (table, _) in h.FEATURES.items():
      ones = combiners_of_width[h.TABLES[table][1]] == {"sum"}
      for sample in batch[f]["ids"][rows]:
        want += sum(8 if ones else 12 for i in sample if i % n != replica)
      want += 2 * (n - 1) * per_sample * 4 * h.TABLES[table][1]
  assert sent == want
  assert (sent > 0) == (n > 1)


# ------------------------------------------------------------ bad input


@pytest.fixture()
def small_lookup():
  configs = h.feature_configs("adam")
  return h.sharded_lookup(configs)


def _good_inputs():
  inputs, weights, _ = h.replica_inputs(h.make_batch(0, True), 0, 1)
  return inputs, weights


def _tables_unchanged(lookup, before):
  for name, table in lookup.tables.items():
    np.testing.assert_array_equal(table.full_table(), before[name])
    for slots in table.slots.values():
      for slot in slots.values():
        assert not np.any(slot.numpy()), f"slot of {name} moved"


def _train_once(lookup, inputs, weights=None):
  with tf.GradientTape() as tape:
    out = lookup(inputs, weights)
    loss = tf.add_n([tf.reduce_sum(o) for o in out.values()])
  tape.gradient(loss, lookup.trainable_variables)


@pytest.mark.parametrize("bad_id", [37, -1, 10**12])
@pytest.mark.parametrize("in_function", [False, True])
def test_out_of_range_id_names_feature_and_table(small_lookup, bad_id,
                                                  in_function):
  inputs, weights = _good_inputs()
  before = small_lookup.table_values()
  ids = inputs["a_dense"].numpy()
  ids[2, 1] = bad_id
  inputs["a_dense"] = tf.constant(ids)
  train = tf.function(_train_once) if in_function else _train_once
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=rf"feature a_dense \(table A\): id {bad_id} at "
                           r"position 7 is out of range \[0, 37\)"):
    train(small_lookup, inputs, weights)
  _tables_unchanged(small_lookup, before)


def test_missing_feature_is_named(small_lookup):
  inputs, _ = _good_inputs()
  del inputs["b_sparse"]
  with pytest.raises(ValueError, match=r"feature b_sparse \(table B\) is missing"):
    small_lookup(inputs)


def test_unknown_feature_is_named(small_lookup):
  inputs, _ = _good_inputs()
  inputs["nope"] = tf.constant([1, 2])
  with pytest.raises(ValueError, match=r"\['nope'\] are not in the configuration"):
    small_lookup(inputs)


def test_mismatched_weights_are_named(small_lookup):
  inputs, weights = _good_inputs()
  before = small_lookup.table_values()
  weights["a_dense"] = tf.ones([16, 2])
  with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                     match=r"feature a_dense \(table A\): weights have shape"):
    _train_once(small_lookup, inputs, weights)
  inputs, weights = _good_inputs()
  weights["a_ragged"] = tf.ragged.constant([[1.0]] * 16)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"feature a_ragged \(table A\): weights do not"):
    _train_once(small_lookup, inputs, weights)
  inputs, weights = _good_inputs()
  weights["b_sparse"] = tf.SparseTensor([[0, 0]], [1.0], [16, 4])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"feature b_sparse \(table B\): weights do not"):
    _train_once(small_lookup, inputs, weights)
  _tables_unchanged(small_lookup, before)


@pytest.mark.parametrize("bad", [
    tf.constant([[1.0, 2.0, 3.0]] * 16),
    tf.constant([[[1, 2, 3]]] * 16),
])
def test_wrong_dtype_or_rank_is_named(small_lookup, bad):
  inputs, _ = _good_inputs()
  inputs["a_dense"] = bad
  with pytest.raises((TypeError, ValueError), match=r"feature a_dense \(table A\)"):
    small_lookup(inputs)


def test_calling_under_another_replica_count_is_an_error():
  with mirrored(2).scope():
    lookup = h.sharded_lookup(h.feature_configs("sgd"))
  inputs, _ = _good_inputs()
  with pytest.raises(RuntimeError, match="built for 2 replicas"):
    lookup(inputs)


def test_explicit_path_apply_gradients_equals_reference(strategy):
  """SOK style: IndexedSlices on the local shards, then a tfde sparse
  optimizer's apply_gradients, equals the numpy reference."""
  n = strategy.num_replicas_in_sync
  configs = h.feature_configs("adam", variant=1)
  batches = [h.make_batch(s, weighted=True, seed=3, num_replicas=n)
             for s in range(3)]
  with strategy.scope():
    lookup = h.sharded_lookup(configs, train_in_backward=False)
  assert_explicit_training_equals_reference(strategy, lookup, configs, batches, "adam")


def assert_explicit_training_equals_reference(strategy, lookup, configs, batches, kind):
  """Trains `lookup` (train_in_backward=False) on `batches` by applying
  each replica's IndexedSlices for its tables' local variables with a tfde
  sparse optimizer of `kind`; its tables equal the numpy reference."""
  n = strategy.num_replicas_in_sync
  _, want = h.reference_run(configs, lookup.table_values(), batches)
  optimizer = h.sparse_optimizer(kind)

  @tf.function
  def step(inputs, weights, targets):
    def replica_step(inputs, weights, targets):
      variables = [v for name in sorted(lookup.tables)
                   for v in lookup.tables[name].local_variables()]
      with tf.GradientTape() as tape:
        loss = h.replica_loss(lookup(inputs, weights), targets)
      grads = tape.gradient(loss, variables)
      optimizer.apply_gradients(zip(grads, variables))
    strategy.run(replica_step, args=(inputs, weights, targets))

  for batch in batches:
    per = [h.replica_inputs(batch, r, n) for r in range(n)]
    step(*[distribute(strategy, [p[i] for p in per]) for i in range(3)])
  for name, table in lookup.tables.items():
    np.testing.assert_allclose(table.full_table(), want[name], rtol=RTOL,
                               atol=ATOL, err_msg=f"table {name}")
    # Every replica's step, a holder's or not (Adam's bias correction and
    # the exchanges' stamps read it), and every column slice's.
    for part in getattr(table, "slices", [table]):
      assert {int(s.numpy()) for s in part.steps.values()} == {len(batches)}, part.name


def test_apply_gradients_rejects_foreign_variables_and_kinds():
  configs = h.feature_configs("adam")
  lookup = h.sharded_lookup(configs)
  shard = lookup.tables["A"].local_variables()[0]
  grad = tf.IndexedSlices(tf.ones([1, 4]), tf.constant([0]), tf.constant([19, 4]))
  with pytest.raises(ValueError, match="not a tfde table shard"):
    tfde.optimizers.Adam().apply_gradients([(grad, tf.Variable(tf.zeros([3, 4])))])
  with pytest.raises(ValueError, match="keeps slots for 'adam', not 'sgd'"):
    tfde.optimizers.SGD().apply_gradients([(grad, shard)])
  before = shard.numpy().copy()
  with pytest.raises(ValueError, match="must be a tf.IndexedSlices"):
    tfde.optimizers.Adam().apply_gradients([(tf.ones([19, 4]), shard)])
  np.testing.assert_array_equal(shard.numpy(), before)


@pytest.mark.parametrize("kind", ["adagrad", "ftrl"])
def test_replicated_and_sharded_tables_together(strategy, kind):
  """placement="default_device" keeps table B whole on every replica; its
  gradients are summed over replicas. All tables equal the reference and
  every copy of B is identical."""
  n = strategy.num_replicas_in_sync
  configs = h.feature_configs(kind, variant=2, placements={"B": "default_device"})
  batches = [h.make_batch(s, weighted=True, seed=4, num_replicas=n)
             for s in range(4)]
  initial, outputs, final, _, lookup = sharded_run(strategy, configs, batches,
                                                   weighted=True)
  table_b = lookup.tables["B"]
  assert table_b.replicated and not lookup.tables["A"].replicated
  assert all(s.shape == (50, 4) for s in table_b.shards.values())
  want_outputs, want_tables = h.reference_run(configs, initial, batches)
  for f in h.FEATURES:
    np.testing.assert_allclose(outputs[f], want_outputs[f], rtol=RTOL, atol=ATOL)
  for name in want_tables:
    np.testing.assert_allclose(final[name], want_tables[name], rtol=RTOL,
                               atol=ATOL, err_msg=f"table {name}")
  copies = [s.numpy() for s in table_b.shards.values()]
  for copy in copies[1:]:
    np.testing.assert_array_equal(copy, copies[0])


def test_table_stacking_choices():
  configs = h.feature_configs("sgd")
  for stacking, groups in [("auto", [["C"], ["A", "B"]]),
                           (None, [["A"], ["B"], ["C"]]),
                           ([["B"], ["A"]], [["B"], ["A"], ["C"]])]:
    lookup = h.sharded_lookup(configs, table_stacking=stacking)
    got = [[t.name for t in g.tables] for g in lookup._groups]  # pylint: disable=protected-access
    assert sorted(got) == sorted(groups), (stacking, got)
  with pytest.raises(ValueError, match="mixes widths"):
    h.sharded_lookup(configs, table_stacking=[["A", "C"]])
  with pytest.raises(ValueError, match="unknown tables"):
    h.sharded_lookup(configs, table_stacking=[["Z"]])


def test_a_one_replica_strategy_keeps_its_tables_on_its_device():
  """A strategy of one replica on another device than the default (here
  /cpu:1; on a GPU machine, /cpu:0 under a GPU default) holds the tables
  there, and trains them as the reference does."""
  strategy = tf.distribute.MirroredStrategy(["/cpu:1"])
  configs = h.feature_configs("adagrad", variant=2)
  batches = [h.make_batch(s, weighted=True, seed=3) for s in range(3)]
  initial, outputs, final, _, lookup = sharded_run(strategy, configs, batches, True)
  for name, table in lookup.tables.items():
    assert table.shards[0].device.endswith("CPU:1"), (name, table.shards[0].device)
    assert table.steps[0].device.endswith("CPU:1"), (name, table.steps[0].device)
  want_outputs, want_tables = h.reference_run(configs, initial, batches)
  for f in h.FEATURES:
    np.testing.assert_allclose(outputs[f], want_outputs[f], rtol=RTOL, atol=ATOL)
  for name in want_tables:
    np.testing.assert_allclose(final[name], want_tables[name], rtol=RTOL, atol=ATOL)


def test_an_update_with_another_kind_of_optimizer_changes_nothing():
  """A table keeps the slots of its own optimizer's kind: an update asking
  for another kind is refused by name before its step advances."""
  table = tfde.tables.ShardedTable(tfde.TableConfig(
      name="t", vocabulary_size=6, embedding_dim=2, optimizer="adagrad"))
  before = table.full_table()
  with pytest.raises(ValueError, match="table 't' keeps slots for 'adagrad', not "
                                       "'rowwise_adagrad'"):
    table.apply_gradient(0, tf.constant([1], tf.int64), tf.ones([1, 2]),
                         optimizer=tfde.optimizers.RowwiseAdagrad())
  assert table.step_value() == 0
  np.testing.assert_array_equal(table.full_table(), before)


def test_rowwise_adagrad_refuses_zero_epsilon_and_accumulator():
  """With both 0, a row whose first gradient is 0 would step by 0 / 0."""
  with pytest.raises(ValueError, match="epsilon and initial_accumulator_value are both 0"):
    tfde.optimizers.RowwiseAdagrad(epsilon=0.0)
  assert tfde.optimizers.RowwiseAdagrad(epsilon=0.0,
                                        initial_accumulator_value=0.1).hyper["epsilon"] == 0
  config = tfde.optimizers.RowwiseAdagrad(learning_rate=0.2).get_config()
  assert tfde.optimizers.SparseOptimizer.from_config(config) == \
      tfde.optimizers.RowwiseAdagrad(learning_rate=0.2)
