"""Writes the saved files of tests/data with the code of the checkout it
runs in (run from the root of a checkout of the format to keep):

    python tests/data/make_legacy_files.py tests/data

A tf.train.Checkpoint and a .keras model, each holding a static (Adam) and
a dynamic (Adagrad) table trained for two steps, and legacy_expected.npz
with what those tables held when they were written (the oracle of
tests/unit/test_saved_formats.py).
"""

import os
import sys

import keras
import numpy as np
import tensorflow as tf

import tfde


def configs():
  static = tfde.TableConfig(name="items", vocabulary_size=40, embedding_dim=4,
                            optimizer="adam", combiner="sum", seed=3)
  dynamic = tfde.TableConfig(name="users", vocabulary_size=None, embedding_dim=4,
                             optimizer="adagrad", combiner="mean",
                             initializer="uniform", seed=5,
                             dynamic=tfde.DynamicConfig(admit_after=2))
  return {"item": tfde.FeatureConfig(name="item", table=static),
          "user": tfde.FeatureConfig(name="user", table=dynamic)}


def batches():
  yield {"item": tf.constant([[1, 2], [3, 39]]),
         "user": tf.constant([[10**12, 7], [7, 7]], tf.int64)}
  yield {"item": tf.constant([[2, 2], [5, 0]]),
         "user": tf.constant([[-3, 7], [10**12, 8]], tf.int64)}


def model():
  inputs = {k: keras.Input(shape=(2,), dtype="int64", name=k) for k in ("item", "user")}
  emb = tfde.layers.DistributedEmbedding(configs(), name="embedding")(inputs)
  out = keras.layers.Dense(1, kernel_initializer="ones")(
      keras.layers.Concatenate()([emb["item"], emb["user"]]))
  return keras.Model(inputs, out)


def _table_arrays(prefix, tables):
  """"<prefix>/<table>/<field>" -> array, for every table."""
  arrays = {}
  for name, table in tables.items():
    if table.is_dynamic:
      fields = table.export_rows()
    else:
      fields = {"table": table.full_table()}
      fields.update({f"slot_{s}": table.full_slot(s) for s in table.optimizer.slot_names})
    arrays.update({f"{prefix}/{name}/{k}": v for k, v in fields.items()})
  return arrays


def main(out_dir):
  os.makedirs(out_dir, exist_ok=True)
  expected = {}
  # A checkpoint of a ShardedLookup.
  lookup = tfde.lookup.ShardedLookup(configs())
  for batch in batches():
    with tf.GradientTape() as tape:
      loss = sum(tf.reduce_sum(v * v) for v in lookup(batch).values())
    tape.gradient(loss, lookup.trainable_variables)
  tf.train.Checkpoint(lookup=lookup).write(os.path.join(out_dir, "legacy_ckpt", "ckpt"))
  expected.update(_table_arrays("ckpt", lookup.tables))
  # A .keras model trained with fit.
  keras.utils.set_random_seed(0)
  m = model()
  m.compile(optimizer="sgd", loss="mse")
  x = {k: tf.concat([b[k] for b in batches()], 0) for k in ("item", "user")}
  m.fit(x, tf.ones([4, 1]), batch_size=2, epochs=1, verbose=0, shuffle=False)
  m.save(os.path.join(out_dir, "legacy_model.keras"))
  layer = m.get_layer("embedding")
  expected.update(_table_arrays("keras", layer.tables))
  expected["keras/prediction"] = m.predict(x, verbose=0)
  np.savez(os.path.join(out_dir, "legacy_expected.npz"), **expected)
  print("wrote", sorted(expected))


if __name__ == "__main__":
  main(sys.argv[1])
