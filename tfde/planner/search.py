"""The planner's search: the layout per table that minimises the
estimated step under each replica's memory (`plan`), and the uniform
layouts it is compared with (`simple_plan`)."""

import dataclasses
import math

import numpy as np

from tfde import exchange_kind
from tfde import routing
from tfde.planner.cost import CostModel
from tfde.planner.cost import _Load
from tfde.planner.cost import _table_configs
from tfde.planner.cost import exchanging_rows
from tfde.planner.cost import layout_load
from tfde.planner.cost import table_stats
from tfde.planner.layout import ShardingPlan
from tfde.planner.layout import TableLayout
from tfde.planner.layout import check_memory_budget


def _candidates(stats, config, n, load, cost, per_worker=None):
  """The layouts considered for a table."""
  everyone = list(range(n))
  if config.placement == "default_device" and not config.is_dynamic:
    return [TableLayout("replicated", everyone)]
  if n > 1 and stats.may_pool_partials and stats.ids_known:
    # Both exchanges, each estimated (`_choose_exchanges` then settles one
    # per exchange group).
    options = [TableLayout("row_wise", everyone, exchange=e)
               for e in ("rows", "partial sums")]
  else:
    options = [TableLayout("row_wise", everyone)]
  if n == 1:
    return options
  if not config.is_dynamic:
    options.append(TableLayout("replicated", everyone))
  # Owners in order of their current load, least loaded first.
  order = [int(r) for r in np.argsort(load.replica_seconds(cost) + load.memory * 1e-18,
                                      kind="stable")]
  # Replicas of equal load are interchangeable owners: the least loaded
  # few are enough (and keep planning for 1,024 replicas fast).
  options += [TableLayout("table_wise", [r]) for r in order[:TABLE_WISE_OWNERS_TRIED]]
  if not config.is_dynamic and per_worker is not None and 1 < per_worker < n:
    # Rows spread over one worker's replicas: their traffic stays inside it
    # (the least loaded workers first).
    workers = np.argsort(_worker_loads(load, cost, per_worker), kind="stable")
    options += [TableLayout("table_row_wise", _worker_replicas(int(w), per_worker))
                for w in workers[:TABLE_WISE_OWNERS_TRIED]]
  if config.column_wise_refusal() is None:
    k = 2
    while k <= n and stats.width // k >= cost.min_column_width:
      if stats.width % k == 0:
        options.append(TableLayout("column_wise", order[:k], [stats.width // k] * k))
      k *= 2
  return options


TABLE_WISE_OWNERS_TRIED = 4


def _check_workers(num_replicas, replicas_per_worker):
  if replicas_per_worker is not None and (
      not isinstance(replicas_per_worker, int) or replicas_per_worker < 1 or
      num_replicas % replicas_per_worker):
    raise ValueError(f"replicas_per_worker ({replicas_per_worker}) must divide "
                     f"num_replicas ({num_replicas})")


def _worker_loads(load, cost, per_worker):
  """Each worker's estimated seconds (its replicas' sum)."""
  return load.replica_seconds(cost).reshape(-1, per_worker).sum(1)


def _worker_replicas(worker, per_worker):
  return list(range(worker * per_worker, (worker + 1) * per_worker))


class PlanError(ValueError):
  """No layout of a table fits the replicas' memory."""


def plan(feature_configs, num_replicas, memory_per_replica_bytes=None,
         replicas_per_worker=None, sample_inputs=None, batch_size=None,
         cost_model=None, exchange="auto"):
  """A `ShardingPlan` for the tables of `feature_configs` on `num_replicas`.

  Args:
    feature_configs: `FeatureConfig`s (dict or list).
    num_replicas: replicas the plan is for.
    memory_per_replica_bytes: each replica's budget for rows and optimizer
      slots (None: unlimited).
    replicas_per_worker: replicas per worker process (replicas 0..w-1 on
      worker 0, and so on): the cost model prices bytes between workers at
      `CostModel.cross_worker_bandwidth_bytes_per_s`, so layouts keeping
      traffic inside a worker cost less. None: every link alike.
    sample_inputs: feature name -> one global batch of ids (dense, ragged
      or sparse), from which ids per sample and unique ids per replica are
      measured; without it each feature is assumed to give `input_shape[1]`
      (or 1) distinct ids per sample.
    batch_size: the global batch to plan for (default the sample's).
    cost_model: a `CostModel` (default constants otherwise).
    exchange: the lookup's `exchange` ("auto": row-wise tables of pooled
      features are estimated exchanging partial sums, as the lookup's
      default does; "rows": exchanging rows).

  Tables are placed largest first; each takes the layout (row-wise,
  replicated, table-wise on each replica, column-wise in 2, 4, ...
  slices, table-row-wise over a worker's replicas when
  `replicas_per_worker` is given) that fits every replica's memory and gives the smallest
  estimated step time for the tables placed so far (ties: the earlier
  option, row-wise first), while leaving the tables still to place the
  memory of their row-wise layout when it can. Raises `PlanError` naming the table and the
  bytes missing when none fits.
  """
  cost = cost_model or CostModel()
  if not isinstance(num_replicas, int) or num_replicas < 1:
    raise ValueError(f"num_replicas must be an int >= 1, got {num_replicas!r}")
  check_memory_budget(memory_per_replica_bytes)
  _check_workers(num_replicas, replicas_per_worker)
  tables = _table_configs(feature_configs)
  configs = {name: cfg for name, (cfg, _) in tables.items()}
  features_of = {name: features for name, (_, features) in tables.items()}
  budget = math.inf if memory_per_replica_bytes is None else memory_per_replica_bytes
  searched = []
  # Under "auto", where every table's ids per sample are measured or
  # declared, also the search whose row-wise tables exchange rows only: a
  # greedy placement offering both exchanges table by table can settle in
  # groups of partial sums (or in groups that cannot take them) where rows
  # would be faster; the faster plan is kept. (Not on guessed ids: the
  # lookup's own rule stands there.)
  measured = table_stats(feature_configs, num_replicas, sample_inputs, batch_size, exchange)
  for each in dict.fromkeys([exchange, "rows"]):
    # The sample inputs are measured once: the rows-only search's stats
    # are the same measures under exchange="rows".
    stats = measured if each == exchange else exchanging_rows(measured)
    if searched and not all(t.ids_known for t in stats.values()):
      break
    layouts, load = _search(stats, configs, num_replicas, budget, cost,
                            replicas_per_worker, memory_per_replica_bytes)
    layouts, load = _choose_exchanges(layouts, load, stats, features_of, num_replicas,
                                      cost, replicas_per_worker)
    searched.append((load.seconds(cost), stats, layouts, load))
    if num_replicas == 1:
      break
  _, stats, layouts, load = min(searched, key=lambda s: s[0])
  for name, (option, delta) in layouts.items():
    option.estimate = _table_estimate(stats[name], delta)
  layouts = {name: option for name, (option, _) in layouts.items()}
  return ShardingPlan(
      num_replicas=num_replicas, tables={n: layouts[n] for n in sorted(layouts)},
      memory_per_replica_bytes=memory_per_replica_bytes,
      replicas_per_worker=replicas_per_worker,
      estimated_step_seconds=load.seconds(cost),
      per_replica=_replica_estimate(load, cost))


def _search(stats, configs, num_replicas, budget, cost, replicas_per_worker,
            memory_per_replica_bytes):
  """The greedy placement, then `_improve`'s moves: (layouts, load)."""
  order = sorted(stats, key=lambda t: (-stats[t].rows * stats[t].row_bytes, t))
  load = _Load(num_replicas)
  layouts = {}
  # What the tables still to place need at least (row-wise, spread evenly):
  # a choice leaving less would starve them.
  least = {t: math.ceil(stats[t].rows / num_replicas) * stats[t].row_bytes for t in order}
  reserve = float(sum(least.values()))
  for name in order:
    reserve -= least[name]
    best, best_reserved, shortfall = None, None, None
    for option in _candidates(stats[name], configs[name], num_replicas, load, cost,
                              replicas_per_worker):
      delta = layout_load(stats[name], option, num_replicas, replicas_per_worker)
      over = load.memory + delta.memory - budget
      if over.max() > 0:
        if shortfall is None or over.max() < shortfall[0]:
          shortfall = (over.max(), option.kind, int(over.argmax()))
        continue
      trial = load.copy()
      trial.add(delta)
      seconds = trial.seconds(cost)
      if best is None or seconds < best[0] * (1 - 1e-9):
        best = (seconds, option, delta)
      if (over.max() + reserve <= 0 and
          (best_reserved is None or seconds < best_reserved[0] * (1 - 1e-9))):
        best_reserved = (seconds, option, delta)
    best = best_reserved or best
    if best is None:
      missing, kind, replica = shortfall
      raise PlanError(
          f"table {name!r} ({stats[name].rows} rows x {stats[name].width}, "
          f"{stats[name].slots:g} row-sized optimizer slots) does not fit: its smallest "
          f"layout ({kind}) needs {int(math.ceil(missing))} bytes more than "
          f"replica {replica} has left of its {memory_per_replica_bytes} "
          f"(tables placed before it: {sorted(layouts)})")
    _, option, delta = best
    load.add(delta)
    layouts[name] = (option, delta)
  return _improve(layouts, load, stats, configs, num_replicas, budget, cost,
                  order, replicas_per_worker)


# A move or a layout must beat the estimate by this much to be taken: the
# estimate is rough, and near ties go to the simpler, better balanced
# layout.
MARGIN = 0.01


def _improve(layouts, load, stats, configs, n, budget, cost, order, per_worker=None,
             sweeps=3):
  """The greedy layouts after moves of one table at a time to another
  layout while the estimate drops by more than MARGIN (a greedy choice
  early on cannot see the tables after it); or a uniform layout (every
  table row-wise, table-wise balanced, or replicated) that fits and is
  estimated within MARGIN of them."""
  for _ in range(sweeps):
    moved = False
    for name in order:
      _, delta = layouts[name]
      load.subtract(delta)
      trial = load.copy()
      trial.add(delta)
      best, best_seconds = None, trial.seconds(cost) * (1 - MARGIN)
      for option in _candidates(stats[name], configs[name], n, load, cost, per_worker):
        option_delta = layout_load(stats[name], option, n, per_worker)
        if (load.memory + option_delta.memory).max() > budget:
          continue
        trial = load.copy()
        trial.add(option_delta)
        seconds = trial.seconds(cost)
        if seconds < best_seconds:
          best, best_seconds = (option, option_delta), seconds
      if best is not None:
        layouts[name] = best
        moved = True
      load.add(layouts[name][1])
    if not moved:
      break
  uniform = []
  kinds = ["row_wise", "table_wise", "replicated"]
  if per_worker is not None and 1 < per_worker < n:
    kinds.append("table_row_wise")
  for kind in kinds:
    other, other_load = _uniform(stats, configs, n, kind, cost, order, per_worker)
    if other is not None and other_load.memory.max() <= budget:
      uniform.append((other_load.seconds(cost), other, other_load))
  if uniform:
    seconds, other, other_load = min(uniform, key=lambda u: u[0])
    if seconds <= load.seconds(cost) * (1 + MARGIN):
      return other, other_load
  return layouts, load


def _choose_exchanges(layouts, load, stats, features_of, n, cost, per_worker=None,
                      choose=True):
  """Writes, per exchange group (`cost.group_key`: a width's sharded
  tables, as the lookup stacks them) with row-wise tables, the exchange
  its row-wise tables take (`TableLayout.exchange`), priced as such, so
  that the lookup builds what was estimated. Partial sums only where
  every table of the group is row-wise and may take them and the group's
  rows leave room for the sample in the ids (`routing.sample_key_bits`);
  then, with `choose` and every table's ids per sample measured or
  declared, the one estimated faster, else the lookup's own rule for the
  group's features (`exchange_kind.features_pool_partials`). One replica
  exchanges nothing: nothing written."""
  if n == 1:
    return layouts, load
  members = {}
  for name, (_, delta) in layouts.items():
    for key in list(delta.sharded_groups) + list(delta.pooled_groups):
      members.setdefault(key, []).append(name)
  for names in members.values():
    row_wise = [t for t in names if layouts[t][0].kind == "row_wise"]
    if not row_wise:
      continue
    rows_here = sum(math.ceil(stats[t].rows / n) for t in names)
    if not (len(row_wise) == len(names) and
            all(stats[t].may_pool_partials for t in names) and
            routing.sample_key_bits(rows_here, n) is not None):
      options = ["rows"]
    elif choose and all(stats[t].ids_known for t in names):
      options = ["rows", "partial sums"]
    else:
      features = [f for t in names for f in features_of[t]]
      options = ["partial sums" if exchange_kind.features_pool_partials(features, n)
                 else "rows"]
    best = None
    for option in options:
      trial, chosen = load.copy(), {}
      for t in row_wise:
        layout = dataclasses.replace(layouts[t][0], exchange=option)
        chosen[t] = (layout, layout_load(stats[t], layout, n, per_worker))
        trial.subtract(layouts[t][1])
        trial.add(chosen[t][1])
      seconds = trial.seconds(cost)
      if best is None or seconds < best[0] * (1 - 1e-9):
        best = (seconds, chosen, trial)
    _, chosen, load = best
    layouts.update(chosen)
  return layouts, load


def _uniform(stats, configs, n, kind, cost, order, per_worker=None):
  """Every table of `kind` (table-wise: each on the least loaded replica
  so far, largest first; table-row-wise: each over the least loaded
  worker's replicas), or None where a table cannot take it."""
  load, layouts = _Load(n), {}
  for name in order:
    if kind in ("replicated", "table_row_wise") and stats[name].dynamic:
      return None, None
    if kind == "table_row_wise":
      # Each table over the replicas of the least loaded worker so far.
      worker = int(np.argmin(_worker_loads(load, cost, per_worker) +
                             1e-12 * np.arange(n // per_worker)))
      layout = TableLayout("table_row_wise", _worker_replicas(worker, per_worker))
    elif kind == "table_wise":
      owner = int(np.argmin(load.replica_seconds(cost) + 1e-12 * np.arange(n)))
      layout = TableLayout("table_wise", [owner])
    else:
      layout = TableLayout(kind, list(range(n)))
    delta = layout_load(stats[name], layout, n, per_worker)
    load.add(delta)
    layouts[name] = (layout, delta)
  return layouts, load


def _table_estimate(stats, load):
  return {
      "rows": stats.rows, "width": stats.width, "slots": stats.slots,
      "ids_per_sample": round(stats.ids_per_sample, 3),
      "unique_ids_per_replica": round(stats.unique_per_replica, 1),
      "measured": stats.measured,
      "bytes_per_replica": [int(b) for b in load.memory],
      "ids_exchanged_per_step": int(round(load.ids.sum())),
      # Sent plus received, summed over replicas, halved: bytes on the wire.
      "bytes_exchanged_per_step": int(round((load.forward.sum() +
                                             load.backward.sum()) / 2)),
      "cross_worker_bytes_per_step": int(round((load.forward_cross.sum() +
                                                load.backward_cross.sum()) / 2)),
  }


def _replica_estimate(load, cost):
  return {
      "bytes_held": [int(b) for b in load.memory],
      "bytes_exchanged": [int(round(b)) for b in load.forward + load.backward],
      "bytes_computed": [int(round(b)) for b in load.compute],
      "estimated_seconds": [float(s) for s in load.replica_seconds(cost)],
  }


def simple_plan(feature_configs, num_replicas, kind, sample_inputs=None,
                batch_size=None, cost_model=None, replicas_per_worker=None,
                exchange="auto"):
  """Every table row-wise, replicated, table-wise (each on the least
  loaded replica so far, largest first) or table-row-wise (each over the
  least loaded worker's replicas; needs `replicas_per_worker`), with the
  same estimates as `plan`: the baselines a plan is compared with.
  Row-wise tables exchange what the lookup's rule gives each exchange
  group under `exchange`, written in their layouts; no choice between
  the two."""
  _check_workers(num_replicas, replicas_per_worker)
  if kind == "table_row_wise" and replicas_per_worker is None:
    raise ValueError("a table_row_wise plan needs replicas_per_worker")
  cost = cost_model or CostModel()
  stats = table_stats(feature_configs, num_replicas, sample_inputs, batch_size, exchange)
  order = sorted(stats, key=lambda t: (-stats[t].rows * stats[t].row_bytes, t))
  layouts, load = _uniform(stats, None, num_replicas, kind, cost, order,
                           replicas_per_worker)
  features_of = {name: features
                 for name, (_, features) in _table_configs(feature_configs).items()}
  layouts, load = _choose_exchanges(layouts, load, stats, features_of, num_replicas, cost,
                                    replicas_per_worker, choose=False)
  tables = {}
  for name in sorted(layouts):
    layout, delta = layouts[name]
    layout.estimate = _table_estimate(stats[name], delta)
    tables[name] = layout
  return ShardingPlan(num_replicas=num_replicas, tables=tables,
                      replicas_per_worker=replicas_per_worker,
                      estimated_step_seconds=load.seconds(cost),
                      per_replica=_replica_estimate(load, cost))
