"""Collection for `pytest tests tfde --doctest-modules`: tfde.dtensor is a
tf_keras layer, collected only where tf_keras is installed (the extra
`tfde[dtensor]`; `make env` installs it). The old paths of the modules
that moved to `tfde/saving/` are aliases whose docs are the new modules'
(`tests/unit/test_layering.py` imports them by their old paths)."""

import importlib.util

collect_ignore = [f"tfde/{name}.py" for name in
                  ("checkpoint", "delta_checkpoint", "delta_manifest", "serving")]
if importlib.util.find_spec("tf_keras") is None:
  collect_ignore.append("tfde/dtensor.py")
