"""Loads tfde's C++ op library and wraps its ops with tfde's signatures.

The library is `_tfde_ops.so` next to this file, built by `pip install .`
(or `make ops` for an in-place build), or the file $TFDE_OPS_LIBRARY names
(`make bazel` builds one with Bazel). `load()` returns None, with the
reason in `load_error()`, when it is missing or was built against another
TensorFlow; callers then fall back to the pure-TF twins in `reference`.
"""

import os

import tensorflow as tf

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


def unique_with_counts(ids):
  return load().tfde_unique_with_counts(ids)


def partition_by_shard(ids, num_shards, dynamic=False):
  return load().tfde_partition_by_shard(
      ids, tf.cast(num_shards, tf.int32), dynamic=dynamic)


def embedding_combine(rows, inverse, row_splits, weights=None, combiner="sum"):
  return load().tfde_embedding_combine(
      rows, tf.cast(inverse, tf.int32), row_splits, _weights_or_empty(weights),
      combiner=combiner)


def embedding_combine_grad(grad, inverse, row_splits, weights, num_unique,
                           combiner="sum"):
  return load().tfde_embedding_combine_grad(
      grad, tf.cast(inverse, tf.int32), row_splits, _weights_or_empty(weights),
      tf.cast(num_unique, tf.int32), combiner=combiner)


def _scalar(x):
  return tf.cast(x, tf.float32)


def _rows(grad_rows):
  return tf.zeros([0], tf.int32) if grad_rows is None else tf.cast(grad_rows, tf.int32)


def sparse_apply_sgd(var, indices, grad, learning_rate, grad_rows=None):
  return load().tfde_sparse_apply_sgd(var.handle, indices, grad, _rows(grad_rows),
                                      _scalar(learning_rate))


def sparse_apply_adagrad(var, accumulator, indices, grad, learning_rate,
                         epsilon, grad_rows=None):
  return load().tfde_sparse_apply_adagrad(
      var.handle, accumulator.handle, indices, grad, _rows(grad_rows),
      _scalar(learning_rate),
      _scalar(epsilon))


def sparse_apply_lazy_adam(var, m, v, indices, grad, learning_rate, beta_1,
                           beta_2, epsilon, step, grad_rows=None):
  return load().tfde_sparse_apply_lazy_adam(
      var.handle, m.handle, v.handle, indices, grad, _rows(grad_rows),
      _scalar(learning_rate),
      _scalar(beta_1), _scalar(beta_2), _scalar(epsilon), _scalar(step))


def sparse_apply_ftrl(var, accumulator, linear, indices, grad, learning_rate,
                      l1, l2, l2_shrinkage, beta, learning_rate_power,
                      grad_rows=None):
  return load().tfde_sparse_apply_ftrl(
      var.handle, accumulator.handle, linear.handle, indices, grad,
      _rows(grad_rows),
      _scalar(learning_rate), _scalar(l1), _scalar(l2), _scalar(l2_shrinkage),
      _scalar(beta), _scalar(learning_rate_power))


def gather_from_tables(tables, rows, bases):
  return load().tfde_gather_from_tables([t.handle for t in tables], rows,
                                        bases=[int(b) for b in bases])


class NativeDynamicStore:
  """A dynamic table shard in the kernel's hash-table resource
  (kernels/dynamic_table_ops.cc); the interface of
  `reference.DynamicStoreTwin`."""

  _APPLY_OPS = {"sgd": "tfde_dynamic_table_apply_sgd",
                "adagrad": "tfde_dynamic_table_apply_adagrad",
                "adam": "tfde_dynamic_table_apply_lazy_adam",
                "ftrl": "tfde_dynamic_table_apply_ftrl"}

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

  def lookup(self, ids, counts, step, insert):
    """(rows, row addresses after the lookup), from one op."""
    ids = tf.reshape(tf.cast(ids, tf.int64), [-1])
    counts = (tf.zeros([0], tf.int64) if counts is None
              else tf.cast(counts, tf.int64))
    return load().tfde_dynamic_table_lookup(
        self._handle, ids, counts, tf.cast(step, tf.int64), dim=self.spec.dim,
        insert=insert)

  def apply(self, kind, ids, grad, scalars, grad_rows=None, by_address=False):
    op = getattr(load(), self._APPLY_OPS[kind])
    return op(self._handle, tf.reshape(tf.cast(ids, tf.int64), [-1]),
              tf.cast(grad, tf.float32), _rows(grad_rows),
              *[_scalar(s) for s in scalars], by_address=by_address)

  def export(self):
    return load().tfde_dynamic_table_export(self._handle)

  def import_(self, ids, values, counts, last_seen, pending_ids, pending_counts,
              pending_last_seen):
    cast = lambda x: tf.cast(x, tf.int64)
    return load().tfde_dynamic_table_import(
        self._handle, cast(ids), tf.cast(values, tf.float32), cast(counts),
        cast(last_seen), cast(pending_ids), cast(pending_counts),
        cast(pending_last_seen))

  def evict(self, step, max_unseen_steps, max_rows):
    return load().tfde_dynamic_table_evict(
        self._handle, tf.cast(step, tf.int64),
        tf.constant(max_unseen_steps, tf.int64), tf.constant(max_rows, tf.int64))

  def stats(self):
    return load().tfde_dynamic_table_stats(self._handle)
