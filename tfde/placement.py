"""Where a table lives: sharded over the replicas or replicated on each.

>>> import tfde
>>> small = tfde.TableConfig(name="s", vocabulary_size=1000, embedding_dim=8)
>>> big = tfde.TableConfig(name="b", vocabulary_size=100_000, embedding_dim=8)
>>> tfde.placement.replicates(small), tfde.placement.replicates(big)
(True, False)

One policy for every front door. `placement="default_device"` replicates
a table (data parallel: each replica holds it whole, gradients are
all-gathered); `"auto"` replicates a table of at most
`AUTO_REPLICATE_BYTES` (V * D * 4 bytes) and shards a larger one by
`id % N`: at 1 MiB a table's per-step gradient exchange stays smaller
than routing its lookups. Dynamic tables are always sharded. "sparsecore"
needs a TPU.
"""

AUTO_REPLICATE_BYTES = 1 << 20


def check(config):
  """Raises ValueError naming the table for a placement this process
  cannot give it."""
  if config.is_dynamic and config.placement == "default_device":
    raise ValueError(f"table {config.name!r} is dynamic; it is sharded, so "
                     "placement 'default_device' does not apply")
  if config.placement == "sparsecore":
    raise ValueError(
        f"table {config.name!r}: placement 'sparsecore' needs TPU SparseCore, "
        "which this process does not have; use 'auto' or 'default_device'")


def replicates(config, auto_replicate_bytes=None):
  """True when the table is replicated rather than sharded.
  `auto_replicate_bytes` overrides `AUTO_REPLICATE_BYTES` (0: shard every
  "auto" table)."""
  check(config)
  if config.is_dynamic:
    return False
  if config.placement == "default_device":
    return True
  if auto_replicate_bytes is None:
    auto_replicate_bytes = AUTO_REPLICATE_BYTES
  return config.vocabulary_size * config.embedding_dim * 4 <= auto_replicate_bytes
