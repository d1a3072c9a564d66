"""The peers' side of bench/ops_bench.py: torch `nn.EmbeddingBag` and
FBGEMM TBE CPU on the data ops_bench.py hands over, run in their own
environment (`make peers-env`, which ops_bench.py runs this script in).

  peers_bench.py time IDS.npz REPS      -> JSON {system: median ms} on stdout
  peers_bench.py variants FORMS.npz REPS -> JSON {variant: torch median ms}
      torch's forward for each combiner (sum, mean, sqrtn), with and
      without per-id weights, on dense and ragged ids (bench/forward_bench.py)
  peers_bench.py step CASE.npz OUT.npz
      one optimizer step (sum combiner, loss = sum(outputs * targets)) from
      the tables in CASE.npz: SGD (torch optim.SGD, FBGEMM EXACT_SGD) or
      lazy Adam (torch optim.SparseAdam; FBGEMM's CPU TBE has no Adam);
      writes each peer's tables after it to OUT.npz.

IDS.npz holds `ids_0..ids_{T-1}` ([batch, hot] int64) and `vocab`, `dim`.
Only numpy, torch and (optionally) fbgemm_gpu are imported.
"""

import json
import statistics
import sys
import time

import numpy as np
import torch

torch.set_num_threads(max(1, torch.get_num_threads()))


def _fbgemm():
  """(SplitTableBatchedEmbeddingBagsCodegen, its enums), or None where
  fbgemm_gpu does not import."""
  try:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType  # pylint: disable=g-import-not-at-top
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation  # pylint: disable=g-import-not-at-top
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode  # pylint: disable=g-import-not-at-top
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice  # pylint: disable=g-import-not-at-top
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # pylint: disable=g-import-not-at-top
      SplitTableBatchedEmbeddingBagsCodegen,
    )
  except Exception as e:  # pylint: disable=broad-except
    print(f"fbgemm_gpu unavailable: {e}", file=sys.stderr)
    return None
  return SplitTableBatchedEmbeddingBagsCodegen, EmbOptimType, EmbeddingLocation, \
      PoolingMode, ComputeDevice


def _timed(fn, reps, warmup=2):
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3


def _tbe(fb, num_tables, vocab, dim, optimizer, lr, eps=1e-7):
  codegen, optim, location, pooling, device = fb
  kwargs = {}
  if optimizer == "sgd":
    kwargs["optimizer"] = optim.EXACT_SGD
  else:
    kwargs["optimizer"] = optim.EXACT_ROWWISE_ADAGRAD
    kwargs["eps"] = eps
  return codegen(
      embedding_specs=[(vocab, dim, location.HOST, device.CPU)] * num_tables,
      learning_rate=lr, pooling_mode=pooling.SUM, **kwargs)


def _tbe_inputs(ids):
  """TBE's (indices, offsets): table-major, one bag per (table, sample)."""
  batch, hot = ids[0].shape
  indices = torch.from_numpy(np.concatenate([x.reshape(-1) for x in ids]))
  offsets = torch.arange(0, len(ids) * batch * hot + 1, hot, dtype=torch.int64)
  return indices, offsets


def time_peers(path, reps):
  data = np.load(path)
  num_tables = int(data["tables"])
  vocab, dim = int(data["vocab"]), int(data["dim"])
  ids = [data[f"ids_{t}"] for t in range(num_tables)]
  batch = ids[0].shape[0]
  gen = torch.Generator().manual_seed(0)
  results = {}
  bags = [torch.nn.EmbeddingBag(vocab, dim, mode="sum", sparse=True) for _ in ids]
  for b in bags:
    with torch.no_grad():
      b.weight.uniform_(-0.05, 0.05, generator=gen)
  inputs = [torch.from_numpy(x) for x in ids]
  targets = [torch.randn(batch, dim, generator=gen) for _ in ids]

  def forward():
    with torch.no_grad():
      return [b(x) for b, x in zip(bags, inputs)]

  results["torch EmbeddingBag forward"] = _timed(forward, reps)
  sgd = torch.optim.SGD([b.weight for b in bags], lr=0.01)

  def sgd_step():
    sgd.zero_grad(set_to_none=True)
    loss = sum((b(x) * y).sum() for b, x, y in zip(bags, inputs, targets))
    loss.backward()
    sgd.step()

  results["torch EmbeddingBag + SGD step"] = _timed(sgd_step, reps)
  bags = sgd = None  # frees them (closures above read them)
  fb = _fbgemm()
  if fb is not None:
    indices, offsets = _tbe_inputs(ids)
    target = torch.cat(targets, 1)
    for optimizer in ("sgd", "rowwise_adagrad"):
      tbe = _tbe(fb, num_tables, vocab, dim, optimizer, 0.01)
      if optimizer == "sgd":
        def tbe_forward(tbe=tbe):
          with torch.no_grad():
            return tbe(indices, offsets)
        results["FBGEMM TBE forward"] = _timed(tbe_forward, reps)

      def tbe_step(tbe=tbe):
        # The optimizer is fused into TBE's backward.
        (tbe(indices, offsets) * target).sum().backward()

      name = "EXACT_SGD" if optimizer == "sgd" else "EXACT_ROWWISE_ADAGRAD"
      results[f"FBGEMM TBE {name} step"] = _timed(tbe_step, reps)
      del tbe
  return results


def time_variants(path, reps):
  """torch `nn.EmbeddingBag` forwards of FORMS.npz's ids: per table
  `dense_{t}` [batch, hot] with `dense_w_{t}`, and `values_{t}`,
  `lengths_{t}`, `values_w_{t}` (ragged). EmbeddingBag has "sum" and
  "mean" and takes per-id weights with "sum" only: sqrtn, and the weighted
  mean and sqrtn, are "sum" with weights that the timed call normalizes
  per bag itself (w / sum(w), w / sqrt(sum(w^2)), 1 / sqrt(n))."""
  data = np.load(path)
  num_tables = int(data["tables"])
  vocab, dim = int(data["vocab"]), int(data["dim"])
  gen = torch.Generator().manual_seed(0)
  modules = {mode: [torch.nn.EmbeddingBag(vocab, dim, mode=mode) for _ in range(num_tables)]
             for mode in ("sum", "mean")}
  for bag in modules["mean"]:
    torch.nn.init.uniform_(bag.weight, -0.05, 0.05, generator=gen)
  for plain, mean in zip(modules["sum"], modules["mean"]):
    plain.weight = mean.weight  # one copy of the tables for both modes
  dense = [torch.from_numpy(data[f"dense_{t}"]) for t in range(num_tables)]
  dense_w = [torch.from_numpy(data[f"dense_w_{t}"]) for t in range(num_tables)]
  values = [torch.from_numpy(data[f"values_{t}"]) for t in range(num_tables)]
  lengths = [torch.from_numpy(data[f"lengths_{t}"]) for t in range(num_tables)]
  values_w = [torch.from_numpy(data[f"values_w_{t}"]) for t in range(num_tables)]
  offsets = [torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(n, 0)[:-1]])
             for n in lengths]
  bag_of = [torch.repeat_interleave(torch.arange(len(n)), n) for n in lengths]

  def normalized(w, combiner, t, ragged):
    """Per-id weights (None: unweighted) scaled so that "sum" gives `combiner`."""
    if combiner == "sum":
      return w
    if ragged:
      ones = torch.ones(len(values[t])) if w is None else w
      squares = ones if w is None else w * w
      total = torch.zeros(len(lengths[t])).index_add_(
          0, bag_of[t], ones if combiner == "mean" else squares)
      scale = 1 / total if combiner == "mean" else torch.rsqrt(total)
      return ones * scale[bag_of[t]]
    ones = torch.ones(dense[t].shape) if w is None else w
    if combiner == "mean":
      return ones / ones.sum(1, keepdim=True)
    return ones * torch.rsqrt((ones * ones).sum(1, keepdim=True))

  results = {}
  for form in ("dense", "ragged"):
    for combiner in ("sum", "mean", "sqrtn"):
      for weighted in (False, True):
        def forward(form=form, combiner=combiner, weighted=weighted):
          out = []
          with torch.no_grad():
            for t in range(num_tables):
              ragged = form == "ragged"
              w = (values_w if ragged else dense_w)[t] if weighted else None
              if combiner == "mean" and not weighted:
                bag, w = modules["mean"][t], None
              else:
                bag, w = modules["sum"][t], normalized(w, combiner, t, ragged)
              if ragged:
                out.append(bag(values[t], offsets[t], per_sample_weights=w))
              else:
                out.append(bag(dense[t], per_sample_weights=w))
          return out
        results[f"{form} {combiner}{' weighted' if weighted else ''}"] = _timed(forward, reps)
  return results


def optimizer_step(case_path, out_path):
  """One step of each peer's optimizer (the case's "optimizer": "sgd",
  "adam" (lazy; torch only) or "rowwise_adagrad" (FBGEMM only)) from the
  tables in `case_path`."""
  data = np.load(case_path)
  num_tables, lr = int(data["tables"]), float(data["lr"])
  optimizer = str(data["optimizer"])
  init = [data[f"table_{t}"] for t in range(num_tables)]
  ids = [data[f"ids_{t}"] for t in range(num_tables)]
  targets = [torch.from_numpy(data[f"target_{t}"]) for t in range(num_tables)]
  out = {}
  if optimizer != "rowwise_adagrad":
    out.update(_torch_step(data, optimizer, lr, init, ids, targets))
  fb = _fbgemm() if optimizer in ("sgd", "rowwise_adagrad") else None
  if fb is not None:
    vocab, dim = init[0].shape
    tbe = _tbe(fb, num_tables, vocab, dim, optimizer, lr, eps=float(data["epsilon"]))
    with torch.no_grad():
      for w, x in zip(tbe.split_embedding_weights(), init):
        w.copy_(torch.from_numpy(x))
    indices, offsets = _tbe_inputs(ids)
    (tbe(indices, offsets) * torch.cat(targets, 1)).sum().backward()
    for t, w in enumerate(tbe.split_embedding_weights()):
      out[f"fbgemm_{t}"] = w.detach().numpy().copy()
  np.savez(out_path, **out)


def _torch_step(data, optimizer, lr, init, ids, targets):
  """torch's EmbeddingBag tables after one SGD or SparseAdam step."""
  out = {}
  bags = [torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(w.copy()), freeze=False,
                                                mode="sum", sparse=True) for w in init]
  weights = [b.weight for b in bags]
  if optimizer == "adam":
    # SparseAdam is lazy Adam: m, v and the row move for the rows a batch
    # touches, epsilon added to sqrt(v) after bias correction, as tfde's.
    opt = torch.optim.SparseAdam(weights, lr=lr, betas=(float(data["beta_1"]),
                                                          float(data["beta_2"])),
                                 eps=float(data["epsilon"]))
  else:
    opt = torch.optim.SGD(weights, lr=lr)
  loss = sum((b(torch.from_numpy(x)) * y).sum() for b, x, y in zip(bags, ids, targets))
  loss.backward()
  opt.step()
  for t, b in enumerate(bags):
    out[f"torch_{t}"] = b.weight.detach().numpy()
  return out


if __name__ == "__main__":
  if sys.argv[1] == "time":
    print(json.dumps(time_peers(sys.argv[2], int(sys.argv[3]))))
  elif sys.argv[1] == "variants":
    print(json.dumps(time_variants(sys.argv[2], int(sys.argv[3]))))
  elif sys.argv[1] == "step":
    optimizer_step(sys.argv[2], sys.argv[3])
  else:
    sys.exit(f"unknown mode {sys.argv[1]!r}: time, variants or step")
