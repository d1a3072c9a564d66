"""One Horovod rank of an mxRec-flow run in a TF1 graph (launched by
tests/distributed/test_multiprocess.py under horovodrun): sparse_lookup routes ids to
their owner rank, gradients of the local embeddings come back through the
exchange, the hash optimizer applies them by address. Writes this rank's
outputs of every step and the whole table to OUT/mxrec_{rank}.npz."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tests.support import worker_common as w  # noqa: E402


def main():
  args = w.data_and_out_args()
  import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
  hvd.init()
  rank, size = hvd.rank(), hvd.size()
  from tfde.compat import mxrec  # pylint: disable=g-import-not-at-top
  data = w.load_batches(args.data)
  per = data["batch"] // size
  result = {}
  with tf.Graph().as_default():
    mxrec.init(use_dynamic_expansion=True)
    optimizer = mxrec.lazy_adam.create_hash_optimizer_by_addr(
        learning_rate=data["lr"], beta1=0.8, beta2=0.95, epsilon=1e-7)
    table = mxrec.create_table(key_dtype=tf.int64, dim=data["dim"], name="user",
                               emb_initializer=tf.random_uniform_initializer(-0.5, 0.5),
                               optimizer_list=[optimizer])
    ids = tf.compat.v1.placeholder(tf.int64, [None, data["slots"]])
    target = tf.compat.v1.placeholder(tf.float32, [None, data["slots"], data["dim"]])
    emb = mxrec.sparse_lookup(table, ids, is_train=True)
    loss = tf.reduce_sum(tf.square(emb - target))
    local = tf.compat.v1.get_collection(mxrec.ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
    addresses = tf.compat.v1.get_collection(mxrec.ASCEND_SPARSE_LOOKUP_ID_OFFSET)
    train = optimizer.apply_gradients(list(zip(tf.gradients(loss, local), addresses)))
    export = table.table._serialize_to_tensors()  # pylint: disable=protected-access
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for index, step in enumerate(data["steps"]):
        lo, hi = rank * per, (rank + 1) * per
        out, _ = sess.run([emb, train], {ids: step["ids"][lo:hi],
                                         target: step["target"][lo:hi]})
        result[f"output/{index}"] = out
      for key, value in sess.run(export).items():
        result[f"table/{key}"] = value
  w.finish(args.out, "mxrec", rank, result, f"of {size}")


if __name__ == "__main__":
  main()
