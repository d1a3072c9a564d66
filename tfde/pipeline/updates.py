"""What a lookup's backward does with the gradients each replica owns
(the exchanges' `backward`): apply each table's optimizer to its touched
rows inside the backward (`ApplyInBackward`, the default), or hand them
back as `tf.IndexedSlices` of the local shard variables (`GradientSlices`,
SOK style, `train_in_backward=False`).

>>> type(of(train_in_backward=False)).__name__
'GradientSlices'
"""

import tensorflow as tf

from tfde import ops
from tfde import tf_internals
from tfde.pipeline import batches


class Update:
  """One way to finish a backward. `for_update`: whether the gradients
  only feed a sparse update, so an exchange may give them as it reads
  them best."""

  for_update = False

  def watch(self, exchange, replica):
    """Before `exchange`'s forward on `replica`: what the backward needs a
    tape to see."""
    del exchange, replica

  def finish(self, comm, pairs, owned, grads, trigger_value, variables):
    """(the update trigger's gradient, those of `variables`) for the
    exchanges' steps `pairs` ([(exchange, step)]), their `owned` (rows,
    gradients) and the output gradients `grads` (one list per step)."""
    raise NotImplementedError


class ApplyInBackward(Update):
  """One optimizer step per table, applied to its touched rows in the
  backward; a step one table refuses (non-finite gradients) updates no
  table."""

  for_update = True

  def finish(self, comm, pairs, owned, grads, trigger_value, variables):
    previous = [t for rows, summed in owned for t in [rows] + batches.tensors_of(summed)]
    with tf.control_dependencies(previous):
      finite = finite_by_table(comm, pairs, grads)
    # A table that refuses a non-finite step refuses it for the whole
    # step: every table's check runs before any table of any group is
    # updated (each table's own guard alone would let the others train).
    refusals = [c for exchange, step in pairs for t in exchange.group.tables
                for c in t.nonfinite_checks(step.replica, finite[t.name])]
    applied = []
    with tf.control_dependencies(refusals):
      # As data too: a control edge into a tf.cond (a skipping table's
      # guard) does not hold back the ops of its branches.
      finite = {name: tf.identity(flag) for name, flag in finite.items()}
      for (exchange, step), (rows, summed) in zip(pairs, owned):
        applied += exchange.group.apply_gradient(
            step.replica, tf.identity(rows), batches.map_tensors(tf.identity, summed),
            finite)
    # Zero, but computed from the updates' results (new steps), so
    # whatever consumes the trigger's gradient runs them. Not zeros times
    # them: Grappler rewrites that as zeros, and Keras fit on TF 2.16 (a
    # step function inside another) then ran no update at all.
    done = tf.add_n([tf.cast(u, trigger_value.dtype) for u in applied])
    return tf.zeros_like(trigger_value) + ops.zero_from(done), [None] * len(variables)


class GradientSlices(Update):
  """`tf.IndexedSlices` gradients for the local shard variables; nothing
  applied."""

  def watch(self, exchange, replica):
    # The kernels read the variables through their handles, which a tape
    # does not see; tell it, so gradients can flow to them. (When training
    # in backward, watching them would only cost a copy.)
    for variable in exchange.variables_read(replica):
      tf_internals.mark_variable_read(variable)

  def finish(self, comm, pairs, owned, grads, trigger_value, variables):
    del comm, grads
    slices = {}
    for (exchange, step), (rows, summed) in zip(pairs, owned):
      slices.update(exchange.group.gradient_slices(step.replica, rows, summed))
    return tf.zeros_like(trigger_value), [slices.get(id(v)) for v in variables]


def of(train_in_backward):
  """The update a lookup's `train_in_backward` asks for."""
  return ApplyInBackward() if train_in_backward else GradientSlices()


def finite_by_table(comm, pairs, output_grads):
  """table name -> whether every replica's gradients for the table's rows
  are finite this step (its features' output gradients and weights), for
  the tables of every group in one exchange. One flag for all replicas,
  so a table is updated everywhere or nowhere."""
  names, flags = [], []
  for (exchange, step), grads in zip(pairs, output_grads):
    for table in exchange.group.tables:
      name = table.name
      parts = [tf.reduce_all(tf.math.is_finite(g)) for f, g in
               zip(step.features, grads) if f.table.name == name]
      parts += [tf.reduce_all(tf.math.is_finite(f.weights)) for f in step.features
                if f.table.name == name and f.weights is not None]
      names.append(name)
      flags.append(tf.reduce_all(tf.stack(parts)) if parts else tf.constant(True))
  every = comm.gather_flags(tf.cast(tf.stack(flags), tf.int32))
  finite = tf.equal(tf.reduce_min(every, axis=0), 1)
  return {name: finite[i] for i, name in enumerate(names)}
