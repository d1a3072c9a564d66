"""Fuzz cases of the dynamic store (lookup, apply, import_, evict, and
create from a malformed spec), checked against StoreModel, the store as
dicts.
"""

import collections

import numpy as np

from tests.fuzz.fuzz_ops_sparse_apply import HP
from tests.fuzz.fuzz_ops_sparse_apply import NUM_SLOTS
from tests.fuzz.fuzz_ops_sparse_apply import SLOT_INITIAL
from tests.fuzz.fuzz_ops_sparse_apply import SparseApply
from tests.fuzz.fuzz_ops_sparse_apply import _hp_of
from tests.fuzz.fuzz_ops_sparse_apply import _scalars
from tests.fuzz.fuzz_oracle import I64_MAX
from tests.fuzz.fuzz_oracle import I64_MIN
from tests.fuzz.fuzz_oracle import WRAP
from tests.fuzz.fuzz_oracle import Op
from tests.fuzz.fuzz_oracle import _check_bytes
from tests.fuzz.fuzz_oracle import _int_scalar
from tests.fuzz.fuzz_oracle import _int_vector
from tests.fuzz.fuzz_oracle import _may_refuse_if
from tests.fuzz.fuzz_oracle import _pick
from tests.fuzz.fuzz_oracle import _refuse_if
from tests.fuzz.fuzz_oracle import _set
from tests.fuzz.fuzz_oracle import _t
from tests.fuzz.fuzz_oracle import describe
from tests.fuzz.fuzz_oracle import mismatch
from tests.support import oracles

# ---- the dynamic store


# Dynamic stores keep every slot as wide as a row: no row-wise kind.
DYNAMIC_KINDS = sorted(k for k in HP if k != "rowwise_adagrad")


def _spec_valid(rng):
  kind = str(rng.choice(DYNAMIC_KINDS))
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
