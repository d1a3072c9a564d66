"""Validation of the sparse optimizers' hyper-parameters.

Every update is computed in float32, so a value that is not a finite
float32 (NaN, +-inf, or above 3.4e38, which float32 rounds to inf) would
write NaN or inf into every row a step touches. Each hyper-parameter is
checked where it is set, against a stated rule, and a bad one is refused
naming the table (when known) and the value:

- learning_rate: a finite float32 > 0 (or a LearningRateSchedule);
- beta_1, beta_2 (Adam): 0 <= beta < 1 (beta 1 divides by 1 - beta^t = 0);
- epsilon: finite, > 0 for Adam (a zero gradient would step by 0 / 0),
  >= 0 elsewhere;
- initial_accumulator_value, l1/l2/l2_shrinkage_regularization_strength,
  beta (FTRL): finite, >= 0;
- learning_rate_power (FTRL): finite, <= 0;
- bias_correction (Adam): a bool.

>>> check("learning_rate", float("nan"), "SGD", "user")
Traceback (most recent call last):
...
ValueError: table 'user': SGD learning_rate must be a finite float32 > 0, got nan
"""

import numpy as np

_FLOAT32_MAX = float(np.finfo(np.float32).max)

# name -> (test, the rule in words).
_RULES = {
    "learning_rate": (lambda v: v > 0, "a finite float32 > 0"),
    "beta_1": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "beta_2": (lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "epsilon": (lambda v: v >= 0, "a finite float32 >= 0"),
    "initial_accumulator_value": (lambda v: v >= 0, "a finite float32 >= 0"),
    "l1_regularization_strength": (lambda v: v >= 0, "a finite float32 >= 0"),
    "l2_regularization_strength": (lambda v: v >= 0, "a finite float32 >= 0"),
    "l2_shrinkage_regularization_strength": (lambda v: v >= 0,
                                             "a finite float32 >= 0"),
    "beta": (lambda v: v >= 0, "a finite float32 >= 0"),
    "learning_rate_power": (lambda v: v <= 0, "a finite float32 <= 0"),
}
# Per optimizer class name, rules stricter than the common ones.
_STRICTER = {
    "Adam": {"epsilon": (lambda v: v > 0, "a finite float32 > 0 (a zero "
                         "gradient would otherwise step by 0 / 0)")},
}


def as_float32(value):
  """`value` as the float32 updates compute with it."""
  return float(np.float32(value))


def _where(table_name):
  return f"table {table_name!r}: " if table_name not in (None, "?") else ""


def check(name, value, optimizer_name, table_name=None):
  """Returns `value` as a float if it satisfies `name`'s rule; raises
  ValueError naming the table, the optimizer, the setting and the value."""
  if name == "bias_correction":
    if not isinstance(value, (bool, np.bool_)):
      raise ValueError(f"{_where(table_name)}{optimizer_name} bias_correction "
                       f"must be a bool, got {value!r}")
    return bool(value)
  test, rule = _STRICTER.get(optimizer_name, {}).get(name) or _RULES[name]
  try:
    # The rule holds for the value the float32 update computes with: 1e-50
    # is 0 there, 1 - 1e-12 is 1.
    ok = (not isinstance(value, (bool, np.bool_)) and
          isinstance(value, (int, float, np.integer, np.floating)) and
          abs(float(value)) <= _FLOAT32_MAX and test(as_float32(value)))
  except OverflowError:  # an int too large for a float
    ok = False
  if not ok:
    raise ValueError(f"{_where(table_name)}{optimizer_name} {name} must be "
                     f"{rule}, got {value!r}")
  return float(value)


def check_all(optimizer, table_name=None):
  """Checks every hyper-parameter of a `SparseOptimizer`."""
  cls = type(optimizer).__name__
  if not callable(optimizer.learning_rate):
    check("learning_rate", optimizer.learning_rate, cls, table_name)
  for name, value in optimizer.hyper.items():
    check(name, value, cls, table_name)
