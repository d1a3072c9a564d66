"""Lets Keras 3 `fit` run under MultiWorkerMirroredStrategy.

Keras's TensorFlow trainer (3.x up to at least 3.15) builds a model
symbolically from its first batch, which it first averages across replicas
with `strategy.reduce("MEAN", batch)`. MultiWorkerMirroredStrategy cannot
reduce a nested batch (dict of features, (x, y) tuple): fit fails with
"Attempt to convert a value ({...: PerReplica...})", for any model. The
symbolic build only needs shapes and dtypes (and a mean of ids would be
meaningless), so this shim gives it this worker's first local replica's
batch instead. It changes nothing else and only that one case.

Keras's `reduce_per_replica` (same module) also averages the per-step
logs of multi-worker runs with `strategy.reduce("MEAN", v, axis=0)`, which
fails for scalar logs such as the loss ("Invalid reduction dimension 0 for
input with 0 dimensions"); scalars are reduced with axis=None instead.

Nothing is patched at import: `apply()` (idempotent) is called when a
`tfde.layers.DistributedEmbedding` is built under
MultiWorkerMirroredStrategy, or explicitly. The symbolic-build fix then
acts only for models that hold a tfde layer; the scalar-log fix is a
module function of Keras's trainer that cannot tell models apart, so it
acts for any model under MultiWorkerMirroredStrategy, where Keras's own
code fails.
"""

import tensorflow as tf

from tfde import tf_internals

_applied = False


def _holds_tfde_layer(model):
  # tfde's layers (and users' subclasses of them) say so.
  return any(getattr(layer, "holds_tfde_tables", False)
             for layer in model._flatten_layers())  # pylint: disable=protected-access


def apply():
  global _applied
  if _applied:
    return
  trainer = tf_internals.keras_tensorflow_trainer()
  if trainer is None:
    return
  import keras  # pylint: disable=g-import-not-at-top
  tree = keras.tree
  original = getattr(trainer.TensorFlowTrainer, "_maybe_symbolic_build", None)
  if original is None:
    return

  def _maybe_symbolic_build(self, iterator=None, data_batch=None):
    strategy = getattr(self, "_distribute_strategy", None)
    if (iterator is None or strategy is None or not isinstance(
        strategy, tf.distribute.MultiWorkerMirroredStrategy) or
        not _holds_tfde_layer(self)):
      return original(self, iterator=iterator, data_batch=data_batch)
    for _, _, it in iterator:
      batch = next(it)
      data_batch = tree.map_structure(
          lambda x: (strategy.experimental_local_results(x)[0]
                     if isinstance(x, tf.distribute.DistributedValues) else x),
          batch)
      break
    with strategy.scope():
      self._symbolic_build(data_batch=data_batch)  # pylint: disable=protected-access

  trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build  # pylint: disable=protected-access

  original_reduce = getattr(trainer, "reduce_per_replica", None)
  if original_reduce is not None:

    def reduce_per_replica(values, strategy, reduction):
      if (reduction in ("auto", "mean") and
          isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)):
        def reduce_one(v):
          local = (strategy.experimental_local_results(v)[0]
                   if isinstance(v, tf.distribute.DistributedValues) else v)
          if tf.is_tensor(local) and local.shape.rank == 0:
            return strategy.reduce("MEAN", v, axis=None)
          return original_reduce(v, strategy, reduction)
        return tree.map_structure(reduce_one, values)
      return original_reduce(values, strategy, reduction)

    trainer.reduce_per_replica = reduce_per_replica
  _applied = True
