"""Compatibility doors and shims for other libraries' APIs.

Each door loads on first use (`tfde.compat.sok`, `tfde.compat.mxrec`,
`tfde.compat.deeprec`), as `import tfde.compat.sok as sok` does.
"""

import importlib

_DOORS = ("deeprec", "keras_multiworker", "mxrec", "sok")

__all__ = list(_DOORS)


def __getattr__(name):
  if name not in _DOORS:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  value = importlib.import_module(f"{__name__}.{name}")
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))
