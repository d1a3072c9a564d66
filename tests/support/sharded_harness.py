"""A sharded training run and its unsharded numpy reference.

Shared by the in-process tests (MirroredStrategy over logical CPUs) and the
multi-process workers (MultiWorkerMirroredStrategy, Horovod), so every
path is held to the same oracle: numpy loops over the global batch
(tests/support/oracles.py), never tfde's own code.

Three tables, two of width 4 (fused into one exchange) and one of width 3,
and five features of every input kind; two pairs of features share a
table. Each table's combiner rotates with `variant`.
"""

import numpy as np
import tensorflow as tf

import tfde
from tests.support import oracles

GLOBAL_BATCH = 16
TABLES = {"A": (37, 4), "B": (50, 4), "C": (23, 3)}
FEATURES = {  # name: (table, input kind)
    "a_dense": ("A", "dense"),
    "a_ragged": ("A", "ragged"),
    "b_sparse": ("B", "sparse"),
    "b_ragged": ("B", "ragged"),
    "c_single": ("C", "dense1"),
}
COMBINERS = ("sum", "mean", "sqrtn")
HYPER = {
    "sgd": dict(learning_rate=0.5),
    "adagrad": dict(learning_rate=0.3, initial_accumulator_value=0.1, epsilon=1e-7),
    "rowwise_adagrad": dict(learning_rate=0.3, initial_accumulator_value=0.1,
                            epsilon=1e-8),
    "adam": dict(learning_rate=0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-7),
    "ftrl": dict(learning_rate=0.2, learning_rate_power=-0.5,
                 initial_accumulator_value=0.1, l1_regularization_strength=0.001,
                 l2_regularization_strength=0.01,
                 l2_shrinkage_regularization_strength=0.002, beta=0.1),
}


def variant_of(kind):
  """The harness variant (combiners, seeds) a test runs `kind` with."""
  return ["sgd", "adagrad", "adam", "ftrl", "rowwise_adagrad"].index(kind)


def sparse_optimizer(kind):
  cls = {"sgd": tfde.optimizers.SGD, "adagrad": tfde.optimizers.Adagrad,
         "rowwise_adagrad": tfde.optimizers.RowwiseAdagrad,
         "adam": tfde.optimizers.Adam, "ftrl": tfde.optimizers.Ftrl}[kind]
  return cls(**HYPER[kind])


def numpy_optimizer(kind, shape):
  hp = dict(HYPER[kind])
  if kind == "ftrl":
    hp = dict(learning_rate=hp["learning_rate"],
              learning_rate_power=hp["learning_rate_power"],
              initial_accumulator_value=hp["initial_accumulator_value"],
              l1=hp["l1_regularization_strength"],
              l2=hp["l2_regularization_strength"],
              l2_shrinkage=hp["l2_shrinkage_regularization_strength"],
              beta=hp["beta"])
  return oracles.NumpyOptimizer(kind, shape, **hp)


def layouts(name, n):
  """A plan (table name -> TableLayout) for the harness's tables A (37 x 4),
  B (50 x 4) and C (23 x 3) on n replicas."""
  last = n - 1
  L = tfde.planner.TableLayout
  return {
      # A and B fused in one exchange with different owners, C row-wise.
      "table_wise": {"A": L("table_wise", [last]), "B": L("table_wise", [0]),
                     "C": L("row_wise", list(range(n)))},
      # A in two slices of width 2, C in slices of 1 and 2 (one joins A's
      # width-2 slices in an exchange), B row-wise.
      "column_wise": {"A": L("column_wise", [0, last], [2, 2]),
                      "B": L("row_wise", list(range(n))),
                      "C": L("column_wise", [last, 0], [1, 2])},
      # A's rows over the upper half of the replicas (a worker's), fused
      # with B whole on replica 0; C's rows over the last and the first.
      "table_row_wise": {"A": L("table_row_wise", list(range(n // 2, n)) or [0]),
                         "B": L("table_wise", [0]),
                         "C": L("table_row_wise", [last, 0] if n > 1 else [0])},
      "mixed": {"A": L("replicated", list(range(n))),
                "B": L("table_wise", [1 % n]),
                "C": L("column_wise", [0, last, 1 % n], [1, 1, 1])},
  }[name]


def sharded_lookup(feature_configs, **kwargs):
  """A ShardedLookup that shards every "auto" table, however small: the
  harness's tables are tiny, and sharding them is what the suite tests
  (placement's default would replicate them; tests/unit/test_layers.py and
  tfde.placement's doctest cover the default)."""
  return tfde.lookup.ShardedLookup(feature_configs, auto_replicate_bytes=0, **kwargs)


def feature_configs(optimizer_kind, variant=0, placements=None):
  """`placements` maps table names to a placement (default "auto", which
  `sharded_lookup` shards)."""
  placements = placements or {}
  tables = {}
  for i, (name, (vocab, dim)) in enumerate(sorted(TABLES.items())):
    tables[name] = tfde.TableConfig(
        name=name, vocabulary_size=vocab, embedding_dim=dim,
        optimizer=sparse_optimizer(optimizer_kind),
        combiner=COMBINERS[(i + variant) % 3], seed=11 + i,
        initializer="uniform" if name == "C" else None,
        placement=placements.get(name, "auto"))
  return {f: tfde.FeatureConfig(name=f, table=tables[t])
          for f, (t, _) in FEATURES.items()}


def make_batch(step, weighted, seed=0, empty_replica=None, num_replicas=1):
  """Global batch: ids and weights per sample, and regression targets.

  `empty_replica` empties every ragged and sparse sample of that replica's
  slice, so it sends no ids of those features at all.
  """
  rng = np.random.default_rng(1000 * seed + step)
  per = GLOBAL_BATCH // num_replicas
  batch = {}
  for name, (table, kind) in FEATURES.items():
    vocab, dim = TABLES[table]
    ids, weights = [], []
    for b in range(GLOBAL_BATCH):
      if kind == "dense":
        k = 3
      elif kind == "dense1":
        k = 1
      else:
        k = int(rng.integers(0, 5))
        if empty_replica is not None and b // per == empty_replica:
          k = 0
      # A skewed id distribution, so ids repeat inside and across replicas.
      row = (rng.zipf(1.3, size=k) * 7 + rng.integers(0, 3, size=k)) % vocab
      ids.append([int(x) for x in row])
      weights.append([float(w) for w in rng.uniform(0.2, 2.0, size=k)])
    batch[name] = dict(ids=ids, weights=weights if weighted else None,
                       target=rng.normal(size=(GLOBAL_BATCH, dim)).astype(np.float32))
  return batch


def replica_bounds(num_replicas, uneven=False):
  """Where each replica's slice of the global batch starts, and the end:
  equal slices, or (`uneven`) slices growing as 1 : 2 : ... : N, as a last
  partial batch can leave them."""
  if not uneven:
    return [r * (GLOBAL_BATCH // num_replicas) for r in range(num_replicas + 1)]
  total = num_replicas * (num_replicas + 1) // 2
  return [round(GLOBAL_BATCH * (r * (r + 1) // 2) / total)
          for r in range(num_replicas + 1)]


def replica_inputs(batch, replica, num_replicas, bounds=None):
  """tf inputs, weights and targets of one replica's slice (`bounds`: the
  slices', `replica_bounds`; equal slices when None)."""
  bounds = bounds or replica_bounds(num_replicas)
  lo, hi = bounds[replica], bounds[replica + 1]
  inputs, weights, targets = {}, {}, {}
  for name, (_, kind) in FEATURES.items():
    ids = batch[name]["ids"][lo:hi]
    ws = batch[name]["weights"]
    ws = None if ws is None else ws[lo:hi]
    if kind == "dense":
      inputs[name] = tf.constant(ids, tf.int64)
      w = None if ws is None else tf.constant(ws, tf.float32)
    elif kind == "dense1":
      inputs[name] = tf.constant([r[0] for r in ids], tf.int32)
      w = None if ws is None else tf.constant([r[0] for r in ws], tf.float32)
    elif kind == "ragged":
      # Built valid, so unchecked: the ragged constructors' checks are
      # eager ops, a fifth of a 4-replica case's time in tests/unit/test_sharded.py.
      lengths = np.array([len(r) for r in ids], np.int64)
      inputs[name] = tf.RaggedTensor.from_row_lengths(
          np.array([x for r in ids for x in r], np.int64), lengths, validate=False)
      w = None
      if ws is not None:
        w = tf.RaggedTensor.from_row_splits(
            np.array([x for r in ws for x in r], np.float32),
            inputs[name].row_splits, validate=False)
    else:  # sparse [batch, 4]
      idx = [[b, k] for b, r in enumerate(ids) for k in range(len(r))]
      vals = [x for r in ids for x in r]
      shape = [len(ids), 4]
      idx_t = tf.constant(idx, tf.int64) if idx else tf.zeros([0, 2], tf.int64)
      inputs[name] = tf.SparseTensor(idx_t, tf.constant(vals, tf.int64), shape)
      w = None
      if ws is not None:
        w = tf.SparseTensor(idx_t, tf.constant([x for r in ws for x in r],
                                               tf.float32), shape)
    if w is not None:
      weights[name] = w
    targets[name] = tf.constant(batch[name]["target"][lo:hi])
  return inputs, (weights or None), targets


def replica_loss(outputs, targets):
  """Sum of squared errors over the replica's samples / global batch, so
  gradients summed over replicas are those of the global mean loss."""
  return tf.add_n([tf.reduce_sum(tf.square(outputs[f] - targets[f]))
                   for f in FEATURES]) / GLOBAL_BATCH


def reference_run(configs, initial_tables, batches):
  """Numpy: outputs of the first batch and tables after all batches."""
  tables = {n: np.array(v, np.float64) for n, v in initial_tables.items()}
  kind = next(iter(configs.values())).table.optimizer_config()["kind"]
  opts = {n: numpy_optimizer(kind, t.shape) for n, t in tables.items()}
  first_outputs = None
  for batch in batches:
    outputs, grads = {}, {n: np.zeros_like(t) for n, t in tables.items()}
    touched = {n: set() for n in tables}
    for f, cfg in configs.items():
      t = cfg.table.name
      ids, ws = batch[f]["ids"], batch[f]["weights"]
      out = oracles.combine(tables[t], ids, ws, cfg.table.combiner)
      outputs[f] = out
      d_out = 2.0 * (out - batch[f]["target"]) / GLOBAL_BATCH
      grads[t] += oracles.combine_grad_dense(tables[t].shape[0], d_out, ids, ws,
                                             cfg.table.combiner)
      touched[t].update(i for r in ids for i in r)
    if first_outputs is None:
      first_outputs = outputs
    for n in tables:
      rows = sorted(touched[n])
      opts[n].apply(tables[n], rows, grads[n][rows])
  return first_outputs, tables


def table_states(lookup):
  """Every table's whole state (rows, slots and step; a dynamic table's ids,
  counts and pending sightings too) as numpy, by table name."""
  return {name: {k: v.numpy() for k, v in t.state().items()}
          for name, t in lookup.tables.items()}


def assert_states_unchanged(before, lookup):
  """`lookup`'s tables hold `before` (`table_states`) exactly."""
  after = table_states(lookup)
  for name in before:
    for key in before[name]:
      np.testing.assert_array_equal(after[name][key], before[name][key],
                                    err_msg=f"table {name}: {key} changed")
