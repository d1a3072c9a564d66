"""The planner's cost model: per table statistics measured on sample ids
(`TableStats`, `table_stats`), and the per replica bytes, rows and time a
layout costs (`CostModel`, `layout_load`)."""

import collections
import dataclasses
import math
from typing import Optional

import numpy as np

from tfde import exchange_kind
from tfde import optimizer_configs
from tfde import routing
from tfde.planner.layout import FLOAT_BYTES
from tfde.planner.layout import ID_BYTES


@dataclasses.dataclass
class CostModel:
  """The constants of the step-time estimate (see the module).

  Attributes:
    bandwidth_bytes_per_s: bytes a replica sends plus receives per second
      in an exchange (with replicas of its own worker, when
      `cross_worker_bandwidth_bytes_per_s` is given).
    cross_worker_bandwidth_bytes_per_s: the same with replicas of other
      workers (NVLink inside a host, the network between hosts); None: every
      link alike. Used when the plan knows `replicas_per_worker`.
    exchange_latency_s: the fixed cost of one collective round (a count
      exchange, an all-to-all).
    memory_bytes_per_s: bytes of rows and slots a replica reads or writes
      per second when it gathers and updates rows.
    forward_weight: how many times a forward exchange counts (the dense
      model waits for its rows; a backward exchange overlaps other work).
    min_column_width: column slices are at least this wide.
    table_overhead_s: the fixed cost of each table (or column slice) a
      replica holds, per step: its gather, optimizer apply and the ops
      around them (kernel launches on a GPU, op dispatch on a CPU).
    parallel_replicas: how many replicas compute at once (None: all, each
      on its own device); logical CPU devices sharing a host's cores
      compute as many at once as there are cores, so the step's compute
      is then at least the replicas' total over this number.
  """

  bandwidth_bytes_per_s: float = 10e9
  cross_worker_bandwidth_bytes_per_s: Optional[float] = None
  exchange_latency_s: float = 20e-6
  memory_bytes_per_s: float = 20e9
  forward_weight: float = 2.0
  min_column_width: int = 4
  table_overhead_s: float = 10e-6
  parallel_replicas: Optional[int] = None

  @classmethod
  def logical_cpus(cls, cores):
    """Constants for replicas that are logical CPU devices of one process
    sharing `cores` cores (this project's test machines), measured with
    bench/planner_bench.py: exchanges are in-process copies, and each
    table a replica holds costs about 0.2 ms of op dispatch per step."""
    return cls(bandwidth_bytes_per_s=5e9, exchange_latency_s=100e-6,
               memory_bytes_per_s=5e9, table_overhead_s=200e-6,
               parallel_replicas=cores)

  def __post_init__(self):
    for field in ("bandwidth_bytes_per_s", "memory_bytes_per_s", "forward_weight"):
      if not getattr(self, field) > 0:
        raise ValueError(f"CostModel.{field} must be positive, got {getattr(self, field)}")
    if self.cross_worker_bandwidth_bytes_per_s is not None and not (
        self.cross_worker_bandwidth_bytes_per_s > 0):
      raise ValueError(f"CostModel.cross_worker_bandwidth_bytes_per_s must be positive "
                       f"or None, got {self.cross_worker_bandwidth_bytes_per_s}")
    if self.exchange_latency_s < 0:
      raise ValueError(f"CostModel.exchange_latency_s must be >= 0, got "
                       f"{self.exchange_latency_s}")
    if self.table_overhead_s < 0:
      raise ValueError(f"CostModel.table_overhead_s must be >= 0, got "
                       f"{self.table_overhead_s}")
    if self.parallel_replicas is not None and (
        not isinstance(self.parallel_replicas, int) or self.parallel_replicas < 1):
      raise ValueError(f"CostModel.parallel_replicas must be None or an int >= 1, "
                       f"got {self.parallel_replicas!r}")
    if not isinstance(self.min_column_width, int) or self.min_column_width < 1:
      raise ValueError(f"CostModel.min_column_width must be an int >= 1, got "
                       f"{self.min_column_width!r}")

  def get_config(self):
    return dataclasses.asdict(self)

  @classmethod
  def from_config(cls, config):
    return cls(**config)


# Collective rounds of one group per step: a sharded group's forward plans
# the exchange (counts), sends ids and gets rows back, and its backward
# sends gradients; a replicated group's backward all-gathers ids and
# gradients, each with its counts.
SHARDED_ROUNDS = (3, 1)
REPLICATED_ROUNDS = (0, 4)
# A group exchanging partial sums: the forward gathers every replica's
# sample count, plans the exchange, sends ids and their coefficients, and
# gets the partial sums back; the backward sends the output gradients.
POOLED_ROUNDS = (5, 1)


@dataclasses.dataclass
class TableStats:
  """What the planner knows of one table's traffic.

  Attributes:
    name, rows, width: the table (rows: its vocabulary size, or for a
      dynamic table the rows it is expected to hold).
    slots: optimizer slot values per row element (0 SGD, 1 Adagrad, 2 Adam,
      FTRL; 1 / width for row-wise Adagrad's one value per row).
    dynamic: a dynamic table.
    ids_per_sample: ids per sample over its features.
    unique_per_replica: unique ids in one replica's batch (U).
    unique_global: unique ids in the global batch.
    measured: from sample inputs (else assumed: 1 id per sample, unique).
    element_bytes: bytes of one row element (2 for reduced precision).
    samples_per_replica: samples in one replica's batch.
    num_features: the features looking the table up (each pooled one
      makes its own output, and its own partial sums).
    may_pool_partials: whether the table, row-wise, may exchange each
      owner's partial sums rather than rows (`tfde.exchange_kind`, judged
      from its own features: all pooled, no max_norm, float32 and static,
      under the lookup's exchange="auto").
    pools_partials: whether it would without a plan's word: where its
      features declare their ids per sample, 2N or more on average.
    ids_known: its ids per sample were measured, or every feature declares
      them (the most a sample, all taken as distinct: an upper bound):
      what the planner needs to choose its exchange.
    dtype: its rows' dtype (reduced-precision tables group apart).
  """

  name: str
  rows: int
  width: int
  slots: float
  dynamic: bool
  ids_per_sample: float
  unique_per_replica: float
  unique_global: float
  measured: bool
  element_bytes: int = FLOAT_BYTES
  samples_per_replica: float = 0.0
  pools_partials: bool = False
  num_features: int = 1
  may_pool_partials: bool = False
  ids_known: bool = False
  dtype: str = "float32"

  @property
  def row_bytes(self):
    """A row and its slots (slots are float32 whatever the rows' type)."""
    return self.width * (self.element_bytes + FLOAT_BYTES * self.slots)


def _table_configs(feature_configs):
  if isinstance(feature_configs, dict):
    feature_configs = list(feature_configs.values())
  tables = {}
  for f in feature_configs:
    tables.setdefault(f.table.name, (f.table, []))[1].append(f)
  return tables


def _to_numpy_ids(feature, value):
  from tfde import inputs as inputs_lib  # pylint: disable=g-import-not-at-top
  ids, splits, _ = inputs_lib.flatten_feature(feature.name, feature.table.name, value)
  return np.asarray(ids), np.asarray(splits)


def _may_pool_partials(config, features, num_replicas, exchange):
  """Whether a row-wise `config` (its `features`) may exchange partial
  sums: `tfde.exchange_kind.pools_partials` for a group of this table
  alone, its rule for declared ids aside."""
  return (exchange == "auto" and num_replicas > 1 and not config.is_dynamic and
          getattr(config, "dtype", "float32") == "float32" and
          routing.sample_key_bits(math.ceil(config.vocabulary_size / num_replicas),
                                  num_replicas) is not None and
          exchange_kind.features_may_pool(features))


def table_stats(feature_configs, num_replicas, sample_inputs=None, batch_size=None,
                exchange="auto"):
  """name -> TableStats, measured on `sample_inputs` (feature name -> one
  global batch of ids, any input kind) when given. `batch_size`: the
  global batch the plan is for (default the sample's, or each feature's
  `input_shape[0]` times the replicas). `exchange`: the lookup's (a
  row-wise table of pooled features exchanges partial sums under
  "auto")."""
  if exchange not in ("auto", "rows"):
    raise ValueError(f'exchange must be "auto" or "rows", got {exchange!r}')
  stats = {}
  for name, (config, features) in _table_configs(feature_configs).items():
    kind = optimizer_configs.KINDS[config.optimizer_config()["kind"]]
    slots = len(kind.slot_names)
    if kind.slot_width is not None:
      slots *= kind.slot_width / config.embedding_dim
    measured = sample_inputs is not None and all(f.name in sample_inputs
                                                 for f in features)
    if measured:
      per_sample, per_replica, every, batch = 0.0, [], set(), None
      parts = [[] for _ in range(num_replicas)]
      for f in features:
        ids, splits = _to_numpy_ids(f, sample_inputs[f.name])
        b = len(splits) - 1
        batch = b if batch is None else batch
        per_sample += len(ids) / max(b, 1)
        for r in range(num_replicas):
          lo, hi = splits[r * b // num_replicas], splits[(r + 1) * b // num_replicas]
          parts[r].append(ids[lo:hi])
        every.update(ids.tolist())
      per_replica = [len(np.unique(np.concatenate(p))) if p else 0 for p in parts]
      unique_replica, unique_global = float(np.mean(per_replica)), float(len(every))
      scale = 1.0 if batch_size is None else batch_size / max(batch, 1)
      unique_replica *= scale
      unique_global *= scale
      samples = (batch if batch_size is None else batch_size) / num_replicas
    else:
      per_sample = float(sum(f.declared_ids_per_sample() or 1 for f in features))
      per_replica_batch = (batch_size / num_replicas if batch_size else
                           next((f.input_shape[0] for f in features
                                 if f.input_shape and f.input_shape[0]), 1024))
      unique_replica = per_sample * per_replica_batch
      unique_global = unique_replica * num_replicas
      samples = per_replica_batch
    may_pool = _may_pool_partials(config, features, num_replicas, exchange)
    if config.is_dynamic:
      rows = (config.dynamic.max_rows_per_shard or 0) * num_replicas or int(
          unique_global)
    else:
      rows = config.vocabulary_size
      unique_replica = min(unique_replica, rows)
      unique_global = min(unique_global, rows)
    stats[name] = TableStats(name, int(rows), config.embedding_dim, slots,
                             config.is_dynamic, per_sample, unique_replica,
                             unique_global, measured,
                             2 if getattr(config, "dtype", "float32") != "float32"
                             else FLOAT_BYTES, float(samples),
                             may_pool and exchange_kind.features_pool_partials(
                                 features, num_replicas),
                             len(features), may_pool,
                             measured or all(f.declared_ids_per_sample() is not None
                                             for f in features),
                             getattr(config, "dtype", "float32"))
  return stats


def exchanging_rows(stats):
  """`stats` (name -> TableStats) as `table_stats` gives them for a lookup
  whose exchange is "rows": no table may exchange partial sums.

  >>> from tfde.planner.cost import TableStats
  >>> t = TableStats("t", 100, 8, 0.0, False, 2.0, 10.0, 20.0, False,
  ...                pools_partials=True, may_pool_partials=True)
  >>> rows = exchanging_rows({"t": t})["t"]
  >>> print(rows.may_pool_partials, rows.pools_partials, rows.unique_global)
  False False 20.0
  """
  return {name: dataclasses.replace(t, may_pool_partials=False, pools_partials=False)
          for name, t in stats.items()}


_LOAD_ARRAYS = ("forward", "backward", "forward_cross", "backward_cross", "compute",
                "memory", "ids", "tables")


class _Load:
  """Per replica figures of a (partial) plan, and the groups it makes."""

  def __init__(self, n):
    self.n = n
    self.forward = np.zeros(n)   # bytes sent + received in forward exchanges
    self.backward = np.zeros(n)  # in backward exchanges
    self.forward_cross = np.zeros(n)   # of those, with other workers' replicas
    self.backward_cross = np.zeros(n)
    self.compute = np.zeros(n)   # bytes of rows and slots read and written
    self.memory = np.zeros(n)    # bytes of rows and slots held
    self.ids = np.zeros(n)       # ids sent to other replicas per step
    self.tables = np.zeros(n)    # tables (or column slices) held
    # Group key -> members: a group's rounds are paid once however many
    # tables it holds.
    self.sharded_groups = collections.Counter()
    self.pooled_groups = collections.Counter()
    self.replicated_groups = collections.Counter()

  def copy(self):
    other = _Load(self.n)
    for k in _LOAD_ARRAYS:
      setattr(other, k, getattr(self, k).copy())
    other.sharded_groups = collections.Counter(self.sharded_groups)
    other.pooled_groups = collections.Counter(self.pooled_groups)
    other.replicated_groups = collections.Counter(self.replicated_groups)
    return other

  def add(self, other):
    for k in _LOAD_ARRAYS:
      setattr(self, k, getattr(self, k) + getattr(other, k))
    self.sharded_groups += other.sharded_groups
    self.pooled_groups += other.pooled_groups
    self.replicated_groups += other.replicated_groups

  def subtract(self, other):
    for k in _LOAD_ARRAYS:
      setattr(self, k, getattr(self, k) - getattr(other, k))
    self.sharded_groups -= other.sharded_groups
    self.pooled_groups -= other.pooled_groups
    self.replicated_groups -= other.replicated_groups

  def seconds(self, cost):
    sharded, replicated = len(self.sharded_groups), len(self.replicated_groups)
    pooled = len(self.pooled_groups)
    if self.n == 1:
      sharded = replicated = pooled = 0  # nothing is exchanged
    forward = (cost.exchange_latency_s * (sharded * SHARDED_ROUNDS[0] +
                                          pooled * POOLED_ROUNDS[0]) +
               self._wire_seconds(self.forward, self.forward_cross, cost).max())
    backward = (cost.exchange_latency_s * (sharded * SHARDED_ROUNDS[1] +
                                           pooled * POOLED_ROUNDS[1] +
                                           replicated * REPLICATED_ROUNDS[1]) +
                self._wire_seconds(self.backward, self.backward_cross, cost).max())
    compute = self.compute_seconds(cost)
    at_once = cost.parallel_replicas or self.n
    return (cost.forward_weight * forward + backward +
            max(compute.max(), compute.sum() / min(at_once, self.n)))

  @staticmethod
  def _wire_seconds(total, cross, cost):
    """Per replica: its bytes with its own worker's replicas at
    `bandwidth_bytes_per_s`, those with other workers' at the cross-worker
    bandwidth."""
    across = cost.cross_worker_bandwidth_bytes_per_s or cost.bandwidth_bytes_per_s
    return (total - cross) / cost.bandwidth_bytes_per_s + cross / across

  def compute_seconds(self, cost):
    return self.compute / cost.memory_bytes_per_s + self.tables * cost.table_overhead_s

  def replica_seconds(self, cost):
    """Each replica's own share (exchange bytes and compute), for balance."""
    return (cost.forward_weight * self._wire_seconds(self.forward, self.forward_cross, cost) +
            self._wire_seconds(self.backward, self.backward_cross, cost) +
            self.compute_seconds(cost))


def group_key(stats, width=None):
  """The exchange group a table (or a column slice of `width`) joins, as
  the lookup stacks tables: by width, reduced-precision rows apart, each
  dynamic table alone."""
  if stats.dynamic:
    return ("dynamic", stats.name)
  width = stats.width if width is None else width
  return width if stats.dtype == "float32" else (width, stats.dtype)


def _worker(replica, per_worker):
  return 0 if per_worker is None else replica // per_worker


def _cross_share(n, per_worker):
  """Of a replica's n - 1 peers, the share on other workers (replicas
  0..w-1 make worker 0, and so on); 0 when the workers are unknown."""
  return 0.0 if per_worker is None or n == 1 else (n - per_worker) / (n - 1)


def _slice_load(stats, n, owner, width, key, per_worker=None):
  """The load of `width` columns of a table held whole by `owner`."""
  load = _Load(n)
  elsewhere = 0 if per_worker is None else n - per_worker
  u, ug = stats.unique_per_replica, stats.unique_global
  row = width * FLOAT_BYTES
  others = n - 1
  for r in range(n):
    if r == owner:
      load.forward[r] += others * u * (ID_BYTES + row)
      load.backward[r] += others * u * row
      load.forward_cross[r] += elsewhere * u * (ID_BYTES + row)
      load.backward_cross[r] += elsewhere * u * row
      load.compute[r] += n * u * row + ug * row * (1 + stats.slots) * 2
      load.memory[r] += stats.rows * stats.row_bytes * width // stats.width
      load.tables[r] += 1
    else:
      load.forward[r] += u * (ID_BYTES + row)
      load.backward[r] += u * row
      load.ids[r] += u
      if _worker(r, per_worker) != _worker(owner, per_worker):
        load.forward_cross[r] += u * (ID_BYTES + row)
        load.backward_cross[r] += u * row
  load.sharded_groups[key] += 1
  return load


def _row_split_load(stats, n, owners, per_worker=None):
  """The load of a table whose rows are spread over `owners` (row i on
  owners[i % k]): each replica sends each owner but itself 1/k of its
  unique ids and gets their rows back."""
  load = _Load(n)
  k = len(owners)
  u, ug = stats.unique_per_replica, stats.unique_global
  row = stats.width * FLOAT_BYTES
  share = u / k
  for r in range(n):
    for o in owners:
      if o == r:
        continue
      across = _worker(r, per_worker) != _worker(o, per_worker)
      for end in (r, o):
        load.forward[end] += share * (ID_BYTES + row)
        load.backward[end] += share * row
        if across:
          load.forward_cross[end] += share * (ID_BYTES + row)
          load.backward_cross[end] += share * row
      load.ids[r] += share
  for o in owners:
    # Serves 1/k of every replica's ids, updates 1/k of the step's rows.
    load.compute[o] += n * share * row + ug / k * row * (1 + stats.slots) * 2
    load.memory[o] += math.ceil(stats.rows / k) * stats.row_bytes
    load.tables[o] += 1
  load.sharded_groups[group_key(stats)] += 1
  return load


def _pooled_row_wise_load(stats, n, cross):
  """Row-wise, exchanging partial sums: each replica sends (N-1)/N of its
  I ids (8 bytes and a 4-byte coefficient each, counted even where none
  is sent: an unweighted sum in one process) to their owners, and as
  an owner sums its rows of every sample of the global batch; each owner
  sends each other replica its S samples' partial sums (4 D bytes a
  sample and feature), and in the backward each replica sends every
  other its S samples' output gradients. An owner writes N S partial
  sums (per feature), its
  replica adds N of them, and it updates the global batch's unique rows
  it holds. (Reading each id's row and gradient where it is combined,
  which every layout does, is not counted, as for the others.)"""
  load = _Load(n)
  samples = stats.samples_per_replica
  ids = stats.ids_per_sample * samples
  # Partial sums and output gradients travel per feature: one output each.
  outputs = samples * stats.num_features
  row = stats.width * FLOAT_BYTES
  share = (n - 1) / n
  load.forward += 2 * share * ids * (ID_BYTES + FLOAT_BYTES) + 2 * (n - 1) * outputs * row
  load.backward += 2 * (n - 1) * outputs * row
  load.compute += 2 * n * outputs * row + (
      stats.unique_global / n * row * (1 + stats.slots) * 2)
  load.ids += share * ids
  load.pooled_groups[group_key(stats)] += 1
  return _rows_spread_evenly(load, stats, n, cross)


def _rows_spread_evenly(load, stats, n, cross):
  """What both row-wise exchanges add alike: every replica holds 1/N of
  the rows and their slots, and `cross` of its bytes go to other workers."""
  load.memory += math.ceil(stats.rows / n) * stats.row_bytes
  load.forward_cross += cross * load.forward
  load.backward_cross += cross * load.backward
  load.tables += 1
  return load


def layout_load(stats, layout, n, per_worker=None):
  """The per replica load of one table under `layout`, on `n` replicas in
  workers of `per_worker` (None: unknown, every link alike)."""
  u, ug = stats.unique_per_replica, stats.unique_global
  row = stats.width * FLOAT_BYTES
  cross = _cross_share(n, per_worker)
  if layout.kind == "row_wise" and n > 1 and (
      layout.exchange == "partial sums" if layout.exchange else stats.pools_partials):
    return _pooled_row_wise_load(stats, n, cross)
  if layout.kind == "row_wise":
    load = _Load(n)
    share = (n - 1) / n
    load.forward += 2 * share * u * (ID_BYTES + row)
    load.backward += 2 * share * u * row
    load.compute += u * row + ug / n * row * (1 + stats.slots) * 2
    load.ids += share * u
    load.sharded_groups[group_key(stats)] += 1
    return _rows_spread_evenly(load, stats, n, cross)
  if layout.kind == "replicated":
    load = _Load(n)
    load.backward += 2 * (n - 1) * u * (ID_BYTES + row)
    load.compute += u * row + ug * row * (1 + stats.slots) * 2
    load.memory += stats.rows * stats.row_bytes
    load.ids += (n - 1) * u
    load.backward_cross += cross * load.backward
    load.tables += 1
    load.replicated_groups[group_key(stats)] += 1
    return load
  if layout.kind == "table_row_wise":
    return _row_split_load(stats, n, layout.owners, per_worker)
  widths = layout.column_widths or [stats.width]
  load = _Load(n)
  for owner, width in zip(layout.owners, widths):
    key = group_key(stats, width)
    load.add(_slice_load(stats, n, owner, width, key, per_worker))
  return load
