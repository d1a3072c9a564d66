"""Trains tfde.dtensor.DistributedEmbedding on DTensor meshes of logical
CPUs and compares with the numpy reference of the unsharded model
(tests/support/sharded_harness.py, tests/support/oracles.py). Run by tests/unit/test_dtensor.py
in a child process (DTensor's device is process-wide); prints one JSON line
per case.

  python -m tests.workers.dtensor_worker MESH_SIZE:OPTIMIZER[:VARIANT] ...
  python -m tests.workers.dtensor_worker layout-and-checkpoint DIRECTORY [MESH_SIZE:...]
"""

import json
import sys

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.experimental import dtensor  # noqa: E402

import tests.conftest  # noqa: F401  (4 logical CPUs)
import tfde.dtensor  # noqa: E402
from tests.support import sharded_harness as h  # noqa: E402

STEPS = 3


def mesh_of(size):
  """A 1-D "batch" mesh of `size` CPUs, or for "BxM" a "batch" x "model"
  mesh (the tables sharded over "batch", each shard held by M devices)."""
  if isinstance(size, str) and "x" in size:
    batch, model = (int(n) for n in size.split("x"))
    return dtensor.create_mesh([("batch", batch), ("model", model)],
                               devices=[f"CPU:{i}" for i in range(batch * model)])
  size = int(size)
  return dtensor.create_mesh([("batch", size)], devices=[f"CPU:{i}" for i in range(size)])


def pack(mesh, values, dtype):
  """A DTensor sharded on its first dimension over "batch"."""
  value = tf.constant(values, dtype)
  rank = value.shape.rank
  replicated = dtensor.copy_to_mesh(value, dtensor.Layout.replicated(mesh, rank))
  return dtensor.relayout(replicated, dtensor.Layout(
      ["batch"] + [dtensor.UNSHARDED] * (rank - 1), mesh))


def dense_inputs(mesh, batch):
  """The harness's batch as dense ids padded with -1 (and weights with 0):
  its ragged and sparse features too, as DTensor takes dense tensors only."""
  ids, weights, targets = {}, {}, {}
  for name, (_, kind) in h.FEATURES.items():
    rows = batch[name]["ids"]
    if kind == "dense1":
      ids[name] = pack(mesh, [r[0] for r in rows], tf.int32)
      if batch[name]["weights"] is not None:
        weights[name] = pack(mesh, [r[0] for r in batch[name]["weights"]], tf.float32)
    else:
      width = max(4, max(len(r) for r in rows))
      ids[name] = pack(mesh, [r + [-1] * (width - len(r)) for r in rows], tf.int64)
      if batch[name]["weights"] is not None:
        weights[name] = pack(mesh, [r + [0.0] * (width - len(r))
                                    for r in batch[name]["weights"]], tf.float32)
    targets[name] = pack(mesh, batch[name]["target"], tf.float32)
  return ids, weights, targets


def run_case(size, kind, variant):
  mesh = mesh_of(size)
  configs = h.feature_configs(kind, variant=variant)
  layer = tfde.dtensor.DistributedEmbedding(configs, mesh)
  initial = {n: t.full_table() for n, t in layer.tables.items()}

  @tf.function
  def train_step(ids, weights, targets):
    with tf.GradientTape() as tape:
      outputs = layer(ids, weights)
      loss = tf.add_n([tf.reduce_sum(tf.square(outputs[f] - targets[f]))
                       for f in h.FEATURES]) / h.GLOBAL_BATCH
    grads = tape.gradient(loss, layer.gradient_sources())
    return outputs, layer.sparse_gradients(grads)

  batches = [h.make_batch(s, weighted=(s % 2 == 0), seed=variant) for s in range(STEPS)]
  first = None
  held_reads_kept = True
  for batch in batches:
    outputs, sparse = train_step(*dense_inputs(mesh, batch))
    if first is None:
      first = {f: dtensor.relayout(o, dtensor.Layout.replicated(mesh, 2)).numpy()
               for f, o in outputs.items()}
      layouts = {f: dtensor.fetch_layout(o).sharding_specs for f, o in outputs.items()}
    # A read held across an update keeps its value (the update copies a
    # buffer a read still shares).
    held = [c for t in layer.tables.values() for c in dtensor.unpack(t.variable.read_value())]
    values = [c.numpy() for c in held]
    layer.apply_gradients(sparse)
    held_reads_kept &= all(np.array_equal(c.numpy(), v) for c, v in zip(held, values))
  ref_outputs, ref_tables = h.reference_run(configs, initial, batches)
  out_error = max(float(np.max(np.abs(first[f] - ref_outputs[f]))) for f in h.FEATURES)
  table_error = max(float(np.max(np.abs(t.full_table() - ref_tables[n])))
                    for n, t in layer.tables.items())
  steps = {n: t.step_value() for n, t in layer.tables.items()}
  return dict(mesh=size, optimizer=kind, variant=variant, output_error=out_error,
              table_error=table_error, steps=steps,
              reads_share_shards=reads_share_shards(layer),
              shard_copies_agree=shard_copies_agree(layer),
              held_reads_kept=bool(held_reads_kept),
              output_layouts=sorted({tuple(v) for v in layouts.values()}))


def reads_share_shards(layer):
  """After training, does reading a table or slot leave each device's
  component in place? (After TF's sparse updates every read would copy the
  shard, making each forward O(V / N).) Numpy shares an eager CPU tensor's
  buffer, so two reads sharing one address were not copied."""
  def share(variable):
    # Both reads alive at once, so a freed buffer cannot come back as the other.
    first = dtensor.unpack(variable.read_value())
    second = dtensor.unpack(variable.read_value())
    return all(np.shares_memory(np.asarray(a), np.asarray(b))
               for a, b in zip(first, second))
  return all(share(v) for t in layer.tables.values()
             for v in [t.variable, *t.slots.values()])


def shard_copies_agree(layer):
  """On a mesh with more devices than shards, every device holding a shard
  (table and slots) holds the same values (the oracle reads one of them)."""
  for table in layer.tables.values():
    for variable in [table.variable, *table.slots.values()]:
      held = {}
      for shard, component in zip(table.device_shards,
                                  dtensor.unpack(variable.read_value())):
        first = held.setdefault(shard, component.numpy())
        if not np.array_equal(first, component.numpy()):
          return False
  return True


def layout_case():
  """What each device holds: its own [R, D] shard of the id % N layout,
  for the table, each slot, and after training (numpy's full[s::N])."""
  mesh = mesh_of(4)
  configs = h.feature_configs("ftrl")
  layer = tfde.dtensor.DistributedEmbedding(configs, mesh)
  report = {}
  for name, table in layer.tables.items():
    full = table.full_table()
    rows = -(-full.shape[0] // 4)
    padded = np.pad(full, [[0, rows * 4 - full.shape[0]], [0, 0]])
    errors, shapes, devices = [], [], []
    for variable in [table.variable] + list(table.slots.values()):
      components = dtensor.unpack(variable.read_value())
      shapes += [list(c.shape) for c in components]
      devices += [c.device.rsplit(":", 1)[-1] for c in components]
    for s, component in enumerate(dtensor.unpack(table.variable.read_value())):
      errors.append(float(np.max(np.abs(component.numpy() - padded[s::4]))))
    report[name] = dict(vocabulary=full.shape[0], shapes=shapes, devices=devices,
                        max_error=max(errors),
                        layout=dtensor.fetch_layout(table.variable.read_value()).sharding_specs)
  # Bad ids: an error naming the feature and table; no table changes.
  before = {n: t.full_table() for n, t in layer.tables.items()}
  ids, weights, _ = dense_inputs(mesh, h.make_batch(0, weighted=False))
  report["cancelled_calls"] = 0
  def error_of(ids):
    """The refused call's error message, once: DTensor's asynchronous
    device can report another device's cancelled collective instead of the
    named check (docs/doors/dtensor.md); such a call is counted, not
    repeated, and the test bounds the count."""
    try:
      outputs = tf.function(layer)(ids)
      # DTensor runs asynchronously: the error arrives with the result.
      dtensor.relayout(outputs["b_sparse"], dtensor.Layout.replicated(mesh, 2)).numpy()
      return None
    except tf.errors.InvalidArgumentError as e:
      return e.message
    except tf.errors.CancelledError as e:
      report["cancelled_calls"] += 1
      return "CancelledError: " + e.message

  # Three refused calls each: one named error is then all but certain while
  # the cancelled ones are counted.
  report["bad_id_error"] = [error_of(
      dict(ids, b_sparse=pack(mesh, [[50, 1]] * h.GLOBAL_BATCH, tf.int64)))
                            for _ in range(3)]
  # uint64 ids from 2^63 are refused as given, not wrapped to negative ids
  # (2^64 - 1 to the padding -1); in-range ones look up the int64 rows.
  report["uint64_error"] = [error_of(
      dict(ids, b_sparse=pack(mesh, [[2**64 - 1, 1]] * h.GLOBAL_BATCH, tf.uint64)))
                            for _ in range(3)]
  report["unchanged"] = all(np.array_equal(before[n], t.full_table())
                            for n, t in layer.tables.items())
  as_int64 = dict(ids, b_sparse=pack(mesh, [[49, 1]] * h.GLOBAL_BATCH, tf.int64))
  as_uint64 = dict(ids, b_sparse=pack(mesh, [[49, 1]] * h.GLOBAL_BATCH, tf.uint64))
  report["uint64_rows_equal"] = bool(np.array_equal(
      *[dtensor.relayout(layer(x)["b_sparse"], dtensor.Layout.replicated(mesh, 2)).numpy()
        for x in (as_int64, as_uint64)]))
  return report


def tutorial_case():
  """The DTensor Keras tutorial's step (every trainable variable's gradient
  handed to a Keras optimizer) would train no table: it is refused by name
  on its first step, traced or eager, and no table moves. tfde's step, with
  the same optimizer also given the layer's trainable variables, trains
  like the numpy reference."""
  import tf_keras  # pylint: disable=g-import-not-at-top
  mesh = mesh_of(2)
  configs = h.feature_configs("sgd")
  layer = tfde.dtensor.DistributedEmbedding(configs, mesh)
  initial = {n: t.full_table() for n, t in layer.tables.items()}
  optimizer = tf_keras.dtensor.experimental.optimizers.SGD(0.5, mesh=mesh)

  def loss_of(ids, weights, targets):
    outputs = layer(ids, weights)
    return tf.add_n([tf.reduce_sum(tf.square(outputs[f] - targets[f]))
                     for f in h.FEATURES]) / h.GLOBAL_BATCH

  def tutorial_step(ids, weights, targets):
    with tf.GradientTape() as tape:
      loss = loss_of(ids, weights, targets)
    grads = tape.gradient(loss, layer.trainable_variables)
    optimizer.apply_gradients(zip(grads, layer.trainable_variables))
    return loss

  report = {}
  inputs = dense_inputs(mesh, h.make_batch(0, weighted=True))
  for mode, step in (("traced", tf.function(tutorial_step)), ("eager", tutorial_step)):
    try:
      step(*inputs)
      report[f"tutorial_{mode}_error"] = None
    except ValueError as e:
      report[f"tutorial_{mode}_error"] = str(e)
  report["tutorial_unchanged"] = all(np.array_equal(initial[n], t.full_table())
                                     for n, t in layer.tables.items())

  @tf.function
  def tfde_step(ids, weights, targets):
    with tf.GradientTape() as tape:
      loss = loss_of(ids, weights, targets)
    dense = layer.trainable_variables
    grads = tape.gradient(loss, dense + layer.gradient_sources())
    optimizer.apply_gradients(zip(grads[:len(dense)], dense))
    return layer.sparse_gradients(grads[len(dense):])

  batches = [h.make_batch(s, weighted=(s % 2 == 0)) for s in range(STEPS)]
  for batch in batches:
    layer.apply_gradients(tfde_step(*dense_inputs(mesh, batch)))
  _, ref_tables = h.reference_run(configs, initial, batches)
  report["tfde_step_table_error"] = max(
      float(np.max(np.abs(t.full_table() - ref_tables[n])))
      for n, t in layer.tables.items())
  report["tfde_step_moved"] = float(max(
      np.max(np.abs(t.full_table() - initial[n])) for n, t in layer.tables.items()))
  return report


def checkpoint_case(directory):
  """A table trained on a DTensor mesh restores into tfde.layers'
  tables under MirroredStrategy(2) (tf.train.Checkpoint through state()),
  trains there, and comes back to a mesh of 4."""
  mesh = mesh_of(4)
  kind = "adagrad"
  configs = h.feature_configs(kind)
  layer = tfde.dtensor.DistributedEmbedding(configs, mesh)
  train_step = None
  for step in range(2):
    ids, weights, targets = dense_inputs(mesh, h.make_batch(step, weighted=True))
    if train_step is None:
      @tf.function
      def train_step(ids, weights, targets):
        with tf.GradientTape() as tape:
          outputs = layer(ids, weights)
          loss = tf.add_n([tf.reduce_sum(tf.square(outputs[f] - targets[f]))
                           for f in h.FEATURES])
        return layer.sparse_gradients(tape.gradient(loss, layer.gradient_sources()))
    sparse = train_step(ids, weights, targets)
    layer.apply_gradients(sparse)
  trained = {n: t.state() for n, t in layer.tables.items()}
  # A non-finite gradient: an error naming the table; nothing written.
  rows, grads = sparse["A"]
  try:
    layer.apply_gradients({"A": (rows, grads * float("nan"))})
    nonfinite_error = None
  except tf.errors.InvalidArgumentError as e:
    nonfinite_error = e.message
  unchanged = all(np.array_equal(v.numpy(), layer.tables["A"].state()[k].numpy())
                  for k, v in trained["A"].items())
  path = tf.train.Checkpoint(**layer.tables).write(f"{directory}/dtensor")

  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  with strategy.scope():
    keras_layer = tfde.layers.DistributedEmbedding(h.feature_configs(kind))
  tables = keras_layer.tables
  tf.train.Checkpoint(**tables).read(path).assert_existing_objects_matched()
  errors = {}
  for name, table in tables.items():
    errors[f"{name}/to_mirrored"] = max(
        float(np.max(np.abs(table.state()[k].numpy() - trained[name][k].numpy())))
        for k in trained[name])
    # Changed there (as a run under that strategy would), then written.
    table.load_state({k: v * 2 if k != "step" else v + 5
                      for k, v in table.state().items()})
  back_path = tf.train.Checkpoint(**tables).write(f"{directory}/mirrored")
  other = tfde.dtensor.DistributedEmbedding(h.feature_configs(kind), mesh_of(4))
  tf.train.Checkpoint(**other.tables).read(back_path).assert_existing_objects_matched()
  for name, table in other.tables.items():
    expected = tables[name].state()
    errors[f"{name}/back"] = max(
        float(np.max(np.abs(table.state()[k].numpy() - expected[k].numpy())))
        for k in expected)
    errors[f"{name}/step"] = table.step_value()
  errors["nonfinite_error"] = nonfinite_error
  errors["nonfinite_unchanged"] = unchanged
  # A checkpoint whose table B has another shape restores no table of the
  # mesh's layer (every table is checked before any is written).
  bad_configs = h.feature_configs(kind)
  for feature in bad_configs.values():
    if feature.table.name == "B":
      feature.table.vocabulary_size = 60
  with strategy.scope():
    bad_layer = tfde.layers.DistributedEmbedding(bad_configs)
  bad_path = tf.train.Checkpoint(**bad_layer.tables).write(f"{directory}/bad")
  before = {n: {k: v.numpy() for k, v in t.state().items()} for n, t in other.tables.items()}
  try:
    tf.train.Checkpoint(**other.tables).read(bad_path)
    errors["bad_restore_error"] = None
  except ValueError as e:
    errors["bad_restore_error"] = str(e)
  errors["bad_restore_unchanged"] = all(
      np.array_equal(v.numpy(), before[n][k])
      for n, t in other.tables.items() for k, v in t.state().items())
  return errors


def main():
  specs = sys.argv[1:]
  if specs[0] == "layout-and-checkpoint":
    print(json.dumps(layout_case()), flush=True)
    print(json.dumps(checkpoint_case(specs[1])), flush=True)
    print(json.dumps(tutorial_case()), flush=True)
    specs = specs[2:]
  for spec in specs:
    parts = spec.split(":")
    size, kind = parts[0], parts[1]
    variant = int(parts[2]) if len(parts) > 2 else 0
    print(json.dumps(run_case(size, kind, variant)), flush=True)


if __name__ == "__main__":
  main()
