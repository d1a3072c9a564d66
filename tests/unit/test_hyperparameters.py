"""Sparse optimizers' hyper-parameters are validated where they are set: a
value that would write NaN or inf into the rows a step touches is refused,
naming the table and the value."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfde
from tfde import optimizers

BAD = [
    ("sgd", {"learning_rate": float("nan")}, "learning_rate"),
    ("sgd", {"learning_rate": float("inf")}, "learning_rate"),
    ("sgd", {"learning_rate": 1e39}, "learning_rate"),
    ("adagrad", {"learning_rate": 1e39}, "learning_rate"),
    ("adam", {"beta_1": 1.0}, "beta_1"),
    ("adam", {"beta_1": float("nan")}, "beta_1"),
    ("adam", {"beta_2": 1.0}, "beta_2"),
    ("adam", {"beta_2": -0.1}, "beta_2"),
    ("adam", {"epsilon": 0.0}, "epsilon"),
    ("adam", {"epsilon": float("inf")}, "epsilon"),
    ("adam", {"bias_correction": "yes"}, "bias_correction"),
    ("adagrad", {"epsilon": float("nan")}, "epsilon"),
    ("adagrad", {"initial_accumulator_value": -1.0}, "initial_accumulator_value"),
    ("adagrad", {"initial_accumulator_value": 0.0, "epsilon": 0.0}, "both 0"),
    ("rowwise_adagrad", {"epsilon": float("inf")}, "epsilon"),
    ("ftrl", {"learning_rate_power": 0.5}, "learning_rate_power"),
    ("ftrl", {"l1_regularization_strength": float("nan")}, "l1_regularization_strength"),
    ("ftrl", {"l2_regularization_strength": -1.0}, "l2_regularization_strength"),
    ("ftrl", {"l2_shrinkage_regularization_strength": float("inf")},
     "l2_shrinkage_regularization_strength"),
    ("ftrl", {"beta": -1.0}, "beta"),
    ("ftrl", {"initial_accumulator_value": float("nan")}, "initial_accumulator_value"),
]


@pytest.mark.parametrize("kind,hyper,name", BAD)
def test_table_config_refuses_hyperparameter(kind, hyper, name):
  """Through a table's config (a dict optimizer), the error names table and value."""
  hyper = dict(hyper)
  config = {"kind": kind, "learning_rate": hyper.pop("learning_rate", 0.01), **hyper}
  with pytest.raises(ValueError, match=rf"table 'user'.*{name}"):
    tfde.TableConfig(name="user", vocabulary_size=8, embedding_dim=2, optimizer=config)


@pytest.mark.parametrize("kind,hyper,name", BAD)
def test_constructor_refuses_hyperparameter(kind, hyper, name):
  cls = optimizers._KINDS[kind]  # pylint: disable=protected-access
  with pytest.raises(ValueError, match=name):
    cls(**hyper)


def test_error_shows_value():
  with pytest.raises(ValueError, match=r"table 'user': SGD learning_rate must be a "
                     r"finite float32 > 0, got nan"):
    tfde.TableConfig(name="user", vocabulary_size=8, embedding_dim=2,
                     optimizer={"kind": "sgd", "learning_rate": math.nan})


@pytest.mark.parametrize("keras_optimizer,name", [
    (lambda: keras.optimizers.SGD(learning_rate=float("nan")), "learning_rate"),
    (lambda: keras.optimizers.SGD(learning_rate=float("inf")), "learning_rate"),
    (lambda: keras.optimizers.SGD(learning_rate=1e39), "learning_rate"),
    (lambda: keras.optimizers.Adam(beta_1=1.0), "beta_1"),
    (lambda: keras.optimizers.Adam(beta_1=float("nan")), "beta_1"),
    (lambda: keras.optimizers.Adagrad(epsilon=float("nan")), "epsilon"),
])
def test_keras_optimizer_refused(keras_optimizer, name):
  with pytest.raises(ValueError, match=rf"table 'user'.*{name}"):
    tfde.TableConfig(name="user", vocabulary_size=8, embedding_dim=2,
                     optimizer=keras_optimizer())


def test_setting_after_construction_is_checked():
  """Where it is set: assigning a bad value later is refused too, and a
  mutated optimizer handed to a table is re-checked naming the table."""
  opt = optimizers.Adam()
  with pytest.raises(ValueError, match="beta_1"):
    opt.hyper["beta_1"] = 1.0
  with pytest.raises(ValueError, match="learning_rate"):
    opt.learning_rate = float("nan")
  assert opt.hyper["beta_1"] == 0.9 and opt.learning_rate == 0.001
  dict.__setitem__(opt.hyper, "beta_2", float("nan"))  # bypassing the check
  with pytest.raises(ValueError, match=r"table 'user'.*beta_2"):
    tfde.TableConfig(name="user", vocabulary_size=8, embedding_dim=2, optimizer=opt)


def test_good_values_still_train():
  """Edge values inside the rules are accepted and update finitely (numpy oracle)."""
  opt = optimizers.Adam(learning_rate=0.5, beta_1=0.0, beta_2=0.0, epsilon=1e-7)
  table = tf.Variable(tf.zeros([2, 2]))
  slots = opt.create_slots(table.shape)
  opt.apply(table, slots, tf.constant([1]), tf.constant([[2.0, -4.0]]), step=1)
  # beta 0: m = g, v = g^2, step = lr * g / (|g| + eps).
  np.testing.assert_allclose(table.numpy()[1], [-0.5, 0.5], rtol=1e-6)
  assert table.numpy()[0].tolist() == [0.0, 0.0]
  assert optimizers.get({"kind": "ftrl", "learning_rate": 0.1,
                         "learning_rate_power": 0.0}).hyper["learning_rate_power"] == 0.0


@pytest.mark.parametrize("make", [
    lambda: tfde.optimizers.Adam(epsilon=1e-50),          # 0 in float32
    lambda: tfde.optimizers.Adam(beta_1=1 - 1e-12),       # 1 in float32
    lambda: tfde.optimizers.Adagrad(epsilon=1e-50, initial_accumulator_value=0.0),
    lambda: tfde.optimizers.RowwiseAdagrad(epsilon=1e-50, initial_accumulator_value=0.0),
    lambda: tfde.optimizers.Ftrl(initial_accumulator_value=0.0),
])
def test_values_that_float32_rounds_into_a_nan_step_are_refused(make):
  with pytest.raises(ValueError):
    make()


def test_an_assignment_that_breaks_a_combined_rule_is_refused_and_undone():
  opt = tfde.optimizers.Adagrad(initial_accumulator_value=0.0, epsilon=1e-7)
  with pytest.raises(ValueError, match="both 0"):
    opt.hyper["epsilon"] = 0.0
  assert opt.hyper["epsilon"] == 1e-7


def _table(optimizer, name="user"):
  return tfde.TableConfig(name=name, vocabulary_size=8, embedding_dim=2,
                          optimizer=optimizer)


def test_configs_keep_the_optimizer_given_and_build_none(monkeypatch):
  """A config is data: it keeps what the user passed and checks it without
  building a tfde optimizer; the table builds one from it."""
  def refuse(*args, **kwargs):
    raise AssertionError("a config built a SparseOptimizer")
  schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
  given = [None, "lazy_adam", {"kind": "ftrl", "beta": 0.5},
           keras.optimizers.Adagrad(learning_rate=0.05, clipnorm=2.0),
           keras.optimizers.SGD(learning_rate=schedule)]
  with monkeypatch.context() as patched:
    patched.setattr(optimizers.SparseOptimizer, "__init__", refuse)
    configs = [_table(g) for g in given]
    canonical = [c.optimizer_config() for c in configs]
    assert [tfde.TableConfig.from_config(c.get_config()) for c in configs] == configs
  assert all(c.optimizer is g for c, g in zip(configs, given))
  # Keras's own defaults and the values given are the oracle.
  adam, adagrad = keras.optimizers.Adam(), keras.optimizers.Adagrad()
  assert canonical[0] == {"kind": "sgd", "learning_rate": 0.01}
  adam_rate = pytest.approx(adam.get_config()["learning_rate"])
  assert canonical[1] == {"kind": "adam", "learning_rate": adam_rate,
                          "beta_1": adam.beta_1, "beta_2": adam.beta_2,
                          "epsilon": adam.epsilon, "bias_correction": True}
  assert (canonical[2]["kind"], canonical[2]["beta"]) == ("ftrl", 0.5)
  assert canonical[3] == {"kind": "adagrad", "learning_rate": pytest.approx(0.05),
                          "initial_accumulator_value": adagrad.initial_accumulator_value,
                          "epsilon": adagrad.epsilon, "clipnorm": 2.0}
  assert canonical[4]["learning_rate"]["class_name"] == "ExponentialDecay"
  built = optimizers.get(configs[4].optimizer)
  assert float(built.learning_rate(10)) == pytest.approx(0.05)


def test_tables_given_one_optimizer_share_it_and_others_build_their_own():
  shared = optimizers.Adam(learning_rate=0.5)
  lookup = tfde.lookup.ShardedLookup({
      "a": tfde.FeatureConfig(name="a", table=_table(shared, "ta")),
      "b": tfde.FeatureConfig(name="b", table=_table(shared, "tb")),
      "c": tfde.FeatureConfig(name="c", table=_table("adam", "tc")),
      "d": tfde.FeatureConfig(name="d", table=_table("adam", "td"))})
  assert lookup.tables["ta"].optimizer is shared is lookup.tables["tb"].optimizer
  assert lookup.tables["tc"].optimizer is not lookup.tables["td"].optimizer
  assert lookup.tables["tc"].optimizer.kind == "adam"
  # Changed after the configs were made, the shared optimizer is the tables'.
  shared.learning_rate = 0.25
  assert lookup.tables["ta"].optimizer.learning_rate == 0.25


@pytest.mark.parametrize("optimizer,match", [
    ({"kind": "bogus"}, "kind must be one of"),
    ({"learning_rate": 0.1}, "kind must be one of"),
    ({"kind": "sgd", "learning_rate": {"class_name": "Nope", "config": {}}},
     "LearningRateSchedule's config"),
    ({"kind": "sgd", "momentum": 0.9}, r"SGD does not support \['momentum'\]"),
    (object(), "unsupported optimizer"),
])
def test_a_bad_optimizer_config_is_refused_naming_the_table(optimizer, match):
  with pytest.raises(ValueError, match=rf"table 'user': .*{match}"):
    _table(optimizer)


class _Halving(keras.optimizers.schedules.LearningRateSchedule):
  """A user's own schedule, which Keras has not registered: 0.5, 0.25, ..."""

  def __call__(self, step):
    return 0.5 ** (tf.cast(step, tf.float32) + 1.0)

  def get_config(self):
    return {}


@pytest.mark.parametrize("make", [
    lambda schedule: optimizers.SGD(learning_rate=schedule),
    lambda schedule: keras.optimizers.SGD(learning_rate=schedule),
    lambda schedule: {"kind": "sgd", "learning_rate": schedule},
], ids=["tfde", "keras", "dict"])
def test_a_users_own_schedule_trains_the_table(make):
  schedule = _Halving()
  table = tfde.TableConfig(name="user", vocabulary_size=4, embedding_dim=2,
                           initializer="zeros", optimizer=make(schedule))
  assert table.get_config()["optimizer"]["learning_rate"]["class_name"] == "_Halving"
  lookup = tfde.lookup.ShardedLookup({"f": tfde.FeatureConfig(name="f", table=table)})
  assert lookup.tables["user"].optimizer.learning_rate is schedule
  for _ in range(2):
    with tf.GradientTape() as tape:
      out = lookup({"f": tf.ragged.constant([[1]], tf.int64)})
      loss = tf.reduce_sum(out["f"])
    tape.gradient(loss, lookup.trainable_variables)
  # Gradient 1 per element at steps 1 and 2: -(0.5 + 0.25).
  np.testing.assert_allclose(lookup.tables["user"].state()["table"].numpy(),
                             [[0, 0], [-0.75, -0.75], [0, 0], [0, 0]])


def test_a_keras_learning_rate_function_is_refused_naming_the_table():
  with pytest.raises(ValueError, match="table 'user': SGD's learning_rate is a function"):
    _table(keras.optimizers.SGD(learning_rate=lambda: 0.1))
