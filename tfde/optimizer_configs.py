"""A table's optimizer as data: the kinds, their settings, and the one
canonical config of whatever a user may pass for `TableConfig.optimizer`.

>>> from tfde import optimizer_configs
>>> optimizer_configs.canonical("adagrad")
{'kind': 'adagrad', 'learning_rate': 0.001, 'initial_accumulator_value': 0.1, 'epsilon': 1e-07}
>>> optimizer_configs.canonical({"kind": "sgd", "learning_rate": float("nan")}, "user")
Traceback (most recent call last):
...
ValueError: table 'user': SGD learning_rate must be a finite float32 > 0, got nan

A canonical config is what `tfde.optimizers.SparseOptimizer.get_config`
returns, and what `SparseOptimizer.from_config` builds the optimizer from:
configs (this layer) validate and compare optimizers without building
one; the tables' layer (`tfde.optimizers`) builds it and does the update.
The rules for each setting are `tfde.hyperparameters`'.
"""

import dataclasses
from typing import Optional

from tfde import hyperparameters
from tfde import tf_version


@dataclasses.dataclass(frozen=True)
class Kind:
  """What is known of an optimizer kind before it is built.

  Attributes:
    name: The kind, as configs spell it ("adam").
    class_name: Its class in `tfde.optimizers` ("Adam"); errors name it.
    default_learning_rate: The learning rate when none is given.
    defaults: Its other settings and their defaults (besides
      learning_rate, clipnorm and clipvalue, which every kind takes).
    slot_names: Its slot variables, in order.
    slot_width: Each slot's row width: None for the table's (one value per
      element), 1 for one value per row (a row-wise optimizer's).
    one_positive: Settings not all 0 as float32 computes with them (a row
      whose first gradient is 0 would step by 0 / 0).
  """

  name: str
  class_name: str
  default_learning_rate: float
  defaults: dict
  slot_names: tuple = ()
  slot_width: Optional[int] = None
  one_positive: tuple = ()


KINDS = {k.name: k for k in (
    Kind("sgd", "SGD", 0.01, {}),
    Kind("adagrad", "Adagrad", 0.001,
         {"initial_accumulator_value": 0.1, "epsilon": 1e-7}, ("accumulator",),
         one_positive=("epsilon", "initial_accumulator_value")),
    # FBGEMM's defaults: learning_rate 0.01, epsilon 1e-8, accumulators from 0.
    Kind("rowwise_adagrad", "RowwiseAdagrad", 0.01,
         {"initial_accumulator_value": 0.0, "epsilon": 1e-8}, ("row_accumulator",),
         slot_width=1, one_positive=("epsilon", "initial_accumulator_value")),
    Kind("adam", "Adam", 0.001,
         {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "bias_correction": True},
         ("m", "v")),
    # 0 / ((beta + sqrt(0)) / lr + 2 l2) for a zero gradient on a zero accumulator.
    Kind("ftrl", "Ftrl", 0.001,
         {"learning_rate_power": -0.5, "initial_accumulator_value": 0.1,
          "l1_regularization_strength": 0.0, "l2_regularization_strength": 0.0,
          "l2_shrinkage_regularization_strength": 0.0, "beta": 0.0},
         ("accumulator", "linear"),
         one_positive=("initial_accumulator_value", "beta", "l2_regularization_strength")),
)}

# Other spellings of a kind (keras-rs's, FBGEMM's, TorchRec's).
ALIASES = {"lazy_adam": "adam", "lazyadam": "adam", "row_wise_adagrad": "rowwise_adagrad",
           "exact_rowwise_adagrad": "rowwise_adagrad"}

# Keras optimizer class name -> (kind, settings carried over).
KERAS_MAPPING = {
    "SGD": ("sgd", ()),
    "Adagrad": ("adagrad", ("initial_accumulator_value", "epsilon")),
    "Adam": ("adam", ("beta_1", "beta_2", "epsilon")),
    "Ftrl": ("ftrl", tuple(KINDS["ftrl"].defaults)),
}
# Keras options that change the update and that tfde does not implement:
# name -> the value that means "off".
KERAS_UNSUPPORTED = {
    "weight_decay": None, "global_clipnorm": None, "use_ema": False, "momentum": 0.0,
    "nesterov": False, "amsgrad": False, "gradient_accumulation_steps": None,
    "loss_scale_factor": None,
}


def check(kind, learning_rate, clipnorm, clipvalue, hyper):
  """Raises ValueError (naming the optimizer, the setting and the value)
  unless the settings of an optimizer of `kind` are valid, each and
  together. `hyper`: its settings besides the three every kind takes."""
  spec = KINDS[kind]
  unknown = sorted(set(hyper) - set(spec.defaults))
  if unknown:
    raise ValueError(f"{spec.class_name} does not support {unknown}; "
                     f"supported: learning_rate, clipnorm, clipvalue, "
                     f"{sorted(spec.defaults)}")
  # A schedule's values are checked by the ops when it is evaluated.
  if not callable(learning_rate) and not isinstance(learning_rate, dict):
    hyperparameters.check("learning_rate", learning_rate, spec.class_name)
  for name, value in hyper.items():
    hyperparameters.check(name, value, spec.class_name)
  for name, value in (("clipnorm", clipnorm), ("clipvalue", clipvalue)):
    if value is not None and (isinstance(value, bool) or
                              not isinstance(value, (int, float)) or
                              not value > 0 or value == float("inf")):
      raise ValueError(f"{spec.class_name}: {name} must be None or a "
                       f"positive finite number, got {value!r}")
  check_together(kind, dict(spec.defaults, **hyper))


def check_together(kind, hyper):
  """Refuses `one_positive` settings that are all 0 as float32 computes
  with them: a row whose first gradient is 0 would then step by 0 / 0."""
  spec = KINDS[kind]
  names = spec.one_positive
  if names and not any(hyperparameters.as_float32(hyper[n]) > 0 for n in names):
    listed = ", ".join(names[:-1]) + " and " + names[-1]
    raise ValueError(f"{spec.class_name}: {listed} are "
                     f"{'both' if len(names) == 2 else 'all'} 0, so a row whose first "
                     "gradient is 0 would become NaN; make one of them positive")


def canonical(identifier, table_name="?", keep_schedule=False):
  """The validated config of an optimizer given as None (SGD, learning
  rate 0.01), a kind's name, a config dict, a Keras optimizer or a
  `tfde.optimizers.SparseOptimizer`: {"kind", "learning_rate", every other
  setting of the kind, and clipnorm / clipvalue when set}. ValueError
  naming the table otherwise.

  A learning-rate schedule (or any callable) appears serialised, Keras's
  dict, so that configs compare and save as data; with `keep_schedule`
  it appears as given, for building the optimizer (a schedule class
  Keras has not registered would not deserialise).
  """
  try:
    return _canonical(identifier, table_name, keep_schedule)
  except ValueError as e:
    if table_name in (None, "?") or str(e).startswith("table "):
      raise
    raise ValueError(f"table {table_name!r}: {e}") from None


def slot_width(config):
  """`Kind.slot_width` of a canonical config."""
  return KINDS[config["kind"]].slot_width


def _canonical(identifier, table_name, keep_schedule):
  if identifier is None:
    return {"kind": "sgd", "learning_rate": 0.01}
  if isinstance(identifier, str):
    key = identifier.lower()
    key = ALIASES.get(key, key)
    if key not in KINDS:
      raise ValueError(f"table {table_name!r}: unknown optimizer "
                       f"{identifier!r}; use one of {sorted(KINDS)}")
    return _config(key, None, None, None, {}, keep_schedule)
  if isinstance(identifier, dict):
    config = dict(identifier)
    kind = config.pop("kind", None)
    if kind not in KINDS:
      raise ValueError(f"an optimizer config's kind must be one of {sorted(KINDS)}, "
                       f"got {kind!r}")
    learning_rate = config.pop("learning_rate", None)
    if isinstance(learning_rate, dict):
      _check_schedule(kind, learning_rate)
    return _config(kind, learning_rate, config.pop("clipnorm", None),
                   config.pop("clipvalue", None), config, keep_schedule)
  if _is_keras_optimizer(identifier):
    return _from_keras(identifier, table_name, keep_schedule)
  # A tfde.optimizers.SparseOptimizer (which this layer cannot import): its
  # own settings, checked again so that the error names the table.
  if getattr(identifier, "kind", None) in KINDS and hasattr(identifier, "get_config"):
    config = dict(identifier.get_config(), learning_rate=identifier.learning_rate)
    return _canonical(config, table_name, keep_schedule)
  raise ValueError(f"table {table_name!r}: unsupported optimizer "
                   f"{identifier!r}")


def _check_schedule(kind, serialized):
  """Refuses a learning rate's dict that is not a Keras schedule's."""
  keras = tf_version.keras()
  try:
    schedule = keras.optimizers.schedules.deserialize(serialized)
  except (ValueError, TypeError, KeyError):
    schedule = None
  if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
    raise ValueError(f"{KINDS[kind].class_name} learning_rate must be a finite float32 "
                     f"> 0 or a Keras LearningRateSchedule's config, got {serialized!r}")


def _config(kind, learning_rate, clipnorm, clipvalue, hyper, keep_schedule):
  spec = KINDS[kind]
  if learning_rate is None:
    learning_rate = spec.default_learning_rate
  if callable(learning_rate) and not keep_schedule:
    keras = tf_version.keras()
    learning_rate = keras.optimizers.schedules.serialize(learning_rate)
  check(kind, learning_rate, clipnorm, clipvalue, hyper)
  config = {"kind": kind, "learning_rate": learning_rate, **spec.defaults, **hyper}
  # Only when set: configs written before clipping existed stay equal.
  for name, value in (("clipnorm", clipnorm), ("clipvalue", clipvalue)):
    if value is not None:
      config[name] = float(value)
  return config


def _is_keras_optimizer(identifier):
  try:
    keras = tf_version.keras()
  except ImportError:
    return False
  return isinstance(identifier, keras.optimizers.Optimizer)


def _from_keras(optimizer, table_name, keep_schedule):
  name = type(optimizer).__name__
  if name not in KERAS_MAPPING:
    raise ValueError(
        f"table {table_name!r}: Keras optimizer {name} is not supported for "
        f"embedding tables; use one of {sorted(KERAS_MAPPING)} or "
        f"{sorted(KINDS)}")
  # Keras 3's config holds a schedule's serialisation, not the schedule.
  learning_rate = optimizer._learning_rate  # pylint: disable=protected-access
  keras = tf_version.keras()
  is_schedule = isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule)
  if callable(learning_rate) and not isinstance(learning_rate, keras.Variable) and not is_schedule:
    # tfde calls a learning rate with the table's step; Keras calls it bare.
    raise ValueError(f"table {table_name!r}: {name}'s learning_rate is a function of "
                     "no arguments; give a keras.optimizers.schedules."
                     "LearningRateSchedule (called with the step) or a number")
  config = optimizer.get_config()
  bad = [k for k, off in KERAS_UNSUPPORTED.items()
         if k in config and config[k] not in (off, 0, 0.0, None, False)]
  if bad:
    raise ValueError(f"table {table_name!r}: {name} option(s) {bad} are not "
                     "supported by tfde's sparse optimizers")
  kind, carried = KERAS_MAPPING[name]
  if not is_schedule:
    learning_rate = float(config["learning_rate"])
  clipping = [config.get(k) if config.get(k) not in (None, 0, 0.0) else None
              for k in ("clipnorm", "clipvalue")]
  return _config(kind, learning_rate, *clipping,
                 {k: config[k] for k in carried if k in config}, keep_schedule)
