"""Stage 0 of a lookup: every feature's batch (dense, ragged or sparse,
with optional weights) as flat ids, row splits and weights, validated.

>>> import tensorflow as tf
>>> from tfde import inputs
>>> ids, splits, weights = inputs.flatten_feature(
...     "f", "t", tf.ragged.constant([[3, 1], [], [2]]))
>>> ids.numpy().tolist(), splits.numpy().tolist(), weights
([3, 1, 2], [0, 2, 2, 3], None)

Errors name the feature and its table, and are raised before any table
changes.
"""

import dataclasses

import tensorflow as tf

from tfde import input_checks
from tfde import ops
from tfde.ops import checks
from tfde.ops import reference


@dataclasses.dataclass
class FlatFeature:
  """A feature's batch as flat ids, row splits and optional weights."""
  name: str
  table: object
  ids: tf.Tensor          # int64 [n]
  row_splits: tf.Tensor   # int64 [batch + 1]
  weights: object         # float32 [n] or None
  # Unpooled features (see `unpool`): the output's sequence length L, or
  # the input's row splits for a ragged output.
  sequence_length: object = None
  output_splits: object = None
  # The (ids, weights) as given, for an engine that takes them so
  # (`tfde.tables.tpu`); its features carry no flat ids.
  source: object = None


# How an error names a feature and its table (the tables' checks name them so too).
describe = checks.describe_feature


def string_keys(ids):
  """int64 keys of string ids: their 64-bit FarmHash fingerprint
  (`tf.fingerprint`, "farmhash64", read as a little-endian int64), a fixed
  function of the bytes that stock TensorFlow computes everywhere, so an
  exported model needs no tfde. Two of k distinct strings collide with
  probability about k^2 / 2^65 (1e-7 for a billion strings).

  >>> import tensorflow as tf
  >>> string_keys(tf.constant(["a", "a", "b"])).numpy().tolist()[:2]
  [-5528939962900187677, -5528939962900187677]
  """
  bytes_ = tf.fingerprint(tf.reshape(ids, [-1]), method="farmhash64")  # [n, 8] uint8
  # Fingerprints are little-endian; bitcast reads the host's order, and
  # TensorFlow runs on little-endian hosts only (x86, ARM).
  return tf.reshape(tf.bitcast(bytes_, tf.int64), tf.shape(ids))


def _check_ids_dtype(ids, where, strings=False):
  if ids.dtype == tf.string:
    if not strings:
      raise TypeError(f"{where}: string ids need a dynamic table "
                      f"(vocabulary_size=None), whose keys are their 64-bit "
                      f"fingerprints")
    return string_keys(ids)
  if not ids.dtype.is_integer:
    raise TypeError(f"{where}: ids must be int32 or int64"
                    f"{' or string' if strings else ''}, got {ids.dtype.name}")
  if ids.dtype == tf.uint64 and not strings:
    # From 2^63 the cast to int64 wraps to negative ids, which the range
    # check would show wrapped: refuse them here, as given. (A dynamic
    # table's keys are any 64 bits: there the cast is a bijection.)
    flat = tf.reshape(ids, [-1])
    none, i, value = checks.first_offender(input_checks.past_int64(flat), flat)
    guard = checks.assert_that(none, where, ": id ", value, " at position ", i,
                               " is out of range: the ids of a table are below 2^63")
    with tf.control_dependencies([guard]):
      ids = tf.identity(ids)
  return tf.cast(ids, tf.int64)


def _reordered(sparse, what):
  """`tf.sparse.reorder(sparse)`, once its indices are checked against its
  values and dense shape (refused naming `what`: SparseReorder's own error
  names no feature)."""
  num_indices, num_values, counts_match, inside = input_checks.sparse_structure(sparse)
  guards = [
      checks.assert_that(counts_match, what, " have ", num_indices, " indices but ",
                         num_values, " values"),
      checks.assert_that(inside, f"{what} have an index outside their dense shape")]
  with tf.control_dependencies(guards):
    return tf.sparse.reorder(tf.SparseTensor(tf.identity(sparse.indices), sparse.values,
                                             sparse.dense_shape))


def _float_weights(values, where):
  """Weights' `values` as float32: floats of any width, integers and
  booleans (a 0/1 mask) are cast (as for every input kind alike); any other
  dtype is a TypeError naming the feature.

  >>> _float_weights(tf.constant([1, 2]), "feature f (table t)").dtype.name
  'float32'
  """
  if not (values.dtype.is_floating or values.dtype.is_integer or values.dtype == tf.bool):
    raise TypeError(f"{where}: weights must be floats, integers or booleans, got "
                    f"{values.dtype.name}")
  return tf.cast(values, tf.float32)


def flatten_feature(feature_name, table_name, inputs, weights=None, strings=False,
                    check_row_splits=reference.check_row_splits):
  """(ids int64 [n], row_splits int64 [B+1], weights float32 [n] or None).

  Dense inputs of rank 1 give one id per sample, rank 2 [batch, hotness]
  give `hotness` ids per sample; ragged inputs give their rows; sparse
  inputs [batch, hotness] give the ids present in each row. Weights must
  have the same kind and structure as the ids. With `strings` (a dynamic
  table), tf.string ids become their `string_keys`. `check_row_splits`
  checks a ragged input's splits: the stock twin by default, as a serving
  export runs; `tfde.ops.check_row_splits` (the op, or the twin under the
  reference backend) in training.
  """
  where = describe(feature_name, table_name)
  if weights is not None and input_checks.input_kind(weights) != input_checks.input_kind(inputs):
    raise ValueError(f"{where}: weights are {input_checks.input_kind(weights)} but the ids are "
                     f"{input_checks.input_kind(inputs)}; they must match")
  if isinstance(inputs, tf.RaggedTensor):
    if inputs.ragged_rank != 1 or inputs.shape.rank != 2:
      raise ValueError(f"{where}: ragged ids must be [batch, (hotness)], got "
                       f"shape {inputs.shape}")
    ids = _check_ids_dtype(inputs.values, where, strings)
    splits = tf.cast(inputs.row_splits, tf.int64)
    num_ids = tf.size(ids, out_type=tf.int64)
    # A RaggedTensor built without validation (validate=False) may hold
    # any splits; every later stage reads samples from them.
    with tf.control_dependencies([check_row_splits(splits, num_ids, where)]):
      ids, splits = tf.identity(ids), tf.identity(splits)
    w = None
    if weights is not None:
      if weights.ragged_rank != 1 or weights.shape.rank != 2:
        raise ValueError(f"{where}: ragged weights must be [batch, (hotness)] as the "
                         f"ids are, got shape {weights.shape}")
      values = _float_weights(weights.values, where)
      # Their values too: weights built with validate=False may hold more
      # or fewer than their own splits say.
      guards = [checks.assert_that(
          input_checks.ragged_weights_match(weights, splits, num_ids),
          f"{where}: weights do not have the same row lengths as the ids")]
      with tf.control_dependencies(guards):
        # identity: a cast to its own dtype makes no op for the guard to hold.
        w = tf.identity(values)
    return ids, splits, w
  if isinstance(inputs, tf.SparseTensor):
    if inputs.shape.rank != 2:
      raise ValueError(f"{where}: sparse ids must be [batch, hotness], got "
                       f"shape {inputs.shape}")
    # Nothing checks a SparseTensor's indices against its shape where it is
    # made; a row past the batch would drop its id from the counts, and
    # SparseReorder's own refusal names no feature.
    inputs = _reordered(inputs, f"{where}: sparse ids")
    ids = _check_ids_dtype(inputs.values, where, strings)
    batch = inputs.dense_shape[0]
    # Reordered, the ids arrive by row.
    splits = _splits_by_slot(inputs.indices[:, 0], batch, input_checks.counts_fit(batch), (
        f"{where}: sparse ids have a batch (dense_shape[0]) of ", batch,
        f" samples; at most {input_checks.MAX_COUNTED} are taken"))
    w = None
    if weights is not None:
      if weights.shape.rank != 2:
        raise ValueError(f"{where}: sparse weights must be [batch, hotness] as the ids "
                         f"are, got shape {weights.shape}")
      weights = _reordered(weights, f"{where}: sparse weights")
      values = _float_weights(weights.values, where)
      guards = [checks.assert_that(
          input_checks.same_rows(weights.indices, inputs.indices),
          f"{where}: weights do not have the same indices as the ids")]
      with tf.control_dependencies(guards):
        # identity: a cast to its own dtype makes no op for the guard to hold.
        w = tf.identity(values)
    return ids, splits, w
  inputs = tf.convert_to_tensor(inputs)
  ids = _check_ids_dtype(inputs, where, strings)
  rank = inputs.shape.rank
  if rank == 1:
    ids = tf.reshape(ids, [-1, 1])
  elif rank != 2:
    raise ValueError(f"{where}: dense ids must have rank 1 or 2, got shape "
                     f"{inputs.shape}")
  # One op for both dimensions, where a slice of the shape for each is ten.
  batch, hotness = tf.unstack(tf.shape(ids, out_type=tf.int64), 2)
  splits = tf.range(batch + 1, dtype=tf.int64) * hotness
  w = None
  if weights is not None:
    weights = _float_weights(tf.convert_to_tensor(weights), where)
    if weights.shape.rank is not None and weights.shape.rank != rank:
      raise ValueError(f"{where}: weights have shape {weights.shape} but the "
                       f"ids have shape {inputs.shape}")
    weights_shape, ids_shape = tf.shape(weights), tf.shape(inputs)
    guards = [checks.assert_that(
        input_checks.same_rows(weights_shape, ids_shape),
        f"{where}: weights have shape ", weights_shape, " but the ids have shape ", ids_shape)]
    with tf.control_dependencies(guards):
      w = tf.reshape(weights, [-1])
  return tf.reshape(ids, [-1]), splits, w


def check_id_range(ids, vocabulary_size, feature_name, table_name):
  """Fails with the first out-of-range id, its position and its table: in
  stock TensorFlow ops (the op's twin), for serving exports, which must run
  without tfde. The training pipeline checks with the op
  (`Table.check_ids`)."""
  return reference.check_id_range(ids, vocabulary_size,
                                  describe(feature_name, table_name))


def combine_served_rows(rows, row_splits, weights, combiner, hotness=None):
  """Each sample's combined row from `rows`, one per id in id order, in
  stock TensorFlow ops: what a serving export runs (`rows` float32 [n, dim],
  `row_splits` [batch + 1], `weights` [n] or None). `hotness` (a dense
  input's ids per sample, a scalar) sums a [batch, hotness, dim] view of
  the rows; without it a sorted segment sum serves ragged and sparse
  inputs. Either is one pass over the rows, where the twin's generic combine
  (`reference.embedding_combine`) gathers and scales them first. An
  unweighted mean or sqrtn divides each sample's sum; weights are folded
  with their divisor per id in float64, as the kernels do.

  >>> rows = tf.constant([[1.0], [3.0], [5.0]])
  >>> splits = tf.constant([0, 2, 2, 3], tf.int64)
  >>> combine_served_rows(rows, splits, None, "mean").numpy().ravel().tolist()
  [2.0, 0.0, 5.0]
  >>> combine_served_rows(rows[:2], splits[:2], tf.constant([1.0, 3.0]), "sqrtn",
  ...                     hotness=2).numpy().ravel().tolist()  # (1 + 9) / sqrt(10)
  [3.1622776985168457]
  """
  batch = tf.size(row_splits, out_type=tf.int64) - 1
  if hotness is not None:
    hotness = tf.cast(hotness, tf.int64)
    segment_ids = None
  else:
    segment_ids = ops.segment_ids(row_splits)

  def per_sample_sum(values):  # [n, ...] -> [batch, ...]
    if hotness is not None:
      return tf.reduce_sum(tf.reshape(
          values, tf.concat([[batch, hotness], tf.shape(values, out_type=tf.int64)[1:]], 0)), 1)
    # Samples past the last one with an id have no segment: zeros.
    sums = tf.math.segment_sum(values, segment_ids)
    pad = tf.concat([[batch - tf.shape(sums, out_type=tf.int64)[0]],
                     tf.zeros([tf.rank(values) - 1], tf.int64)], 0)
    return tf.pad(sums, tf.stack([tf.zeros_like(pad), pad], 1))

  if combiner == "sum":
    return per_sample_sum(rows if weights is None else rows * weights[:, None])
  if weights is None:
    # Unweighted: each sample's sum over its id count (its square root).
    count = tf.cast(row_splits[1:] - row_splits[:-1], tf.float64)
    divisor = count if combiner == "mean" else tf.sqrt(count)
    scale = tf.math.divide_no_nan(tf.constant(1.0, tf.float64), divisor)
    return per_sample_sum(rows) * tf.cast(scale, tf.float32)[:, None]
  # Weighted: each id's w / divisor in float64, as the kernels and the twin
  # compute it (squares of large weights overflow float32), then one pass.
  w = tf.cast(weights, tf.float64)
  divisor = per_sample_sum(w if combiner == "mean" else w * w)
  if combiner == "sqrtn":
    divisor = tf.sqrt(divisor)
  scale = tf.math.divide_no_nan(tf.constant(1.0, tf.float64), divisor)
  per_id = (tf.repeat(scale, hotness) if hotness is not None
            else tf.gather(scale, segment_ids))
  return per_sample_sum(rows * tf.cast(w * per_id, tf.float32)[:, None])


def _positions(inputs, row_splits):
  """Each id's position in its sample: its column for dense and sparse
  inputs (a sparse input's gaps stay gaps, as TPU embedding places them),
  its rank in the row for ragged ones."""
  if isinstance(inputs, tf.SparseTensor):
    return tf.sparse.reorder(inputs).indices[:, 1]
  segment_ids = ops.segment_ids(row_splits)
  return (tf.range(row_splits[-1], dtype=tf.int64) -
          tf.gather(row_splits, segment_ids))


def flat_feature(feature, table, ids, weights, check_ids=True):
  """Stage 0 of one feature (a `FeatureConfig`) of `table` (which checks
  the ids, `Table.check_ids`, unless `check_ids` is false): its ids and
  weights as given, as flat ids, row splits and weights; a sequence
  feature unpooled (`unpool`). A table whose engine takes the inputs as
  given (`Table.takes_inputs_as_given`) gets them so, in `source`."""
  name = feature.name
  if table.takes_inputs_as_given:
    return FlatFeature(
        name, table, None, None, None,
        sequence_length=feature.max_sequence_length if feature.output == "sequence" else None,
        source=(ids, weights))
  flat_ids, splits, flat_weights = flatten_feature(name, table.name, ids, weights,
                                                   strings=table.is_dynamic,
                                                   check_row_splits=ops.check_row_splits)
  length = output_splits = None
  if feature.output != "pooled":
    if flat_weights is not None:
      raise ValueError(f"{describe(name, table.name)}: weights are given but the "
                       f"feature is unpooled (output={feature.output!r}); sequence "
                       "features take none")
    # Before the id checks: truncated ids are never looked up.
    length = feature.max_sequence_length
    flat_ids, splits, output_splits = unpool(ids, flat_ids, splits, length,
                                             describe(name, table.name))
  if check_ids:
    flat_ids = table.check_ids(flat_ids, name)
  return FlatFeature(name, table, flat_ids, splits, flat_weights, length, output_splits)


def flat_features(feature_configs, tables, inputs, weights=None, gather_flags=None):
  """Stage 0 of a lookup: every feature of `feature_configs` (name ->
  FeatureConfig) in `inputs` (name -> ids) as its table's (`tables`, name ->
  Table) `flat_feature`, validated; `weights` a dict too, or None.

  `gather_flags` (a communicator's, where a replica's failed step leaves
  its peers waiting: workers) makes every replica learn which replicas'
  inputs are refused (malformed, or an id their table refuses) before any
  replica raises: the one with the bad input names what is wrong, and
  every other raises naming that replica and feature, instead of waiting
  for it in the first exchange.

  In a graph each feature's ids wait for every feature's checked ids, row
  splits and weights: a stage that changes a table as it reads (a dynamic
  table admitting ids in training) must not run for one feature when
  another's check, or its own weights', fails. (Eagerly each check has
  raised before any lookup runs.)
  """
  if not isinstance(inputs, dict):
    raise TypeError(f"inputs must be a dict of feature name -> ids, got "
                    f"{type(inputs).__name__}")
  unknown = sorted(set(inputs) - set(feature_configs))
  if unknown:
    raise ValueError(f"features {unknown} are not in the configuration; "
                     f"configured: {sorted(feature_configs)}")
  weights = {} if weights is None else weights
  if not isinstance(weights, dict):
    raise TypeError(f"weights must be a dict of feature name -> weights, got "
                    f"{type(weights).__name__}")
  unknown = sorted(set(weights) - set(feature_configs))
  if unknown:
    raise ValueError(f"weights given for unknown features {unknown}")
  for name, feature in feature_configs.items():
    if inputs.get(name) is None:
      raise ValueError(f"{describe(name, feature.table.name)} is missing from the inputs")
  refused = None
  if gather_flags is not None:
    inputs, weights, refused = _refusals_exchanged(feature_configs, tables, inputs,
                                                   weights, gather_flags)
  # The table says what its lookup takes (flat checked ids for tfde's
  # exchanges; the inputs as given for an engine).
  flat = [flat_feature(feature, tables[feature.table.name], inputs[name], weights.get(name))
          for name, feature in feature_configs.items()]
  if refused is not None:
    flat = _others_refused(flat, refused)
  if tf.executing_eagerly():
    return flat
  checked = [t for f in flat for t in (f.ids, f.row_splits, f.weights)
             if isinstance(t, tf.Tensor)]
  with tf.control_dependencies(checked):
    return [f if f.ids is None else dataclasses.replace(f, ids=tf.identity(f.ids))
            for f in flat]


# What a replica's refusal code (`_refusal`) says, by code.
_REFUSED = ("nothing", "the input", "an id")


def _refusal(feature, table, ids, weights):
  """This replica's refusal of `feature`'s input (its `ids` and `weights`
  as given), computed without raising: an int32 scalar indexing
  `_REFUSED` (1: `flatten_feature` refuses the input, 2: `table` refuses
  one of its ids), or None where neither can happen."""
  if not isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)):
    ids = tf.convert_to_tensor(ids)
  strings = ids.dtype == tf.string and table.is_dynamic  # keys: no id is refused
  if not (ids.dtype.is_integer or strings):
    return None  # a dtype refused as the step is built
  malformed = input_checks.malformed(ids, weights, strings=table.is_dynamic)
  batch = None if feature.max_sequence_length is None else input_checks.batch_of(ids)
  if batch is not None:
    # unpool's own refusal, foreseen from the input's batch.
    too_long = tf.logical_not(input_checks.counts_fit(batch, feature.max_sequence_length))
    malformed = too_long if malformed is None else tf.logical_or(malformed, too_long)
  # A pooled feature's flat ids are its values, reordered. (Neither the
  # cast nor the comparisons can fail, whatever the input's structure.)
  refused = None if strings else table.refuses_ids(
      tf.reshape(tf.cast(input_checks.values_of(ids), tf.int64), [-1]))
  if refused is not None and feature.output != "pooled":
    # A sequence feature's truncated ids are never looked up: its flat
    # ids, of a well-formed input only (a malformed one could fail to
    # flatten, before its replica has told the others).
    def unpooled():
      flat = flat_feature(feature, table, ids, weights, check_ids=False).ids
      return 2 * tf.cast(table.refuses_ids(flat), tf.int32)
    if malformed is None:
      return unpooled()
    if tf.executing_eagerly():
      return tf.constant(1) if malformed else unpooled()
    return tf.cond(malformed, lambda: tf.constant(1), unpooled)
  if refused is None:
    return None if malformed is None else tf.cast(malformed, tf.int32)
  id_code = 2 * tf.cast(refused, tf.int32)
  return id_code if malformed is None else tf.where(malformed, 1, id_code)


def _refusals_exchanged(feature_configs, tables, inputs, weights, gather_flags):
  """(inputs, weights, every replica's refusal of each feature: [N, k]
  int32, or None where none can refuse): every replica learns whose
  inputs are refused before any replica's checks raise, and the inputs
  returned are read only after that (`flat_features`)."""
  names = list(feature_configs)
  codes = [_refusal(feature_configs[n], tables[feature_configs[n].table.name],
                    inputs[n], weights.get(n)) for n in names]
  if all(code is None for code in codes):
    return inputs, weights, None
  refused = gather_flags(tf.stack([tf.constant(0) if c is None else c for c in codes]))

  def after_exchange(value):
    with tf.control_dependencies([refused]):
      return tf.nest.map_structure(tf.identity, value, expand_composites=True)

  return ({n: after_exchange(v) for n, v in inputs.items()},
          {n: None if v is None else after_exchange(v) for n, v in weights.items()},
          refused)


def _others_refused(flat, refused):
  """`flat` with its ids read only once this replica's own checks (its
  features' ids, row splits and weights) have passed and no other
  replica refused its input (`refused` from `_refusals_exchanged`): each
  raises naming the replica and the feature."""
  own = [t for f in flat for t in (f.ids, f.row_splits, f.weights) if isinstance(t, tf.Tensor)]
  none, position, code = checks.first_offender(tf.reshape(refused > 0, [-1]),
                                               tf.reshape(refused, [-1]))
  count = len(flat)
  names = tf.constant([describe(f.name, f.table.name) for f in flat])
  with tf.control_dependencies(own):
    # (Where none is refused, the position is past the end: feature 0.)
    guard = checks.assert_that(
        none, "replica ", tf.math.floordiv(position, count), " refused ",
        tf.gather(tf.constant(_REFUSED), code), " of ",
        tf.gather(names, tf.math.floormod(position, count)),
        " (its error names it), so the step of this replica is refused too")
  with tf.control_dependencies([guard]):
    return [f if f.ids is None else dataclasses.replace(f, ids=tf.identity(f.ids))
            for f in flat]


def _splits_by_slot(slots, num_slots, countable, refusal):
  """The [num_slots + 1] row splits of ids that arrive in slot order,
  `slots` (int64) holding each id's slot; counted in int32 (bincount), so
  refused with the message parts `refusal` where not `countable`
  (`input_checks.counts_fit`)."""
  with tf.control_dependencies([checks.assert_that(countable, *refusal)]):
    slots = tf.cast(slots, tf.int32)
  length = input_checks.bincount_length(num_slots, countable)
  counts = tf.math.bincount(slots, minlength=length, maxlength=length, dtype=tf.int64)
  return tf.concat([[0], tf.cumsum(counts)], 0)


def unpool(inputs, ids, row_splits, max_sequence_length, where):
  """A sequence feature's flat ids as a pooled lookup computes them: one
  sample (of one id or none) per output row.

  With `max_sequence_length` L, sample b becomes L samples: position j
  holds the id at position j (dropped if j >= L: truncated; empty past
  the row: zero padding), so the combined [batch * L, dim] output reshapes
  to [batch, L, dim]. With None, each id is its own sample (the output's
  rows are the RaggedTensor's values). Returns (ids, row_splits,
  output_splits: the input's row splits for a ragged output, else None).
  A batch of more than 2^31 - 1 positions (batch * L) is refused naming
  `where` (the feature and table).

  >>> import tensorflow as tf
  >>> ids, splits, _ = unpool(tf.ragged.constant([[4, 5, 6], [7]]),
  ...                         tf.constant([4, 5, 6, 7], tf.int64),
  ...                         tf.constant([0, 3, 4], tf.int64), 2, "feature f (table t)")
  >>> ids.numpy().tolist(), splits.numpy().tolist()
  ([4, 5, 7], [0, 1, 2, 3, 3])
  """
  if max_sequence_length is None:
    return ids, tf.range(tf.size(ids, out_type=tf.int64) + 1), row_splits
  length = tf.constant(max_sequence_length, tf.int64)
  # After the input's checks (the flat ids come after them): a sparse
  # input is sorted again here, and SparseReorder's error names nothing.
  with tf.control_dependencies([ids, row_splits]):
    positions = _positions(inputs, row_splits)
  keep = positions < length
  segment_ids = ops.segment_ids(row_splits)
  slots = tf.boolean_mask(segment_ids * length + positions, keep)
  batch = tf.size(row_splits, out_type=tf.int64) - 1
  # Ids arrive in slot order (row-major). (batch * length cannot wrap in
  # int64 where it is countable.)
  splits = _splits_by_slot(slots, batch * length,
                           input_checks.counts_fit(batch, max_sequence_length), (
      f"{where}: a batch of ", batch, f" samples of max_sequence_length "
      f"{max_sequence_length} holds more than {input_checks.MAX_COUNTED} positions"))
  return tf.boolean_mask(ids, keep), splits, None


def shape_output(feature, out):
  """A lookup's [samples, dim] output in its feature's shape: [batch, L,
  dim] for a sequence feature, a RaggedTensor [batch, (len), dim] for a
  ragged output, else as is."""
  if feature.sequence_length is not None:
    return tf.reshape(out, [-1, feature.sequence_length, out.shape[-1] or tf.shape(out)[-1]])
  if feature.output_splits is not None:
    return tf.RaggedTensor.from_row_splits(out, feature.output_splits, validate=False)
  return out
