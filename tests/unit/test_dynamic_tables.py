"""Dynamic tables (vocabulary_size=None) against a numpy dict-of-rows
oracle (tests/support/oracles.py: DynamicTableOracle), on the kernel's hash-table
resource and on its tf.lookup twin, for N in {1, 2, 4} replicas."""

import os

import numpy as np
import pytest
import tensorflow as tf

import tfde
import tfde.ops
from tests.support import oracles
from tests.support.dynamic_harness import ATOL  # noqa: F401  (re-exported for other tests)
from tests.support.dynamic_harness import DIM  # noqa: F401  (re-exported for other tests)
from tests.support.dynamic_harness import GLOBAL_BATCH  # noqa: F401  (re-exported for other tests)
from tests.support.dynamic_harness import POOL  # noqa: F401  (re-exported for other tests)
from tests.support.dynamic_harness import RTOL  # noqa: F401  (re-exported for other tests)
from tests.support.dynamic_harness import _init_spec  # noqa: F401  (re-exported for other tests)
from tests.support.dynamic_harness import _keras_initializer  # noqa: F401  (re-exported for other tests)
from tests.support.dynamic_harness import feature_configs  # noqa: F401  (re-exported for other tests)
from tests.support.dynamic_harness import make_batch  # noqa: F401  (re-exported for other tests)
from tests.support.dynamic_harness import mirrored  # noqa: F401  (re-exported for other tests)
from tests.support.dynamic_harness import oracle_for  # noqa: F401  (re-exported for other tests)
from tests.support.dynamic_harness import oracle_step  # noqa: F401  (re-exported for other tests)
from tests.support.dynamic_harness import replica_inputs  # noqa: F401  (re-exported for other tests)
from tests.support.dynamic_harness import table_config  # noqa: F401  (re-exported for other tests)


class Trainer:
  """The pipeline under MirroredStrategy over n logical CPUs."""

  def __init__(self, strategy, configs, **lookup_kwargs):
    self.strategy = strategy
    self.n = strategy.num_replicas_in_sync
    with strategy.scope():
      self.lookup = tfde.lookup.ShardedLookup(configs, **lookup_kwargs)

    def replica_step(inputs, weights, targets):
      with tf.GradientTape() as tape:
        outputs = self.lookup(inputs, weights)
        loss = tf.add_n([tf.reduce_sum(tf.square(outputs[f] - targets[f]))
                         for f in outputs]) / GLOBAL_BATCH
      tape.gradient(loss, self.lookup.trainable_variables)
      return outputs

    @tf.function(reduce_retracing=True)
    def step(inputs, weights, targets):
      return strategy.run(replica_step, args=(inputs, weights, targets))

    self._step = step

  def __call__(self, batch):
    per = [replica_inputs(batch, r, self.n) for r in range(self.n)]
    dist = lambda i: self.strategy.experimental_distribute_values_from_function(
        lambda ctx: per[ctx.replica_id_in_sync_group][i])
    outputs = self._step(dist(0), dist(1), dist(2))
    local = self.strategy.experimental_local_results(outputs)
    return {f: np.concatenate([o[f].numpy() for o in local]) for f in ("clicks", "pair")}

  @property
  def table(self):
    return self.lookup.tables["users"]


def assert_table_equals_oracle(table, oracle, exact_only=False):
  rows = table.export_rows()
  want_ids = sorted(oracle.rows)
  np.testing.assert_array_equal(rows["ids"], want_ids)
  np.testing.assert_array_equal(rows["counts"], [oracle.rows[k]["count"] for k in want_ids])
  np.testing.assert_array_equal(rows["last_seen"], [oracle.rows[k]["last"] for k in want_ids])
  pending = sorted(oracle.pending)
  np.testing.assert_array_equal(rows["pending_ids"], pending)
  np.testing.assert_array_equal(rows["pending_counts"], [oracle.pending[k][0] for k in pending])
  if not exact_only and want_ids:
    np.testing.assert_allclose(rows["table"], [oracle.rows[k]["w"] for k in want_ids],
                               rtol=RTOL, atol=ATOL)


# ---- initial values


@pytest.mark.parametrize("init", ["zeros", "constant", "uniform", "normal",
                                  "truncated_normal"])
def test_initial_values_are_a_function_of_seed_and_id(op_backend, init):
  del op_backend
  table = tfde.tables.DynamicTable(table_config("sgd", init, seed=11))
  ids = tf.constant(POOL, tf.int64)
  got = table.lookup_local(0, ids, None, training=False).numpy()
  kind, a, b = _init_spec(init)
  want = [oracles.dynamic_initial_row(int(k), DIM, kind, a, b, 11) for k in POOL]
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  assert table.size() == 0  # an inference lookup creates nothing
  if init in ("uniform", "normal", "truncated_normal"):
    assert np.std(got) > 0.1
    if init == "truncated_normal":
      assert np.all(np.abs(got) <= 2 * 0.5 + 1e-6)


def test_unreproducible_initializer_is_rejected():
  import keras  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="table 'users' is dynamic.*GlorotUniform"):
    tfde.tables.DynamicTable(tfde.TableConfig(
        name="users", vocabulary_size=None, embedding_dim=4,
        initializer=keras.initializers.GlorotUniform()))


def test_dynamic_options_need_a_dynamic_table():
  with pytest.raises(ValueError, match="dynamic options need vocabulary_size=None"):
    tfde.TableConfig(name="t", vocabulary_size=10, embedding_dim=2,
                     dynamic=tfde.DynamicConfig())
  with pytest.raises(ValueError, match="admit_after must be an int >= 1"):
    tfde.DynamicConfig(admit_after=0)
  config = table_config(admit_after=3, evict_after_steps=5)
  assert tfde.TableConfig.from_config(config.get_config()) == config


def test_rowwise_adagrad_is_refused_for_dynamic_tables_by_name():
  """A dynamic table keeps each slot as wide as a row: row-wise Adagrad's
  one value per row is refused at the config, and by a table asked to
  switch to it, which keeps its optimizer."""
  with pytest.raises(ValueError, match="TableConfig 'users': 'rowwise_adagrad' keeps "
                                       "one slot value per row, and a dynamic table"):
    tfde.TableConfig(name="users", vocabulary_size=None, embedding_dim=4,
                     optimizer="rowwise_adagrad")
  table = tfde.tables.DynamicTable(table_config())
  kind = table.optimizer.kind
  with pytest.raises(ValueError, match="table 'users': 'rowwise_adagrad' keeps one slot "
                                       "value per row, and a dynamic table"):
    table.use_optimizer(tfde.optimizers.RowwiseAdagrad())
  assert table.optimizer.kind == kind == table.config.optimizer_config()["kind"]


def test_a_dynamic_store_refuses_a_row_wise_update(op_backend):
  """Below the table too: the store (kernel and twin) has no row-wise
  update, and says so rather than apply another rule."""
  table = tfde.tables.DynamicTable(table_config("adagrad"))
  store = table.stores[0]
  with pytest.raises(ValueError, match="dynamic tables have no 'rowwise_adagrad' update"):
    store.apply("rowwise_adagrad", tf.constant([1], tf.int64), tf.ones([1, DIM]),
                [0.1, 1e-8])


# ---- admission and eviction, scripted


SCRIPT = [  # ids of one sample each, step by step
    [[1], [2], [2]],          # 2 admitted (2 sightings); 1 waits
    [[1], [3], [4]],          # 1 admitted; 3, 4 wait
    [[5], [5], [5]],          # 5 admitted
    [[3], [6], [6]],          # 3 admitted; 6 admitted; 2 unseen for 3 steps
    [[5], [7], [8]],          # over 4 rows: the least frequent go
    [[9], [9], [5]],
]


def test_admission_and_eviction_follow_their_rules(op_backend):
  del op_backend
  dynamic = dict(admit_after=2, evict_after_steps=3, max_rows_per_shard=3)
  table = tfde.TableConfig(name="users", vocabulary_size=None, embedding_dim=DIM,
                           optimizer=tfde.optimizers.SGD(learning_rate=0.5),
                           initializer="uniform", combiner="sum",
                           dynamic=tfde.DynamicConfig(**dynamic))
  lookup = tfde.lookup.ShardedLookup([tfde.FeatureConfig(name="f", table=table)])
  oracle = oracles.DynamicTableOracle(
      DIM, "sgd", dict(learning_rate=0.5), init=("uniform", -0.05, 0.05),
      admit_after=2, evict_after_steps=3, max_rows=3)
  history = []
  for ids in SCRIPT:
    target = np.ones((len(ids), DIM), np.float32)
    with tf.GradientTape() as tape:
      out = lookup({"f": tf.constant(ids, tf.int64)})["f"]
      loss = tf.reduce_sum(tf.square(out - target))
    tape.gradient(loss, lookup.trainable_variables)
    want = oracle.train_step([(ids, None, "sum", target, 1.0)])[0]
    np.testing.assert_allclose(out.numpy(), want, rtol=RTOL, atol=ATOL)
    assert_table_equals_oracle(lookup.tables["users"], oracle)
    history.append(sorted(oracle.rows))
  # The rules, spelled out: admitted on the 2nd sighting, gone after 3
  # unseen steps or when a shard holds more than 3 rows (coldest first).
  assert history == [[2], [1, 2], [1, 2, 5], [3, 5, 6], [3, 5, 6], [5, 6, 9]]


def test_export_seen_after_lists_only_the_rows_seen_since(op_backend):
  """A delta's export: the rows last seen after a step, as the whole export
  filtered in numpy; pending ids whole; a non-scalar step refused."""
  del op_backend
  table = tfde.TableConfig(name="users", vocabulary_size=None, embedding_dim=DIM,
                           optimizer=tfde.optimizers.Adagrad(learning_rate=0.5),
                           initializer="uniform", combiner="sum",
                           dynamic=tfde.DynamicConfig(admit_after=2))
  lookup = tfde.lookup.ShardedLookup([tfde.FeatureConfig(name="f", table=table)])
  for ids in SCRIPT:
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(lookup({"f": tf.constant(ids, tf.int64)})["f"])
    tape.gradient(loss, lookup.trainable_variables)
  store = lookup.tables["users"].stores[0]
  whole = [x.numpy() for x in store.export()]
  assert len(whole[0]) >= 4 and len(set(whole[3])) >= 3  # rows of several steps
  for step in sorted(set(whole[3])) + [-1, 10**6]:
    since = [x.numpy() for x in store.export(seen_after=step)]
    keep = whole[3] > step
    for got, want in zip(since[:4], whole[:4]):
      np.testing.assert_array_equal(got, want[keep])
    for got, want in zip(since[4:], whole[4:]):
      np.testing.assert_array_equal(got, want)
  with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="seen_after"):
    store.export(seen_after=tf.constant([1, 2], tf.int64))


def test_zeros_until_admitted(op_backend):
  del op_backend
  table = tfde.tables.DynamicTable(table_config(
      "sgd", "uniform", admit_after=2, unadmitted_value="zeros"))
  first = table.lookup_local(0, tf.constant([5, 9], tf.int64),
                             tf.constant([1, 2], tf.int64), training=True).numpy()
  assert np.all(first[0] == 0)  # seen once: not admitted, zeros
  assert np.any(first[1] != 0)  # seen twice in one batch: admitted at once
  assert table.size() == 1


# ---- training equals the dict oracle, N = 1, 2, 4


STEPS = 8


def _train_against_oracle(n, kind):
  dynamic = dict(admit_after=2, evict_after_steps=4)
  trainer = Trainer(mirrored(n), feature_configs(table_config(kind, **dynamic)))
  oracle = oracle_for(kind, **dynamic)
  for step in range(STEPS):
    batch = make_batch(step)
    got = trainer(batch)
    want = oracle_step(oracle, batch)
    for f in got:
      np.testing.assert_allclose(got[f], want[f], rtol=RTOL, atol=ATOL,
                                 err_msg=f"step {step} feature {f}")
  assert_table_equals_oracle(trainer.table, oracle)
  assert len(oracle.rows) > 5 and oracle.pending  # admission did something
  for store_step in trainer.table.steps.values():
    assert int(store_step.numpy()) == STEPS


@pytest.mark.parametrize("n", [1, 2, 4], ids=lambda n: f"N{n}")
@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam", "ftrl"])
def test_training_equals_dict_oracle(n, kind):
  _train_against_oracle(n, kind)


def test_twin_trains_like_the_dict_oracle_under_two_replicas():
  with tfde.ops.backend(tfde.ops.REFERENCE):
    _train_against_oracle(2, "adam")


# ---- checkpoints: any replica count


@pytest.mark.parametrize("restore_n", [1, 4], ids=lambda n: f"to_N{n}")
def test_checkpoint_restores_onto_other_replica_counts(tmp_path, restore_n):
  dynamic = dict(admit_after=2, evict_after_steps=4)
  trainer = Trainer(mirrored(2), feature_configs(table_config("adagrad", **dynamic)))
  oracle = oracle_for("adagrad", **dynamic)
  for step in range(3):
    batch = make_batch(step)
    trainer(batch)
    oracle_step(oracle, batch)
  saved = trainer.table.export_rows()
  path = tf.train.Checkpoint(lookup=trainer.lookup).write(str(tmp_path / "ckpt"))

  restored = Trainer(mirrored(restore_n),
                     feature_configs(table_config("adagrad", **dynamic)))
  tf.train.Checkpoint(lookup=restored.lookup).read(path).assert_consumed()
  again = restored.table.export_rows()
  for key in saved:
    np.testing.assert_array_equal(again[key], saved[key], err_msg=key)
  # Training on equals training that never stopped.
  for step in range(3, 6):
    batch = make_batch(step)
    got = restored(batch)
    want = oracle_step(oracle, batch)
    np.testing.assert_allclose(got["pair"], want["pair"], rtol=RTOL, atol=ATOL)
  assert_table_equals_oracle(restored.table, oracle)


def test_checkpoint_of_another_width_is_refused_and_changes_nothing(tmp_path):
  table = tfde.tables.DynamicTable(table_config("sgd"))
  table.lookup_local(0, tf.constant([3, 4], tf.int64), tf.constant([1, 1], tf.int64),
                     training=True)
  path = tf.train.Checkpoint(t=table).write(str(tmp_path / "ckpt"))
  wider = tfde.TableConfig(name="users", vocabulary_size=None, embedding_dim=DIM + 1,
                           optimizer="sgd", initializer="zeros")
  other = tfde.tables.DynamicTable(wider)
  other.lookup_local(0, tf.constant([9], tf.int64), tf.constant([1], tf.int64),
                     training=True)
  with pytest.raises(ValueError, match=r"table 'users'.*shape \(2, 4\).*\(None, 5\)"):
    tf.train.Checkpoint(t=other).read(path)
  np.testing.assert_array_equal(other.export_rows()["ids"], [9])


# ---- growth and memory


def _insert(table, ids, batch=250_000):
  for start in range(0, len(ids), batch):
    chunk = tf.constant(ids[start:start + batch], tf.int64)
    table.lookup_local(0, chunk, tf.ones_like(chunk), training=True)


def _rss_bytes():
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# Per live row (dim 8, SGD): 32 bytes of values, 24 of id, count and step,
# and at most 32 of hash index (16-byte slots, at least half full).
BYTES_PER_ROW_BOUND = 100


def test_a_million_live_ids_stay_within_the_memory_bound():
  config = tfde.TableConfig(name="big", vocabulary_size=None, embedding_dim=8,
                            optimizer="sgd", initializer="zeros")
  rng = np.random.default_rng(0)
  spread = np.unique(rng.integers(-2**63, 2**63 - 1, size=1_050_000, dtype=np.int64))
  spread = rng.permutation(spread)[:1_000_000]
  with tfde.ops.backend(tfde.ops.KERNELS):
    before = _rss_bytes()
    table = tfde.tables.DynamicTable(config)
    _insert(table, spread)
    grown = _rss_bytes() - before
    assert table.size() == 1_000_000
    held = table.memory_bytes()
    assert held <= BYTES_PER_ROW_BOUND * 1_000_000, held
    # What the process really grew by is of the same order (TF's own
    # buffers come and go around it).
    assert grown <= 2 * BYTES_PER_ROW_BOUND * 1_000_000, grown
    # Memory follows the live rows, not the id range: dense small ids cost
    # the same.
    dense = tfde.tables.DynamicTable(config)
    _insert(dense, np.arange(1_000_000, dtype=np.int64))
    assert abs(dense.memory_bytes() - held) <= 0.01 * held
    # Rows read back as stored.
    some = tf.constant(spread[:5], tf.int64)
    np.testing.assert_array_equal(table.lookup_local(0, some, None, False).numpy(),
                                  np.zeros((5, 8)))
    table.assign_rows(tf.zeros([0], tf.int64), tf.zeros([0, 8]))  # frees the rows
    assert table.size() == 0


# ---- bad input


def test_ids_of_a_wrong_dtype_are_refused_and_change_nothing(op_backend):
  del op_backend
  lookup = tfde.lookup.ShardedLookup(feature_configs(table_config("sgd")))
  lookup({"clicks": tf.ragged.constant([[1, 2]], tf.int64),
          "pair": tf.constant([[3, 4]], tf.int64)})
  before = lookup.tables["users"].export_rows()
  with pytest.raises(TypeError, match=r"feature pair \(table users\).*float32"):
    lookup({"clicks": tf.ragged.constant([[1]], tf.int64),
            "pair": tf.constant([[3.0, 4.0]])})
  after = lookup.tables["users"].export_rows()
  for key in before:
    np.testing.assert_array_equal(before[key], after[key])


def test_repeated_ids_in_an_update_are_refused(op_backend):
  del op_backend
  table = tfde.tables.DynamicTable(table_config("adam"))
  table.lookup_local(0, tf.constant([3, 4], tf.int64), tf.constant([1, 1], tf.int64),
                     training=True)
  before = table.export_rows()
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids\[2\] = 3 repeats ids\[0\]"):
    table.apply_gradient(0, tf.constant([3, 4, 3], tf.int64), tf.ones([3, DIM]))
  after = table.export_rows()
  np.testing.assert_array_equal(after["table"], before["table"])


# ---- Keras: fit, predict, save and load, export for serving


def _hashed_ranking_model():
  """test_layers' ranking model with users as hashed 64-bit ids in a dynamic
  table (admitted on the second sighting; keras-rs's default initializer)."""
  from tests.unit import test_layers  # pylint: disable=g-import-not-at-top
  return test_layers._ranking_model(  # pylint: disable=protected-access
      user_dynamic=tfde.DynamicConfig(admit_after=2))


def _hashed_data(num, seed=0):
  from tests.unit import test_layers  # pylint: disable=g-import-not-at-top
  x, y = test_layers._ranking_data(num, seed)  # pylint: disable=protected-access
  # Each user id hashed to a 64-bit key (about half of them negative).
  x["user_id"] = (x["user_id"].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
                  ).view(np.int64)
  return x, y


def test_keras_fit_predict_save_load_and_serve(tmp_path):
  import keras  # pylint: disable=g-import-not-at-top

  from tests.unit import test_serving  # pylint: disable=g-import-not-at-top
  with mirrored(2).scope():
    model = _hashed_ranking_model()
    model.compile(optimizer=keras.optimizers.Adam(0.005), loss="mse")
  x, y = _hashed_data(4096)
  history = model.fit(x, y, batch_size=256, epochs=8, verbose=0)
  # The same margin as the static model's test in test_layers.
  assert history.history["loss"][-1] < 0.5 * history.history["loss"][0]
  layer = model.get_layer("embedding")
  table = layer.tables["user"]
  assert table.size() == len(np.unique(x["user_id"]))
  before = table.export_rows()

  # predict and evaluate neither count sightings nor admit new ids.
  fresh = dict(x, user_id=np.arange(len(x["user_id"]), dtype=np.int64) + 10**15)
  want = model.predict(fresh, batch_size=512, verbose=0)
  model.evaluate(fresh, y, batch_size=512, verbose=0)
  after = table.export_rows()
  for key in before:
    np.testing.assert_array_equal(before[key], after[key], err_msg=key)

  # A .keras file restores the table under another replica count.
  model.save(tmp_path / "model.keras")
  with mirrored(1).scope():
    loaded = keras.models.load_model(tmp_path / "model.keras")
  again = loaded.get_layer("embedding").tables["user"].export_rows()
  for key in before:
    np.testing.assert_array_equal(before[key], again[key], err_msg=key)
  # So do save_weights / load_weights, into a fresh model on 4 replicas.
  model.save_weights(tmp_path / "model.weights.h5")
  with mirrored(4).scope():
    other = _hashed_ranking_model()
  other.load_weights(tmp_path / "model.weights.h5")
  again = other.get_layer("embedding").tables["user"].export_rows()
  for key in before:
    np.testing.assert_array_equal(before[key], again[key], err_msg=key)

  # Served without tfde: known ids from their rows, unknown ones from the
  # initial value they would start with, as the model does.
  mixed = {k: v[:64].copy() for k, v in x.items()}
  mixed["user_id"][::2] = fresh["user_id"][:32]
  want = model.predict(mixed, batch_size=64, verbose=0)
  tfde.export_for_serving(model, str(tmp_path / "served"), mixed)
  served = test_serving._serve_elsewhere(tmp_path, tmp_path / "served", mixed)  # pylint: disable=protected-access
  np.testing.assert_allclose(np.array(served["outputs"]["output"]), want,
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dim,slots", [(2**31, ()), (2**30, (0.0,))])
def test_rows_wider_than_2_to_the_31_floats_are_refused_by_spec_and_kernel(dim, slots):
  """A row (embedding and slots) of 2^31 floats or more is refused before
  anything is made, by the spec (both backends) and by the kernel itself.
  (The kernel took 2^40 floats and the twin's Fill refused it: a fuzz
  harness's finding.)"""
  with pytest.raises(ValueError, match=f"dim = {dim} with {1 + len(slots)} slots is too "
                     "wide a row: at most 2147483647 floats"):
    tfde.ops.DynamicTableSpec(dim=dim, slot_initial_values=slots)
  assert tfde.ops.DynamicTableSpec(dim=dim - 1,
                                   slot_initial_values=slots).dim == dim - 1
  with pytest.raises(tf.errors.InvalidArgumentError, match=f"dim = {dim} with "
                     f"{1 + len(slots)} slots is too wide a row: at most 2147483647 floats"):
    tfde.ops.native.load().tfde_dynamic_table_handle(
        shared_name=f"too_wide_{dim}", dim=dim, slot_initial_values=list(slots),
        initializer="zeros")


def test_table_ops_refuse_malformed_inputs():
  """The kernel's ops check shapes themselves (eager calls skip shape
  functions): an error, never a crash."""
  lib = tfde.ops.native.load()
  handle = lib.tfde_dynamic_table_handle(shared_name="malformed_inputs", dim=2,
                                         initializer="zeros")
  one = tf.constant([1], tf.int64)
  with pytest.raises(tf.errors.InvalidArgumentError, match="step must be a scalar"):
    lib.tfde_dynamic_table_lookup(handle, one, one, tf.constant([1, 2], tf.int64),
                                  dim=2, insert=True)
  with pytest.raises(tf.errors.InvalidArgumentError, match="counts has 2 entries"):
    lib.tfde_dynamic_table_lookup(handle, one, tf.constant([1, 1], tf.int64),
                                  tf.constant(1, tf.int64), dim=2, insert=True)
  with pytest.raises(tf.errors.InvalidArgumentError, match="max_rows must be a scalar"):
    lib.tfde_dynamic_table_evict(handle, tf.constant(1, tf.int64), tf.constant(0, tf.int64),
                                 tf.zeros([3], tf.int64))
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"values have shape \[1,3,2\]"):
    empty = tf.zeros([0], tf.int64)
    lib.tfde_dynamic_table_import(handle, one, tf.zeros([1, 3, 2]), one, one, empty,
                                  empty, empty)
  with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids\[1\] = 1 repeats ids\[0\]"):
    lib.tfde_dynamic_table_import(handle, tf.constant([1, 1], tf.int64), tf.zeros([2, 1, 2]),
                                  tf.constant([1, 1], tf.int64), tf.constant([1, 1], tf.int64),
                                  empty, empty, empty)
  # Still usable, and unchanged by the refused calls.
  assert int(lib.tfde_dynamic_table_stats(handle)[0]) == 0
