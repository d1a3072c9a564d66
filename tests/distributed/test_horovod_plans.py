"""Plans in which a rank holds none of an exchange group's rows, under
Horovod: their collectives survive TensorFlow's graph optimizers, and
2-rank `horovodrun` jobs train them as the unsharded reference does.

Horovod's collectives are not stateful ops, so the optimizers may treat
them as pure computations: constant folding runs one whose inputs are all
constants while optimizing the graph (each rank at its own moment, so the
ranks block in each other's optimizers), and the dependency optimizer turns
one whose results feed only control edges into a no-op (that rank never
joins, and its peers wait forever). Both hung real `horovodrun` jobs where
a rank holds none of a group's rows.

Here a stand-in for `horovod.tensorflow` makes each collective a stateless
op, as Horovod's are, and the traced step is optimized by Grappler as a
session would (constant folding and the dependency optimizer, on the
step's fetches): every collective must come out as it went in. Its
boundary: the runtime's own constant folder (which folds what Grappler
leaves, a placeholder with a default) and TF1 graphs are not examined
here, and the stand-in keeps static shapes where Horovod's output has an
unknown first dimension. Then the 2-rank runs, which exercise all of it
for real (with the helpers of tests/distributed/test_multiprocess.py).
"""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.grappler import tf_optimizer

import tfde
from tests.distributed.test_multiprocess import TIMEOUT_S
from tests.distributed.test_multiprocess import _check_against_reference
from tests.distributed.test_multiprocess import _check_dynamic
from tests.distributed.test_multiprocess import _dynamic_batches
from tests.distributed.test_multiprocess import _horovodrun
from tests.distributed.test_multiprocess import _write_batches
from tests.workers import horovod_tf1_worker

L = tfde.planner.TableLayout

# Each plan leaves some rank without rows of some exchange group.
PLANS = {
    # A table-wise table alone in its width on each rank.
    "table_wise_widths": ({"A": 1, "B": 2},
                          {"A": L("table_wise", [0]), "B": L("table_wise", [1])}),
    # A table-wise table beside a row-wise one of another width (the sum's
    # output gradient of ones made the pooled exchange's inputs constants).
    "table_wise_beside_row_wise": ({"A": 1, "B": 3},
                                   {"A": L("table_wise", [0]), "B": L("row_wise", [0, 1])}),
    # Column slices of uneven widths, on the two ranks.
    "column_wise_uneven": ({"C": 3}, {"C": L("column_wise", [0, 1], [1, 2])}),
    # A dynamic table whole on rank 1 (a width of None: dynamic, 2 wide).
    "dynamic_table_wise": ({"D": None}, {"D": L("table_wise", [1])}),
}


class _StandInHorovod:
  """What HorovodCommunicator reads of `horovod.tensorflow`: rank `rank`
  of 2, and collectives that are stateless ops of the same inputs (a roll
  by the splits stands in for the exchange: only the graph is examined).
  Records their node names."""

  def __init__(self, rank):
    self._rank = rank
    self.collectives = []

  def size(self):
    return 2

  def rank(self):
    return self._rank

  def _collective(self, tensor, splits):
    out = tf.raw_ops.Roll(input=tensor, shift=splits, axis=tf.zeros_like(splits))
    self.collectives.append(out.op.name)
    return out

  def alltoall(self, tensor, splits=None, name=None, ignore_name_scope=False):
    del name, ignore_name_scope
    return self._collective(tensor, splits), splits

  def allgather(self, tensor, name=None):
    del name
    return self._collective(tf.concat([tensor, tensor], 0), tf.zeros([1], tf.int32))


def _optimized(graph, fetches):
  """`graph` as Grappler's constant folding and dependency optimizer leave
  it, with `fetches` (op names) kept."""
  meta = tf.compat.v1.train.export_meta_graph(graph_def=graph.as_graph_def(),
                                                graph=graph)
  meta.collection_def["train_op"].node_list.value.extend(fetches)
  config = config_pb2.ConfigProto()
  rewrites = config.graph_options.rewrite_options
  rewrites.min_graph_nodes = -1
  rewrites.optimizers[:] = ["constfold", "dependency"]
  return tf_optimizer.OptimizeGraph(config, meta)


def _lookup(widths, layouts):
  tables = {n: tfde.TableConfig(name=n, vocabulary_size=None if w is None else 8,
                                embedding_dim=w or 2,
                                optimizer=tfde.optimizers.SGD(learning_rate=0.5))
            for n, w in widths.items()}
  return tfde.lookup.ShardedLookup(
      {n.lower(): tfde.FeatureConfig(name=n.lower(), table=t) for n, t in tables.items()},
      plan=tfde.planner.ShardingPlan(2, layouts), auto_replicate_bytes=0)


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("plan", sorted(PLANS))
def test_every_collective_of_a_traced_training_step_survives_the_optimizers(
    monkeypatch, plan, rank):
  hvd = _StandInHorovod(rank)
  communicator = tfde.comm.HorovodCommunicator(hvd)
  monkeypatch.setattr(tfde.comm, "current", lambda: communicator)
  lookup = _lookup(*PLANS[plan])

  @tf.function
  def train(ids):
    with tf.GradientTape() as tape:
      outputs = lookup({name: ids for name in lookup.feature_configs})
      loss = tf.add_n([tf.reduce_sum(out) for out in outputs.values()])
    tape.gradient(loss, lookup.trainable_variables)
    return loss

  graph = train.get_concrete_function(tf.TensorSpec([2, 1], tf.int64)).graph
  assert len(hvd.collectives) >= 4, hvd.collectives  # the forward's and the backward's
  fetches = [t.op.name for t in graph.outputs] + [op.name for op in graph.control_outputs]
  kinds = {node.name: node.op for node in _optimized(graph, fetches).node}
  changed = {name: kinds.get(name) for name in hvd.collectives if kinds.get(name) != "Roll"}
  assert not changed, (f"rank {rank}: collectives folded, dropped or made no-ops "
                       f"by the optimizers: {changed}")


def _reached(graph_def, fetches):
  """Every node a session runs for `fetches` (node names) in `graph_def`:
  what they reach through their inputs and control inputs."""
  nodes = {node.name: node for node in graph_def.node}
  seen, todo = set(), list(fetches)
  while todo:
    name = todo.pop()
    if name not in seen:
      seen.add(name)
      todo += [i.lstrip("^").split(":")[0] for i in nodes[name].input]
  return seen


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("plan", sorted(PLANS))
def test_a_tf1_train_op_alone_reaches_every_collective(monkeypatch, plan, rank):
  """A TF1 session runs only what its fetches reach: the train op alone
  must reach every collective of the forward and the backward on every
  rank, or a peer waits in one this rank skips (it hung: an owner whose
  updates need none of the rows it sends back skipped that exchange;
  and Horovod's exchanges, which take no received counts, left the
  plan's exchange of counts and its check of the steps unreached)."""
  hvd = _StandInHorovod(rank)
  communicator = tfde.comm.HorovodCommunicator(hvd)
  monkeypatch.setattr(tfde.comm, "current", lambda: communicator)
  with tf.Graph().as_default():
    lookup = _lookup(*PLANS[plan])
    built = len(hvd.collectives)  # the saved state's gathers, run by a Saver
    ids = tf.constant([[1], [3]], tf.int64)
    outputs = lookup({name: ids for name in lookup.feature_configs})
    loss = tf.add_n([tf.reduce_sum(out) for out in outputs.values()])
    train = tf.group([g for g in tf.gradients(loss, lookup.trainable_variables)
                      if g is not None])
    step = hvd.collectives[built:]
    assert len(step) >= 4, step  # the forward's and the backward's
    # As the session's Grappler leaves the graph, which drops inputs it
    # can do without (a shape it knows), then as the session prunes it.
    optimized = _optimized(tf.compat.v1.get_default_graph(), [train.name])
    skipped = sorted(set(step) - _reached(optimized, [train.name]))
    assert not skipped, f"rank {rank}: the train op alone skips {skipped}"
    # Reached, and still collectives: Grappler makes an op a no-op in place.
    kinds = {node.name: node.op for node in optimized.node}
    changed = {name: kinds[name] for name in step if kinds[name] != "Roll"}
    assert not changed, f"rank {rank}: collectives made no-ops: {changed}"


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("layouts,optimizer", [("mixed", "adam"), ("column_wise", "ftrl"),
                                               ("table_row_wise", "adagrad")])
def test_horovod_two_ranks_under_a_plan(tmp_path, layouts, optimizer):
  """The plans of tests/distributed/test_multiprocess.py's MultiWorker runs: "mixed"
  puts B, alone in its group, whole on rank 1 (and trains a row-wise
  lookup beside); "column_wise" puts C's 1-wide slice on rank 1 alone;
  "table_row_wise" spreads rows over some ranks. The first step's outputs
  and 10 steps' tables equal the numpy reference."""
  batches_path, batches = _write_batches(str(tmp_path), optimizer)
  beside = layouts == "mixed"
  _horovodrun(tmp_path, ["tests.workers.multiprocess_worker", "--mode", "horovod",
                         "--optimizer", optimizer, "--batches", batches_path,
                         "--out", str(tmp_path), "--layouts", layouts] +
              (["--beside-row-wise"] if beside else []))
  _check_against_reference(str(tmp_path), optimizer, batches, whole_tables=True,
                           beside=beside)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_dynamic_table_wise_table_under_horovod(tmp_path):
  """A dynamic table whole on rank 1, which hung under Horovod (rank 0
  holds none of it): outputs and the gathered table equal the dict oracle."""
  batches_path, batches = _dynamic_batches(str(tmp_path))
  _horovodrun(tmp_path, ["tests.workers.dynamic_worker", "--mode", "horovod", "--optimizer",
                         "ftrl", "--batches", batches_path, "--out", str(tmp_path),
                         "--layouts", "table_wise"])
  _check_dynamic(str(tmp_path), "ftrl", batches)


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("plan", ["table_wise", "beside_row_wise"])
def test_tf1_graph_under_horovod_trains_a_plan(tmp_path, plan):
  """A TF1 graph (`tf.compat.v1.Session`), where Horovod's splits pass
  through a stateful identity: a rank holding none of a group's rows
  trains 3 SGD steps of the sum of the outputs, and every row of both
  tables (probed through the lookup on each rank) moves as numpy says:
  by the learning rate times the id's count in both ranks' batches.
  The train op is fetched alone, which once hung (the session skipped
  an exchange its fetches did not reach)."""
  steps, w = 3, horovod_tf1_worker
  _horovodrun(tmp_path, ["tests.workers.horovod_tf1_worker", "--plan", plan, "--steps", str(steps),
                         "--out", str(tmp_path)])
  counts = np.bincount(w.BATCHES[0] + w.BATCHES[1], minlength=w.VOCAB)[:, None]
  ranks = [np.load(tmp_path / f"tf1_{plan}_{r}.npz") for r in (0, 1)]
  for feature in ("a", "b"):
    before = ranks[0][f"before/{feature}"]
    assert before.shape[0] == w.VOCAB and np.abs(before).max() > 0
    for result in ranks:
      np.testing.assert_array_equal(result[f"before/{feature}"], before)
      np.testing.assert_allclose(result[f"after/{feature}"],
                                 before - steps * w.LEARNING_RATE * counts, rtol=1e-6)
