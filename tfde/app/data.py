"""Data for the main job: a Criteo-like generator with a hidden true model,
and MovieLens ratings from a CSV.

>>> from tfde.app import data
>>> spec = data.SyntheticSpec(sparse=[data.SparseFeature("c1", 1000, 3)],
...                           dense_features=2, samples=64)
>>> d = data.synthetic(spec, seed=0)
>>> sorted(d.features), d.labels.shape
(['c1', 'dense'], (64,))

The synthetic labels come from a hidden model (per-feature hidden
embeddings averaged over each sample's ids, a linear term on the dense
features, a logistic link), so learning is real and measurable: the report
compares the trained model's AUC with the hidden model's own (`oracle_auc`).
"""

import csv
import dataclasses
from typing import Dict
from typing import List
from typing import Optional

import numpy as np


@dataclasses.dataclass
class SparseFeature:
  """One categorical feature: its name, vocabulary and max ids per sample."""
  name: str
  vocabulary_size: int
  hotness: int = 1


@dataclasses.dataclass
class SyntheticSpec:
  sparse: List[SparseFeature]
  dense_features: int = 13
  samples: int = 10000
  zipf_alpha: float = 1.1


@dataclasses.dataclass
class Dataset:
  """Features as numpy arrays: sparse features as (values, row_lengths),
  dense features as a [n, d] float array under "dense"."""
  features: Dict[str, object]
  labels: np.ndarray
  task: str                      # "ctr" (0/1 labels) or "rating"
  vocabulary: Dict[str, int]
  oracle_scores: Optional[np.ndarray] = None

  @property
  def size(self):
    return len(self.labels)

  def split(self, fraction):
    """(first, rest) with `fraction` of the samples in the first."""
    cut = int(self.size * fraction)
    return self._take(slice(0, cut)), self._take(slice(cut, self.size))

  def permuted(self, seed):
    """The same samples in a random order (numpy, so the job knows which
    samples each batch holds: its per-step statistics come from them)."""
    order = np.random.default_rng(seed).permutation(self.size)
    out = {}
    for name, value in self.features.items():
      if isinstance(value, tuple):
        values, lengths = value
        starts = np.concatenate([[0], np.cumsum(lengths)])[:-1][order]
        picked = lengths[order]
        index = np.repeat(starts - np.concatenate([[0], np.cumsum(picked)])[:-1],
                          picked) + np.arange(int(picked.sum()))
        out[name] = (values[index], picked)
      else:
        out[name] = value[order]
    oracle = None if self.oracle_scores is None else self.oracle_scores[order]
    return Dataset(out, self.labels[order], self.task, self.vocabulary, oracle)

  def batch_ids(self, name, batch_size):
    """[ids of batch k] of sparse feature `name`, for the batches
    `to_tf_dataset` makes (the incomplete last batch dropped)."""
    values, lengths = self.features[name]
    splits = np.concatenate([[0], np.cumsum(lengths)])
    return [values[splits[k * batch_size]:splits[(k + 1) * batch_size]]
            for k in range(self.size // batch_size)]

  def _take(self, rows):
    out = {}
    for name, value in self.features.items():
      if isinstance(value, tuple):
        values, lengths = value
        splits = np.concatenate([[0], np.cumsum(lengths)])
        start, stop = splits[rows.start], splits[rows.stop]
        out[name] = (values[start:stop], lengths[rows])
      else:
        out[name] = value[rows]
    oracle = None if self.oracle_scores is None else self.oracle_scores[rows]
    return Dataset(out, self.labels[rows], self.task, self.vocabulary, oracle)


def _zipf_ids(rng, count, vocab, alpha):
  """`count` ids of a Zipf(alpha) law truncated to the vocabulary.

  Rank r (1-based) has probability proportional to r**-alpha for r <= vocab.
  (Drawing from the untruncated law and folding the overflow back with a
  modulo, as this generator once did, spreads the overflow, 28% of the
  draws for alpha 1.1 and 300,000 ids, uniformly over the vocabulary: a
  floor of ids seen once, whose hidden effects no model can learn.) A
  fixed permutation then scatters the ranks so hot ids are not all small
  numbers (nor all on shard 0)."""
  weights = np.arange(1, vocab + 1, dtype=np.float64) ** -alpha
  cdf = np.cumsum(weights)
  cdf /= cdf[-1]
  ranks = np.minimum(np.searchsorted(cdf, rng.uniform(size=count)), vocab - 1)
  permutation = rng.permutation(vocab)
  return permutation[ranks].astype(np.int64)


def synthetic(spec, seed=0):
  """Criteo-like data with labels from a hidden logistic model."""
  rng = np.random.default_rng(seed)
  n = spec.samples
  features, vocabulary = {}, {}
  logit = np.zeros(n)
  for feature in spec.sparse:
    lengths = rng.integers(1, feature.hotness + 1, size=n)
    values = _zipf_ids(rng, int(lengths.sum()), feature.vocabulary_size,
                       spec.zipf_alpha)
    hidden = rng.normal(0.0, 1.0, size=feature.vocabulary_size)
    per_id = hidden[values]
    splits = np.concatenate([[0], np.cumsum(lengths)])
    logit += np.add.reduceat(per_id, splits[:-1]) / lengths
    features[feature.name] = (values, lengths)
    vocabulary[feature.name] = feature.vocabulary_size
  if spec.dense_features:
    dense = rng.lognormal(0.0, 1.0, size=(n, spec.dense_features)).astype(np.float32)
    dense = np.log1p(dense)
    logit += (dense - dense.mean(0)) @ rng.normal(0, 0.5, size=spec.dense_features)
    features["dense"] = dense
  logit = logit / np.sqrt(len(spec.sparse) + 1) * 2.0
  probability = 1.0 / (1.0 + np.exp(-logit))
  labels = (rng.uniform(size=n) < probability).astype(np.float32)
  return Dataset(features, labels, "ctr", vocabulary, oracle_scores=probability)


class DataError(ValueError):
  """A data file that cannot be used; the message is one line naming the
  file (and line)."""


def movielens(path, max_samples=None):
  """MovieLens ratings (`userId,movieId,rating,timestamp` CSV) as a rating
  task with one-hot user and movie features, shuffled deterministically.
  Raises DataError naming the file and line of a bad row."""
  users, movies, ratings = [], [], []
  try:
    with open(path, newline="", encoding="utf-8") as f:
      reader = csv.DictReader(f)
      missing = {"userId", "movieId", "rating"} - set(reader.fieldnames or [])
      if missing:
        raise DataError(f"{path}: missing columns {sorted(missing)}; expected "
                        "userId,movieId,rating,timestamp")
      for row in reader:
        try:
          user, movie = int(row["userId"]), int(row["movieId"])
          rating = float(row["rating"])
        except (TypeError, ValueError):
          user = movie = rating = None
        if user is None or user < 0 or movie < 0 or not np.isfinite(rating):
          raise DataError(f"{path}:{reader.line_num}: expected non-negative "
                          f"integer userId and movieId and a finite rating, got "
                          f"{[row.get(k) for k in ('userId', 'movieId', 'rating')]}")
        users.append(user)
        movies.append(movie)
        ratings.append(rating)
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: not a UTF-8 text (CSV) file: {e.reason} at byte "
                    f"{e.start}") from None
  except csv.Error as e:
    raise DataError(f"{path}: not a CSV file: {e}") from None
  except OSError as e:
    raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
  if not ratings:
    raise DataError(f"{path}: no ratings")
  order = np.random.default_rng(0).permutation(len(ratings))
  if max_samples:
    order = order[:max_samples]
  users = np.asarray(users, np.int64)[order]
  movies = np.asarray(movies, np.int64)[order]
  ones = np.ones(len(order), np.int64)
  return Dataset({"user_id": (users, ones), "movie_id": (movies, ones)},
                 np.asarray(ratings, np.float32)[order], "rating",
                 {"user_id": int(users.max()) + 1, "movie_id": int(movies.max()) + 1})


def ratings(path=None, rows=100_000, seed=0):
  """(user_id, movie_id, rating) arrays for the ranking examples: from a
  MovieLens ratings.csv when `path` is given, else `rows` generated ratings
  of 610 users and 9,742 movies (MovieLens-small's sizes; Zipf(1.2)
  movies) from a hidden rank-4 model, rounded to MovieLens's 0.5 steps.

  >>> users, movies, stars = ratings(rows=5)
  >>> users.dtype, movies.dtype, stars.dtype, stars.shape
  (dtype('int64'), dtype('int64'), dtype('float32'), (5,))
  """
  if path:
    data = movielens(path)
    return (data.features["user_id"][0], data.features["movie_id"][0],
            data.labels)
  rng = np.random.default_rng(seed)
  users = rng.integers(0, 610, rows)
  movies = (rng.zipf(1.2, rows) - 1) % 9742
  hidden_u, hidden_m = rng.normal(size=(610, 4)), rng.normal(size=(9742, 4))
  score = np.sum(hidden_u[users] * hidden_m[movies], axis=1)
  stars = np.clip(np.round(3.5 + score * 0.6), 0.5, 5.0).astype(np.float32)
  return users.astype(np.int64), movies.astype(np.int64), stars


# Fills the unused tail of a multi-hot feature's id block. Never a valid id:
# `embedding_inputs` drops it before any lookup, and were it ever looked up,
# the layer's id range check would fail the step instead of training a row.
PAD_ID = -1


def to_tf_dataset(dataset, batch_size, shuffle_seed=None):
  """A tf.data.Dataset of (features, labels), batches of `batch_size`.

  Single-id features are [batch] ids. A multi-hot feature `name` travels as
  two dense tensors: "name", [batch, max_hotness] ids with each sample's
  ids first and the rest PAD_ID, and "name/lengths", [batch], each sample's
  count of ids. The model calls `embedding_inputs` to turn the pair into
  the [batch, (hotness)] RaggedTensor the embedding layer looks up, so the
  padding never reaches a table: no row is looked up, trained or given
  optimizer state for it (a lazy optimizer such as Adam moves every row a
  batch looks up, even with a zero gradient, so padding with a real id and
  weight 0 is not neutral).

  The batches hold dense tensors only because Keras 3's `fit` under a
  distribution strategy first averages a batch across replicas for its
  symbolic build (`strategy.reduce("MEAN")`), which fails on ragged and
  sparse tensors.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tensors = {}
  for name, value in dataset.features.items():
    if not isinstance(value, tuple):
      tensors[name] = value
      continue
    values, lengths = value
    width = int(lengths.max()) if len(lengths) else 1
    if width == 1 and (not len(lengths) or int(lengths.min()) == 1):
      tensors[name] = values
      continue
    ids = np.full((len(lengths), width), PAD_ID, np.int64)
    ids[np.arange(width)[None, :] < lengths[:, None]] = values
    tensors[name] = ids
    tensors[f"{name}/lengths"] = lengths.astype(np.int64)
  ds = tf.data.Dataset.from_tensor_slices((tensors, dataset.labels))
  if shuffle_seed is not None:
    ds = ds.shuffle(min(dataset.size, 100_000), seed=shuffle_seed)
  return ds.batch(batch_size, drop_remainder=True).prefetch(2)


def embedding_inputs(batch, names):
  """{name: ids} for the embedding layer from a `to_tf_dataset` batch:
  single-id features as they are, multi-hot ones as RaggedTensors holding
  only each sample's real ids (the padding is dropped here)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out = {}
  for name in names:
    lengths = batch.get(f"{name}/lengths")
    if lengths is None:
      out[name] = batch[name]
    else:
      # (Cast: Keras's symbolic build traces the model on a batch averaged
      # across replicas, in floats; real batches are int64 already.)
      out[name] = tf.RaggedTensor.from_tensor(
          tf.cast(batch[name], tf.int64), lengths=tf.cast(lengths, tf.int64))
  return out


def auc(labels, scores):
  """Area under the ROC curve (rank statistic, ties averaged)."""
  labels = np.asarray(labels)
  scores = np.asarray(scores, np.float64)
  order = np.argsort(scores, kind="mergesort")
  ranks = np.empty(len(scores))
  sorted_scores = scores[order]
  i = 0
  while i < len(scores):
    j = i
    while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
      j += 1
    ranks[order[i:j + 1]] = (i + j) / 2.0 + 1
    i = j + 1
  positives = labels > 0.5
  n_pos, n_neg = positives.sum(), (~positives).sum()
  if n_pos == 0 or n_neg == 0:
    return float("nan")
  return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
