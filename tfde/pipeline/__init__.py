"""The lookup pipeline's parts that are types of their own: the exchanges
(`tfde.pipeline.exchanges`: how a group's rows travel between the
replicas, forward and back) and the updates (`tfde.pipeline.updates`:
what the backward does with the gradients each replica owns).
`tfde.lookup.ShardedLookup` runs stage 0, asks `exchanges.choose` which
exchange each group takes, and runs them under one custom gradient.
"""
