"""Fuzz cases of the ops on a group's tables: split_rows_by_table,
gather_from_tables and combine_from_tables.
"""

import numpy as np

from tests.fuzz.fuzz_oracle import I64_MAX
from tests.fuzz.fuzz_oracle import I64_MIN
from tests.fuzz.fuzz_oracle import Op
from tests.fuzz.fuzz_oracle import _int_vector
from tests.fuzz.fuzz_oracle import _pick
from tests.fuzz.fuzz_oracle import _refuse_if
from tests.fuzz.fuzz_oracle import _set
from tests.fuzz.fuzz_oracle import _t
from tests.fuzz.fuzz_oracle import describe
from tests.fuzz.fuzz_ragged import RAGGED_MUTATIONS
from tests.fuzz.fuzz_ragged import _check_ragged
from tests.fuzz.fuzz_ragged import _ragged_valid
from tests.support import oracles

# ---- a group's tables: split_rows_by_table, gather_from_tables,
# combine_from_tables


def _bases_mutations():
  def set_bases(make, note):
    def mutate(rng, inp):
      bases = make(rng, list(inp["bases"]))
      if bases is None:
        return False
      return _set(inp, "bases", bases, f"= {bases} {note}")
    return mutate

  def swap(rng, b):
    if len(b) < 3:
      return None
    b[1], b[2] = b[2], b[1]
    return b

  def repeat(rng, b):
    if len(b) < 2:
      return None
    b[1] = b[0]
    return b

  return {
      "bases_non_monotone": ("order", set_bases(swap, "(not increasing)")),
      "bases_repeated": ("order", set_bases(repeat, "(a repeated base)")),
      "bases_not_from_0": ("value", set_bases(lambda rng, b: [x + 1 for x in b], "")),
      "bases_negative": ("negative", set_bases(lambda rng, b: [-4] + b[1:], "")),
      "bases_empty": ("empty", set_bases(lambda rng, b: [], "")),
  }


class SplitRows(Op):
  name = "split_rows_by_table"

  def valid(self, rng):
    sizes = rng.integers(1, 20, size=int(rng.integers(1, 5)))
    bases = [0] + np.cumsum(sizes)[:-1].tolist()
    rows = rng.integers(0, int(sizes.sum()) + 5, size=int(rng.integers(0, 25)))
    return dict(rows=rows.astype(rng.choice([np.int32, np.int64])), bases=bases)

  def _row(make):
    def mutate(rng, inp):
      rows = inp["rows"].astype(np.int64)
      if rows.size == 0:
        return False
      i = _pick(rng, rows)
      rows[i] = make(rng)
      return _set(inp, "rows", rows, f"[{i}] = {rows[i]}")
    return mutate

  MUTATIONS = dict(
      _bases_mutations(),
      bases_int64_max=("extreme", lambda rng, inp: _set(
          inp, "bases", list(inp["bases"]) + [I64_MAX], "with a last base of 2**63-1")),
      bases_beyond_int32=("extreme", lambda rng, inp: _set(
          inp, "bases", list(inp["bases"]) + [2**40], "with a last base of 2**40")),
      rows_negative=("negative", _row(lambda rng: -int(rng.integers(1, 9)))),
      rows_int64_max=("extreme", _row(lambda rng: I64_MAX)),
      rows_int64_min=("extreme", _row(lambda rng: I64_MIN)),
      rows_float=("dtype", lambda rng, inp: _set(inp, "rows", inp["rows"] + 0.5,
                                                 "float64 + 0.5")),
      rows_rank2=("rank", lambda rng, inp: inp["rows"].size > 0 and _set(
          inp, "rows", inp["rows"].reshape(-1, 1), "with shape [n, 1]")),
      rows_empty=("empty", lambda rng, inp: _set(inp, "rows", inp["rows"][:0], "empty")),
  )

  def oracle(self, inp):
    rows, bases = inp["rows"], inp["bases"]
    _int_vector(rows, "rows")
    _check_bases(bases)
    _refuse_if(bool((rows < 0).any()), "negative row")
    table_of = np.searchsorted(np.array(bases, object), rows.astype(object),
                               side="right") - 1
    out = []
    for t, base in enumerate(bases):
      where = np.flatnonzero(table_of == t)
      out += [np.array([int(r) - base for r in rows[where]], np.int64), where]
    return dict(result=out)

  def call(self, inp, ctx, tf, tfde):
    parts = tfde.ops.split_rows_by_table(_t(tf, inp["rows"]), inp["bases"])
    return [x.numpy() for part in parts for x in part]


def _check_bases(bases):
  _refuse_if(len(bases) < 1, "no bases")
  _refuse_if(not all(isinstance(b, (int, np.integer)) for b in bases), "a base is not an int")
  _refuse_if(any(not I64_MIN <= b <= I64_MAX for b in bases), "a base is not an int64")
  _refuse_if(bases[0] != 0, "bases[0] != 0")
  _refuse_if(any(b <= a for a, b in zip(bases, bases[1:])), "bases do not increase")


def _tables_valid(rng):
  sizes = rng.integers(1, 15, size=int(rng.integers(1, 4)))
  dim = int(rng.integers(1, 6))
  tables = [rng.normal(size=(int(s), dim)).astype(np.float32) for s in sizes]
  bases = [0] + np.cumsum(sizes)[:-1].tolist()
  return tables, bases


def _tables_mutations():
  def table(make, note):
    def mutate(rng, inp):
      t = int(rng.integers(0, len(inp["tables"])))
      new = make(rng, inp["tables"][t])
      if new is None:
        return False
      inp["tables"] = list(inp["tables"])
      inp["tables"][t] = new
      inp["_note"] = f"tables[{t}] {note}: {describe(new, 3)}"
      return True
    return mutate

  def too_small(rng, inp):
    if len(inp["tables"]) < 2:
      return False
    inp["tables"] = list(inp["tables"])
    inp["tables"][0] = inp["tables"][0][:-1]
    inp["_note"] = "tables[0] one row short of its range (a gap in the row space)"
    return True

  def count(delta):
    def mutate(rng, inp):
      bases = list(inp["bases"])
      if delta < 0:
        if len(bases) < 2:
          return False
        bases = bases[:-1]
      else:
        bases = bases + [bases[-1] + inp["tables"][-1].shape[0]]
      return _set(inp, "bases", bases, f"with {len(bases)} bases for "
                  f"{len(inp['tables'])} tables")
    return mutate

  def nonfinite(rng, t):
    t = t.copy()
    if t.size == 0:
      return None
    t.ravel()[_pick(rng, t)] = rng.choice([np.nan, np.inf, -np.inf])
    return t

  return {
      "table_int32": ("dtype", table(lambda rng, t: t.astype(np.int32), "as int32")),
      "table_float64": ("dtype", table(lambda rng, t: t.astype(np.float64), "as float64")),
      "table_width": ("shape", table(lambda rng, t: np.ones([t.shape[0], t.shape[1] + 1],
                                                             np.float32), "one column wider")),
      "table_rank1": ("rank", table(lambda rng, t: t.ravel(), "flattened")),
      "table_nonfinite": ("nonfinite", table(nonfinite, "with a non-finite value")),
      "table_too_small": ("shape", too_small),
      "one_base_fewer": ("shape", count(-1)),
      "one_base_more": ("shape", count(+1)),
  }


def _check_tables(tables, bases):
  _check_bases(bases)
  _refuse_if(len(bases) != len(tables), "bases and tables differ in count")
  for t in tables:
    _refuse_if(t.dtype != np.float32 or t.ndim != 2, "a table is not a float32 matrix")
    _refuse_if(t.shape[1] != tables[0].shape[1], "tables differ in width")
  for t in range(len(tables) - 1):
    _refuse_if(tables[t].shape[0] < bases[t + 1] - bases[t], "a table is shorter than its range")


def _gather(tables, bases, rows):
  _int_vector(rows, "rows")
  _check_tables(tables, bases)
  out = []
  for r in rows.tolist():
    t = int(np.searchsorted(np.array(bases, object), r, side="right")) - 1
    _refuse_if(r < 0 or t < 0 or r - bases[t] >= tables[t].shape[0],
               f"row {r} outside every table")
    out.append(tables[t][r - bases[t]])
  return np.array(out, np.float64).reshape(len(out), tables[0].shape[1])


class _TablesOp(Op):
  def prepare(self, inp, tf, tfde):
    return [tf.Variable(t) for t in inp["tables"]]

  def state(self, ctx):
    return [v.numpy() for v in ctx]

  def _row_mutation(make):
    def mutate(rng, inp):
      rows = inp["fused_rows"].astype(np.int64)
      if rows.size == 0:
        return False
      i = _pick(rng, rows)
      if inp.get("inverse") is not None and inp["inverse"].size and rng.random() < 0.5:
        i = int(inp["inverse"][_pick(rng, inp["inverse"])])  # a row that is read
      rows[i] = make(rng, inp)
      return _set(inp, "fused_rows", rows, f"[{i}] = {rows[i]}")
    return mutate

  ROW_MUTATIONS = {
      "rows_out_of_range": ("range", _row_mutation(
          lambda rng, inp: inp["bases"][-1] + inp["tables"][-1].shape[0])),
      "rows_negative": ("negative", _row_mutation(lambda rng, inp: -1)),
      "rows_int64_max": ("extreme", _row_mutation(lambda rng, inp: I64_MAX)),
      "rows_int64_min": ("extreme", _row_mutation(lambda rng, inp: I64_MIN)),
      "rows_float": ("dtype", lambda rng, inp: _set(inp, "fused_rows",
                                                    inp["fused_rows"] + 0.5, "float64 + 0.5")),
      "rows_rank2": ("rank", lambda rng, inp: inp["fused_rows"].size > 0 and _set(
          inp, "fused_rows", inp["fused_rows"].reshape(-1, 1), "with shape [n, 1]")),
  }


class GatherFromTables(_TablesOp):
  name = "gather_from_tables"

  def valid(self, rng):
    tables, bases = _tables_valid(rng)
    total = bases[-1] + tables[-1].shape[0]
    rows = rng.integers(0, total, size=int(rng.integers(0, 20)))
    return dict(tables=tables, bases=bases,
                fused_rows=rows.astype(rng.choice([np.int32, np.int64])))

  MUTATIONS = dict(_bases_mutations(), **_tables_mutations(), **_TablesOp.ROW_MUTATIONS,
                   rows_empty=("empty", lambda rng, inp: _set(
                       inp, "fused_rows", inp["fused_rows"][:0], "empty")))

  def oracle(self, inp):
    return dict(result=_gather(inp["tables"], inp["bases"], inp["fused_rows"]))

  def call(self, inp, ctx, tf, tfde):
    return tfde.ops.gather_from_tables(ctx, _t(tf, inp["fused_rows"]), inp["bases"]).numpy()


class CombineFromTables(_TablesOp):
  name = "combine_from_tables"

  def valid(self, rng):
    tables, bases = _tables_valid(rng)
    total = bases[-1] + tables[-1].shape[0]
    num_rows = int(rng.integers(1, 10))
    rows = rng.integers(0, total, size=num_rows).astype(rng.choice([np.int32, np.int64]))
    inp = _ragged_valid(rng, num_rows)
    inp.update(tables=tables, bases=bases, fused_rows=rows)
    return inp

  MUTATIONS = dict(RAGGED_MUTATIONS, **_bases_mutations(), **_tables_mutations(),
                   **_TablesOp.ROW_MUTATIONS)

  def oracle(self, inp):
    rows = _gather(inp["tables"], inp["bases"], inp["fused_rows"])
    ids, ws = _check_ragged(inp, rows.shape[0])
    with np.errstate(all="ignore"):
      return dict(result=oracles.combine(rows, ids, ws, inp["combiner"]))

  def call(self, inp, ctx, tf, tfde):
    return tfde.ops.combine_from_tables(
        ctx, _t(tf, inp["fused_rows"]), inp["bases"], _t(tf, inp["inverse"]),
        _t(tf, inp["row_splits"]), _t(tf, inp["weights"]), inp["combiner"]).numpy()
