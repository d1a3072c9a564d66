"""One worker of the peer failure checks (launched by
tests/distributed/test_multiprocess_reliability.py): trains the harness's tables
(Adam) on --batches under MultiWorkerMirroredStrategy or Horovod, --pace
seconds a step, so the parent can kill or stop a peer mid-run.

Writes OUT/pid_{rank} at the start and OUT/progress_{rank} (steps done)
after every step; with --checkpoint-dir saves after every step (and
--resume goes on from the latest checkpoint). At the end, OUT/peer_{rank}.npz
holds this worker's final shards.
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


from tests.support import worker_common as w  # noqa: E402


def main():
  p = w.parser(__doc__.split("\n")[0])
  p.add_argument("--pace", type=float, default=0.0)
  args = p.parse_args()
  strategy, rank, num_replicas = w.start(args.mode)
  with open(os.path.join(args.out, f"pid_{rank}"), "w") as f:
    f.write(str(os.getpid()))
  from tests.support import sharded_harness as h  # pylint: disable=g-import-not-at-top

  configs = h.feature_configs("adam", 2)
  with strategy.scope():
    lookup = h.sharded_lookup(configs)

  step = w.harness_training_step(strategy, lookup)
  manager, start = w.checkpointing(
      args, lookup, rank, lambda lk: int(next(iter(lk.tables.values())).steps[rank].numpy()))
  for index, batch in enumerate(w.load_batches(args.batches)):
    if index < start:
      continue
    w.run_step(step, strategy, args.mode,
               lambda r, batch=batch: h.replica_inputs(batch, r, num_replicas),
               rank, num_replicas)
    if manager is not None:
      manager.save()
    with open(os.path.join(args.out, f"progress_{rank}"), "w") as f:
      f.write(str(index + 1))
    time.sleep(args.pace)
  w.finish(args.out, "peer", rank,
           {f"final/{n}": t.shards[rank].numpy() for n, t in lookup.tables.items()})


if __name__ == "__main__":
  main()
