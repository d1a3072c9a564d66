"""One estimator ranking model over tfde tables, and its numpy oracle.

The model: a static table "user" (Adagrad, two ids a sample, summed) whose
output times a dense vector `w` (trained by a tf.compat.v1 Adagrad) scores
a sample against a label `y`; and a dynamic table "item" (lazy Adam,
admission after 2 sightings, eviction after 3 unseen steps) whose output is
pulled to a per-sample target. Loss = mean((user @ w - y)^2) +
sum((item - target)^2) / B. The oracle trains the same steps in numpy.
"""

import numpy as np
import tensorflow as tf

import tfde
from tests.support import oracles
from tests.support import sharded_harness as h

VOCAB, DIM, BATCH = 16, 4, 6
DENSE_LR, DENSE_ACC = 0.1, 0.1
DYNAMIC = dict(admit_after=2, evict_after_steps=3)


def initial_values():
  rng = np.random.default_rng(7)
  return (rng.uniform(-0.5, 0.5, (VOCAB, DIM)).astype(np.float32),
          rng.uniform(-0.5, 0.5, DIM).astype(np.float32))


def batch(step):
  rng = np.random.default_rng(100 + step)
  return dict(user=rng.integers(0, VOCAB, (BATCH, 2)).astype(np.int64),
              item=(rng.zipf(1.6, (BATCH, 1)) * 7919 - 2**40).astype(np.int64),
              y=rng.normal(size=BATCH).astype(np.float32),
              target=rng.normal(size=(BATCH, DIM)).astype(np.float32))


def input_fn(first_step, steps, rank=0, ranks=1):
  """Batches first_step .. first_step + steps - 1, in order; of each, rank
  `rank`'s share of `ranks` (samples rank * B / ranks onwards)."""
  per = BATCH // ranks
  batches = [{k: v[rank * per:(rank + 1) * per] for k, v in batch(s).items()}
             for s in range(first_step, first_step + steps)]
  def make():
    stacked = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    ds = tf.data.Dataset.from_tensor_slices(
        ({"user": stacked["user"], "item": stacked["item"]},
         {"y": stacked["y"], "target": stacked["target"]}))
    return ds.batch(per, drop_remainder=True)
  return make


def table_configs():
  table0, _ = initial_values()
  user = tfde.TableConfig(name="user", vocabulary_size=VOCAB, embedding_dim=DIM,
                          optimizer=h.sparse_optimizer("adagrad"), combiner="sum",
                          initializer=table0)
  item = tfde.TableConfig(name="item", vocabulary_size=None, embedding_dim=DIM,
                          optimizer=h.sparse_optimizer("adam"), combiner="sum",
                          initializer="uniform", dynamic=tfde.DynamicConfig(**DYNAMIC))
  return user, item


def model_fn(features, labels, mode, params=None):
  """Looks features up through tfde; train_op from a tf.compat.v1 optimizer's
  minimize(loss, global_step). PREDICT (serving) reads the static table
  only, on the pure-TF twins, so the export needs no tfde. With
  params={"horovod": True} each Horovod rank trains on its share of the
  global batch (`loss_and_train_op`)."""
  horovod = bool((params or {}).get("horovod"))
  user, _ = table_configs()
  _, w0 = initial_values()
  w = tf.compat.v1.get_variable("w", initializer=tf.constant(w0))
  if mode == tf.estimator.ModeKeys.PREDICT:
    with tfde.ops.backend("reference"):
      lookup = tfde.lookup.ShardedLookup([tfde.FeatureConfig(name="user", table=user)],
                                         auto_replicate_bytes=0)
      emb = lookup({"user": features["user"]}, training=False)["user"]
    score = tf.linalg.matvec(emb, w)
    return tf.estimator.EstimatorSpec(
        mode, predictions={"score": score},
        export_outputs={"serving_default": tf.estimator.export.PredictOutput(
            {"score": score})})
  training = mode == tf.estimator.ModeKeys.TRAIN
  loss, train_op = loss_and_train_op(features, labels, w, training, horovod)
  if not training:
    return tf.estimator.EstimatorSpec(mode, loss=loss)
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def loss_and_train_op(features, labels, w=None, training=True, horovod=False):
  """The training graph (a TF1 graph; no estimator needed): the loss, and
  a tf.compat.v1 Adagrad's minimize(loss, global_step) (None when not
  training).

  The loss sums over the samples here and divides by the global batch
  (BATCH), so with `horovod` each rank's loss is its share of the global
  one: the tables sum the ranks' gradients at their owners, and
  `hvd.DistributedOptimizer(op=hvd.Sum)` sums the dense ones."""
  user, item = table_configs()
  if w is None:
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(initial_values()[1]))
  lookup = tfde.lookup.ShardedLookup([tfde.FeatureConfig(name="user", table=user),
                                      tfde.FeatureConfig(name="item", table=item)],
                                     auto_replicate_bytes=0)
  out = lookup(features, training=training)
  score = tf.linalg.matvec(out["user"], w)
  loss = (tf.reduce_sum(tf.square(score - labels["y"])) +
          tf.reduce_sum(tf.square(out["item"] - labels["target"]))) / BATCH
  if not training:
    return loss, None
  optimizer = tf.compat.v1.train.AdagradOptimizer(
      DENSE_LR, initial_accumulator_value=DENSE_ACC)
  if horovod:
    import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
    optimizer = hvd.DistributedOptimizer(optimizer, op=hvd.Sum)
  return loss, optimizer.minimize(loss, tf.compat.v1.train.get_global_step())


class Oracle:
  """The model in numpy: `train(step)` is one step on batch(step)."""

  def __init__(self):
    self.table, self.w = (x.astype(np.float64) for x in initial_values())
    self.w_acc = np.full(DIM, DENSE_ACC)
    self.user_opt = h.numpy_optimizer("adagrad", (VOCAB, DIM))
    self.item = oracles.DynamicTableOracle(
        DIM, "adam", h.numpy_optimizer("adam", (1, DIM)).hp,
        init=("uniform", -0.05, 0.05), **{
            "admit_after": DYNAMIC["admit_after"],
            "evict_after_steps": DYNAMIC["evict_after_steps"]})

  def scores(self, user_ids):
    return self.table[user_ids].sum(1) @ self.w

  def loss(self, b):
    item = self.item.lookup([int(k) for k in b["item"][:, 0]]).reshape(BATCH, DIM)
    return (np.mean((self.scores(b["user"]) - b["y"]) ** 2) +
            np.sum((item - b["target"]) ** 2) / BATCH)

  def train(self, step):
    b = batch(step)
    emb = self.table[b["user"]].sum(1)
    dscore = 2.0 * (emb @ self.w - b["y"]) / BATCH
    dw = emb.T @ dscore
    demb = np.outer(dscore, self.w)
    grads = {}
    for sample, ids in enumerate(b["user"]):
      for i in ids:
        grads[i] = grads.get(i, 0.0) + demb[sample]
    rows = sorted(grads)
    self.user_opt.apply(self.table, rows, [grads[r] for r in rows])
    self.w_acc += dw * dw
    self.w = self.w - DENSE_LR * dw / np.sqrt(self.w_acc)
    self.item.train_step([([[int(k) for k in r] for r in b["item"]], None, "sum",
                            b["target"], 1.0 / BATCH)])


def checkpoint_tables(path):
  """The whole tables a checkpoint holds (tfde_tables/<table>/<key>)."""
  reader = tf.train.load_checkpoint(path)
  prefix = tfde.tables.graph_saving.PREFIX
  out = {}
  for key in reader.get_variable_to_shape_map():
    if key.startswith(prefix):
      table, field = key[len(prefix):].split("/", 1)
      out.setdefault(table, {})[field] = reader.get_tensor(key)
  return out


def assert_tables_equal_oracle(tables, oracle, steps):
  np.testing.assert_allclose(tables["user"]["table"], oracle.table, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(tables["user"]["slot_accumulator"], oracle.user_opt.slots[0],
                             rtol=1e-5, atol=1e-6)
  assert int(tables["user"]["step"]) == steps
  item, ids = tables["item"], sorted(oracle.item.rows)
  np.testing.assert_array_equal(item["ids"], ids)
  np.testing.assert_allclose(item["table"], [oracle.item.rows[k]["w"] for k in ids],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(item["slot_m"], [oracle.item.rows[k]["slots"][0] for k in ids],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(item["counts"], [oracle.item.rows[k]["count"] for k in ids])
  np.testing.assert_array_equal(item["last_seen"], [oracle.item.rows[k]["last"] for k in ids])
  np.testing.assert_array_equal(item["pending_ids"], sorted(oracle.item.pending))
  np.testing.assert_array_equal(item["pending_counts"],
                                [oracle.item.pending[k][0] for k in sorted(oracle.item.pending)])
