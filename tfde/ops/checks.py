"""Input checks shared by the twins and the pipeline: errors that name the
bad value, raised eagerly at once and in graphs as Assert ops.

>>> import tensorflow as tf
>>> from tfde.ops import checks
>>> checks.first_index_where(tf.constant([False, True, True])).numpy().tolist()
[1]
>>> checks.index_tensor([0.0, 1.7], "inverse")
Traceback (most recent call last):
TypeError: inverse must be an int32 or int64 tensor, got float32
>>> try:
...   checks.assert_that(tf.constant(False), "id ", tf.constant([7]), " is bad")
... except tf.errors.InvalidArgumentError as e:
...   print(e.message)
id 7 is bad
"""

import contextlib

import numpy as np
import tensorflow as tf

from tfde import tf_internals


def describe_feature(feature_name, table_name):
  """How an error names a feature and its table.

  >>> describe_feature("clicks", "items")
  'feature clicks (table items)'
  """
  # No quotes: graph-mode Assert messages escape them.
  return f"feature {feature_name} (table {table_name})"


def message(parts):
  """The message as a string tensor: strings and string tensors as they
  are, other tensors as their comma-separated elements."""
  # String ops have CPU kernels only: pinned there, a step placed on a GPU
  # with soft placement off still builds (its Assert reads host memory).
  # Not inside an XLA computation (a TPU program), where TensorFlow itself
  # moves what XLA cannot compile out to the host.
  in_xla = tf_internals.in_xla_context()
  with contextlib.nullcontext() if in_xla else tf.device("/device:CPU:0"):
    if all(isinstance(p, str) for p in parts):
      return tf.constant("".join(parts))
    if all(isinstance(p, str) and "{" not in p and "}" not in p or _integer_scalar(p)
           for p in parts):
      # One op, where each tensor part as its own string takes four or
      # more (a tenth of a traced sharded step's ops were messages).
      return tf.strings.format("".join("{}" if not isinstance(p, str) else p for p in parts),
                               [p for p in parts if not isinstance(p, str)])
    return tf.strings.join([
        p if isinstance(p, str) else tf.strings.reduce_join(
            tf.reshape(p if getattr(p, "dtype", None) == tf.string else
                       tf.strings.as_string(p), [-1]), separator=",")
        for p in parts])


def _integer_scalar(part):
  """Whether `part` is an integer scalar tensor, which `tf.strings.format`
  writes as `tf.strings.as_string` does."""
  return (isinstance(part, (tf.Tensor, tf.Variable)) and part.dtype.is_integer and
          part.shape.rank == 0)


def assert_that(condition, *parts):
  """Raises InvalidArgumentError with the message `parts` when `condition`
  is false.

  The message parts are strings and small tensors, concatenated. Eagerly it
  raises at once; in a graph it is an Assert op to add as a control
  dependency of whatever it guards.
  """
  if tf.executing_eagerly():
    if not bool(condition):
      raise tf.errors.InvalidArgumentError(
          None, None, message(parts).numpy().decode())
    return tf.no_op()
  return tf.debugging.Assert(condition, [message(parts)])


def index_tensor(value, name):
  """`value` as a tensor of an index dtype, int32 or int64; any other dtype
  is a TypeError naming `name`, never a cast (a float index would be
  truncated, a wider one wrapped)."""
  tensor = tf.convert_to_tensor(value)
  if tensor.dtype not in (tf.int32, tf.int64):
    raise TypeError(f"{name} must be an int32 or int64 tensor, got {tensor.dtype.name}")
  return tensor


def first_true(mask):
  """The first i with mask[i] (a vector), or its size where none is: an
  int64 scalar.

  A minimum over fixed shapes, not tf.where: on a GPU, tf.where waits for
  the device to learn its output's size, and a check built on it would
  cost the step a second round trip to the host. The positions are
  float64 (exact below 2**53) because TensorFlow's GPU Min has no int64
  kernel: an int64 one would copy the whole mask to the host.

  >>> first_true(tf.constant([False, True, True])).numpy().tolist()
  1
  >>> first_true(tf.zeros([0], tf.bool)).numpy().tolist()
  0
  """
  mask = _vector(mask)
  size = tf.size(mask, out_type=tf.int64)
  # The range from the size as TensorFlow keeps it, on the host: a limit
  # computed on the device would have to come back to the host first.
  positions = tf.cast(tf.range(size), tf.float64)
  n = tf.cast(size, tf.float64)
  # The minimum of no elements is +inf: n bounds it.
  return tf.cast(tf.minimum(tf.reduce_min(tf.where(mask, positions, n)), n), tf.int64)


def _vector(tensor):
  """`tensor` flattened: as it is where it is a vector already (a reshape
  is two ops more in every check of a traced step)."""
  tensor = tf.convert_to_tensor(tensor)
  return tensor if tensor.shape.rank == 1 else tf.reshape(tensor, [-1])


def first_offender(mask, values):
  """(none, i, values[i]) for the first i with mask[i], in fixed shapes
  (`first_true`): `none` is a bool scalar, true where no element is
  masked; then i is the size and the value a padding zero, never shown.

  >>> none, i, value = first_offender(tf.constant([False, True]), tf.constant([4, -2]))
  >>> bool(none), int(i), int(value)
  (False, 1, -2)
  """
  values = _vector(values)
  if values.dtype == tf.int32:
    # TensorFlow keeps int32 tensors of a GPU on the host for ConcatV2.
    values = tf.cast(values, tf.int64)
  first = first_true(mask)
  value = tf.gather(tf.concat([values, tf.zeros([1], values.dtype)], 0), first)
  return tf.equal(first, tf.size(values, out_type=tf.int64)), first, value


def first_index_where(mask):
  """The first i with mask[i], as a [0]- or [1]-shaped int64 tensor."""
  return tf.reshape(tf.where(mask), [-1])[:1]



def grad_rows_in_range(grad_rows, grad):
  """An Assert that every gradient row `grad_rows` names is a row of
  `grad`, naming the first that is not, as the update kernels do."""
  num_rows = tf.shape(grad, out_type=grad_rows.dtype)[0]
  none, i, value = first_offender((grad_rows < 0) | (grad_rows >= num_rows), grad_rows)
  return assert_that(none, "grad_rows[", i, "] = ", value, " is out of range [0, ",
                     num_rows, ")")


def first_repeat(values):
  """(positions of the first repeated value (a [0]- or [1]-shaped int32
  tensor), the earlier position each value first appeared at)."""
  n = tf.size(values, out_type=tf.int32)
  _, inverse = tf.unique(values, out_idx=tf.int32)
  first_position = tf.math.unsorted_segment_min(tf.range(n), inverse, n)
  earlier = tf.gather(first_position, inverse)
  return first_index_where(tf.not_equal(earlier, tf.range(n))), earlier



# ---- the kernels' checks of shapes, attributes and variables, for the twins
#
# Each raises at once where what it checks is static (a rank, a variable's
# dtype, an attribute; a shape known when tracing), with the kernels' words,
# so that a graph's own shape inference cannot answer first with another
# error; otherwise it returns Assert ops to run before anything is written.


def shape_string(shape):
  """A static shape as the kernels' messages write one: [4,4] (? where a
  dimension is unknown)."""
  shape = tf.TensorShape(shape)
  if shape.rank is None:
    return "<unknown>"
  return "[" + ",".join("?" if d is None else str(d) for d in shape.as_list()) + "]"


def _text(part):
  if isinstance(part, str):
    return part
  if isinstance(part, tf.TensorShape):
    return shape_string(part)
  if tf.is_tensor(part) and not tf.executing_eagerly():
    return "?"  # a graph's value, unknown while tracing
  return ",".join(str(x) for x in np.reshape(np.asarray(part), [-1]))


def check(condition, *parts):
  """[] or [an Assert op]: raises InvalidArgumentError with the message
  `parts` at once when `condition` is a Python bool and false; a tensor
  condition is checked as `assert_that` does."""
  if isinstance(condition, (bool, np.bool_)):
    if not condition:
      raise tf.errors.InvalidArgumentError(None, None, "".join(_text(p) for p in parts))
    return []
  return [assert_that(condition, *parts)]


def dim(tensor, axis):
  """Dimension `axis` of `tensor`: an int where known when tracing, else
  an int64 scalar tensor."""
  static = tf.TensorShape(tensor.shape)[axis]
  return static if static is not None else tf.shape(tensor, out_type=tf.int64)[axis]


def num_elements(tensor):
  """How many elements `tensor` has: an int where known, else a tensor."""
  static = tensor.shape.num_elements()
  return static if static is not None else tf.size(tensor, out_type=tf.int64)


def _static(*values):
  return all(isinstance(v, (int, np.integer)) for v in values)


def equal(a, b):
  """a == b for dims from `dim`: a bool where both are known, else a tensor."""
  if _static(a, b):
    return a == b
  return tf.equal(tf.cast(a, tf.int64), tf.cast(b, tf.int64))


_RANK_NAMES = {0: "scalar", 1: "vector", 2: "matrix", 3: "rank-3 tensor"}


def shape_parts(tensor):
  """The message parts that write `tensor`'s shape as the kernels do."""
  if tensor.shape.is_fully_defined():
    return [shape_string(tensor.shape)]
  return ["[", tf.shape(tensor), "]"]


def check_rank(tensor, rank, name):
  """The kernels' "`name` must be a vector, got shape [2,2]"."""
  what = f"{name} must be a {_RANK_NAMES[rank]}, got shape "
  if tensor.shape.rank is not None:
    return check(tensor.shape.rank == rank, what, shape_string(tensor.shape))
  return check(tf.equal(tf.rank(tensor), rank), what, "[", tf.shape(tensor), "]")


def check_row_splits(splits, num_ids, what):
  """The twin of TfdeCheckRowSplits: an Assert that `splits` are a ragged
  input's over `num_ids` ids (they start at 0, never decrease and end at
  `num_ids`), naming `what`; eagerly it raises at once."""
  splits = index_tensor(splits, "row_splits")
  checks = check_rank(splits, 1, f"{what}: row splits")
  with tf.control_dependencies(checks):
    return assert_that(row_splits_valid(splits, num_ids), what,
                       ": ragged ids have row splits that do not start at 0, "
                       "never decrease and end at the number of ids")


def row_splits_valid(splits, num_ids):
  """Whether `splits` (a vector) are row splits over `num_ids` ids, as a
  bool scalar: what `check_row_splits` asserts, for a caller that must
  not raise.

  >>> bool(row_splits_valid(tf.constant([0, 2, 2, 3]), 3))
  True
  """
  wide = tf.cast(splits, tf.int64)
  return tf.logical_and(
      tf.logical_and(tf.size(wide) > 0, tf.reduce_all(tf.equal(wide[:1], 0))),
      tf.logical_and(tf.reduce_all(tf.equal(wide[-1:], tf.cast(num_ids, tf.int64))),
                     tf.reduce_all(wide[1:] >= wide[:-1])))


def check_scalars(values, names):
  """Each of `values` a scalar, as the kernels read their hyperparameters."""
  return [c for v, name in zip(values, names)
          for c in check_rank(tf.convert_to_tensor(v), 0, name)]


def check_variables(variables):
  """The kernels' check of the variables they read or update
  (kernels/variables.h): float32 matrices."""
  for v in variables:
    check(v.dtype == tf.float32 and v.shape.rank == 2,
          f"variable {v.name} must be a float32 matrix, got {v.dtype.name} ",
          shape_string(v.shape))


def check_bases(bases, num_tables):
  """The attributes of an op over a group's tables (kernels/fused_tables.h):
  one base per table, starting at 0 and increasing."""
  check(num_tables >= 1, f"a group needs at least one table, got {num_tables}")
  check(len(bases) == num_tables, f"bases has {len(bases)} entries for {num_tables} tables")
  for t, base in enumerate(bases):
    check(base == 0 if t == 0 else base > bases[t - 1],
          f"bases must start at 0 and increase, got bases[{t}] = {base}")


def check_fused_tables(tables, bases):
  """A group's tables as the kernels check them before reading
  (FusedTables::Acquire): float32 matrices of one width, each holding at
  least the rows of its range."""
  check_bases(bases, len(tables))
  check_variables(tables)
  checks = []
  width = dim(tables[0], 1)
  for t, table in enumerate(tables[1:], 1):
    checks += check(equal(dim(table, 1), width), f"table {t} has width ", dim(table, 1),
                    " but table 0 has width ", width)
  for t in range(len(tables) - 1):
    need = int(bases[t + 1]) - int(bases[t])
    rows = dim(tables[t], 0)
    enough = rows >= need if _static(rows) else tf.greater_equal(rows, need)
    checks += check(enough, f"table {t} has ", rows, f" rows but its range needs {need}")
  return checks


def check_update_inputs(ids, grad, grad_rows, what):
  """A sparse update's `ids` (named `what`), its [k, dim] gradient and
  grad_rows (None: gradient row i belongs to ids[i]), as the kernels check
  them (CheckUpdateInputs): with no ids, nothing is read."""
  checks = check_rank(ids, 1, what) + check_rank(grad, 2, "grad")
  if grad_rows is not None:
    checks += check_rank(grad_rows, 1, "grad_rows")
  n = dim(ids, 0)
  grad_num_rows = dim(grad, 0)
  select = 0 if grad_rows is None else dim(grad_rows, 0)
  parts = ["grad has ", grad_num_rows, " rows and grad_rows ", select, " entries but there are ",
           n, f" {what}"]
  if _static(n, grad_num_rows, select):
    ok = n == 0 or (select == n if select else grad_num_rows == n)
  else:
    n, grad_num_rows, select = [tf.cast(x, tf.int64) for x in (n, grad_num_rows, select)]
    ok = tf.logical_or(tf.equal(n, 0), tf.where(select > 0, tf.equal(select, n),
                                                 tf.equal(grad_num_rows, n)))
  return checks + check(ok, *parts)
