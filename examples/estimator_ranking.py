"""A tf.estimator ranking model over tfde tables (TensorFlow 2.15 with
tensorflow-estimator 2.15; `make tf215-env` builds that environment).

    python examples/estimator_ranking.py                  # generated ratings
    python examples/estimator_ranking.py --data ../shared/data/ml-latest-small/ratings.csv

User and movie ids are looked up in tfde tables (a static user table and a
dynamic movie table that admits a movie at its 2nd sighting; each trains
with its own sparse Adagrad inside the backward pass), their product and
a dense head predict the rating; a tf.compat.v1 Adam trains the dense
weights only. Estimator.train logs progress; evaluate reports RMSE; the
model is exported as a SavedModel. The movie table is dynamic (a tfde hash
table), so the export loads where tfde's op library is loaded
(`import tfde; tfde.ops.native.load()` before `tf.saved_model.load`); a
model_fn whose PREDICT mode reads static tables only, under
`tfde.ops.backend("reference")`, exports a SavedModel that serves without
tfde (tests/lanes/test_estimator.py does so).
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfde  # noqa: E402
from tfde.app import data as tfde_data  # noqa: E402  (MovieLens or generated ratings)

DIM = 16
USERS = 1000


def model_fn(features, labels, mode, params):
  user_table = tfde.TableConfig(name="user", vocabulary_size=USERS, embedding_dim=DIM,
                                optimizer=tfde.optimizers.Adagrad(learning_rate=0.05))
  movie_table = tfde.TableConfig(name="movie", vocabulary_size=None, embedding_dim=DIM,
                                 optimizer=tfde.optimizers.Adagrad(learning_rate=0.05),
                                 dynamic=tfde.DynamicConfig(admit_after=2))
  del params
  lookup = tfde.lookup.ShardedLookup([tfde.FeatureConfig(name="user", table=user_table),
                                      tfde.FeatureConfig(name="movie", table=movie_table)])
  out = lookup({name: features[name][:, None] for name in ("user", "movie")},
               training=mode == tf.estimator.ModeKeys.TRAIN)
  user, movie = out["user"], out["movie"]
  hidden = tf.compat.v1.layers.dense(tf.concat([user, movie, user * movie], 1), 64,
                                     activation=tf.nn.relu, name="head")
  rating = 3.5 + tf.squeeze(tf.compat.v1.layers.dense(hidden, 1, name="out"), 1)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={"rating": rating}, export_outputs={
        "serving_default": tf.estimator.export.PredictOutput({"rating": rating})})
  loss = tf.reduce_mean(tf.square(rating - labels))
  metrics = {"rmse": tf.compat.v1.metrics.root_mean_squared_error(labels, rating)}
  train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                    eval_metric_ops=metrics)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data", help="a MovieLens ratings.csv")
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--model_dir", default=None)
  args = parser.parse_args()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)  # the progress log
  users, movies, ratings = tfde_data.ratings(args.data, rows=50_000)
  users = users % USERS  # MovieLens's user ids, folded into the table
  split = int(len(ratings) * 0.9)

  def input_fn(lo, hi, repeat):
    def make():
      ds = tf.data.Dataset.from_tensor_slices(
          ({"user": users[lo:hi], "movie": movies[lo:hi]}, ratings[lo:hi]))
      return (ds.shuffle(10_000, seed=1).repeat() if repeat else ds).batch(256)
    return make

  model_dir = args.model_dir or tempfile.mkdtemp(prefix="tfde_estimator_")
  est = tf.estimator.Estimator(model_fn, model_dir=model_dir, params={},
                               config=tf.estimator.RunConfig(log_step_count_steps=100))
  tf.estimator.train_and_evaluate(
      est, tf.estimator.TrainSpec(input_fn(0, split, True), max_steps=args.steps),
      tf.estimator.EvalSpec(input_fn(split, len(ratings), False), throttle_secs=0))
  metrics = est.evaluate(input_fn(split, len(ratings), False))
  print(f"held-out RMSE {metrics['rmse']:.4f} after {metrics['global_step']} steps")

  def serving_input():
    inputs = {name: tf.compat.v1.placeholder(tf.int64, [None], name=name)
              for name in ("user", "movie")}
    return tf.estimator.export.ServingInputReceiver(inputs, inputs)

  path = est.export_saved_model(os.path.join(model_dir, "export"), serving_input)
  print(f"SavedModel: {path.decode()}")


if __name__ == "__main__":
  main()
