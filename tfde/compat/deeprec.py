"""DeepRec's GroupEmbedding API on tfde.

>>> import tensorflow as tf
>>> import tfde
>>> users = tf.Variable(tf.ones([10, 4]))
>>> items = tf.Variable(tf.ones([20, 4]) * 2)
>>> ids = [tf.SparseTensor([[0, 0], [1, 0]], tf.constant([3, 4], tf.int64), [2, 1]),
...        tf.SparseTensor([[0, 0], [0, 1]], tf.constant([5, 6], tf.int64), [2, 2])]
>>> out = tfde.nn.group_embedding_lookup_sparse([users, items], ids, ["sum", "mean"])
>>> [o.shape.as_list() for o in out]
[[2, 4], [2, 4]]

`params` may hold plain `tf.Variable`s (whole tables: their gradients are
the usual `tf.IndexedSlices`, for any optimizer) or tfde tables
(`tfde.tables.ShardedTable`: sharded, trained by their own sparse optimizer
in the backward pass, as everywhere in tfde; `tape.gradient(loss,
tape.watched_variables())` includes the group's update trigger). Tables of one width are looked
up together: one dedup and one gather for plain variables, one exchange for
tfde tables. Beyond DeepRec: "sqrtn", `sp_weights` and
`tf.nn.embedding_lookup_sparse`'s `max_norm` are supported, and inputs may
be `tf.RaggedTensor`s. Only `partition_strategy="mod"` exists.

DeepRec's newer signature (`sp_weights` fourth, `is_sequence`,
`params_num_per_group`) works too; `is_sequence=True` returns each id's
row at its position, [batch, T, D] (T: a sparse input's second dimension,
a ragged input's longest row), zeros where no id is:

>>> seq = tfde.nn.group_embedding_lookup_sparse([users], [ids[1]], ["sum"],
...                                             is_sequence=True)
>>> seq[0].shape.as_list()
[2, 2, 4]
"""

import collections
import logging

import tensorflow as tf

from tfde import config as config_lib
from tfde import inputs as inputs_lib
from tfde import lookup as lookup_lib
from tfde import ops
from tfde import tables as tables_lib


def _check_lists(params, sp_ids, combiners, sp_weights, partition_strategy):
  if partition_strategy != "mod":
    raise ValueError(f"partition_strategy must be 'mod' (rows sharded by "
                     f"id % N), got {partition_strategy!r}")
  if not isinstance(params, (list, tuple)) or not isinstance(sp_ids, (list, tuple)):
    raise ValueError("params and sp_ids must be lists, one entry per feature")
  if combiners is None:
    # DeepRec's default, with its warning.
    logging.getLogger(__name__).warning(
        "group_embedding_lookup_sparse: combiners=None, so every feature's "
        "combiner is 'mean'")
    combiners = ["mean"] * len(params)
  if isinstance(combiners, str):
    combiners = [combiners] * len(params)
  lengths = {"params": len(params), "sp_ids": len(sp_ids),
             "combiners": len(combiners)}
  if sp_weights is not None:
    lengths["sp_weights"] = len(sp_weights)
  if len(set(lengths.values())) != 1:
    raise ValueError(f"params, sp_ids, combiners (and sp_weights) must have "
                     f"one entry per feature; got lengths {lengths}")
  for i, c in enumerate(combiners):
    if c not in config_lib.COMBINERS:
      raise ValueError(f"combiners[{i}] must be one of {config_lib.COMBINERS}, "
                       f"got {c!r}")
  return list(combiners), (list(sp_weights) if sp_weights is not None
                           else [None] * len(params))


def _check_max_norms(max_norm, params):
  """One limit per feature (None: none), from a number or a list."""
  if max_norm is None or isinstance(max_norm, (int, float)):
    max_norm = [max_norm] * len(params)
  if not isinstance(max_norm, (list, tuple)) or len(max_norm) != len(params):
    raise ValueError(f"max_norm must be None, a number or a list with one entry "
                     f"per feature ({len(params)}), got {max_norm!r}")
  for i, m in enumerate(max_norm):
    if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float))
                          or not 0 < m < float("inf")):
      raise ValueError(f"max_norm[{i}] (params[{i}]) must be a positive finite "
                       f"number or None, got {m!r}")
  for i, (p, m) in enumerate(zip(params, max_norm)):
    if isinstance(p, tables_lib.Table) and m is not None and m != p.config.max_norm:
      raise ValueError(f"max_norm[{i}] = {m!r} but tfde table {p.name!r} "
                       f"(params[{i}]) is configured with max_norm="
                       f"{p.config.max_norm!r}; a tfde table's limit is its "
                       "TableConfig's")
  return [None if m is None else float(m) for m in max_norm]


def group_embedding_lookup_sparse(params, sp_ids, combiners, sp_weights=None,
                                  partition_strategy="mod", is_sequence=False,
                                  params_num_per_group=None, name=None, *,
                                  max_norm=None):
  """Looks up a group of sparse features, one table each.

  Args:
    params: list of tables: `tf.Variable` [V, D], or tfde tables
      (`ShardedTable`, or `DynamicTable` taking any int64 id).
    sp_ids: list of `tf.SparseTensor` [batch, k] (or `tf.RaggedTensor`) ids.
    combiners: list of "sum", "mean" or "sqrtn" (or one for all); None
      means "mean" for all, as in DeepRec.
    partition_strategy: "mod" only.
    sp_weights: optional list of weights matching sp_ids (entries may be
      None). This is DeepRec's newer order; its older one,
      `(params, sp_ids, combiners, partition_strategy, sp_weights, name)`,
      works positionally too (a string fourth is the partition strategy).
    name: an optional name scope.
    max_norm: as `tf.nn.embedding_lookup_sparse`'s: each row read is scaled
      to an L2 norm of at most this before combining (its gradient too).
      One number for all features or a list (None entries: no limit). A
      tfde table takes its `TableConfig.max_norm`; a value given here must
      equal it.
    is_sequence: DeepRec's: no combining; [batch, T, D] outputs, each id's
      row at its position (a sparse input's column, a ragged input's
      index), zeros elsewhere. Trained like pooled lookups. Takes no
      sp_weights.
    params_num_per_group: DeepRec's op-size hint; accepted and unused (one
      fused lookup per width here).

  Returns:
    A list of [batch, D] tensors: results equal tf.nn.embedding_lookup_sparse
    per table (with every row of the batch present, empty ones zero); with
    is_sequence, [batch, T, D] tensors.
  """
  del params_num_per_group  # A GPU op-size hint of DeepRec's.
  if isinstance(sp_weights, str):
    # DeepRec's older positional order: (..., partition_strategy,
    # sp_weights, name).
    sp_weights, partition_strategy = (None if partition_strategy == "mod"
                                      else partition_strategy), sp_weights
    if isinstance(is_sequence, str):
      name, is_sequence = is_sequence, False
  combiners, sp_weights = _check_lists(params, sp_ids, combiners, sp_weights,
                                       partition_strategy)
  max_norms = _check_max_norms(max_norm, params)
  if is_sequence:
    return _sequence_lookup(params, sp_ids, combiners, sp_weights, max_norms, name)
  with tf.name_scope(name or "group_embedding_lookup_sparse"):
    results = [None] * len(params)
    tfde_tables = tables_lib.Table
    plain = [i for i, p in enumerate(params) if not isinstance(p, tfde_tables)]
    sharded = [i for i, p in enumerate(params) if isinstance(p, tfde_tables)]
    by_width = collections.defaultdict(list)
    for i in plain:
      if not isinstance(params[i], tf.Variable) or params[i].shape.rank != 2:
        raise ValueError(f"params[{i}] must be a [V, D] tf.Variable or a tfde "
                         f"table, got {params[i]!r}")
      by_width[int(params[i].shape[1])].append(i)
    for indices in by_width.values():
      outs = _plain_group([params[i] for i in indices], [sp_ids[i] for i in indices],
                          [combiners[i] for i in indices],
                          [sp_weights[i] for i in indices], indices,
                          [max_norms[i] for i in indices])
      for i, out in zip(indices, outs):
        results[i] = out
    if sharded:
      outs = _sharded_group([params[i] for i in sharded], [sp_ids[i] for i in sharded],
                            [combiners[i] for i in sharded],
                            [sp_weights[i] for i in sharded], sharded)
      for i, out in zip(sharded, outs):
        results[i] = out
    return results


def _sequence_lookup(params, sp_ids, combiners, sp_weights, max_norms, name):
  """is_sequence: each id becomes a sample of its own (pooled, any
  combiner, that is its row), looked up and trained as pooled features
  are; the rows then go to their [batch, T] positions."""
  given = [i for i, w in enumerate(sp_weights) if w is not None]
  if given:
    raise ValueError(f"sp_weights[{given[0]}] is given with is_sequence=True: "
                     f"a sequence lookup does not combine, so it takes no weights")
  singles, places = [], []
  for i, ids in enumerate(sp_ids):
    if isinstance(ids, tf.RaggedTensor):
      if ids.ragged_rank != 1:
        raise ValueError(f"sp_ids[{i}]: is_sequence takes [batch, (k)] ids, got "
                         f"ragged rank {ids.ragged_rank}")
      values, splits = ids.flat_values, ids.row_splits
      places.append(("ragged", splits))
    elif isinstance(ids, tf.SparseTensor):
      if ids.shape.rank not in (None, 2):
        raise ValueError(f"sp_ids[{i}]: is_sequence takes [batch, k] ids, got "
                         f"rank {ids.shape.rank}")
      values = ids.values
      places.append(("sparse", ids))
    else:
      raise ValueError(f"sp_ids[{i}] must be a tf.SparseTensor or tf.RaggedTensor, "
                       f"got {type(ids).__name__}")
    singles.append(tf.RaggedTensor.from_row_splits(
        values, tf.range(tf.size(values, out_type=tf.int64) + 1)))
  rows = group_embedding_lookup_sparse(
      params, singles, [p.config.combiner if isinstance(p, tables_lib.Table) else c
                        for p, c in zip(params, combiners)],
      name=name or "group_embedding_lookup_sequence", max_norm=max_norms)
  outputs = []
  for (kind, where), r in zip(places, rows):
    if kind == "ragged":
      outputs.append(tf.RaggedTensor.from_row_splits(r, where).to_tensor())
    else:
      shape = tf.concat([tf.cast(where.dense_shape, tf.int64), tf.shape(r, out_type=tf.int64)[1:]], 0)
      outputs.append(tf.scatter_nd(where.indices, r, shape))
  return outputs


def group_embedding_lookup(params, ids, partition_strategy="mod", name=None):
  """Dense ids ([batch] or [batch, k]): one row per id, shape ids + [D]."""
  if partition_strategy != "mod":
    raise ValueError(f"partition_strategy must be 'mod', got {partition_strategy!r}")
  if len(params) != len(ids):
    raise ValueError(f"params and ids must have one entry per feature; got "
                     f"{len(params)} and {len(ids)}")
  flat = [tf.reshape(tf.convert_to_tensor(x), [-1, 1]) for x in ids]
  ragged = [tf.RaggedTensor.from_tensor(x) for x in flat]
  out = group_embedding_lookup_sparse(params, ragged, ["sum"] * len(params),
                                      name=name or "group_embedding_lookup")
  return [tf.reshape(o, tf.concat([tf.shape(x), tf.shape(o)[1:]], 0))
          for o, x in zip(out, ids)]


def _flatten(i, ids, weights, vocabulary_size):
  feature = f"sp_ids[{i}]"
  table = f"params[{i}]"
  flat_ids, splits, w = inputs_lib.flatten_feature(feature, table, ids, weights,
                                                   check_row_splits=ops.check_row_splits)
  flat_ids = ops.check_id_range(flat_ids, vocabulary_size,
                                inputs_lib.describe(feature, table))
  return flat_ids, splits, w


def _plain_group(table_vars, sp_ids, combiners, sp_weights, indices, max_norms):
  """Whole-table tf.Variables of one width: one dedup, one gather."""
  bases, total = [], 0
  for v in table_vars:
    bases.append(total)
    total += int(v.shape[0])
  flat = [_flatten(i, ids, w, int(v.shape[0]))
          for i, v, ids, w in zip(indices, table_vars, sp_ids, sp_weights)]
  fused = tf.concat([f[0] + b for f, b in zip(flat, bases)], 0)
  sizes = [tf.size(f[0]) for f in flat]
  # Weights get tf.nn.embedding_lookup_sparse's gradient when asked for.
  trained = [i for i, f in enumerate(flat)
             if f[2] is not None and lookup_lib.wants_gradient(f[2])]

  @tf.custom_gradient
  def lookup(*inputs):
    for i, w in zip(trained, inputs[len(table_vars):]):
      flat[i] = (flat[i][0], flat[i][1], w)
    unique, inverse, _ = ops.unique_with_counts(fused)
    table_index = tf.cast(tf.searchsorted(tf.constant(bases, unique.dtype),
                                          unique, side="right"), tf.int32) - 1
    if all(v.dtype == tf.float32 for v in table_vars):
      rows = ops.gather_from_tables(table_vars, unique, bases)
    else:
      # Reduced-precision variables (DeepRec's BF16): read each table's
      # rows with stock ops, combined in float32 as tfde's tables are.
      positions = [tf.where(tf.equal(table_index, t))[:, 0] for t in range(len(table_vars))]
      rows = tf.dynamic_stitch(
          [tf.cast(p, tf.int32) for p in positions],
          [tf.cast(tf.gather(v, tf.gather(unique, p) - base), tf.float32)
           for v, p, base in zip(table_vars, positions, bases)])
    raw_rows = row_max_norm = None
    if any(m is not None for m in max_norms):
      # Each unique row is of one feature's block: its feature's limit.
      per_id = tf.concat([tf.fill([n], m or float("inf"))
                          for n, m in zip(sizes, max_norms)], 0)
      row_max_norm = tf.math.unsorted_segment_max(per_id, inverse, tf.shape(rows)[0])
      raw_rows, rows = rows, ops.renormalize_rows(rows, row_max_norm)
    parts = tf.split(inverse, sizes) if len(flat) > 1 else [inverse]
    outputs = [ops.embedding_combine(rows, part, splits, w, c)
               for (_, splits, w), part, c in zip(flat, parts, combiners)]

    def grad_fn(*output_grads, variables=None):
      # The tables' gradients go to the inputs (their reads). A TF1 graph
      # also reports the tables, read inside, as variables: they get None.
      grads = []
      per_row = tf.zeros_like(rows)
      for (_, splits, w), part, c, g in zip(flat, parts, combiners, output_grads):
        if g is not None:
          per_row += ops.embedding_combine_grad(g, part, splits, w,
                                                tf.shape(rows)[0], c)
      if raw_rows is not None:
        per_row = ops.renormalize_rows_grad(raw_rows, per_row, row_max_norm)
      for t, (v, base) in enumerate(zip(table_vars, bases)):
        mask = tf.equal(table_index, t)
        grads.append(tf.IndexedSlices(tf.cast(tf.boolean_mask(per_row, mask), v.dtype),
                                      tf.boolean_mask(unique, mask) - base,
                                      tf.shape(v, out_type=tf.int64)))
      for i in trained:
        _, splits, w = flat[i]
        g = output_grads[i]
        grads.append(None if g is None else ops.combine_weights_grad(
            g, tf.gather(rows, parts[i]), splits, w, outputs[i], combiners[i]))
      if variables is not None:
        return grads, [None] * len(variables)
      return grads

    return outputs, grad_fn

  return lookup(*table_vars, *[flat[i][2] for i in trained])


def _sharded_group(tables, sp_ids, combiners, sp_weights, indices):
  """tfde tables: the sharded pipeline, trained in its backward pass."""
  features = {}
  inputs, weights = {}, {}
  for i, table, ids, w, c in zip(indices, tables, sp_ids, sp_weights, combiners):
    if c != table.config.combiner:
      raise ValueError(f"combiners[{i}] = {c!r} but tfde table "
                       f"{table.name!r} is configured with {table.config.combiner!r}")
    name = f"feature_{i}"
    features[name] = config_lib.FeatureConfig(name=name, table=table.config)
    inputs[name] = ids
    if w is not None:
      weights[name] = w
  lookup = lookup_lib.cached_lookup(
      tables, sorted(features), lambda: lookup_lib.ShardedLookup(
          features, tables={t.name: t for t in tables}, name="group_embedding"))
  out = lookup(inputs, weights or None)
  return [out[f"feature_{i}"] for i in indices]


