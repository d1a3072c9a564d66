"""Runs tests/test_horovod_plans.py's test with either guard removed."""
import sys
import pytest, tensorflow as tf
import tfde
from tests import test_horovod_plans as t
which = sys.argv[1]
for plan in sorted(t.PLANS):
  for rank in (0, 1):
    mp = pytest.MonkeyPatch()
    if which in ("fold", "both"):
      mp.setattr(tfde.comm.HorovodCommunicator, "_splits", lambda self, c: tf.cast(c, tf.int32))
      mp.setattr(tfde.comm, "_stateful_identity", lambda x: x)
    if which in ("read", "both"):
      def control_one(tensors):
        with tf.control_dependencies([x for x in tensors if isinstance(x, tf.Tensor)]):
          return tf.constant(1, tf.int64)
      mp.setattr(tfde.ops, "one_read_from", control_one)
    try:
      t.test_every_collective_of_a_traced_training_step_survives_the_optimizers(mp, plan, rank)
      print(which, plan, rank, "passed")
    except AssertionError as e:
      print(which, plan, rank, "FAILED", str(e)[:150])
    finally:
      mp.undo()
