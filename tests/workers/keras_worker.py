"""One worker of a 2-process Keras fit under MultiWorkerMirroredStrategy
(launched by tests/distributed/test_multiprocess.py with TF_CONFIG set).

Fits the DistributedEmbedding ranking model of tests/unit/test_layers.py on data
the parent wrote, then evaluates and predicts, and writes this worker's
shards, losses and predictions to OUT/keras_{rank}.npz.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.support import worker_common as w  # noqa: E402


def main():
  args = w.data_and_out_args()
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  rank = strategy.cluster_resolver.task_id
  import keras  # pylint: disable=g-import-not-at-top
  keras.config.disable_traceback_filtering()
  from tests.unit import test_layers  # pylint: disable=g-import-not-at-top

  data = np.load(args.data)
  x = {"user_id": data["user_id"], "movie_id": data["movie_id"]}
  y = data["y"]
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = test_layers._ranking_model()  # pylint: disable=protected-access
    model.compile(optimizer=keras.optimizers.Adam(0.005), loss="mse")
  layer = model.get_layer("embedding")
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = (
      tf.data.experimental.AutoShardPolicy.DATA)
  train = tf.data.Dataset.from_tensor_slices((x, y)).batch(256).with_options(options)
  history = model.fit(train, epochs=8, verbose=0)
  evaluation = model.evaluate(train, verbose=0, return_dict=True)
  predictions = model.predict(tf.data.Dataset.from_tensor_slices(x).batch(256)
                              .with_options(options), verbose=0)
  w.finish(args.out, "keras", rank, dict(
      loss=np.array(history.history["loss"]),
      eval_loss=np.array(evaluation["loss"]),
      predictions=predictions,
      dense_kernel=model.layers[-1].get_weights()[0],
      **{f"shard/{name}": t.shards[rank].numpy() for name, t in layer.tables.items()},
      **{f"replicated/{name}": t.replicated for name, t in layer.tables.items()}))


if __name__ == "__main__":
  main()
