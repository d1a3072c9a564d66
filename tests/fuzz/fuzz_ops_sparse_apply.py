"""Fuzz cases of sparse_apply (rows updated by SGD, Adagrad, row-wise
Adagrad, Adam or FTRL,
from gradient rows or from bags), with the numpy updates and slots they
are checked against.
"""

import numpy as np

from tests.fuzz.fuzz_oracle import I64_MAX
from tests.fuzz.fuzz_oracle import I64_MIN
from tests.fuzz.fuzz_oracle import WRAP
from tests.fuzz.fuzz_oracle import Op
from tests.fuzz.fuzz_oracle import _float_scalar
from tests.fuzz.fuzz_oracle import _int_vector
from tests.fuzz.fuzz_oracle import _pick
from tests.fuzz.fuzz_oracle import _refuse_if
from tests.fuzz.fuzz_oracle import _set
from tests.fuzz.fuzz_oracle import _t
from tests.fuzz.fuzz_oracle import describe
from tests.support import oracles

# ---- sparse_apply


HP = {
    "sgd": dict(learning_rate=0.3),
    "adagrad": dict(learning_rate=0.2, epsilon=1e-7),
    "rowwise_adagrad": dict(learning_rate=0.2, epsilon=1e-8),
    "adam": dict(learning_rate=0.05, beta_1=0.8, beta_2=0.95, epsilon=1e-7),
    "ftrl": dict(learning_rate=0.1, l1=0.01, l2=0.02, l2_shrinkage=0.03, beta=0.1,
                 learning_rate_power=-0.5),
}
SCALAR_NAMES = {"sgd": ["learning_rate"], "adagrad": ["learning_rate", "epsilon"],
                "rowwise_adagrad": ["learning_rate", "epsilon"],
                "adam": ["learning_rate", "beta_1", "beta_2", "epsilon", "step"],
                "ftrl": ["learning_rate", "l1", "l2", "l2_shrinkage", "beta",
                         "learning_rate_power"]}
NUM_SLOTS = {"sgd": 0, "adagrad": 1, "rowwise_adagrad": 1, "adam": 2, "ftrl": 2}
SLOT_INITIAL = {"sgd": (), "adagrad": (0.1,), "rowwise_adagrad": (0.0,), "adam": (0.0, 0.0),
                "ftrl": (0.1, 0.0)}


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
  elif kind == "rowwise_adagrad":
    slots = [rng.uniform(0.1, 1.0, size=(shape[0], 1))]  # one value per row
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
    slot_shape = (table.shape[0], 1) if kind == "rowwise_adagrad" else table.shape
    for v in inp["slots"]:
      _refuse_if(v.shape != slot_shape, "a slot's shape is not the table's (row-wise: [V, 1])")
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
