"""The `tfde train` application: a DLRM-style job built on the library.

Nothing in the library imports this package; it imports the library like
any user would (`tfde.layers`, `tfde.checkpoint`, ...). `config` is the
job's config schema and YAML loader; `cli` checks a config and runs it;
`data` generates the job's Criteo-like data (or reads MovieLens ratings).
"""
