"""MovieLens ranking with a distributed embedding layer.

The keras-rs example ("DistributedEmbedding: movie ranking") with one change,
the import: `keras_rs.layers.X` became `tfde.layers.X`.

    python examples/movielens_ranking.py --data ../shared/data/ml-latest-small/ratings.csv
    python examples/movielens_ranking.py            # generated ratings

User and movie embeddings feed a Dense 256-64-1 head; the tables train with
Adagrad, per table, inside the backward pass; the metric is RMSE.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfde as keras_rs  # noqa: E402  (the one line that differs)
from tfde.app import data as tfde_data  # noqa: E402  (MovieLens or generated ratings)

BATCH_SIZE = 256
EMBEDDING_DIMENSION = 32


class EmbeddingModel(keras.Model):
  """Create the model with the embedding configuration."""

  def __init__(self, feature_configs):
    super().__init__()
    self.embedding_layer = keras_rs.layers.DistributedEmbedding(
        feature_configs=feature_configs)
    self.ratings = keras.Sequential([
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(1),
    ])

  def call(self, features):
    # Embedding lookup. Outputs have the same structure as the inputs.
    embedding = self.embedding_layer({"user_id": features["user_id"],
                                      "movie_id": features["movie_id"]})
    return self.ratings(keras.ops.concatenate(
        [embedding["user_id"], embedding["movie_id"]], axis=1))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", help="a MovieLens ratings.csv")
  parser.add_argument("--epochs", type=int, default=5)
  args = parser.parse_args()

  keras.utils.set_random_seed(0)
  users, movies, ratings = tfde_data.ratings(args.data)
  split = int(len(ratings) * 0.8)
  features = {"user_id": users, "movie_id": movies}
  train_ds = tf.data.Dataset.from_tensor_slices(
      ({k: v[:split] for k, v in features.items()}, ratings[:split])
  ).shuffle(100_000, seed=0).batch(BATCH_SIZE, drop_remainder=True)
  eval_ds = tf.data.Dataset.from_tensor_slices(
      ({k: v[split:] for k, v in features.items()}, ratings[split:])
  ).batch(BATCH_SIZE, drop_remainder=True)

  strategy = tf.distribute.MirroredStrategy()
  per_replica_batch = BATCH_SIZE // strategy.num_replicas_in_sync
  user_table = keras_rs.layers.TableConfig(
      name="user_table", vocabulary_size=int(users.max()) + 1,
      embedding_dim=EMBEDDING_DIMENSION,
      optimizer=keras.optimizers.Adagrad(learning_rate=0.05), placement="auto")
  movie_table = keras_rs.layers.TableConfig(
      name="movie_table", vocabulary_size=int(movies.max()) + 1,
      embedding_dim=EMBEDDING_DIMENSION,
      optimizer=keras.optimizers.Adagrad(learning_rate=0.05), placement="auto")
  feature_configs = {
      "user_id": keras_rs.layers.FeatureConfig(
          name="user", table=user_table, input_shape=(per_replica_batch,),
          output_shape=(per_replica_batch, EMBEDDING_DIMENSION)),
      "movie_id": keras_rs.layers.FeatureConfig(
          name="movie", table=movie_table, input_shape=(per_replica_batch,),
          output_shape=(per_replica_batch, EMBEDDING_DIMENSION)),
  }
  with strategy.scope():
    model = EmbeddingModel(feature_configs)
    model.compile(loss=keras.losses.MeanSquaredError(),
                  metrics=[keras.metrics.RootMeanSquaredError()],
                  optimizer=keras.optimizers.Adagrad(learning_rate=0.05))
  model.fit(train_ds, epochs=args.epochs)
  results = model.evaluate(eval_ds, return_dict=True)
  # The trivial predictor: the training mean rating for everyone.
  baseline = float(np.sqrt(np.mean((ratings[split:] - ratings[:split].mean()) ** 2)))
  print(f"eval RMSE: {results['root_mean_squared_error']:.4f} "
        f"(predicting the mean rating: {baseline:.4f})")
  return results


if __name__ == "__main__":
  main()
