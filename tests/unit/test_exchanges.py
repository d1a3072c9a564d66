"""The exchanges are types: the policy gives each group the exchange its
configuration asks for, every step value has only required fields, and a
new exchange plugs in with one module and one line (a test-only one here,
checked against numpy)."""

import dataclasses
import importlib
import pkgutil

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import oracles
from tests.support import stock_exchange
from tfde import groups
from tfde.pipeline import exchanges
from tfde.pipeline.exchanges import base


def _group(num_replicas, replicated=False, **table_args):
  config = tfde.TableConfig(name="t", embedding_dim=4, **{"vocabulary_size": 64, **table_args})
  table = tfde.tables.make_table(config, auto_replicate_bytes=2**20 if replicated else 0)
  group, = groups.make_groups({"t": table}, "auto", num_replicas)
  return group, config


@pytest.mark.parametrize("num_replicas, table_args, feature_args, exchange, expected", [
    (1, {}, {}, "auto", "OneOwner"),
    (1, {"max_norm": 1.0}, {}, "auto", "RenormalizedRows"),
    (1, {"dtype": "bfloat16"}, {}, "auto", "DedupedRows"),
    (2, {}, {}, "auto", "PartialSums"),
    (2, {}, {}, "rows", "DedupedRows"),
    (2, {}, {"input_shape": (32, 1)}, "auto", "DedupedRows"),     # one-hot: rows pay
    (2, {}, {"output": "ragged"}, "auto", "DedupedRows"),
    (2, {"max_norm": 1.0}, {}, "auto", "RenormalizedRows"),
    (2, {"dtype": "bfloat16"}, {}, "auto", "DedupedRows"),
    (2, {"vocabulary_size": None}, {}, "auto", "DedupedRows"),          # dynamic
    (2, {"replicated": True}, {}, "auto", "Replicated"),
])
def test_the_policy_gives_each_group_the_exchange_its_configuration_asks(
    num_replicas, table_args, feature_args, exchange, expected):
  group, config = _group(num_replicas, **table_args)
  feature = tfde.FeatureConfig(name="f", table=config, **feature_args)
  chosen = exchanges.choose(group, exchanges.Choice([feature], num_replicas, exchange))
  assert type(chosen).__name__ == expected


@pytest.mark.parametrize("table_args, expected", [
    ({}, "OneOwner"), ({"max_norm": 2.0}, "RenormalizedRows"),
    ({"dtype": "bfloat16"}, "DedupedRows")])
def test_a_replicated_groups_copy_reads_as_at_one_replica(table_args, expected):
  group, config = _group(2, replicated=True, **table_args)
  choice = exchanges.Choice([tfde.FeatureConfig(name="f", table=config)], 2)
  chosen = exchanges.choose(group, choice)
  assert type(chosen.local).__name__ == expected
  # Its copies must all apply the same update: one owner alone never takes it.
  assert not exchanges.OneOwner.takes(group, choice)


def test_one_table_with_a_max_norm_renormalises_its_whole_group():
  tables = {name: tfde.tables.make_table(
      tfde.TableConfig(name=name, vocabulary_size=16, embedding_dim=4, max_norm=norm),
      auto_replicate_bytes=0) for name, norm in (("a", None), ("b", 1.0))}
  group, = groups.make_groups(tables, "auto", 2)
  features = [tfde.FeatureConfig(name=n, table=t.config) for n, t in tables.items()]
  assert type(exchanges.choose(group, exchanges.Choice(features, 2))).__name__ == (
      "RenormalizedRows")


def test_a_bad_choice_is_refused_by_name():
  with pytest.raises(ValueError, match="exchange must be 'auto' or 'rows', got 'dense'"):
    exchanges.Choice([], 1, "dense")
  with pytest.raises(ValueError, match="num_replicas must be a positive int, got 0"):
    exchanges.Choice([], 0)


def test_every_step_value_has_only_required_fields():
  steps = []
  for module in pkgutil.iter_modules(exchanges.__path__):
    found = importlib.import_module(f"{exchanges.__name__}.{module.name}")
    steps += [v for n, v in vars(found).items()
              if n.endswith("Step") and dataclasses.is_dataclass(v)]
  assert len(steps) >= 5
  optional = [(s.__name__, f.name) for s in steps for f in dataclasses.fields(s)
              if f.default is not dataclasses.MISSING or
              f.default_factory is not dataclasses.MISSING]
  assert not optional
  assert all(issubclass(s, base.Step) and s.__dataclass_params__.frozen for s in steps)


def test_a_new_exchange_plugs_in_with_one_line_and_trains_as_numpy_says(monkeypatch):
  monkeypatch.setattr(exchanges, "EXCHANGES", [stock_exchange.StockOneOwner] + exchanges.EXCHANGES)
  monkeypatch.setattr(stock_exchange.StockOneOwner, "forwards", 0)
  lr, vocab, dim = 0.1, 10, 3
  config = tfde.TableConfig(name="t", vocabulary_size=vocab, embedding_dim=dim,
                            combiner="mean", initializer="uniform",
                            optimizer=tfde.optimizers.SGD(learning_rate=lr))
  other = tfde.TableConfig(name="u", vocabulary_size=5, embedding_dim=2, combiner="sqrtn",
                           optimizer=tfde.optimizers.SGD(learning_rate=lr))
  lookup = tfde.lookup.ShardedLookup({
      "a": tfde.FeatureConfig(name="a", table=config),
      "b": tfde.FeatureConfig(name="b", table=config),
      "c": tfde.FeatureConfig(name="c", table=other)})
  a_ids = [[1, 2, 2], [], [9]]
  b_ids = [[3, 1], [0, 0]]
  c_ids = [[4], [0, 1]]
  rng = np.random.default_rng(0)
  targets = {"a": rng.normal(size=(3, dim)), "b": rng.normal(size=(2, dim)),
             "c": rng.normal(size=(2, 2))}
  expected = {n: np.array(v, np.float64) for n, v in lookup.table_values().items()}
  for _ in range(3):
    with tf.GradientTape() as tape:
      out = lookup({"a": tf.ragged.constant(a_ids, tf.int64), "b": tf.constant(b_ids),
                    "c": tf.ragged.constant(c_ids, tf.int64)})
      loss = tf.add_n([tf.reduce_sum(out[n] * targets[n].astype(np.float32)) for n in out])
    tape.gradient(loss, lookup.trainable_variables)
    np.testing.assert_allclose(out["a"], oracles.combine(expected["t"], a_ids, combiner="mean"),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["b"], oracles.combine(expected["t"], b_ids, combiner="mean"),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["c"], oracles.combine(expected["u"], c_ids, combiner="sqrtn"),
                               rtol=1e-5, atol=1e-6)
    expected["t"] -= lr * (
        oracles.combine_grad_dense(vocab, targets["a"], a_ids, combiner="mean") +
        oracles.combine_grad_dense(vocab, targets["b"], b_ids, combiner="mean"))
    expected["u"] -= lr * oracles.combine_grad_dense(5, targets["c"], c_ids, combiner="sqrtn")
    for name, values in lookup.table_values().items():
      np.testing.assert_allclose(values, expected[name], rtol=1e-5, atol=1e-6)
  # Both groups (one per width), each of three steps.
  assert stock_exchange.StockOneOwner.forwards == 6


def test_a_new_exchange_gives_gradient_slices_as_numpy_says(monkeypatch):
  """The same exchange under the other update (train_in_backward=False):
  IndexedSlices of the shard variable, nothing applied."""
  monkeypatch.setattr(exchanges, "EXCHANGES", [stock_exchange.StockOneOwner] + exchanges.EXCHANGES)
  vocab, dim = 12, 2
  config = tfde.TableConfig(name="t", vocabulary_size=vocab, embedding_dim=dim,
                            combiner="sum", initializer="uniform")
  lookup = tfde.lookup.ShardedLookup({"a": tfde.FeatureConfig(name="a", table=config)},
                                     train_in_backward=False)
  ids = [[3, 3, 11], [0], []]
  before = lookup.table_values()["t"]
  target = np.random.default_rng(1).normal(size=(3, dim)).astype(np.float32)
  with tf.GradientTape() as tape:
    out = lookup({"a": tf.ragged.constant(ids, tf.int64)})
    loss = tf.reduce_sum(out["a"] * target)
  grads = tape.gradient(loss, lookup.trainable_variables)
  np.testing.assert_allclose(out["a"], oracles.combine(before, ids), rtol=1e-5, atol=1e-6)
  shard_grad, = [g for g in grads[1:] if g is not None]
  assert isinstance(shard_grad, tf.IndexedSlices)
  np.testing.assert_allclose(tf.convert_to_tensor(shard_grad),
                             oracles.combine_grad_dense(vocab, target, ids), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(lookup.table_values()["t"], before)


def test_the_old_name_of_the_batch_helpers_still_imports_and_warns():
  import sys  # pylint: disable=g-import-not-at-top

  from tfde.pipeline import batches  # pylint: disable=g-import-not-at-top
  sys.modules.pop("tfde.group_step", None)
  with pytest.warns(DeprecationWarning, match="use tfde.pipeline.batches"):
    import tfde.group_step as old  # pylint: disable=g-import-not-at-top
  assert old.as_one_batch is batches.as_one_batch
