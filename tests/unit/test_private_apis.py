"""TensorFlow's and Keras's private APIs are used from one module only,
`tfde/tf_internals.py`, where each use says what it is for and the
versions it was checked on: an import of `tensorflow.python`, `keras.src`
or a `_pywrap` binding, a use of `tf.__internal__`, or a read of a
caller's frame (a saver's locals), anywhere else in tfde fails here."""

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THE_MODULE = os.path.join("tfde", "tf_internals.py")
PRIVATE_PREFIXES = ("tensorflow.python", "keras.src")
FRAME_READS = ("__internal__", "_getframe", "currentframe", "f_back", "f_locals")


def _private(module_name):
  parts = module_name.split(".")
  return (any(module_name == p or module_name.startswith(p + ".") for p in PRIVATE_PREFIXES)
          or any(part.startswith("_pywrap") for part in parts))


def private_uses(source):
  """(line, what) of each private TensorFlow or Keras API `source` uses."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [(node.lineno, a.name) for a in node.names if _private(a.name)]
    elif isinstance(node, ast.ImportFrom) and not node.level:
      base = node.module or ""
      found += [(node.lineno, f"{base}.{a.name}") for a in node.names
                if _private(base) or _private(f"{base}.{a.name}")]
    elif isinstance(node, ast.Attribute) and node.attr in FRAME_READS:
      found.append((node.lineno, node.attr))
    elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
          and isinstance(node.args[0].value, str) and _private(node.args[0].value)
          and getattr(node.func, "attr", getattr(node.func, "id", None))
          in ("import_module", "__import__")):
      found.append((node.lineno, node.args[0].value))
  return found


def _sources():
  yield "tfde_cli.py"
  for folder, _, files in os.walk(os.path.join(REPO, "tfde")):
    for name in sorted(files):
      if name.endswith(".py"):
        yield os.path.relpath(os.path.join(folder, name), REPO)


def test_private_apis_are_used_from_tf_internals_only():
  found = []
  for path in _sources():
    if path != THE_MODULE:
      with open(os.path.join(REPO, path)) as f:
        found += [f"{path}:{line}: {what}" for line, what in private_uses(f.read())]
  assert not found, ("private TensorFlow/Keras APIs or frames used outside tfde/tf_internals.py "
                     f"(add a named function there): {found}")


def test_the_check_sees_each_kind_of_use():
  source = ("from tensorflow.python.ops import array_ops\n"
            "import keras.src.tree\n"
            "from tensorflow.python.tpu import _pywrap_sparse_core_layout\n"
            "x = tf.__internal__.nest\n"
            "importlib.import_module('tensorflow.python.eager.context')\n"
            "caller = sys._getframe(1).f_locals\n"
            "import tensorflow as tf\nfrom keras import tree\n")
  assert sorted(line for line, _ in private_uses(source)) == [1, 2, 3, 4, 5, 6, 6]


def test_every_use_in_tf_internals_names_the_versions_it_was_checked_on():
  with open(os.path.join(REPO, THE_MODULE)) as f:
    tree = ast.parse(f.read())
  unnamed = [node.name for node in tree.body if isinstance(node, ast.FunctionDef)
             and not node.name.startswith("_")
             and "checked on" not in " ".join((ast.get_docstring(node) or "").split())]
  assert not unnamed, f"functions without the versions they were checked on: {unnamed}"
