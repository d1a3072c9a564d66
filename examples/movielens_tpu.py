"""MovieLens ranking with embeddings on TPU SparseCore, or anywhere else.

keras-rs's TensorFlow tutorial "DistributedEmbedding using TPU SparseCore
and TensorFlow" with `keras_rs.layers` replaced by `tfde.layers`. On a TPU
it runs under `TPUStrategy`, where tfde hands the tables to TensorFlow's TPU
embedding engine (`TPUEmbeddingV2` on SparseCore); elsewhere the same script
runs under `MirroredStrategy` with tfde's own sharded tables. The one
difference: tables ask for `placement="sparsecore"` only when there is a
TPU (tfde refuses that placement off TPU rather than ignore it).

    python examples/movielens_tpu.py --data ../shared/data/ml-latest-small/ratings.csv
    python examples/movielens_tpu.py --logical-cpus 2     # generated ratings

Not yet run on a TPU by tfde's tests (see README, "TPU").
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfde  # noqa: E402
from tfde.app import data as tfde_data  # noqa: E402  (MovieLens or generated ratings)

PER_REPLICA_BATCH_SIZE = 256
EMBEDDING_DIMENSION = 32


def make_strategy(logical_cpus):
  """TPUStrategy when a TPU answers, else MirroredStrategy (the tutorial's
  fallback is the default strategy; tfde spreads over the local devices)."""
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
  except (ValueError, tf.errors.NotFoundError, RuntimeError):
    pass
  if logical_cpus > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * logical_cpus)
    return tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(logical_cpus)])
  return tf.distribute.MirroredStrategy()


class EmbeddingModel(keras.Model):
  """The tutorial's ranking model: embeddings, then Dense 256-64-1."""

  def __init__(self, feature_configs):
    super().__init__()
    self.embedding_layer = tfde.layers.DistributedEmbedding(
        feature_configs=feature_configs, table_stacking="auto")
    self.ratings = keras.Sequential([
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(1),
    ])

  def call(self, features):
    embedding = self.embedding_layer(features)
    return self.ratings(keras.ops.concatenate(
        [embedding["user_id"], embedding["movie_id"]], axis=1))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", help="a MovieLens ratings.csv")
  parser.add_argument("--epochs", type=int, default=5)
  parser.add_argument("--logical-cpus", type=int, default=1,
                      help="off TPU, MirroredStrategy over this many CPUs")
  args = parser.parse_args(argv)

  strategy = make_strategy(args.logical_cpus)
  on_tpu = isinstance(strategy, tf.distribute.TPUStrategy)
  keras.utils.set_random_seed(0)
  users, movies, ratings = tfde_data.ratings(args.data, rows=60_000)
  global_batch = PER_REPLICA_BATCH_SIZE * strategy.num_replicas_in_sync
  split = int(len(ratings) * 0.8)
  features = {"user_id": users.astype(np.int32), "movie_id": movies.astype(np.int32)}
  train_ds = tf.data.Dataset.from_tensor_slices(
      ({k: v[:split] for k, v in features.items()}, ratings[:split])
  ).shuffle(100_000, seed=0).batch(global_batch, drop_remainder=True)
  eval_ds = tf.data.Dataset.from_tensor_slices(
      ({k: v[split:] for k, v in features.items()}, ratings[split:])
  ).batch(global_batch, drop_remainder=True)

  placement = "sparsecore" if on_tpu else "auto"
  movie_table = tfde.layers.TableConfig(
      name="movie_table", vocabulary_size=int(movies.max()) + 1,
      embedding_dim=EMBEDDING_DIMENSION,
      optimizer=keras.optimizers.Adagrad(learning_rate=0.05),
      placement=placement)
  user_table = tfde.layers.TableConfig(
      name="user_table", vocabulary_size=int(users.max()) + 1,
      embedding_dim=EMBEDDING_DIMENSION,
      optimizer=keras.optimizers.Adagrad(learning_rate=0.05),
      placement=placement)
  feature_configs = {
      "movie_id": tfde.layers.FeatureConfig(
          name="movie", table=movie_table, input_shape=(PER_REPLICA_BATCH_SIZE,),
          output_shape=(PER_REPLICA_BATCH_SIZE, EMBEDDING_DIMENSION)),
      "user_id": tfde.layers.FeatureConfig(
          name="user", table=user_table, input_shape=(PER_REPLICA_BATCH_SIZE,),
          output_shape=(PER_REPLICA_BATCH_SIZE, EMBEDDING_DIMENSION)),
  }
  with strategy.scope():
    model = EmbeddingModel(feature_configs)
    model.compile(loss=keras.losses.MeanSquaredError(),
                  metrics=[keras.metrics.RootMeanSquaredError()],
                  optimizer=keras.optimizers.Adagrad(learning_rate=0.05))
  model.fit(train_ds, epochs=args.epochs)
  results = model.evaluate(eval_ds, return_dict=True)
  baseline = float(np.sqrt(np.mean((ratings[split:] - ratings[:split].mean()) ** 2)))
  print(f"strategy: {type(strategy).__name__} x{strategy.num_replicas_in_sync}; "
        f"eval RMSE: {results['root_mean_squared_error']:.4f} "
        f"(predicting the mean rating: {baseline:.4f})")
  return results


if __name__ == "__main__":
  main()
