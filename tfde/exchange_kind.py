"""Which exchange a group of tables takes between the replicas: each
owner's partial sums of every sample, or the rows of each replica's unique
ids (`tfde.lookup.ShardedLookup`'s `exchange`). Decided from the
configuration only: every graph of a step (training, evaluation) must
make the same collectives in the same order, which the workers of a
multi-process run name by their call order.

"auto" (the default): each owner sums its rows of every sample into
partial outputs, which the replicas add (TorchRec's row-wise sharding;
`tfde.routing.route_bags_to_owners`), where a group's features are all
pooled and none renormalises rows (max_norm); one [samples, width] partial
per owner and replica then travels each way, in place of one row per
unique id (trained weights add each id's row back in the backward).
"rows": the rows of each replica's unique ids travel (fewer bytes, and a
faster step, where a replica's unique ids are not several times N times
its samples: at many replicas, or with one-hot features: `make demo`'s
mostly one-hot model trained about 8% slower with partial sums than
exchanging rows). "auto" keeps the rows where every feature of a group
declares its ids per sample (`FeatureConfig.input_shape`) and they
average under 2N, and a sharding plan's choice (`TableLayout.exchange`,
which `tfde.planner.plan` makes per exchange group from its estimate of
both, from ids per sample measured on sample inputs or declared)
overrides that rule; table-wise, dynamic and reduced-precision groups always
exchange so, and so do groups too large for the sample to ride in the
ids' high bits (N * 2^ceil(log2(the group's rows on one replica)) at 2^31
or more), and every table of a group (`table_stacking`: of one width, by
default) where one feature is unpooled or one table has a max_norm.
Replicated groups exchange only their gradients (an all-gather).

>>> import tfde
>>> t = tfde.TableConfig(name="t", vocabulary_size=8, embedding_dim=4)
>>> one_hot = tfde.FeatureConfig(name="f", table=t, input_shape=(32, 1))
>>> [features_pool_partials(f, num_shards=2) for f in
...  [[one_hot], [tfde.FeatureConfig(name="g", table=t, input_shape=(32, 20))],
...   [tfde.FeatureConfig(name="h", table=t)]]]
[False, True, True]
"""

def features_may_pool(configs):
  """Whether `configs` (`FeatureConfig`s of one group's tables) allow the
  partial sums: every feature pooled, no table renormalising rows."""
  return all(c.output == "pooled" and c.table.max_norm is None for c in configs)


def features_pool_partials(configs, num_shards):
  """The features' side of the choice: whether `configs` (`FeatureConfig`s
  of one group's tables) looked up at `num_shards` owners would take the
  partial sums under "auto", the group allowing it (`pools_partials`) and
  no sharding plan choosing. The planner asks it too (`tfde.planner`)."""
  if not features_may_pool(configs):
    return False
  # The partial sums move fewer bytes (and the step runs faster) only
  # where a replica's unique ids are several times N times its samples.
  # Where every feature declares its ids per sample (`input_shape`), too
  # few of them (under 2N a sample on average) keep the rows: one-hot
  # features, or many replicas. Undeclared, the partial sums.
  declared = [c.declared_ids_per_sample() for c in configs]
  return not (configs and None not in declared and
              sum(declared) < 2 * num_shards * len(configs))


def pools_partials(exchange, group, configs, plan=None):
  """Whether `group`, looked up for the `FeatureConfig`s `configs`, takes
  the exchange of partial sums under the lookup's `exchange`. A sharding
  `plan` whose layouts of the group's tables choose an exchange
  (`TableLayout.exchange`, `tfde.planner.plan`'s) decides in place of
  the declared ids: partial sums where every one says so."""
  if not (exchange == "auto" and group.pools_partials and features_may_pool(configs)):
    return False
  chosen = set()
  if plan is not None:
    chosen = {plan.tables[t.name].exchange for t in group.tables
              if t.name in plan.tables and plan.tables[t.name].exchange}
  if chosen:
    return chosen == {"partial sums"}
  return features_pool_partials(configs, group.num_shards)
