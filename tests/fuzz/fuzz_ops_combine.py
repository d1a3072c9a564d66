"""Fuzz cases of the combining ops: embedding_combine, and its backward
halves embedding_combine_grad and bag_gradients.
"""

import numpy as np

from tests.fuzz.fuzz_oracle import I32_MAX
from tests.fuzz.fuzz_oracle import I64_MIN
from tests.fuzz.fuzz_oracle import WRAP
from tests.fuzz.fuzz_oracle import Op
from tests.fuzz.fuzz_oracle import _check_bytes
from tests.fuzz.fuzz_oracle import _int_scalar
from tests.fuzz.fuzz_oracle import _pick
from tests.fuzz.fuzz_oracle import _refuse_if
from tests.fuzz.fuzz_oracle import _set
from tests.fuzz.fuzz_oracle import _t
from tests.fuzz.fuzz_oracle import mismatch
from tests.fuzz.fuzz_ragged import RAGGED_MUTATIONS
from tests.fuzz.fuzz_ragged import _check_ragged
from tests.fuzz.fuzz_ragged import _coefficients
from tests.fuzz.fuzz_ragged import _ragged_valid
from tests.support import oracles

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


def _output_grad_valid(rng):
  """A valid ragged batch with an output gradient and its num_unique."""
  num_unique, dim = int(rng.integers(1, 12)), int(rng.integers(1, 6))
  inp = _ragged_valid(rng, num_unique)
  inp["num_unique"] = num_unique
  inp["grad"] = rng.normal(size=(inp["row_splits"].size - 1, dim)).astype(np.float32)
  return inp


class CombineGrad(Op):
  name = "embedding_combine_grad"

  def valid(self, rng):
    return _output_grad_valid(rng)

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
    return _output_grad_valid(rng)

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
