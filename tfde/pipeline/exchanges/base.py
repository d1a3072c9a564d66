"""What an exchange is: the stages one group of tables runs through per
step, forward and back, and the value that carries the step between them.

An exchange owns its input distribution, compute and output distribution
(`forward`, which returns its own step value, the outputs among its
fields), the gradients of the per-id weights (`weights_gradients`) and the
backward of the stages (`backward`: the rows this replica owns and their
gradients, which the lookup's update applies or hands back). The group
(`tfde.groups`) is its storage: it fuses ids, reads and combines rows and
applies updates, and never calls back.

>>> import tfde
>>> from tfde import groups
>>> from tfde.pipeline import exchanges
>>> t = tfde.TableConfig(name="t", vocabulary_size=8, embedding_dim=4)
>>> f = tfde.FeatureConfig(name="f", table=t)
>>> group, = groups.make_groups(
...     {"t": tfde.tables.make_table(t, auto_replicate_bytes=0)}, "auto", 1)
>>> exchange = exchanges.choose(group, exchanges.Choice([f], num_replicas=1))
>>> type(exchange).__name__, exchange.kind
('OneOwner', 'none')
"""

import dataclasses

import tensorflow as tf

from tfde import ops


@dataclasses.dataclass(frozen=True)
class Choice:
  """What decides a group's exchange, besides the group: configuration
  only, so every graph of a step makes the same collectives in the same
  order (the workers of a multi-process run name them by call order).

  Attributes:
    configs: the `FeatureConfig`s of the group's features.
    num_replicas: the replicas of the lookup.
    exchange: the lookup's `exchange` setting: "auto" or "rows".
    plan: its `tfde.planner.ShardingPlan`, or None.
  """
  configs: list
  num_replicas: int
  exchange: str = "auto"
  plan: object = None

  def __post_init__(self):
    if self.exchange not in ("auto", "rows"):
      raise ValueError(f"exchange must be 'auto' or 'rows', got {self.exchange!r}")
    if not isinstance(self.num_replicas, int) or self.num_replicas < 1:
      raise ValueError(f"num_replicas must be a positive int, got {self.num_replicas!r}")

  def renormalizes(self):
    """Whether any of the features' tables renormalises rows (max_norm)."""
    return any(c.table.max_norm is not None for c in self.configs)


@dataclasses.dataclass(frozen=True)
class Step:
  """What every exchange's step value holds (each exchange's adds its own
  fields, all required), which the lookup and its update read.

  Attributes:
    features: the features' `FlatFeature`s, in output order.
    combiners: each feature's combiner.
    replica: the replica it ran on.
    outputs: the features' combined outputs.
  """
  features: list
  combiners: list
  replica: object
  outputs: list


class Exchange:
  """One way a group's rows travel between the replicas, forward and back.

  Args:
    group: the `tfde.groups.TableGroup` it serves.
    comm: the replicas' communicator.
    choice: the `Choice` it was chosen under.

  A subclass says which groups it takes (`takes`), and runs their step:
  `forward` (stages 1 to 3) returns a step value of its own, a `Step`
  with its own fields, all required; `prepare_backward`,
  `weights_gradients` and `backward` take that value back. `kind` says
  what travels.
  """

  def __init__(self, group, comm, choice):
    self.group = group
    self.comm = comm
    self.choice = choice

  @classmethod
  def takes(cls, group, choice):
    """Whether `group` under `choice` (a `Choice`) takes this exchange."""
    raise NotImplementedError

  @property
  def kind(self):
    """What travels between the replicas, as `ShardedLookup.exchanges()`
    reports it: "rows", "partial sums" or "none" (nothing, or only the
    gradients). A new exchange says its own."""
    raise NotImplementedError

  def fused_ids(self, features):
    """One id vector for all `features` (their group's fused ids)."""
    return self.group.fused_ids(features)

  def refuse_weight_gradients(self, features, wants_gradient):
    """Raises where a gradient of `features`' per-id weights is asked for
    (`wants_gradient(tensor)`) that this exchange cannot give."""
    del features, wants_gradient

  def variables_read(self, replica):
    """The variables the forward reads on `replica` through their handles,
    which a tape does not see (`tfde.pipeline.updates.GradientSlices`
    marks them read)."""
    return self.group.gradient_variables(replica)

  def forward(self, features, combiners, fused_ids, training):
    """Stages 1 to 3 for `features` (`FlatFeature`s of the group's tables)
    with their `combiners` and `fused_ids` (`fused_ids(features)`); a step
    value, the outputs among it. `training=False` keeps dynamic tables as
    they are."""
    raise NotImplementedError

  def weights_gradients(self, step, grads, trained):
    """d loss / d weights of the features of `step` at the indices
    `trained`, given their output gradients `grads` (one per feature)."""
    if not trained:
      return []
    return [ops.combine_weights_grad(grads[i], rows, step.features[i].row_splits,
                                     step.features[i].weights, step.outputs[i],
                                     step.combiners[i])
            for i, rows in zip(trained, self.rows_of_ids(step, trained))]

  def rows_of_ids(self, step, trained):
    """For each feature index in `trained`, the rows its ids were combined
    from, one per id."""
    raise NotImplementedError(f"{type(self).__name__} gives per-id weights no gradient")

  def prepare_backward(self, step):
    """What `backward` needs of `step` that waits on no exchange (a dedup),
    built before the backward's chain of exchanges so it may run as soon
    as the forward's ids are known; given back to `backward`. None here."""
    del step

  def backward(self, step, prepared, grads, for_update):
    """(rows or ids this replica owns, their gradients summed over every
    replica that read them) from the output gradients `grads` of `step`'s
    features (`prepared`: `prepare_backward(step)`). `for_update`: they
    only feed a sparse update, so they may come as it reads them best
    (`ops.gradients_for_update`); else a matrix."""
    raise NotImplementedError


def output_gradient(grads):
  """The features' output gradients as one batch's."""
  return grads[0] if len(grads) == 1 else tf.concat(grads, 0)


def split_outputs(out, features, width):
  """One batch's [samples, width] outputs as each feature's, with their
  static shapes."""
  outputs = [out] if len(features) == 1 else tf.split(
      out, [tf.size(f.row_splits) - 1 for f in features])
  return set_output_shapes(outputs, features, width)


def set_output_shapes(outputs, features, width):
  for f, o in zip(features, outputs):
    o.set_shape([f.row_splits.shape[0] - 1 if f.row_splits.shape[0] else None, width])
  return outputs


def split_by_feature(values, features):
  """Per-id `values` of the features as one batch, split per feature."""
  if len(features) == 1:
    return [values]
  return tf.split(values, [tf.size(f.ids) for f in features])


def gradients_at_one_owner(rows, inverse, batch, output_grad, device, for_update):
  """(the distinct `rows` one owner read, their gradients) from the output
  gradient of `batch` (row splits, weights, combiner), each id's row being
  `rows[inverse]`: no exchange, so each row's gradient is summed where it
  is read."""
  splits, weights, combiner = batch
  num_rows = tf.size(rows)
  if for_update:
    return rows, ops.gradients_for_update(output_grad, inverse, splits, weights, num_rows,
                                          combiner, device=device)
  return rows, ops.embedding_combine_grad(output_grad, inverse, splits, weights, num_rows,
                                          combiner)
