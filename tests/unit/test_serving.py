"""Export for serving: a SavedModel that loads and serves where tfde is not
importable, giving the trained model's outputs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import oracles
from tests.support import sharded_harness as h
from tests.unit import test_layers

# Runs in a fresh interpreter (-I: no PYTHONPATH, no user site) with tfde
# blocked, so any dependency on tfde or its op library fails loudly.
LOADER = r"""
import json, sys
sys.modules["tfde"] = None
import numpy as np, tensorflow as tf
spec = json.load(open(sys.argv[2]))
served = tf.saved_model.load(sys.argv[1])
ops = sorted({op.type for f in served.serve.concrete_functions
              for op in f.graph.get_operations()})
def tensor(d):
  if d["kind"] == "dense":
    return tf.constant(np.array(d["values"], dtype=d["dtype"]))
  if d["kind"] == "ragged":
    return tf.RaggedTensor.from_row_splits(
        np.array(d["values"], dtype=d["dtype"]), np.array(d["splits"], np.int64))
  return tf.SparseTensor(np.array(d["indices"], np.int64),
                         np.array(d["values"], dtype=d["dtype"]), d["shape"])
inputs = {k: tensor(v) for k, v in spec["inputs"].items()}
result = {"ops": ops}
try:
  out = served.serve(inputs)
  out = out if isinstance(out, dict) else {"output": out}
  result["outputs"] = {k: v.numpy().tolist() for k, v in out.items()}
except tf.errors.InvalidArgumentError as e:
  result["error"] = e.message
print("RESULT" + json.dumps(result))
"""


def _describe(value):
  if isinstance(value, tf.RaggedTensor):
    return {"kind": "ragged", "values": value.values.numpy().tolist(),
            "splits": value.row_splits.numpy().tolist(),
            "dtype": value.dtype.name}
  if isinstance(value, tf.SparseTensor):
    return {"kind": "sparse", "indices": value.indices.numpy().tolist(),
            "values": value.values.numpy().tolist(),
            "shape": value.dense_shape.numpy().tolist(), "dtype": value.dtype.name}
  value = np.asarray(value)
  return {"kind": "dense", "values": value.tolist(), "dtype": value.dtype.name}


def _serve_elsewhere(tmp_path, path, inputs):
  spec = tmp_path / "inputs.json"
  spec.write_text(json.dumps({"inputs": {k: _describe(v) for k, v in inputs.items()}}))
  loader = tmp_path / "loader.py"
  loader.write_text(LOADER)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TFDE_OPS")}
  env["TF_CPP_MIN_LOG_LEVEL"] = "3"
  result = subprocess.run([sys.executable, "-I", str(loader), str(path), str(spec)],
                          capture_output=True, text=True, env=env, cwd="/",
                          timeout=180)
  assert result.returncode == 0, result.stderr[-3000:]
  line = [l for l in result.stdout.splitlines() if l.startswith("RESULT")][-1]
  served = json.loads(line[len("RESULT"):])
  assert not [op for op in served["ops"] if op.startswith("Tfde")], served["ops"]
  return served


def _inputs_and_numpy_outputs(layer, configs):
  """The harness's unweighted batch of every input kind, and each
  feature's output from `layer`'s tables in numpy."""
  batch = h.make_batch(0, weighted=False)
  inputs, _, _ = h.replica_inputs(batch, 0, 1)
  tables = layer.get_embedding_tables()
  return inputs, {f: h.oracles.combine(tables[cfg.table.name], batch[f]["ids"], None,
                                       cfg.table.combiner)
                  for f, cfg in configs.items()}


def test_exported_keras_model_serves_without_tfde(tmp_path):
  x, y = test_layers._ranking_data(512)  # pylint: disable=protected-access
  with test_layers.mirrored(2).scope():
    model = test_layers._ranking_model()  # pylint: disable=protected-access
    model.compile(optimizer="adam", loss="mse")
  model.fit(x, y, batch_size=128, epochs=1, verbose=0)
  want = model.predict(x, batch_size=512, verbose=0)
  path = tmp_path / "served"
  tfde.export_for_serving(model, str(path), {k: v[:4] for k, v in x.items()})
  served = _serve_elsewhere(tmp_path, path, x)
  np.testing.assert_allclose(np.array(served["outputs"]["output"]), want,
                             rtol=1e-5, atol=1e-6)


def test_exported_layer_serves_every_input_kind_and_rejects_bad_ids(tmp_path):
  configs = h.feature_configs("adagrad", placements={"B": "default_device"})
  with test_layers.mirrored(2).scope():
    layer = tfde.layers.DistributedEmbedding(configs)
  inputs, want = _inputs_and_numpy_outputs(layer, configs)
  path = tmp_path / "layer"
  tfde.export_for_serving(layer, str(path), inputs)
  served = _serve_elsewhere(tmp_path, path, inputs)
  for name in h.FEATURES:
    np.testing.assert_allclose(np.array(served["outputs"][name]), want[name],
                               rtol=1e-5, atol=1e-6)
  ids = inputs["a_dense"].numpy()
  ids[1, 2] = 37
  inputs["a_dense"] = tf.constant(ids)
  served = _serve_elsewhere(tmp_path, path, inputs)
  assert "feature a_dense (table A): id 37 at position 5 is out of range" in served["error"]


def test_an_export_serves_ids_of_either_index_dtype(tmp_path):
  # Training takes int32 and int64 ids alike; so does the export, whichever
  # the example had (its serving signature keeps the example's).
  configs = h.feature_configs("adagrad")
  layer = tfde.layers.DistributedEmbedding(configs)
  inputs, want = _inputs_and_numpy_outputs(layer, configs)

  def as_dtype(value, dtype):
    if isinstance(value, tf.RaggedTensor):
      return value.with_values(tf.cast(value.values, dtype))
    if isinstance(value, tf.SparseTensor):
      return tf.SparseTensor(value.indices, tf.cast(value.values, dtype), value.dense_shape)
    return tf.cast(value, dtype)

  for example, served_as in ((tf.int64, tf.int32), (tf.int32, tf.int64)):
    path = tmp_path / f"from_{example.name}"
    tfde.export_for_serving(layer, str(path), {k: as_dtype(v, example)
                                               for k, v in inputs.items()})
    served = _serve_elsewhere(tmp_path, path, {k: as_dtype(v, served_as)
                                              for k, v in inputs.items()})
    for name in h.FEATURES:
      np.testing.assert_allclose(np.array(served["outputs"][name]), want[name],
                                 rtol=1e-5, atol=1e-6, err_msg=f"{example.name} {name}")
    # The signature's int32 tensors are the ids' values, one per feature,
    # where the example had int32 (row splits and sparse indices are int64).
    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    int32 = [spec for spec in signature.structured_input_signature[1].values()
             if spec.dtype == tf.int32]
    assert len(int32) == (len(inputs) if example == tf.int32 else 0)


def test_export_needs_a_distributed_embedding(tmp_path):
  import keras  # pylint: disable=g-import-not-at-top
  model = keras.Sequential([keras.layers.Dense(1)])
  with pytest.raises(ValueError, match="holds no DistributedEmbedding"):
    tfde.export_for_serving(model, str(tmp_path / "x"), np.zeros((2, 3)))


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("lengths", [[0, 3, 1, 0, 5, 2, 0], [4] * 6, [0, 0], []],
                         ids=["ragged", "dense", "only-empty", "no-samples"])
def test_the_served_combine_matches_numpy(combiner, weighted, lengths):
  """An export's combine (stock ops): a [batch, hotness, dim] sum for dense
  inputs, a sorted segment sum for the others (empty samples anywhere give
  zeros), then the combiner's divisor per sample."""
  rng = np.random.default_rng(len(lengths))
  table = rng.normal(size=(20, 3)).astype(np.float32)
  ids = [rng.integers(0, 20, size=n) for n in lengths]
  weights = [rng.uniform(0.5, 2.0, size=n).astype(np.float32) for n in lengths]
  want = oracles.combine(table, ids, weights if weighted else None, combiner)
  flat = np.concatenate(ids + [np.zeros(0, np.int64)]).astype(np.int64)
  splits = tf.constant(np.concatenate([[0], np.cumsum(lengths)]), tf.int64)
  w = tf.constant(np.concatenate(weights + [np.zeros(0, np.float32)])) if weighted else None
  dense = lengths and len(set(lengths)) == 1
  got = tfde.inputs.combine_served_rows(tf.gather(table, flat), splits, w, combiner,
                                        hotness=lengths[0] if dense else None)
  np.testing.assert_allclose(got.numpy(), np.reshape(want, (len(lengths), 3)),
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_the_serving_lookup_matches_training_for_every_output_and_form(combiner):
  """The layer's stock-op lookup (what an export runs) against its
  training lookup: pooled features from rank-1 and rank-2 dense ids,
  ragged and sparse ids, weighted or not; sequence and ragged outputs from
  dense ids (unpooled: one sample per id, so no [batch, hotness] view)."""
  table = tfde.TableConfig(name="t", vocabulary_size=30, embedding_dim=4,
                           combiner=combiner, seed=5)
  features = {
      "rank1": tfde.FeatureConfig(name="rank1", table=table),
      "rank2": tfde.FeatureConfig(name="rank2", table=table),
      "weighted": tfde.FeatureConfig(name="weighted", table=table),
      "ragged": tfde.FeatureConfig(name="ragged", table=table),
      "sparse": tfde.FeatureConfig(name="sparse", table=table),
      "sequence": tfde.FeatureConfig(name="sequence", table=table, max_sequence_length=4),
      "ragged_out": tfde.FeatureConfig(name="ragged_out", table=table, output="ragged"),
  }
  layer = tfde.layers.DistributedEmbedding(features)
  rng = np.random.default_rng(3)
  dense = tf.constant(rng.integers(0, 30, size=(5, 3)), tf.int64)
  inputs = {
      "rank1": tf.constant(rng.integers(0, 30, size=5), tf.int64),
      "rank2": dense, "weighted": dense, "sequence": dense, "ragged_out": dense,
      "ragged": tf.ragged.constant([[1, 2, 3], [], [4], [5, 6], []], tf.int64),
      "sparse": tf.sparse.from_dense(tf.constant([[1, 0, 2], [0, 0, 0], [3, 4, 0],
                                                  [0, 5, 0], [0, 0, 0]], tf.int64)),
  }
  weights = {"weighted": tf.constant(rng.uniform(0.5, 2.0, size=(5, 3)), tf.float32)}
  want = layer(inputs, weights, training=False)
  layer.serve_from({"t": tf.Variable(layer.tables["t"].state(keys=("table",))["table"])})
  try:
    got = layer(inputs, weights, training=False)
  finally:
    layer.serve_from(None)
  for name in features:
    w, g = want[name], got[name]
    if isinstance(w, tf.RaggedTensor):
      w, g = w.to_tensor(), g.to_tensor()
    np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_serving_lookup_refuses_what_int32_counts_would_wrap():
  """A sparse batch of 2^32 + 6 samples (wrapped: 6) and a sequence of
  2^31 positions, refused naming the feature and table as in training."""
  table = tfde.TableConfig(name="t", vocabulary_size=30, embedding_dim=4)
  layer = tfde.layers.DistributedEmbedding({
      "pooled": tfde.FeatureConfig(name="pooled", table=table),
      "sequence": tfde.FeatureConfig(name="sequence", table=table,
                                     max_sequence_length=2**30)})
  good = {"pooled": tf.constant([[1, 2]], tf.int64), "sequence": tf.constant([[1, 2]], tf.int64)}
  wide = tf.SparseTensor([[0, 0], [5, 1]], tf.constant([1, 2], tf.int64), [2**32 + 6, 2])
  layer.serve_from({"t": tf.Variable(layer.tables["t"].state(keys=("table",))["table"])})
  try:
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"feature pooled \(table t\): sparse ids have a batch "
                             r"\(dense_shape\[0\]\) of 4294967302 samples"):
      layer(dict(good, pooled=wide), training=False)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"feature sequence \(table t\): a batch of 2 samples"):
      layer(dict(good, sequence=tf.constant([[1, 2], [3, 4]], tf.int64)), training=False)
  finally:
    layer.serve_from(None)


def test_the_served_combine_keeps_huge_weights_finite():
  """Weights whose sum overflows float32: folded per id in float64, as the
  kernels and the twin fold them, not summed in float32 first."""
  rows = np.array([[2.0], [3.0], [4.0], [6.0]])
  weights = np.array([1e38, 1e38, 3e38, 1e38])
  splits = tf.constant([0, 2, 4], tf.int64)
  for combiner in ("mean", "sqrtn"):
    # numpy in float64: each sample's sum of w_i * row_i over its divisor.
    want = []
    for b in (slice(0, 2), slice(2, 4)):
      w = weights[b]
      divisor = w.sum() if combiner == "mean" else np.sqrt((w * w).sum())
      want.append((w[:, None] * rows[b]).sum(0) / divisor)
    for hotness in (None, 2):
      got = tfde.inputs.combine_served_rows(tf.constant(rows, tf.float32), splits,
                                            tf.constant(weights, tf.float32), combiner, hotness)
      assert np.all(np.isfinite(got.numpy()))
      np.testing.assert_allclose(got.numpy(), np.array(want), rtol=1e-6)


def _two_feature_model():
  import keras  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(3)
  tables = {n: tfde.layers.TableConfig(name=n, vocabulary_size=v, embedding_dim=4)
            for n, v in (("user", 50), ("movie", 30))}
  features = {f"{n}_id": tfde.layers.FeatureConfig(name=f"{n}_id", table=t)
              for n, t in tables.items()}
  inputs = {k: keras.Input(shape=(2,), dtype="int64", name=k) for k in features}
  layer = tfde.layers.DistributedEmbedding(features, name="embedding")
  out = layer(inputs)
  model = keras.Model(inputs, keras.layers.Concatenate()([out["user_id"], out["movie_id"]]))
  return model, layer


def test_serving_default_names_its_inputs_after_the_features(tmp_path):
  model, _ = _two_feature_model()
  example = {"user_id": tf.constant([[1, 2]], tf.int64), "movie_id": tf.constant([[3, 4]], tf.int64)}
  tfde.export_for_serving(model, str(tmp_path / "m"), example)
  signature = tf.saved_model.load(str(tmp_path / "m")).signatures["serving_default"]
  specs = signature.structured_input_signature[1]
  assert sorted(specs) == ["movie_id", "user_id"]
  assert {k: s.name for k, s in specs.items()} == {"movie_id": "movie_id", "user_id": "user_id"}
  # Called by name, as a serving system does.
  got = signature(user_id=tf.constant([[1, 2]], tf.int64), movie_id=tf.constant([[3, 4]], tf.int64))
  assert list(got.values())[0].shape == (1, 8)


def test_serve_takes_int32_and_int64_ids_mixed_across_features(tmp_path):
  """int32 ids for one feature beside int64 for another, against the
  tables' rows gathered in numpy (a mean of 2 ids per feature)."""
  model, layer = _two_feature_model()
  example = {"user_id": tf.constant([[1, 2]], tf.int64), "movie_id": tf.constant([[3, 4]], tf.int64)}
  tfde.export_for_serving(model, str(tmp_path / "m"), example)
  served = tf.saved_model.load(str(tmp_path / "m"))
  rows = {n: np.asarray(layer.tables[n].state(keys=("table",))["table"])
          for n in ("user", "movie")}
  users, movies = np.array([[1, 7], [49, 0]]), np.array([[3, 29], [5, 5]])
  want = np.concatenate([rows["user"][users].mean(1), rows["movie"][movies].mean(1)], 1)
  for user_dtype, movie_dtype in ((tf.int32, tf.int64), (tf.int64, tf.int32),
                                  (tf.int32, tf.int32), (tf.int64, tf.int64)):
    got = served.serve({"user_id": tf.constant(users, user_dtype),
                        "movie_id": tf.constant(movies, movie_dtype)})
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7,
                               err_msg=f"{user_dtype.name} {movie_dtype.name}")
  # The four mixes call one traced model: the tables are read in at most
  # two of the SavedModel's functions (the signature's graph, and the one
  # tf.saved_model.save traces again), not in one per mix (five), beside
  # the trace Keras saves of the model itself.
  from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=g-import-not-at-top
  saved = saved_model_pb2.SavedModel()
  with open(tmp_path / "m" / "saved_model.pb", "rb") as f:
    saved.ParseFromString(f.read())
  reading = [fn.signature.name for fn in saved.meta_graphs[0].graph_def.library.function
             if any(n.op.startswith("ResourceGather") for n in fn.node_def)
             and "serving_default" not in fn.signature.name]
  assert 1 <= len(reading) <= 2, reading


def test_a_model_refusing_int64_ids_is_exported_per_mix(tmp_path):
  """A model that refuses int64 ids (here a layer checking its ids'
  dtype) cannot share one int64 graph: it is traced per mix, serves the
  int32 ids of its example, and int64 ids find no function to serve them."""

  class Int32Only(tfde.layers.DistributedEmbedding):
    def call(self, inputs, weights=None, training=None):
      if inputs["f"].dtype == tf.int64:
        raise TypeError("int32 ids only")
      return super().call(inputs, weights, training)

  table = tfde.layers.TableConfig(name="t", vocabulary_size=20, embedding_dim=3)
  layer = Int32Only({"f": tfde.layers.FeatureConfig(name="f", table=table)})
  example = {"f": tf.constant([[1, 2], [3, 19]], tf.int32)}
  want = layer(example)["f"].numpy()
  rows = np.asarray(layer.tables["t"].state(keys=("table",))["table"])
  np.testing.assert_allclose(want, rows[[[1, 2], [3, 19]]].mean(1), rtol=1e-6)  # a mean
  tfde.export_for_serving(layer, str(tmp_path / "m"), example)
  served = tf.saved_model.load(str(tmp_path / "m"))
  np.testing.assert_allclose(served.serve(example)["f"].numpy(), want, rtol=1e-6)
  with pytest.raises((TypeError, ValueError)):
    served.serve({"f": tf.cast(example["f"], tf.int64)})


def test_the_example_dtypes_serve_the_model_as_it_trained(tmp_path):
  """A model computing in its ids' dtype (a hash that wraps in int32) is
  served its example's int32 ids as it trained, by the signature and by
  `serve`, not through the graph shared by the widened mixes."""

  class Hashing(tfde.layers.DistributedEmbedding):
    def call(self, inputs, weights=None, training=None):
      ids = inputs["f"]
      hashed = tf.math.floormod(ids * tf.constant(1000003, ids.dtype), tf.constant(20, ids.dtype))
      return super().call({"f": hashed}, weights, training)

  table = tfde.layers.TableConfig(name="t", vocabulary_size=20, embedding_dim=3)
  layer = Hashing({"f": tfde.layers.FeatureConfig(name="f", table=table)})
  example = {"f": tf.constant([[5000, 123456], [99999, 7]], tf.int32)}
  want = layer(example)["f"].numpy()
  # The int32 products wrap: an int64 graph would read other rows.
  assert not np.allclose(want, layer({"f": tf.cast(example["f"], tf.int64)})["f"].numpy())
  tfde.export_for_serving(layer, str(tmp_path / "m"), example)
  served = tf.saved_model.load(str(tmp_path / "m"))
  np.testing.assert_allclose(served.serve(example)["f"].numpy(), want, rtol=1e-6)
  signature = served.signatures["serving_default"]
  np.testing.assert_allclose(list(signature(f=example["f"]).values())[0].numpy(), want,
                             rtol=1e-6)


def test_the_mixes_traced_are_bounded():
  """2**k mixes for k <= MAX_MIXED_ID_INPUTS id inputs (the example's own
  is traced apart), else all int32 and all int64."""
  from tfde.saving import serving  # pylint: disable=g-import-not-at-top
  def signature(k):
    return {f"f{i}": tf.TensorSpec([None, 2], tf.int64, name=f"f{i}") for i in range(k)}
  k = serving.MAX_MIXED_ID_INPUTS
  mixes = serving._id_dtype_mixes(signature(k))  # pylint: disable=protected-access
  assert len(mixes) == 2 ** k - 1
  assert len({tuple(s.dtype for s in m.values()) for m in mixes}) == 2 ** k - 1
  wide = serving._id_dtype_mixes(signature(k + 1))  # pylint: disable=protected-access
  assert [sorted({s.dtype.name for s in m.values()}) for m in wide] == [["int32"]]
  # Dense floats are not ids.
  floats = dict(signature(1), dense=tf.TensorSpec([None, 3], tf.float32))
  assert all(m["dense"].dtype == tf.float32
             for m in serving._id_dtype_mixes(floats))  # pylint: disable=protected-access
