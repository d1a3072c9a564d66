"""tfde's ops: one entry point per op, backed by the C++ kernels or by their
pure-TF twins.

The kernels are used when the op library loads; otherwise the twins are,
after one warning saying why. `TFDE_OPS=reference` forces the twins, and
`backend("reference")` does so while a block of code runs (tests run both).

>>> import tensorflow as tf
>>> import tfde.ops
>>> local_rows, counts, positions = tfde.ops.partition_by_shard(
...     tf.constant([5, 2, 7, 4], tf.int64), num_shards=2)
>>> local_rows.numpy().tolist(), counts.numpy().tolist()
([1, 2, 2, 3], [2, 2])
>>> with tfde.ops.backend("reference"):
...   out = tfde.ops.embedding_combine(
...       tf.constant([[1.0], [3.0]]), inverse=[0, 1, 1],
...       row_splits=tf.constant([0, 2, 3], tf.int64), combiner="mean")
>>> out.numpy().ravel().tolist()
[2.0, 3.0]
"""

import contextlib
import os
import threading
import warnings

from tfde import tf_version

# Before TensorFlow's modules and the op library load: a TensorFlow tfde
# does not support, or another than the library's, is refused by name.
tf_version.check_tensorflow()

import tensorflow as tf  # noqa: E402

from tfde.ops import checks  # noqa: F401 (public)
from tfde.ops import native
from tfde.ops import reference
from tfde.ops import row_features
from tfde.ops import types
from tfde.ops.dynamic_store_twin import DynamicStoreTwin

KERNELS = "kernels"
REFERENCE = "reference"
_BACKENDS = (KERNELS, REFERENCE)

# The `backend()` blocks open now, oldest first: (a token of the block, its
# backend). Process-wide, not per thread: MirroredStrategy runs each
# replica's function in a thread of its own, which must see the block's
# backend. Each block removes its own entry when it closes, so blocks of
# several threads may close in any order.
_open_blocks = []
_open_blocks_lock = threading.Lock()
_warned = False


def _default_backend():
  global _warned
  requested = os.environ.get("TFDE_OPS", KERNELS).strip().lower() or KERNELS
  if requested not in _BACKENDS:
    raise ValueError(f"TFDE_OPS must be one of {_BACKENDS}, got {requested!r}")
  if requested == REFERENCE:
    return REFERENCE
  if native.load() is None:
    if not _warned:
      _warned = True
      warnings.warn("tfde: using the pure-TF twins of its ops because the op "
                    f"library is unavailable: {native.load_error()}",
                    RuntimeWarning, stacklevel=3)
    return REFERENCE
  return KERNELS


def current_backend():
  """"kernels" or "reference": what the ops called now will run on."""
  with _open_blocks_lock:
    override = _open_blocks[-1][1] if _open_blocks else None
  return override or _default_backend()


@contextlib.contextmanager
def backend(name):
  """Runs the ops of a block on `name` ("kernels" or "reference"), in every
  thread while the block is open (the replicas of a MirroredStrategy run
  in threads of their own); where blocks are open in several threads at
  once, the one opened last decides.

  Asking for "kernels" when the library cannot load is an error, so a test
  of the kernels can never silently test the twins.

  >>> with backend(REFERENCE):
  ...   current_backend()
  'reference'
  """
  if name not in _BACKENDS:
    raise ValueError(f"backend must be one of {_BACKENDS}, got {name!r}")
  if name == KERNELS and native.load() is None:
    raise RuntimeError(f"tfde op library unavailable: {native.load_error()}")
  entry = (object(), name)
  with _open_blocks_lock:
    _open_blocks.append(entry)
  try:
    yield
  finally:
    with _open_blocks_lock:
      _open_blocks.remove(entry)


def kernels_available():
  return native.load() is not None


@tf.autograph.experimental.do_not_convert
def _impl():
  return native if current_backend() == KERNELS else reference


def unique_with_counts(ids):
  """Unique ids (first-appearance order), inverse index, counts."""
  return _impl().unique_with_counts(ids)


def sorted_unique_in_range(ids, num_ids):
  """The unique values of `ids` in increasing order, and each element's
  index into them (int32), where every id lies in [0, num_ids); else an
  InvalidArgumentError naming the first that does not. Meant for row
  numbers, such as a group's fused ids: the CPU kernel keeps a bitmap of
  [0, num_ids) (num_ids / 8 bytes), or sorts where the range is far wider
  than the ids; elsewhere (a GPU) the ids are checked and hash-deduped by
  those ops' kernels there (the error then reads "ids: id V at position I
  is out of range [0, N)") and the unique ids sorted.

  >>> unique, inverse = sorted_unique_in_range(tf.constant([7, 2, 7, 5], tf.int64), 8)
  >>> unique.numpy().tolist(), inverse.numpy().tolist()
  ([2, 5, 7], [2, 0, 2, 1])
  """
  return _impl().sorted_unique_in_range(ids, num_ids)


def check_id_range(ids, vocabulary_size, what):
  """`ids` (a vector) once every one lies in [0, vocabulary_size); else an
  InvalidArgumentError naming `what` (the feature and its table), the first
  bad id and its position.

  >>> ids = tf.constant([3, 0, 4], tf.int64)
  >>> check_id_range(ids, 5, "feature f (table t)").numpy().tolist()
  [3, 0, 4]
  >>> try:
  ...   check_id_range(tf.constant([3, 7], tf.int64), 5, "feature f (table t)")
  ... except tf.errors.InvalidArgumentError as e:
  ...   print("feature f (table t): id 7 at position 1 is out of range [0, 5)" in e.message)
  True
  """
  return _impl().check_id_range(ids, vocabulary_size, what)


def check_row_splits(row_splits, num_ids, what):
  """A check that `row_splits` (a vector) are a ragged input's over
  `num_ids` ids: they start at 0, never decrease and end at `num_ids`;
  else an InvalidArgumentError naming `what` (the feature and its table)
  and, from the kernel, the first bad split. Eagerly it raises at once; in
  a graph it is an op to hold what reads the splits on (as an Assert).

  >>> _ = check_row_splits(tf.constant([0, 2, 3], tf.int64), 3, "feature f (table t)")
  >>> try:
  ...   check_row_splits(tf.constant([0, 2, 1], tf.int64), 1, "feature f (table t)")
  ... except tf.errors.InvalidArgumentError as e:
  ...   print("feature f (table t): ragged ids have row splits that do not start at 0" in
  ...         e.message)
  True
  """
  return _impl().check_row_splits(row_splits, num_ids, what)


def stamp_rows(stamps, rows, step):
  """stamps[rows] = step: `stamps` an int64 vector variable (a table's
  record of each row's last update), every row in range, else an
  InvalidArgumentError naming the first that is not, and nothing written.
  On a CPU a kernel writes them in parallel; elsewhere, and on the twins,
  TensorFlow's scatter does (the twin checks the rows first, as the kernel
  does).

  >>> stamps = tf.Variable(tf.zeros([5], tf.int64))
  >>> _ = stamp_rows(stamps, tf.constant([3, 1]), 7)
  >>> stamps.numpy().tolist()
  [0, 7, 0, 7, 0]
  """
  return _impl().stamp_rows(stamps, rows, step)


def partition_by_shard(ids, num_shards, dynamic=False):
  """Ids grouped by `id % num_shards`: (local_ids, shard_counts, positions).

  local_ids holds `id // num_shards` (the row in the owner's shard), or the
  id itself when `dynamic`; `positions[i]` is where ids[i] went.
  """
  return _impl().partition_by_shard(ids, num_shards, dynamic=dynamic)


def sample_keys(ids, row_splits, first_sample, stride):
  """The pooled exchange's keys of a replica's ids (int64): keys[i] =
  (s + first_sample) * stride + ids[i], s the sample (row of `row_splits`)
  of ids[i]. Every id lies in [0, stride), and no key may pass the largest
  int64; else an InvalidArgumentError. On a CPU one kernel pass; elsewhere
  the twin's stock ops.

  >>> sample_keys(tf.constant([3, 1, 2], tf.int64), tf.constant([0, 2, 3], tf.int64),
  ...             first_sample=1, stride=4).numpy().tolist()
  [7, 5, 10]
  """
  return _impl().sample_keys(ids, row_splits, first_sample, stride)


def split_sample_keys(keys, num_samples, bits):
  """(ids, row_splits) of keys `sample * 2^bits + id` received in
  increasing sample: ids[i] = keys[i] mod 2^bits, and the [num_samples + 1]
  row splits of the ids by sample. A negative key, a sample not below
  `num_samples`, or one below the key before's is an InvalidArgumentError
  naming the key's position.

  >>> ids, splits = split_sample_keys(tf.constant([7, 5, 10], tf.int64), 3, bits=2)
  >>> ids.numpy().tolist(), splits.numpy().tolist()
  ([3, 1, 2], [0, 0, 2, 3])
  """
  return _impl().split_sample_keys(keys, num_samples, bits)


def embedding_combine(rows, inverse, row_splits, weights=None, combiner="sum"):
  """[batch, dim] outputs: sample b combines rows[inverse[i]] over its ids."""
  return _impl().embedding_combine(rows, inverse, row_splits, weights, combiner)


def embedding_combine_grad(grad, inverse, row_splits, weights, num_unique,
                           combiner="sum"):
  """Gradient of `embedding_combine` w.r.t. rows: [num_unique, dim]."""
  return _impl().embedding_combine_grad(grad, inverse, row_splits, weights,
                                        num_unique, combiner)


def sum_rows_by_index(rows, index, num_rows, device=None):
  """out[k] = the sum of rows[i] over the i with index[i] == k, added in
  order of i; rows no index names are 0. `tf.math.unsorted_segment_sum`
  of float32 [n, dim] rows (the same bits: each coefficient is 1, so a
  fused multiply-add rounds as the add does), on the combine gradient's
  kernels (each row a sample of its own), which sum in parallel where
  TensorFlow's CPU kernel adds one row at a time. Where the rows are on a
  GPU (`device`; not known: where a GPU is visible) the stock op serves:
  the kernel there waits on the device for its checks.

  >>> import tensorflow as tf
  >>> out = sum_rows_by_index(tf.constant([[1.0], [2.0], [4.0]]),
  ...                         tf.constant([1, 0, 1]), 3)
  >>> out.numpy().ravel().tolist()
  [2.0, 5.0, 0.0]
  """
  if not types.on_cpu(device):
    return tf.math.unsorted_segment_sum(rows, index, num_rows)
  return embedding_combine_grad(
      rows, index, tf.range(tf.shape(rows, out_type=tf.int64)[0] + 1), None, num_rows, "sum")


def split_rows_by_table(rows, bases, device=None):
  """Per table of a fused row space (table t from bases[t]): (its rows,
  local to the table, and their positions in `rows`). `device`: where the
  tables live; on a GPU the kernel (a CPU one) is not used, the stock ops of
  its twin are, which have GPU kernels."""
  impl = reference if types.on_gpu(device) else _impl()
  return impl.split_rows_by_table(rows, bases)


def combine_from_tables(tables, rows, bases, inverse, row_splits, weights=None,
                        combiner="sum"):
  """`embedding_combine` of `gather_from_tables(tables, rows, bases)`,
  reading each id's row from its table without gathering the rows first."""
  return _impl().combine_from_tables(tables, rows, bases, inverse, row_splits, weights,
                                     combiner)


# Variables smaller than this are not worth a huge page's advice (a 2 MiB
# page, and the time MADV_COLLAPSE takes: here 0.2 s for 146 MiB in one
# probe, 0.75 s per 256 MB in another).
HUGE_PAGES_MIN_BYTES = 32 << 20


def advise_huge_pages(variables, collapse=True):
  """Asks the OS to back the buffers of `variables` with transparent huge
  pages, and with `collapse` to move them there now (Linux 6.1 and later):
  embedding rows are read and written at random, and with 4 KiB pages most
  of those accesses miss the TLB. Only variables on a CPU of at least
  `HUGE_PAGES_MIN_BYTES` are advised; values never change, and a refused
  advice changes nothing. `TFDE_HUGE_PAGES=0` turns it off. Returns
  (advised bytes, bytes moved to huge pages): the op's int64 scalars, or
  0, 0 where it had nothing to advise.

  The threshold is per variable. A TensorFlow op that gives a variable a
  new buffer (an assign from a restore) leaves it unadvised: the tables
  advise again after loading (eagerly; a table of a TF1 graph is not
  advised). The collapse runs in the caller, before it returns.

  >>> import tensorflow as tf
  >>> small = tf.Variable(tf.zeros([4, 4]))
  >>> [int(x) for x in advise_huge_pages([small])]  # below the minimum
  [0, 0]
  """
  # On a CPU by name: not GPU variables, nor a DTensor mesh's (a custom
  # device), nor a TF1 graph's that name no device.
  chosen = [v for v in variables
            if "CPU" in (v.device or "").upper() and
            v.shape.num_elements() is not None and
            v.shape.num_elements() * v.dtype.size >= HUGE_PAGES_MIN_BYTES]
  if not chosen or os.environ.get("TFDE_HUGE_PAGES", "1").strip() == "0":
    return reference.advise_huge_pages([], collapse)  # nothing advised
  return _impl().advise_huge_pages(chosen, collapse)


BagGradients = types.BagGradients
int32_range = types.int32_range
segment_ids = types.segment_ids
one_read_from = types.one_read_from
zero_from = types.zero_from


def bag_gradients_dense(grads):
  """The [rows, dim] gradient matrix that a `BagGradients` stands for,
  summed per row by `sum_rows_by_index` (in parallel on a CPU's kernels,
  where TensorFlow's segment sum adds one row at a time)."""
  return grads.dense(sum_rows_by_index)


def id_coefficients(row_splits, weights, num_ids, combiner):
  """Each id's coefficient, its weight (1 where `weights` is None) over its
  sample's divisor, as the kernels compute it, for folding a combiner into
  the weights of a "sum"; `weights` one per id (or None) and the splits
  checked already, where the batch came in. A "sum"'s coefficients are its
  weights: no sample is looked up for them.

  >>> import tensorflow as tf
  >>> splits = tf.constant([0, 2, 3], tf.int64)
  >>> id_coefficients(splits, None, tf.constant(3), "mean").numpy().tolist()
  [0.5, 0.5, 1.0]
  >>> id_coefficients(splits, tf.constant([2.0, 1.0, 4.0]), tf.constant(3), "sum").numpy().tolist()
  [2.0, 1.0, 4.0]
  """
  reference.check_combiner(combiner)
  coefficients = (tf.ones([num_ids], tf.float32) if weights is None
                  else tf.cast(weights, tf.float32))
  if combiner == "sum":
    return coefficients
  return reference.over_divisors(coefficients, types.segment_ids(row_splits, tf.int32, num_ids),
                                 tf.size(row_splits) - 1, combiner)


def unique_rows(rows, num_rows, device=None):
  """(the distinct values of `rows`, row numbers in [0, num_rows), and each
  element's index into them (int32)): in increasing order where a bitmap
  of the row space is cheap (at least num_rows / 32 rows, not on a GPU:
  `device` says where they are used), so that an update walks them in
  address order, and then any value outside the range is refused; else
  (or where `num_rows` is None: ids, not rows) by hashing, in
  first-appearance order. The count of `rows` may be known only when run
  (a `tf.cond` then picks).

  >>> unique, inverse = unique_rows(tf.constant([7, 2, 7], tf.int64), 8)
  >>> unique.numpy().tolist(), inverse.numpy().tolist()
  ([2, 7], [1, 0, 1])
  """
  # The bitmap's passes grow with the row space, the hash's with the rows:
  # for the bench's 327,680 ids in a 40M-row group (122 rows an id) the
  # bitmap took 8.5 ms, the hash 6.1 (bench/ops_bench.py), so past about 32 rows an
  # id the hash is taken. On a GPU the range's dedup is a hash
  # dedup and a sort (`sorted_unique_in_range`), and the updates there read
  # a matrix, whatever its order.
  def in_row_order():
    return tuple(sorted_unique_in_range(rows, num_rows))

  def by_hashing():
    return tuple(unique_with_counts(rows)[:2])

  if num_rows is None or types.on_gpu(device):
    return by_hashing()
  n = rows.shape.num_elements()
  if n is not None:
    return in_row_order() if 32 * n >= num_rows else by_hashing()
  return tf.cond(32 * tf.size(rows, out_type=tf.int64) >= num_rows, in_row_order, by_hashing)


def gradients_for_update(grad, inverse, row_splits, weights, num_unique,
                         combiner="sum", device=None):
  """`embedding_combine_grad`'s result in the form a sparse update reads
  best where the tables live (`device`): bags on the kernels on a CPU
  (summed as the update applies them, no [num_unique, dim] matrix
  written); the matrix itself on the twins, which have no bag updates, and
  on a GPU, where the combine gradient's kernel writes it faster than the
  bags (a CPU kernel) are indexed. The updates take either."""
  if current_backend() == REFERENCE or types.on_gpu(device):
    return _impl().embedding_combine_grad(grad, inverse, row_splits, weights,
                                          num_unique, combiner)
  return bag_gradients(grad, inverse, row_splits, weights, num_unique, combiner)


def bag_gradients(grad, inverse, row_splits, weights, num_unique, combiner="sum"):
  """`embedding_combine_grad`'s result left as a `BagGradients`: the ids of
  each unique row, for a sparse update to sum as it applies them."""
  segments, bags, bag_weights = _impl().bag_gradient_index(
      inverse, row_splits, weights, num_unique, combiner)
  return BagGradients(tf.convert_to_tensor(grad), segments, bags, bag_weights)


def gather_from_tables(tables, rows, bases):
  """Rows of a fused row space over `tables` (table t from bases[t])."""
  return _impl().gather_from_tables(tables, rows, bases)


# The sparse updates change var[indices[k]] (and the slots' rows) using
# grad[k], or grad[grad_rows[k]] when grad_rows is given; grad is a matrix
# or a BagGradients. Indices must be unique and in range; nothing is written
# otherwise.


def sparse_apply(kind, variables, indices, grad, scalars, grad_rows=None,
                 copy_on_read=True):
  """`kind`'s update ("sgd", "adagrad", "rowwise_adagrad", "adam" (lazy),
  "ftrl") of `variables`, the table then its slots, with the scalar inputs
  in the order `tfde.optimizers.SparseOptimizer.scalars` gives them. Slots
  are shaped like the table, except a row-wise kind's: [rows, 1].

  `copy_on_read=False` is for tables read whole every step (a DTensor
  mesh's): the update then copies a buffer only while a read still shares
  it, instead of making every later whole read copy the table. It leaves a
  copy-on-read mode set before (by a default update, a `tf.gather` on the
  variable, TF's sparse ops) as it is: TensorFlow never clears it."""
  return _impl().sparse_apply(kind, variables, indices, grad, scalars, grad_rows,
                              copy_on_read)


def sparse_apply_sgd(var, indices, grad, learning_rate, grad_rows=None):
  return sparse_apply("sgd", [var], indices, grad, [learning_rate], grad_rows)


def sparse_apply_adagrad(var, accumulator, indices, grad, learning_rate,
                         epsilon, grad_rows=None):
  return sparse_apply("adagrad", [var, accumulator], indices, grad,
                      [learning_rate, epsilon], grad_rows)


def sparse_apply_rowwise_adagrad(var, row_accumulator, indices, grad, learning_rate,
                                 epsilon, grad_rows=None):
  """FBGEMM's EXACT_ROWWISE_ADAGRAD on var[indices]: each row's accumulator
  (`row_accumulator`, [rows, 1]) gains the mean of the row's squared
  gradient, and the row steps by grad * lr / (sqrt(accumulator) + epsilon).

  >>> import tensorflow as tf
  >>> var = tf.Variable(tf.ones([3, 2]))
  >>> acc = tf.Variable(tf.zeros([3, 1]))
  >>> _ = sparse_apply_rowwise_adagrad(var, acc, tf.constant([1]),
  ...                                  tf.constant([[3.0, 4.0]]), 1.0, 1e-8)
  >>> acc.numpy().ravel().tolist()   # (9 + 16) / 2
  [0.0, 12.5, 0.0]
  """
  return sparse_apply("rowwise_adagrad", [var, row_accumulator], indices, grad,
                      [learning_rate, epsilon], grad_rows)


def sparse_apply_lazy_adam(var, m, v, indices, grad, learning_rate, beta_1,
                           beta_2, epsilon, step, grad_rows=None):
  return sparse_apply("adam", [var, m, v], indices, grad,
                      [learning_rate, beta_1, beta_2, epsilon, step], grad_rows)


def sparse_apply_ftrl(var, accumulator, linear, indices, grad, learning_rate,
                      l1, l2, l2_shrinkage, beta, learning_rate_power,
                      grad_rows=None):
  return sparse_apply("ftrl", [var, accumulator, linear], indices, grad,
                      [learning_rate, l1, l2, l2_shrinkage, beta, learning_rate_power],
                      grad_rows)


# Dynamic tables: one store per shard, on the backend current when it is
# made (the kernel's hash-table resource, or its tf.lookup twin). A store has
# lookup(ids, counts, step, insert) -> (rows, row addresses), apply(kind,
# ids, grad, scalars, grad_rows, by_address), export(), import_(...),
# evict(step, max_unseen_steps, max_rows) and stats(); see
# tfde.ops.dynamic_store_twin.DynamicStoreTwin.
DynamicTableSpec = types.DynamicTableSpec
dynamic_initial_values = reference.dynamic_initial_values


def dynamic_store(spec, name, device=None):
  """A new, empty dynamic table shard."""
  if current_backend() == KERNELS:
    return native.NativeDynamicStore(spec, name, device)
  return DynamicStoreTwin(spec, name, device)


@tf.RegisterGradient("TfdeEmbeddingCombine")
def _embedding_combine_gradient(op, grad):
  rows, inverse, row_splits, weights = op.inputs
  unique_grad = native.load().tfde_embedding_combine_grad(
      grad, inverse, row_splits, weights, tf.shape(rows, out_type=tf.int32)[0],
      combiner=op.get_attr("combiner"))
  return unique_grad, None, None, None


# Row features of stock ops only (twins and kernels alike run them).
combine_weights_grad = row_features.combine_weights_grad
renormalize_rows = row_features.renormalize_rows
renormalize_rows_grad = row_features.renormalize_rows_grad
clip_row_gradients = row_features.clip_row_gradients
# Reduced-precision tables: stock ops on either backend (the kernels update
# float32 tables only).
ROW_DTYPES = row_features.ROW_DTYPES
rounding_noise = row_features.rounding_noise
stochastic_round = row_features.stochastic_round
gather_rows_float32 = row_features.gather_rows_float32
sparse_apply_rounded = row_features.sparse_apply_rounded
