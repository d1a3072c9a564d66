"""One worker of the refused steps across processes (launched by
tests/distributed/test_multiprocess_reliability.py), under MultiWorkerMirroredStrategy
or Horovod: non-finite gradients and out-of-range ids.

Six steps of the harness's tables (Adam), table A with
nonfinite="skip", B and C with the default "error":
  0  a finite step;
  1  the last worker's targets of A's feature are NaN: A's update is
     skipped and counted on every worker, B and C train;
  2  the last worker's targets of B's features are NaN: every worker
     raises an error naming table B and step 3, and no table changes;
  3  the last worker's ids of c_single include one past table C: that
     worker raises naming the id, every other naming the worker and the
     feature, none waits, and no table changes;
  4  the last worker's b_ragged has row splits past its ids (built
     without validation): that worker raises naming the feature, every
     other naming the worker and the feature, none waits, and no table
     changes;
  5  a good step: every worker goes on after the refused steps.
Writes OUT/nonfinite_{rank}.npz: this worker's shard, slots, step and
skip count of every table after each step, and the error of each step.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.support import worker_common as w  # noqa: E402


def _past_their_ids(ragged):
  """`ragged` with its last row split one past its values: malformed."""
  splits = tf.concat([ragged.row_splits[:-1], ragged.row_splits[-1:] + 1], 0)
  return tf.RaggedTensor.from_row_splits(ragged.values, splits, validate=False)


def main():
  args = w.parser(__doc__.split("\n")[0]).parse_args()
  strategy, rank, num_replicas = w.start(args.mode)
  from tests.support import sharded_harness as h  # pylint: disable=g-import-not-at-top

  configs = h.feature_configs("adam", 2)
  configs["a_dense"].table.nonfinite = "skip"
  with strategy.scope():
    lookup = h.sharded_lookup(configs)

  step = w.harness_training_step(strategy, lookup)
  batches = w.load_batches(args.batches)
  last = slice(h.GLOBAL_BATCH * (num_replicas - 1) // num_replicas, None)
  poisoned = {1: ["a_dense"], 2: ["b_sparse", "b_ragged"]}
  bad_id = {3: "c_single"}
  malformed_step = 4

  def local_state(phase):
    out = {}
    for name, table in lookup.tables.items():
      out[f"{phase}/{name}/table"] = table.shards[rank].numpy()
      for slot, variable in table.slots[rank].items():
        out[f"{phase}/{name}/{slot}"] = variable.numpy()
      out[f"{phase}/{name}/step"] = np.array(table.steps[rank].numpy())
      out[f"{phase}/{name}/skips"] = np.array(table.skips[rank].numpy())
    return out

  result = local_state("initial")
  for index, batch in enumerate(batches):
    for feature in poisoned.get(index, []):
      batch[feature]["target"] = batch[feature]["target"].copy()
      batch[feature]["target"][last] = np.nan
    if index in bad_id:
      ids = batch[bad_id[index]]["ids"]
      ids[-1] = [h.TABLES[h.FEATURES[bad_id[index]][0]][0] + 5]  # in the last slice
    error = ""

    def inputs_of(replica, batch=batch, index=index):
      inputs, weights, targets = h.replica_inputs(batch, replica, num_replicas)
      if index == malformed_step and replica == num_replicas - 1:
        inputs["b_ragged"], weights["b_ragged"] = (
            _past_their_ids(inputs["b_ragged"]), _past_their_ids(weights["b_ragged"]))
      return inputs, weights, targets

    try:
      w.run_step(step, strategy, args.mode, inputs_of, rank, num_replicas)
    except tf.errors.OpError as e:
      # Go on, as a loop that skips a bad batch does.
      error = f"{type(e).__name__}: {e.message}"
      print(f"worker {rank} step {index}: {error[:300]}", flush=True)
    result[f"error_{index}"] = np.array(error)
    result.update(local_state(f"after_{index}"))
  result["group_of_B"] = np.array(sorted(next(
      g.index for g in lookup._groups if "B" in g.index)))  # pylint: disable=protected-access
  w.finish(args.out, "nonfinite", rank, result)


if __name__ == "__main__":
  main()
