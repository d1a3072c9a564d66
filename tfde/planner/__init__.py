"""The sharding planner: a layout per table (row-wise, table-wise,
column-wise, replicated) chosen by a cost model under each replica's
memory.

>>> import tfde
>>> sizes = [(50, 8), (200_000, 16), (30_000, 64), (1000, 16)]
>>> tables = [tfde.TableConfig(name=f"t{i}", vocabulary_size=v, embedding_dim=d,
...                            optimizer="adagrad") for i, (v, d) in enumerate(sizes)]
>>> features = [tfde.FeatureConfig(name=f"f{i}", table=t, input_shape=(1024, 4))
...             for i, t in enumerate(tables)]
>>> plan = tfde.planner.plan(features, num_replicas=4,
...                          memory_per_replica_bytes=64 << 20)
>>> {name: layout.kind for name, layout in plan.tables.items()}
{'t0': 'replicated', 't1': 'row_wise', 't2': 'column_wise', 't3': 'row_wise'}
>>> plan.tables["t2"].column_widths   # slices join t1 and t3's exchange
[16, 16, 16, 16]
>>> tfde.planner.ShardingPlan.from_json(plan.to_json()) == plan
True

A plan is applied by `ShardedLookup(..., plan=plan)` or
`DistributedEmbedding(..., plan=plan)`; `plan.report()` describes it
table by table and replica by replica.

The cost model (`CostModel`, every constant a field) estimates a step as

    sum over the step's exchange phases of
        (latency per collective round + max over replicas of bytes / bandwidth)
    + max over replicas of compute (or the replicas' total over the
      replicas that compute at once, when they share cores), a replica's
      compute being (rows gathered and updated * row bytes) / memory
      bandwidth + tables held * a fixed cost per table

from, per table, the ids per sample of its features, the samples, and
the unique ids per replica batch (measured on `sample_inputs`, else assumed: 1 id per
sample, all unique). Per kind, per replica batch of U unique ids of
width D on N replicas:

- row_wise, exchanging rows (the lookup's `exchange="rows"`, and
  tables whose features do not all pool, or with a max_norm): each
  replica sends (N-1)/N * U ids (8 bytes), gets as many rows back (4 D
  bytes each) and sends their gradients in the backward; the rows are
  spread evenly (memory V D / N per replica);
- row_wise, exchanging partial sums (the default for tables of pooled
  features, as `tfde.exchange_kind` decides from the features' declared
  ids per sample): each replica sends (N-1)/N of its I ids (8 bytes and
  a 4-byte coefficient each; an unweighted sum's ones are not sent where
  one process runs every replica, but the planner, which does not know
  the inputs' weights, counts them: an upper bound); each owner sends
  each other replica, per feature, its S samples' partial sums (4 D bytes a sample), and in the
  backward each replica sends each other its output gradients (as
  many); 5 collective rounds in the forward, against the rows' 3. Fewer
  bytes where U is several times N S, more at many replicas or few ids
  per sample. Each table is judged by its own features, where the
  lookup decides for all tables of its exchange group together (a
  width; reduced-precision rows apart). Where a table's ids per sample
  are measured or declared, the search prices both exchanges, and once
  the layouts are chosen each group's row-wise tables get the faster
  (`TableLayout.exchange`; "partial sums" only where every table of the
  group is row-wise, may take them, and the group's rows leave room for
  the sample in the ids), which the lookup follows in place of its rule
  for declared ids; a second search with rows only is kept where it is
  estimated faster (a greedy placement can settle in groups of partial
  sums). Where some table's ids are neither, the groups get the lookup's
  own rule, written and priced as such;
- table_wise on replica o: every other replica sends o its U ids and
  gets U rows back; o serves N U rows and holds V D;
- column_wise: table-wise per slice, each slice with its own width
  (ids go to every slice's owner, rows come back in slices);
- replicated: no forward exchange; in the backward each replica sends
  its U ids and gradients to the N - 1 others, and every replica applies
  all of them; memory V D on every replica.

With `replicas_per_worker=w` (replicas 0..w-1 on worker 0, and so on) a
replica's bytes with other workers' replicas go at
`CostModel.cross_worker_bandwidth_bytes_per_s` and the rest at
`bandwidth_bytes_per_s`: row-wise and replicated tables send (N - w) /
(N - 1) of their bytes across, a table-wise owner's requesters on other
workers all of theirs. Each table's estimate says its cross-worker bytes.
Knowing the workers, the planner also tries table-row-wise layouts:

- table_row_wise over a worker's w replicas: row i on the (i % w)-th;
  every replica sends each of them 1/w of its U ids; each holds V D / w.
  Against row-wise, only w replicas pay the table's fixed cost and serve
  it; against table-wise, w replicas share its traffic.

Each table (or column slice) a replica holds costs it a fixed
`CostModel.table_overhead_s` per step (its gather and apply ops): what
makes table-wise pay for many small tables, as TorchRec's planner finds.
A group's collective rounds are paid once however many tables share it,
so a column-wise split can pay for itself by joining another width's
exchange, and replicating the tables of a width without large ones saves
that width's forward exchange.

The planner places the largest tables first, each where the estimate
grows least (keeping the row-wise memory of the tables still to place),
moves one table at a time while the estimate drops by more than 1%, and
takes a uniform layout (all row-wise, table-wise or replicated) instead
when it is estimated within 1% of that: near ties go to the simpler,
better balanced layout.

Forward exchanges count `CostModel.forward_weight` times: the dense model
waits for them, while a backward exchange overlaps the dense optimizer
and the other groups' updates. A table's memory is its rows and its
optimizer's slots (Adagrad 1, Adam 2, FTRL 2 of the row's size).
"""

# The package's public names (`tfde.planner.X` in the README, docs and tests).
from tfde.planner.cost import CostModel  # noqa: F401
from tfde.planner.cost import TableStats  # noqa: F401
from tfde.planner.cost import layout_load  # noqa: F401
from tfde.planner.cost import table_stats  # noqa: F401
from tfde.planner.layout import FLOAT_BYTES  # noqa: F401
from tfde.planner.layout import ID_BYTES  # noqa: F401
from tfde.planner.layout import KINDS  # noqa: F401
from tfde.planner.layout import ShardingPlan  # noqa: F401
from tfde.planner.layout import TableLayout  # noqa: F401
from tfde.planner.layout import as_plan  # noqa: F401
from tfde.planner.layout import balance  # noqa: F401
from tfde.planner.search import PlanError  # noqa: F401
from tfde.planner.search import plan  # noqa: F401
from tfde.planner.search import simple_plan  # noqa: F401
