"""Writes the saved files of tests/data with the code of the checkout it
runs in (run from the root of a checkout of the format to keep):

    python tests/data/make_legacy_files.py tests/data

A tf.train.Checkpoint and a .keras model, each holding a static (Adam) and
a dynamic (Adagrad) table trained for two steps, and legacy_expected.npz
with what those tables held when they were written (the oracle of
tests/test_saved_formats.py).
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
  for name, value in lookup.table_values().items():
    if isinstance(value, dict):
      for key, array in value.items():
        expected[f"ckpt/{name}/{key}"] = array
    else:
      expected[f"ckpt/{name}/table"] = value
      for slot in lookup.tables[name].optimizer.slot_names:
        expected[f"ckpt/{name}/slot_{slot}"] = lookup.tables[name].full_slot(slot)
  # A .keras model trained with fit.
  keras.utils.set_random_seed(0)
  m = model()
  m.compile(optimizer="sgd", loss="mse")
  x = {k: tf.concat([b[k] for b in batches()], 0) for k in ("item", "user")}
  m.fit(x, tf.ones([4, 1]), batch_size=2, epochs=1, verbose=0, shuffle=False)
  m.save(os.path.join(out_dir, "legacy_model.keras"))
  layer = m.get_layer("embedding")
  for name, value in layer.get_embedding_tables().items():
    if isinstance(value, dict):
      for key, array in value.items():
        expected[f"keras/{name}/{key}"] = array
    else:
      expected[f"keras/{name}/table"] = value
      for slot in layer.tables[name].optimizer.slot_names:
        expected[f"keras/{name}/slot_{slot}"] = layer.tables[name].full_slot(slot)
  expected["keras/prediction"] = m.predict(x, verbose=0)
  np.savez(os.path.join(out_dir, "legacy_expected.npz"), **expected)
  print("wrote", sorted(expected))


if __name__ == "__main__":
  main(sys.argv[1])
