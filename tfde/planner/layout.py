"""What a sharding plan says: a layout per table (`TableLayout`), the
plan (`ShardingPlan`, serializable, with its report), and how a plan is
read from its config or JSON."""

import dataclasses
import json
import math
import numbers
from typing import Dict
from typing import List
from typing import Optional

import numpy as np

KINDS = ("row_wise", "table_wise", "column_wise", "replicated", "table_row_wise")
# What a row-wise width's tables exchange (`tfde.exchange_kind`).
EXCHANGES = ("partial sums", "rows")
ID_BYTES = 8
FLOAT_BYTES = 4


def _whole(value):
  """Whether `value` is an integer (not a bool; numpy ints count): an owner
  or a width of 1.7, hand-edited into a plan, must not become 1."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_memory_budget(value, name="memory_per_replica_bytes"):
  """`value` if it is None (unlimited) or a finite number of bytes > 0;
  NaN compares false with everything, so a NaN budget would be ignored."""
  if value is None:
    return None
  if (not isinstance(value, numbers.Real) or isinstance(value, bool) or
      not math.isfinite(value) or value <= 0):
    raise ValueError(f"{name} must be a finite number of bytes > 0 (or None: "
                     f"unlimited), got {value!r}")
  return value


@dataclasses.dataclass
class TableLayout:
  """Where one table lives.

  Attributes:
    kind: "row_wise" (rows by `id % N` on every replica), "table_wise"
      (whole on `owners[0]`), "column_wise" (slice k of width
      `column_widths[k]` whole on `owners[k]`), "replicated" (whole on
      every replica), or "table_row_wise" (row i on
      `owners[i % len(owners)]`: rows spread over one worker's replicas).
    owners: the replicas holding it: every replica for row_wise and
      replicated, one for table_wise, one per slice for column_wise, the
      replicas its rows are spread over for table_row_wise.
    column_widths: the slices' widths (column_wise only), summing to the
      table's width.
    exchange: (row_wise only) "partial sums" or "rows": what the tables
      of its width exchange between the replicas, as the planner chose
      from its estimate (`tfde.exchange_kind`); the lookup takes the
      partial sums only where every table of the width says so, and
      only under its `exchange="auto"`. None: the lookup's own rule.
    estimate: the planner's figures for the table (bytes per replica,
      ids and bytes exchanged per step, ...), for reports; not needed to
      apply the layout.
  """

  kind: str
  owners: List[int]
  column_widths: Optional[List[int]] = None
  estimate: Optional[Dict[str, object]] = None
  exchange: Optional[str] = None

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"TableLayout.kind must be one of {KINDS}, got {self.kind!r}")
    if (not isinstance(self.owners, (list, tuple)) or not self.owners or
        any(not _whole(o) or o < 0 for o in self.owners)):
      raise ValueError(f"TableLayout.owners must be a list of replicas (ints >= 0), "
                       f"got {self.owners!r}")
    self.owners = [int(o) for o in self.owners]
    if self.kind == "table_row_wise" and len(set(self.owners)) != len(self.owners):
      raise ValueError(f"a table_row_wise layout's owners must be distinct, got "
                       f"{self.owners}")
    if self.kind == "table_wise" and len(self.owners) != 1:
      raise ValueError(f"a table_wise layout has one owner, got {self.owners}")
    if self.kind == "column_wise":
      if self.column_widths is None or len(self.column_widths) != len(self.owners):
        raise ValueError("a column_wise layout needs one column width per owner, "
                         f"got {self.column_widths} for owners {self.owners}")
      if any(not _whole(w) or w < 1 for w in self.column_widths):
        raise ValueError(f"a column_wise layout's column widths must be ints >= 1, "
                         f"got {self.column_widths!r}")
      self.column_widths = [int(w) for w in self.column_widths]
    elif self.column_widths is not None:
      raise ValueError(f"column_widths apply to column_wise layouts only, not "
                       f"{self.kind!r}")
    if self.exchange is not None:
      if self.exchange not in EXCHANGES:
        raise ValueError(f"TableLayout.exchange must be one of {EXCHANGES} or None, "
                         f"got {self.exchange!r}")
      if self.kind != "row_wise":
        raise ValueError(f"an exchange is chosen for row_wise layouts only, not "
                         f"{self.kind!r}")

  def get_config(self):
    return dataclasses.asdict(self)

  @classmethod
  def from_config(cls, config):
    return cls(**config)


@dataclasses.dataclass
class ShardingPlan:
  """A layout per table for `num_replicas` replicas (see the module).

  Attributes:
    num_replicas: the replica count it was made for; applying it under
      another is an error.
    tables: table name -> `TableLayout`.
    memory_per_replica_bytes: the memory budget it was planned under
      (None: unlimited).
    replicas_per_worker: replicas per worker process: the cost model
      prices bytes between workers apart, and table-row-wise layouts are
      tried (None: unknown).
    estimated_step_seconds: the cost model's estimate of a step.
    per_replica: per replica estimates (bytes held, bytes exchanged, rows
      touched), lists indexed by replica, for reports.
  """

  num_replicas: int
  tables: Dict[str, TableLayout]
  memory_per_replica_bytes: Optional[int] = None
  replicas_per_worker: Optional[int] = None
  estimated_step_seconds: Optional[float] = None
  per_replica: Optional[Dict[str, List[float]]] = None

  def __post_init__(self):
    if not isinstance(self.num_replicas, int) or self.num_replicas < 1:
      raise ValueError(f"ShardingPlan.num_replicas must be an int >= 1, got "
                       f"{self.num_replicas!r}")
    if not isinstance(self.tables, dict):
      raise ValueError(f"ShardingPlan.tables must be a mapping of table name -> "
                       f"layout, got a {type(self.tables).__name__}")
    self.memory_per_replica_bytes = check_memory_budget(
        self.memory_per_replica_bytes, "ShardingPlan.memory_per_replica_bytes")
    tables = {}
    for name, layout in self.tables.items():
      if isinstance(layout, TableLayout):
        tables[name] = layout
        continue
      if not isinstance(layout, dict):
        raise ValueError(f"ShardingPlan: table {name!r}'s layout must be a mapping "
                         f"(kind, owners, ...), got {layout!r:.60}")
      try:
        tables[name] = TableLayout.from_config(layout)
      except (ValueError, TypeError) as e:
        raise ValueError(f"ShardingPlan: table {name!r}: {e}") from None
    self.tables = tables
    for name, layout in self.tables.items():
      bad = [o for o in layout.owners if o >= self.num_replicas]
      if bad:
        raise ValueError(f"ShardingPlan: table {name!r} names replicas {bad}, "
                         f"but the plan has {self.num_replicas}")

  def get_config(self):
    config = dataclasses.asdict(self)
    config["tables"] = {n: t.get_config() for n, t in self.tables.items()}
    return config

  @classmethod
  def from_config(cls, config):
    return cls(**config)

  def to_json(self):
    return json.dumps(self.get_config(), indent=1, sort_keys=True)

  @classmethod
  def from_json(cls, text):
    return cls.from_config(json.loads(text))

  def report(self, file=None):
    """Prints (to `file`, default stdout) and returns the plan as text:
    per table its kind, owners, bytes per replica (rows + slots), ids and
    bytes exchanged per step; per replica its totals and the balance (the
    largest over the mean)."""
    lines = [f"Sharding plan for {self.num_replicas} replicas"
             + (f" ({self.replicas_per_worker} per worker)"
                if self.replicas_per_worker else "")
             + (f", {_human(self.memory_per_replica_bytes)} per replica"
                if self.memory_per_replica_bytes else "")
             + (f"; estimated step {self.estimated_step_seconds * 1e3:.3f} ms"
                if self.estimated_step_seconds is not None else "")]
    header = (f"{'table':<20} {'kind':<14} {'rows x width':>16} {'owners':<16} "
              f"{'bytes/replica (max)':>20} {'ids/step':>10} {'bytes/step':>11}")
    lines += ["", header, "-" * len(header)]
    for name, layout in self.tables.items():
      e = layout.estimate or {}
      owners = ("all" if layout.kind in ("row_wise", "replicated")
                else ",".join(map(str, layout.owners)))
      if layout.column_widths:
        owners += " w" + "/".join(map(str, layout.column_widths))
      if layout.exchange:
        owners += " (sums)" if layout.exchange == "partial sums" else " (rows)"
      shape = f"{e.get('rows', '?')} x {e.get('width', '?')}"
      held = max(e.get("bytes_per_replica", [0]))
      lines.append(f"{name:<20} {layout.kind:<14} {shape:>16} {owners:<16} "
                   f"{_human(held):>20} {e.get('ids_exchanged_per_step', 0):>10} "
                   f"{_human(e.get('bytes_exchanged_per_step', 0)):>11}")
    kinds = {}
    for layout in self.tables.values():
      kinds[layout.kind] = kinds.get(layout.kind, 0) + 1
    lines += ["", "tables per kind: " + ", ".join(f"{k} {v}" for k, v in
                                                  sorted(kinds.items()))]
    if self.per_replica:
      p = self.per_replica
      lines += ["", f"{'replica':<8} {'bytes held':>12} {'bytes exchanged':>16} "
                    f"{'bytes computed':>15} {'est. ms':>8}"]
      for r in range(self.num_replicas):
        lines.append(f"{r:<8} {_human(p['bytes_held'][r]):>12} "
                     f"{_human(p['bytes_exchanged'][r]):>16} "
                     f"{_human(p['bytes_computed'][r]):>15} "
                     f"{p['estimated_seconds'][r] * 1e3:>8.3f}")
      lines.append("balance (max / mean): " + ", ".join(
          f"{k.replace('_', ' ')} {balance(p[k]):.2f}"
          for k in ("bytes_held", "bytes_exchanged", "estimated_seconds")))
    text = "\n".join(lines)
    print(text, file=file)
    return text

  def layout_of(self, table_config, num_replicas):
    """The layout of a table (None when the plan does not name it), checked
    against the table and the replica count it is applied under."""
    if num_replicas != self.num_replicas:
      raise ValueError(f"the sharding plan was made for {self.num_replicas} "
                       f"replicas, but the tables are built for {num_replicas}")
    layout = self.tables.get(table_config.name)
    if layout is None:
      return None
    if layout.kind == "column_wise" and sum(layout.column_widths) != \
        table_config.embedding_dim:
      raise ValueError(f"table {table_config.name!r}: the plan's column widths "
                       f"{layout.column_widths} do not sum to its embedding_dim "
                       f"{table_config.embedding_dim}")
    return layout


def balance(values):
  """max / mean of per replica figures (1.0: perfectly balanced)."""
  values = np.asarray(values, np.float64)
  mean = values.mean() if values.size else 0.0
  return float(values.max() / mean) if mean > 0 else 1.0


def _human(num_bytes):
  if num_bytes is None:
    return "-"
  value = float(num_bytes)
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if abs(value) < 1024 or unit == "TiB":
      return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
    value /= 1024
  return str(num_bytes)


def as_plan(plan):
  """A ShardingPlan from a plan, its config dict, its JSON, or None."""
  if plan is None or isinstance(plan, ShardingPlan):
    return plan
  if isinstance(plan, dict):
    return ShardingPlan.from_config(plan)
  if isinstance(plan, str):
    return ShardingPlan.from_json(plan)
  raise TypeError(f"plan must be a ShardingPlan, its config or JSON, got "
                  f"{type(plan).__name__}")
