"""Deprecated: the `tfde` command moved to `tfde.app.command`; this alias
forwards to it for one release (`python -m tfde_cli` still runs it).

Import `tfde.app.command` (or run `python -m tfde.app`) instead.
"""

import sys
import warnings

warnings.warn("tfde_cli is deprecated and will be removed in the next release; "
              "use tfde.app.command (the `tfde` command, or `python -m tfde.app`)",
              DeprecationWarning, stacklevel=2)

from tfde.app.command import build_parser  # noqa: E402,F401
from tfde.app.command import load_tensorflow  # noqa: E402,F401
from tfde.app.command import main  # noqa: E402

if __name__ == "__main__":
  sys.exit(main())
