"""Moved to `tfde.saving.serving`; this path is kept for one release.

`tfde.serving` (the attribute) keeps answering without a warning; importing
`tfde.serving` by its old module path warns.
"""

import sys
import warnings

from tfde.saving import serving as _moved

warnings.warn("tfde.serving moved to tfde.saving.serving; import it from there "
              "(the old path goes in the next release)", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
