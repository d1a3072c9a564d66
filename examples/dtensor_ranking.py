"""MovieLens ranking on a DTensor mesh: TensorFlow's DTensor + Keras
tutorial workflow, with tfde tables for the embeddings.

    python examples/dtensor_ranking.py                     # generated ratings
    python examples/dtensor_ranking.py --data ../shared/data/ml-latest-small/ratings.csv

The tutorial's pieces (tf_keras, `pip install tfde[dtensor]`): a mesh of 4
logical CPUs, a `LayoutMap` for the dense layers, a DTensor-aware Keras
optimizer for them, inputs `dtensor.pack`ed batch-sharded, and a custom
`tf.function` train step with a progress bar. The user and movie tables
are `tfde.dtensor.DistributedEmbedding`'s: sharded by `id % 4` over the
mesh, each device reading and updating (Adagrad, touched rows only) its own
rows; the train step returns their sparse gradients, applied after it.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

NUM_DEVICES = 4
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_DEVICES)

import tf_keras  # noqa: E402
from tensorflow.experimental import dtensor  # noqa: E402

import tfde  # noqa: E402
import tfde.dtensor  # noqa: E402
from tfde.app import data as tfde_data  # noqa: E402  (MovieLens or generated ratings)

BATCH_SIZE = 256
EMBEDDING_DIMENSION = 32


def ranking_head(mesh):
  """The dense head, built under a `LayoutMap` as the tutorial builds its
  models: each variable gets its layout (replicated on this 1-D batch mesh:
  data parallel)."""
  layout_map = tf_keras.dtensor.experimental.LayoutMap(mesh=mesh)
  layout_map["hidden.*kernel"] = dtensor.Layout.replicated(mesh, rank=2)
  layout_map["hidden.*bias"] = dtensor.Layout.replicated(mesh, rank=1)
  layout_map["score.*kernel"] = dtensor.Layout.replicated(mesh, rank=2)
  layout_map["score.*bias"] = dtensor.Layout.replicated(mesh, rank=1)
  with layout_map.scope():
    return tf_keras.Sequential([
        tf_keras.layers.Dense(64, activation="relu", name="hidden"),
        tf_keras.layers.Dense(1, name="score"),
    ])


def pack_batch(mesh, values, dtype):
  """One global batch as a DTensor sharded on its first dimension: each
  device gets its slice (`dtensor.pack`, as the tutorial's repack)."""
  layout = dtensor.Layout.batch_sharded(mesh, "batch", rank=np.ndim(values))
  parts = np.split(np.asarray(values), mesh.dim_size("batch"))
  components = []
  for device, part in zip(mesh.local_devices(), parts):
    with tf.device(device):
      components.append(tf.constant(part, dtype))
  return dtensor.pack(components, layout)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", help="MovieLens ratings.csv (default: generated)")
  parser.add_argument("--epochs", type=int, default=2)
  parser.add_argument("--rows", type=int, default=40_000,
                      help="generated ratings (without --data)")
  parser.add_argument("--steps", type=int, default=None,
                      help="stop each epoch after this many steps")
  args = parser.parse_args()

  users, movies, ratings = tfde_data.ratings(args.data, args.rows)
  mesh = dtensor.create_mesh([("batch", NUM_DEVICES)],
                             devices=[f"CPU:{i}" for i in range(NUM_DEVICES)])
  # Stateless initialisers: DTensor refuses stateful random ops.
  tf_keras.backend.experimental.enable_tf_random_generator()
  tf_keras.utils.set_random_seed(0)

  tables = {
      "user_id": tfde.TableConfig(name="user", vocabulary_size=int(users.max()) + 1,
                                  embedding_dim=EMBEDDING_DIMENSION,
                                  optimizer=tfde.optimizers.Adagrad(learning_rate=0.05),
                                  combiner="sum"),
      "movie_id": tfde.TableConfig(name="movie", vocabulary_size=int(movies.max()) + 1,
                                   embedding_dim=EMBEDDING_DIMENSION,
                                   optimizer=tfde.optimizers.Adagrad(learning_rate=0.05),
                                   combiner="sum"),
  }
  feature_configs = {name: tfde.FeatureConfig(name=name, table=table)
                     for name, table in tables.items()}

  # The tables lay themselves out over the mesh (id % 4); the dense head
  # takes its layouts from a LayoutMap and trains with a DTensor optimizer.
  embedding = tfde.dtensor.DistributedEmbedding(feature_configs, mesh)
  head = ranking_head(mesh)
  optimizer = tf_keras.dtensor.experimental.optimizers.Adam(0.005, mesh=mesh)

  def model(features):
    embedded = embedding(features)
    x = tf.concat([embedded["user_id"], embedded["movie_id"]], axis=1)
    return tf.squeeze(head(x), axis=1)

  @tf.function
  def train_step(features, labels):
    with tf.GradientTape() as tape:
      predictions = model(features)
      loss = tf.reduce_mean(tf.square(predictions - labels))
    dense = head.trainable_variables
    grads = tape.gradient(loss, dense + embedding.gradient_sources())
    optimizer.apply_gradients(zip(grads[:len(dense)], dense))
    return loss, embedding.sparse_gradients(grads[len(dense):])

  order = np.random.default_rng(1).permutation(len(ratings))
  split = int(0.9 * len(order))
  train, test = order[:split], order[split:]
  steps = len(train) // BATCH_SIZE
  if args.steps:
    steps = min(steps, args.steps)
  for epoch in range(args.epochs):
    print(f"epoch {epoch + 1}/{args.epochs}")
    progress = tf_keras.utils.Progbar(steps, stateful_metrics=["rmse"])
    total = 0.0
    for step in range(steps):
      rows = train[step * BATCH_SIZE:(step + 1) * BATCH_SIZE]
      features = {"user_id": pack_batch(mesh, users[rows], tf.int64),
                  "movie_id": pack_batch(mesh, movies[rows], tf.int64)}
      loss, sparse = train_step(features, pack_batch(mesh, ratings[rows], tf.float32))
      embedding.apply_gradients(sparse)
      total += float(loss)
      progress.update(step + 1, [("rmse", np.sqrt(total / (step + 1)))])

  @tf.function
  def predict(features):
    return model(features)

  errors = []
  for start in range(0, len(test) - BATCH_SIZE + 1, BATCH_SIZE):
    rows = test[start:start + BATCH_SIZE]
    out = predict({"user_id": pack_batch(mesh, users[rows], tf.int64),
                   "movie_id": pack_batch(mesh, movies[rows], tf.int64)})
    out = dtensor.relayout(out, dtensor.Layout.replicated(mesh, 1)).numpy()
    errors.append(np.mean(np.square(out - ratings[rows])))
  print(f"test RMSE {np.sqrt(np.mean(errors)):.4f} over {len(errors) * BATCH_SIZE} ratings")
  for variable in head.trainable_variables:
    print(f"dense {variable.name}: {type(variable).__name__}, layout "
          f"{dtensor.fetch_layout(variable).sharding_specs}")
  for name, table in embedding.tables.items():
    print(f"table {name}: {table.vocabulary_size} rows, "
          f"{dtensor.fetch_layout(table.variable).sharding_specs} over "
          f"{table.num_shards} devices, step {table.step_value()}")


if __name__ == "__main__":
  main()
