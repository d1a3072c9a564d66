"""Moved to `tfde.saving.checkpoint`; this path is kept for one release.

`tfde.checkpoint` (the attribute) keeps answering without a warning; importing
`tfde.checkpoint` by its old module path warns.
"""

import sys
import warnings

from tfde.saving import checkpoint as _moved

warnings.warn("tfde.checkpoint moved to tfde.saving.checkpoint; import it from there "
              "(the old path goes in the next release)", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
