"""Loads tfde's C++ op library and wraps its ops with tfde's signatures.

The library is `_tfde_ops.so` next to this file, built by `pip install .`
(or `make ops` for an in-place build), or the file $TFDE_OPS_LIBRARY names
(`make bazel` builds one with Bazel). `load()` returns None, with the
reason in `load_error()`, when it is missing or was built against another
TensorFlow; callers then fall back to the pure-TF twins in `reference`.
"""

import os
import weakref

import tensorflow as tf

from tfde import tf_internals
from tfde.ops import reference
from tfde.ops import sample_keys_twin
from tfde.ops import types
from tfde.ops.checks import grad_rows_in_range
from tfde.ops.checks import index_tensor

_LIBRARY_NAME = "_tfde_ops.so"
_library = None
_load_error = None
_loaded = False


def library_path():
  """The op library: $TFDE_OPS_LIBRARY (e.g. a Bazel-built one), else the
  one installed next to this file."""
  return os.environ.get("TFDE_OPS_LIBRARY") or os.path.join(
      os.path.dirname(os.path.abspath(__file__)), _LIBRARY_NAME)


def load():
  """Returns the loaded op module, or None if it cannot be loaded."""
  global _library, _load_error, _loaded
  if not _loaded:
    _loaded = True
    path = library_path()
    if not os.path.exists(path):
      _load_error = (f"{path} does not exist (build it with `pip install .` "
                     "or `make ops`)")
    else:
      try:
        _library = tf.load_op_library(path)
      except (tf.errors.NotFoundError, OSError) as e:
        # An ABI mismatch with the installed TensorFlow lands here.
        _load_error = f"{path} failed to load: {e}"
  return _library


def load_error():
  load()
  return _load_error


def _weights_or_empty(weights):
  if weights is None:
    return tf.zeros([0], tf.float32)
  return tf.cast(weights, tf.float32)


# Index inputs (ids, rows, inverse, num_unique, num_shards, grad_rows) pass
# as they are, int32 or int64: the ops take either (an index-type attribute,
# as tf.gather's) and check every value before narrowing any.


def unique_with_counts(ids):
  return load().tfde_unique_with_counts(index_tensor(ids, "ids"))


def sorted_unique_in_range(ids, num_ids):
  ids = index_tensor(ids, "ids")
  if not types.on_cpu(ids.device):
    return sorted_unique_by_hashing(ids, num_ids)
  return load().tfde_sorted_unique_in_range(ids, num_ids=int(num_ids))


def sorted_unique_by_hashing(ids, num_ids):
  """The bitmap kernel is the CPU's: elsewhere (a GPU) the ids are checked
  and deduped by the ops that have kernels there, and the unique ids
  sorted after (fewer than the ids), all on the ids' device."""
  ids = load().tfde_check_id_range(ids, vocabulary_size=int(num_ids), what="ids")
  unique, inverse, _ = load().tfde_unique_with_counts(ids)
  order = tf.cast(tf.argsort(unique, stable=True), tf.int32)
  # Each first-appearance index's rank; a scatter stays on the device, where
  # InvertPermutation's GPU kernel keeps its data on the host.
  rank = tf.scatter_nd(order[:, None], tf.range(tf.size(order)), tf.shape(order))
  return tf.gather(unique, order), tf.gather(rank, inverse)


def check_row_splits(splits, num_ids, what):
  return load().tfde_check_row_splits(index_tensor(splits, "row_splits"),
                                      tf.cast(num_ids, tf.int64), what=what)


def check_id_range(ids, vocabulary_size, what):
  return load().tfde_check_id_range(index_tensor(ids, "ids"),
                                    vocabulary_size=int(vocabulary_size), what=what)


def stamp_rows(stamps, rows, step):
  if not types.on_cpu(stamps.device):
    # The kernel is the CPU's. A GPU's variable (or one whose device a TF1
    # graph leaves to the placer) keeps TensorFlow's scatter, without the
    # twin's host-side check, which the rest of the step does not pay for.
    return reference.scatter_stamps(stamps, rows, step)
  return load().tfde_stamp_rows(stamps.handle, index_tensor(rows, "rows"),
                                tf.cast(step, tf.int64))


def partition_by_shard(ids, num_shards, dynamic=False):
  return load().tfde_partition_by_shard(
      index_tensor(ids, "ids"), index_tensor(num_shards, "num_shards"), dynamic=dynamic)


def sample_keys(ids, row_splits, first_sample, stride):
  args = [tf.cast(index_tensor(x, name), tf.int64) for x, name in (
      (ids, "ids"), (row_splits, "row_splits"), (first_sample, "first_sample"),
      (stride, "stride"))]
  if not types.on_cpu(args[0].device):
    # The kernel is the CPU's. Elsewhere (a GPU) the stock ops, unchecked
    # as stamp_rows' scatter is: the splits were checked as the batch came
    # in, and the twin's Asserts would each wait for the host.
    return sample_keys_twin.keys_of_samples(*args)
  return load().tfde_sample_keys(*args)


def split_sample_keys(keys, num_samples, bits):
  keys = tf.cast(index_tensor(keys, "keys"), tf.int64)
  num_samples = tf.cast(index_tensor(num_samples, "num_samples"), tf.int64)
  if not types.on_cpu(keys.device):
    # Keys the pipeline made in increasing sample (as sample_keys).
    return sample_keys_twin.ids_and_splits_of_keys(keys, num_samples, int(bits))
  return load().tfde_split_sample_keys(keys, num_samples, bits=int(bits))


def embedding_combine(rows, inverse, row_splits, weights=None, combiner="sum"):
  return load().tfde_embedding_combine(
      rows, index_tensor(inverse, "inverse"), row_splits, _weights_or_empty(weights),
      combiner=combiner)


def embedding_combine_grad(grad, inverse, row_splits, weights, num_unique,
                           combiner="sum"):
  return load().tfde_embedding_combine_grad(
      grad, index_tensor(inverse, "inverse"), row_splits, _weights_or_empty(weights),
      index_tensor(num_unique, "num_unique"), combiner=combiner)


def _scalar(x):
  return tf.cast(x, tf.float32)


def _rows(grad_rows):
  return tf.zeros([0], tf.int32) if grad_rows is None else index_tensor(grad_rows, "grad_rows")


# Each optimizer kind's op, for static variables and for dynamic tables.
_SPARSE_APPLY_OPS = {"sgd": "tfde_sparse_apply_sgd", "adagrad": "tfde_sparse_apply_adagrad",
                     "rowwise_adagrad": "tfde_sparse_apply_rowwise_adagrad",
                     "adam": "tfde_sparse_apply_lazy_adam", "ftrl": "tfde_sparse_apply_ftrl"}
# Dynamic tables keep every slot as wide as a row: no row-wise kind.
_DYNAMIC_APPLY_OPS = {kind: op.replace("tfde_sparse_apply", "tfde_dynamic_table_apply")
                      for kind, op in _SPARSE_APPLY_OPS.items()
                      if kind not in reference.ROW_WISE_KINDS}
# Kinds with a CPU kernel only: on a GPU their twin (stock TF ops) updates.
_CPU_ONLY_KINDS = frozenset({"rowwise_adagrad"})


def bag_gradient_index(inverse, row_splits, weights, num_unique, combiner="sum"):
  return load().tfde_bag_gradient_index(
      index_tensor(inverse, "inverse"), row_splits, _weights_or_empty(weights),
      index_tensor(num_unique, "num_unique"), combiner=combiner)


def sparse_apply(kind, variables, indices, grad, scalars, grad_rows=None,
                 copy_on_read=True):
  if kind in _CPU_ONLY_KINDS and types.on_gpu(variables[0].device):
    return reference.sparse_apply(kind, variables, indices, grad, scalars, grad_rows,
                                  copy_on_read)
  handles = [v.handle for v in variables]
  indices = index_tensor(indices, "indices")
  scalars = [_scalar(x) for x in scalars]
  if isinstance(grad, types.BagGradients):
    if types.on_gpu(variables[0].device):
      # The FromBags updates are CPU kernels: on a GPU the gradient matrix
      # is formed first.
      grad = grad.dense()
    else:
      op = getattr(load(), _SPARSE_APPLY_OPS[kind] + "_from_bags")
      return op(*handles, indices, tf.cast(grad.output_grad, tf.float32), grad.segments,
                grad.bags, grad.weights, _rows(grad_rows), *scalars,
                copy_on_read=copy_on_read)
  op = getattr(load(), _SPARSE_APPLY_OPS[kind])
  rows = _rows(grad_rows)
  if rows.dtype == tf.int64 and types.on_gpu(variables[0].device):
    rows = _narrow_grad_rows(rows, grad)
  return op(*handles, indices, grad, rows, *scalars, copy_on_read=copy_on_read)


def _narrow_grad_rows(rows, grad):
  # The GPU kernels read int32 gradient rows (a gradient matrix has fewer
  # than 2**31 rows). A row out of range is refused by name before the
  # narrowing, as the CPU kernels refuse it, so none wraps onto another row.
  with tf.control_dependencies([grad_rows_in_range(rows, grad)]):
    return tf.cast(rows, tf.int32)


def combine_from_tables(tables, rows, bases, inverse, row_splits, weights=None,
                        combiner="sum"):
  inverse = index_tensor(inverse, "inverse")
  if types.on_gpu(tables[0].device) and inverse.dtype != tf.int32:
    # The GPU kernel reads an int32 inverse (the pipeline's is); with an
    # int64 one, gather, then combine.
    return embedding_combine(gather_from_tables(tables, rows, bases), inverse, row_splits,
                             weights, combiner)
  return _of_tables_width(load().tfde_combine_from_tables(
      [t.handle for t in tables], index_tensor(rows, "rows"), inverse, row_splits,
      _weights_or_empty(weights), bases=[int(b) for b in bases], combiner=combiner), tables)


def _of_tables_width(output, tables):
  """`output`, rows as wide as `tables`, with that width in its static
  shape: the ops' shape functions see only the tables' handles, and an
  unknown width made every op after them size their rows when traced."""
  output.set_shape(tf.TensorShape([None]).concatenate(tables[0].shape[1:]))
  return output


def split_rows_by_table(rows, bases):
  local_rows, positions = load().tfde_split_rows_by_table(
      index_tensor(rows, "rows"), num_tables=len(bases), bases=[int(b) for b in bases])
  return list(zip(local_rows, positions))


def gather_from_tables(tables, rows, bases):
  return _of_tables_width(load().tfde_gather_from_tables([t.handle for t in tables],
                                                         index_tensor(rows, "rows"),
                                                         bases=[int(b) for b in bases]), tables)


def advise_huge_pages(variables, collapse=True):
  # One op per device: an op's resource inputs must all be on its device,
  # and MirroredStrategy over logical CPUs puts each replica's table on one.
  by_device = {}
  for v in variables:
    by_device.setdefault(v.device, []).append(v.handle)
  advice = []
  for device, handles in by_device.items():
    with tf.device(device):
      advice.append(load().tfde_advise_huge_pages(handles, collapse=collapse))
  return tuple(tf.add_n(list(bytes_)) for bytes_ in zip(*advice))


def _int64(value, name):
  """An integer input of the dynamic table ops, widened to int64."""
  return tf.cast(index_tensor(value, name), tf.int64)


def _destroy_resource(handle, device):
  # A weakref callback runs wherever the garbage collector happens to run:
  # in any thread, possibly one tracing a tf.function (a strategy's replica
  # thread). There, in graph mode, the op would join the traced graph,
  # leaving the rows allocated (and, inside the trace, once hung a suite).
  # Eagerly, as TensorFlow's own resource deleters do.
  try:
    with tf_internals.eager_mode(), tf.device(device):
      tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)
  except Exception:  # pylint: disable=broad-except
    pass  # interpreter shutdown: nothing left to free


class NativeDynamicStore:
  """A dynamic table shard in the kernel's hash-table resource
  (kernels/dynamic_table.h; its ops in dynamic_table_ops.cc and
  dynamic_table_state_ops.cc); the interface of
  `tfde.ops.dynamic_store_twin.DynamicStoreTwin`."""

  _count = 0

  def __init__(self, spec, name, device=None):
    self.spec = spec
    # Every store gets its own resource, however many share a name.
    NativeDynamicStore._count += 1
    shared_name = f"tfde_dynamic_{name}_{NativeDynamicStore._count}"
    with tf.device(device):
      self._handle = load().tfde_dynamic_table_handle(
          shared_name=shared_name, dim=spec.dim,
          slot_initial_values=[float(v) for v in spec.slot_initial_values],
          initializer=spec.initializer, initializer_a=float(spec.initializer_a),
          initializer_b=float(spec.initializer_b), seed=int(spec.seed),
          admit_after=int(spec.admit_after),
          zeros_until_admitted=bool(spec.zeros_until_admitted))
    if tf.executing_eagerly():
      # The resource manager keeps a resource made by name until it is
      # destroyed: free the rows with the last reference to this store (in
      # a TF1 graph they go with the session).
      weakref.finalize(self, _destroy_resource, self._handle, device)

  def lookup(self, ids, counts, step, insert):
    """(rows, row addresses after the lookup), from one op."""
    ids = tf.reshape(_int64(ids, "ids"), [-1])
    counts = tf.zeros([0], tf.int64) if counts is None else _int64(counts, "counts")
    return load().tfde_dynamic_table_lookup(
        self._handle, ids, counts, _int64(step, "step"), dim=self.spec.dim,
        insert=insert)

  def apply(self, kind, ids, grad, scalars, grad_rows=None, by_address=False):
    reference.check_dynamic_update_kind(kind)
    op = getattr(load(), _DYNAMIC_APPLY_OPS[kind])
    return op(self._handle, tf.reshape(_int64(ids, "ids"), [-1]),
              tf.cast(grad, tf.float32), _rows(grad_rows),
              *[_scalar(s) for s in scalars], by_address=by_address)

  def export(self, seen_after=None):
    # The lowest int64 asks for every row (the twin: no filter).
    seen_after = tf.int64.min if seen_after is None else seen_after
    return load().tfde_dynamic_table_export(self._handle, _int64(seen_after, "seen_after"))

  def import_(self, ids, values, counts, last_seen, pending_ids, pending_counts,
              pending_last_seen):
    return load().tfde_dynamic_table_import(
        self._handle, _int64(ids, "ids"), tf.cast(values, tf.float32),
        _int64(counts, "counts"), _int64(last_seen, "last_seen"),
        _int64(pending_ids, "pending_ids"), _int64(pending_counts, "pending_counts"),
        _int64(pending_last_seen, "pending_last_seen"))

  def evict(self, step, max_unseen_steps, max_rows):
    return load().tfde_dynamic_table_evict(
        self._handle, _int64(step, "step"),
        tf.constant(max_unseen_steps, tf.int64), tf.constant(max_rows, tf.int64))

  def stats(self):
    return load().tfde_dynamic_table_stats(self._handle)
