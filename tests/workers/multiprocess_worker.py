"""One worker of a multi-process training run (launched by
tests/distributed/test_multiprocess.py).

  --mode mwms     TF_CONFIG is set; MultiWorkerMirroredStrategy.
  --mode horovod  launched by `horovodrun -np N --gloo`.

Trains the harness's tables on the batches in --batches (a pickle written
by the parent, so both sides use the same data whatever numpy generates in
this environment), then writes this worker's
initial and final shards and its slice of the first step's outputs to
OUT/worker_{rank}.npz; the parent assembles the shards and compares them
with the numpy reference.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.support import worker_common as w  # noqa: E402


def main():
  args = w.parser(__doc__.split("\n")[0]).parse_args()
  strategy, rank, num_replicas = w.start(args.mode)

  import tfde  # pylint: disable=g-import-not-at-top
  from tests.support import sharded_harness as h  # pylint: disable=g-import-not-at-top

  variant = h.variant_of(args.optimizer)
  configs = h.feature_configs(args.optimizer, variant)
  plan = None if args.layouts is None else tfde.planner.ShardingPlan(
      num_replicas=num_replicas, tables=h.layouts(args.layouts, num_replicas))
  with strategy.scope():
    lookup = h.sharded_lookup(configs, plan=plan, exchange=args.exchange)
  assert lookup.comm.num_replicas == num_replicas, lookup.comm
  refused = w.refused_restore(args, lookup)
  # Row-wise: this worker's shards; under a plan: whole tables (gathering
  # them is a collective, which every worker runs).
  initial = {name: t.shards[rank].numpy() if plan is None else t.full_table()
             for name, t in lookup.tables.items()}

  def replica_step(inputs, weights, targets):
    with tf.GradientTape() as tape:
      outputs = lookup(inputs, weights)
      loss = h.replica_loss(outputs, targets)
    tape.gradient(loss, lookup.trainable_variables)
    return outputs

  step = w.distributed_step(strategy, replica_step)
  bounds = h.replica_bounds(num_replicas, uneven=args.uneven)
  beside = None
  if args.beside_row_wise:
    with strategy.scope():
      beside = h.sharded_lookup(h.feature_configs(args.optimizer, variant))
    beside_step = w.harness_training_step(strategy, beside)
  manager, start = w.checkpointing(
      args, lookup, rank, lambda lk: int(next(iter(lk.tables.values())).steps[rank].numpy()))
  deltas = w.delta_checkpointing(args, lookup, rank)
  first = None
  for index, batch in enumerate(w.load_batches(args.batches)):
    if index < start:
      continue
    w.die_if_asked(args, index, rank)
    if index == args.out_of_step_at and rank == 1:
      for table in lookup.tables.values():
        table.steps[rank].assign_add(1)
    outputs = w.run_step(step, strategy, args.mode,
                         lambda r, batch=batch: h.replica_inputs(batch, r, num_replicas, bounds),
                         rank, num_replicas)
    if beside is not None:
      w.run_step(beside_step, strategy, args.mode,
                 lambda r, batch=batch: h.replica_inputs(batch, r, num_replicas, bounds),
                 rank, num_replicas)
    if first is None:
      first = {f: outputs[f].numpy() for f in h.FEATURES}
    if manager is not None:
      manager.save()
    if deltas is not None:
      deltas.save()
  w.write_checkpoint(args, lookup, rank)

  result = dict(refused)
  result.update({f"initial/{n}": v for n, v in initial.items()})
  result.update({f"final/{n}": t.shards[rank].numpy() if plan is None else t.full_table()
                 for n, t in lookup.tables.items()})
  result.update({f"output/{f}": v for f, v in first.items()})
  if beside is not None:
    result.update({f"beside_final/{n}": t.full_table() for n, t in beside.tables.items()})
  result["bytes_sent"] = np.array(lookup.comm.bytes_sent())
  result["backend"] = np.array(tfde.ops.current_backend())
  result["tf_version"] = np.array(tf.__version__)
  w.finish(args.out, "worker", rank, result,
           f"backend={tfde.ops.current_backend()} tf={tf.__version__} "
           f"bytes_sent={lookup.comm.bytes_sent()}")


if __name__ == "__main__":
  main()
