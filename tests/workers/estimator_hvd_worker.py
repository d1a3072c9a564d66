"""One Horovod rank of an estimator run (launched by tests/lanes/test_estimator.py
under `horovodrun -np N --gloo`, in the TF 2.15 environment): the model_fn
of tests/support/estimator_model.py with params={"horovod": True}, each rank on its
share of every global batch, Horovod's BroadcastGlobalVariablesHook beside
the tables. Every rank keeps a checkpoint (saving whole tables gathers
every rank's shard): rank r's model_dir is ROOT/rank_r, and a restart from
it continues where the ranks stopped.

  horovodrun -np 2 --gloo python -m tests.workers.estimator_hvd_worker \\
      --root DIR --first-step 0 --steps 4
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tests.support import estimator_model as m  # noqa: E402


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--root", required=True)
  parser.add_argument("--first-step", type=int, required=True)
  parser.add_argument("--steps", type=int, required=True)
  args = parser.parse_args()
  import horovod.tensorflow as hvd  # pylint: disable=g-import-not-at-top
  hvd.init()
  rank, size = hvd.rank(), hvd.size()
  config = tf.estimator.RunConfig(
      model_dir=os.path.join(args.root, f"rank_{rank}"), tf_random_seed=1,
      save_summary_steps=None, log_step_count_steps=None, save_checkpoints_steps=1000)
  estimator = tf.estimator.Estimator(m.model_fn, config=config, params={"horovod": True})
  estimator.train(m.input_fn(args.first_step, args.steps, rank, size), steps=args.steps,
                  hooks=[hvd.BroadcastGlobalVariablesHook(0)])
  print(f"rank {rank} of {size}: trained steps {args.first_step} to "
        f"{args.first_step + args.steps - 1}", flush=True)


if __name__ == "__main__":
  main()
