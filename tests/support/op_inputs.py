"""Random inputs shared by the op tests (test_ops.py, test_ops_optimizers.py):
the seeds of the seeded cases, and bags of ids in the ragged form the ops
take."""

import numpy as np
import tensorflow as tf

SEEDS = range(12)


def random_bags(rng, batch, vocab, max_hot, weighted):
  lengths = rng.integers(0, max_hot + 1, size=batch)
  ids = [list(rng.integers(0, vocab, size=k)) for k in lengths]
  weights = ([list(rng.uniform(-1.0, 2.0, size=k)) for k in lengths]
             if weighted else None)
  return ids, weights


def combine_inputs(ids, weights):
  flat = np.array([i for bag in ids for i in bag], np.int64)
  splits = np.concatenate([[0], np.cumsum([len(b) for b in ids])]).astype(np.int64)
  w = (None if weights is None else
       tf.constant(np.array([x for bag in weights for x in bag], np.float32)))
  return flat, splits, w


def seeded_bags(seed):
  """A case that varies with the seed: width 1 to 257, vocabularies of 1 to
  500, batches of 1 to 64, weights on odd seeds. (rng, dim, vocab, ids,
  weights)."""
  rng = np.random.default_rng(seed)
  dim = [1, 4, 16, 257][seed % 4]
  vocab = [1, 30, 500][seed % 3]
  ids, weights = random_bags(rng, batch=[1, 7, 64][seed % 3], vocab=vocab,
                             max_hot=[1, 3, 20][seed % 3], weighted=seed % 2 == 1)
  return rng, dim, vocab, ids, weights
