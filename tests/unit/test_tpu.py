"""TPU portability: configs both ways, the optimizer mapping's numbers,
the same lookups as TensorFlow's TPUEmbeddingForServing, and TPU
checkpoints both ways (mid-level API and a synthetic SparseCore layout)."""

import collections
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import oracles
from tests.support import sharded_harness as h
from tests.unit.test_sharded import mirrored
from tfde import comm as comm_lib

E = tf.tpu.experimental.embedding

OPTIMIZERS = {
    "sgd": tfde.optimizers.SGD(learning_rate=0.3),
    "adagrad": tfde.optimizers.Adagrad(learning_rate=0.3,
                                       initial_accumulator_value=0.2,
                                       epsilon=0.05),
    "adam": tfde.optimizers.Adam(learning_rate=0.05, beta_1=0.8, beta_2=0.95,
                                 epsilon=1e-3),
    "ftrl": tfde.optimizers.Ftrl(learning_rate=0.2, l1_regularization_strength=0.001,
                                 l2_regularization_strength=0.01, beta=0.1),
}


def _tables(combiners=("sum", "mean", "sqrtn")):
  kinds = list(OPTIMIZERS)
  return [tfde.TableConfig(name=f"t_{i}", vocabulary_size=11 + i, embedding_dim=3 + i % 2,
                           optimizer=OPTIMIZERS[kinds[i % len(kinds)]],
                           combiner=combiner, seed=i)
          for i, combiner in enumerate(combiners)]


# ---- configs


def test_tfde_configs_round_trip_through_tpu():
  tables = _tables(("sum", "mean", "sqrtn", "sum"))
  features = {"a": tfde.FeatureConfig(name="a", table=tables[0], output_shape=(8, 3)),
              "b": [tfde.FeatureConfig(name="b", table=tables[1]),
                    tfde.FeatureConfig(name="c", table=tables[1])],
              "d": (tfde.FeatureConfig(name="d", table=tables[2]),
                    tfde.FeatureConfig(name="e", table=tables[3]))}
  tpu = tfde.tpu.to_tpu_feature_configs(features, iterations=tf.Variable(0))
  assert tpu["b"][0].table is tpu["b"][1].table          # shared stays shared
  assert list(tpu["a"].output_shape) == [8]               # TPU omits the width
  back = tfde.tpu.from_tpu_feature_configs(tpu)
  assert back["b"][0].table is back["b"][1].table
  for f, g in zip(tf.nest.flatten(features), tf.nest.flatten(back)):
    assert f == g, f.name


def test_tpu_configs_round_trip_through_tfde():
  optimizers = [E.SGD(0.1), E.Adagrad(0.2, initial_accumulator_value=0.3),
                E.Adam(0.01, beta_1=0.7, beta_2=0.9, epsilon=1e-4,
                       sum_inside_sqrt=False),
                E.FTRL(0.1, learning_rate_power=-0.6, l1_regularization_strength=0.01,
                       l2_regularization_strength=0.02, beta=0.3,
                       initial_accumulator_value=0.4)]
  features = [E.FeatureConfig(table=E.TableConfig(vocabulary_size=5 + i, dim=2 + i,
                                                  optimizer=opt, combiner=c,
                                                  name=f"t{i}"),
                              name=f"f{i}", output_shape=[4])
              for i, (opt, c) in enumerate(zip(optimizers, ["sum", "mean", "sqrtn", "sum"]))]
  back = tfde.tpu.to_tpu_feature_configs(tfde.tpu.from_tpu_feature_configs(features))
  for f, g in zip(features, back):
    assert (g.name, list(g.output_shape), g.max_sequence_length) == (
        f.name, list(f.output_shape), f.max_sequence_length)
    t, u = f.table, g.table
    assert (u.name, u.vocabulary_size, u.dim, u.combiner) == (
        t.name, t.vocabulary_size, t.dim, t.combiner)
    assert type(u.optimizer) is type(t.optimizer)
    for key, value in vars(t.optimizer).items():
      if key not in ("slot_variable_creation_fn", "_tfde_optimizer"):
        assert vars(u.optimizer)[key] == pytest.approx(value), (t.name, key)


def test_sequence_feature_converts_both_ways():
  if "max_sequence_length" not in tfde.FeatureConfig.__dataclass_fields__:
    pytest.skip("this tfde has no sequence features")
  table = tfde.TableConfig(name="t", vocabulary_size=10, embedding_dim=4)
  feature = tfde.FeatureConfig(name="s", table=table, max_sequence_length=5)
  tpu = tfde.tpu.to_tpu_feature_configs([feature])[0]
  assert tpu.max_sequence_length == 5
  assert tfde.tpu.from_tpu_feature_configs([tpu])[0] == feature
  pooled = tfde.tpu.to_tpu_feature_configs(
      [tfde.FeatureConfig(name="p", table=table)])[0]
  assert pooled.max_sequence_length == 0
  assert tfde.tpu.from_tpu_feature_configs([pooled])[0].max_sequence_length is None


@pytest.mark.parametrize("make, option", [
    (lambda: E.Adam(0.1), "sum_inside_sqrt"),
    (lambda: E.Adam(0.1, sum_inside_sqrt=False, lazy_adam=False), "lazy_adam"),
    (lambda: E.SGD(0.1, clip_weight_min=-1.0), "clip_weight_min"),
    (lambda: E.Adagrad(0.1, weight_decay_factor=0.1), "weight_decay_factor"),
    (lambda: E.FTRL(0.1, multiply_linear_by_learning_rate=True),
     "multiply_linear_by_learning_rate"),
    (lambda: E.SGD(lambda: 0.1), "learning_rate"),
])
def test_tpu_options_tfde_cannot_keep_are_named(make, option):
  table = E.TableConfig(vocabulary_size=4, dim=2, optimizer=make(), name="tt")
  with pytest.raises(ValueError, match=f"table 'tt'.*{option}"):
    tfde.layers.DistributedEmbedding({"f": E.FeatureConfig(table=table, name="f")})


def test_tfde_options_tpu_cannot_keep_are_named():
  shrink = tfde.TableConfig(name="s", vocabulary_size=4, embedding_dim=2,
                            optimizer=tfde.optimizers.Ftrl(
                                l2_shrinkage_regularization_strength=0.1))
  with pytest.raises(ValueError, match="table 's'.*l2_shrinkage"):
    tfde.tpu.to_tpu_feature_configs([tfde.FeatureConfig(name="f", table=shrink)])
  adam = tfde.TableConfig(name="a", vocabulary_size=4, embedding_dim=2,
                          optimizer="adam")
  with pytest.raises(ValueError, match="table 'a'.*iterations="):
    tfde.tpu.to_tpu_feature_configs([tfde.FeatureConfig(name="f", table=adam)])


class FeatureConfig:  # a stranger with a familiar name
  name = "x"


def test_unknown_config_names_its_module_and_class():
  with pytest.raises(ValueError, match=r"tests\.unit\.test_tpu\.FeatureConfig"):
    tfde.layers.DistributedEmbedding({"x": FeatureConfig()})
  with pytest.raises(ValueError, match=r"builtins\.str"):
    tfde.lookup.ShardedLookup(["not a config"])


def test_tpu_configs_drive_the_layer_and_lookup_in_any_structure():
  shared = E.TableConfig(vocabulary_size=20, dim=4, combiner="sum",
                         optimizer=E.SGD(0.1), name="shared")
  configs = {"x": E.FeatureConfig(table=shared, name="x"),
             "nested": [E.FeatureConfig(table=shared, name="y"),
                        tfde.FeatureConfig(name="z", table=tfde.TableConfig(
                            name="own", vocabulary_size=7, embedding_dim=2))]}
  layer = tfde.layers.DistributedEmbedding(configs)
  assert sorted(layer.tables) == ["own", "shared"]
  out = layer({"x": tf.constant([[1, 2]]), "nested": [tf.constant([[3]]),
                                                      tf.constant([[4]])]})
  values = layer.get_embedding_tables()
  np.testing.assert_allclose(out["x"][0], values["shared"][1] + values["shared"][2],
                             rtol=1e-6)
  lookup = tfde.lookup.ShardedLookup(configs)
  assert sorted(lookup.feature_configs) == ["x", "y", "z"]


def test_keras_rs_configs_when_installed():
  keras_rs = pytest.importorskip("keras_rs")
  table = keras_rs.layers.TableConfig(name="movie", vocabulary_size=30,
                                      embedding_dim=4, optimizer="adagrad",
                                      combiner="sum", max_ids_per_partition=64)
  features = {"m": keras_rs.layers.FeatureConfig(name="m", table=table,
                                                 input_shape=(2, 3),
                                                 output_shape=(2, 4))}
  layer = tfde.layers.DistributedEmbedding(features)
  config = layer.tables["movie"].config
  assert (config.combiner, config.optimizer_config()["kind"], config.max_ids_per_partition) == (
      "sum", "adagrad", 64)
  assert layer({"m": tf.constant([[1, 2, 3], [4, 5, 6]])})["m"].shape == (2, 4)


# ---- the optimizer mapping, in numbers


def _tpu_row_update(tpu, step, w, slots, g):
  """One row of TPU embedding's update (optimization_parameters.proto), with
  the TPU optimizer's own fields; `step` is 0-based (what `iterations`
  holds while the update runs)."""
  lr = float(tpu.learning_rate()) if callable(tpu.learning_rate) else tpu.learning_rate
  if isinstance(tpu, E.Adagrad):
    acc = slots[0] + g * g
    return w - lr * g / np.sqrt(acc), [acc]
  if isinstance(tpu, E.Adam):
    m = tpu.beta_1 * slots[0] + (1 - tpu.beta_1) * g
    v = tpu.beta_2 * slots[1] + (1 - tpu.beta_2) * g * g
    denominator = (np.sqrt(v + tpu.epsilon ** 2) if tpu.sum_inside_sqrt
                   else np.sqrt(v) + tpu.epsilon)
    return w - lr * m / denominator, [m, v]
  if isinstance(tpu, E.FTRL):
    p = -tpu.learning_rate_power
    acc, linear = slots
    new_acc = acc + g * g
    linear = linear + g - (new_acc ** p - acc ** p) / lr * w
    quadratic = (tpu.beta + new_acc ** p) / lr + 2 * tpu.l2_regularization_strength
    l1 = tpu.l1_regularization_strength
    return np.where(np.abs(linear) > l1, (np.sign(linear) * l1 - linear) / quadratic,
                    0.0), [new_acc, linear]
  return w - lr * g, []


def _tpu_initial_slots(tpu, dim):
  if isinstance(tpu, E.Adam):
    return [np.zeros(dim), np.zeros(dim)]
  if isinstance(tpu, E.Adagrad):
    return [np.full(dim, tpu.initial_accumulator_value)]
  if isinstance(tpu, E.FTRL):
    return [np.full(dim, tpu.initial_accumulator_value), np.zeros(dim)]
  return []


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_tpu_mapping_makes_the_keras_update(kind):
  """Six steps of the TPU rule with the converted optimizer equal Keras's
  rule with tfde's, and tfde's table trained the same steps."""
  opt = OPTIMIZERS[kind]
  iterations = tf.Variable(0, dtype=tf.int64)
  tpu = tfde.tpu.to_tpu_optimizer(opt, "t", iterations=iterations)
  rng = np.random.default_rng(3)
  w0 = rng.normal(size=4)
  grads = [rng.normal(size=4) for _ in range(6)]
  hp = {"learning_rate": 0.3 if kind != "adam" else 0.05}
  hp.update({k: v for k, v in opt.hyper.items()})
  if kind == "ftrl":
    hp.update(l1=hp["l1_regularization_strength"], l2=hp["l2_regularization_strength"])
  hp["learning_rate"] = opt.learning_rate
  keras_w, keras_slots = w0.copy(), oracles.initial_slots(kind, hp, 4)
  tpu_w, tpu_slots = w0.copy(), _tpu_initial_slots(tpu, 4)
  table = tfde.tables.ShardedTable(tfde.TableConfig(
      name="t", vocabulary_size=2, embedding_dim=4, optimizer=opt,
      initializer=np.stack([w0, w0]).astype(np.float32)))
  for step, g in enumerate(grads):
    iterations.assign(step)
    keras_w, keras_slots = oracles.keras_row_update(kind, hp, step + 1, keras_w,
                                                    keras_slots, g)
    tpu_w, tpu_slots = _tpu_row_update(tpu, step, tpu_w, tpu_slots, g)
    np.testing.assert_allclose(tpu_w, keras_w, rtol=1e-5, atol=1e-7)
    table.apply_gradient(0, tf.constant([1]), tf.constant([g], tf.float32))
  np.testing.assert_allclose(table.full_table()[1], keras_w, rtol=2e-4, atol=1e-6)
  offsets = tfde.tpu.tpu_slot_offsets(opt)
  for name, tpu_slot in zip(opt.slot_names, tpu_slots):
    np.testing.assert_allclose(tpu_slot - offsets.get(name, 0.0),
                               keras_slots[opt.slot_names.index(name)], rtol=1e-5)


def test_tpu_adam_without_bias_correction_trains_alike():
  tpu = E.Adam(0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-3, sum_inside_sqrt=False)
  opt = tfde.tpu.from_tpu_optimizer(tpu)
  rng = np.random.default_rng(4)
  w0 = rng.normal(size=3)
  table = tfde.tables.ShardedTable(tfde.TableConfig(
      name="t", vocabulary_size=1, embedding_dim=3, optimizer=opt,
      initializer=w0[None].astype(np.float32)))
  w, slots = w0.copy(), _tpu_initial_slots(tpu, 3)
  for step in range(5):
    g = rng.normal(size=3)
    w, slots = _tpu_row_update(tpu, step, w, slots, g)
    table.apply_gradient(0, tf.constant([0]), tf.constant([g], tf.float32))
  np.testing.assert_allclose(table.full_table()[0], w, rtol=2e-4, atol=1e-6)


# ---- the same answers as TPUEmbeddingForServing


def _ragged(rows):
  return tf.ragged.constant(rows, dtype=tf.int64)


def _sparse(rows):
  indices = [[b, j] for b, r in enumerate(rows) for j in range(len(r))]
  values = [x for r in rows for x in r]
  return tf.sparse.SparseTensor(indices, tf.constant(values, tf.int64),
                                [len(rows), max(len(r) for r in rows)])


def test_lookups_equal_tpu_embedding_for_serving(tmp_path):
  """Every combiner, ragged and sparse, with and without weights: tfde
  (restored from the TPU object's checkpoint) equals TPUEmbeddingForServing
  and the numpy oracle."""
  tpu_features, inputs, weights, rows = {}, {}, {}, {}
  rng = np.random.default_rng(5)
  for combiner in ("sum", "mean", "sqrtn"):
    table = E.TableConfig(vocabulary_size=17, dim=4, combiner=combiner,
                          optimizer=E.Adagrad(0.1), name=f"t_{combiner}")
    for form in ("ragged", "sparse"):
      for weighted in (False, True):
        name = f"{combiner}_{form}_{'w' if weighted else 'u'}"
        tpu_features[name] = E.FeatureConfig(table=table, name=name)
        ids = [list(rng.integers(0, 17, size=n)) for n in (3, 1, 2, 4)]
        rows[name] = ids
        inputs[name] = _ragged(ids) if form == "ragged" else _sparse(ids)
        if weighted:
          w = [list(rng.uniform(0.5, 2.0, size=len(r)).astype(np.float32)) for r in ids]
          weights[name] = (tf.ragged.constant(w, dtype=tf.float32) if form == "ragged"
                           else tf.sparse.SparseTensor(inputs[name].indices,
                                                       tf.constant(np.concatenate(w)),
                                                       inputs[name].dense_shape))
  serving = E.TPUEmbeddingForServing(tpu_features, optimizer=None)
  serving.build()
  path = tf.train.Checkpoint(embedding=serving).write(str(tmp_path / "tpu"))
  expected = serving(inputs, weights={k: weights.get(k) for k in tpu_features})

  layer = tfde.layers.DistributedEmbedding(tpu_features)
  tfde.tpu.restore_tpu_checkpoint(layer, path)
  got = layer(inputs, weights={k: weights.get(k) for k in tpu_features})
  tables = {t.name: serving.embedding_tables[t].numpy() for t in serving.embedding_tables}
  for name, table in layer.tables.items():
    state = table.state()
    np.testing.assert_array_equal(state["table"].numpy(), tables[name])
    # TPU Adagrad comes back as tfde Adagrad(epsilon=0): the slot as is.
    np.testing.assert_array_equal(
        state["slot_accumulator"].numpy(),
        serving._variables[name]["accumulators"].numpy())  # pylint: disable=protected-access
  for name, feature in tpu_features.items():
    np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)
    w = None if name not in weights else [list(x) for x in weights[name].to_list()] \
        if isinstance(weights[name], tf.RaggedTensor) else \
        np.split(weights[name].values.numpy(),
                 np.cumsum([len(r) for r in rows[name]])[:-1])
    oracle = oracles.combine(tables[feature.table.name], rows[name], w,
                             feature.table.combiner)
    np.testing.assert_allclose(got[name], oracle, rtol=1e-5, atol=1e-6, err_msg=name)


def test_sequence_lookups_equal_tpu_embedding_for_serving():
  table = E.TableConfig(vocabulary_size=12, dim=3, optimizer=E.SGD(0.1), name="t")
  features = {"s": E.FeatureConfig(table=table, name="s", max_sequence_length=3)}
  serving = E.TPUEmbeddingForServing(features, optimizer=None)
  serving.build()
  layer = tfde.layers.DistributedEmbedding(features)
  layer.tables["t"].load_state({"table": serving.embedding_tables[table].numpy(),
                                "step": np.int64(0)})
  for ids in (_ragged([[1, 2, 3, 4], [5], [6, 7]]), _sparse([[1, 2, 3, 4], [5], [6, 7]])):
    np.testing.assert_allclose(layer({"s": ids})["s"], serving({"s": ids})["s"],
                               rtol=1e-6)


def test_dense_two_dimensional_input_is_combined():
  """A dense [batch, hotness] input is one sample per row, combined (keras-rs
  and tfde); TPUEmbeddingForServing reads it as a sequence. The same ids as
  a ragged input give tfde's answer."""
  table = E.TableConfig(vocabulary_size=9, dim=2, combiner="sum",
                        optimizer=E.SGD(0.1), name="t")
  features = {"f": E.FeatureConfig(table=table, name="f")}
  serving = E.TPUEmbeddingForServing(features, optimizer=None)
  serving.build()
  layer = tfde.layers.DistributedEmbedding(features)
  values = serving.embedding_tables[table].numpy()
  layer.tables["t"].load_state({"table": values, "step": np.int64(0)})
  dense = tf.constant([[1, 2, 3], [4, 5, 6]], tf.int64)
  assert serving({"f": dense})["f"].shape == (2, 3, 2)       # a sequence
  got = layer({"f": dense})["f"]
  np.testing.assert_allclose(got, serving({"f": tf.RaggedTensor.from_tensor(dense)})["f"],
                             rtol=1e-6)


# ---- checkpoints both ways


def _trained_lookup(strategy, steps=3):
  configs = {f"f{i}": tfde.FeatureConfig(name=f"f{i}", table=t)
             for i, t in enumerate(_tables(("sum", "mean", "sqrtn", "sum")))}
  with strategy.scope():
    lookup = h.sharded_lookup(configs)
  rng = np.random.default_rng(6)
  for _ in range(steps):
    inputs = {name: _ragged([list(rng.integers(0, f.table.vocabulary_size, size=n))
                             for n in (2, 3)]) for name, f in configs.items()}
    with tf.GradientTape() as tape:
      out = lookup(inputs)
      loss = tf.add_n([tf.reduce_sum(o * o) for o in out.values()])
    tape.gradient(loss, lookup.trainable_variables)
  return lookup, configs


def test_written_checkpoint_restores_into_tpu_embedding(tmp_path):
  lookup, configs = _trained_lookup(tf.distribute.get_strategy())
  path = tfde.tpu.write_tpu_checkpoint(lookup, str(tmp_path / "ck"))
  tpu_features = tfde.tpu.to_tpu_feature_configs(configs, iterations=tf.Variable(0))
  serving = E.TPUEmbeddingForServing(tpu_features, optimizer=None)
  serving.build()
  tf.train.Checkpoint(embedding=serving).read(path).assert_consumed()
  for name, table in lookup.tables.items():
    state = {k: v.numpy() for k, v in table.state().items()}
    variables = serving._variables[name]  # pylint: disable=protected-access
    np.testing.assert_array_equal(variables["parameters"].numpy(), state["table"])
    offsets = tfde.tpu.tpu_slot_offsets(table.optimizer)
    for slot, tpu_slot in tfde.tpu.TPU_SLOT_NAMES[table.optimizer.kind].items():
      np.testing.assert_allclose(variables[tpu_slot].numpy(),
                                 state["slot_" + slot] + offsets.get(slot, 0.0),
                                 rtol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_tpu_checkpoint_restores_onto_any_replica_count(tmp_path, n):
  source, configs = _trained_lookup(tf.distribute.get_strategy())
  path = tfde.tpu.write_tpu_checkpoint(source, str(tmp_path / "ck"))
  with mirrored(n).scope():
    target = h.sharded_lookup(configs)
  tfde.tpu.restore_tpu_checkpoint(target, path, step=source.tables["t_0"].step_value())
  for name, table in source.tables.items():
    want = {k: v.numpy() for k, v in table.state().items()}
    got = {k: v.numpy() for k, v in target.tables[name].state().items()}
    np.testing.assert_array_equal(got["table"], want["table"])
    for key in want:
      np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=(name, key))


def test_tpu_checkpoint_offsets_slots_by_the_optimizer_the_table_trains_with(tmp_path):
  """Adagrad's TPU accumulator holds epsilon more than tfde's: the
  epsilon of the table's optimizer, changed after its config was made."""
  table = tfde.TableConfig(name="t", vocabulary_size=6, embedding_dim=2, optimizer="adagrad")
  configs = {"f": tfde.FeatureConfig(name="f", table=table)}
  source, target = h.sharded_lookup(configs), h.sharded_lookup(configs)
  for lookup in (source, target):
    lookup.tables["t"].optimizer.hyper["epsilon"] = 0.5
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(source({"f": _ragged([[1, 2], [4]])})["f"] ** 2)
  tape.gradient(loss, source.trainable_variables)
  path = tfde.tpu.write_tpu_checkpoint(source, str(tmp_path / "ck"))
  tfde.tpu.restore_tpu_checkpoint(target, path)
  want = source.tables["t"].state()["slot_accumulator"].numpy()
  assert np.ptp(want) > 0
  np.testing.assert_allclose(target.tables["t"].state()["slot_accumulator"], want,
                             rtol=1e-6)


def _sparsecore_checkpoint(path, tables, num_cores, slots):
  """A TPUEmbeddingV2-style checkpoint, written by hand: the tables stacked
  into one variable sharded over `num_cores` SparseCores (row `id` in shard
  `(id % S + rotation) % S` at `offset + id // S`), the layouts proto beside."""
  from tensorflow.core.tpu.kernels import sparse_core_layout_pb2
  dim = max(v.shape[1] for v in tables.values())
  padded_dim = -(-dim // 8) * 8
  per_shard = {n: -(-v.shape[0] // num_cores) for n, v in tables.items()}
  rows_per_core = sum(per_shard.values())
  layouts = sparse_core_layout_pb2.SparseCoreTableLayouts()
  arrays = {slot: np.full((num_cores * rows_per_core, padded_dim), -7.0, np.float32)
            for slot in [None] + slots}
  offset = 0
  for rotation, (name, value) in enumerate(tables.items()):
    layout = layouts.tables.add()
    layout.table_name = name
    layout.stacked_table_name = "stacked"
    layout.num_sparse_cores = num_cores
    layout.num_partitions = num_cores
    layout.total_rows_per_sparse_core_shard = rows_per_core
    layout.unsharded_shape.extend(value.shape)
    layout.unsharded_padded_shape.extend([per_shard[name] * num_cores, padded_dim])
    layout.sparse_core_shard_row_offset = offset
    layout.sparse_core_shard_rotation = rotation % num_cores
    for slot, array in arrays.items():
      content = value if slot is None else value * 10 + len(slot)
      for row in range(value.shape[0]):
        shard = (row % num_cores + layout.sparse_core_shard_rotation) % num_cores
        position = offset + row // num_cores
        array[shard * rows_per_core + position, :value.shape[1]] = content[row]
    offset += per_shard[name]
  module = tf.Module()
  embedding = tf.Module()
  embedding._track_trackable(tf.Variable(arrays[None]), "stacked")  # pylint: disable=protected-access
  for slot in slots:
    embedding._track_trackable(tf.Variable(arrays[slot]), f"stacked/{slot}")  # pylint: disable=protected-access
  embedding._track_trackable(  # pylint: disable=protected-access
      tf.Variable(layouts.SerializeToString()), tfde.tpu.SPARSECORE_LAYOUTS_KEY)
  module.embedding = embedding
  return tf.train.Checkpoint(model=module).write(path)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_sparsecore_layout_restores_onto_any_replica_count(tmp_path, n):
  rng = np.random.default_rng(7)
  values = {"a": rng.normal(size=(13, 4)).astype(np.float32),
            "b": rng.normal(size=(9, 4)).astype(np.float32)}
  path = _sparsecore_checkpoint(str(tmp_path / "sc"), values, num_cores=4,
                                slots=["momenta", "velocities"])
  adam = tfde.optimizers.Adam(learning_rate=0.01)
  configs = [tfde.FeatureConfig(name=f"f_{k}", table=tfde.TableConfig(
      name=k, vocabulary_size=v.shape[0], embedding_dim=4, optimizer=adam))
             for k, v in values.items()]
  with mirrored(n).scope():
    lookup = h.sharded_lookup(configs)
  tfde.tpu.restore_tpu_checkpoint(lookup, path)
  for name, value in values.items():
    state = {k: v.numpy() for k, v in lookup.tables[name].state().items()}
    np.testing.assert_array_equal(state["table"], value)
    np.testing.assert_array_equal(state["slot_m"], value * 10 + len("momenta"))
    np.testing.assert_array_equal(state["slot_v"], value * 10 + len("velocities"))


def test_mismatched_checkpoint_names_the_table_and_changes_nothing(tmp_path):
  lookup, configs = _trained_lookup(tf.distribute.get_strategy(), steps=1)
  path = tfde.tpu.write_tpu_checkpoint(lookup, str(tmp_path / "ck"))
  bigger = [tfde.FeatureConfig(name=name, table=tfde.TableConfig(
      **dict(f.table.get_config(), optimizer=f.table.optimizer,
             initializer=f.table.initializer,
             vocabulary_size=f.table.vocabulary_size + (name == "f2"))))
            for name, f in configs.items()]
  other = h.sharded_lookup(bigger)
  before = other.table_values()
  with pytest.raises(ValueError, match="table 't_2'.*shape"):
    tfde.tpu.restore_tpu_checkpoint(other, path)
  for name, value in other.table_values().items():
    np.testing.assert_array_equal(value, before[name])
  missing = h.sharded_lookup([tfde.FeatureConfig(name="z", table=tfde.TableConfig(
      name="absent", vocabulary_size=3, embedding_dim=2))])
  with pytest.raises(ValueError, match="table 'absent'"):
    tfde.tpu.restore_tpu_checkpoint(missing, path)
  sgd_only = h.sharded_lookup([tfde.FeatureConfig(name="z", table=tfde.TableConfig(
      **dict(configs["f0"].table.get_config(), optimizer="adagrad",
             initializer=None)))])
  with pytest.raises(ValueError, match="table 't_0'.*accumulators"):
    tfde.tpu.restore_tpu_checkpoint(sgd_only, path)


# ---- dispatch under TPUStrategy, against a stand-in of the TPU engine


class _Hardware:
  def __init__(self, kind):
    names = tf.tpu.experimental.HardwareFeature.EmbeddingFeature
    self.embedding_feature = names.V2 if kind == "sparsecore" else names.V1
    self.num_embedding_devices_per_chip = 4 if kind == "sparsecore" else 0


class _FakeTPUStrategy:
  num_replicas_in_sync = 2

  def __init__(self, kind):
    self.extended = type("Extended", (), {"tpu_hardware_feature": _Hardware(kind)})()


Preserved = collections.namedtuple("Preserved", ["row_pointers", "sample_count"])


class _StandInEngine:
  """Records what tfde gives TPU's engine; looks up with
  TPUEmbeddingForServing (the same TPU configs), so answers can be checked."""

  made = []

  def __init__(self, features, config):
    self.features, self.config = features, config
    self.serving = E.TPUEmbeddingForServing(features, optimizer=None)
    self.serving.build()
    self.calls, self.applied, self.learning_rates = [], [], []
    _StandInEngine.made.append(self)

  def __call__(self, inputs, weights):       # TPUEmbeddingV2
    self.calls.append((inputs, weights))
    # As TPUEmbeddingV2's: per table, a namedtuple of tensors and ints.
    preserved = {name: Preserved(tf.constant([0, 1]), 2) for name in inputs}
    return self.serving(inputs, weights), preserved

  def enqueue(self, inputs, weights, training):   # TPUEmbedding
    self.calls.append((inputs, weights))
    self._pending = self.serving(inputs, weights)

  def dequeue(self):
    return self._pending

  def apply_gradients(self, gradients, preserved_outputs=None):
    self.applied.append((gradients, preserved_outputs))
    for feature in tf.nest.flatten(self.features):
      rate = feature.table.optimizer.learning_rate
      self.learning_rates.append(float(rate() if callable(rate) else rate))
    return None


@pytest.fixture
def stand_in_tpu(monkeypatch):
  from tfde.tables import tpu as tpu_tables

  def use(kind):
    # What tfde.comm.current() gives inside a TPUStrategy's scope.
    communicator = comm_lib.TPUCommunicator(_FakeTPUStrategy(kind))
    monkeypatch.setattr(comm_lib, "current", lambda: communicator)
    monkeypatch.setitem(tpu_tables.ENGINES, kind, _StandInEngine)
    _StandInEngine.made.clear()
  return use


def _engine_features():
  adam = tfde.optimizers.Adam(learning_rate=0.1, beta_1=0.5, beta_2=0.75)
  tables = {n: tfde.TableConfig(name=n, vocabulary_size=40 + i, embedding_dim=8,
                                optimizer=adam, combiner="sum",
                                max_ids_per_partition=32 * (i + 1),
                                max_unique_ids_per_partition=16 * (i + 1),
                                nonfinite="skip")
            for i, n in enumerate(["a", "b", "c"])}
  tables["d"] = tfde.TableConfig(name="d", vocabulary_size=30, embedding_dim=4,
                                 optimizer="sgd", max_ids_per_partition=8,
                                 max_unique_ids_per_partition=8, nonfinite="skip")
  return {n: tfde.FeatureConfig(name=f"f_{n}", table=t, input_shape=(4, 2))
          for n, t in tables.items()}


@pytest.mark.parametrize("stacking, stacks", [
    (None, [["a"], ["b"], ["c"], ["d"]]),
    ("auto", [["a", "b", "c"], ["d"]]),
    (["a", "c"], [["a", "c"], ["b"], ["d"]]),
    ([["a", "b"], ["c"]], [["a", "b"], ["c"], ["d"]]),
])
def test_sparsecore_engine_gets_stacking_and_buffer_sizes(stand_in_tpu, stacking, stacks):
  stand_in_tpu("sparsecore")
  features = _engine_features()
  tfde.lookup.ShardedLookup(features, table_stacking=stacking)
  engine = _StandInEngine.made[-1]
  config = engine.config
  assert config.disable_table_stacking == (stacking is None)
  tables = {f.table.name: f.table for f in tf.nest.flatten(engine.features)}
  stack_names = {}
  for stack in stacks:
    if len(stack) == 1 and tables[stack[0]].layout is None:
      stack_names[stack[0]] = stack[0]
      continue
    names = {tables[n].layout.stacked_table_name for n in stack}
    assert len(names) == 1, stack                  # one stack for the group
    stack_name = names.pop()
    stack_names.update({n: stack_name for n in stack})
  assert len(set(stack_names.values())) == len(stacks)   # and no more
  for stack in stacks:
    key = stack_names[stack[0]]
    assert config.max_ids_per_table[key] == sum(
        features[n].table.max_ids_per_partition for n in stack)
    assert config.max_unique_ids_per_table[key] == sum(
        features[n].table.max_unique_ids_per_partition for n in stack)


def test_stacking_refusals_name_the_tables(stand_in_tpu):
  stand_in_tpu("sparsecore")
  with pytest.raises(ValueError, match="'zz'"):
    tfde.lookup.ShardedLookup(_engine_features(), table_stacking=[["a", "zz"]])
  with pytest.raises(ValueError, match=r"\['a', 'd'\]"):
    tfde.lookup.ShardedLookup(_engine_features(), table_stacking=[["a", "d"]])


@pytest.mark.parametrize("kind", ["sparsecore", "tensorcore"])
def test_engine_looks_up_and_trains_through_the_layer(stand_in_tpu, kind):
  """The layer's forward is the engine's activations (a dense 2-D input is
  handed over as ragged, so it is combined); its backward hands the
  engine the loss gradients, and Adam's learning rate carries the bias
  correction of the step."""
  stand_in_tpu(kind)
  features = _engine_features()
  layer = tfde.layers.DistributedEmbedding(
      features, table_stacking="auto" if kind == "sparsecore" else None)
  engine = _StandInEngine.made[-1]
  assert engine.config is None if kind == "tensorcore" else engine.config is not None
  inputs = {"a": tf.constant([[1, 2], [3, 4]], tf.int64),
            "b": _ragged([[5], [6, 7, 8]]), "c": _sparse([[9, 10], [11]]),
            "d": _ragged([[1], [2]])}
  with tf.GradientTape() as tape:
    out = layer(inputs)
    loss = tf.add_n([tf.reduce_sum(o * o) for o in tf.nest.flatten(out)])
  tape.gradient(loss, layer.trainable_variables)
  sent, _ = engine.calls[-1]
  assert isinstance(sent["f_a"], tf.RaggedTensor)
  expected = engine.serving({**sent})
  for name in inputs:
    np.testing.assert_allclose(out[name], expected[f"f_{name}"], rtol=1e-6)
  gradients, _ = engine.applied[-1]
  for name in inputs:
    np.testing.assert_allclose(gradients[f"f_{name}"], 2 * out[name].numpy(), rtol=1e-6)
  # Step 1 of Adam: lr * sqrt(1 - 0.75) / (1 - 0.5); SGD's default 0.01.
  assert engine.learning_rates[:3] == pytest.approx([0.1 * np.sqrt(0.25) / 0.5] * 3)
  assert engine.learning_rates[3] == pytest.approx(0.01)
  assert int(layer._lookup.tables["a"].engine.iterations.numpy()) == 1


@pytest.mark.parametrize("kind", ["sparsecore", "tensorcore"])
def test_engine_group_hands_over_inputs_and_guards_its_update(stand_in_tpu, kind):
  """Under TPUStrategy the engine's tables are one group of the pipeline
  (run eagerly: the stand-in's TPUEmbeddingForServing cannot be traced
  with ragged inputs): the engine gets the inputs as given (a
  sequence feature's positions intact, weights alongside) and back what it
  preserved, untouched; a table whose step is not finite is handed zeros
  (nonfinite="skip") or fails the step by name ("error", off TPU: XLA drops
  assertions), while the other tables' gradients reach the engine as
  they are."""
  stand_in_tpu(kind)
  features = _engine_features()
  features["a"] = tfde.FeatureConfig(
      name="f_a", table=dataclasses.replace(features["a"].table, nonfinite="skip"),
      input_shape=(4, 2))
  features["d"] = tfde.FeatureConfig(name="f_d", table=features["d"].table,
                                     input_shape=(2, 3), output_shape=(2, 3, 4),
                                     max_sequence_length=3)
  lookup = tfde.lookup.ShardedLookup(features, table_stacking=None)
  engine = _StandInEngine.made[-1]
  inputs = {"f_a": _ragged([[1], [2, 3]]), "f_b": _ragged([[5], [6]]),
            "f_c": _ragged([[7], [8]]), "f_d": _ragged([[1, 2], [3]])}
  weights = {"f_b": tf.ragged.constant([[0.5], [2.0]])}

  def step(inputs, weights, poison):
    with tf.GradientTape() as tape:
      out = lookup(inputs, weights)
      loss = (tf.reduce_sum(out["f_a"]) * poison + tf.reduce_sum(out["f_b"]) +
              2 * tf.reduce_sum(out["f_c"]) + tf.reduce_sum(out["f_d"]))
    tape.gradient(loss, lookup.trainable_variables)
    return out

  out = step(inputs, weights, tf.constant(np.nan))
  sent, sent_weights = engine.calls[-1]
  assert isinstance(sent["f_d"], tf.RaggedTensor)          # positions kept
  assert sent_weights["f_b"] is not None and sent_weights["f_a"] is None
  assert out["f_d"].shape == (2, 3, 4)
  gradients, preserved = engine.applied[-1]
  if kind == "sparsecore":
    assert isinstance(preserved["f_a"], Preserved) and preserved["f_a"].sample_count == 2
  np.testing.assert_array_equal(gradients["f_a"], 0)   # NaN: zeros for table a
  np.testing.assert_array_equal(gradients["f_b"], 1)
  np.testing.assert_array_equal(gradients["f_c"], 2)
  np.testing.assert_array_equal(gradients["f_d"], 1)
  iterations = lookup.tables["a"].engine.iterations
  assert int(iterations.numpy()) == 1



def test_engine_refuses_what_it_cannot_honour(stand_in_tpu):
  """nonfinite="error" (XLA drops the assertion on a TPU) is refused by
  table when the lookup is built, and a lookup whose per-id weights a tape
  watches (the engine gives them no gradient) by feature, before anything
  reaches the engine."""
  stand_in_tpu("sparsecore")
  features = _engine_features()
  features["b"] = tfde.FeatureConfig(
      name="f_b", table=dataclasses.replace(features["b"].table, nonfinite="error"),
      input_shape=(4, 2))
  with pytest.raises(ValueError, match=r"table 'b': nonfinite='error' cannot be "
                     r"honoured under TPUStrategy.*nonfinite='skip'"):
    tfde.lookup.ShardedLookup(features, table_stacking=None)
  layer_features = _engine_features()
  layer_features["b"] = features["b"]
  with pytest.raises(ValueError, match=r"table 'b': nonfinite='error'"):
    tfde.layers.DistributedEmbedding(layer_features)(
        {k: _ragged([[1], [2]]) for k in ("f_a", "f_b", "f_c", "f_d")})

  lookup = tfde.lookup.ShardedLookup(_engine_features(), table_stacking=None)
  engine = _StandInEngine.made[-1]
  inputs = {"f_a": _ragged([[1], [2, 3]]), "f_b": _ragged([[5], [6]]),
            "f_c": _ragged([[7], [8]]), "f_d": _ragged([[1], [3]])}
  weights = tf.ragged.constant([[0.5], [2.0]])
  calls = len(engine.calls)
  with tf.GradientTape() as tape:
    tape.watch(weights.flat_values)
    with pytest.raises(ValueError, match=r"features \['f_b'\]: a gradient of their "
                       r"per-id weights .*TPUStrategy"):
      lookup(inputs, {"f_b": weights})
  assert len(engine.calls) == calls                    # nothing reached the engine
  lookup(inputs, {"f_b": tf.stop_gradient(weights)})   # unwatched weights pass
  assert len(engine.calls) == calls + 1


def test_what_the_engine_cannot_hold_is_refused_by_name(stand_in_tpu):
  stand_in_tpu("sparsecore")
  features = _engine_features()
  with pytest.raises(ValueError, match="train_in_backward=False"):
    tfde.lookup.ShardedLookup(features, train_in_backward=False)
  with pytest.raises(ValueError, match="table 'a'.*TPU embedding engine"):
    tfde.tables.ShardedTable(features["a"].table)
  off_tpu = tfde.tables.ShardedTable(features["a"].table,
                                     comm_lib.LocalCommunicator())
  with pytest.raises(ValueError, match=r"tables \['a'\] were built before"):
    tfde.lookup.ShardedLookup(features, tables={"a": off_tpu})


def test_sparsecore_placement_off_tpu_keeps_its_error():
  table = tfde.TableConfig(name="s", vocabulary_size=10, embedding_dim=2,
                           placement="sparsecore")
  with pytest.raises(ValueError, match="table 's'.*sparsecore"):
    tfde.layers.DistributedEmbedding({"f": tfde.FeatureConfig(name="f", table=table)})


def test_movielens_tpu_example_runs_under_mirrored_strategy():
  """The TPU tutorial's script, off TPU: MirroredStrategy over 2 CPUs (a
  smoke test; it trains 1 epoch on generated ratings)."""
  import os
  import subprocess
  import sys
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  result = subprocess.run(
      [sys.executable, "examples/movielens_tpu.py", "--logical-cpus", "2",
       "--epochs", "1"], capture_output=True, text=True, cwd=repo, timeout=300,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=repo))
  assert result.returncode == 0, result.stderr[-3000:]
  last = result.stdout.strip().splitlines()[-1]
  assert last.startswith("strategy: MirroredStrategy x2;"), last
  rmse = float(last.split("eval RMSE: ")[1].split()[0])
  baseline = float(last.split("mean rating: ")[1].rstrip(")"))
  assert np.isfinite(rmse) and rmse < 1.05 * baseline, last


def test_rowwise_adagrad_has_no_tpu_form(tmp_path):
  """TPU embedding has no row-wise Adagrad: the mapping, and TPU checkpoints
  both ways, refuse it by name (the table unchanged) rather than train or
  load with another rule."""
  with pytest.raises(ValueError, match="table 't'.*'rowwise_adagrad' has no TPU form"):
    tfde.tpu.to_tpu_optimizer(tfde.optimizers.RowwiseAdagrad(), "t")
  source, configs = _trained_lookup(tf.distribute.get_strategy(), steps=1)
  path = tfde.tpu.write_tpu_checkpoint(source, str(tmp_path / "ck"))
  row_wise = {name: tfde.FeatureConfig(name=name, table=dataclasses.replace(
      f.table, optimizer=tfde.optimizers.RowwiseAdagrad())) for name, f in configs.items()}
  target = h.sharded_lookup(row_wise)
  before = target.table_values()
  with pytest.raises(ValueError, match="table 't_0': optimizer 'rowwise_adagrad' has no "
                                       "TPU form"):
    tfde.tpu.restore_tpu_checkpoint(target, path)
  for name, values in target.table_values().items():
    np.testing.assert_array_equal(values, before[name])
  with pytest.raises(ValueError, match="table 't_0': optimizer 'rowwise_adagrad' has no "
                                       "TPU form"):
    tfde.tpu.write_tpu_checkpoint(target, str(tmp_path / "other"))


def test_learning_rate_schedule_is_carried_to_tpu():
  import keras
  schedule = keras.optimizers.schedules.ExponentialDecay(0.5, decay_steps=1,
                                                         decay_rate=0.5)
  iterations = tf.Variable(0, dtype=tf.int64)
  tpu = tfde.tpu.to_tpu_optimizer(tfde.optimizers.SGD(learning_rate=schedule),
                                  "t", iterations=iterations)
  rates = []
  for step in range(3):
    iterations.assign(step)
    rates.append(float(tpu.learning_rate()))
  assert rates == pytest.approx([0.5, 0.25, 0.125])   # Keras: schedule(iterations)
  opt = tfde.optimizers.Adam(learning_rate=0.1, bias_correction=False)
  assert tfde.optimizers.SparseOptimizer.from_config(opt.get_config()) == opt
