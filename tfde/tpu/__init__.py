"""TPU portability: configs in three vocabularies, and TPU checkpoints.

>>> import tensorflow as tf
>>> import tfde
>>> table = tfde.TableConfig(name="movie", vocabulary_size=100,
...                          embedding_dim=8, optimizer="adagrad",
...                          combiner="sum")
>>> features = {"watched": tfde.FeatureConfig(name="watched", table=table)}
>>> tpu_features = tfde.tpu.to_tpu_feature_configs(features)
>>> tpu_table = tpu_features["watched"].table
>>> tpu_table.dim, tpu_table.combiner, type(tpu_table.optimizer).__name__
(8, 'sum', 'Adagrad')
>>> tfde.tpu.from_tpu_feature_configs(tpu_features)["watched"] == features["watched"]
True

`to_tpu_feature_configs` / `from_tpu_feature_configs` convert tfde's
configs to TensorFlow's `tf.tpu.experimental.embedding` ones and back;
`as_feature_configs` takes any nested structure of tfde, TensorFlow TPU or
keras-rs configs (what `DistributedEmbedding` and `ShardedLookup` accept).
The optimizers are mapped so that both make the same update, where TPU
embedding's rules differ from Keras's (TensorFlow's
`optimization_parameters.proto`):

- TPU Adagrad has no epsilon: tfde's `Adagrad(initial_accumulator_value=a,
  epsilon=e)` becomes TPU `Adagrad(initial_accumulator_value=a + e)`, whose
  accumulator is then always tfde's plus e, so lr g / sqrt(acc) is the same
  step. Checkpoints add or subtract e in the accumulator slot.
- TPU Adam has no bias correction, and by default divides by
  sqrt(v + eps^2): tfde's Adam becomes TPU `Adam(sum_inside_sqrt=False,
  lazy_adam=True)` with a callable learning rate lr * sqrt(1 - beta_2^t) /
  (1 - beta_1^t), t read from `iterations`. A TPU Adam comes back as tfde
  `Adam(bias_correction=False)`; with `sum_inside_sqrt=True` (and epsilon
  > 0) it has no tfde equivalent and is refused by name.
- TPU FTRL has no l2 shrinkage: a tfde FTRL with
  `l2_shrinkage_regularization_strength` is refused by name. Its `beta`
  enters both the same way (beta / lr in the quadratic term).

Initializers carry over as objects: the same distribution, not the same
random values (tfde draws rows from (seed, row); TPU from its own seed).

`restore_tpu_checkpoint` loads tables and optimizer slots from a checkpoint
of TensorFlow's TPU embedding mid-level API (`TPUEmbedding`,
`TPUEmbeddingV2` with SparseCore's stacked, sharded tables, or
`TPUEmbeddingForServing`) into a tfde layer or lookup of any replica count;
`write_tpu_checkpoint` writes one `TPUEmbeddingForServing` restores.
"""

from tfde import lazy_modules as _lazy_modules

# The package's public names (`tfde.tpu.X` in the README, docs and tests),
# each read from its module on first use: the config conversions lie a
# layer below this package (the TPU table kind and the pipeline use them,
# docs/ARCHITECTURE.md), and importing one must not load the checkpoints.
_NAMES = {
    "SPARSECORE_LAYOUTS_KEY": "checkpoints", "TPU_SLOT_NAMES": "checkpoints",
    "read_tpu_checkpoint": "checkpoints", "restore_tpu_checkpoint": "checkpoints",
    "unshuffle_sparsecore": "checkpoints", "write_tpu_checkpoint": "checkpoints",
    "as_feature_configs": "configs", "from_tpu_feature_configs": "configs",
    "from_tpu_table_config": "configs", "to_tpu_feature_configs": "configs",
    "to_tpu_table_config": "configs", "from_tpu_optimizer": "optimizer_mapping",
    "to_tpu_optimizer": "optimizer_mapping", "tpu_slot_offsets": "optimizer_mapping",
}
__all__ = sorted(_NAMES)

__getattr__, __dir__ = _lazy_modules.submodules(__name__, attributes=_NAMES)
