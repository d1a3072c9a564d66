"""Column-wise tables: a static table's width split into slices, each
slice held whole by one replica (a `TableWiseTable` of the slice's width).

>>> import tfde
>>> config = tfde.TableConfig(name="wide", vocabulary_size=10,
...                           embedding_dim=8, optimizer="adam")
>>> table = tfde.tables.ColumnWiseTable(config, owners=[0, 0],
...                                     widths=[4, 4])   # no strategy
>>> [s.name for s in table.slices], table.full_table().shape
(['wide_columns_0_4', 'wide_columns_4_8'], (10, 8))

A lookup sends a feature's ids to every slice's owner and concatenates
the slices' outputs (`tfde.lookup`). Combiners (sum, mean, sqrtn) act on
each column alike, and every optimizer (SGD, Adagrad, lazy Adam, FTRL)
updates each element from its own gradient, slots and the table's step
(which every slice advances each step, so Adam's bias correction is the
unsharded one): the slices train exactly as the whole table would.
Slices join the exchanges of tables of their width.

Tables with `max_norm` (a row's norm spans every column) or
reduced-precision rows (each update rounds stochastically per row and
column of the whole table) cannot be column-wise either, and dynamic
tables cannot: a dynamic row is created when its
id is admitted and drawn per (seed, id, column) by the store's kernel
from column 0, and its admission and eviction state (sightings, last
step) would be kept and decided once per slice; `make_table` refuses it.

Its state is the whole table (slices concatenated along the width), so
checkpoints move between kinds and replica counts. The one difference
from an unsharded table: `TableConfig(nonfinite="skip")` decides per
slice, from that slice's gradients.
"""

import numpy as np
import tensorflow as tf

from tfde import config as config_lib
from tfde import initializers
from tfde.tables import base
from tfde.tables import table_wise


def slice_name(table_name, start, stop):
  return f"{table_name}_columns_{start}_{stop}"


def check_slices(config, owners, widths):
  where = f"table {config.name!r}"
  refusal = config.column_wise_refusal()
  if refusal:
    raise ValueError(f"{where} {refusal}")
  if not widths or len(widths) != len(owners):
    raise ValueError(f"{where}: column_wise needs one width per owner, got "
                     f"widths {widths} and owners {owners}")
  if any(not isinstance(w, int) or w <= 0 for w in widths) or \
      sum(widths) != config.embedding_dim:
    raise ValueError(f"{where}: column widths {widths} must be positive and "
                     f"sum to its embedding_dim {config.embedding_dim}")


class ColumnWiseTable(base.Table):
  """A static table split into column slices.

  Args:
    config: the table's `TableConfig`.
    owners: the replica of each slice.
    widths: each slice's width (summing to `embedding_dim`).
    communicator: as `ShardedTable`'s.

  Attributes:
    slices: the `TableWiseTable` of each slice, in column order.
  """

  def __init__(self, config, owners, widths, communicator=None):
    check_slices(config, owners, widths)
    super().__init__(config, communicator)
    self.replicated = False
    self.num_shards = self.comm.num_replicas
    self.owners = list(owners)
    self.widths = list(widths)
    whole = None
    if any(o in self.comm.local_replicas() for o in owners):
      # Each slice starts as its columns of the whole table's initial value.
      whole = initializers.shard_value(config, 1, 0)
    self.slices = []
    start = 0
    for owner, width in zip(owners, widths):
      stop = start + width
      slice_config = config_lib.TableConfig(
          name=slice_name(config.name, start, stop),
          vocabulary_size=config.vocabulary_size, embedding_dim=width,
          initializer="zeros", optimizer=self.optimizer,
          combiner=config.combiner, seed=config.seed, nonfinite=config.nonfinite)
      initial = None if whole is None else whole[:, start:stop]
      self.slices.append(table_wise.TableWiseTable(slice_config, owner, self.comm,
                                                   initial_value=initial))
      start = stop
    for s in self.slices:
      # A slice holds no whole row either: an optimizer handed to a
      # slice's update (explicit training) is refused as the table's is.
      s.row_wise_slots_refused = s.row_norms_refused = self.row_norms_refused
    self.steps = self.slices[0].steps
    self.skips = self.slices[0].skips

  @property
  def optimizer(self):
    return self.__dict__.get("_optimizer") if not self.__dict__.get("slices") \
        else self.slices[0].optimizer

  @optimizer.setter
  def optimizer(self, value):
    # Before the slices are made, kept for them to share.
    self.__dict__["_optimizer"] = value
    for s in self.__dict__.get("slices", []):
      s.optimizer = value

  row_wise_slots_refused = row_norms_refused = (
      "a column-wise table's slices hold no whole row; use row_wise, table_wise "
      "or table_row_wise")

  def use_optimizer(self, optimizer):
    base.check_switch(self, optimizer)
    for s in self.slices:
      s.use_optimizer(optimizer)

  def lookup_local(self, replica, requested, counts, training):
    raise NotImplementedError(f"table {self.name!r} is column-wise: its slices "
                              "are looked up, not the table")

  def apply_gradient(self, replica, rows, grads, optimizer=None, grad_rows=None,
                     finite=None):
    raise NotImplementedError(f"table {self.name!r} is column-wise: its slices "
                              "are trained, not the table")

  def gradient_variable(self, replica):
    raise ValueError(f"table {self.name!r} is column-wise: take gradients of "
                     "its slices' variables (local_variables())")

  def local_variables(self):
    return [v for s in self.slices for v in s.local_variables()]

  # ---- whole-table state: slices side by side

  def state(self, keys=None):
    keys = keys or self.state_keys()
    parts = [s.state(keys) for s in self.slices]
    return {k: parts[0][k] if k == "step" else tf.concat([p[k] for p in parts], 1)
            for k in keys}

  def check_state(self, state, source="checkpoint"):
    super().check_state(state, source)
    for key in self.state_keys():
      if key != "step":
        self._check_shape(state, key, (self.vocabulary_size, self.embedding_dim),
                          source)

  def _load_state(self, state, source):
    self.check_state(state, source)
    self._replaced()
    updates, start = [], 0
    for s in self.slices:
      stop = start + s.embedding_dim
      # The slices' own loads: this table's load_state advises them all.
      updates.append(s._load_state(  # pylint: disable=protected-access
          {k: v if k == "step" else tf.convert_to_tensor(v)[:, start:stop]
           for k, v in state.items() if k in self.state_keys()}, source))
      start = stop
    return tf.group(updates)

  # ---- changes since a mark: the rows any slice changed, whole

  def _changes_since_step(self, step):
    ids = np.unique(np.concatenate(
        [s._changes_since_step(step)[base.CHANGED_IDS] for s in self.slices]))  # pylint: disable=protected-access
    whole = self.state()
    changes = {key: value.numpy()[ids] for key, value in whole.items() if key != "step"}
    changes[base.CHANGED_IDS] = ids
    changes["step"] = whole["step"].numpy()
    return changes

  def apply_changes(self, changes):
    self.check_changes(changes)
    start = 0
    for s in self.slices:
      stop = start + s.embedding_dim
      s.apply_changes({k: v if k in (base.CHANGED_IDS, "step") else v[:, start:stop]
                       for k, v in changes.items()})
      start = stop
    self._replaced()

  def full_table(self):
    return self.state(["table"])["table"].numpy()

  def full_slot(self, slot_name):
    key = base.SLOT_PREFIX + slot_name
    return self.state([key])[key].numpy()


def even_widths(embedding_dim, num_slices):
  """`num_slices` widths summing to `embedding_dim`, as even as can be."""
  size, extra = divmod(embedding_dim, num_slices)
  return [size + (1 if i < extra else 0) for i in range(num_slices)]

