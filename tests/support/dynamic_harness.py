"""A dynamic-table training run and its dict-of-rows oracle, shared by the
in-process tests (tests/unit/test_dynamic_tables.py) and the multi-process
worker (tests/workers/dynamic_worker.py): one dynamic table, two features of it
(ragged weighted "clicks", dense "pair"), 64-bit ids with negatives,
admission after 2 sightings and eviction after 4 unseen steps."""

import numpy as np
import tensorflow as tf

import tfde
from tests.support import oracles
from tests.support import sharded_harness as h

GLOBAL_BATCH = 8
DIM = 4
RTOL, ATOL = 2e-5, 2e-6
# Ids as a hashing front end would make them: 64-bit, negative too.
POOL = np.random.default_rng(7).integers(-2**63, 2**63 - 1, size=40, dtype=np.int64)
POOL[:3] = [0, -1, 2**63 - 1]


def mirrored(n):
  return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])


def _init_spec(kind):
  return {"zeros": ("zeros", 0.0, 0.0), "constant": ("constant", 0.25, 0.0),
          "uniform": ("uniform", -0.5, 0.5), "normal": ("normal", 0.1, 0.3),
          "truncated_normal": ("truncated_normal", 0.0, 0.5)}[kind]


def _keras_initializer(kind):
  import keras  # pylint: disable=g-import-not-at-top
  _, a, b = _init_spec(kind)
  return {"zeros": keras.initializers.Zeros(),
          "constant": keras.initializers.Constant(a),
          "uniform": keras.initializers.RandomUniform(a, b),
          "normal": keras.initializers.RandomNormal(a, b),
          "truncated_normal": keras.initializers.TruncatedNormal(a, b)}[kind]


def table_config(kind="adam", init="uniform", seed=3, **dynamic):
  return tfde.TableConfig(
      name="users", vocabulary_size=None, embedding_dim=DIM,
      optimizer=h.sparse_optimizer(kind), initializer=_keras_initializer(init),
      combiner="mean", seed=seed, dynamic=tfde.DynamicConfig(**dynamic))


def feature_configs(table):
  # Two features share the table: ragged (weighted, sum) and dense [B, 2].
  ragged = tfde.TableConfig.from_config(dict(table.get_config(), combiner="sum"))
  return {"clicks": tfde.FeatureConfig(name="clicks", table=ragged),
          "pair": tfde.FeatureConfig(name="pair", table=table)}


def oracle_for(kind, init="uniform", seed=3, **dynamic):
  hp = h.numpy_optimizer(kind, (1, DIM)).hp
  return oracles.DynamicTableOracle(
      DIM, kind, hp, init=_init_spec(init), seed=seed,
      admit_after=dynamic.get("admit_after", 1),
      zeros_until_admitted=dynamic.get("unadmitted_value") == "zeros",
      evict_after_steps=dynamic.get("evict_after_steps"),
      max_rows=dynamic.get("max_rows_per_shard"),
      evict_every_steps=dynamic.get("evict_every_steps", 1))


def make_batch(step, pool=POOL):
  rng = np.random.default_rng(100 + step)
  # Skewed: a few ids are hot, many are seen once (and wait for admission).
  pick = lambda k: [int(pool[i]) for i in np.minimum(rng.zipf(1.4, k) - 1, len(pool) - 1)]
  clicks = [pick(int(rng.integers(0, 4))) for _ in range(GLOBAL_BATCH)]
  weights = [list(rng.uniform(0.5, 1.5, len(c))) for c in clicks]
  pair = [pick(2) for _ in range(GLOBAL_BATCH)]
  targets = {f: rng.normal(size=(GLOBAL_BATCH, DIM)).astype(np.float32)
             for f in ("clicks", "pair")}
  return dict(clicks=clicks, weights=weights, pair=pair, targets=targets)


def replica_inputs(batch, replica, n):
  per = GLOBAL_BATCH // n
  lo, hi = replica * per, (replica + 1) * per
  clicks = batch["clicks"][lo:hi]
  splits = np.concatenate([[0], np.cumsum([len(c) for c in clicks])]).astype(np.int64)
  values = tf.constant([x for c in clicks for x in c], tf.int64, shape=[int(splits[-1])])
  ragged = tf.RaggedTensor.from_row_splits(values, splits)
  weights = tf.RaggedTensor.from_row_splits(
      tf.constant([w for ws in batch["weights"][lo:hi] for w in ws], tf.float32,
                  shape=[int(splits[-1])]), splits)
  inputs = {"clicks": ragged, "pair": tf.constant(batch["pair"][lo:hi], tf.int64)}
  targets = {f: tf.constant(t[lo:hi]) for f, t in batch["targets"].items()}
  return inputs, {"clicks": weights}, targets


def oracle_step(oracle, batch):
  scale = 1.0 / GLOBAL_BATCH
  outs = oracle.train_step([
      (batch["clicks"], batch["weights"], "sum", batch["targets"]["clicks"], scale),
      (batch["pair"], None, "mean", batch["targets"]["pair"], scale)])
  return dict(zip(("clicks", "pair"), outs))
