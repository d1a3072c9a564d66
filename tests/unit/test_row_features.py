"""Row features (issue 16): sequence outputs, clipping and max-norm, trainable
weights, string ids, reduced-precision rows; each against numpy."""

import numpy as np
import pytest
import tensorflow as tf

import tfde
from tests.support import sharded_harness as h
from tests.unit.test_sharded import distribute
from tests.unit.test_sharded import mirrored

# ----------------------------------------------------------------- configs


def test_max_sequence_length_validates_and_round_trips():
  table = tfde.TableConfig(name="t", vocabulary_size=10, embedding_dim=4)
  feature = tfde.FeatureConfig(name="f", table=table, max_sequence_length=5)
  assert feature.max_sequence_length == 5
  assert feature.get_config()["max_sequence_length"] == 5
  assert tfde.FeatureConfig.from_config(feature.get_config()) == feature
  pooled = tfde.FeatureConfig(name="g", table=table)
  assert pooled.max_sequence_length is None
  assert tfde.FeatureConfig.from_config(pooled.get_config()) == pooled
  assert pooled != tfde.FeatureConfig(name="g", table=table, max_sequence_length=1)
  for bad in (0, -2, 2.5, True, "3"):
    with pytest.raises(ValueError, match="'f': max_sequence_length must be"):
      tfde.FeatureConfig(name="f", table=table, max_sequence_length=bad)
  assert (feature.output, pooled.output) == ("sequence", "pooled")
  ragged = tfde.FeatureConfig(name="r", table=table, output="ragged")
  assert tfde.FeatureConfig.from_config(ragged.get_config()) == ragged
  for output, length in (("sequence", None), ("ragged", 3), ("pooled", 3)):
    with pytest.raises(ValueError, match=f"output='{output}' with max_sequence_length"):
      tfde.FeatureConfig(name="f", table=table, output=output, max_sequence_length=length)
  with pytest.raises(ValueError, match="output must be one of"):
    tfde.FeatureConfig(name="f", table=table, output="dense")


def test_row_dtype_validates_and_round_trips():
  table = tfde.TableConfig(name="t", vocabulary_size=10, embedding_dim=4,
                           dtype="float16")
  assert tfde.TableConfig.from_config(table.get_config()) == table
  with pytest.raises(ValueError, match="'t': dtype must be one of"):
    tfde.TableConfig(name="t", vocabulary_size=10, embedding_dim=4, dtype="int8")
  with pytest.raises(ValueError, match="'t': dtype='bfloat16' needs a static table"):
    tfde.TableConfig(name="t", vocabulary_size=None, embedding_dim=4, dtype="bfloat16")


# ----------------------------------------------------------- trainable weights


def _weights_values(w):
  """The tensor holding a weights input's values (what a user would watch)."""
  return w.values if isinstance(w, (tf.RaggedTensor, tf.SparseTensor)) else w


def _oracle_weights_grads(configs, tables, batch):
  """d loss / d weights of every feature, by tf.nn.embedding_lookup_sparse
  on unsharded copies of the tables, for the global batch."""
  values, outputs = {}, {}
  with tf.GradientTape() as tape:
    for f, cfg in configs.items():
      ids, ws = batch[f]["ids"], batch[f]["weights"]
      idx = [[b, k] for b, r in enumerate(ids) for k in range(len(r))]
      shape = [len(ids), max(4, max(len(r) for r in ids))]
      values[f] = tf.constant([x for r in ws for x in r], tf.float32)
      tape.watch(values[f])
      sp_ids = tf.SparseTensor(tf.constant(idx, tf.int64),
                               tf.constant([x for r in ids for x in r], tf.int64), shape)
      sp_w = tf.SparseTensor(tf.constant(idx, tf.int64), values[f], shape)
      out = tf.nn.embedding_lookup_sparse(
          tf.constant(tables[cfg.table.name], tf.float32), sp_ids, sp_w,
          combiner=cfg.table.combiner)
      # embedding_lookup_sparse drops trailing empty samples: pad them back.
      outputs[f] = tf.pad(out, [[0, len(ids) - tf.shape(out)[0]], [0, 0]])
    loss = tf.add_n([tf.reduce_sum(tf.square(outputs[f] - batch[f]["target"]))
                     for f in configs]) / h.GLOBAL_BATCH
  return {f: g.numpy() for f, g in tape.gradient(loss, values).items()}


@pytest.mark.parametrize("exchange", ["auto", "rows"])
@pytest.mark.parametrize("num_replicas,variant", [(1, 0), (2, 1), (4, 2)])
def test_weights_gradients_equal_embedding_lookup_sparse(num_replicas, variant, exchange):
  """Dense, ragged and sparse weights, sharded over N, training the tables
  meanwhile, through either exchange (the owners' partial sums then send
  each id's row back for the weights). `variant` rotates the combiners
  over the tables, so each table meets every combiner over the three
  runs."""
  strategy = mirrored(num_replicas)
  configs = h.feature_configs("sgd", variant=variant)
  with strategy.scope():
    lookup = h.sharded_lookup(configs, exchange=exchange)
  initial = {n: t.full_table() for n, t in lookup.tables.items()}
  batch = h.make_batch(0, weighted=True, seed=variant, num_replicas=num_replicas)
  per = [h.replica_inputs(batch, r, num_replicas) for r in range(num_replicas)]

  @tf.function
  def step(inputs, weights, targets):
    def replica_step(inputs, weights, targets):
      watched = {f: _weights_values(w) for f, w in weights.items()}
      with tf.GradientTape() as tape:
        tape.watch(watched)
        outputs = lookup(inputs, weights)
        loss = h.replica_loss(outputs, targets)
      grads = tape.gradient(loss, [watched, lookup.trainable_variables])
      return grads[0]
    return strategy.run(replica_step, args=(inputs, weights, targets))

  grads = step(distribute(strategy, [p[0] for p in per]),
               distribute(strategy, [p[1] for p in per]),
               distribute(strategy, [p[2] for p in per]))
  want = _oracle_weights_grads(configs, initial, batch)
  local = strategy.experimental_local_results(grads)
  for f in h.FEATURES:
    got = np.concatenate([np.asarray(g[f]).ravel() for g in local])
    np.testing.assert_allclose(got, want[f], rtol=1e-5, atol=1e-6,
                               err_msg=f"feature {f}, variant {variant}")
    if f != "c_single" or configs[f].table.combiner == "sum":
      # (One id per sample: mean and sqrtn do not depend on its weight.)
      assert np.abs(want[f]).max() > 1e-3
  # The tables still train as without trainable weights.
  _, want_tables = h.reference_run(configs, initial, [batch])
  for name, t in lookup.tables.items():
    np.testing.assert_allclose(t.full_table(), want_tables[name], rtol=1e-5,
                               atol=1e-6, err_msg=name)


def _lookup_sparse(params, ids, weights, combiner):
  """tf.nn.embedding_lookup_sparse of ragged ids and weights (lists)."""
  idx = [[b, k] for b, r in enumerate(ids) for k in range(len(r))]
  shape = [len(ids), max(len(r) for r in ids)]
  sp_ids = tf.SparseTensor(tf.constant(idx, tf.int64),
                           tf.constant([x for r in ids for x in r], tf.int64), shape)
  sp_w = tf.SparseTensor(tf.constant(idx, tf.int64), weights, shape)
  return tf.nn.embedding_lookup_sparse(params, sp_ids, sp_w, combiner=combiner)


def test_keras_layer_weights_gradients_static_and_dynamic(op_backend):
  """Eager, through the Keras layer, on both op backends: the weights get
  embedding_lookup_sparse's gradient, for a static table (ragged weights,
  sqrtn) and a dynamic one (sparse weights, mean)."""
  del op_backend
  static = tfde.layers.TableConfig(name="s", vocabulary_size=20, embedding_dim=3,
                                   combiner="sqrtn")
  dynamic = tfde.layers.TableConfig(name="d", vocabulary_size=None, embedding_dim=3,
                                    combiner="mean", initializer="uniform")
  layer = tfde.layers.DistributedEmbedding(
      {"s": tfde.layers.FeatureConfig(name="s", table=static),
       "d": tfde.layers.FeatureConfig(name="d", table=dynamic)})
  ids = [[3, 7, 3], [5], [1, 2]]
  keys = [[10**12, -5], [7, 7, 2**40], [3]]
  w_s = tf.constant([0.5, 2.0, 1.0, 3.0, 0.7, 1.2])
  w_d = tf.constant([1.0, 0.3, 2.0, 0.5, 1.1, 0.4])
  d_idx = tf.constant([[b, k] for b, r in enumerate(keys) for k in range(len(r))],
                      tf.int64)
  targets = tf.constant(np.random.default_rng(0).normal(size=(3, 3)), tf.float32)
  with tf.GradientTape() as tape:
    tape.watch([w_s, w_d])
    out = layer({"s": tf.ragged.constant(ids, tf.int64),
                 "d": tf.SparseTensor(d_idx, [x for r in keys for x in r], [3, 3])},
                weights={"s": tf.RaggedTensor.from_row_lengths(w_s, [3, 1, 2]),
                         "d": tf.SparseTensor(d_idx, w_d, [3, 3])})
    loss = tf.reduce_sum(tf.square(out["s"] - targets)) + tf.reduce_sum(
        out["d"] * targets)
  # The rows as looked up (the dynamic ones admitted now), before training.
  rows = layer.tables["d"].export_rows()
  s_table = tf.constant(layer.get_embedding_tables()["s"])
  grads = tape.gradient(loss, [w_s, w_d])
  # The oracle, with the dynamic table's rows renumbered 0..k-1.
  position = {int(k): i for i, k in enumerate(rows["ids"])}
  with tf.GradientTape() as oracle:
    oracle.watch([w_s, w_d])
    want_s = _lookup_sparse(s_table, ids, w_s, "sqrtn")
    want_d = _lookup_sparse(tf.constant(rows["table"]),
                            [[position[k] for k in r] for r in keys], w_d, "mean")
    want_loss = tf.reduce_sum(tf.square(want_s - targets)) + tf.reduce_sum(
        want_d * targets)
  np.testing.assert_allclose(loss.numpy(), want_loss.numpy(), rtol=1e-5)
  for got, want in zip(grads, oracle.gradient(want_loss, [w_s, w_d])):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert np.abs(want.numpy()).max() > 1e-2


# ------------------------------------------------- clipping and max-norm

CLIPS = {"A": dict(max_norm=0.8, clipvalue=0.05), "B": dict(clipnorm=0.1),
         "C": dict(clipnorm=0.1, clipvalue=0.04)}


def _clipping_configs(kind, variant):
  tables = {}
  for i, (name, (vocab, dim)) in enumerate(sorted(h.TABLES.items())):
    clip = {k: v for k, v in CLIPS[name].items() if k != "max_norm"}
    optimizer = type(h.sparse_optimizer(kind))(**h.HYPER[kind], **clip)
    tables[name] = tfde.TableConfig(
        name=name, vocabulary_size=vocab, embedding_dim=dim, optimizer=optimizer,
        combiner=h.COMBINERS[(i + variant) % 3], seed=11 + i,
        initializer="uniform" if name == "C" else None,
        max_norm=CLIPS[name].get("max_norm"))
  return {f: tfde.FeatureConfig(name=f, table=tables[t])
          for f, (t, _) in h.FEATURES.items()}


def _renormalized(table, max_norm):
  norms = np.linalg.norm(table, axis=1, keepdims=True)
  return np.where(norms > max_norm, table * max_norm / np.maximum(norms, 1e-30), table)


def _clipping_reference(configs, initial, batches):
  """Numpy: rows renormalised on lookup (max_norm) and differentiated
  through it; each touched row's summed gradient clipped by norm, then by
  value; then the optimizer."""
  tables = {n: np.array(v, np.float64) for n, v in initial.items()}
  kind = next(iter(configs.values())).table.optimizer_config()["kind"]
  opts = {n: h.numpy_optimizer(kind, t.shape) for n, t in tables.items()}
  first, bites = None, {"max_norm": 0, "clipnorm": 0, "clipvalue": 0}
  for batch in batches:
    outputs, grads = {}, {n: np.zeros_like(t) for n, t in tables.items()}
    touched = {n: set() for n in tables}
    for f, cfg in configs.items():
      t, c = cfg.table.name, cfg.table
      used = tables[t] if c.max_norm is None else _renormalized(tables[t], c.max_norm)
      ids, ws = batch[f]["ids"], batch[f]["weights"]
      outputs[f] = h.oracles.combine(used, ids, ws, c.combiner)
      d_out = 2.0 * (outputs[f] - batch[f]["target"]) / h.GLOBAL_BATCH
      grads[t] += h.oracles.combine_grad_dense(used.shape[0], d_out, ids, ws, c.combiner)
      touched[t].update(i for r in ids for i in r)
    first = first or outputs
    for n, table in tables.items():
      c = next(cfg.table for cfg in configs.values() if cfg.table.name == n)
      rows = sorted(touched[n])
      g = grads[n][rows]
      if c.max_norm is not None:  # the Jacobian of x * m / |x| where |x| > m
        x = table[rows]
        norm = np.linalg.norm(x, axis=1, keepdims=True)
        through = (c.max_norm / norm) * (g - x * np.sum(x * g, 1, keepdims=True) / norm**2)
        g = np.where(norm > c.max_norm, through, g)
        bites["max_norm"] += int((norm > c.max_norm).sum())
      clipnorm = c.optimizer_config().get("clipnorm")
      clipvalue = c.optimizer_config().get("clipvalue")
      if clipnorm is not None:
        norm = np.linalg.norm(g, axis=1, keepdims=True)
        g = np.where(norm > clipnorm, g * clipnorm / norm, g)
        bites["clipnorm"] += int((norm > clipnorm).sum())
      if clipvalue is not None:
        bites["clipvalue"] += int((np.abs(g) > clipvalue).sum())
        g = np.clip(g, -clipvalue, clipvalue)
      opts[n].apply(table, rows, g)
  return first, tables, bites


@pytest.mark.parametrize("num_replicas,kind,variant",
                         [(1, "sgd", 0), (2, "adagrad", 1), (4, "adam", 2),
                          (2, "rowwise_adagrad", 0)])
def test_clipping_and_max_norm_equal_numpy(num_replicas, kind, variant):
  from tests.unit.test_sharded import sharded_run
  strategy = mirrored(num_replicas)
  configs = _clipping_configs(kind, variant)
  batches = [h.make_batch(s, weighted=True, seed=7 + variant,
                          num_replicas=num_replicas) for s in range(3)]
  initial, outputs, final, _, _ = sharded_run(strategy, configs, batches, weighted=True)
  want_outputs, want_tables, bites = _clipping_reference(configs, initial, batches)
  for f in h.FEATURES:
    np.testing.assert_allclose(outputs[f], want_outputs[f], rtol=1e-5, atol=1e-6,
                               err_msg=f)
  for name in want_tables:
    np.testing.assert_allclose(final[name], want_tables[name], rtol=1e-5, atol=1e-6,
                               err_msg=name)
  # Each limit bit somewhere (and not everywhere: the rows differ).
  assert min(bites.values()) > 0, bites
  norms = np.linalg.norm(initial["A"], axis=1)
  assert (norms > 0.8).any() and (norms < 0.8).any()


def test_clipping_configs_from_keras_validate_and_round_trip():
  import keras
  table = tfde.TableConfig(
      name="t", vocabulary_size=10, embedding_dim=4, max_norm=2,
      optimizer=keras.optimizers.Adagrad(learning_rate=0.1, clipnorm=0.5))
  clipping = table.optimizer_config()
  assert (clipping["clipnorm"], clipping.get("clipvalue")) == (0.5, None)
  assert table.max_norm == 2.0
  assert tfde.TableConfig.from_config(table.get_config()) == table
  sgd = tfde.TableConfig(name="u", vocabulary_size=10, embedding_dim=4,
                         optimizer=keras.optimizers.SGD(clipvalue=0.25))
  assert sgd.optimizer_config()["clipvalue"] == 0.25
  assert tfde.TableConfig.from_config(sgd.get_config()) == sgd
  # A config written before clipping existed reads as unclipped.
  old = sgd.get_config()
  old["optimizer"].pop("clipvalue")
  old.pop("max_norm")
  assert "clipvalue" not in tfde.TableConfig.from_config(old).optimizer_config()
  for bad in (0, -1.0, float("inf"), True, "1"):
    with pytest.raises(ValueError, match="'t': max_norm must be"):
      tfde.TableConfig(name="t", vocabulary_size=10, embedding_dim=4, max_norm=bad)
    with pytest.raises(ValueError, match="clipnorm must be None or a positive"):
      tfde.optimizers.SGD(clipnorm=bad)
  with pytest.raises(ValueError, match=r"\['global_clipnorm'\]"):
    tfde.TableConfig(name="t", vocabulary_size=10, embedding_dim=4,
                     optimizer=keras.optimizers.SGD(global_clipnorm=1.0))


# ------------------------------------------------------ sequence features

B = 8  # global batch
SEQ_TABLES = {"A": (37, 4), "B": (50, 4)}
SEQ_FEATURES = {  # name: (table, input kind, max_sequence_length, output)
    "a_pooled": ("A", "ragged", None, "pooled"),
    "a_seq_dense": ("A", "dense", 2, "sequence"),     # [B, 3] truncated to 2
    "a_seq_ragged": ("A", "ragged", 3, "sequence"),   # 0..5 ids: pad, truncate
    "b_seq_sparse": ("B", "sparse", 4, "sequence"),   # columns with gaps, of 6
    "b_ragged_out": ("B", "ragged", None, "ragged"),
    "b_pooled": ("B", "sparse", None, "pooled"),
}


def _seq_configs(kind):
  tables = {n: tfde.TableConfig(name=n, vocabulary_size=v, embedding_dim=d,
                                optimizer=h.sparse_optimizer(kind), seed=3,
                                combiner="mean" if n == "A" else "sum")
            for n, (v, d) in SEQ_TABLES.items()}
  return {f: tfde.FeatureConfig(name=f, table=tables[t], max_sequence_length=length,
                                output=output)
          for f, (t, _, length, output) in SEQ_FEATURES.items()}


def _seq_batch(step):
  """Per feature: per sample a list of (position, id), and targets."""
  rng = np.random.default_rng(50 + step)
  batch = {}
  for f, (t, kind, length, output) in SEQ_FEATURES.items():
    vocab, dim = SEQ_TABLES[t]
    samples = []
    for _ in range(B):
      if kind == "dense":
        positions = [0, 1, 2]
      elif kind == "sparse":
        positions = sorted(rng.choice(6, size=int(rng.integers(0, 5)), replace=False))
      else:
        positions = list(range(int(rng.integers(0, 6))))
      ids = (rng.zipf(1.3, size=len(positions)) * 5) % vocab
      samples.append([(int(p), int(i)) for p, i in zip(positions, ids)])
    if output == "sequence":
      shape = (B, length, dim)
    elif output == "ragged":
      shape = (sum(len(s) for s in samples), dim)
    else:
      shape = (B, dim)
    batch[f] = dict(samples=samples, target=rng.normal(size=shape).astype(np.float32))
  return batch


def _seq_replica_inputs(batch, replica, n):
  per = B // n
  inputs, targets = {}, {}
  for f, (_, kind, _, output) in SEQ_FEATURES.items():
    samples = batch[f]["samples"][replica * per:(replica + 1) * per]
    if kind == "dense":
      inputs[f] = tf.constant([[i for _, i in s] for s in samples], tf.int64)
    elif kind == "sparse":
      idx = [[b, p] for b, s in enumerate(samples) for p, _ in s]
      inputs[f] = tf.SparseTensor(tf.constant(idx, tf.int64) if idx else
                                  tf.zeros([0, 2], tf.int64),
                                  tf.constant([i for s in samples for _, i in s], tf.int64),
                                  [per, 6])
    else:
      inputs[f] = tf.RaggedTensor.from_row_lengths(
          tf.constant([i for s in samples for _, i in s], tf.int64),
          [len(s) for s in samples])
    target = batch[f]["target"]
    if output == "ragged":
      start = sum(len(s) for s in batch[f]["samples"][:replica * per])
      targets[f] = tf.constant(target[start:start + sum(len(s) for s in samples)])
    else:
      targets[f] = tf.constant(target[replica * per:(replica + 1) * per])
  return inputs, targets


def _seq_reference(configs, initial, batches, kind):
  tables = {n: np.array(v, np.float64) for n, v in initial.items()}
  opts = {n: h.numpy_optimizer(kind, t.shape) for n, t in tables.items()}
  first = None
  for batch in batches:
    outputs, grads = {}, {n: np.zeros_like(t) for n, t in tables.items()}
    touched = {n: set() for n in tables}
    for f, cfg in configs.items():
      t, table = cfg.table.name, tables[cfg.table.name]
      samples, target = batch[f]["samples"], batch[f]["target"]
      if cfg.output == "pooled":
        ids = [[i for _, i in s] for s in samples]
        out = h.oracles.combine(table, ids, None, cfg.table.combiner)
        grads[t] += h.oracles.combine_grad_dense(
            len(table), 2.0 * (out - target) / B, ids, None, cfg.table.combiner)
        used = [i for r in ids for i in r]
      elif cfg.output == "sequence":
        out, used = np.zeros(target.shape), []
        for b, s in enumerate(samples):
          for p, i in s:
            if p < cfg.max_sequence_length:
              out[b, p] = table[i]
              used.append(i)
              grads[t][i] += 2.0 * (out[b, p] - target[b, p]) / B
      else:
        used = [i for s in samples for _, i in s]
        out = table[used]
        for k, i in enumerate(used):
          grads[t][i] += 2.0 * (out[k] - target[k]) / B
      outputs[f] = out
      touched[t].update(used)
    first = first or outputs
    for n in tables:
      rows = sorted(touched[n])
      opts[n].apply(tables[n], rows, grads[n][rows])
  return first, tables


@pytest.mark.parametrize("num_replicas,kind", [(1, "adam"), (2, "sgd"), (4, "adagrad")])
def test_sequence_features_train_like_numpy(num_replicas, kind):
  strategy = mirrored(num_replicas)
  configs = _seq_configs(kind)
  with strategy.scope():
    lookup = h.sharded_lookup(configs)
  initial = {n: t.full_table() for n, t in lookup.tables.items()}

  @tf.function
  def step(inputs, targets):
    def replica_step(inputs, targets):
      with tf.GradientTape() as tape:
        outputs = lookup(inputs)
        loss = tf.add_n([
            tf.reduce_sum(tf.square((o.values if isinstance(o, tf.RaggedTensor) else o)
                                    - targets[f])) for f, o in outputs.items()]) / B
      tape.gradient(loss, lookup.trainable_variables)
      return {f: o.values if isinstance(o, tf.RaggedTensor) else o
              for f, o in outputs.items()}
    return strategy.run(replica_step, args=(inputs, targets))

  batches = [_seq_batch(s) for s in range(2)]
  first = None
  for batch in batches:
    per = [_seq_replica_inputs(batch, r, num_replicas) for r in range(num_replicas)]
    outputs = step(distribute(strategy, [p[0] for p in per]),
                   distribute(strategy, [p[1] for p in per]))
    if first is None:
      local = strategy.experimental_local_results(outputs)
      first = {f: np.concatenate([o[f].numpy() for o in local]) for f in SEQ_FEATURES}
  want_outputs, want_tables = _seq_reference(configs, initial, batches, kind)
  for f in SEQ_FEATURES:
    assert first[f].shape == want_outputs[f].shape, f
    np.testing.assert_allclose(first[f], want_outputs[f], rtol=1e-5, atol=1e-6,
                               err_msg=f)
  for n, t in lookup.tables.items():
    np.testing.assert_allclose(t.full_table(), want_tables[n], rtol=1e-5, atol=1e-6,
                               err_msg=n)
    # One update per step for the table, however many features share it.
    assert t.step_value() == 2


def test_keras_layer_and_serving_export_match_tpu_embedding(tmp_path):
  """The layer's sequence outputs equal TF's TPUEmbeddingForServing's (the
  peer, on CPU) for sparse (ids at their columns) and ragged inputs; a
  dense input is truncated and padded; the exported model gives the same."""
  table = tfde.layers.TableConfig(name="t", vocabulary_size=30, embedding_dim=3)
  features = {
      "sparse": tfde.layers.FeatureConfig(name="sparse", table=table,
                                          max_sequence_length=3),
      "ragged": tfde.layers.FeatureConfig(name="ragged", table=table,
                                          max_sequence_length=2),
      "dense": tfde.layers.FeatureConfig(name="dense", table=table,
                                         max_sequence_length=4),
      "values": tfde.layers.FeatureConfig(name="values", table=table, output="ragged"),
  }
  layer = tfde.layers.DistributedEmbedding(features)
  inputs = {
      "sparse": tf.SparseTensor([[0, 0], [0, 2], [1, 1], [1, 4]],
                                tf.constant([1, 2, 3, 4], tf.int64), [2, 5]),
      "ragged": tf.ragged.constant([[5, 6, 7], [8]], tf.int64),
      "dense": tf.constant([[9, 10, 11, 12, 13], [14, 15, 16, 17, 18]], tf.int64),
      "values": tf.ragged.constant([[19, 20], [], [21]], tf.int64),
  }
  out = layer(inputs)
  rows = layer.get_embedding_tables()["t"].numpy()
  tpu = tf.tpu.experimental.embedding
  tpu_table = tpu.TableConfig(vocabulary_size=30, dim=3,
                              initializer=tf.constant_initializer(rows))
  peer = tpu.TPUEmbeddingForServing(
      {f: tpu.FeatureConfig(table=tpu_table, max_sequence_length=features[f].max_sequence_length,
                            name=f) for f in ("sparse", "ragged")}, tpu.SGD(0.1))
  peer.build()
  want = peer({f: inputs[f] for f in ("sparse", "ragged")})
  for f in ("sparse", "ragged"):
    np.testing.assert_allclose(out[f].numpy(), want[f].numpy(), err_msg=f)
  # TPU serving refuses dense sequence inputs; truncation and padding by hand.
  np.testing.assert_allclose(out["dense"].numpy(), rows[[[9, 10, 11, 12], [14, 15, 16, 17]]])
  assert isinstance(out["values"], tf.RaggedTensor)
  np.testing.assert_allclose(out["values"].values.numpy(), rows[[19, 20, 21]])
  assert out["values"].row_lengths().numpy().tolist() == [2, 0, 1]
  # The exported model serves the same, with stock ops.
  tfde.export_for_serving(layer, str(tmp_path / "served"), inputs)
  loaded = tf.saved_model.load(str(tmp_path / "served"))
  served = loaded.serve(inputs)
  for f in features:
    got, expected = served[f], out[f]
    if f == "values":
      got, expected = got.values, expected.values
    np.testing.assert_allclose(got.numpy(), expected.numpy(), err_msg=f)
  # A sequence feature takes no weights (as on TPU), with a clear error.
  with pytest.raises(ValueError, match="feature ragged .table t.: weights are given "
                                       "but the feature is unpooled"):
    layer(inputs, weights={"ragged": tf.ragged.constant([[1.0, 1.0, 1.0], [1.0]])})
  # The config round-trips, output kinds included.
  clone = tfde.layers.DistributedEmbedding.from_config(layer.get_config())
  assert clone.get_config() == layer.get_config()


# ------------------------------------------------------------- string ids


def _fingerprint(s):
  """Fingerprint64 of a Python string as a signed int64, read here from
  tf.fingerprint's documented little-endian bytes."""
  raw = tf.fingerprint(tf.constant([s]), method="farmhash64").numpy()[0]
  return int.from_bytes(bytes(raw), "little", signed=True)


def test_string_keys_are_farmhash_fingerprint64():
  words = [f"user_{i}" for i in range(200)] + ["", "é" * 40, "a\x00b"]
  keys = tfde.inputs.string_keys(tf.constant(words)).numpy()
  assert keys.dtype == np.int64 and len(set(keys.tolist())) == len(words)
  assert keys.tolist() == [_fingerprint(w) for w in words]
  # The same Fingerprint64 TF's to_hash_bucket_fast takes modulo its buckets.
  buckets = tf.strings.to_hash_bucket_fast(tf.constant(words), 2**63 - 1).numpy()
  np.testing.assert_array_equal(keys.view(np.uint64) % np.uint64(2**63 - 1),
                                buckets.astype(np.uint64))
  assert (keys < 0).any()  # all 64 bits used
  ragged = tfde.inputs.string_keys(tf.constant([["a", "b"], ["c", "d"]]))
  assert ragged.shape == (2, 2)


@pytest.mark.parametrize("num_replicas", [1, 2, 4])
def test_string_ids_train_like_the_dict_oracle_and_serve(num_replicas, tmp_path):
  """A dynamic table fed tf.string ids (ragged, and sparse in a second
  feature) trains like the dict oracle keyed by their fingerprints, sharded
  over N; the exported model serves the same rows for the same strings.
  Static tables refuse strings, naming the feature and table."""
  strategy = mirrored(num_replicas)
  sgd = dict(learning_rate=0.5)
  config = tfde.TableConfig(name="words", vocabulary_size=None, embedding_dim=3,
                            combiner="sum", initializer="uniform",
                            optimizer=tfde.optimizers.SGD(**sgd))
  with strategy.scope():
    layer = tfde.layers.DistributedEmbedding(
        {"r": tfde.layers.FeatureConfig(name="r", table=config),
         "s": tfde.layers.FeatureConfig(name="s", table=config)})
  oracle = h.oracles.DynamicTableOracle(3, "sgd", sgd, init=("uniform", -0.05, 0.05))
  vocab = ["cat", "dog", "", "🐈 emoji", "x" * 100, "dog "]
  per = 8 // num_replicas

  @tf.function
  def step(inputs, targets):
    def replica_step(inputs, targets):
      with tf.GradientTape() as tape:
        out = layer(inputs)
        loss = tf.add_n([tf.reduce_sum(tf.square(out[f] - targets[f])) for f in out]) / 8
      tape.gradient(loss, layer.trainable_variables)
      return out
    return strategy.run(replica_step, args=(inputs, targets))

  for s in range(2):
    rng = np.random.default_rng(s)
    words = {f: [[vocab[i] for i in rng.integers(0, 6, size=int(rng.integers(0, 4)))]
                 for _ in range(8)] for f in ("r", "s")}
    targets = {f: rng.normal(size=(8, 3)).astype(np.float32) for f in words}

    def replica(r):
      rows = {f: words[f][r * per:(r + 1) * per] for f in words}
      idx = [[b, k] for b, row in enumerate(rows["s"]) for k in range(len(row))]
      sparse = tf.SparseTensor(tf.constant(idx, tf.int64) if idx else tf.zeros([0, 2], tf.int64),
                               tf.constant([w for row in rows["s"] for w in row], tf.string),
                               [per, 3])
      ragged = tf.RaggedTensor.from_row_lengths(
          tf.constant([w for row in rows["r"] for w in row], tf.string),
          [len(row) for row in rows["r"]])
      return ({"r": ragged, "s": sparse},
              {f: tf.constant(t[r * per:(r + 1) * per]) for f, t in targets.items()})

    parts = [replica(r) for r in range(num_replicas)]
    out = step(distribute(strategy, [p[0] for p in parts]),
               distribute(strategy, [p[1] for p in parts]))
    want = oracle.train_step([([[_fingerprint(w) for w in row] for row in words[f]],
                               None, "sum", targets[f], 1.0 / 8) for f in ("r", "s")])
    for f, w in zip(("r", "s"), want):
      got = np.concatenate([o[f].numpy() for o in strategy.experimental_local_results(out)])
      np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6, err_msg=f)
  rows = layer.tables["words"].export_rows()
  for key, row in zip(rows["ids"], rows["table"]):
    np.testing.assert_allclose(row, oracle.value(int(key)), rtol=1e-5, atol=1e-6)
  if num_replicas == 1:
    probe = {"r": tf.ragged.constant([["dog", "never seen"], []]),
             "s": tf.sparse.from_dense(tf.constant([["cat", ""], ["", "x" * 100]]))}
    tfde.export_for_serving(layer, str(tmp_path / "served"), probe)
    loaded = tf.saved_model.load(str(tmp_path / "served"))
    served = loaded.serve(probe)
    local = layer(probe, training=False)
    for f in probe:
      np.testing.assert_allclose(served[f].numpy(), local[f].numpy(), err_msg=f)
    np.testing.assert_allclose(served["r"].numpy()[0], oracle.value(_fingerprint("dog")) +
                               oracle.initial(_fingerprint("never seen")), rtol=1e-5)
    static = tfde.layers.DistributedEmbedding({"f": tfde.layers.FeatureConfig(
        name="f", table=tfde.layers.TableConfig(name="t", vocabulary_size=5,
                                                embedding_dim=2))})
    with pytest.raises(TypeError, match="feature f .table t.: string ids need a "
                                        "dynamic table"):
      static({"f": tf.constant([["a"]])})


def test_doors_pass_string_ids_through():
  """DeepRec's, SOK's and mxRec's doors look string ids up by their
  fingerprints: fresh rows are the documented initial rows of those keys."""
  import keras

  from tfde.compat import mxrec
  from tfde.compat import sok
  words = [["cat", "dog"], ["dog"], [""]]
  idx = [[b, k] for b, r in enumerate(words) for k in range(len(r))]
  sparse = tf.SparseTensor(tf.constant(idx, tf.int64),
                           tf.constant([w for r in words for w in r]), [3, 2])

  def initial(table, combiner):
    rows = [[h.oracles.dynamic_initial_row(_fingerprint(w), 3, "uniform", -0.5, 0.5,
                                           table.config.seed) for w in r] for r in words]
    return np.array([np.sum(r, 0) / (len(r) if combiner == "mean" else 1) for r in rows])

  config = tfde.TableConfig(name="deeprec_words", vocabulary_size=None, embedding_dim=3,
                            combiner="sum",
                            initializer=keras.initializers.RandomUniform(-0.5, 0.5))
  deeprec_table = tfde.tables.DynamicTable(config)
  out = tfde.nn.group_embedding_lookup_sparse([deeprec_table], [sparse], ["sum"])[0]
  np.testing.assert_allclose(out.numpy(), initial(deeprec_table, "sum"), rtol=1e-6)

  sok.init()
  dv = sok.DynamicVariable(dimension=3, key_type=tf.string,
                           initializer=keras.initializers.RandomUniform(-0.5, 0.5))
  out = sok.lookup_sparse([dv], [sparse], combiners=["mean"])[0]
  np.testing.assert_allclose(out.numpy(), initial(sok._table_of(dv), "mean"), rtol=1e-6)  # pylint: disable=protected-access

  mxrec.init(use_dynamic_expansion=True)
  table = mxrec.create_table(
      key_dtype=tf.string, dim=3, name="mxrec_words",
      emb_initializer=tf.random_uniform_initializer(-0.5, 0.5),
      optimizer_list=[mxrec.lazy_adam.create_hash_optimizer_by_addr(learning_rate=0.1)])
  out = mxrec.sparse_lookup(table, tf.constant([["cat", "dog"], ["", "dog"]]), is_train=False)
  want = [[h.oracles.dynamic_initial_row(_fingerprint(w), 3, "uniform", -0.5, 0.5,
                                         table.table.config.seed) for w in r]
          for r in (["cat", "dog"], ["", "dog"])]
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)


# ------------------------------------------------- reduced-precision rows


def test_stochastic_rounding_is_unbiased_and_reproducible():
  """4000 identical bfloat16 rows, 20 SGD steps of a constant gradient too
  small for round-to-nearest to move them: each element walks by
  stochastic rounding, and their mean is the float32 result within the
  bound of the rounding's noise; the same seed gives the same table."""
  def run(seed, dtype="bfloat16", steps=20):
    config = tfde.TableConfig(name=f"r{seed}{dtype}", vocabulary_size=4000,
                              embedding_dim=8, dtype=dtype, seed=seed,
                              optimizer=tfde.optimizers.SGD(learning_rate=0.01))
    table = tfde.tables.ShardedTable(config)
    table.load_state({"table": np.ones((4000, 8), np.float32), "step": np.asarray(0, np.int64)})
    rows = tf.range(4000)
    for _ in range(steps):
      table.apply_gradient(0, rows, tf.fill([4000, 8], 0.1))
    return table.full_table().astype(np.float64)
  got = run(1)
  exact = 1.0 - 20 * 0.01 * 0.1  # float32 numpy: 0.98
  assert tf.cast(tf.cast(1.0 - 0.001, tf.bfloat16), tf.float32).numpy() == 1.0  # nearest stalls
  ulp = 2.0**-8  # bfloat16 spacing in [0.5, 1)
  # Each step adds noise of variance <= ulp^2 / 4 per element.
  bound = 5 * np.sqrt(20 * ulp**2 / 4 / got.size)
  assert abs(got.mean() - exact) < bound, (got.mean(), exact, bound)
  assert got.std() > ulp / 4  # really random per element
  # Each step moves an element by 0 or 1 spacing (0.001 < ulp).
  assert set(np.unique(got)) <= {1.0 - k * ulp for k in range(21)}
  np.testing.assert_array_equal(run(1), got)  # reproducible
  assert (run(2) != got).any()  # the seed matters
  half = run(1, "float16")
  assert abs(half.mean() - exact) < 5 * np.sqrt(20 * (2.0**-11)**2 / 4 / half.size)


@pytest.mark.parametrize("kind", ["adam", "rowwise_adagrad"])
def test_reduced_precision_tables_sharded_forward_and_update(kind):
  """bfloat16 and float16 tables under N = 1, 2, 4: lookups equal numpy
  combines of the stored rows in float32; after a step each updated
  element is one of the two neighbours of the float32 numpy update (slots
  float32 and exact), and the rounding is the same for every N."""
  results = []
  for n in (1, 2, 4):
    strategy = mirrored(n)
    configs = {}
    for dtype, name, combiner in (("bfloat16", "b", "mean"), ("float16", "h", "sqrtn")):
      table = tfde.TableConfig(name=name, vocabulary_size=29, embedding_dim=4,
                               dtype=dtype, combiner=combiner, seed=5,
                               optimizer=h.sparse_optimizer(kind))
      configs[name] = tfde.FeatureConfig(name=name, table=table)
    with strategy.scope():
      lookup = h.sharded_lookup(configs)
    initial = {k: t.full_table().astype(np.float64) for k, t in lookup.tables.items()}
    rng = np.random.default_rng(0)
    ids = {k: [[int(x) for x in rng.integers(0, 29, size=3)] for _ in range(8)]
           for k in configs}
    weights = {k: [[float(x) for x in rng.uniform(0.5, 2, size=3)] for _ in range(8)]
               for k in configs}
    target = {k: rng.normal(size=(8, 4)).astype(np.float32) for k in configs}
    per = 8 // n

    @tf.function
    def step(inputs, w, t):
      def replica_step(inputs, w, t):
        with tf.GradientTape() as tape:
          out = lookup(inputs, w)
          loss = tf.add_n([tf.reduce_sum(tf.square(out[k] - t[k])) for k in out]) / 8
        tape.gradient(loss, lookup.trainable_variables)
        return out
      return strategy.run(replica_step, args=(inputs, w, t))

    def part(data, r, dtype):
      return {k: tf.constant(v[r * per:(r + 1) * per], dtype) for k, v in data.items()}
    out = step(distribute(strategy, [part(ids, r, tf.int64) for r in range(n)]),
               distribute(strategy, [part(weights, r, tf.float32) for r in range(n)]),
               distribute(strategy, [part(target, r, tf.float32) for r in range(n)]))
    final = {}
    for k, cfg in configs.items():
      got = np.concatenate([o[k].numpy() for o in strategy.experimental_local_results(out)])
      assert got.dtype == np.float32
      want = h.oracles.combine(initial[k], ids[k], weights[k], cfg.table.combiner)
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=k)
      grad = h.oracles.combine_grad_dense(29, 2.0 * (want - target[k]) / 8, ids[k],
                                          weights[k], cfg.table.combiner)
      rows = sorted({i for r in ids[k] for i in r})
      reference = np.array(initial[k])
      optimizer = h.numpy_optimizer(kind, reference.shape)
      optimizer.apply(reference, rows, grad[rows])
      table = lookup.tables[k]
      final[k] = table.full_table().astype(np.float64)
      assert table.shards[min(table.shards)].dtype == cfg.table.dtype
      # Within one spacing of the type around the exact value: one of its
      # two neighbours.
      spacing = 2.0 ** (np.floor(np.log2(np.abs(reference) + 1e-30)) -
                        {"bfloat16": 7, "float16": 10}[cfg.table.dtype])
      assert (np.abs(final[k] - reference) <= spacing * 1.0001).all(), k
      untouched = sorted(set(range(29)) - set(rows))
      np.testing.assert_array_equal(final[k][untouched], initial[k][untouched])
      # Slots stay float32 and follow the float32 gradient exactly: they
      # equal the numpy optimizer's slots.
      for slot, expected in zip(table.optimizer.slot_names, optimizer.slots):
        got_slot = table.full_slot(slot)
        assert got_slot.dtype == np.float32
        np.testing.assert_allclose(got_slot, expected, rtol=1e-5, atol=1e-7,
                                   err_msg=f"{k} {slot}")
    results.append(final)
  for other in results[1:]:
    for k in other:
      np.testing.assert_array_equal(other[k], results[0][k])


def test_reduced_precision_checkpoints_keras_policy_and_serving(tmp_path):
  """Checkpoints keep bfloat16 rows as bfloat16 and restore into a float32
  table of the same config exactly, and back (rounded to nearest); Keras
  weight files too; a "mixed_bfloat16" layer returns bfloat16; the
  exported model serves the stored rows combined in float32."""
  import keras

  def layer(dtype, policy=None, name="t"):
    table = tfde.layers.TableConfig(name=name, vocabulary_size=50, embedding_dim=4,
                                    dtype=dtype, optimizer="adagrad", combiner="mean")
    return tfde.layers.DistributedEmbedding(
        {"f": tfde.layers.FeatureConfig(name="f", table=table)}, dtype=policy)

  half = layer("bfloat16", "mixed_bfloat16")
  ids = tf.ragged.constant([[1, 2, 2], [], [49]], tf.int64)

  def combined(rows):  # numpy, in float32, of the stored rows
    rows = rows.astype(np.float32)
    return np.stack([rows[[1, 2, 2]].mean(0), np.zeros(4), rows[49]])

  initial = half.tables["t"].full_table()
  with tf.GradientTape() as tape:
    out = half({"f": ids})["f"]
    loss = tf.reduce_sum(tf.cast(out, tf.float32))
  tape.gradient(loss, half.trainable_variables)  # trains the slots too
  assert out.dtype == tf.bfloat16
  rows = half.tables["t"].full_table()
  assert rows.dtype == tf.bfloat16.as_numpy_dtype
  assert (rows != initial).any()
  # Combined in float32, then rounded once to the policy's bfloat16.
  np.testing.assert_allclose(out.numpy().astype(np.float32), combined(initial),
                             rtol=2.0**-8)

  path = tf.train.Checkpoint(layer=half).write(str(tmp_path / "ckpt"))
  saved = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
  table_key = next(k for k in saved if k.endswith("/t/.ATTRIBUTES/table"))
  assert saved[table_key] == tf.bfloat16
  full = layer("float32")
  tfde.checkpoint.restore_tables(full.tables, path)
  np.testing.assert_array_equal(full.tables["t"].full_table(), rows.astype(np.float32))
  np.testing.assert_array_equal(full.tables["t"].full_slot("accumulator"),
                                half.tables["t"].full_slot("accumulator"))
  assert full.tables["t"].step_value() == 1
  # And back: float32 rows into bfloat16, rounded to nearest.
  full.tables["t"].load_state(dict(full.tables["t"].state(),
                                   table=tf.fill([50, 4], 1.0 + 2.0**-10)))
  path = tf.train.Checkpoint(layer=full).write(str(tmp_path / "ckpt32"))
  back = layer("bfloat16")
  tfde.checkpoint.restore_tables(back.tables, path)
  assert (back.tables["t"].full_table() == 1.0).all()
  # Keras weight files.
  class Model(keras.Model):
    def __init__(self, embedding):
      super().__init__()
      self.embedding = embedding

    def call(self, inputs):
      return self.embedding(inputs)

  model = Model(half)
  model({"f": ids})  # builds it (a forward pass changes no row)
  model.save_weights(str(tmp_path / "w.weights.h5"))
  again = layer("bfloat16")
  model = Model(again)
  model({"f": ids})
  model.load_weights(str(tmp_path / "w.weights.h5"))
  np.testing.assert_array_equal(again.tables["t"].full_table(), rows)
  # Serving: stock ops, float32 combine of the stored rows, policy kept.
  tfde.export_for_serving(half, str(tmp_path / "served"), {"f": ids})
  loaded = tf.saved_model.load(str(tmp_path / "served"))
  served = loaded.serve({"f": ids})["f"]
  assert served.dtype == tf.bfloat16
  np.testing.assert_allclose(served.numpy().astype(np.float32), combined(rows),
                             rtol=2.0**-8)


def test_deeprec_door_weights_gradients_for_plain_and_tfde_tables():
  """tfde.nn.group_embedding_lookup_sparse differentiates sp_weights as
  tf.nn.embedding_lookup_sparse does, for plain variables and tfde tables."""
  rng = np.random.default_rng(4)
  plain = tf.Variable(rng.normal(size=(12, 3)).astype(np.float32))
  config = tfde.TableConfig(name="deeprec_w", vocabulary_size=12, embedding_dim=3,
                            combiner="sqrtn", optimizer=tfde.optimizers.SGD(learning_rate=0.1))
  table = tfde.tables.ShardedTable(config)
  rows = tf.constant(table.full_table())
  ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0], [2, 0], [2, 2]],
                        tf.constant([3, 5, 3, 11, 0], tf.int64), [3, 3])
  w = tf.constant([0.5, 2.0, 1.5, 0.3, 1.1])
  target = tf.constant(rng.normal(size=(3, 3)).astype(np.float32))
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(w)
    weights = tf.SparseTensor(ids.indices, w, ids.dense_shape)
    out = tfde.nn.group_embedding_lookup_sparse([plain, table], [ids, ids],
                                                ["mean", "sqrtn"], sp_weights=[weights, weights])
    loss = tf.reduce_sum(tf.square(out[0] - target)) + tf.reduce_sum(out[1] * target)
    want = [tf.nn.embedding_lookup_sparse(plain, ids, weights, combiner="mean"),
            tf.nn.embedding_lookup_sparse(rows, ids, weights, combiner="sqrtn")]
    want_loss = tf.reduce_sum(tf.square(want[0] - target)) + tf.reduce_sum(want[1] * target)
  got = tape.gradient(loss, w)
  np.testing.assert_allclose(got.numpy(), tape.gradient(want_loss, w).numpy(),
                             rtol=1e-5, atol=1e-6)
  assert np.abs(got.numpy()).max() > 1e-2


def test_mismatched_weights_are_refused_inside_tf_function():
  """The weights' structure check holds in a traced function too (a cast
  of float32 weights to float32 used to leave the guard nothing to hold)."""
  table = tfde.TableConfig(name="t", vocabulary_size=10, embedding_dim=2)
  lookup = tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=table)})

  @tf.function
  def run(ids, weights):
    return lookup({"f": ids}, {"f": weights})["f"]

  ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="weights do not have the same row lengths as the ids"):
    run(ids, tf.ragged.constant([[1.0], [1.0, 2.0]]))
  sparse = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 2], tf.int64), [2, 2])
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="weights do not have the same indices as the ids"):
    run(sparse, tf.SparseTensor([[0, 0], [1, 1]], [1.0, 2.0], [2, 2]))


@pytest.mark.parametrize("traced", [False, True])
def test_weights_of_another_batch_or_length_name_the_feature(traced):
  """Weights with another number of samples (ragged) or of ids (sparse)
  than the ids get the check's own error, naming the feature and table,
  eagerly and traced with static or unknown shapes; never a bare shape
  error from comparing them."""
  table = tfde.TableConfig(name="t", vocabulary_size=10, embedding_dim=2)
  lookup = tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=table)})

  def run(ids, weights):
    return lookup({"f": ids}, {"f": weights})["f"]

  ids = tf.ragged.constant([[1, 2], [3], [4]], tf.int64)
  sparse = tf.SparseTensor([[0, 0], [1, 0], [1, 1]], tf.constant([1, 2, 3], tf.int64), [2, 2])
  cases = [(ids, tf.ragged.constant([[1.0, 2.0], [3.0]]), "the same row lengths"),
           (sparse, tf.SparseTensor([[0, 0], [1, 1]], [1.0, 2.0], [2, 2]), "the same indices")]
  for given, weights, what in cases:
    calls = [run]
    if traced:  # with the shapes known when traced, and unknown
      unknown = [tf.RaggedTensorSpec([None, None], x.dtype, ragged_rank=1)
                 if isinstance(x, tf.RaggedTensor) else tf.SparseTensorSpec([None, 2], x.dtype)
                 for x in (given, weights)]
      calls = [tf.function(run), tf.function(run, input_signature=unknown)]
    for call in calls:
      with pytest.raises(tf.errors.InvalidArgumentError,
                         match=rf"feature f \(table t\): weights do not have {what} as the ids"):
        call(given, weights)
