"""One worker of a multi-process dynamic-table run (launched by
tests/distributed/test_multiprocess.py): the harness of tests/support/dynamic_harness.py under
MultiWorkerMirroredStrategy (--mode mwms, TF_CONFIG set) or Horovod (--mode
horovod, under horovodrun). Writes this worker's outputs of every step and
the whole table (gathered from every worker) to OUT/dynamic_{rank}.npz."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.support import worker_common as w  # noqa: E402


def main():
  args = w.parser(__doc__.split("\n")[0]).parse_args()
  strategy, rank, num_replicas = w.start(args.mode)

  import tfde  # pylint: disable=g-import-not-at-top
  from tests.support import dynamic_harness as d  # pylint: disable=g-import-not-at-top

  configs = d.feature_configs(d.table_config(args.optimizer, admit_after=2,
                                             evict_after_steps=4))
  plan = None
  if args.layouts is not None:  # the table whole on the last worker
    assert args.layouts == "table_wise", args.layouts
    plan = tfde.planner.ShardingPlan(num_replicas=num_replicas, tables={
        "users": tfde.planner.TableLayout("table_wise", [num_replicas - 1])})
  with strategy.scope():
    lookup = tfde.lookup.ShardedLookup(configs, plan=plan)
  assert lookup.comm.num_replicas == num_replicas

  def replica_step(inputs, weights, targets):
    with tf.GradientTape() as tape:
      outputs = lookup(inputs, weights)
      loss = tf.add_n([tf.reduce_sum(tf.square(outputs[f] - targets[f]))
                       for f in outputs]) / d.GLOBAL_BATCH
    tape.gradient(loss, lookup.trainable_variables)
    return outputs

  step = w.distributed_step(strategy, replica_step)
  manager, start = w.checkpointing(
      args, lookup, rank, lambda lk: int(lk.tables["users"].steps[rank].numpy()))
  deltas = w.delta_checkpointing(args, lookup, rank)
  result = {}
  for index, batch in enumerate(w.load_batches(args.batches)):
    if index < start:
      continue
    w.die_if_asked(args, index, rank)
    outputs = w.run_step(step, strategy, args.mode,
                         lambda r, batch=batch: d.replica_inputs(batch, r, num_replicas),
                         rank, num_replicas)
    for f in ("clicks", "pair"):
      result[f"output/{index}/{f}"] = outputs[f].numpy()
    if manager is not None:
      manager.save()
    if deltas is not None:
      deltas.save()
  w.write_checkpoint(args, lookup, rank)
  # Every worker takes part in gathering the whole table.
  for key, value in lookup.tables["users"].export_rows().items():
    result[f"table/{key}"] = value
  result["backend"] = np.array(tfde.ops.current_backend())
  result["tf_version"] = np.array(tf.__version__)
  w.finish(args.out, "dynamic", rank, result)


if __name__ == "__main__":
  main()
