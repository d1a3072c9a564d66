"""Embedding tables: one contract (`base.Table`), one class per kind.

>>> import tfde
>>> config = tfde.TableConfig(name="t", vocabulary_size=10, embedding_dim=4)
>>> type(tfde.tables.make_table(config)).__name__
'ShardedTable'

- `base.py`: the contract every kind implements (routing, local compute,
  apply, explicit gradients, whole-table state) and ownership;
- `sharded.py`: static tables sharded by `id % N`, or replicated;
- `dynamic.py`: hash tables that grow, with admission and eviction;
- `table_wise.py`: a whole table (static or dynamic) on one replica;
- `column_wise.py`: a static table's width in slices on several replicas;
- `table_row_wise.py`: a static table's rows spread over a few replicas
  (one worker's);
- `tpu.py`: under TPUStrategy, TensorFlow's TPU embedding engine holds the
  tables (`TPUTable`, made with the `TPUEngine` of `tpu.engine_for`, and
  looked up and trained by `tfde.groups.EngineGroup`);
- `graph_saving.py`: whole tables in TF1 savers (estimator checkpoints).

A new kind (an engine, a sharding kind) is a new file with a class
implementing `base.Table`, and a branch in `make_table`.
"""

from tfde import optimizers
from tfde import placement
from tfde.tables import graph_saving
from tfde.tables.base import Table  # noqa: F401 (public)
from tfde.tables.column_wise import ColumnWiseTable
from tfde.tables.dynamic import DynamicTable
from tfde.tables.sharded import ShardedTable
from tfde.tables.table_row_wise import TableRowWiseTable
from tfde.tables.table_wise import DynamicTableWiseTable
from tfde.tables.table_wise import TableWiseTable
from tfde.tables.tpu import TPUTable

# The sharding kinds a layout (`tfde.planner.TableLayout`) may name.
KINDS = ("row_wise", "table_wise", "column_wise", "replicated", "table_row_wise")


def make_table(config, communicator=None, auto_replicate_bytes=None, layout=None,
               engine=None):
  """The table of `config`'s kind and placement (see `tfde.placement`), or
  of `layout` (a `tfde.planner.TableLayout`: kind, owners, column widths)
  when given; with `engine` (a `tpu.TPUEngine`), a table living in it."""
  if engine is not None:
    return TPUTable(config, engine)
  if layout is not None:
    table = _make_laid_out(config, communicator, layout)
  elif config.is_dynamic:
    placement.check(config)
    table = DynamicTable(config, communicator)
  else:
    table = ShardedTable(config, communicator,
                         replicated=placement.replicates(config, auto_replicate_bytes))
  table.advise_memory()  # its buffers exist and hold their first values
  # Built in a TF1 graph (an estimator's model_fn), the table joins the
  # graph's savers whole (graph_saving).
  return graph_saving.register(table)


def _make_laid_out(config, communicator, layout):
  kind = layout.kind
  if kind not in KINDS:
    raise ValueError(f"table {config.name!r}: unknown sharding kind {kind!r}; "
                     f"one of {KINDS}")
  if kind == "row_wise":
    if config.is_dynamic:
      return DynamicTable(config, communicator)
    return ShardedTable(config, communicator, replicated=False)
  if kind == "replicated":
    if config.is_dynamic:
      raise ValueError(f"table {config.name!r} is dynamic; replicated applies "
                       "to static tables only (each replica would grow its own "
                       "rows); use row_wise or table_wise")
    return ShardedTable(config, communicator, replicated=True)
  if kind == "table_wise":
    cls = DynamicTableWiseTable if config.is_dynamic else TableWiseTable
    return cls(config, layout.owners[0], communicator)
  if kind == "table_row_wise":
    return TableRowWiseTable(config, layout.owners, communicator)
  return ColumnWiseTable(config, layout.owners, layout.column_widths, communicator)


# (table, replica) of a variable a table handed out, else None.
owner_of = optimizers.shard_owner
