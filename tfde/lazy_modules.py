"""Packages whose submodules, and names of them, load on first use (PEP
562), and modules that moved.

>>> import json, types
>>> getattr_, dir_ = submodules("json", ("decoder",), {"JSONDecoder": "decoder"})
>>> isinstance(getattr_("decoder"), types.ModuleType), "decoder" in dir_()
(True, True)
>>> getattr_("JSONDecoder") is json.decoder.JSONDecoder, "JSONDecoder" in dir_()
(True, True)
"""

import importlib
import sys
import warnings


def submodules(package, names=(), attributes=None):
  """(`__getattr__`, `__dir__`) for `package` (imported, or importing:
  call this from its `__init__`), whose submodules `names`, and those
  `attributes` ({name: the submodule that defines it}) name, are imported
  when first read; each attribute is read from its submodule then."""
  attributes = dict(attributes or {})
  modules = set(names) | set(attributes.values())
  namespace = sys.modules[package].__dict__

  def __getattr__(name):
    if name in attributes:
      value = getattr(__getattr__(attributes[name]), name)
    elif name in modules:
      value = importlib.import_module(f"{package}.{name}")
    else:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    namespace[name] = value
    return value

  def __dir__():
    return sorted(set(namespace) | modules | set(attributes))

  return __getattr__, __dir__


def moved(old, new):
  """Makes module path `old` answer with module `new`, warning the
  importer (for one release: the old path goes in the next)."""
  warnings.warn(f"{old} moved to {new}; import it from there (the old path goes in "
                "the next release)", DeprecationWarning, stacklevel=3)
  sys.modules[old] = importlib.import_module(new)
