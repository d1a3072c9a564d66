"""What the fuzz's oracles are made of (tests/fuzz/fuzz_cases.py): the limits,
the Refuse verdict and the reasons a call may also be refused, checks of
one input, describe(), mismatch() between a result and the oracle's, the
comparison of state snapshots, and the Op base class every op's cases
derive from.
"""

import os

import numpy as np

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


def _pick(rng, x):
  return int(rng.integers(0, x.size))


def _set(inp, key, value, note):
  inp[key] = value
  inp["_note"] = f"{key} {note}"
  return True


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
