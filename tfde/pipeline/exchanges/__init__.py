"""The exchanges, one module each, and the policy that gives each group of
tables its exchange (`choose`): the first of `EXCHANGES` that takes it.

A new exchange is one module (a `base.Exchange` with its step value) and
one line in `EXCHANGES`, ahead of those it should win over.

>>> import tfde
>>> from tfde import groups
>>> t = tfde.TableConfig(name="t", vocabulary_size=8, embedding_dim=4,
...                      max_norm=1.0)
>>> group, = groups.make_groups(
...     {"t": tfde.tables.make_table(t, auto_replicate_bytes=0)}, "auto", 1)
>>> f = tfde.FeatureConfig(name="f", table=t)
>>> type(choose(group, Choice([f], num_replicas=1))).__name__
'RenormalizedRows'
"""

from tfde.pipeline.exchanges.base import Choice
from tfde.pipeline.exchanges.base import Exchange
from tfde.pipeline.exchanges.base import Step
from tfde.pipeline.exchanges.engine import Engine
from tfde.pipeline.exchanges.max_norm import RenormalizedRows
from tfde.pipeline.exchanges.one_owner import OneOwner
from tfde.pipeline.exchanges.partial_sums import PartialSums
from tfde.pipeline.exchanges.replicated import Replicated
from tfde.pipeline.exchanges.rows import DedupedRows

# In order: a group takes the first that takes it. DedupedRows takes all.
EXCHANGES = [
    Engine,
    Replicated,
    OneOwner,
    PartialSums,
    RenormalizedRows,
    DedupedRows,
]


def choose(group, choice, comm=None):
  """The exchange (an `Exchange`) of `group`, a `tfde.groups.TableGroup`,
  under `choice` (a `Choice`), between the replicas of `comm` (the group's
  tables' communicator by default)."""
  comm = comm or group.tables[0].comm
  for exchange in EXCHANGES:
    if exchange.takes(group, choice):
      return exchange(group, comm, choice)
  raise ValueError(f"no exchange takes the group of tables {[t.name for t in group.tables]}")


__all__ = ["Choice", "DedupedRows", "EXCHANGES", "Engine", "Exchange", "OneOwner",
           "PartialSums", "RenormalizedRows", "Replicated", "Step", "choose"]
