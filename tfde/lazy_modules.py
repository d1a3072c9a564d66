"""Packages whose submodules load on first use (PEP 562), and modules
that moved.

>>> import types
>>> getattr_, dir_ = submodules("json", ("decoder",))
>>> isinstance(getattr_("decoder"), types.ModuleType), "decoder" in dir_()
(True, True)
"""

import importlib
import sys
import warnings


def submodules(package, names):
  """(`__getattr__`, `__dir__`) for `package`, whose submodules `names`
  are imported when first read as attributes."""
  namespace = sys.modules[package].__dict__ if package in sys.modules else {}

  def __getattr__(name):
    if name not in names:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = importlib.import_module(f"{package}.{name}")
    namespace[name] = value
    return value

  def __dir__():
    return sorted(set(namespace) | set(names))

  return __getattr__, __dir__


def moved(old, new):
  """Makes module path `old` answer with module `new`, warning the
  importer (for one release: the old path goes in the next)."""
  warnings.warn(f"{old} moved to {new}; import it from there (the old path goes in "
                "the next release)", DeprecationWarning, stacklevel=3)
  sys.modules[old] = importlib.import_module(new)
