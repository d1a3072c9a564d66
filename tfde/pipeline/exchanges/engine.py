"""An embedding engine's exchange: tables living in one engine
(TensorFlow's TPU embedding, `tfde.tables.tpu`) are looked up and trained
by it in one call, and it moves their rows itself. The forward is the
engine's activations; the backward hands it the output gradients by
feature, which its update applies (`tfde.groups.EngineGroup`).
"""

import dataclasses

import tensorflow as tf

from tfde import groups
from tfde.pipeline import batches
from tfde.pipeline.exchanges import base


@dataclasses.dataclass(frozen=True)
class EngineStep(base.Step):
  """One engine's step: its `outputs` are the engine's activations, one
  per feature, and its `replica` the engine's own (0).

  Attributes (besides `base.Step`'s):
    preserved: what the engine keeps from the forward for its update.
  """
  preserved: object


class Engine(base.Exchange):
  """Takes the groups of tables that live in an engine."""

  kind = "none"

  @classmethod
  def takes(cls, group, choice):
    del choice
    return isinstance(group, groups.EngineGroup)

  def fused_ids(self, features):
    return None

  def variables_read(self, replica):
    return []

  def refuse_weight_gradients(self, features, wants_gradient):
    """The engine gives per-id weights no gradient: refuses `features`
    whose weights (as given, in `source`) a tape watches, by name, rather
    than return none."""
    watched = []
    for feature in features:
      weights = (feature.source or (None, None))[1]
      if weights is None:
        continue
      values = getattr(weights, "flat_values", getattr(weights, "values", weights))
      if wants_gradient(values):
        watched.append(feature.name)
    if watched:
      raise ValueError(
          f"features {sorted(watched)}: a gradient of their per-id weights is "
          "asked for, but under TPUStrategy the TPU embedding engine gives "
          "weights no gradient; pass them through tf.stop_gradient or do not "
          "watch them")

  def forward(self, features, combiners, fused_ids, training):
    del fused_ids
    activations, preserved = self.group.engine.activations(features, training)
    return EngineStep(features=features, combiners=combiners, replica=0,
                      preserved=preserved, outputs=activations)

  def backward(self, step, prepared, grads, for_update):
    del prepared, for_update
    # Nothing is owned here; the update is the engine's, by feature.
    return (tf.zeros([0], tf.int64),
            ([f.name for f in step.features], [f.table.name for f in step.features],
             list(grads), batches.Carried(step.preserved)))
