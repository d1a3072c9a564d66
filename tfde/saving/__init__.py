"""Saving: what outlives a process.

- `tfde.saving.checkpoint`: checkpoints of any replica count, warm starts;
- `tfde.saving.delta_checkpoint`: delta checkpoints (rows changed since a
  mark) and their chains;
- `tfde.saving.delta_manifest`: the manifests that link a chain's files;
- `tfde.saving.serving`: serving exports that need no tfde, delta exports,
  and their stock-op lookup.

Each loads on first use (`tfde.saving.checkpoint` imports it). The tables
keep their own state, checksums and restore checks (`tfde.tables`); the
modules here write, read and link them.
"""

from tfde import lazy_modules

_MODULES = ("checkpoint", "delta_checkpoint", "delta_manifest", "serving")

__getattr__, __dir__ = lazy_modules.submodules(__name__, _MODULES)
