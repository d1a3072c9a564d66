"""The layers of docs/ARCHITECTURE.md hold: a module imports only its own
layer and those below it. ALLOWED, the list of exceptions, is empty and
stays so; a listed import that is gone fails too, so that a list someone
adds to is mended when the code is."""

import ast
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# From the top: the command; the front doors (a user's API turned into
# feature configs and tables, saving and serving); the planner (its cost
# model estimates the pipeline's exchanges); the pipeline (one lookup per
# group per step); tables, their optimizers and the plan they are laid
# out by;
# the ops and the communicators that carry the exchanges; and what every
# layer may use (configs, the id arithmetic). A module's layer is that of its longest listed prefix.
LAYERS = (
    ("command", ("tfde.app", "tfde_cli")),
    ("front doors", ("tfde.layers", "tfde.compat", "tfde.saving", "tfde.dtensor", "tfde.nn",
                     # the saving modules' old paths (aliases, for one release)
                     "tfde.serving", "tfde.checkpoint", "tfde.delta_checkpoint",
                     "tfde.delta_manifest",
                     "tfde.feature_column",
                     "tfde.keras_support", "tfde.tpu")),
    ("planner", ("tfde.planner",)),
    ("pipeline", ("tfde.lookup", "tfde.group_step", "tfde.inputs", "tfde.input_checks",
                  "tfde.routing", "tfde.exchange_kind", "tfde.groups", "tfde.pipeline")),
    ("tables", ("tfde.tables", "tfde.placement", "tfde.initializers", "tfde.planner.layout",
                "tfde.optimizers",
                # the TPU configs and optimizers as tfde's and back (the TPU
                # table kind builds its engine from them)
                "tfde.tpu.configs", "tfde.tpu.optimizer_mapping")),
    ("ops and communicators", ("tfde.ops", "tfde.comm")),
    ("foundations", ("tfde.config", "tfde.optimizer_configs", "tfde.initializer_configs",
                     "tfde.hyperparameters",
                     "tfde.sharding", "tfde.collective_keys", "tfde.atomic_files",
                     "tfde._build_info", "tfde.tf_version", "tfde.tf_internals",
                     "tfde.lazy_modules")),
)

# (importer, imported): upward imports let through. None is.
ALLOWED = set()


def _modules():
  """{module name: path} of tfde's modules and the command."""
  found = {"tfde_cli": os.path.join(REPO, "tfde_cli.py")}
  for folder, _, files in os.walk(os.path.join(REPO, "tfde")):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        module = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
        found[module.removesuffix(".__init__")] = path
  return found


def _imports(module, path, modules):
  """The tfde modules `module` imports, anywhere in it (functions too)."""
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")
        parts = parts[:len(parts) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
      names = [f"{base}.{a.name}" for a in node.names]
    else:
      continue
    for name in names:
      # The longest tfde module the name is (or lies in).
      while name and name not in modules:
        name = name.rpartition(".")[0]
      if name and name != module and (name.startswith("tfde") or name == "tfde_cli"):
        yield name


def _layer(module):
  if module == "tfde":
    return None   # the package's facade re-exports every layer
  best = None
  for depth, (_, prefixes) in enumerate(LAYERS):
    for prefix in prefixes:
      if module == prefix or module.startswith(prefix + "."):
        if best is None or len(prefix) > best[1]:
          best = (depth, len(prefix))
  return None if best is None else best[0]


def upward_imports():
  modules = _modules()
  found = set()
  for module, path in modules.items():
    if module == "tfde":
      continue
    for imported in set(_imports(module, path, modules)):
      here, there = _layer(module), _layer(imported)
      # The package's facade re-exports every layer: only the command,
      # above them all, imports it.
      facade = imported == "tfde" and here != 0
      if facade or (here is not None and there is not None and there < here):
        found.add((module, imported))
  return found


def test_every_module_has_a_layer():
  unplaced = sorted(m for m in _modules() if m != "tfde" and _layer(m) is None)
  assert not unplaced, f"modules in no layer of LAYERS: {unplaced}"


def test_no_import_goes_up_a_layer_but_the_listed_ones():
  found = upward_imports()
  new = sorted(found - ALLOWED)
  assert not new, ("imports up a layer (docs/ARCHITECTURE.md), or of the package's "
                   f"facade `tfde` from inside it: {new}")
  mended = sorted(ALLOWED - found)
  assert not mended, f"listed in ALLOWED but gone (delete them from the list): {mended}"


def test_the_saving_modules_answer_by_their_old_paths():
  """tfde/saving/ holds what moved; each old path answers for one release:
  the attribute silently, an import of the old module path with a
  DeprecationWarning naming the new one. In a fresh process, where no test
  has imported either yet."""
  code = textwrap.dedent("""
      import warnings
      import tfde
      from tfde.saving import checkpoint, delta_checkpoint, delta_manifest, serving
      with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tfde.checkpoint is checkpoint and tfde.serving is serving
        assert tfde.delta_checkpoint is delta_checkpoint
        assert tfde.delta_manifest is delta_manifest
        assert tfde.export_for_serving is serving.export_for_serving
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from tfde.checkpoint import warm_start
        import tfde.serving as old_serving
        from tfde import delta_manifest as old_manifest
      assert warm_start is checkpoint.warm_start and old_serving is serving
      assert old_manifest is delta_manifest
      print(sorted(str(w.message) for w in caught if w.category is DeprecationWarning))
      """)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=REPO, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip() == str([
      f"tfde.{m} moved to tfde.saving.{m}; import it from there (the old path goes "
      "in the next release)" for m in ("checkpoint", "serving")])


def test_the_pipeline_and_the_tpu_table_kind_load_no_front_door():
  """`tfde.tpu` is a front door whose config conversions lie in the tables
  layer: importing the pipeline and the TPU table kind (which read them)
  loads none of the package's front-door modules. In a fresh process."""
  code = textwrap.dedent("""
      import sys
      import tfde.lookup, tfde.tables.tpu
      doors = ("tfde.tpu.checkpoints", "tfde.layers", "tfde.saving", "tfde.compat")
      print(sorted(m for m in sys.modules if m.startswith(doors)))
  """)
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3"),
                          timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout
