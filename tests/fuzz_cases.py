"""Generated malformed inputs for every public op of tfde.ops, on both
backends (issue 18, point 2: fuzzing as a habit).

A case is a function of (seed, index): a valid call of one op with one
thing changed (its rank, its dtype, an empty tensor, an int64 extreme, a
negative or out-of-range value, non-monotone splits, NaN/Inf, a size that
would overflow int32 or an allocation, a mismatched count, ...). A numpy
oracle says what the call must give: either the result (the valid calls,
and malformed-looking ones that are valid, such as NaN weights), or that
the call must be refused.

Each case runs on the C++ kernels and on the pure-TF twins. One run of a
case on one backend is a job; jobs run in batches in a child process
(`python -m tests.fuzz_cases --child --seed S --first J --last K`), which
prints one JSON line per finished job. The parent (`run`) reads them; when
the child dies of a signal (or hangs), the job after the last one reported
is the one that crashed: it is recorded as a crash, run once more alone to
confirm it, and the batch goes on from the next job in a new child. So a
crash is pinned to its case and is a finding, never a killed test run.

Children run under an address-space limit (MEMORY_CAP, 4 GiB unless
$TFDE_FUZZ_MEMORY_CAP says otherwise), so a case that asks for a huge
allocation cannot take the machine's memory; a result larger than the cap
must be refused (ResourceExhaustedError or InvalidArgumentError).

Per job the record holds the outcome:
  ok        the result equals the oracle's
  wrong     a result that differs from the oracle's
  accepted  a result for an input the oracle refuses
  error     an allowed error (InvalidArgumentError, ValueError,
            ResourceExhaustedError; TypeError for a wrong dtype or a wrong
            number of arguments) for an input the oracle refuses
  refused   an allowed error for an input the oracle accepts
  bad-error any other exception
  crash     the child died of a signal (or hung) in this job
and whether a table, slot or dynamic store changed on an error.

`make fuzz` runs `python -m tests.fuzz_cases --seed S --cases N` and prints
the summary; tests/test_fuzz.py runs a fixed seed as part of `make test`.
"""

import argparse
import collections
import functools
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time

import numpy as np

from tests import oracles

BACKENDS = ("kernels", "reference")
MEMORY_CAP = int(os.environ.get("TFDE_FUZZ_MEMORY_CAP", 4 << 30))
I32_MAX = 2**31 - 1
I64_MAX = 2**63 - 1
I64_MIN = -(2**63)
# Integers that int32 casts wrap: 2**32 + k becomes k.
WRAP = 2**32


class Refuse(Exception):
  """The oracle's verdict: the call is malformed and must be refused."""


def _refuse_if(condition, why):
  if condition:
    raise Refuse(why)


# Reasons the current call may also be refused: inputs whose meaning is not
# documented (a negative step, say), where a refusal and the oracle's result
# are both right.
_may_refuse = []


def _may_refuse_if(condition, why):
  if condition:
    _may_refuse.append(why)


# ---------------------------------------------------------------- helpers


def describe(x, limit=6):
  """A short, JSON-safe description of an input."""
  if isinstance(x, np.ndarray):
    flat = x.ravel()
    values = ",".join(f"{v:.4g}" if isinstance(v, float) else str(v)
                      for v in flat[:limit].tolist())
    more = ",..." if flat.size > limit else ""
    return f"{x.dtype.name}{list(x.shape)}[{values}{more}]".replace(" ", "")
  if isinstance(x, (list, tuple)):
    return "[" + ",".join(describe(v, 3) for v in x) + "]"
  if isinstance(x, dict):
    return "{" + ",".join(f"{k}:{describe(v, 3)}" for k, v in x.items()) + "}"
  if isinstance(x, float):
    return f"{x:.4g}"
  return repr(x)


def _int_vector(x, name):
  _refuse_if(not isinstance(x, np.ndarray), f"{name} is not an array")
  _refuse_if(x.dtype not in (np.int32, np.int64), f"{name} has dtype {x.dtype}")
  _refuse_if(x.ndim != 1, f"{name} has rank {x.ndim}")


def _int_scalar(x, name, lo=None, hi=None):
  if isinstance(x, np.ndarray):
    _refuse_if(x.ndim != 0, f"{name} has rank {x.ndim}")
    _refuse_if(x.dtype.kind not in "iu", f"{name} has dtype {x.dtype}")
    x = int(x)
  _refuse_if(isinstance(x, (bool, float)) or not isinstance(x, (int, np.integer)),
             f"{name} is not an integer")
  x = int(x)
  _refuse_if(lo is not None and x < lo, f"{name} = {x} < {lo}")
  _refuse_if(hi is not None and x > hi, f"{name} = {x} > {hi}")
  return x


def _float_scalar(x, name):
  if isinstance(x, np.ndarray):
    _refuse_if(x.ndim != 0, f"{name} has rank {x.ndim}")
    return float(x)
  return float(x)


def _check_bytes(nbytes, what):
  _refuse_if(nbytes > MEMORY_CAP, f"{what} needs {nbytes} bytes, over the "
             f"{MEMORY_CAP}-byte cap")


def _random_bags(rng, batch, num_rows, max_hot, weighted):
  lengths = rng.integers(0, max_hot + 1, size=batch) if num_rows else np.zeros(batch, int)
  n = int(lengths.sum())
  inverse = rng.integers(0, max(num_rows, 1), size=n)
  splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
  weights = rng.uniform(-1.0, 2.0, size=n).astype(np.float32) if weighted else None
  return inverse, splits, weights


def _ragged_valid(rng, num_rows, allow_empty=True):
  batch = int(rng.integers(0 if allow_empty else 1, 6))
  inverse, splits, weights = _random_bags(rng, batch, num_rows, int(rng.integers(1, 5)),
                                          bool(rng.integers(0, 2)))
  inverse = inverse.astype(rng.choice([np.int32, np.int64]))
  splits = splits.astype(rng.choice([np.int32, np.int64]))
  return dict(inverse=inverse, row_splits=splits, weights=weights,
              combiner=str(rng.choice(["sum", "mean", "sqrtn"])))


def _pick(rng, x):
  return int(rng.integers(0, x.size))


def _set(inp, key, value, note):
  inp[key] = value
  inp["_note"] = f"{key} {note}"
  return True


# Mutations shared by the ops with a ragged batch (inverse, row_splits,
# weights, combiner). Each returns False when it does not apply.


def _m_inverse_value(make):
  def mutate(rng, inp):
    inv = inp["inverse"]
    if inv.size == 0:
      return False
    inv = inv.astype(np.int64)
    i = _pick(rng, inv)
    inv[i] = make(inp, inv[i])
    return _set(inp, "inverse", inv, f"[{i}] = {inv[i]}")
  return mutate


def _num_rows_of(inp):
  if "rows" in inp and isinstance(inp["rows"], np.ndarray) and inp["rows"].ndim >= 1:
    return inp["rows"].shape[0]
  if "num_unique" in inp:
    return inp["num_unique"]
  return len(inp["fused_rows"])


def _m_inverse_float(rng, inp):
  return _set(inp, "inverse", inp["inverse"].astype(np.float32) + 0.5, "as float32 + 0.5")


def _m_inverse_rank2(rng, inp):
  return _set(inp, "inverse", inp["inverse"].reshape(-1, 1), "with shape [n, 1]")


def _m_splits_nonmonotone(rng, inp):
  s = inp["row_splits"].copy()
  if s.size < 3 or s[-1] < 1:
    return False
  i = int(rng.integers(1, s.size - 1))
  s[i] = s[-1] + 1 if s[i - 1] == s[i + 1] or rng.random() < 0.5 else s[i - 1] - 1
  if np.all(np.diff(s) >= 0):
    s[i] = s[i + 1] + 1
  return _set(inp, "row_splits", s, f"non-monotone at {i}: {s.tolist()}")


def _m_splits_first(rng, inp):
  s = inp["row_splits"].copy()
  s[0] = -1 if s.size == 1 or s[1] == 0 else 1
  return _set(inp, "row_splits", s, f"[0] = {s[0]}")


def _m_splits_last(rng, inp):
  s = inp["row_splits"].copy()
  s[-1] += 1
  return _set(inp, "row_splits", s, f"[-1] = {s[-1]} (one past the ids)")


def _m_splits_empty(rng, inp):
  return _set(inp, "row_splits", np.zeros([0], inp["row_splits"].dtype), "empty")


def _m_splits_extreme(rng, inp):
  s = inp["row_splits"].copy()
  s[-1] = I64_MAX if s.dtype == np.int64 else I32_MAX
  return _set(inp, "row_splits", s, f"[-1] = {s[-1]}")


def _m_splits_float(rng, inp):
  return _set(inp, "row_splits", inp["row_splits"].astype(np.float32), "as float32")


def _m_splits_rank2(rng, inp):
  return _set(inp, "row_splits", inp["row_splits"].reshape(1, -1), "with shape [1, b+1]")


def _m_weights_len(rng, inp):
  n = inp["inverse"].size
  k = n + 1 if n == 0 or rng.random() < 0.5 else n - 1
  if k == 0:
    k = n + 1
  return _set(inp, "weights", np.ones([k], np.float32), f"with {k} elements for {n} ids")


def _m_weights_nonfinite(rng, inp):
  n = inp["inverse"].size
  if n == 0:
    return False
  w = (inp["weights"] if inp["weights"] is not None else np.ones([n], np.float32)).copy()
  i = _pick(rng, w)
  w[i] = rng.choice([np.nan, np.inf, -np.inf])
  return _set(inp, "weights", w, f"[{i}] = {w[i]}")


def _m_weights_big(rng, inp):
  n = inp["inverse"].size
  if n == 0:
    return False
  w = np.full([n], 1e20, np.float32)
  return _set(inp, "weights", w, "all 1e20 (w*w overflows float32)")


def _m_weights_rank2(rng, inp):
  n = inp["inverse"].size
  if n == 0:
    return False
  return _set(inp, "weights", np.ones([n, 1], np.float32), "with shape [n, 1]")


def _m_combiner(rng, inp):
  return _set(inp, "combiner", str(rng.choice(["max", "SUM", ""])), "unknown")


def _m_empty_batch(rng, inp):
  inp["inverse"] = np.zeros([0], inp["inverse"].dtype)
  inp["row_splits"] = np.zeros([1], inp["row_splits"].dtype)
  inp["weights"] = None
  if "grad" in inp:
    inp["grad"] = inp["grad"][:0]
  inp["_note"] = "an empty batch (row_splits [0])"
  return True


RAGGED_MUTATIONS = {
    "inverse_out_of_range": ("range", _m_inverse_value(lambda inp, v: _num_rows_of(inp))),
    "inverse_negative": ("negative", _m_inverse_value(lambda inp, v: -1)),
    "inverse_wraps_int32": ("extreme", _m_inverse_value(lambda inp, v: WRAP + v)),
    "inverse_int64_max": ("extreme", _m_inverse_value(lambda inp, v: I64_MAX)),
    "inverse_int64_min": ("extreme", _m_inverse_value(lambda inp, v: I64_MIN)),
    "inverse_float": ("dtype", _m_inverse_float),
    "inverse_rank2": ("rank", _m_inverse_rank2),
    "row_splits_non_monotone": ("order", _m_splits_nonmonotone),
    "row_splits_first_not_0": ("value", _m_splits_first),
    "row_splits_last_wrong": ("value", _m_splits_last),
    "row_splits_empty": ("empty", _m_splits_empty),
    "row_splits_extreme": ("extreme", _m_splits_extreme),
    "row_splits_float": ("dtype", _m_splits_float),
    "row_splits_rank2": ("rank", _m_splits_rank2),
    "weights_count": ("shape", _m_weights_len),
    "weights_nonfinite": ("nonfinite", _m_weights_nonfinite),
    "weights_1e20": ("extreme", _m_weights_big),
    "weights_rank2": ("rank", _m_weights_rank2),
    "combiner_unknown": ("value", _m_combiner),
    "empty_batch": ("empty", _m_empty_batch),
}


def _check_ragged(inp, num_rows):
  """The ragged batch's contract; returns (ids per sample (lists of ints),
  weights per sample or None)."""
  inverse, splits, weights = inp["inverse"], inp["row_splits"], inp["weights"]
  _int_vector(inverse, "inverse")
  _int_vector(splits, "row_splits")
  n = inverse.size
  if weights is not None:
    _refuse_if(weights.ndim != 1, f"weights has rank {weights.ndim}")
    _refuse_if(weights.size not in (0, n), f"weights has {weights.size} elements for {n} ids")
    if weights.size == 0:
      weights = None
  _refuse_if(splits.size < 1, "row_splits is empty")
  _refuse_if(splits[0] != 0, "row_splits[0] != 0")
  _refuse_if(np.any(np.diff(splits.astype(np.int64)) < 0), "row_splits decrease")
  _refuse_if(splits[-1] != n, "row_splits[-1] != number of ids")
  _refuse_if(inp["combiner"] not in ("sum", "mean", "sqrtn"), "unknown combiner")
  bad = (inverse < 0) | (inverse >= num_rows)
  _refuse_if(bool(bad.any()), "inverse out of range")
  ids = [inverse[splits[b]:splits[b + 1]].tolist() for b in range(splits.size - 1)]
  ws = (None if weights is None else
        [weights[splits[b]:splits[b + 1]].astype(np.float64).tolist()
         for b in range(splits.size - 1)])
  return ids, ws


def _coefficients(ids, ws, combiner):
  """Per id in order: its sample and its w / divisor (0 for a divisor of
  0), as documented."""
  bag_of, coefficient = [], []
  for b, bag in enumerate(ids):
    w = np.ones(len(bag)) if ws is None else np.asarray(ws[b], np.float64)
    with np.errstate(all="ignore"):
      divisor = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[combiner]
      scale = 0.0 if divisor == 0 else 1.0 / divisor
      coefficient += list(w * scale)
    bag_of += [b] * len(bag)
  return np.array(bag_of, np.int64), np.array(coefficient, np.float64)


# ------------------------------------------------------------ comparing


def mismatch(got, want, rtol=1e-4, atol=1e-5, what="result"):
  """None when `got` equals `want` (numbers: close where want is finite,
  non-finite where it is not), else a short description."""
  if isinstance(want, (list, tuple)):
    if not isinstance(got, (list, tuple)) or len(got) != len(want):
      return f"{what}: {len(got) if isinstance(got, (list, tuple)) else got!r} parts, want {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
      m = mismatch(g, w, rtol, atol, f"{what}[{k}]")
      if m:
        return m
    return None
  got = np.asarray(got)
  want = np.asarray(want)
  if got.shape != want.shape:
    return f"{what}: shape {list(got.shape)}, want {list(want.shape)}"
  if want.dtype.kind in "iub":
    if not np.array_equal(got.astype(np.int64), want.astype(np.int64)):
      bad = np.flatnonzero(got.astype(np.int64).ravel() != want.astype(np.int64).ravel())
      i = int(bad[0])
      return (f"{what}: [{i}] = {got.ravel()[i]}, want {want.ravel()[i]} "
              f"({bad.size} differ)")
    return None
  g = got.astype(np.float64).ravel()
  w = want.astype(np.float64).ravel()
  finite = np.isfinite(w)
  with np.errstate(all="ignore"):
    ok = np.where(finite, np.isfinite(g) & (np.abs(g - w) <= atol + rtol * np.abs(w)),
                  ~np.isfinite(g))
  if not ok.all():
    bad = np.flatnonzero(~ok)
    i = int(bad[0])
    return f"{what}: [{i}] = {g[i]}, want {w[i]} ({bad.size} of {w.size} differ)"
  return None


def _state_equal(a, b):
  if a is None or b is None:
    return a is b
  if len(a) != len(b):
    return False
  for x, y in zip(a, b):
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape or x.dtype != y.dtype:
      return False
    if x.dtype.kind == "f":
      if not np.array_equal(x, y, equal_nan=True):
        return False
    elif not np.array_equal(x, y):
      return False
  return True


# ------------------------------------------------------------------ ops
#
# Each op: valid(rng) -> inputs; MUTATIONS: name -> (category, mutate(rng,
# inputs) -> applied); oracle(inputs) -> expected (or raises Refuse);
# prepare(inputs) -> context (variables, stores; built with the backend in
# force); state(context) -> arrays or None; call(inputs, context) -> result
# as numpy; check(got, expected, inputs) -> None or a mismatch. Ops with
# state put the state expected after the call in expected["state"].


class Op:
  name = ""
  MUTATIONS = {}
  rtol, atol = 1e-4, 1e-5

  def prepare(self, inp, tf, tfde):
    return None

  def state(self, ctx):
    return None

  def check(self, got, want, inp):
    return mismatch(got, want["result"], self.rtol, self.atol)


def _t(tf, x):
  return tf.constant(x) if isinstance(x, np.ndarray) else x


# ---- unique_with_counts


class Unique(Op):
  name = "unique_with_counts"

  def valid(self, rng):
    n = int(rng.integers(0, 30))
    dtype = rng.choice([np.int32, np.int64])
    return dict(ids=rng.integers(-5, 12, size=n).astype(dtype))

  def _extremes(rng, inp):
    ids = np.concatenate([inp["ids"].astype(np.int64),
                          [I64_MAX, I64_MIN, WRAP + 1, 1, -1, I64_MAX]])
    return _set(inp, "ids", rng.permutation(ids), "with int64 extremes")

  MUTATIONS = {
      "rank0": ("rank", lambda rng, inp: _set(inp, "ids", np.array(7, inp["ids"].dtype),
                                             "a scalar")),
      "rank2": ("rank", lambda rng, inp: inp["ids"].size > 0 and _set(
          inp, "ids", inp["ids"].reshape(-1, 1), "with shape [n, 1]")),
      "float_ids": ("dtype", lambda rng, inp: _set(inp, "ids", inp["ids"] + 0.5,
                                                   "float64 + 0.5")),
      "bool_ids": ("dtype", lambda rng, inp: _set(inp, "ids", inp["ids"] > 0, "bool")),
      "empty": ("empty", lambda rng, inp: _set(inp, "ids", inp["ids"][:0], "empty")),
      "int64_extremes": ("extreme", _extremes),
  }

  def oracle(self, inp):
    _int_vector(inp["ids"], "ids")
    return dict(result=list(oracles.unique_first_appearance(inp["ids"])))

  def call(self, inp, ctx, tf, tfde):
    return [x.numpy() for x in tfde.ops.unique_with_counts(_t(tf, inp["ids"]))]


# ---- partition_by_shard


class Partition(Op):
  name = "partition_by_shard"

  def valid(self, rng):
    dynamic = bool(rng.integers(0, 2))
    n = int(rng.integers(0, 30))
    lo = -50 if dynamic else 0
    ids = rng.integers(lo, 1000, size=n).astype(rng.choice([np.int32, np.int64]))
    return dict(ids=ids, num_shards=int(rng.integers(1, 9)), dynamic=dynamic)

  def _shards(value):
    return lambda rng, inp: _set(inp, "num_shards", value, f"= {value}")

  def _id(make, note):
    def mutate(rng, inp):
      ids = inp["ids"].astype(np.int64)
      if ids.size == 0:
        return False
      i = _pick(rng, ids)
      ids[i] = make(rng)
      return _set(inp, "ids", ids, f"[{i}] = {ids[i]} {note}")
    return mutate

  MUTATIONS = {
      "num_shards_0": ("value", _shards(0)),
      "num_shards_negative": ("negative", _shards(-3)),
      "num_shards_wraps_int32": ("extreme", _shards(WRAP + 2)),
      "num_shards_2**31": ("extreme", _shards(2**31)),
      "num_shards_int32_max": ("huge", _shards(I32_MAX)),
      "num_shards_1e12": ("huge", _shards(10**12)),
      "num_shards_int64_min": ("extreme", _shards(I64_MIN)),
      "num_shards_vector": ("rank", lambda rng, inp: _set(inp, "num_shards",
                                                          np.array([2], np.int32), "[2]")),
      "num_shards_float": ("dtype", _shards(2.5)),
      "negative_id": ("negative", _id(lambda rng: -int(rng.integers(1, 100)), "")),
      "id_int64_max": ("extreme", _id(lambda rng: I64_MAX, "")),
      "id_int64_min": ("extreme", _id(lambda rng: I64_MIN, "")),
      "ids_rank2": ("rank", lambda rng, inp: inp["ids"].size > 0 and _set(
          inp, "ids", inp["ids"].reshape(1, -1), "with shape [1, n]")),
      "ids_float": ("dtype", lambda rng, inp: _set(inp, "ids", inp["ids"] + 0.5,
                                                   "float64 + 0.5")),
      "ids_empty": ("empty", lambda rng, inp: _set(inp, "ids", inp["ids"][:0], "empty")),
  }

  def oracle(self, inp):
    ids = inp["ids"]
    _int_vector(ids, "ids")
    n = _int_scalar(inp["num_shards"], "num_shards", 1, I32_MAX)
    _check_bytes(4 * n, "shard_counts")
    ids64 = ids.astype(object)  # exact floor division and modulo
    if not inp["dynamic"]:
      _refuse_if(bool((ids < 0).any()), "negative id of a static table")
    shard = np.array([int(x) % n for x in ids64], np.int64)
    order = np.argsort(shard, kind="stable")
    local = ids[order] if inp["dynamic"] else np.array(
        [int(x) // n for x in ids64[order]], np.int64)
    counts = np.bincount(shard, minlength=n)
    positions = np.empty_like(order)
    positions[order] = np.arange(len(ids))
    return dict(result=[local, counts, positions])

  def call(self, inp, ctx, tf, tfde):
    out = tfde.ops.partition_by_shard(_t(tf, inp["ids"]), inp["num_shards"],
                                      dynamic=inp["dynamic"])
    return [x.numpy() for x in out]


# ---- embedding_combine


def _rows_tensor(tf, rows, dtype):
  if dtype == "bfloat16":
    return tf.cast(tf.constant(rows), tf.bfloat16)
  return tf.constant(rows)


def _rows_mutations(key):
  """Mutations of a [rows, dim] float input named `key`."""
  def nonfinite(rng, inp):
    x = inp[key].copy()
    if x.size == 0:
      return False
    i = np.unravel_index(_pick(rng, x), x.shape)
    x[i] = rng.choice([np.nan, np.inf, -np.inf])
    return _set(inp, key, x, f"{list(i)} = {x[i]}")

  def dtype(rng, inp):
    choice = str(rng.choice(["float64", "int32", "float16", "bfloat16"]))
    if choice in ("float64", "int32", "float16"):
      inp[key] = inp[key].astype(choice)
      inp[key + "_dtype"] = "numpy"
    else:
      inp[key + "_dtype"] = choice
    inp["_note"] = f"{key} as {choice}"
    return True

  return {
      f"{key}_rank1": ("rank", lambda rng, inp: _set(inp, key, inp[key].ravel(), "flattened")),
      f"{key}_rank3": ("rank", lambda rng, inp: _set(inp, key, inp[key][:, :, None],
                                                     "with shape [r, d, 1]")),
      f"{key}_nonfinite": ("nonfinite", nonfinite),
      f"{key}_dtype": ("dtype", dtype),
  }


def _float_input_ok(x, name):
  """A [rows, dim] matrix of the kernels' float types (bfloat16 rows are
  float32 arrays cast on the way in)."""
  _refuse_if(x.ndim != 2, f"{name} has rank {x.ndim}")
  _refuse_if(x.dtype not in (np.float32, np.float16), f"{name} has dtype {x.dtype}")


def _half_tolerance(op, inp, key):
  if inp[key].dtype == np.float16 or inp.get(key + "_dtype") == "bfloat16":
    return 3e-2, 3e-2
  return op.rtol, op.atol


class Combine(Op):
  name = "embedding_combine"

  def valid(self, rng):
    num_rows, dim = int(rng.integers(1, 12)), int(rng.integers(1, 6))
    inp = _ragged_valid(rng, num_rows)
    inp["rows"] = rng.normal(size=(num_rows, dim)).astype(np.float32)
    return inp

  MUTATIONS = dict(RAGGED_MUTATIONS, **_rows_mutations("rows"), rows_empty=(
      "empty", lambda rng, inp: inp["inverse"].size > 0 and _set(
          inp, "rows", inp["rows"][:0], "with no rows")))

  def oracle(self, inp):
    rows = inp["rows"]
    _float_input_ok(rows, "rows")
    ids, ws = _check_ragged(inp, rows.shape[0])
    with np.errstate(all="ignore"):
      return dict(result=oracles.combine(rows.astype(np.float64), ids, ws, inp["combiner"]))

  def call(self, inp, ctx, tf, tfde):
    out = tfde.ops.embedding_combine(
        _rows_tensor(tf, inp["rows"], inp.get("rows_dtype")), _t(tf, inp["inverse"]),
        _t(tf, inp["row_splits"]), _t(tf, inp["weights"]), inp["combiner"])
    return tf.cast(out, tf.float32).numpy()

  def check(self, got, want, inp):
    rtol, atol = _half_tolerance(self, inp, "rows")
    return mismatch(got, want["result"], rtol, atol)


# ---- embedding_combine_grad and bag_gradients


def _num_unique_mutations():
  def value(make, note):
    def mutate(rng, inp):
      v = make(inp)
      if v is None:
        return False
      if "grad" in inp and abs(v) > 10**6 and inp["grad"].shape[1] < 16:
        # A width that puts the result far over the memory cap.
        inp["grad"] = np.repeat(inp["grad"][:, :1], 16, axis=1)
      return _set(inp, "num_unique", v, f"= {v} {note}")
    return mutate

  def below(inp):
    return int(inp["inverse"].max()) if inp["inverse"].size else None

  return {
      "num_unique_negative": ("negative", value(lambda inp: -1, "")),
      "num_unique_too_small": ("range", value(below, "(the largest inverse)")),
      "num_unique_1e9": ("huge", value(lambda inp: 10**9, "")),
      "num_unique_int32_max": ("huge", value(lambda inp: I32_MAX, "")),
      "num_unique_2**31": ("extreme", value(lambda inp: 2**31, "")),
      "num_unique_wraps_int32": ("extreme", value(lambda inp: WRAP + inp["num_unique"],
                                                  "(wraps to num_unique)")),
      "num_unique_1e12": ("huge", value(lambda inp: 10**12, "")),
      "num_unique_int64_min": ("extreme", value(lambda inp: I64_MIN, "(wraps to 0)")),
      "num_unique_vector": ("rank", lambda rng, inp: _set(
          inp, "num_unique", np.array([inp["num_unique"]], np.int32), "a vector")),
  }


def _num_unique_ok(inp, bytes_per_row):
  num_unique = _int_scalar(inp["num_unique"], "num_unique", 0, I32_MAX)
  _check_bytes(num_unique * bytes_per_row, "the result")
  _check_bytes(8 * (num_unique + 1), "the segments")
  return num_unique


class CombineGrad(Op):
  name = "embedding_combine_grad"

  def valid(self, rng):
    num_unique, dim = int(rng.integers(1, 12)), int(rng.integers(1, 6))
    inp = _ragged_valid(rng, num_unique)
    inp["num_unique"] = num_unique
    inp["grad"] = rng.normal(size=(inp["row_splits"].size - 1, dim)).astype(np.float32)
    return inp

  MUTATIONS = dict(
      RAGGED_MUTATIONS, **_num_unique_mutations(), **_rows_mutations("grad"),
      grad_batch=("shape", lambda rng, inp: _set(
          inp, "grad", np.ones([inp["grad"].shape[0] + 1, inp["grad"].shape[1]], np.float32),
          "with one row more than the batch")))

  def oracle(self, inp):
    grad = inp["grad"]
    _float_input_ok(grad, "grad")
    num_unique = _num_unique_ok(inp, 4 * grad.shape[1])
    ids, ws = _check_ragged(inp, num_unique)
    _refuse_if(grad.shape[0] != len(ids), "grad rows != batch")
    with np.errstate(all="ignore"):
      return dict(result=oracles.combine_grad_dense(num_unique, grad.astype(np.float64),
                                                    ids, ws, inp["combiner"]))

  def call(self, inp, ctx, tf, tfde):
    out = tfde.ops.embedding_combine_grad(
        _rows_tensor(tf, inp["grad"], inp.get("grad_dtype")), _t(tf, inp["inverse"]),
        _t(tf, inp["row_splits"]), _t(tf, inp["weights"]), _t(tf, inp["num_unique"]),
        inp["combiner"])
    return tf.cast(out, tf.float32).numpy()

  def check(self, got, want, inp):
    rtol, atol = _half_tolerance(self, inp, "grad")
    return mismatch(got, want["result"], rtol, atol)


class BagGradients(Op):
  name = "bag_gradients"

  def valid(self, rng):
    num_unique, dim = int(rng.integers(1, 12)), int(rng.integers(1, 6))
    inp = _ragged_valid(rng, num_unique)
    inp["num_unique"] = num_unique
    inp["grad"] = rng.normal(size=(inp["row_splits"].size - 1, dim)).astype(np.float32)
    return inp

  MUTATIONS = dict(RAGGED_MUTATIONS, **_num_unique_mutations())

  def oracle(self, inp):
    num_unique = _num_unique_ok(inp, 0)
    ids, ws = _check_ragged(inp, num_unique)
    bag_of, coefficient = _coefficients(ids, ws, inp["combiner"])
    inverse = inp["inverse"].astype(np.int64)
    order = np.argsort(inverse, kind="stable")
    segments = np.concatenate([[0], np.cumsum(np.bincount(inverse, minlength=num_unique))])
    return dict(result=[segments, bag_of[order], coefficient[order]])

  def call(self, inp, ctx, tf, tfde):
    g = tfde.ops.bag_gradients(
        tf.constant(inp["grad"]), _t(tf, inp["inverse"]), _t(tf, inp["row_splits"]),
        _t(tf, inp["weights"]), _t(tf, inp["num_unique"]), inp["combiner"])
    return [g.segments.numpy(), g.bags.numpy(), g.weights.numpy()]


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


# ---- sparse_apply


HP = {
    "sgd": dict(learning_rate=0.3),
    "adagrad": dict(learning_rate=0.2, epsilon=1e-7),
    "adam": dict(learning_rate=0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-7),
    "ftrl": dict(learning_rate=0.1, l1=0.01, l2=0.02, l2_shrinkage=0.03, beta=0.1,
                 learning_rate_power=-0.5),
}
SCALAR_NAMES = {"sgd": ["learning_rate"], "adagrad": ["learning_rate", "epsilon"],
                "adam": ["learning_rate", "beta_1", "beta_2", "epsilon", "step"],
                "ftrl": ["learning_rate", "l1", "l2", "l2_shrinkage", "beta",
                         "learning_rate_power"]}
NUM_SLOTS = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 2}
SLOT_INITIAL = {"sgd": (), "adagrad": (0.1,), "adam": (0.0, 0.0), "ftrl": (0.1, 0.0)}


def _scalars(rng, kind):
  values = [HP[kind][k] for k in SCALAR_NAMES[kind] if k != "step"]
  if kind == "adam":
    values.append(float(rng.integers(1, 6)))
  return values


def _hp_of(kind, scalars):
  """(hp, step) for oracles.keras_row_update from an op's scalars."""
  values = [_float_scalar(s, "scalar") for s in scalars]
  hp = dict(zip(SCALAR_NAMES[kind], values))
  step = hp.pop("step", 1.0)
  if kind == "adam":
    _refuse_if(not step >= 1.0, f"adam step {step} < 1")
  if kind == "ftrl":
    _refuse_if(not hp["learning_rate"] > 0.0, "ftrl learning_rate <= 0")
  return hp, step


def _slot_arrays(rng, kind, shape):
  slots = []
  if kind == "adagrad":
    slots = [rng.uniform(0.1, 1.0, size=shape)]
  elif kind == "adam":
    slots = [rng.normal(size=shape), rng.uniform(0.0, 1.0, size=shape)]
  elif kind == "ftrl":
    slots = [rng.uniform(0.1, 1.0, size=shape), rng.normal(size=shape)]
  return [s.astype(np.float32) for s in slots]


def _apply_rows(kind, hp, step, variables, rows, grads):
  """oracles.keras_row_update on each row: the new variables (float64)."""
  out = [v.astype(np.float64) for v in variables]
  with np.errstate(all="ignore"):
    for r, g in zip(rows, grads):
      w, slots = oracles.keras_row_update(kind, hp, step, out[0][r],
                                          [s[r] for s in out[1:]], g)
      out[0][r] = w
      for s, value in zip(out[1:], slots):
        s[r] = value
  return out


def _bags_of(rng, num_rows, dim):
  """A valid BagGradients (numpy) with num_rows rows."""
  batch = int(rng.integers(1, 6))
  per_row = rng.integers(0, 4, size=num_rows)
  entries = int(per_row.sum())
  return dict(output_grad=rng.normal(size=(batch, dim)).astype(np.float32),
              segments=np.concatenate([[0], np.cumsum(per_row)]).astype(np.int64),
              bags=rng.integers(0, batch, size=entries).astype(np.int32),
              weights=rng.uniform(-1, 2, size=entries).astype(np.float32))


def _bags_dense(bags, rows_read):
  """The gradient rows `rows_read` of a BagGradients, checking what they
  read (the kernel's contract: every row a caller reads is checked)."""
  og, seg, b, w = bags["output_grad"], bags["segments"], bags["bags"], bags["weights"]
  _refuse_if(og.ndim != 2, "output_grad is not a matrix")
  _refuse_if(seg.ndim != 1 or b.ndim != 1 or w.ndim != 1, "bags are not vectors")
  _refuse_if(seg.size < 1, "segments is empty")
  _refuse_if(w.size != b.size, "bag weights and bags differ in count")
  _refuse_if(seg[0] != 0, "segments[0] != 0")
  _refuse_if(seg[-1] != b.size, "segments[-1] != entries")
  out = np.zeros((len(rows_read), og.shape[1]))
  with np.errstate(all="ignore"):
    for k, r in enumerate(rows_read):
      lo, hi = int(seg[r]), int(seg[r + 1])
      _refuse_if(lo < 0 or hi > b.size or hi < lo, "a segment leaves the entries")
      for j in range(lo, hi):
        _refuse_if(not 0 <= b[j] < og.shape[0], "a bag is out of range")
        out[k] += float(w[j]) * og[b[j]].astype(np.float64)
  return out


class SparseApply(Op):
  name = "sparse_apply"
  rtol, atol = 1e-4, 1e-5

  def __init__(self, bags):
    self.bags = bags
    self.name = "sparse_apply_from_bags" if bags else "sparse_apply"
    self.MUTATIONS = dict(self.COMMON, **(self.BAG_MUTATIONS if bags else self.MATRIX))

  def valid(self, rng):
    kind = str(rng.choice(sorted(HP)))
    vocab, dim = int(rng.integers(1, 20)), int(rng.integers(1, 5))
    n = int(rng.integers(1, vocab + 1))
    indices = rng.choice(vocab, size=n, replace=False).astype(rng.choice([np.int32, np.int64]))
    inp = dict(kind=kind, table=rng.normal(size=(vocab, dim)).astype(np.float32),
               indices=indices, scalars=_scalars(rng, kind), grad_rows=None)
    inp["slots"] = _slot_arrays(rng, kind, (vocab, dim))
    use_rows = rng.random() < 0.4
    num_grad_rows = n + int(rng.integers(0, 4)) if use_rows else n
    if use_rows:
      inp["grad_rows"] = rng.choice(num_grad_rows, size=n, replace=False).astype(np.int32)
    if self.bags:
      inp["bag_grad"] = _bags_of(rng, num_grad_rows, dim)
    else:
      inp["grad"] = rng.normal(size=(num_grad_rows, dim)).astype(np.float32)
    return inp

  # -- mutations

  def _index(make):
    def mutate(rng, inp):
      idx = inp["indices"].astype(np.int64)
      if idx.size == 0:
        return False
      i = _pick(rng, idx)
      idx[i] = make(rng, inp, idx)
      return _set(inp, "indices", idx, f"[{i}] = {idx[i]}")
    return mutate

  def _repeat(rng, inp):
    idx = inp["indices"]
    if idx.size < 2:
      return False
    idx = idx.copy()
    idx[-1] = idx[0]
    return _set(inp, "indices", idx, f"repeats: {idx.tolist()}")

  def _grad_rows(make, note):
    def mutate(rng, inp):
      gr = inp["grad_rows"]
      if gr is None:
        gr = np.arange(inp["indices"].size, dtype=np.int64)
      gr = make(rng, inp, gr.astype(np.int64))
      if gr is None:
        return False
      return _set(inp, "grad_rows", gr, note)
    return mutate

  def _num_grad_rows(inp):
    if "grad" in inp:
      return inp["grad"].shape[0]
    return inp["bag_grad"]["segments"].size - 1

  def _gr_at(value):
    def make(rng, inp, gr):
      if gr.size == 0:
        return None
      gr[_pick(rng, gr)] = value(inp, gr)
      return gr
    return make

  def _variables(make, note):
    def mutate(rng, inp):
      if make(rng, inp) is False:
        return False
      inp["_note"] = note
      return True
    return mutate

  def _slot_shape(rng, inp):
    if not inp["slots"]:
      return False
    inp["slots"] = [np.ones([inp["table"].shape[0] + 1, inp["table"].shape[1]], np.float32)
                    ] + inp["slots"][1:]

  def _missing_slot(rng, inp):
    if not inp["slots"]:
      return False
    inp["slots"] = inp["slots"][:-1]

  def _extra_variable(rng, inp):
    inp["slots"] = inp["slots"] + [np.zeros_like(inp["table"])]

  def _scalar(make, note, kinds=None):
    def mutate(rng, inp):
      if kinds and inp["kind"] not in kinds:
        return False
      s = list(inp["scalars"])
      k = len(s) - 1 if inp["kind"] == "adam" and "step" in note else 0
      s[k] = make(s[k])
      inp["scalars"] = s
      inp["_note"] = f"scalars[{k}] {note}"
      return True
    return mutate

  COMMON = {
      "indices_out_of_range": ("range", _index(lambda rng, inp, idx: inp["table"].shape[0])),
      "indices_negative": ("negative", _index(lambda rng, inp, idx: -1)),
      "indices_int64_max": ("extreme", _index(lambda rng, inp, idx: I64_MAX)),
      "indices_int64_min": ("extreme", _index(lambda rng, inp, idx: I64_MIN)),
      "indices_wrap_int32": ("extreme", _index(lambda rng, inp, idx: WRAP + idx[0])),
      "indices_repeated": ("order", _repeat),
      "indices_float": ("dtype", lambda rng, inp: _set(inp, "indices", inp["indices"] + 0.5,
                                                       "float64 + 0.5")),
      "indices_rank2": ("rank", lambda rng, inp: _set(inp, "indices",
                                                      inp["indices"].reshape(-1, 1),
                                                      "with shape [n, 1]")),
      "indices_empty": ("empty", lambda rng, inp: (
          inp.__setitem__("grad_rows", None if inp["grad_rows"] is None
                          else np.zeros([0], np.int32)),
          _set(inp, "indices", inp["indices"][:0], "empty (gradient unchanged)"))[1]),
      "grad_rows_out_of_range": ("range", _grad_rows(
          _gr_at(lambda inp, gr: SparseApply._num_grad_rows(inp)), "one out of range")),
      "grad_rows_negative": ("negative", _grad_rows(_gr_at(lambda inp, gr: -1),
                                                    "one negative")),
      "grad_rows_wrap_int32": ("extreme", _grad_rows(_gr_at(lambda inp, gr: WRAP + gr[0]),
                                                     "one = 2**32 + a valid row")),
      "grad_rows_count": ("shape", _grad_rows(lambda rng, inp, gr: np.concatenate([gr, gr[:1]]),
                                              "one entry longer than indices")),
      "grad_rows_empty": ("empty", _grad_rows(
          lambda rng, inp, gr: (np.zeros([0], np.int32)
                                if inp["grad_rows"] is None else None),
          "an empty array (documented: the same as none)")),
      "grad_rows_rank2": ("rank", _grad_rows(lambda rng, inp, gr: gr.reshape(-1, 1),
                                             "with shape [n, 1]")),
      "slot_shape": ("shape", _variables(_slot_shape, "slots[0] one row longer than the table")),
      "slot_missing": ("arity", _variables(_missing_slot, "one slot variable missing")),
      "extra_variable": ("arity", _variables(_extra_variable, "one variable too many")),
      "table_float64": ("dtype", _variables(
          lambda rng, inp: inp.__setitem__("table", inp["table"].astype(np.float64)),
          "table as float64")),
      "table_int32": ("dtype", _variables(
          lambda rng, inp: inp.__setitem__("table", inp["table"].astype(np.int32)),
          "table as int32")),
      "table_rank1": ("rank", _variables(
          lambda rng, inp: (inp.__setitem__("table", inp["table"].ravel()),
                            inp.__setitem__("slots", [s.ravel() for s in inp["slots"]])),
          "table and slots flattened")),
      "scalar_rank1": ("rank", _scalar(lambda v: np.array([v], np.float32), "as a vector")),
      "scalar_nan": ("nonfinite", _scalar(lambda v: float("nan"), "= nan")),
      "scalar_count": ("arity", lambda rng, inp: _set(inp, "scalars", inp["scalars"][:-1],
                                                      "one scalar missing")),
      "adam_step_0": ("value", _scalar(lambda v: 0.0, "step = 0", kinds=("adam",))),
      "ftrl_lr_negative": ("negative", _scalar(lambda v: -0.1, "= -0.1", kinds=("ftrl",))),
  }

  def _grad(make, note):
    def mutate(rng, inp):
      g = make(rng, inp["grad"])
      if g is None:
        return False
      return _set(inp, "grad", g, note)
    return mutate

  def _grad_nonfinite(rng, g):
    g = g.copy()
    g.ravel()[_pick(rng, g)] = rng.choice([np.nan, np.inf, -np.inf])
    return g

  MATRIX = {
      "grad_rows_mismatch": ("shape", _grad(
          lambda rng, g: np.concatenate([g, g[:1]]), "with one row more")),
      "grad_width": ("shape", _grad(lambda rng, g: np.ones([g.shape[0], g.shape[1] + 1],
                                                           np.float32), "one column wider")),
      "grad_rank1": ("rank", _grad(lambda rng, g: g.ravel(), "flattened")),
      "grad_rank3": ("rank", _grad(lambda rng, g: g[:, :, None], "with shape [k, d, 1]")),
      "grad_nonfinite": ("nonfinite", _grad(_grad_nonfinite, "with a non-finite value")),
      "grad_float64": ("dtype", _grad(lambda rng, g: g.astype(np.float64), "as float64")),
      "grad_int32": ("dtype", _grad(lambda rng, g: g.astype(np.int32), "as int32")),
  }

  def _bag(field, make, note):
    def mutate(rng, inp):
      if inp["grad_rows"] is not None:
        return False  # only rows that are read are checked: read them all
      bags = dict(inp["bag_grad"])
      value = make(rng, bags[field].copy(), bags)
      if value is None:
        return False
      bags[field] = value
      inp["bag_grad"] = bags
      inp["_note"] = f"bags.{field} {note}: {describe(value)}"
      return True
    return mutate

  def _seg_non_monotone(rng, s, bags):
    if s.size < 3 or s[-1] == 0:
      return None
    i = int(rng.integers(1, s.size - 1))
    s[i] = s[-1] + 1 if s[i - 1] == s[i + 1] or rng.random() < 0.5 else -1
    return s

  def _bag_at(value):
    def make(rng, b, bags):
      if b.size == 0:
        return None
      b[_pick(rng, b)] = value(bags)
      return b
    return make

  BAG_MUTATIONS = {
      "segments_non_monotone": ("order", _bag("segments", _seg_non_monotone, "")),
      "segments_first_not_0": ("value", _bag(
          "segments", lambda rng, s, bags: (np.concatenate([[1], s[1:]])
                                            if s.size > 1 and s[1] > 0 else None), "")),
      "segments_last_wrong": ("value", _bag(
          "segments", lambda rng, s, bags: np.concatenate([s[:-1], [s[-1] + 1]]), "")),
      "bags_out_of_range": ("range", _bag(
          "bags", _bag_at(lambda bags: bags["output_grad"].shape[0]), "")),
      "bags_negative": ("negative", _bag("bags", _bag_at(lambda bags: -1), "")),
      "bag_weights_count": ("shape", _bag(
          "weights", lambda rng, w, bags: np.concatenate([w, [1.0]]).astype(np.float32), "")),
      "bag_weights_nonfinite": ("nonfinite", _bag(
          "weights", lambda rng, w, bags: (SparseApply._grad_nonfinite(rng, w)
                                           if w.size else None), "")),
      "output_grad_width": ("shape", _bag(
          "output_grad", lambda rng, g, bags: np.ones([g.shape[0], g.shape[1] + 1],
                                                      np.float32), "one column wider")),
      "output_grad_nonfinite": ("nonfinite", _bag(
          "output_grad", lambda rng, g, bags: SparseApply._grad_nonfinite(rng, g), "")),
  }

  # -- oracle and call

  def oracle(self, inp):
    kind = inp["kind"]
    table = inp["table"]
    variables = [table] + inp["slots"]
    _refuse_if(len(inp["slots"]) != NUM_SLOTS[kind], "wrong number of slot variables")
    _refuse_if(len(inp["scalars"]) != len(SCALAR_NAMES[kind]), "wrong number of scalars")
    for v in variables:
      _refuse_if(v.dtype != np.float32 or v.ndim != 2, "a variable is not a float32 matrix")
      _refuse_if(v.shape != table.shape, "a slot differs from the table in shape")
    for s in inp["scalars"]:
      _refuse_if(isinstance(s, np.ndarray) and s.ndim != 0, "a scalar is not a scalar")
    hp, step = _hp_of(kind, inp["scalars"])
    idx = inp["indices"]
    _int_vector(idx, "indices")
    n = idx.size
    gr = inp["grad_rows"]
    if gr is not None:
      _int_vector(gr, "grad_rows")
      if gr.size == 0:
        gr = None
    if self.bags:
      bags = inp["bag_grad"]
      num_grad_rows = bags["segments"].size - 1
      _refuse_if(bags["output_grad"].dtype != np.float32, "output_grad is not float32")
      width = bags["output_grad"].shape[1] if bags["output_grad"].ndim == 2 else -1
    else:
      g = inp["grad"]
      _refuse_if(g.dtype != np.float32 or g.ndim != 2, "grad is not a float32 matrix")
      num_grad_rows, width = g.shape
    if gr is not None:
      _refuse_if(gr.size != n, "grad_rows and indices differ in count")
      _refuse_if(bool(((gr < 0) | (gr >= num_grad_rows)).any()), "grad_rows out of range")
    elif n:
      _refuse_if(num_grad_rows != n, "grad rows != indices")
    _refuse_if(bool(((idx < 0) | (idx >= table.shape[0])).any()), "indices out of range")
    _refuse_if(len(set(idx.tolist())) != n, "repeated indices")
    read = (gr if gr is not None else np.arange(n)).tolist()
    if self.bags:
      grads = _bags_dense(bags, read)
    else:
      grads = inp["grad"][read].astype(np.float64) if n else np.zeros((0, width))
    _refuse_if(width != table.shape[1], "grad width != table width")
    return dict(state=_apply_rows(kind, hp, step, variables, idx.tolist(), grads))

  def prepare(self, inp, tf, tfde):
    return [tf.Variable(v) for v in [inp["table"]] + inp["slots"]]

  def state(self, ctx):
    return [v.numpy() for v in ctx]

  def call(self, inp, ctx, tf, tfde):
    if self.bags:
      grad = tfde.ops.BagGradients(**{k: tf.constant(v) for k, v in inp["bag_grad"].items()})
    else:
      grad = tf.constant(inp["grad"])
    gr = inp["grad_rows"]
    tfde.ops.sparse_apply(inp["kind"], ctx, tf.constant(inp["indices"]), grad,
                          [_t(tf, s) for s in inp["scalars"]],
                          None if gr is None else tf.constant(gr))
    return None

  def check(self, got, want, inp):
    return None  # the state is compared


# ---- the dynamic store


def _spec_valid(rng):
  kind = str(rng.choice(sorted(HP)))
  init = str(rng.choice(["zeros", "constant", "uniform", "normal", "truncated_normal"]))
  return dict(kind=kind, dim=int(rng.integers(1, 5)), slot_initial_values=SLOT_INITIAL[kind],
              initializer=init, initializer_a=float(rng.uniform(-1, 0)),
              initializer_b=float(rng.uniform(0.1, 1)), seed=int(rng.integers(0, 1000)),
              admit_after=int(rng.integers(1, 4)),
              zeros_until_admitted=bool(rng.random() < 0.3))


def _contents_valid(rng, spec):
  """A valid import: rows and pending ids (disjoint), their counts and steps."""
  k = int(rng.integers(0, 7))
  p = int(rng.integers(0, 4)) if spec["admit_after"] > 1 else 0
  ids = rng.choice(np.arange(-20, 40), size=k + p, replace=False).astype(np.int64)
  if k and rng.random() < 0.3:
    ids[0] = I64_MAX
  slots = 1 + len(spec["slot_initial_values"])
  return dict(ids=ids[:k],
              values=rng.normal(size=(k, slots, spec["dim"])).astype(np.float32),
              counts=rng.integers(1, 6, size=k).astype(np.int64),
              last_seen=rng.integers(0, 10, size=k).astype(np.int64),
              pending_ids=ids[k:],
              pending_counts=rng.integers(1, spec["admit_after"], size=p).astype(np.int64),
              pending_last_seen=rng.integers(0, 10, size=p).astype(np.int64))


class StoreModel:
  """The dynamic store as dicts (the documented behaviour)."""

  def __init__(self, spec):
    self.spec = spec
    self.rows = {}     # id -> [values [slots, dim] float64, count, last]
    self.pending = {}  # id -> [count, last]

  def load(self, c):
    _int_vector(c["ids"], "ids")
    for key in ("counts", "last_seen", "pending_ids", "pending_counts", "pending_last_seen"):
      _int_vector(c[key], key)
    k, p = c["ids"].size, c["pending_ids"].size
    v = c["values"]
    _refuse_if(v.dtype.kind != "f", "values are not floats")
    _refuse_if(v.shape != (k, 1 + len(self.spec["slot_initial_values"]), self.spec["dim"]),
               "values have the wrong shape")
    _refuse_if(c["counts"].size != k or c["last_seen"].size != k, "row fields differ in count")
    _refuse_if(c["pending_counts"].size != p or c["pending_last_seen"].size != p,
               "pending fields differ in count")
    _refuse_if(len(set(c["ids"].tolist())) != k, "repeated ids")
    _refuse_if(len(set(c["pending_ids"].tolist())) != p, "repeated pending ids")
    _refuse_if(bool(set(c["ids"].tolist()) & set(c["pending_ids"].tolist())),
               "an id both has a row and is pending")
    for key in ("counts", "last_seen", "pending_counts", "pending_last_seen"):
      _may_refuse_if(bool((c[key] < 0).any()), f"negative {key}")
    self.rows = {int(i): [v[j].astype(np.float32).astype(np.float64), int(c["counts"][j]),
                          int(c["last_seen"][j])] for j, i in enumerate(c["ids"].tolist())}
    self.pending = {int(i): [int(c["pending_counts"][j]), int(c["pending_last_seen"][j])]
                    for j, i in enumerate(c["pending_ids"].tolist())}

  def initial(self, key):
    s = self.spec
    if s["initializer"] == "zeros":
      return np.zeros(s["dim"])
    return oracles.dynamic_initial_row(key, s["dim"], s["initializer"], s["initializer_a"],
                                       s["initializer_b"], s["seed"])

  def value(self, key):
    if key in self.rows:
      return self.rows[key][0][0]
    if self.spec["zeros_until_admitted"]:
      return np.zeros(self.spec["dim"])
    return self.initial(key)

  def lookup(self, ids, counts, step, insert):
    if insert:
      seen = collections.OrderedDict()
      for i, c in zip(ids, counts):
        seen[i] = seen.get(i, 0) + c
      for i, c in seen.items():
        if i in self.rows:
          self.rows[i][1] += c
          self.rows[i][2] = max(self.rows[i][2], step)
          continue
        total = self.pending.get(i, [0, 0])[0] + c
        if total < self.spec["admit_after"]:
          self.pending[i] = [total, step]
          continue
        self.pending.pop(i, None)
        slots = [np.full(self.spec["dim"], v, np.float64)
                 for v in self.spec["slot_initial_values"]]
        self.rows[i] = [np.stack([self.initial(i)] + slots).astype(np.float32)
                        .astype(np.float64), total, step]
    return np.array([self.value(i) for i in ids]).reshape(len(ids), self.spec["dim"])

  def apply(self, kind, ids, grads, hp, step):
    applied = 0
    with np.errstate(all="ignore"):
      for i, g in zip(ids, grads):
        if i not in self.rows:
          continue
        values = self.rows[i][0]
        w, slots = oracles.keras_row_update(kind, hp, step, values[0], list(values[1:]), g)
        self.rows[i][0] = np.stack([w] + list(slots))
        applied += 1
    return applied

  def evict(self, step, max_unseen, max_rows):
    evicted = []
    if max_unseen > 0:
      for i in list(self.rows):
        if step - self.rows[i][2] >= max_unseen:
          evicted.append(i)
          del self.rows[i]
      for i in list(self.pending):
        if step - self.pending[i][1] >= max_unseen:
          del self.pending[i]
    if max_rows > 0 and len(self.rows) > max_rows:
      coldest = sorted(self.rows, key=lambda i: (self.rows[i][1], self.rows[i][2], i))
      for i in coldest[:len(self.rows) - max_rows]:
        evicted.append(i)
        del self.rows[i]
    return np.array(sorted(evicted), np.int64)

  def export(self):
    ids = sorted(self.rows)
    slots = 1 + len(self.spec["slot_initial_values"])
    pending = sorted(self.pending)
    return [np.array(ids, np.int64),
            np.array([self.rows[i][0] for i in ids]).reshape(len(ids), slots, self.spec["dim"]),
            np.array([self.rows[i][1] for i in ids], np.int64),
            np.array([self.rows[i][2] for i in ids], np.int64),
            np.array(pending, np.int64),
            np.array([self.pending[i][0] for i in pending], np.int64),
            np.array([self.pending[i][1] for i in pending], np.int64)]


class DynamicStore(Op):
  """One call on a dynamic store (`target`: lookup, apply, import_, evict,
  or create: a store from a malformed spec, then a lookup) after a valid
  import of some rows and pending ids. export() and stats() are checked
  after every call."""

  rtol, atol = 1e-4, 1e-5

  def __init__(self, target):
    self.target = target
    self.name = f"dynamic_store.{target}"
    self.MUTATIONS = dict(self.COMMON if target != "create" else {},
                          **getattr(self, target.upper().rstrip("_")))

  def valid(self, rng):
    spec = _spec_valid(rng)
    inp = dict(spec=spec, contents=_contents_valid(rng, spec), target=self.target)
    known = list(inp["contents"]["ids"]) + list(inp["contents"]["pending_ids"])
    n = int(rng.integers(0, 8))
    pool = np.array(known + list(rng.integers(-30, 60, size=4)), np.int64)
    if self.target in ("lookup", "create"):
      inp["ids"] = rng.choice(pool, size=n).astype(np.int64)
      inp["counts"] = rng.integers(1, 4, size=n).astype(np.int64)
      inp["step"] = int(rng.integers(10, 20))
      inp["insert"] = self.target == "lookup" and bool(rng.random() < 0.7)
    elif self.target == "apply":
      ids = np.unique(pool)
      inp["ids"] = rng.permutation(ids)[:n].astype(np.int64)
      n = inp["ids"].size
      inp["scalars"] = _scalars(rng, spec["kind"])
      inp["by_address"] = bool(rng.random() < 0.4)
      use_rows = rng.random() < 0.3
      rows = n + int(rng.integers(0, 3)) if use_rows else n
      inp["grad"] = rng.normal(size=(rows, spec["dim"])).astype(np.float32)
      inp["grad_rows"] = (rng.choice(rows, size=n, replace=False).astype(np.int32)
                          if use_rows else None)
      inp["kind"] = spec["kind"]
    elif self.target == "import_":
      inp["new"] = _contents_valid(rng, spec)
    elif self.target == "evict":
      inp["step"] = int(rng.integers(5, 20))
      inp["max_unseen_steps"] = int(rng.integers(0, 8))
      inp["max_rows"] = int(rng.integers(0, 6))
    return inp

  # -- mutations

  def _field(key, make, note, applies=None):
    def mutate(rng, inp):
      if applies and not applies(inp):
        return False
      value = make(rng, inp)
      if value is None:
        return False
      return _set(inp, key, value, note(value) if callable(note) else note)
    return mutate

  def _address(value):
    """An address replaced after the ids are resolved to addresses."""
    def mutate(rng, inp):
      if not inp.get("by_address") or inp["ids"].size == 0:
        return False
      i = _pick(rng, inp["ids"])
      inp["_override"] = (i, value)
      inp["_note"] = f"address [{i}] = {value}"
      return True
    return mutate

  COMMON = {}

  LOOKUP = {
      "counts_count": ("shape", _field("counts", lambda rng, inp: np.concatenate(
          [inp["counts"], [1]]), "one entry longer than ids", lambda inp: inp["insert"])),
      "counts_negative": ("negative", _field("counts", lambda rng, inp: (
          -inp["counts"] if inp["counts"].size else None), "negated",
          lambda inp: inp["insert"])),
      "counts_rank2": ("rank", _field("counts", lambda rng, inp: inp["counts"].reshape(-1, 1),
                                      "with shape [n, 1]", lambda inp: inp["insert"])),
      "step_vector": ("rank", _field("step", lambda rng, inp: np.array([inp["step"]]),
                                     "a vector")),
      "step_negative": ("negative", _field("step", lambda rng, inp: -5, "= -5",
                                           lambda inp: inp["insert"])),
      "step_int64_max": ("extreme", _field("step", lambda rng, inp: I64_MAX, "= 2**63-1")),
      "ids_int64_extremes": ("extreme", lambda rng, inp: (
          inp.__setitem__("counts", np.concatenate([inp["counts"], [1, 1, 1]])),
          _set(inp, "ids", np.concatenate([inp["ids"], [I64_MAX, I64_MIN, WRAP + 1]]),
               "with int64 extremes"))[1]),
      "ids_float": ("dtype", _field("ids", lambda rng, inp: inp["ids"] + 0.5, "float64 + 0.5")),
      "ids_rank2": ("rank", _field("ids", lambda rng, inp: inp["ids"].reshape(-1, 1),
                                   "with shape [n, 1] (flattened by the store)")),
      "ids_empty": ("empty", lambda rng, inp: (_set(inp, "ids", inp["ids"][:0], "empty"),
                                               inp.__setitem__("counts", inp["counts"][:0]))[0]),
  }

  APPLY = {
      "ids_repeated": ("order", _field("ids", lambda rng, inp: (
          np.concatenate([inp["ids"][:-1], inp["ids"][:1]]) if inp["ids"].size >= 2 else None),
          lambda v: f"repeats: {v.tolist()}")),
      "address_not_a_row": ("range", _address(10**6)),
      "address_negative": ("negative", _address(-2)),
      "address_int64_min": ("extreme", _address(I64_MIN)),
      "grad_rows_mismatch": ("shape", _field("grad", lambda rng, inp: np.concatenate(
          [inp["grad"], inp["grad"][:1]]) if inp["grad"].size else None,
          "with one row more", lambda inp: inp["grad_rows"] is None)),
      "grad_width": ("shape", _field("grad", lambda rng, inp: np.ones(
          [inp["grad"].shape[0], inp["grad"].shape[1] + 1], np.float32), "one column wider")),
      "grad_nonfinite": ("nonfinite", _field("grad", lambda rng, inp: (
          SparseApply._grad_nonfinite(rng, inp["grad"]) if inp["grad"].size else None),
          "with a non-finite value")),
      "grad_rank1": ("rank", _field("grad", lambda rng, inp: inp["grad"].ravel(), "flattened")),
      "grad_rows_out_of_range": ("range", _field("grad_rows", lambda rng, inp: (
          np.full([inp["ids"].size], inp["grad"].shape[0], np.int32)
          if inp["ids"].size else None), "all = grad's row count")),
      "grad_rows_wrap_int32": ("extreme", _field("grad_rows", lambda rng, inp: (
          WRAP + np.arange(inp["ids"].size, dtype=np.int64) if inp["ids"].size else None),
          "= 2**32 + [0, 1, ...]", lambda inp: inp["grad_rows"] is None)),
      "grad_rows_empty": ("empty", _field("grad_rows", lambda rng, inp: np.zeros([0], np.int32),
                                          "an empty array (documented: the same as none)",
                                          lambda inp: inp["grad_rows"] is None)),
      "ids_empty": ("empty", _field("ids", lambda rng, inp: inp["ids"][:0],
                                    "empty (gradient unchanged)",
                                    lambda inp: inp["grad_rows"] is None)),
      "ids_float": ("dtype", _field("ids", lambda rng, inp: inp["ids"] + 0.5, "float64 + 0.5",
                                    lambda inp: not inp["by_address"])),
      "kind_mismatch": ("value", lambda rng, inp: _set(
          inp, "kind", {"sgd": "adam", "adagrad": "ftrl", "adam": "sgd", "ftrl": "adagrad"}[
              inp["kind"]], "for a store with another optimizer's slots") and inp.__setitem__(
                  "scalars", _scalars(rng, inp["kind"])) is None),
      "adam_step_0": ("value", lambda rng, inp: inp["kind"] == "adam" and _set(
          inp, "scalars", inp["scalars"][:-1] + [0.0], "adam step = 0")),
      "scalar_nan": ("nonfinite", lambda rng, inp: _set(
          inp, "scalars", [float("nan")] + inp["scalars"][1:], "learning_rate = nan")),
  }

  def _new(key, make, note):
    def mutate(rng, inp):
      new = dict(inp["new"])
      value = make(rng, new)
      if value is None:
        return False
      new[key] = value
      inp["new"] = new
      inp["_note"] = f"import {key} {note}: {describe(value)}"
      return True
    return mutate

  IMPORT = {
      "counts_count": ("shape", _new("counts", lambda rng, c: np.concatenate(
          [c["counts"], [1]]), "one entry longer")),
      "last_seen_count": ("shape", _new("last_seen", lambda rng, c: c["last_seen"][:-1]
                                        if c["last_seen"].size else None, "one entry short")),
      "pending_counts_count": ("shape", _new("pending_counts", lambda rng, c: np.concatenate(
          [c["pending_counts"], [1]]), "one entry longer")),
      "values_shape": ("shape", _new("values", lambda rng, c: np.ones(
          [c["values"].shape[0], c["values"].shape[1] + 1, c["values"].shape[2]], np.float32),
          "one slot too many")),
      "values_rank2": ("rank", _new("values", lambda rng, c: c["values"][:, 0],
                                    "without the slot axis")),
      "values_nonfinite": ("nonfinite", _new("values", lambda rng, c: (
          SparseApply._grad_nonfinite(rng, c["values"]) if c["values"].size else None), "")),
      "ids_repeated": ("order", _new("ids", lambda rng, c: (
          np.concatenate([c["ids"][:-1], c["ids"][:1]]) if c["ids"].size >= 2 else None), "")),
      "pending_ids_repeated": ("order", _new("pending_ids", lambda rng, c: (
          np.concatenate([c["pending_ids"][:-1], c["pending_ids"][:1]])
          if c["pending_ids"].size >= 2 else None), "")),
      "pending_id_has_row": ("value", _new("pending_ids", lambda rng, c: (
          np.concatenate([c["ids"][:1], c["pending_ids"][1:]])
          if c["ids"].size and c["pending_ids"].size else None), "")),
      "counts_negative": ("negative", _new("counts", lambda rng, c: (
          -c["counts"] if c["counts"].size else None), "")),
      "last_seen_negative": ("negative", _new("last_seen", lambda rng, c: (
          -1 - c["last_seen"] if c["last_seen"].size else None), "")),
      "ids_float": ("dtype", _new("ids", lambda rng, c: (
          c["ids"] + 0.5 if c["ids"].size else None), "")),
      "empty": ("empty", lambda rng, inp: (
          inp.__setitem__("new", {k: v[:0] for k, v in inp["new"].items()}),
          _set(inp, "_empty", True, "every field empty"))[1]),
  }

  EVICT = {
      "step_negative": ("negative", _field("step", lambda rng, inp: -5, "= -5")),
      "step_int64_max": ("extreme", _field("step", lambda rng, inp: I64_MAX, "= 2**63-1")),
      "step_vector": ("rank", _field("step", lambda rng, inp: np.array([inp["step"]]),
                                     "a vector")),
      "max_unseen_negative": ("negative", _field("max_unseen_steps", lambda rng, inp: -3,
                                                 "= -3 (documented: off)")),
      "max_rows_negative": ("negative", _field("max_rows", lambda rng, inp: -1,
                                               "= -1 (documented: off)")),
      "max_unseen_int64_max": ("extreme", _field("max_unseen_steps", lambda rng, inp: I64_MAX,
                                                 "= 2**63-1")),
      "max_rows_int64_max": ("extreme", _field("max_rows", lambda rng, inp: I64_MAX,
                                               "= 2**63-1")),
  }

  def _spec(key, value, note=None):
    def mutate(rng, inp):
      spec = dict(inp["spec"])
      spec[key] = value
      inp["spec"] = spec
      inp["_note"] = f"spec.{key} = {value!r}" + (f" {note}" if note else "")
      return True
    return mutate

  CREATE = {
      "dim_0": ("value", _spec("dim", 0)),
      "dim_negative": ("negative", _spec("dim", -2)),
      "dim_huge": ("huge", _spec("dim", 2**40)),
      "admit_after_0": ("value", _spec("admit_after", 0)),
      "initializer_unknown": ("value", _spec("initializer", "glorot")),
      "initializer_a_nan": ("nonfinite", _spec("initializer_a", float("nan"))),
      "seed_int64_min": ("extreme", _spec("seed", I64_MIN)),
      "seed_2**64": ("extreme", _spec("seed", 2**64)),
      "slot_initial_nan": ("nonfinite", _spec("slot_initial_values", (float("nan"),))),
  }

  # -- oracle and call

  def _check_spec(self, spec):
    _refuse_if(spec["dim"] < 1, "dim < 1")
    _refuse_if(spec["admit_after"] < 1, "admit_after < 1")
    _refuse_if(spec["initializer"] not in ("zeros", "constant", "uniform", "normal",
                                           "truncated_normal"), "unknown initializer")
    _refuse_if(not I64_MIN <= spec["seed"] <= I64_MAX, "seed is not an int64")
    _check_bytes(4 * spec["dim"] * (1 + len(spec["slot_initial_values"])), "one row")

  def oracle(self, inp):
    spec = inp["spec"]
    self._check_spec(spec)
    model = StoreModel(spec)
    target = self.target
    if target != "create":
      model.load(inp["contents"])  # valid by construction
    result = None
    if target in ("lookup", "create"):
      ids, counts = inp["ids"], inp["counts"]
      _int_vector(ids.reshape(-1) if isinstance(ids, np.ndarray) and ids.dtype.kind in "iu"
                  else ids, "ids")
      ids = ids.reshape(-1).tolist()
      step = _int_scalar(inp["step"], "step")
      if inp["insert"]:
        _int_vector(counts, "counts")
        _refuse_if(counts.size != len(ids), "counts and ids differ in count")
        _may_refuse_if(bool((counts < 0).any()), "negative counts")
        _may_refuse_if(step < 0, "a negative step")
      rows = model.lookup(ids, counts.tolist(), step, inp["insert"])
      result = [rows, np.array([i in model.rows for i in ids], bool)]
    elif target == "apply":
      result = self._apply_oracle(inp, model)
    elif target == "import_":
      model.load(inp["new"])
    elif target == "evict":
      step = _int_scalar(inp["step"], "step")
      _may_refuse_if(step < 0, "a negative step")
      result = model.evict(step, int(inp["max_unseen_steps"]), int(inp["max_rows"]))
    out = dict(result=result, stats=[len(model.rows), len(model.pending)])
    if target != "create":
      out["state"] = model.export()
    return out

  def _apply_oracle(self, inp, model):
    kind = inp["kind"]
    _refuse_if(NUM_SLOTS[kind] != len(inp["spec"]["slot_initial_values"]),
               "the optimizer's slots are not the store's")
    hp, step = _hp_of(kind, inp["scalars"])
    ids = inp["ids"]
    _int_vector(ids, "ids")
    g = inp["grad"]
    _refuse_if(g.ndim != 2, "grad is not a matrix")
    n = ids.size
    gr = inp["grad_rows"]
    if gr is not None:
      _int_vector(gr, "grad_rows")
      if gr.size == 0:
        gr = None
    if gr is not None:
      _refuse_if(gr.size != n, "grad_rows and ids differ in count")
      _refuse_if(bool(((gr < 0) | (gr >= g.shape[0])).any()), "grad_rows out of range")
    elif n:
      _refuse_if(g.shape[0] != n, "grad rows != ids")
    _refuse_if(g.shape[1] != inp["spec"]["dim"], "grad width != dim")
    if inp["by_address"]:
      live = inp["_live"]  # address -> id, from the lookup in prepare
      real = [a for a in ids.tolist() if a != -1]
      _refuse_if(any(a not in live for a in real), "an address is not a live row")
      _refuse_if(len(set(real)) != len(real), "repeated addresses")
      keys = [live.get(a) for a in ids.tolist()]
    else:
      _refuse_if(len(set(ids.tolist())) != n, "repeated ids")
      keys = ids.tolist()
    read = gr.tolist() if gr is not None else list(range(n))
    grads = g[read].astype(np.float64) if n else np.zeros((0, g.shape[1]))
    return model.apply(kind, keys, grads, hp, step)

  def _make_spec(self, tfde, spec):
    return tfde.ops.DynamicTableSpec(
        dim=spec["dim"], slot_initial_values=tuple(spec["slot_initial_values"]),
        initializer=spec["initializer"], initializer_a=spec["initializer_a"],
        initializer_b=spec["initializer_b"], seed=spec["seed"],
        admit_after=spec["admit_after"], zeros_until_admitted=spec["zeros_until_admitted"])

  def prepare(self, inp, tf, tfde):
    if self.target == "create":
      return {"store": None}
    store = tfde.ops.dynamic_store(self._make_spec(tfde, inp["spec"]), "fuzz")
    c = inp["contents"]
    store.import_(*[tf.constant(c[k]) for k in (
        "ids", "values", "counts", "last_seen", "pending_ids", "pending_counts",
        "pending_last_seen")])
    if self.target == "apply" and inp["by_address"]:
      # Addresses of the known ids (and -1 for the rest), from a lookup that
      # changes nothing; the oracle learns which addresses are live.
      known = tf.constant(c["ids"])
      _, live = store.lookup(known, None, 0, insert=False)
      inp["_live"] = dict(zip(live.numpy().tolist(), c["ids"].tolist()))
      _, addresses = store.lookup(tf.constant(inp["ids"].astype(np.int64)), None, 0,
                                  insert=False)
      addresses = addresses.numpy()
      if "_override" in inp:
        i, value = inp["_override"]
        addresses[i] = value
      inp["ids"] = addresses
    return {"store": store}

  def state(self, ctx):
    if ctx["store"] is None or self.target == "create":
      return None
    return [x.numpy() for x in ctx["store"].export()]

  def call(self, inp, ctx, tf, tfde):
    target = self.target
    if target == "create":
      ctx["store"] = tfde.ops.dynamic_store(self._make_spec(tfde, inp["spec"]), "fuzz")
      target = "lookup"
    store = ctx["store"]
    if target == "lookup":
      rows, addresses = store.lookup(_t(tf, inp["ids"]), _t(tf, inp["counts"]),
                                     _t(tf, inp["step"]), insert=inp["insert"])
      result = [rows.numpy(), addresses.numpy()]
    elif target == "apply":
      gr = inp["grad_rows"]
      result = store.apply(inp["kind"], _t(tf, inp["ids"]), tf.constant(inp["grad"]),
                           [_t(tf, s) for s in inp["scalars"]],
                           None if gr is None else tf.constant(gr),
                           by_address=inp["by_address"]).numpy()
    elif target == "import_":
      c = inp["new"]
      store.import_(*[tf.constant(c[k]) for k in (
          "ids", "values", "counts", "last_seen", "pending_ids", "pending_counts",
          "pending_last_seen")])
      result = None
    else:
      result = store.evict(_t(tf, inp["step"]), inp["max_unseen_steps"],
                           inp["max_rows"]).numpy()
    stats = store.stats().numpy()
    return dict(result=result, stats=stats)

  def check(self, got, want, inp):
    if self.target in ("lookup", "create"):
      rows, addresses = got["result"]
      m = mismatch(rows, want["result"][0], self.rtol, self.atol, "rows")
      if m:
        return m
      present = want["result"][1]
      m = mismatch(addresses >= 0, present, what="has a row (address >= 0)")
      if m:
        return m
      ids = np.asarray(inp["ids"]).reshape(-1).tolist()
      by_id = {}
      for i, a in zip(ids, addresses.tolist()):
        if a >= 0 and by_id.setdefault(i, a) != a:
          return f"id {i} has two addresses"
      if len(set(by_id.values())) != len(by_id):
        return "two ids share an address"
    elif self.target in ("apply", "evict"):
      m = mismatch(got["result"], want["result"])
      if m:
        return m
    return mismatch(got["stats"][:2], np.array(want["stats"]), what="stats[:2]")


OPS = [Unique(), Partition(), Combine(), CombineGrad(), BagGradients(), SplitRows(),
       GatherFromTables(), CombineFromTables(), SparseApply(bags=False),
       SparseApply(bags=True), DynamicStore("lookup"), DynamicStore("apply"),
       DynamicStore("import_"), DynamicStore("evict"), DynamicStore("create")]
OP_NAMES = [op.name for op in OPS]
# One cycle of cases: every op with each of its mutations once, and two
# valid calls.
PAIRS = [(op, m) for op in OPS for m in ["valid", "valid"] + sorted(op.MUTATIONS)]
CYCLE = len(PAIRS)


@functools.lru_cache(maxsize=16)
def _schedule(seed, cycle):
  """The order of the pairs in a cycle: each cycle shuffled by the seed."""
  return np.random.default_rng([seed, cycle, 7]).permutation(CYCLE)
ALLOWED = ("InvalidArgumentError", "ValueError", "ResourceExhaustedError")


# ---------------------------------------------------------------- cases


class Case:
  def __init__(self, seed, index):
    self.seed, self.index = seed, index
    self.op, self.mutation = PAIRS[_schedule(seed, index // CYCLE)[index % CYCLE]]
    self.category = "valid" if self.mutation == "valid" else self.op.MUTATIONS[self.mutation][0]
    rng = np.random.default_rng([seed, index, 1])
    for _ in range(50):
      inp = self.op.valid(rng)
      inp["_note"] = "valid"
      if self.mutation == "valid" or self.op.MUTATIONS[self.mutation][1](rng, inp):
        break
    else:
      inp["_note"] = "valid (the mutation never applied)"
      self.mutation, self.category = "valid", "valid"
    self.inputs = inp

  def describe(self):
    parts = [self.inputs["_note"]]
    for k, v in self.inputs.items():
      if not k.startswith("_") and k != "contents":
        parts.append(f"{k}={describe(v, 4)}")
    return "; ".join(parts)[:600]


def _error_kind(e):
  return type(e).__name__


def run_job(case, backend, tf, tfde):
  """Runs one case on one backend (in a child): the job's record."""
  op, inp = case.op, case.inputs
  record = dict(index=case.index, backend=backend, op=op.name, mutation=case.mutation,
                category=case.category)
  with tfde.ops.backend(backend):
    try:
      ctx = op.prepare(inp, tf, tfde)
    except Exception as e:  # noqa: BLE001 (a valid set-up must work)
      record.update(outcome="setup-error", detail=f"{_error_kind(e)}: {_first_line(e)}")
      return record
    del _may_refuse[:]
    try:
      want = op.oracle(inp)
      verdict = None
    except Refuse as r:
      want, verdict = None, str(r)
    either = "; ".join(_may_refuse)
    record["oracle"] = ("valid" if verdict is None and not either else
                        f"either (result or refusal): {either}" if verdict is None else
                        f"refuse: {verdict}")
    before = op.state(ctx)
    error = None
    try:
      got = op.call(inp, ctx, tf, tfde)
    except Exception as e:  # noqa: BLE001 (classified below)
      error = e
    try:
      after = op.state(ctx)
    except Exception as e:  # noqa: BLE001
      after = f"unreadable: {_error_kind(e)}: {_first_line(e)}"
  if error is not None:
    kind = _error_kind(error)
    record["error"] = kind
    record["detail"] = _first_line(error)
    allowed = kind in ALLOWED or (kind == "TypeError" and case.category in ("dtype", "arity"))
    if not allowed:
      record["outcome"] = "bad-error"
    else:
      record["outcome"] = "error" if verdict is not None or either else "refused"
    record["state_changed"] = not (isinstance(after, list) or after is None) or \
        not _state_equal(before, after)
    return record
  if verdict is not None:
    record["outcome"] = "accepted"
    record["detail"] = f"no error (the oracle refuses: {verdict})"
    return record
  problem = op.check(got, want, inp)
  if problem is None and "state" in want:
    if isinstance(after, str):
      problem = f"state {after}"
    else:
      problem = mismatch(after, want["state"], op.rtol, op.atol, "state")
  elif problem is None and before is not None and not _state_equal(before, after):
    problem = "the state changed"
  record["outcome"] = "ok" if problem is None else "wrong"
  if problem:
    record["detail"] = problem
  return record


def _first_line(e):
  text = str(e).strip() or repr(e)
  line = text.splitlines()[0] if text else ""
  # TF prefixes eager errors with the function node; keep the message.
  line = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", line)
  return line[:300]


def jobs_of(count):
  """Job j is case j // 2 on BACKENDS[j % 2]."""
  return 2 * count


def child_main(args):
  """Runs jobs [first, last) and prints one JSON line per job."""
  import resource  # pylint: disable=g-import-not-at-top
  resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP + (2 << 30), MEMORY_CAP + (2 << 30)))
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tfde.ops  # pylint: disable=g-import-not-at-top
  if not tfde.ops.kernels_available():
    print(json.dumps(dict(fatal=f"op library unavailable: {tfde.ops.native.load_error()}")),
          flush=True)
    return 3
  print(json.dumps(dict(ready=True)), flush=True)
  for job in range(args.first, args.last):
    case = Case(args.seed, job // 2)
    backend = BACKENDS[job % 2]
    print(json.dumps(dict(start=job)), flush=True)
    t0 = time.time()
    record = run_job(case, backend, tf, tfde)
    record["job"] = job
    record["seconds"] = round(time.time() - t0, 3)
    print(json.dumps(record), flush=True)
  return 0


# ---------------------------------------------------------------- parent


def _run_child(seed, first, last, timeout, log):
  """Runs jobs [first, last) in one child: (records, the job it died in
  or None, how it died)."""
  cmd = [sys.executable, "-m", "tests.fuzz_cases", "--child", "--seed", str(seed),
         "--first", str(first), "--last", str(last)]
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  # Without oneDNN's options TF uses its plain CPU allocator, which fails an
  # allocation at once; oneDNN's retries one for 10 s before
  # ResourceExhaustedError.
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0",
             PYTHONWARNINGS="ignore")
  env.pop("TFDE_OPS", None)
  with tempfile.TemporaryFile() as err:
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=err)
    records, started, buffer = [], None, b""
    deadline = time.time() + timeout + 120  # the first job also waits for TF's import
    died = None
    while True:
      ready, _, _ = select.select([proc.stdout], [], [], 1.0)
      if ready:
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
          break
        buffer += chunk
        while b"\n" in buffer:
          line, buffer = buffer.split(b"\n", 1)
          try:
            msg = json.loads(line)
          except ValueError:
            continue
          if "fatal" in msg:
            proc.kill()
            proc.wait()
            raise RuntimeError(msg["fatal"])
          if "start" in msg:
            started = msg["start"]
            deadline = time.time() + timeout
          elif "job" in msg:
            records.append(msg)
            started = None
      elif time.time() > deadline:
        proc.kill()
        died = f"hang (no result in {timeout} s)"
        break
    rc = proc.wait()
    err.seek(0)
    why = _why(err.read().decode(errors="replace"))
  if died is None and rc != 0:
    died = (f"signal {-rc} ({_signal_name(-rc)})" if rc < 0 else f"exit code {rc}")
  if died is None:
    return records, None, None
  done = records[-1]["job"] + 1 if records else first
  crashed = started if started is not None else done
  how = f"{died}: {why}" if why else died
  if log:
    log(f"  job {crashed} died: {how}")
  return records, crashed, how


def _why(stderr):
  """The line of a child's stderr that says why it died, if any."""
  lines = [l.strip() for l in stderr.splitlines() if l.strip()]
  for pattern in (r"Check failed", r"terminate called|what\(\):", r"^F\d{4} ",
                  r"Fatal Python error", r"Error|error"):
    hits = [l for l in lines if re.search(pattern, l)]
    if hits:
      return re.sub(r"^[FEW]\d{4} [\d:.]+\s+\d+ ", "", hits[-1])[:300]
  return ""


def _signal_name(sig):
  import signal  # pylint: disable=g-import-not-at-top
  try:
    return signal.Signals(sig).name
  except ValueError:
    return "?"


def _crash_record(seed, job, how, confirmed):
  case = Case(seed, job // 2)
  return dict(job=job, index=case.index, backend=BACKENDS[job % 2], op=case.op.name,
              mutation=case.mutation, category=case.category, outcome="crash",
              detail=how + ("" if confirmed else
                            " (not when run again alone: intermittent, or set off by an "
                            "earlier job in the same process)"))


def run(seed, count, timeout=120, confirm=True, log=None):
  """Every job of cases [0, count) under `seed`: records, by job."""
  total = jobs_of(count)
  records = {}
  first = 0
  while first < total:
    got, crashed, how = _run_child(seed, first, total, timeout, log)
    for r in got:
      records[r["job"]] = r
    if crashed is None:
      break
    confirmed = True
    if confirm:
      _, again, _ = _run_child(seed, crashed, crashed + 1, timeout, None)
      confirmed = again == crashed
    records[crashed] = _crash_record(seed, crashed, how, confirmed)
    first = crashed + 1
  for job in range(total):
    if job not in records:
      records[job] = _crash_record(seed, job, "no record", True)
  return records


# ---------------------------------------------------------------- findings


FAILING = ("crash", "wrong", "accepted", "bad-error", "setup-error")


def findings(seed, records):
  """Failures, as dicts (op, kind, who, mutation, index, detail, text):
  crashes, wrong results, accepted malformed input, disallowed errors
  (kind = the outcome), the state changed on an error ("state-changed"),
  and cases one backend refuses and the other does not ("disagree")."""
  out = []
  by_case = collections.defaultdict(dict)
  for r in records.values():
    by_case[r["index"]][r["backend"]] = r
  for index in sorted(by_case):
    jobs = by_case[index]
    case = Case(seed, index)
    where = f"case {index} ({case.describe()})"

    def add(kind, who, detail):
      out.append(dict(op=case.op.name, kind=kind, who=who, mutation=case.mutation,
                      index=index, detail=detail.strip(),
                      text=f"{who}: {kind}: {detail.strip()} -- {where}"))

    failing = {b: r for b, r in jobs.items() if r["outcome"] in FAILING}
    if len(failing) == 2 and len({r["outcome"] for r in failing.values()}) == 1:
      r = failing["kernels"]
      add(r["outcome"], "both", f"{r.get('error', '')} {r.get('detail', '')}")
    else:
      for backend, r in sorted(failing.items()):
        add(r["outcome"], backend, f"{r.get('error', '')} {r.get('detail', '')}")
    for backend, r in sorted(jobs.items()):
      if r.get("state_changed"):
        add("state-changed", backend, f"on {r.get('error')}: {r.get('detail')}")
    k, t = jobs.get("kernels"), jobs.get("reference")
    if k and t and "crash" not in (k["outcome"], t["outcome"]):
      refused = lambda r: r["outcome"] in ("error", "refused", "bad-error")
      if refused(k) != refused(t):
        who, r = ("kernels", k) if refused(k) else ("reference", t)
        add("disagree", f"only {who} refuses",
            f"{r.get('error', '')} {r.get('detail', '')}")
  return out


def _normalise(message):
  return re.sub(r"-?\d+(\.\d+)?(e[+-]?\d+)?", "#", message)[:160]


def summary(seed, records, seconds=None):
  """A text summary: cases and jobs, outcomes, distinct errors, and the
  findings grouped by op, mutation, kind and backend, with an example."""
  lines = []
  cases = len({r["index"] for r in records.values()})
  outcomes = collections.Counter(r["outcome"] for r in records.values())
  errors = collections.Counter()
  for r in records.values():
    if r.get("error"):
      errors[(r["op"], r["error"], _normalise(r.get("detail", "")))] += 1
  found = findings(seed, records)
  took = f" in {seconds:.0f} s" if seconds is not None else ""
  lines.append(f"tfde fuzz: seed {seed}, {cases} cases tried ({len(records)} jobs: each "
               f"case on {' and '.join(BACKENDS)}){took}")
  lines.append("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
  lines.append(f"distinct errors: {len(errors)} (by op, type and message, numbers elided)")
  for (op, kind, message), n in sorted(errors.items()):
    lines.append(f"  {n:5d}  {op}: {kind}: {message}")
  groups = collections.defaultdict(list)
  for f in found:
    groups[(f["op"], f["mutation"], f["kind"], f["who"])].append(f)
  lines.append(f"findings: {len(found)} in {len(groups)} groups "
               "(op / mutation / kind / who: cases, an example)")
  for key, fs in sorted(groups.items()):
    example = fs[0]
    lines.append(f"  {' / '.join(key)}: {len(fs)} case(s) {[f['index'] for f in fs][:8]}")
    lines.append(f"      {example['detail'][:240]}")
    lines.append(f"      case {example['index']}: {Case(seed, example['index']).describe()[:300]}")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--seed", type=int, default=int(os.environ.get("FUZZ_SEED", 1)))
  parser.add_argument("--cases", type=int, default=int(os.environ.get("FUZZ_CASES", 3000)))
  parser.add_argument("--timeout", type=int, default=120, help="seconds per job")
  parser.add_argument("--no-confirm", action="store_true",
                      help="do not re-run a crashed job alone")
  parser.add_argument("--json", help="write every record to this file")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument("--last", type=int, default=0, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    return child_main(args)
  t0 = time.time()
  log = lambda text: print(text, file=sys.stderr, flush=True)
  log(f"tfde fuzz: seed {args.seed}, {args.cases} cases, each on both backends")
  records = run(args.seed, args.cases, args.timeout, not args.no_confirm, log)
  if args.json:
    with open(args.json, "w") as f:
      json.dump([records[j] for j in sorted(records)], f, indent=0)
  print(summary(args.seed, records, time.time() - t0))
  return 1 if findings(args.seed, records) else 0


if __name__ == "__main__":
  sys.exit(main())
