"""Compatibility doors and shims for other libraries' APIs.

Each door loads on first use (`tfde.compat.sok`, `tfde.compat.mxrec`,
`tfde.compat.deeprec`), as `import tfde.compat.sok as sok` does.
"""

from tfde import lazy_modules

_DOORS = ("deeprec", "keras_multiworker", "mxrec", "sok")

__all__ = list(_DOORS)

__getattr__, __dir__ = lazy_modules.submodules(__name__, _DOORS)
