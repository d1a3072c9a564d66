"""Sparse per-table optimizers: SGD, Adagrad, row-wise Adagrad, lazy Adam
and FTRL.

Each applies Keras 3's update rule to the rows a step touched, and only to
them, with the table's own slot variables (sharded like the table). The
optimizer given to `model.compile` never sees an embedding table.

>>> import tensorflow as tf
>>> import tfde
>>> opt = tfde.optimizers.get("adagrad")
>>> opt.get_config()["learning_rate"]
0.001
>>> table = tf.Variable(tf.ones([4, 2]))
>>> slots = opt.create_slots(table.shape)
>>> _ = opt.apply(table, slots, tf.constant([1]), tf.ones([1, 2]),
...               step=tf.constant(1.0))
>>> bool(table[1, 0] < 1.0), bool(table[0, 0] == 1.0)
(True, True)

Every hyper-parameter is validated where it is set (construction,
assignment, a Keras optimizer's conversion), by the rules of
`tfde.hyperparameters`: a NaN, an inf or a learning rate beyond float32
is refused naming the table and the value, never written into rows.

Explicit (SOK-style) training takes `tf.IndexedSlices` gradients of table
shards: `opt.apply_gradients(zip(grads, table.local_variables()))`.
"""

import tensorflow as tf

from tfde import hyperparameters
from tfde import ops
from tfde import optimizer_configs


class _Hyper(dict):
  """An optimizer's hyper-parameters; each is validated as it is set."""

  def __init__(self, owner, values):
    super().__init__()
    self._owner = owner
    # The optimizer's check of its settings together (Adagrad's epsilon
    # and initial accumulator), run again after each assignment.
    self.revalidate = None
    self.update(values)

  def __setitem__(self, name, value):
    hyperparameters.check(name, value, self._owner, None)
    missing = object()
    before = self.get(name, missing)
    super().__setitem__(name, value)
    if self.revalidate is not None:
      try:
        self.revalidate()
      except ValueError:
        if before is missing:
          super().__delitem__(name)
        else:
          super().__setitem__(name, before)
        raise

  def update(self, *args, **kwargs):
    for name, value in dict(*args, **kwargs).items():
      self[name] = value

  def __reduce__(self):
    return (dict, (dict(self),))


class SparseOptimizer:
  """Base class: hyper-parameters, slots, and the row update.

  Subclasses set `kind`, take their `slot_names`, `slot_width` and
  `defaults` from its entry in `tfde.optimizer_configs.KINDS` (which
  also holds the rules their settings are checked by) and implement
  `scalars`.
  `learning_rate` may be a float or a Keras LearningRateSchedule, which is
  evaluated at the table's 0-based step count, as Keras does.

  Every kind takes `clipnorm` and `clipvalue` (None: off), applied to the
  gradient of each touched row after it is summed over the step's lookups
  and replicas (once per unique row, as FBGEMM's `max_gradient` is):
  `clipnorm` scales a row's gradient to an L2 norm of at most `clipnorm`
  (Keras's clipnorm with each row as a variable), then `clipvalue` clips
  each element to [-clipvalue, clipvalue]. A Keras optimizer's `clipnorm`
  and `clipvalue` become these.

  >>> import tensorflow as tf
  >>> opt = SGD(learning_rate=1.0, clipnorm=1.0)
  >>> table = tf.Variable(tf.zeros([2, 2]))
  >>> _ = opt.apply(table, {}, tf.constant([0, 1]),
  ...               tf.constant([[3.0, 4.0], [0.3, 0.4]]), step=1)
  >>> table.numpy().tolist()
  [[-0.6000000238418579, -0.800000011920929], [-0.30000001192092896, -0.4000000059604645]]
  """

  kind = None
  slot_names = ()
  defaults = {}

  def __init__(self, learning_rate=None, clipnorm=None, clipvalue=None, **hyper):
    optimizer_configs.check(
        self.kind, self.default_learning_rate if learning_rate is None else learning_rate,
        clipnorm, clipvalue, dict(self.defaults, **hyper))
    self.learning_rate = (self.default_learning_rate
                          if learning_rate is None else learning_rate)
    self.hyper = _Hyper(type(self).__name__, dict(self.defaults, **hyper))
    self.clipnorm = None if clipnorm is None else float(clipnorm)
    self.clipvalue = None if clipvalue is None else float(clipvalue)
    self.hyper.revalidate = self._validate

  @property
  def clips(self):
    return self.clipnorm is not None or self.clipvalue is not None

  def clip(self, grads, grad_rows=None):
    """(grads, grad_rows) with each row's gradient clipped (see the class
    doc); unchanged without clipping. Clipped gradients are a matrix, one
    row per updated row."""
    if not self.clips:
      return grads, grad_rows
    if isinstance(grads, ops.BagGradients):
      grads = ops.bag_gradients_dense(grads)
    if grad_rows is not None:
      grads = tf.gather(grads, grad_rows)
    return ops.clip_row_gradients(grads, self.clipnorm, self.clipvalue), None

  default_learning_rate = 0.001

  @property
  def learning_rate(self):
    return self._learning_rate

  @learning_rate.setter
  def learning_rate(self, value):
    # A schedule's values are checked by the ops when it is evaluated.
    if not callable(value):
      hyperparameters.check("learning_rate", value, type(self).__name__)
    self._learning_rate = value

  def _validate(self):
    hyperparameters.check_all(self)
    optimizer_configs.check_together(self.kind, self.hyper)

  def slot_initial_value(self, name):
    del name
    return 0.0

  # Each slot's row width: None for the table's (one value per element), 1
  # for one value per row (a row-wise optimizer's).
  slot_width = None

  def slot_shape(self, shape):
    """The shape of each slot of a table (shard) of `shape` [rows, dim]."""
    shape = tf.TensorShape(shape)
    if self.slot_width is None:
      return shape
    return tf.TensorShape([shape[0], self.slot_width])

  def create_slots(self, shape, name="table", device=None, creator=None):
    """Creates this optimizer's slot variables for a table (shard)."""
    creator = creator or (lambda initial, slot_name: tf.Variable(
        initial, trainable=False, name=slot_name))
    slots = {}
    with tf.device(device):
      for slot in self.slot_names:
        initial = tf.fill(self.slot_shape(shape),
                          tf.constant(self.slot_initial_value(slot), tf.float32))
        slots[slot] = creator(initial, f"{name}/{slot}")
    return slots

  def learning_rate_at(self, step):
    """The learning rate for 1-based `step` (a float tensor)."""
    lr = self.learning_rate
    if callable(lr):
      return tf.cast(lr(tf.cast(step, tf.int64) - 1), tf.float32)
    return tf.constant(lr, tf.float32)

  def apply(self, table, slots, indices, grads, step, grad_rows=None, rounding=None,
            copy_on_read=True, on_saturate=None):
    """Updates table[indices] and the slots' rows; indices must be unique.

    grads[k] (or grads[grad_rows[k]]) is the gradient of row indices[k];
    grads is a matrix or a `tfde.ops.BagGradients`. A table of bfloat16 or
    float16 rows needs `rounding(indices, step)`: the [k, dim] uniform
    draws of its stochastic rounding. `copy_on_read`: see
    `tfde.ops.sparse_apply` (float32 tables; the rounded updates of other
    tables always use TF's copy-on-read mode). `on_saturate`: see
    `tfde.ops.sparse_apply_rounded`.
    """
    variables = [table] + [slots[name] for name in self.slot_names]
    grads, grad_rows = self.clip(grads, grad_rows)
    if table.dtype != tf.float32:
      if not copy_on_read:
        raise ValueError(f"{table.name}: copy_on_read=False is for float32 tables; "
                         f"this one has {table.dtype.name} rows")
      if rounding is None:
        raise ValueError(f"{table.name}: a table of {table.dtype.name} rows is "
                         "updated with stochastic rounding; pass `rounding`")
      step = tf.cast(step, tf.float32)
      return ops.sparse_apply_rounded(
          self.kind, variables, indices, grads, self.scalars(step),
          lambda rows: rounding(rows, tf.cast(step, tf.int64)), grad_rows,
          on_saturate=on_saturate)
    if not isinstance(grads, ops.BagGradients):
      grads = tf.cast(grads, tf.float32)
    return ops.sparse_apply(self.kind, variables, indices, grads,
                            self.scalars(tf.cast(step, tf.float32)), grad_rows,
                            copy_on_read)

  def scalars(self, step):
    """The update's scalar inputs at 1-based `step`, in the order the ops
    take them (after the gradient)."""
    raise NotImplementedError

  def apply_dynamic(self, store, ids, grads, step, grad_rows=None,
                    by_address=False):
    """Updates the rows of `ids` (unique) in a dynamic table shard; ids
    without a row are skipped (`by_address`: ids are row addresses, -1
    skipped). Returns how many rows changed."""
    step = tf.cast(step, tf.float32)
    grads, grad_rows = self.clip(grads, grad_rows)
    return store.apply(self.kind, ids, tf.cast(grads, tf.float32),
                       self.scalars(step), grad_rows, by_address=by_address)

  # ---- explicit path (SOK style)

  def apply_gradients(self, grads_and_vars):
    """Applies `tf.IndexedSlices` gradients to table shard variables.

    Each variable must be a shard from `ShardedTable.local_variables()`; its
    table must be configured with this optimizer's kind, whose slots it
    uses. Rows may repeat in a gradient: they are summed first.
    """
    pending = []
    for grad, var in grads_and_vars:
      if grad is None:
        continue
      owner = shard_owner(var)
      if owner is None:
        raise ValueError(f"{var.name} is not a tfde table shard; tfde's sparse "
                         "optimizers update only tfde tables")
      table, replica = owner
      if table.optimizer.kind != self.kind:
        raise ValueError(
            f"table {table.name!r} keeps slots for {table.optimizer.kind!r}, "
            f"not {self.kind!r}; configure the table with this optimizer")
      if not isinstance(grad, tf.IndexedSlices):
        raise ValueError(f"the gradient of table {table.name!r} must be a "
                         f"tf.IndexedSlices, got {type(grad).__name__}")
      unique, inverse = tf.unique(grad.indices, out_idx=tf.int32)
      summed = tf.math.unsorted_segment_sum(grad.values, inverse,
                                            tf.size(unique))
      pending.append((table, replica, unique, summed))
    finite = all_finite([summed for _, _, _, summed in pending],
                        pending[0][0].comm if pending else None)
    # The table keeps the slots and the step; this optimizer is the rule.
    return tf.group([table.apply_gradient(replica, unique, summed, optimizer=self,
                                          finite=finite[i])
                     for i, (table, replica, unique, summed) in enumerate(pending)])

  # ---- serialisation

  def get_config(self):
    lr = self.learning_rate
    if callable(lr):
      import keras  # pylint: disable=g-import-not-at-top
      lr = keras.optimizers.schedules.serialize(lr)
    config = {"kind": self.kind, "learning_rate": lr, **self.hyper}
    # Only when set: configs written before clipping existed stay equal.
    for name in ("clipnorm", "clipvalue"):
      if getattr(self, name) is not None:
        config[name] = getattr(self, name)
    return config

  @staticmethod
  def from_config(config):
    config = dict(config)
    cls = _KINDS[config.pop("kind")]
    lr = config.pop("learning_rate")
    if isinstance(lr, dict):
      import keras  # pylint: disable=g-import-not-at-top
      lr = keras.optimizers.schedules.deserialize(lr)
    return cls(learning_rate=lr, **config)

  def __eq__(self, other):
    return (isinstance(other, SparseOptimizer) and
            self.get_config() == other.get_config())

  def __hash__(self):
    return hash(self.kind)

  def __repr__(self):
    return f"{type(self).__name__}({self.get_config()})"


class SGD(SparseOptimizer):
  """w -= lr * g on touched rows."""
  kind = "sgd"
  default_learning_rate = optimizer_configs.KINDS[kind].default_learning_rate

  def scalars(self, step):
    return [self.learning_rate_at(step)]


class Adagrad(SparseOptimizer):
  """Keras Adagrad on touched rows: accumulator += g^2, w -= lr g /
  sqrt(accumulator + epsilon)."""
  kind = "adagrad"
  slot_names = optimizer_configs.KINDS[kind].slot_names
  defaults = optimizer_configs.KINDS[kind].defaults
  default_learning_rate = optimizer_configs.KINDS[kind].default_learning_rate

  def slot_initial_value(self, name):
    return self.hyper["initial_accumulator_value"]

  def scalars(self, step):
    return [self.learning_rate_at(step), self.hyper["epsilon"]]


class RowwiseAdagrad(SparseOptimizer):
  """Row-wise Adagrad on touched rows (FBGEMM's `EXACT_ROWWISE_ADAGRAD`,
  TorchRec's default for embedding tables): one accumulator per row gains
  the mean of the row's squared gradient, and the whole row steps by
  g * lr / (sqrt(accumulator) + epsilon). Its slot is [rows, 1]: 4 bytes a
  row where Adagrad keeps a row's width.

  >>> import tensorflow as tf
  >>> opt = RowwiseAdagrad(learning_rate=0.5)
  >>> table = tf.Variable(tf.zeros([2, 2]))
  >>> slots = opt.create_slots(table.shape)
  >>> slots["row_accumulator"].shape
  TensorShape([2, 1])
  >>> _ = opt.apply(table, slots, tf.constant([1]), tf.constant([[3.0, 4.0]]),
  ...               step=1)
  >>> print(*table.numpy()[1].round(4))   # -0.5 / sqrt((9 + 16) / 2) * (3, 4)
  -0.4243 -0.5657

  Defaults are FBGEMM's: learning_rate 0.01, epsilon 1e-8, accumulators
  from 0. A table's slot does not split by columns, so a column-wise
  sharded table refuses it, as do dynamic tables (their slots are as wide
  as a row) and TPU embedding (which has no row-wise Adagrad).
  """
  kind = "rowwise_adagrad"
  slot_names = optimizer_configs.KINDS[kind].slot_names
  slot_width = optimizer_configs.KINDS[kind].slot_width
  defaults = optimizer_configs.KINDS[kind].defaults
  default_learning_rate = optimizer_configs.KINDS[kind].default_learning_rate

  def slot_initial_value(self, name):
    return self.hyper["initial_accumulator_value"]

  def scalars(self, step):
    return [self.learning_rate_at(step), self.hyper["epsilon"]]


class Adam(SparseOptimizer):
  """Lazy Adam: Keras Adam's formulas, but m, v and w change only for
  touched rows; bias correction uses the table's step count.

  `bias_correction=False` drops the factor sqrt(1 - beta_2^t) / (1 -
  beta_1^t), as TPU embedding's Adam does (`tfde.tpu` maps one to the
  other)."""
  kind = "adam"
  slot_names = optimizer_configs.KINDS[kind].slot_names
  defaults = optimizer_configs.KINDS[kind].defaults
  default_learning_rate = optimizer_configs.KINDS[kind].default_learning_rate

  def scalars(self, step):
    h = self.hyper
    learning_rate = self.learning_rate_at(step)
    if not h["bias_correction"]:
      # beta^inf is 0, so the ops' correction factor is exactly 1.
      step = tf.constant(float("inf"), tf.float32)
    return [learning_rate, h["beta_1"], h["beta_2"], h["epsilon"], step]


LazyAdam = Adam


class Ftrl(SparseOptimizer):
  """Keras FTRL on touched rows."""
  kind = "ftrl"
  slot_names = optimizer_configs.KINDS[kind].slot_names
  defaults = optimizer_configs.KINDS[kind].defaults
  default_learning_rate = optimizer_configs.KINDS[kind].default_learning_rate

  def slot_initial_value(self, name):
    return self.hyper["initial_accumulator_value"] if name == "accumulator" else 0.0

  def scalars(self, step):
    h = self.hyper
    return [self.learning_rate_at(step), h["l1_regularization_strength"],
            h["l2_regularization_strength"],
            h["l2_shrinkage_regularization_strength"], h["beta"],
            h["learning_rate_power"]]


_KINDS = {cls.kind: cls for cls in (SGD, Adagrad, RowwiseAdagrad, Adam, Ftrl)}

def all_finite(gradients, comm):
  """Per gradient, whether it is finite on every replica of `comm` (one
  control exchange), so a table is updated everywhere or nowhere."""
  if not gradients:
    return []
  flags = tf.stack([tf.reduce_all(tf.math.is_finite(g)) for g in gradients])
  every = comm.gather_flags(tf.cast(flags, tf.int32))
  finite = tf.equal(tf.reduce_min(every, axis=0), 1)
  return [finite[i] for i in range(len(gradients))]


# The attribute by which a variable a tfde table hands out names its owner.
OWNER_ATTRIBUTE = "_tfde_owner"


def shard_owner(variable):
  """(table, replica) of a variable a tfde table handed out, or None."""
  return getattr(variable, OWNER_ATTRIBUTE, None)


def get(identifier, table_name="?"):
  """A SparseOptimizer from a name, a Keras optimizer, a config or None
  (`tfde.optimizer_configs.canonical`); a SparseOptimizer is returned as
  it is, so that tables given one share it."""
  if isinstance(identifier, SparseOptimizer):
    hyperparameters.check_all(identifier, table_name)
    return identifier
  return SparseOptimizer.from_config(
      optimizer_configs.canonical(identifier, table_name, keep_schedule=True))
