"""Independent numpy oracles: plain loops and textbook formulas, written
without reference to tfde's code."""

import numpy as np


def unique_first_appearance(ids):
  ids = np.asarray(ids).ravel()
  unique, inverse, counts = [], [], []
  index_of = {}
  for x in ids.tolist():
    if x not in index_of:
      index_of[x] = len(unique)
      unique.append(x)
      counts.append(0)
    counts[index_of[x]] += 1
    inverse.append(index_of[x])
  return np.array(unique, ids.dtype), np.array(inverse, np.int64), np.array(counts)


def combine(table, ids_per_sample, weights_per_sample=None, combiner="sum"):
  """table[V, D]; ids_per_sample: list of lists. Returns [B, D] float64."""
  table = np.asarray(table, np.float64)
  out = np.zeros((len(ids_per_sample), table.shape[1]))
  for b, ids in enumerate(ids_per_sample):
    ws = ([1.0] * len(ids) if weights_per_sample is None
          else list(weights_per_sample[b]))
    acc = np.zeros(table.shape[1])
    for i, w in zip(ids, ws):
      acc += w * table[i]
    if combiner == "mean":
      s = sum(ws)
      acc = acc / s if s != 0 else np.zeros_like(acc)
    elif combiner == "sqrtn":
      s = np.sqrt(sum(w * w for w in ws))
      acc = acc / s if s != 0 else np.zeros_like(acc)
    out[b] = acc
  return out


def combine_grad_dense(num_rows, grad, ids_per_sample, weights_per_sample=None,
                       combiner="sum"):
  """d(sum(grad * combine(table)))/d table, as a dense [V, D] array."""
  grad = np.asarray(grad, np.float64)
  out = np.zeros((num_rows, grad.shape[1]))
  for b, ids in enumerate(ids_per_sample):
    ws = ([1.0] * len(ids) if weights_per_sample is None
          else list(weights_per_sample[b]))
    if combiner == "sum":
      scale = 1.0
    elif combiner == "mean":
      scale = 1.0 / sum(ws) if sum(ws) != 0 else 0.0
    else:
      s = np.sqrt(sum(w * w for w in ws))
      scale = 1.0 / s if s != 0 else 0.0
    for i, w in zip(ids, ws):
      out[i] += w * scale * grad[b]
  return out


def keras_row_update(kind, hp, step, w, slots, g):
  """One row of Keras 3's update rule at 1-based `step`: returns the new
  row and slots (lists of float64 arrays). hp as NumpyOptimizer's."""
  g = np.asarray(g, np.float64)
  lr = hp["learning_rate"]
  if kind == "sgd":
    return w - lr * g, []
  if kind == "adagrad":
    acc = slots[0] + g * g
    return w - lr * g / np.sqrt(acc + hp.get("epsilon", 1e-7)), [acc]
  if kind == "rowwise_adagrad":
    # FBGEMM's EXACT_ROWWISE_ADAGRAD: one accumulator per row.
    acc = slots[0] + np.mean(g * g)
    return w - g * lr / (np.sqrt(acc) + hp.get("epsilon", 1e-8)), [acc]
  if kind == "adam":
    b1, b2 = hp.get("beta_1", 0.9), hp.get("beta_2", 0.999)
    alpha = lr * np.sqrt(1 - b2 ** step) / (1 - b1 ** step)
    m = slots[0] + (g - slots[0]) * (1 - b1)
    v = slots[1] + (g * g - slots[1]) * (1 - b2)
    return w - m * alpha / (np.sqrt(v) + hp.get("epsilon", 1e-7)), [m, v]
  if kind == "ftrl":
    p = -hp.get("learning_rate_power", -0.5)
    l1 = hp.get("l1", 0.0)
    l2 = hp.get("l2", 0.0) + hp.get("beta", 0.0) / (2 * lr)
    shrink = hp.get("l2_shrinkage", 0.0)
    acc, linear = slots
    new_acc = acc + g * g
    linear = linear + g + 2 * shrink * w - (new_acc ** p - acc ** p) / lr * w
    quad = new_acc ** p / lr + 2 * l2
    return (np.clip(linear, -l1, l1) - linear) / quad, [new_acc, linear]
  raise ValueError(kind)


def initial_slots(kind, hp, dim):
  init = hp.get("initial_accumulator_value", 0.1)
  return {"sgd": [], "adagrad": [np.full(dim, init)],
          "rowwise_adagrad": [np.full(1, hp.get("initial_accumulator_value", 0.0))],
          "adam": [np.zeros(dim), np.zeros(dim)],
          "ftrl": [np.full(dim, init), np.zeros(dim)]}[kind]


class NumpyOptimizer:
  """Keras 3 update rules (keras/src/optimizers/*.py), applied to rows."""

  def __init__(self, kind, shape, **hp):
    self.kind = kind
    self.hp = hp
    self.step = 0
    self.slots = [np.tile(s, (shape[0], 1)) for s in initial_slots(kind, hp, shape[1])]

  def apply(self, table, rows, grads):
    """Applies grads[k] to table[rows[k]] in place (rows unique)."""
    self.step += 1
    for r, g in zip(rows, grads):
      table[r], new_slots = keras_row_update(
          self.kind, self.hp, self.step, table[r], [s[r] for s in self.slots], g)
      for s, value in zip(self.slots, new_slots):
        s[r] = value


# ---- dynamic tables: a dict of rows

_MASK = (1 << 64) - 1


def _mix64(x):
  """splitmix64's finaliser, on Python ints."""
  x ^= x >> 30
  x = (x * 0xBF58476D1CE4E5B9) & _MASK
  x ^= x >> 27
  x = (x * 0x94D049BB133111EB) & _MASK
  return x ^ (x >> 31)


def dynamic_initial_row(key, dim, kind, a, b, seed):
  """The documented per-id initial value of a dynamic table's row: uniform
  draws u(d, k) = (top 24 bits of mix(mix(id ^ mix(seed)) ^ (d << 3 | k)) +
  0.5) / 2^24, Box-Muller for normals, truncation by up to 4 redraws."""
  base = _mix64((key & _MASK) ^ _mix64(seed & _MASK))

  def u(d, k):
    return ((_mix64(base ^ ((d << 3) | k)) >> 40) + 0.5) / 2.0 ** 24

  def normal(d, k):
    return np.sqrt(-2.0 * np.log(u(d, 2 * k))) * np.cos(2.0 * np.pi * u(d, 2 * k + 1))

  row = np.zeros(dim)
  for d in range(dim):
    if kind == "constant":
      row[d] = a
    elif kind == "uniform":
      row[d] = a + (b - a) * u(d, 0)
    elif kind == "normal":
      row[d] = a + b * normal(d, 0)
    elif kind == "truncated_normal":
      draws = [normal(d, k) for k in range(4)]
      z = next((z for z in draws if abs(z) <= 2.0), float(np.clip(draws[-1], -2, 2)))
      row[d] = a + b * z
  return row.astype(np.float32).astype(np.float64)


class DynamicTableOracle:
  """A dynamic table as a dict of id -> row: admission after K sightings,
  training of admitted rows only, eviction by age and by least frequency,
  with Keras's update rules. One call of `train_step` is one global step."""

  def __init__(self, dim, kind, hp, init=("uniform", -1.0, 1.0), seed=0,
               admit_after=1, zeros_until_admitted=False, evict_after_steps=None,
               max_rows=None, evict_every_steps=1):
    self.dim, self.kind, self.hp = dim, kind, hp
    self.init, self.seed = init, seed
    self.admit_after = admit_after
    self.zeros_until_admitted = zeros_until_admitted
    self.evict_after_steps, self.max_rows = evict_after_steps, max_rows
    self.evict_every_steps = evict_every_steps
    self.rows = {}     # id -> dict(w, slots, count, last)
    self.pending = {}  # id -> [count, last]
    self.step = 0

  def initial(self, key):
    kind, a, b = self.init
    if kind == "zeros":
      return np.zeros(self.dim)
    return dynamic_initial_row(key, self.dim, kind, a, b, self.seed)

  def value(self, key):
    if key in self.rows:
      return self.rows[key]["w"]
    return np.zeros(self.dim) if self.zeros_until_admitted else self.initial(key)

  def see(self, key, times, step):
    if key in self.rows:
      row = self.rows[key]
      row["count"] += times
      row["last"] = max(row["last"], step)
      return
    seen = self.pending.get(key, [0, 0])[0] + times
    if seen < self.admit_after:
      self.pending[key] = [seen, step]
      return
    self.pending.pop(key, None)
    self.rows[key] = dict(w=self.initial(key), slots=initial_slots(self.kind, self.hp, self.dim),
                          count=seen, last=step)

  def lookup(self, ids):
    return np.array([self.value(k) for k in ids])

  def train_step(self, features):
    """features: list of (ids per sample, weights per sample or None,
    combiner, target [B, dim], loss scale). Loss = scale * sum of squared
    errors. Returns the outputs (computed before the update)."""
    step = self.step + 1
    counts = {}
    for ids, _, _, _, _ in features:
      for sample in ids:
        for k in sample:
          counts[k] = counts.get(k, 0) + 1
    for k, c in counts.items():
      self.see(k, c, step)
    keys = sorted(counts)
    index = {k: i for i, k in enumerate(keys)}
    table = np.array([self.value(k) for k in keys]).reshape(len(keys), self.dim)
    grads = np.zeros_like(table)
    outputs = []
    for ids, weights, combiner, target, scale in features:
      local = [[index[k] for k in sample] for sample in ids]
      out = combine(table, local, weights, combiner)
      outputs.append(out)
      grads += combine_grad_dense(len(keys), 2.0 * scale * (out - target), local,
                                  weights, combiner)
    for k in keys:
      if k in self.rows:
        row = self.rows[k]
        row["w"], row["slots"] = keras_row_update(self.kind, self.hp, step, row["w"],
                                                  row["slots"], grads[index[k]])
    self.step = step
    if step % self.evict_every_steps == 0:
      self.evict(step)
    return outputs

  def evict(self, step):
    evicted = []
    if self.evict_after_steps:
      for k in list(self.rows):
        if step - self.rows[k]["last"] >= self.evict_after_steps:
          evicted.append(k)
          del self.rows[k]
      for k in list(self.pending):
        if step - self.pending[k][1] >= self.evict_after_steps:
          del self.pending[k]
    if self.max_rows and len(self.rows) > self.max_rows:
      coldest = sorted(self.rows, key=lambda k: (self.rows[k]["count"],
                                                 self.rows[k]["last"], k))
      for k in coldest[:len(self.rows) - self.max_rows]:
        evicted.append(k)
        del self.rows[k]
    return sorted(evicted)
