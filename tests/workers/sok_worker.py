"""One Horovod rank of a SOK-door run (launched by tests/distributed/test_multiprocess.py
under horovodrun): a sok.Variable and a sok.DynamicVariable, looked up with
sok.lookup_sparse on this rank's slice of each global batch and trained by
a wrapped Keras Adam. Writes this rank's outputs of every step and both
whole tables to OUT/sok_{rank}.npz."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tests.support import worker_common as w  # noqa: E402


def sparse(rows, width=4):
  indices = [[b, j] for b, row in enumerate(rows) for j in range(len(row))]
  values = [x for row in rows for x in row]
  return tf.SparseTensor(tf.constant(indices, tf.int64, shape=[len(values), 2]),
                         tf.constant(values, tf.int64, shape=[len(values)]),
                         [len(rows), width])


def main():
  args = w.data_and_out_args()
  import keras  # pylint: disable=g-import-not-at-top

  import tfde.compat.sok as sok  # pylint: disable=g-import-not-at-top
  sok.init(comm_tool="horovod")
  import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
  rank, size = hvd.rank(), hvd.size()
  data = w.load_batches(args.data)
  batch = data["global_batch"]
  per = batch // size
  static = sok.Variable(data["initial"])
  dynamic = sok.DynamicVariable(dimension=data["dim"],
                                initializer=keras.initializers.RandomUniform(-0.5, 0.5))
  optimizer = sok.OptimizerWrapper(keras.optimizers.Adam(learning_rate=data["lr"]))
  result = {}
  for index, step in enumerate(data["steps"]):
    lo, hi = rank * per, (rank + 1) * per
    with tf.GradientTape() as tape:
      outs = sok.lookup_sparse([static, dynamic],
                               [sparse(step["static"][lo:hi]), sparse(step["dynamic"][lo:hi])],
                               combiners=["sum", "mean"])
      loss = (tf.reduce_sum(tf.square(outs[0] - step["targets"][0][lo:hi])) +
              tf.reduce_sum(tf.square(outs[1] - step["targets"][1][lo:hi]))) / batch
    grads = tape.gradient(loss, [static, dynamic])
    optimizer.apply_gradients(zip(grads, [static, dynamic]))
    result[f"output/{index}/static"] = outs[0].numpy()
    result[f"output/{index}/dynamic"] = outs[1].numpy()
  result["static_table"] = sok._table_of(static).full_table()  # pylint: disable=protected-access
  for key, value in sok._table_of(dynamic).export_rows().items():  # pylint: disable=protected-access
    result[f"dynamic/{key}"] = value
  w.finish(args.out, "sok", rank, result, f"of {size}")


if __name__ == "__main__":
  main()
