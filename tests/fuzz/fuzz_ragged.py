"""The ragged batch (inverse, row_splits, weights, combiner) of the fuzz's
combining ops: random valid batches, the mutations they share, the
batch's contract as the oracles check it, and each id's coefficient.
"""

import numpy as np

from tests.fuzz.fuzz_oracle import I32_MAX
from tests.fuzz.fuzz_oracle import I64_MAX
from tests.fuzz.fuzz_oracle import I64_MIN
from tests.fuzz.fuzz_oracle import WRAP
from tests.fuzz.fuzz_oracle import _int_vector
from tests.fuzz.fuzz_oracle import _pick
from tests.fuzz.fuzz_oracle import _refuse_if
from tests.fuzz.fuzz_oracle import _set


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
